//! `ckptfs log STORE [--json] [--lineage CHECKPOINT]`: the checkpoints oldest first,
//! each with what changed since its parent (when its metadata claims one the store
//! has: `put --parent`) or else since the turn before. Every checkpoint is verified
//! before anything is printed.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;

use super::review_session::Session;
use crate::cache::VerifiedCheckpoint;
use crate::checkpoint::{CheckpointId, CheckpointInfo};
use crate::cli::{Cli, LogArgs};
use crate::review::diff::{DiffStats, empty_index};
use crate::review::tree::{TreeSummary, summarize};

struct Turn<'a> {
    info: &'a CheckpointInfo,
    summary: TreeSummary,
    changes: DiffStats,
    previous: Option<&'a CheckpointInfo>,
    /// The parent the metadata claims, whether or not the store has it.
    parent: Option<CheckpointId>,
    /// What `changes` are counted from: the parent when the store has it, else the
    /// turn before.
    base: Option<&'a CheckpointInfo>,
}

pub(super) fn run(cli: &Cli, args: &LogArgs) -> Result<i32> {
    let session = Session::open(
        cli,
        &args.store,
        &args.review,
        crate::checkpoint::Exact::All,
    )?;
    let parents: HashMap<&CheckpointId, Option<CheckpointId>> = session
        .listing
        .iter()
        .map(|info| Ok((&info.id, session.claimed_parent(info)?)))
        .collect::<Result<_>>()?;
    let listed: HashMap<&CheckpointId, &CheckpointInfo> = session
        .listing
        .iter()
        .map(|info| (&info.id, info))
        .collect();
    let shown: Vec<&CheckpointInfo> = match &args.lineage {
        None => session.listing.iter().collect(),
        Some(given) => {
            let tip = session.resolve(given)?;
            let Some(&tip) = listed.get(&tip.id) else {
                anyhow::bail!(
                    "--lineage {given}: checkpoint {} is not listed in the store",
                    tip.id
                );
            };
            lineage(tip, &parents, &listed)
        }
    };
    let mut turns = Vec::with_capacity(shown.len());
    let nothing = empty_index();
    let mut previous: Option<(&CheckpointInfo, Arc<VerifiedCheckpoint>)> = None;
    for info in shown {
        let checkpoint = session.load(info)?;
        let parent = parents[&info.id].clone();
        let listed_parent = parent.as_ref().and_then(|p| listed.get(p).copied());
        let (base, changes) = match (listed_parent, &previous) {
            (Some(p), Some((prev, prev_checkpoint))) if p.id == prev.id => (
                Some(p),
                DiffStats::between(&prev_checkpoint.index, &checkpoint.index),
            ),
            (Some(p), _) => {
                let parent_checkpoint = session.load(p)?;
                let changes = DiffStats::between(&parent_checkpoint.index, &checkpoint.index);
                (Some(p), changes)
            }
            (None, Some((prev, prev_checkpoint))) => (
                Some(*prev),
                DiffStats::between(&prev_checkpoint.index, &checkpoint.index),
            ),
            (None, None) => (None, DiffStats::between(&nothing, &checkpoint.index)),
        };
        turns.push(Turn {
            info,
            summary: summarize(&checkpoint.index),
            changes,
            previous: previous.as_ref().map(|(i, _)| *i),
            parent,
            base,
        });
        previous = Some((info, checkpoint));
        session.trim(&[&info.id]);
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    if args.json {
        let rows: Vec<_> = turns.iter().map(json).collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        for turn in &turns {
            let DiffStats {
                added,
                removed,
                modified,
                bytes_added,
                bytes_removed,
            } = turn.changes;
            writeln!(
                out,
                "{}  {}  {} bytes  {} files  +{added} ~{modified} -{removed}  \
                 +{bytes_added} -{bytes_removed} bytes{}",
                humantime::format_rfc3339_seconds(turn.info.last_modified),
                turn.info.id.short(),
                turn.info.size,
                turn.summary.files,
                parent_note(turn),
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}

/// The chain of parents `tip` claims, oldest first, as far as the store has them
/// (a claimed cycle ends where it would repeat).
fn lineage<'a>(
    tip: &'a CheckpointInfo,
    parents: &HashMap<&CheckpointId, Option<CheckpointId>>,
    listed: &HashMap<&CheckpointId, &'a CheckpointInfo>,
) -> Vec<&'a CheckpointInfo> {
    let mut chain = vec![tip];
    let mut seen = HashSet::from([&tip.id]);
    while let Some(parent) = parents[&chain[chain.len() - 1].id]
        .as_ref()
        .and_then(|p| listed.get(p).copied())
    {
        if !seen.insert(&parent.id) {
            break;
        }
        chain.push(parent);
    }
    chain.reverse();
    chain
}

/// What a turn's line says of its parent; nothing when it claims none (its changes
/// are then counted from the turn before, as always).
fn parent_note(turn: &Turn<'_>) -> String {
    match (&turn.parent, turn.base) {
        (None, _) => String::new(),
        (Some(parent), Some(base)) if base.id == *parent => {
            format!("  parent {} (from metadata)", parent.short())
        }
        (Some(parent), _) => format!(
            "  parent {} (from metadata; not in the store, compared with the turn before)",
            parent.short()
        ),
    }
}

/// One checkpoint in `--json`.
#[derive(Serialize)]
struct JsonTurn<'a> {
    sha256: &'a str,
    size: u64,
    last_modified: String,
    entries: u64,
    files: u64,
    unpacked_bytes: u64,
    previous: Option<&'a str>,
    parent: Option<&'a str>,
    compared_with: Option<&'a str>,
    added: u64,
    modified: u64,
    removed: u64,
    bytes_added: u64,
    bytes_removed: u64,
}

fn json<'a>(turn: &'a Turn<'a>) -> JsonTurn<'a> {
    JsonTurn {
        sha256: turn.info.id.as_str(),
        size: turn.info.size,
        last_modified: humantime::format_rfc3339_seconds(turn.info.last_modified).to_string(),
        entries: turn.summary.entries,
        files: turn.summary.files,
        unpacked_bytes: turn.summary.unpacked_bytes,
        previous: turn.previous.map(|p| p.id.as_str()),
        parent: turn.parent.as_ref().map(CheckpointId::as_str),
        compared_with: turn.base.map(|b| b.id.as_str()),
        added: turn.changes.added,
        modified: turn.changes.modified,
        removed: turn.changes.removed,
        bytes_added: turn.changes.bytes_added,
        bytes_removed: turn.changes.bytes_removed,
    }
}
