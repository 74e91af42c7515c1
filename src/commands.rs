//! The commands behind the CLI: glue between arguments, the library and the terminal.
//! This is the one layer that uses `anyhow` and prints.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::{self, CheckpointError, GetOptions, PutOptions, StoreOutcome};
use crate::cli::{Cli, Command, GetArgs, LsArgs, PutArgs, VerifyArgs};
use crate::store::{self, DEFAULT_PART_SIZE, ObjectStore, StoreConfig};

/// Runs one command. Returns the process exit code for outcomes that are not errors
/// of the command itself (a failed verification).
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Put(ref args) => put(&cli, args),
        Command::Get(ref args) => get(&cli, args),
        Command::Verify(ref args) => verify(&cli, args),
        Command::Ls(ref args) => ls(&cli, args),
        Command::Mount(ref args) => crate::fs::mount::run(&cli, args).map(|()| 0),
    }
}

/// What the `STORE` argument `url` names, with the global `--endpoint-url`.
fn store_config(cli: &Cli, url: &str, part_size: u64) -> Result<StoreConfig> {
    StoreConfig::parse(url, cli.endpoint_url.clone(), part_size)
        .with_context(|| format!("cannot open store {url}"))
}

/// Opens the store the `STORE` argument `url` names.
pub(crate) fn open_store(cli: &Cli, url: &str, part_size: u64) -> Result<Arc<dyn ObjectStore>> {
    open_config(&store_config(cli, url, part_size)?, url)
}

fn open_config(config: &StoreConfig, url: &str) -> Result<Arc<dyn ObjectStore>> {
    store::open(config).with_context(|| format!("cannot open store {url}"))
}

fn bar(len: u64, message: &'static str) -> ProgressBar {
    if !io::stderr().is_terminal() {
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

fn temp_dir(given: &Option<PathBuf>) -> PathBuf {
    given.clone().unwrap_or_else(std::env::temp_dir)
}

pub(crate) fn compression_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn put(cli: &Cli, args: &PutArgs) -> Result<i32> {
    if args.part_size < store::s3::MIN_PART_SIZE {
        bail!("--part-size must be at least 5MiB (S3's smallest part)");
    }
    let config = store_config(cli, &args.store, args.part_size)?;
    // The one command that may start a local store.
    if let StoreConfig::Local { dir } = &config
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the store directory {}", args.store))?;
        eprintln!("created the store directory {}", args.store);
    }
    let store = open_config(&config, &args.store)?;
    let upload = bar(0, "uploading");
    let report = checkpoint::put(
        store.as_ref(),
        &args.dir,
        &PutOptions {
            max_archive_size: cli.max_archive_size,
            temp_dir: &temp_dir(&args.temp_dir),
            threads: compression_threads(),
        },
        &|done, total| {
            upload.set_length(total);
            upload.set_position(done)
        },
    )
    .with_context(|| format!("cannot capture {}", args.dir.display()))?;
    upload.finish_and_clear();
    println!("{} {}", report.id, report.size);
    match report.outcome {
        StoreOutcome::AlreadyPresent => eprintln!(
            "checkpoint {} already present in {} (verified); nothing uploaded",
            report.id,
            store.describe()
        ),
        StoreOutcome::Stored => {
            eprintln!("stored checkpoint {} in {}", report.id, store.describe())
        }
        StoreOutcome::Replaced { reason } => eprintln!(
            "stored checkpoint {} in {}, replacing a damaged copy ({reason})",
            report.id,
            store.describe()
        ),
    }
    Ok(0)
}

fn get(cli: &Cli, args: &GetArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let id = checkpoint::resolve(store.as_ref(), &args.sha256)?;
    let download = bar(0, "downloading");
    let summary = checkpoint::get(
        store.as_ref(),
        &id,
        &args.dest,
        &GetOptions {
            max_archive_size: cli.max_archive_size,
            limits: args.limits.limits(),
            temp_dir: &temp_dir(&args.temp_dir),
        },
        &|done, total| {
            download.set_length(total);
            download.set_position(done)
        },
    )
    .with_context(|| {
        format!(
            "cannot restore checkpoint {id} into {}",
            args.dest.display()
        )
    })?;
    download.finish_and_clear();
    eprintln!(
        "restored checkpoint {id} into {}: {} entries, {} bytes{}",
        args.dest.display(),
        summary.entries,
        summary.bytes,
        if summary.skipped > 0 {
            format!(", {} skipped (devices, FIFOs)", summary.skipped)
        } else {
            String::new()
        }
    );
    Ok(0)
}

fn verify(cli: &Cli, args: &VerifyArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let ids = if args.sha256.is_empty() {
        checkpoint::list(store.as_ref())?
            .into_iter()
            .map(|c| c.id)
            .collect()
    } else {
        args.sha256
            .iter()
            .map(|given| checkpoint::resolve(store.as_ref(), given))
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut failed = 0;
    let mut out = io::stdout().lock();
    for id in &ids {
        match checkpoint::verify(store.as_ref(), id) {
            Ok(()) => writeln!(out, "{id} ok")?,
            Err(e) => {
                failed += 1;
                let reason = match e {
                    CheckpointError::Verify { failure, .. } => failure.to_string(),
                    other => format!("{:#}", anyhow::Error::from(other)),
                };
                writeln!(out, "{id} FAILED: {reason}")?;
            }
        }
    }
    out.flush()?;
    if failed > 0 {
        eprintln!("{failed} of {} checkpoints failed verification", ids.len());
        return Ok(1);
    }
    Ok(0)
}

fn ls(cli: &Cli, args: &LsArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let checkpoints = checkpoint::list(store.as_ref())?;
    let mut out = io::stdout().lock();
    if args.json {
        let rows: Vec<_> = checkpoints
            .iter()
            .map(|c| {
                serde_json::json!({
                    "sha256": c.id.as_str(),
                    "size": c.size,
                    "last_modified": humantime::format_rfc3339_seconds(c.last_modified).to_string(),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        for c in &checkpoints {
            writeln!(
                out,
                "{}  {:>12}  {}",
                c.id,
                c.size,
                humantime::format_rfc3339_seconds(c.last_modified)
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}
