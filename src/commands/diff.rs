//! `ckptfs diff STORE A B [--stat|--json|--patch]`: the entries added, removed and
//! modified from checkpoint A to checkpoint B, in path order. Both are verified before
//! anything is printed; contents are read only for `--patch`.

use std::io::{self, Write};

use anyhow::{Context, Result};
use serde::Serialize;

use super::review_session::ReviewSession;
use crate::archive::index::{Node, NodeKind};
use crate::cache::VerifiedCheckpoint;
use crate::cli::{Cli, DiffArgs};
use crate::review::diff::{
    self, Change, ChangeKind, DiffStats, PATCH_MAX_BYTES, Patch, PatchBudget, type_name,
};
use crate::review::tree::{FileReader, same_bytes};

pub(super) fn run(cli: &Cli, args: &DiffArgs) -> Result<i32> {
    let session = ReviewSession::open(
        cli,
        &args.store,
        &args.review,
        crate::review::exact_for(&[args.old.as_str(), args.new.as_str()]),
    )?;
    let (old_info, new_info) = (session.resolve(&args.old)?, session.resolve(&args.new)?);
    let old = session.load(&old_info)?;
    let new = session.load(&new_info)?;
    session.trim(&[&old_info.id, &new_info.id]);
    let mut out = io::BufWriter::new(io::stdout().lock());
    if args.stat {
        let DiffStats {
            added,
            removed,
            modified,
            bytes_added,
            bytes_removed,
        } = DiffStats::between(&old.index, &new.index, &mut same_bytes(&old, &new));
        writeln!(
            out,
            "{added} added, {removed} removed, {modified} modified; \
             +{bytes_added} -{bytes_removed} bytes"
        )?;
    } else if args.json {
        let mut first = true;
        out.write_all(b"[")?;
        diff::diff(
            &old.index,
            &new.index,
            &mut same_bytes(&old, &new),
            |change| -> io::Result<()> {
                out.write_all(if first { b"\n  " } else { b",\n  " })?;
                first = false;
                serde_json::to_writer(&mut out, &json(change))?;
                Ok(())
            },
        )?;
        out.write_all(if first { b"]\n" } else { b"\n]\n" })?;
    } else {
        let mut budget = PatchBudget::default();
        diff::diff(
            &old.index,
            &new.index,
            &mut same_bytes(&old, &new),
            |change| -> Result<()> {
                let path = crate::printable::escape(change.path);
                writeln!(out, "{} {path}", change.kind.marker())?;
                if args.patch {
                    write_details(&mut out, change, (&old, &new), &mut budget)?;
                }
                Ok(())
            },
        )?;
    }
    out.flush()?;
    Ok(0)
}

fn target(node: &Node) -> &[u8] {
    match &node.kind {
        NodeKind::Symlink { target } => target,
        _ => b"",
    }
}

/// A path or link target for JSON: as it is when UTF-8, else with `\xNN` escapes.
fn json_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => crate::archive::display_path(bytes),
    }
}

/// One change in `--json`.
#[derive(Serialize)]
struct JsonChange {
    path: String,
    change: &'static str,
    fields: Vec<&'static str>,
    old: Option<JsonEntry>,
    new: Option<JsonEntry>,
}

/// One side of a change in `--json`.
#[derive(Serialize)]
struct JsonEntry {
    #[serde(rename = "type")]
    kind: &'static str,
    mode: String,
    uid: u32,
    gid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

impl JsonEntry {
    fn of(node: &Node) -> Self {
        JsonEntry {
            kind: type_name(node),
            mode: format!("{:04o}", node.mode),
            uid: node.uid,
            gid: node.gid,
            size: diff::file_size(node),
            target: match &node.kind {
                NodeKind::Symlink { target } => Some(json_bytes(target)),
                _ => None,
            },
        }
    }
}

fn json(change: &Change<'_>) -> JsonChange {
    JsonChange {
        path: json_bytes(change.path),
        change: change.kind.name(),
        fields: change.fields.names(),
        old: change.old.map(|(_, node)| JsonEntry::of(node)),
        new: change.new.map(|(_, node)| JsonEntry::of(node)),
    }
}

/// Under a change's line: the fields other than contents that changed, then the
/// unified diff of a file's contents.
fn write_details(
    out: &mut impl Write,
    change: &Change<'_>,
    (old, new): (&VerifiedCheckpoint, &VerifiedCheckpoint),
    budget: &mut PatchBudget,
) -> Result<()> {
    if let (Some((_, a)), Some((_, b))) = (change.old, change.new) {
        let fields = change.fields;
        if fields.kind {
            writeln!(out, "type {} -> {}", type_name(a), type_name(b))?;
        }
        if fields.mode {
            writeln!(out, "mode {:04o} -> {:04o}", a.mode, b.mode)?;
        }
        if fields.owner {
            writeln!(out, "owner {}:{} -> {}:{}", a.uid, a.gid, b.uid, b.gid)?;
        }
        if fields.target {
            let (a, b) = (target(a), target(b));
            let (a, b) = (crate::printable::escape(a), crate::printable::escape(b));
            writeln!(out, "target {a} -> {b}")?;
        }
    }
    let shows_contents = match change.kind {
        ChangeKind::Modified => change.fields.content,
        ChangeKind::Added | ChangeKind::Removed => true,
    };
    let is_file = |&(_, node): &(u32, &Node)| diff::file_size(node).is_some();
    let (old_file, new_file) = (change.old.filter(is_file), change.new.filter(is_file));
    if !shows_contents || (old_file.is_none() && new_file.is_none()) {
        return Ok(());
    }
    let read = |checkpoint: &VerifiedCheckpoint, side: Option<(u32, &Node)>| {
        side.map(|(node, _)| {
            FileReader::new(checkpoint, node)
                .and_then(|reader| reader.read_all(PATCH_MAX_BYTES))
                .with_context(|| {
                    format!(
                        "cannot read {} of checkpoint {}",
                        crate::archive::display_path(change.path),
                        checkpoint.id
                    )
                })
        })
        .transpose()
    };
    let (old_data, new_data) = (read(old, old_file)?, read(new, new_file)?);
    if matches!(old_data, Some(None)) || matches!(new_data, Some(None)) {
        writeln!(out, "Not shown: larger than {}MiB", PATCH_MAX_BYTES >> 20)?;
        return Ok(());
    }
    match diff::unified_diff(
        change.path,
        old_data.flatten().as_deref(),
        new_data.flatten().as_deref(),
        budget,
    ) {
        // On a terminal, a file's control characters are shown escaped: they could
        // erase the lines above and print others. Piped, the patch is as it is.
        Patch::Text(text) if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            out.write_all(&crate::printable::for_terminal(&text))?
        }
        Patch::Text(text) => out.write_all(&text)?,
        Patch::Binary => writeln!(out, "Binary files differ")?,
    }
    Ok(())
}
