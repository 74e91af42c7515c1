//! `ckptfs log STORE [--json]`: the checkpoints oldest first, each with what changed
//! since the one before. Every checkpoint is verified before anything is printed.

use std::io::{self, Write};
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;

use super::review_session::Session;
use crate::cache::VerifiedCheckpoint;
use crate::checkpoint::CheckpointInfo;
use crate::cli::{Cli, LogArgs};
use crate::review::diff::{DiffStats, empty_index};
use crate::review::tree::{TreeSummary, summarize};

struct Turn<'a> {
    info: &'a CheckpointInfo,
    summary: TreeSummary,
    changes: DiffStats,
    previous: Option<&'a CheckpointInfo>,
}

pub(super) fn run(cli: &Cli, args: &LogArgs) -> Result<i32> {
    let session = Session::open(
        cli,
        &args.store,
        &args.review,
        crate::checkpoint::Exact::All,
    )?;
    let mut turns = Vec::with_capacity(session.listing.len());
    let nothing = empty_index();
    let mut previous: Option<(&CheckpointInfo, Arc<VerifiedCheckpoint>)> = None;
    for info in &session.listing {
        let checkpoint = session.load(info)?;
        let before = previous.as_ref().map_or(&nothing, |(_, p)| &p.index);
        turns.push(Turn {
            info,
            summary: summarize(&checkpoint.index),
            changes: DiffStats::between(before, &checkpoint.index),
            previous: previous.as_ref().map(|(i, _)| *i),
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
                 +{bytes_added} -{bytes_removed} bytes",
                humantime::format_rfc3339_seconds(turn.info.last_modified),
                turn.info.id.short(),
                turn.info.size,
                turn.summary.files,
            )?;
        }
    }
    out.flush()?;
    Ok(0)
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
    added: u64,
    modified: u64,
    removed: u64,
    bytes_added: u64,
    bytes_removed: u64,
}

fn json<'a>(turn: &Turn<'a>) -> JsonTurn<'a> {
    JsonTurn {
        sha256: turn.info.id.as_str(),
        size: turn.info.size,
        last_modified: humantime::format_rfc3339_seconds(turn.info.last_modified).to_string(),
        entries: turn.summary.entries,
        files: turn.summary.files,
        unpacked_bytes: turn.summary.unpacked_bytes,
        previous: turn.previous.map(|p| p.id.as_str()),
        added: turn.changes.added,
        modified: turn.changes.modified,
        removed: turn.changes.removed,
        bytes_added: turn.changes.bytes_added,
        bytes_removed: turn.changes.bytes_removed,
    }
}
