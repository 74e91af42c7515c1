//! `ckptfs put STORE DIR`: captures a directory as a checkpoint; prints
//! `<sha256> <size>` on stdout and what happened in the store on stderr.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail};

use super::{
    bar, compression_threads, member_cache, open_config, resolve_name, say, store_config, temp_dir,
};
use crate::cache::CacheDir;
use crate::checkpoint::{self, CheckpointId, PutOptions, StoreOutcome};
use crate::cli::{Cli, PutArgs};
use crate::members::store::MemberCache;
use crate::store::{self, ObjectStore, StoreConfig};

pub(super) fn run(cli: &Cli, args: &PutArgs) -> Result<i32> {
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
        say::note!("created the store directory {}", args.store);
    }
    let store = open_config(&config)?;
    let parent = parent_of(store.as_ref(), args.parent.as_deref())?;
    let members = members(args);
    // Archiving first (a spinner), then the upload (a bar of bytes).
    let archiving = std::sync::Mutex::new(Some(super::spinner(format!(
        "archiving {}",
        args.dir.display()
    ))));
    let upload = bar(0, "uploading");
    let report = checkpoint::put(
        store.as_ref(),
        &args.dir,
        &PutOptions {
            max_archive_size: cli.max_archive_size,
            max_unpacked: args.max_unpacked_size,
            temp_dir: &temp_dir(&args.temp_dir),
            threads: compression_threads(),
            members: members.clone(),
            parent,
            settle: args.settle,
        },
        &|done, total| {
            archiving.lock().expect("spinner lock").take();
            upload.set_length(total);
            upload.set_position(done)
        },
    )
    .with_context(|| format!("cannot capture {}", args.dir.display()))?;
    drop(archiving);
    upload.finish_and_clear();
    if let Some(members) = &members {
        let (reused, compressed, reused_bytes) = members.stats.counts();
        let inflated = members.stats.inflated.load(Ordering::Relaxed);
        tracing::info!(
            reused,
            compressed,
            reused_bytes,
            inflated,
            "gzip members: reused from earlier captures (those inflated to check them), and compressed"
        );
    }
    if report.outcome == StoreOutcome::Stored {
        tracing::info!(
            sent = report.size - report.copied,
            copied = report.copied,
            "bytes sent to the store, and copied there from checkpoints it held"
        );
    }
    println!("{} {}", report.id, report.size);
    match report.outcome {
        StoreOutcome::AlreadyPresent => say::note!(
            "checkpoint {} already present in {} (verified); nothing uploaded",
            report.id,
            store.describe()
        ),
        StoreOutcome::Stored => {
            say::note!("stored checkpoint {} in {}", report.id, store.describe())
        }
        StoreOutcome::Replaced { reason } => say::note!(
            "stored checkpoint {} in {}, replacing a damaged copy ({reason})",
            report.id,
            store.describe()
        ),
    }
    Ok(0)
}

/// `--parent`, resolved and present in the store.
fn parent_of(store: &dyn ObjectStore, given: Option<&str>) -> Result<Option<CheckpointId>> {
    let Some(given) = given else {
        return Ok(None);
    };
    let parent = resolve_name(store, given).with_context(|| format!("--parent {given}"))?;
    if !store.exists(&parent.object_name())? {
        bail!(
            "--parent {given}: checkpoint {parent} is not in {}",
            store.describe()
        );
    }
    Ok(Some(parent))
}

/// The member cache of the cache directory. Without a cache directory (no HOME),
/// everything is compressed, as before; with one it cannot use, too, with a warning.
fn members(args: &PutArgs) -> Option<Arc<MemberCache>> {
    let size = args.member_cache_size;
    if size == 0 {
        // None kept: the cache directory is not even made.
        return None;
    }
    match args.cache_dir.clone().or_else(CacheDir::default_path) {
        None => None,
        Some(path) => match CacheDir::open(&path) {
            Ok(dir) => member_cache(&dir, size),
            Err(e) => {
                tracing::warn!(error = %e, "no member cache: compressing everything");
                None
            }
        },
    }
}
