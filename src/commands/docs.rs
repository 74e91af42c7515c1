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
        clap_mangen::generate_to(crate::cli::command(), dir)
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
