//! `ckptfs completions SHELL` and `ckptfs man`: generated from the clap definitions,
//! so that they never disagree with `--help`.

use std::io::{self, Write};

use anyhow::{Context, Result};
use clap_complete::Generator;

use crate::cli::{CompletionsArgs, ManArgs};

pub fn completions(args: &CompletionsArgs) -> Result<i32> {
    let mut command = crate::cli::command();
    command.set_bin_name("ckptfs");
    command.build();
    let mut out = io::stdout().lock();
    // `try_generate`, not `generate`: a closed pipe (`| head`) is an error to report,
    // not a panic.
    args.shell
        .try_generate(&command, &mut out)
        .context("cannot write the completion script")?;
    out.flush()?;
    Ok(0)
}

pub fn man(args: &ManArgs) -> Result<i32> {
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        write_pages(dir)
            .with_context(|| format!("cannot write the manual pages into {}", dir.display()))?;
        return Ok(0);
    }
    let mut out = io::stdout().lock();
    clap_mangen::Man::new(crate::cli::command())
        .render(&mut out)
        .context("cannot write the manual page")?;
    out.flush()?;
    Ok(0)
}

/// One page per command into `dir`, as `clap_mangen::generate_to` names them, each
/// written whole through a descriptor of `dir` and renamed over its name: a symlink
/// someone put there under a page's name is replaced, never written through (root
/// installing pages into a directory another user can write).
fn write_pages(dir: &std::path::Path) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    fn each(command: clap::Command, dir: &std::os::fd::OwnedFd) -> io::Result<()> {
        for sub in command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
        {
            each(sub, dir)?;
        }
        let page = clap_mangen::Man::new(command);
        let mut bytes = Vec::new();
        page.render(&mut bytes)?;
        crate::beneath::replace_file_at(dir, &page.get_filename(), &bytes, 0o644)
    }
    let dir = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut command = crate::cli::command().disable_help_subcommand(true);
    command.build();
    each(command, &dir)
}
