//! One turn of `ckptfs report`: what changed from the turn it is compared with, as
//! counts and as the HTML of its page (the changes, each with its diff, and the list
//! of every entry).
//!
//! The page is bounded whatever the turn holds: a file's diff is shown up to
//! [`PATCH_MAX_BYTES`] a side and within the command's [`PatchBudget`] (as in `diff
//! --patch`), the diffs of one page up to [`PAGE_DIFF_BYTES`] and its entry list up to
//! [`PAGE_ENTRIES`]; past those, the page says what it left out. Lines are counted for
//! every text file within the per-file bound, shown or not.
//!
//! A rename is an added file whose bytes equal those of a removed one (paired by size
//! and checksum, then compared byte for byte: the checksum is not a cryptographic one,
//! and a "renamed" label must never hide a change).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::diff::{
    self, ChangeKind, Fields, PATCH_MAX_BYTES, Patch, PatchBudget, empty_index, type_name,
};
use super::html::{self, Lines};
use super::tree::{FileReader, walk};
use crate::archive::index::{Index, Node, NodeKind};
use crate::cache::VerifiedCheckpoint;

/// The diffs of one page, in bytes of HTML; the rest of its changes are listed
/// without them.
pub const PAGE_DIFF_BYTES: usize = 4 << 20;
/// The entries a page lists in full.
pub const PAGE_ENTRIES: usize = 50_000;
/// The changes a page shows one by one (the rest are counted).
pub const PAGE_CHANGES: usize = 10_000;
/// Removed files an added one is compared with, looking for a rename.
const RENAME_CANDIDATES: usize = 4;
/// The bytes a turn compares in all, looking for renames.
const RENAME_BYTES: u64 = 256 << 20;

/// What a turn holds and what changed in it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStats {
    /// Regular files (a hard-linked file once per path).
    pub files: u64,
    /// The bytes of its files' contents.
    pub unpacked_bytes: u64,
    /// Files and symlinks (not directories) added, modified, removed, renamed.
    pub added: u64,
    pub modified: u64,
    pub removed: u64,
    pub renamed: u64,
    pub lines_added: u64,
    pub lines_removed: u64,
}

/// A turn's counts and the HTML of its page between the heading and the end.
pub struct TurnBody {
    pub stats: TurnStats,
    pub html: String,
}

/// A change, kept past the walk (renames are found once all are known).
struct Found {
    path: Vec<u8>,
    kind: ChangeKind,
    fields: Fields,
    old: Option<u32>,
    new: Option<u32>,
    /// For an added file: the removed path (and node) it was renamed from.
    renamed_from: Option<(Vec<u8>, u32)>,
    /// A removed file that a rename accounts for (shown with the added side).
    renamed_away: bool,
}

