//! `ckptfs verify STORE [SHA256...] [--history]`: re-hashes checkpoints in the store,
//! one line per checkpoint on stdout (`<sha256> ok` or `<sha256> FAILED: reason`),
//! with `--history` also `HIDDEN` and `TAMPERED` lines from a versioned bucket's
//! versions; exit status 1 when anything was found.

use crate::commands::say;
use std::io::{self, Write};

use anyhow::{Result, bail};

use super::{open_store, resolve_name};
use crate::checkpoint::{self, CheckpointError};
use crate::cli::{Cli, VerifyArgs};
use crate::history::{self, Finding};
use crate::store::DEFAULT_PART_SIZE;
use crate::store::ObjectStore;

pub(super) fn run(cli: &Cli, args: &VerifyArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let ids = if args.sha256.is_empty() {
        checkpoint::list_unordered(store.as_ref())?
            .into_iter()
            .map(|c| c.id)
            .collect()
    } else {
        args.sha256
            .iter()
            .map(|given| resolve_name(store.as_ref(), given))
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut failed = 0;
    let mut out = io::stdout().lock();
    for id in &ids {
        let shown = super::spinner(format!("verifying checkpoint {}", id.short()));
        let verified = checkpoint::verify_object(store.as_ref(), id, None, cli.max_archive_size);
        drop(shown);
        match verified {
            Ok(()) => writeln!(out, "{id} ok")?,
            Err(e) => {
                failed += 1;
                let reason = match e {
                    CheckpointError::Verify { failure, .. } => failure.to_string(),
                    other => format!("{:#}", anyhow::Error::from(other)),
                };
                // The reason may quote the archive's own names.
                let reason = crate::printable::escape(reason.as_bytes());
                writeln!(out, "{id} FAILED: {reason}")?;
            }
        }
    }
    if args.history {
        failed += report_history(
            store.as_ref(),
            cli.max_archive_size,
            args.max_versions,
            &mut out,
        )?;
    }
    out.flush()?;
    if failed > 0 {
        say::note!("{failed} problem(s) found in {} checkpoints", ids.len());
        return Ok(1);
    }
    Ok(0)
}

/// Prints what the bucket's versions say beyond the listing (see
/// [`crate::history`]); returns how many are problems: a version with other bytes
/// (the current one is counted by its FAILED line already), or a hidden checkpoint
/// no version of which verifies. A hidden checkpoint that still verifies (pruned, or
/// deleted by anyone) is listed, not a failure: `prune` makes them every day.
fn report_history(
    store: &dyn ObjectStore,
    max_size: u64,
    max_versions: usize,
    out: &mut impl Write,
) -> Result<usize> {
    let time = |t| humantime::format_rfc3339_seconds(t);
    let Some(findings) = history::examine(store, max_size, max_versions)? else {
        bail!(
            "{} keeps no versions: --history needs a bucket with versioning (see the README)",
            store.describe()
        );
    };
    for finding in &findings {
        match finding {
            Finding::Hidden {
                id,
                deleted_at,
                restorable: Some((version, stored_at)),
            } => writeln!(
                out,
                "{id} HIDDEN: deleted {}; version {version} of {} verifies (ckptfs get restores it)",
                time(*deleted_at),
                time(*stored_at)
            )?,
            Finding::Hidden {
                id,
                deleted_at,
                restorable: None,
            } => writeln!(
                out,
                "{id} HIDDEN: deleted {}; no version verifies",
                time(*deleted_at)
            )?,
            Finding::Tampered {
                id,
                version_id,
                stored_at,
                current,
                reason,
            } => writeln!(
                out,
                "{id} TAMPERED: version {version_id} stored {}{} holds other bytes: {reason}",
                time(*stored_at),
                if *current { " (the current one)" } else { "" }
            )?,
            Finding::Unreadable {
                id,
                version_id,
                stored_at,
                reason,
            } => writeln!(
                out,
                "{id} UNREADABLE: version {version_id} stored {}: {}",
                time(*stored_at),
                crate::printable::message(reason)
            )?,
            Finding::Unexamined { id, skipped } => writeln!(
                out,
                "{id} NOT CHECKED: {skipped} older versions past --max-versions {max_versions}"
            )?,
        }
    }
    let problems = findings
        .iter()
        .filter(|f| {
            matches!(
                f,
                Finding::Tampered { current: false, .. }
                    | Finding::Hidden {
                        restorable: None,
                        ..
                    }
                    | Finding::Unreadable { .. }
                    | Finding::Unexamined { .. }
            )
        })
        .count();
    Ok(problems)
}
