//! `ckptfs log STORE [--json] [--lineage CHECKPOINT]`: the checkpoints oldest first,
//! each with what changed since its parent (when its metadata claims one the store
//! has: `put --parent`) or else since the turn before. Every checkpoint is verified
//! before anything is printed; one that does not verify is shown as `FAILED` with
//! why, the others are still shown, and the exit status is 1.

use std::io::{self, Write};
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;

use super::review_session::{ReviewSession, lineage, unreadable};
use crate::cache::VerifiedCheckpoint;
use crate::checkpoint::{CheckpointId, CheckpointInfo};
use crate::cli::{Cli, LogArgs};
use crate::commands::say;
use crate::review::diff::{DiffStats, empty_index};
use crate::review::tree::{TreeSummary, same_bytes, summarize};

struct Turn<'a> {
    info: &'a CheckpointInfo,
    /// What the turn holds and what changed, or why it could not be read.
    contents: Result<(TreeSummary, DiffStats), String>,
    previous: Option<&'a CheckpointInfo>,
    /// The parent the metadata claims, whether or not the store has it.
    parent: Option<CheckpointId>,
    /// What `changes` are counted from: the parent when the store has it, else the
    /// turn before.
    base: Option<&'a CheckpointInfo>,
}

pub(super) fn run(cli: &Cli, args: &LogArgs) -> Result<i32> {
    let session = ReviewSession::open(
        cli,
        &args.store,
        &args.review,
        crate::checkpoint::Exact::All,
    )?;
    let parents = session.claimed_parents()?;
    let listed = session.by_id();
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
    // The last turn that could be read: a damaged one is shown as such, and the
    // next is compared with the one before it.
    let mut previous: Option<(&CheckpointInfo, Arc<VerifiedCheckpoint>)> = None;
    for info in shown {
        let parent = parents[&info.id].clone();
        let checkpoint = match session.load(info) {
            Ok(checkpoint) => checkpoint,
            Err(e) => {
                turns.push(Turn {
                    info,
                    contents: Err(unreadable(&e)?),
                    previous: previous.as_ref().map(|(i, _)| *i),
                    parent,
                    base: None,
                });
                continue;
            }
        };
        let listed_parent = parent.as_ref().and_then(|p| listed.get(p).copied());
        let (base, changes) = compared(&session, &checkpoint, listed_parent, previous.as_ref())?;
        turns.push(Turn {
            info,
            contents: Ok((summarize(&checkpoint.index), changes)),
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
            writeln!(out, "{}", line(turn))?;
        }
    }
    out.flush()?;
    let failed = turns.iter().filter(|t| t.contents.is_err()).count();
    if failed > 0 {
        say::note!(
            "{failed} of {} checkpoints could not be verified and are shown as FAILED; \
             the turns after one are compared with the last good turn. `ckptfs verify {}` \
             checks them all, `verify --history` finds earlier versions in a versioned \
             bucket; a damaged checkpoint cannot be restored from this copy",
            turns.len(),
            args.store
        );
        return Ok(1);
    }
    Ok(0)
}

/// What `checkpoint` is compared with, and its changes: the parent it claims if that
/// can be read, else the turn before it (the last one read), else nothing.
fn compared<'a>(
    session: &ReviewSession,
    checkpoint: &VerifiedCheckpoint,
    parent: Option<&'a CheckpointInfo>,
    previous: Option<&(&'a CheckpointInfo, Arc<VerifiedCheckpoint>)>,
) -> Result<(Option<&'a CheckpointInfo>, DiffStats)> {
    let loaded_parent = match (parent, previous) {
        (Some(p), Some((prev, prev_checkpoint))) if p.id == prev.id => {
            Some((p, Arc::clone(prev_checkpoint)))
        }
        (Some(p), _) => match session.load(p) {
            Ok(parent_checkpoint) => Some((p, parent_checkpoint)),
            Err(e) => {
                unreadable(&e)?;
                None
            }
        },
        (None, _) => None,
    };
    let (base, old) = match (loaded_parent, previous) {
        (Some((p, parent_checkpoint)), _) => (Some(p), Some(parent_checkpoint)),
        (None, Some((prev, prev_checkpoint))) => (Some(*prev), Some(Arc::clone(prev_checkpoint))),
        (None, None) => (None, None),
    };
    let changes = match old {
        Some(old) => DiffStats::between(
            &old.index,
            &checkpoint.index,
            &mut same_bytes(&old, checkpoint),
        ),
        // Nothing on the old side: no file is compared.
        None => DiffStats::between(&empty_index(), &checkpoint.index, &mut |_, _| true),
    };
    Ok((base, changes))
}

/// A turn's line of text: its time, digest, size and changes, or why it failed.
fn line(turn: &Turn<'_>) -> String {
    let time = humantime::format_rfc3339_seconds(turn.info.last_modified);
    let (id, size) = (turn.info.id.short(), turn.info.size);
    let (summary, changes) = match &turn.contents {
        Ok(contents) => contents,
        Err(reason) => return format!("{time}  {id}  {size} bytes  FAILED: {reason}"),
    };
    let DiffStats {
        added,
        removed,
        modified,
        bytes_added,
        bytes_removed,
    } = *changes;
    format!(
        "{time}  {id}  {size} bytes  {} files  +{added} ~{modified} -{removed}  \
         +{bytes_added} -{bytes_removed} bytes{}",
        summary.files,
        parent_note(turn),
    )
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
    /// Why the checkpoint could not be read (absent when it was read); the counts
    /// below are then null.
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<&'a str>,
    entries: Option<u64>,
    files: Option<u64>,
    unpacked_bytes: Option<u64>,
    previous: Option<&'a str>,
    parent: Option<&'a str>,
    compared_with: Option<&'a str>,
    added: Option<u64>,
    modified: Option<u64>,
    removed: Option<u64>,
    bytes_added: Option<u64>,
    bytes_removed: Option<u64>,
}

fn json<'a>(turn: &'a Turn<'a>) -> JsonTurn<'a> {
    let contents = turn.contents.as_ref().ok();
    let (summary, changes) = (contents.map(|c| &c.0), contents.map(|c| &c.1));
    JsonTurn {
        sha256: turn.info.id.as_str(),
        size: turn.info.size,
        last_modified: humantime::format_rfc3339_seconds(turn.info.last_modified).to_string(),
        failed: turn.contents.as_ref().err().map(String::as_str),
        entries: summary.map(|s| s.entries),
        files: summary.map(|s| s.files),
        unpacked_bytes: summary.map(|s| s.unpacked_bytes),
        previous: turn.previous.map(|p| p.id.as_str()),
        parent: turn.parent.as_ref().map(CheckpointId::as_str),
        compared_with: turn.base.map(|b| b.id.as_str()),
        added: changes.map(|c| c.added),
        modified: changes.map(|c| c.modified),
        removed: changes.map(|c| c.removed),
        bytes_added: changes.map(|c| c.bytes_added),
        bytes_removed: changes.map(|c| c.bytes_removed),
    }
}