/// The page of `new` compared with `base` (`None`: the first turn, everything added).
pub fn turn(
    base: Option<&VerifiedCheckpoint>,
    new: &VerifiedCheckpoint,
    budget: &mut PatchBudget,
) -> io::Result<TurnBody> {
    let nothing = empty_index();
    let old_index = base.map_or(&nothing, |b| &b.index);
    let found = changes_of(base, old_index, new);
    let summary = super::tree::summarize(&new.index);
    let mut stats = TurnStats {
        files: summary.files,
        unpacked_bytes: summary.unpacked_bytes,
        ..TurnStats::default()
    };
    let mut changes = String::new();
    let mut shown_bytes = 0;
    let mut left_out = 0;
    let mut shown_changes = 0usize;
    for change in &found {
        if change.renamed_away {
            continue;
        }
        let old = change.old.and_then(|i| Some((i, old_index.node(i)?)));
        let new_node = change.new.and_then(|i| Some((i, new.index.node(i)?)));
        let counts = [old, new_node]
            .iter()
            .flatten()
            .any(|(_, n)| !matches!(n.kind, NodeKind::Dir { .. }));
        let marker = if change.renamed_from.is_some() {
            'R'
        } else {
            change.kind.marker()
        };
        if counts {
            match marker {
                'A' => stats.added += 1,
                'D' => stats.removed += 1,
                'R' => stats.renamed += 1,
                _ => stats.modified += 1,
            }
        }
        let mut block = change_head(change, marker, old_index, old, new_node);
        if change.renamed_from.is_none() {
            let (detail, lines) = contents(change, (base, old), (new, new_node), budget)?;
            stats.lines_added += lines.added;
            stats.lines_removed += lines.removed;
            if shown_bytes + detail.len() <= PAGE_DIFF_BYTES {
                shown_bytes += detail.len();
                block.push_str(&detail);
            } else if !detail.is_empty() {
                left_out += 1;
                block.push_str("<p class=\"muted\">Diff not shown: this page's limit.</p>");
            }
        }
        block.push_str("</div>\n");
        shown_changes += 1;
        if shown_changes <= PAGE_CHANGES {
            changes.push_str(&block);
        }
    }
    let mut out = counts_html(&stats);
    if found.is_empty() {
        out.push_str("<p class=\"muted\">Nothing changed.</p>\n");
    }
    if left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"muted\">The diffs of {left_out} files are left out past {} of \
             diffs on one page; <code>ckptfs diff --patch</code> shows them.</p>",
            html::bytes(PAGE_DIFF_BYTES as u64)
        );
    }
    if shown_changes > PAGE_CHANGES {
        let _ = writeln!(
            out,
            "<p class=\"muted\">The first {PAGE_CHANGES} of {shown_changes} changes are \
             shown; <code>ckptfs diff</code> lists them all.</p>"
        );
    }
    out.push_str(&changes);
    out.push_str(&entry_list(&new.index));
    Ok(TurnBody { stats, html: out })
}

/// The changes from `old_index` (`base`'s, or an empty one) to `new`, renames paired.
fn changes_of(
    base: Option<&VerifiedCheckpoint>,
    old_index: &Index,
    new: &VerifiedCheckpoint,
) -> Vec<Found> {
    let mut found = Vec::new();
    // No file is compared when there is no base.
    let mut trust = |_, _| true;
    let mut read_back;
    let same: &mut diff::SameBytes<'_> = match base {
        Some(base) => {
            read_back = super::tree::same_bytes(base, new);
            &mut read_back
        }
        None => &mut trust,
    };
    diff::diff::<()>(old_index, &new.index, same, |c| {
        found.push(Found {
            path: c.path.to_vec(),
            kind: c.kind,
            fields: c.fields,
            old: c.old.map(|(i, _)| i),
            new: c.new.map(|(i, _)| i),
            renamed_from: None,
            renamed_away: false,
        });
        Ok(())
    })
    .expect("the visitor does not fail");
    if let Some(base) = base {
        pair_renames(&mut found, base, new);
    }
    found
}

/// The start of a change's block: its marker and path, where it was renamed from,
/// what changed of its mode, owner or time, and a new symlink's target.
fn change_head(
    change: &Found,
    marker: char,
    old_index: &Index,
    old: Option<(u32, &Node)>,
    new_node: Option<(u32, &Node)>,
) -> String {
    let mut block = String::new();
    let _ = write!(
        block,
        "<div class=\"change\"><h3>{marker} {}</h3>",
        html::name(&change.path)
    );
    if let Some((from, from_node)) = &change.renamed_from {
        let _ = write!(
            block,
            "<p>renamed from <code>{}</code>, same contents</p>",
            html::name(from)
        );
        // What else changed with the name: a rename may make a file executable.
        if let (Some(a), Some((_, b))) = (old_index.node(*from_node), new_node) {
            for line in field_lines(Fields::between(a, b), a, b) {
                let _ = write!(block, "<p class=\"muted\">{line}</p>");
            }
        }
    }
    if let (Some((_, a)), Some((_, b))) = (old, new_node) {
        for line in field_lines(change.fields, a, b) {
            let _ = write!(block, "<p class=\"muted\">{line}</p>");
        }
    }
    if let Some((_, node)) = new_node.filter(|_| change.kind == ChangeKind::Added)
        && let NodeKind::Symlink { target } = &node.kind
    {
        let _ = write!(
            block,
            "<p class=\"muted\">symlink to <code>{}</code></p>",
            html::name(target)
        );
    }
    block
}

