//! `ckptfs prune STORE --keep-...`: deletes the checkpoints that no keep rule keeps
//! (see [`crate::prune`]), oldest first, printing one line per checkpoint: `keep`
//! with its reasons, or `delete` (`would delete` with `--dry-run`).

use crate::commands::say;
use std::collections::HashMap;
use std::io::{self, Write};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};

use super::open_store;
use crate::checkpoint;
use crate::checkpoint::CheckpointInfo;
use crate::cli::{Cli, PruneArgs};
use crate::prune::{Policy, decide};
use crate::review;
use crate::store::{DEFAULT_PART_SIZE, ObjectStore, StoreError};

pub(super) fn run(cli: &Cli, args: &PruneArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let listing =
        checkpoint::list(store.as_ref()).with_context(|| format!("cannot list {}", args.store))?;
    let keep = args
        .keep
        .iter()
        .map(|given| Ok(review::resolve(&listing, given)?.id.clone()))
        .collect::<Result<Vec<_>>>()?;
    let policy = Policy {
        keep_last: args.keep_last,
        keep_within: args.keep_within,
        keep,
        keep_lineage: args.keep_lineage,
        grace: args.grace,
    };
    if !policy.keeps_by_rule() {
        bail!(
            "no keep rule: give --keep-last, --keep-within or --keep (prune never deletes everything)"
        );
    }
    let mut parents = HashMap::new();
    if policy.keep_lineage {
        for info in &listing {
            if let Some(parent) = checkpoint::claimed_parent(store.as_ref(), &info.id)? {
                parents.insert(info.id.clone(), parent);
            }
        }
    }
    let decisions = decide(&listing, &parents, &policy, SystemTime::now());
    let mut out = io::stdout().lock();
    let (mut kept, mut deleted, mut freed) = (0, 0, 0);
    for decision in &decisions {
        let info = decision.info;
        let time = humantime::format_rfc3339_seconds(info.last_modified);
        if decision.keep() {
            kept += 1;
            let reasons: Vec<String> = decision.reasons.iter().map(|r| r.to_string()).collect();
            writeln!(
                out,
                "keep          {}  {time}  {}",
                info.id.short(),
                reasons.join(", ")
            )?;
            continue;
        }
        if !args.dry_run {
            // A capture may have found this content present since the listing and
            // made the object its own (see `checkpoint::store_archive`): look again.
            let name = info.id.object_name();
            if captured_since(store.as_ref(), info, policy.grace)? {
                kept += 1;
                writeln!(
                    out,
                    "keep          {}  {time}  captured again since the listing",
                    info.id.short()
                )?;
                continue;
            }
            store
                .delete(&name)
                .with_context(|| format!("cannot delete checkpoint {}", info.id))?;
        }
        let verb = if args.dry_run {
            "would delete"
        } else {
            "delete      "
        };
        writeln!(out, "{verb}  {}  {time}", info.id.short())?;
        deleted += 1;
        freed += info.size;
    }
    out.flush()?;
    let done = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    say::note!(
        "kept {kept}, {done} {deleted} ({freed} bytes) in {}",
        store.describe()
    );
    let first_deleted = decisions
        .iter()
        .find(|d| !d.keep())
        .map(|d| d.info.id.object_name());
    if let Some(name) = first_deleted.filter(|_| deleted > 0 && !args.dry_run) {
        note_versions(store.as_ref(), &name);
    }
    Ok(0)
}

/// Whether a capture found `info`'s content present since the listing, within the
/// grace period, and made the object its own (see `checkpoint::store_archive`).
fn captured_since(
    store: &dyn ObjectStore,
    info: &CheckpointInfo,
    grace: std::time::Duration,
) -> Result<bool> {
    let captured = match store.head(&info.id.object_name()) {
        Ok(meta) => checkpoint::decode_captured(&meta.metadata),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e).with_context(|| format!("checkpoint {}", info.id)),
    };
    let now = SystemTime::now();
    Ok(captured.is_some_and(|t| now.duration_since(t).map_or(true, |age| age < grace)))
}

/// Says what a delete means in a bucket that keeps versions (`name` was deleted).
fn note_versions(store: &dyn ObjectStore, name: &str) {
    match store.versions(Some(name)) {
        Ok(Some(_)) => say::note!(
            "the bucket keeps versions: the deleted checkpoints are hidden behind delete \
             markers and their bytes stay (what Object Lock retains cannot be removed \
             before its date); `verify --history` lists them, `get` restores them"
        ),
        Ok(None) => {}
        Err(e) => {
            tracing::debug!(error = %e, "could not tell whether the bucket keeps versions")
        }
    }
}
