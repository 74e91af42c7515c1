//! `ckptfs get STORE SHA256 DEST`: downloads a checkpoint, verifies it, and only then
//! restores it into DEST (new or empty).

use crate::commands::say;
use anyhow::{Context, Result};

use super::{bar, open_store, resolve_name, temp_dir};
use crate::checkpoint::{self, CheckpointError, GetOptions};
use crate::cli::{Cli, GetArgs};
use crate::history;
use crate::store::DEFAULT_PART_SIZE;

pub(super) fn run(cli: &Cli, args: &GetArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let id = resolve_name(store.as_ref(), &args.sha256)?;
    let download = bar(0, "downloading");
    let get = |version: Option<&str>| {
        checkpoint::get(
            store.as_ref(),
            &id,
            &args.dest,
            &GetOptions {
                max_archive_size: cli.max_archive_size,
                limits: args.limits.limits(),
                temp_dir: &temp_dir(&args.temp_dir),
                version,
            },
            &|done, total| {
                download.set_length(total);
                download.set_position(done)
            },
        )
    };
    // A checkpoint that a delete hid, or whose name now holds other bytes, is read
    // from the newest earlier version that verifies, if the bucket keeps versions.
    let summary = match get(None) {
        Err(CheckpointError::Verify { failure, .. }) if history::worth_looking(&failure) => {
            // Looking is a second chance: if it fails, the first failure is the answer.
            let earlier = history::restorable_version(store.as_ref(), &id, cli.max_archive_size).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not look for an earlier version");
                None
            });
            match earlier {
                Some((version, stored_at)) => {
                    say::note!(
                        "checkpoint {id}: {failure}; restoring the version of {} ({version}), which verifies",
                        humantime::format_rfc3339_seconds(stored_at)
                    );
                    get(Some(&version))
                }
                None => Err(CheckpointError::Verify {
                    id: id.clone(),
                    failure,
                }),
            }
        }
        other => other,
    }
    .with_context(|| {
        format!(
            "cannot restore checkpoint {id} into {}",
            args.dest.display()
        )
    })?;
    download.finish_and_clear();
    say::note!(
        "restored checkpoint {id} into {}: {} {}, {} bytes{}",
        args.dest.display(),
        summary.entries,
        if summary.entries == 1 {
            "entry"
        } else {
            "entries"
        },
        summary.bytes,
        if summary.skipped > 0 {
            format!(", {} skipped (devices, FIFOs)", summary.skipped)
        } else {
            String::new()
        }
    );
    Ok(0)
}