/// The page's heading and its counts of changes and lines.
fn counts_html(stats: &TurnStats) -> String {
    format!(
        "<h2>Changes</h2>\n<p>{} added, {} modified, {} removed, {} renamed; \
         +{} &minus;{} lines.</p>\n",
        stats.added,
        stats.modified,
        stats.removed,
        stats.renamed,
        stats.lines_added,
        stats.lines_removed
    )
}

/// Pairs each added file with a removed file of the same bytes. Bounded: each added
/// file is compared with at most [`RENAME_CANDIDATES`] removed files of its size and
/// checksum, and a turn compares at most [`RENAME_BYTES`] in all (files made to
/// collide could otherwise cost a comparison of every pair).
fn pair_renames(found: &mut [Found], base: &VerifiedCheckpoint, new: &VerifiedCheckpoint) {
    let key = |index: &Index, node: Option<u32>| -> Option<(u64, u64)> {
        match index.node(node?)?.kind {
            NodeKind::File { size, checksum, .. } => Some((size, checksum)),
            _ => None,
        }
    };
    let mut removed: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
    for (i, change) in found.iter().enumerate() {
        if change.kind == ChangeKind::Removed
            && let Some(k) = key(&base.index, change.old)
        {
            removed.entry(k).or_default().push(i);
        }
    }
    let mut same = super::tree::same_bytes(base, new);
    let mut budget = RENAME_BYTES;
    for i in 0..found.len() {
        if found[i].kind != ChangeKind::Added {
            continue;
        }
        let Some(k) = key(&new.index, found[i].new) else {
            continue;
        };
        let Some(candidates) = removed.get_mut(&k) else {
            continue;
        };
        let new_node = found[i].new.expect("added");
        let mut matched = None;
        for (at, &j) in candidates.iter().enumerate().take(RENAME_CANDIDATES) {
            if budget < k.0 {
                return;
            }
            budget -= k.0;
            if same(found[j].old.expect("removed"), new_node) {
                matched = Some(at);
                break;
            }
        }
        if let Some(at) = matched {
            let j = candidates.swap_remove(at);
            found[j].renamed_away = true;
            found[i].renamed_from = Some((found[j].path.clone(), found[j].old.expect("removed")));
        }
    }
}

/// The fields other than contents that changed, as lines of HTML.
fn field_lines(fields: Fields, a: &Node, b: &Node) -> Vec<String> {
    let mut lines = Vec::new();
    if fields.kind {
        lines.push(format!("type {} &rarr; {}", type_name(a), type_name(b)));
    }
    if fields.mode {
        lines.push(format!("mode {:04o} &rarr; {:04o}", a.mode, b.mode));
    }
    if fields.owner {
        lines.push(format!(
            "owner {}:{} &rarr; {}:{}",
            a.uid, a.gid, b.uid, b.gid
        ));
    }
    if fields.target {
        let target = |n: &Node| match &n.kind {
            NodeKind::Symlink { target } => html::name(target),
            _ => String::new(),
        };
        lines.push(format!(
            "target <code>{}</code> &rarr; <code>{}</code>",
            target(a),
            target(b)
        ));
    }
    lines
}

