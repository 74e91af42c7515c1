//! The commands behind the CLI, one file each: [`put`], [`get`], [`verify`], [`ls`],
//! [`mount`] (the daemon), and the review commands [`log`], [`diff`], [`cat`] and
//! [`find`], which share a [`review_session`]. This is the glue between arguments, the library and
//! the terminal, and the one layer (with `main.rs`) that uses `anyhow` and prints:
//! results on stdout, progress bars and notes on stderr.
//!
//! Everything a process does around the library is here too: opening the store a
//! `STORE` argument names, progress bars on a terminal, and for the mount
//! daemonising, signals, the refresh thread and the choice of directories. No
//! library module calls back into this one.

mod cat;
mod diff;
mod docs;
mod find;
mod fork;
mod get;
mod log;
mod ls;
mod mount;
mod prune;
mod put;
mod report;
mod review_session;
pub mod say;
mod status;
mod verify;

use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cache::CacheDir;
use crate::checkpoint::{self, CheckpointId};
use crate::cli::{Cli, Command};
use crate::store::{self, ObjectStore, StoreConfig};

/// Runs one command. Returns the process exit code for outcomes that are not errors
/// of the command itself (a failed verification).
pub fn run(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Put(args) => put::run(&cli, args),
        Command::Get(args) => get::run(&cli, args),
        Command::Verify(args) => verify::run(&cli, args),
        Command::Ls(args) => ls::run(&cli, args),
        Command::Prune(args) => prune::run(&cli, args),
        Command::Mount(args) => mount::run(&cli, args),
        Command::Log(args) => log::run(&cli, args),
        Command::Report(args) => report::run(&cli, args),
        Command::Diff(args) => diff::run(&cli, args),
        Command::Cat(args) => cat::run(&cli, args),
        Command::Find(args) => find::run(&cli, args),
        Command::Status(args) => status::run(args),
        Command::Fork(args) => fork::run(args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
    }
}

/// What the `STORE` argument `url` names, with the global `--endpoint-url`.
fn store_config(cli: &Cli, url: &str, part_size: u64) -> Result<StoreConfig> {
    // Store errors name the store already.
    let mut config = StoreConfig::parse(url, cli.endpoint_url.clone(), part_size)?;
    if let StoreConfig::S3 { stall_timeout, .. } = &mut config {
        *stall_timeout = cli.stall_timeout;
    }
    Ok(config)
}

/// Opens the store the `STORE` argument `url` names.
fn open_store(cli: &Cli, url: &str, part_size: u64) -> Result<Arc<dyn ObjectStore>> {
    open_config(&store_config(cli, url, part_size)?)
}

fn open_config(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>> {
    Ok(store::open(config)?)
}

/// The checkpoint `given` names: a sha256 (taken as it is, without listing the store),
/// an unambiguous prefix of one, `latest` or `latest~N`.
fn resolve_name(store: &dyn ObjectStore, given: &str) -> Result<CheckpointId> {
    if given.trim().starts_with("latest") {
        let exact = crate::review::exact_for(&[given]);
        let (listing, _) =
            checkpoint::list_ordered(store, &mut checkpoint::CaptureTimes::default(), exact)?;
        return Ok(crate::review::resolve(&listing, given)?.id.clone());
    }
    Ok(checkpoint::resolve(store, given)?)
}

/// Progress is shown on a terminal, unless `-q`.
fn progress_shown() -> bool {
    io::stderr().is_terminal() && !say::is_quiet()
}

/// A progress bar of bytes on stderr, or a hidden one when stderr is not a terminal.
fn bar(len: u64, message: &'static str) -> ProgressBar {
    if !progress_shown() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_message(message);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>11} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid progress template")
        .progress_chars("=> "),
    );
    bar
}

/// A spinner on stderr saying what is being done (`verifying 3f2a… (12 MB)`) while a
/// step of unknown length runs, or a hidden one when stderr is not a terminal or `-q`
/// was given. Dropping it clears it.
fn spinner(message: String) -> Spinner {
    if !progress_shown() {
        return Spinner(ProgressBar::hidden());
    }
    let bar = ProgressBar::new_spinner().with_message(message);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid spinner template"),
    );
    // Drawn at once: the ticker thread's first tick may come after a quick step ended.
    bar.tick();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    Spinner(bar)
}

struct Spinner(ProgressBar);

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// `--temp-dir`, or the system's temporary directory.
fn temp_dir(given: &Option<PathBuf>) -> PathBuf {
    given.clone().unwrap_or_else(std::env::temp_dir)
}

/// Threads for compressing archives: one per core.
fn compression_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cache directory: `--cache-dir`, or where [`CacheDir::default_path`] says,
/// resolved and made out of other users' reach.
pub(super) fn cache_dir(explicit: Option<&Path>) -> Result<CacheDir> {
    let path = match explicit {
        Some(dir) => dir.to_owned(),
        None => CacheDir::default_path()
            .context("no cache directory: set --cache-dir, XDG_CACHE_HOME or HOME")?,
    };
    Ok(CacheDir::open(&path)?)
}

/// The member cache of `dir` (see [`crate::members::store`]), or none when `size` is
/// 0 or it cannot be made: it changes how fast a capture is, never what it writes, so
/// a capture goes on without it.
pub(super) fn member_cache(
    dir: &CacheDir,
    size: u64,
) -> Option<Arc<crate::members::store::MemberCache>> {
    if size == 0 {
        return None;
    }
    match crate::members::store::MemberCache::open(&dir.members(), size) {
        Ok(cache) => Some(Arc::new(cache)),
        Err(e) => {
            tracing::warn!(dir = %dir.path().display(), error = %e, "no member cache: compressing everything");
            None
        }
    }
}