type Side<'a> = (Option<&'a VerifiedCheckpoint>, Option<(u32, &'a Node)>);

/// The HTML of a change's contents (a diff, or the sizes and digests of a binary
/// file) and the lines it adds and removes.
fn contents(
    change: &Found,
    (base, old): Side<'_>,
    (new, new_node): (&VerifiedCheckpoint, Option<(u32, &Node)>),
    budget: &mut PatchBudget,
) -> io::Result<(String, Lines)> {
    let shows = match change.kind {
        ChangeKind::Modified => change.fields.content || change.fields.kind,
        ChangeKind::Added | ChangeKind::Removed => true,
    };
    fn file(side: Option<(u32, &Node)>) -> Option<u32> {
        side.filter(|(_, n)| diff::file_size(n).is_some())
            .map(|(i, _)| i)
    }
    let old_file = file(old).and_then(|i| Some((base?, i)));
    let new_file = file(new_node).map(|i| (new, i));
    if !shows || (old_file.is_none() && new_file.is_none()) {
        return Ok((String::new(), Lines::default()));
    }
    let read = |side: Option<(&VerifiedCheckpoint, u32)>| -> io::Result<Option<Option<Vec<u8>>>> {
        side.map(|(checkpoint, node)| FileReader::new(checkpoint, node)?.read_all(PATCH_MAX_BYTES))
            .transpose()
    };
    let (old_data, new_data) = (read(old_file)?, read(new_file)?);
    let too_large = matches!(old_data, Some(None)) || matches!(new_data, Some(None));
    let patch = if too_large {
        Patch::Binary
    } else {
        diff::unified_diff(
            &change.path,
            old_data.flatten().as_deref(),
            new_data.flatten().as_deref(),
            budget,
        )
    };
    match patch {
        Patch::Text(text) if text.is_empty() => Ok((String::new(), Lines::default())),
        Patch::Text(text) => Ok((html::patch(&text), html::count_lines(&text))),
        Patch::Binary => {
            let mut out = String::from("<p>");
            if too_large {
                let _ = write!(
                    out,
                    "Larger than {}, not shown as text. ",
                    html::bytes(PATCH_MAX_BYTES)
                );
            } else {
                out.push_str("Binary file. ");
            }
            for (label, side) in [("old", old_file), ("new", new_file)] {
                if let Some((checkpoint, node)) = side {
                    let mut reader = FileReader::new(checkpoint, node)?;
                    let size = reader.size();
                    let mut hasher = Sha256::new();
                    io::copy(&mut reader, &mut hasher)?;
                    let exact = match size {
                        0..1024 => String::new(),
                        _ => format!(" ({size} bytes)"),
                    };
                    let _ = write!(
                        out,
                        "{label}: {}{exact}, sha256 <code>{}</code>. ",
                        html::bytes(size),
                        hex::encode(hasher.finalize())
                    );
                }
            }
            out.push_str("</p>");
            Ok((out, Lines::default()))
        }
    }
}

/// Every entry of the turn, folded.
fn entry_list(index: &Index) -> String {
    let mut lines = String::new();
    let mut count = 0usize;
    walk::<()>(index, |path, _, node| {
        count += 1;
        if count > PAGE_ENTRIES {
            return Ok(());
        }
        let (kind, size, target) = match &node.kind {
            NodeKind::Dir { .. } => ('d', String::new(), String::new()),
            NodeKind::File { size, .. } => ('-', size.to_string(), String::new()),
            NodeKind::Symlink { target } => {
                ('l', String::new(), format!(" -&gt; {}", html::name(target)))
            }
        };
        let _ = writeln!(
            lines,
            "{kind}{:04o} {:>4}:{:<4} {size:>10}  {}{target}",
            node.mode,
            node.uid,
            node.gid,
            html::name(path)
        );
        Ok(())
    })
    .expect("the visitor does not fail");
    let more = if count > PAGE_ENTRIES {
        format!(
            "<p class=\"muted\">The first {PAGE_ENTRIES} of {count} entries; \
             <code>ckptfs find</code> lists them all.</p>"
        )
    } else {
        String::new()
    };
    format!(
        "<details><summary>All {count} entries of this turn</summary>{more}\
         <pre class=\"scroll\">{lines}</pre></details>\n"
    )
}
