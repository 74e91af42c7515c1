//! What changed between two checkpoints, entry by entry, in path order.
//!
//! Two entries at the same path are compared on their type, contents, permission
//! bits, numeric owner and symlink target. Contents are compared by the size and xxh3
//! checksum that the index records for every file, and when those are equal by the
//! caller's [`SameBytes`] (the bytes: xxh3 collisions can be made on purpose). Not
//! compared: modification times (every rewrite of a file changes them, and a
//! directory's changes with every entry made in it), link counts, and the modes of
//! symlinks (Linux ignores them). Each entry below a directory that exists on one side
//! only, or that took the place of something else, is reported on its own.
//!
//! Bytes are counted the way `git diff --stat` counts lines: an added file adds its
//! size, a removed one removes its size, and a file whose contents changed (or that
//! became or stopped being a file) removes its old size and adds its new one.
//!
//! The walk is that of [`super::tree`], over both indexes at once: no list of paths is
//! held, and changes are handed to the caller as they are found.

use std::io::Write;
use std::time::{Duration, Instant};

use similar::{Algorithm, TextDiff};

use super::tree::{PathStep, children, depth_first, is_dir, step_order};
use crate::archive::index::{Index, Node, NodeKind, ROOT};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// In the new checkpoint only.
    Added,
    /// In the old checkpoint only.
    Removed,
    /// In both, different.
    Modified,
}

impl ChangeKind {
    /// `A`, `D` or `M`, as `git diff --name-status` writes them.
    pub fn marker(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Removed => 'D',
            ChangeKind::Modified => 'M',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Modified => "modified",
        }
    }
}

/// What differs between two entries at the same path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fields {
    /// File, directory or symlink.
    pub kind: bool,
    /// Both files, with other contents.
    pub content: bool,
    /// Permission bits (not compared between symlinks).
    pub mode: bool,
    /// Numeric owner or group.
    pub owner: bool,
    /// Both symlinks, pointing elsewhere.
    pub target: bool,
}

impl Fields {
    pub fn between(old: &Node, new: &Node) -> Fields {
        use NodeKind::*;
        let (content, target, both_links) = match (&old.kind, &new.kind) {
            (
                File {
                    size: a,
                    checksum: x,
                    ..
                },
                File {
                    size: b,
                    checksum: y,
                    ..
                },
            ) => ((a, x) != (b, y), false, false),
            (Symlink { target: a }, Symlink { target: b }) => (false, a != b, true),
            _ => (false, false, false),
        };
        Fields {
            kind: std::mem::discriminant(&old.kind) != std::mem::discriminant(&new.kind),
            content,
            mode: !both_links && old.mode != new.mode,
            owner: (old.uid, old.gid) != (new.uid, new.gid),
            target,
        }
    }

    pub fn any(self) -> bool {
        self != Fields::default()
    }

    /// The names of the fields that differ: `type`, `content`, `mode`, `owner`,
    /// `target`, in that order.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.kind, "type"),
            (self.content, "content"),
            (self.mode, "mode"),
            (self.owner, "owner"),
            (self.target, "target"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

/// One changed entry.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub path: &'a [u8],
    pub kind: ChangeKind,
    /// What differs (all false unless modified).
    pub fields: Fields,
    /// The entry in the old checkpoint (node index and node), unless added.
    pub old: Option<(u32, &'a Node)>,
    /// The entry in the new checkpoint, unless removed.
    pub new: Option<(u32, &'a Node)>,
}

/// `file`, `directory` or `symlink`.
pub fn type_name(node: &Node) -> &'static str {
    match node.kind {
        NodeKind::Dir { .. } => "directory",
        NodeKind::File { .. } => "file",
        NodeKind::Symlink { .. } => "symlink",
    }
}

/// The size of a regular file; `None` for anything else.
pub fn file_size(node: &Node) -> Option<u64> {
    match node.kind {
        NodeKind::File { size, .. } => Some(size),
        _ => None,
    }
}

impl Change<'_> {
    /// Whether file contents were replaced, which is what bytes count.
    fn replaces_contents(&self) -> bool {
        match self.kind {
            ChangeKind::Added | ChangeKind::Removed => true,
            ChangeKind::Modified => self.fields.content || self.fields.kind,
        }
    }

    pub fn bytes_added(&self) -> u64 {
        match self.new {
            Some((_, node)) if self.replaces_contents() => file_size(node).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn bytes_removed(&self) -> u64 {
        match self.old {
            Some((_, node)) if self.replaces_contents() => file_size(node).unwrap_or(0),
            _ => 0,
        }
    }
}

/// An index with nothing in it but its root: what came before the first checkpoint.
pub fn empty_index() -> Index {
    Index {
        nodes: vec![Node {
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            nlink: 2,
            kind: NodeKind::Dir {
                children: Vec::new(),
            },
        }],
        unpacked_bytes: 0,
    }
}

#[derive(Clone, Copy)]
struct Step<'a> {
    name: &'a [u8],
    old: Option<u32>,
    new: Option<u32>,
    descend: bool,
}

impl PathStep for Step<'_> {
    fn name(&self) -> &[u8] {
        self.name
    }

    fn descend(&self) -> bool {
        self.descend
    }
}

/// The steps of a directory present on one side or both: the union of their
/// children, plus a descent below each name that is a directory on either side.
fn steps<'a>(
    old: &'a Index,
    old_dir: Option<u32>,
    new: &'a Index,
    new_dir: Option<u32>,
) -> Vec<Step<'a>> {
    let left = old_dir.map_or(&[][..], |d| children(old, d));
    let right = new_dir.map_or(&[][..], |d| children(new, d));
    let mut steps = Vec::with_capacity(left.len().max(right.len()));
    let (mut i, mut j) = (0, 0);
    while i < left.len() || j < right.len() {
        let order = match (left.get(i), right.get(j)) {
            (Some(a), Some(b)) => a.0.cmp(&b.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        let (name, o, n) = match order {
            std::cmp::Ordering::Less => {
                i += 1;
                (&left[i - 1].0, Some(left[i - 1].1), None)
            }
            std::cmp::Ordering::Greater => {
                j += 1;
                (&right[j - 1].0, None, Some(right[j - 1].1))
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
                (&left[i - 1].0, Some(left[i - 1].1), Some(right[j - 1].1))
            }
        };
        steps.push(Step {
            name,
            old: o,
            new: n,
            descend: false,
        });
        let o = o.filter(|&o| is_dir(old, o));
        let n = n.filter(|&n| is_dir(new, n));
        if o.is_some() || n.is_some() {
            steps.push(Step {
                name,
                old: o,
                new: n,
                descend: true,
            });
        }
    }
    steps.sort_by(|a, b| step_order((a.name, a.descend), (b.name, b.descend)));
    steps
}

/// Whether file node `old` of the old checkpoint and `new` of the new one hold the
/// same bytes; asked only of files whose size and xxh3 checksum are equal. The
/// checksum is not a cryptographic one: files can be made to collide, so only the
/// bytes can say that a file did not change ([`super::tree::same_bytes`]).
pub type SameBytes<'a> = dyn FnMut(u32, u32) -> bool + 'a;

/// Calls `visit` for every entry added, removed or modified from `old` to `new`, in
/// path order; stops at the first error and returns it.
pub fn diff<E>(
    old: &Index,
    new: &Index,
    same: &mut SameBytes<'_>,
    mut visit: impl FnMut(&Change<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let top = steps(old, Some(ROOT), new, Some(ROOT));
    let below = |step: Step<'_>| steps(old, step.old, new, step.new);
    depth_first(top, below, |path, step| {
        let o = step.old.and_then(|i| Some((i, old.node(i)?)));
        let n = step.new.and_then(|i| Some((i, new.node(i)?)));
        let (kind, fields) = match (o, n) {
            (Some(_), None) => (ChangeKind::Removed, Fields::default()),
            (None, Some(_)) => (ChangeKind::Added, Fields::default()),
            (Some((_, a)), Some((_, b))) => {
                let mut fields = Fields::between(a, b);
                let (oi, ni) = (step.old.expect("both"), step.new.expect("both"));
                if !fields.content
                    && file_size(a).is_some_and(|size| size > 0)
                    && file_size(b).is_some()
                    && !same(oi, ni)
                {
                    fields.content = true;
                }
                if !fields.any() {
                    return Ok(());
                }
                (ChangeKind::Modified, fields)
            }
            (None, None) => return Ok(()),
        };
        visit(&Change {
            path,
            kind,
            fields,
            old: o,
            new: n,
        })
    })
}

/// Counts of changed entries and the bytes they account for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffStats {
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    pub bytes_added: u64,
    pub bytes_removed: u64,
}

impl DiffStats {
    pub fn count(&mut self, change: &Change<'_>) {
        match change.kind {
            ChangeKind::Added => self.added += 1,
            ChangeKind::Removed => self.removed += 1,
            ChangeKind::Modified => self.modified += 1,
        }
        self.bytes_added += change.bytes_added();
        self.bytes_removed += change.bytes_removed();
    }

    pub fn between(old: &Index, new: &Index, same: &mut SameBytes<'_>) -> DiffStats {
        let mut stats = DiffStats::default();
        diff::<std::convert::Infallible>(old, new, same, |change| {
            stats.count(change);
            Ok(())
        })
        .unwrap_or_else(|never| match never {});
        stats
    }
}

/// Largest file (on either side) that `diff --patch` shows as text.
pub const PATCH_MAX_BYTES: u64 = 4 << 20;

/// How long finding a minimal diff of one file may take before a larger, still
/// correct one is accepted (the rest of the file shown as removed and added).
const PATCH_SEARCH_PER_FILE: Duration = Duration::from_millis(500);

/// How long one command may spend searching for minimal diffs over all its files.
const PATCH_SEARCH_TOTAL: Duration = Duration::from_secs(3);

/// The search time `diff --patch` has left. Myers' search costs up to the product of
/// the two files' line counts when they differ everywhere (a minified file, a file
/// rewritten): each file gets at most [`PATCH_SEARCH_PER_FILE`], and once the command
/// has spent [`PATCH_SEARCH_TOTAL`], files get the quick diff the search falls back
/// to, which is correct and linear in the lines, only not minimal. A hostile pair of
/// trees thus costs reading and hashing their lines, not their product.
#[derive(Debug)]
pub struct PatchBudget {
    left: Duration,
}

impl Default for PatchBudget {
    fn default() -> Self {
        PatchBudget {
            left: PATCH_SEARCH_TOTAL,
        }
    }
}

/// A file's contents as `diff --patch` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Patch {
    /// A unified diff with `--- a/PATH` and `+++ b/PATH` headers (`/dev/null` for a
    /// side that has no file); empty when there is no line to show (an empty file).
    Text(Vec<u8>),
    /// Either side holds a NUL byte in its first 8000 bytes (git's rule).
    Binary,
}

/// Git's test for binary contents.
pub fn looks_binary(data: &[u8]) -> bool {
    data[..data.len().min(8000)].contains(&0)
}

/// The unified diff (3 lines of context) of file `path` from `old` to `new`
/// (`None`: no file on that side). Lines are compared as bytes: text that is not
/// UTF-8 is shown as it is.
pub fn unified_diff(
    path: &[u8],
    old: Option<&[u8]>,
    new: Option<&[u8]>,
    budget: &mut PatchBudget,
) -> Patch {
    if old.is_some_and(looks_binary) || new.is_some_and(looks_binary) {
        return Patch::Binary;
    }
    let started = Instant::now();
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Myers)
        .deadline(started + budget.left.min(PATCH_SEARCH_PER_FILE))
        .diff_lines(old.unwrap_or_default(), new.unwrap_or_default());
    budget.left = budget.left.saturating_sub(started.elapsed());
    let mut out = Vec::new();
    let header = |side: &[u8], present: bool| -> Vec<u8> {
        if present {
            [side, crate::printable::escape(path).as_bytes()].concat()
        } else {
            b"/dev/null".to_vec()
        }
    };
    // The crate's own writer would make each line valid UTF-8 first.
    let unified = diff.unified_diff();
    for (i, hunk) in unified.iter_hunks().enumerate() {
        if i == 0 {
            out.extend_from_slice(b"--- ");
            out.extend(header(b"a/", old.is_some()));
            out.extend_from_slice(b"\n+++ ");
            out.extend(header(b"b/", new.is_some()));
            out.push(b'\n');
        }
        hunk.to_writer(&mut out).expect("writing to memory");
    }
    // Leave no line unterminated, whatever the last hunk ended with.
    if out.last().is_some_and(|&b| b != b'\n') {
        let _ = writeln!(out);
    }
    Patch::Text(out)
}

#[cfg(test)]
mod tests {
    use super::super::tree::tests::index_of;
    use super::*;

    fn changes(old: &Index, new: &Index) -> Vec<String> {
        let mut out = Vec::new();
        diff::<()>(old, new, &mut |_, _| true, |c| {
            out.push(format!(
                "{} {} {}",
                c.kind.marker(),
                String::from_utf8_lossy(c.path),
                c.fields.names().join(",")
            ));
            Ok(())
        })
        .unwrap();
        out.iter().map(|s| s.trim_end().to_owned()).collect()
    }

    #[test]
    fn every_kind_of_change_in_path_order() {
        let old = index_of(&[
            ("keep", "same"),
            ("edit", "old text"),
            ("gone", "bye"),
            ("link", "l:keep"),
            ("x", "was a file"),
            ("dir", "d"),
            ("dir/inner", "1"),
            ("dir/sub", "d"),
            ("dir/sub/deep", "2"),
        ]);
        let mut new = index_of(&[
            ("keep", "same"),
            ("edit", "new text!"),
            ("link", "l:edit"),
            ("x", "d"),
            ("x/child", "3"),
            ("dir", "l:keep"),
            ("fresh", "hello"),
        ]);
        // `keep`: same contents, another mode and owner.
        let keep = new.lookup(ROOT, b"keep").unwrap() as usize;
        new.nodes[keep].mode = 0o755;
        new.nodes[keep].uid = 0;
        assert_eq!(
            changes(&old, &new),
            [
                "M dir type,mode",
                "D dir/inner",
                "D dir/sub",
                "D dir/sub/deep",
                "M edit content",
                "A fresh",
                "D gone",
                "M keep mode,owner",
                "M link target",
                "M x type,mode",
                "A x/child",
            ]
        );
        let stats = DiffStats::between(&old, &new, &mut |_, _| true);
        assert_eq!(
            stats,
            DiffStats {
                added: 2,
                removed: 4,
                modified: 5,
                // fresh, edit's new text, x/child
                bytes_added: 5 + 9 + 1,
                // inner, deep, gone, edit's old text, x's old contents
                bytes_removed: 1 + 1 + 3 + 8 + 10,
            }
        );
        assert!(changes(&new, &new).is_empty());
    }

    #[test]
    fn everything_is_added_after_nothing() {
        let index = index_of(&[("a", "d"), ("a/b", "12"), ("c", "l:a")]);
        assert_eq!(changes(&empty_index(), &index), ["A a", "A a/b", "A c"]);
        assert_eq!(changes(&index, &empty_index()), ["D a", "D a/b", "D c"]);
        let stats = DiffStats::between(&empty_index(), &index, &mut |_, _| true);
        assert_eq!((stats.added, stats.bytes_added), (3, 2));
    }

    /// Equal sizes and checksums are not enough: a file whose bytes differ (an xxh3
    /// collision, which can be made on purpose) is modified (attacker review).
    #[test]
    fn equal_checksums_are_checked_against_the_bytes() {
        let old = index_of(&[("f", "x"), ("g", "y"), ("empty", "")]);
        let new = old.clone();
        let mut asked = Vec::new();
        let mut differ = |a: u32, b: u32| {
            asked.push((a, b));
            false
        };
        let mut found = Vec::new();
        diff::<()>(&old, &new, &mut differ, |c| {
            found.push((
                String::from_utf8_lossy(c.path).into_owned(),
                c.fields.names(),
            ));
            Ok(())
        })
        .unwrap();
        // An empty file has no bytes to differ in.
        assert_eq!(
            found,
            [
                ("f".to_owned(), vec!["content"]),
                ("g".to_owned(), vec!["content"])
            ]
        );
        assert_eq!(asked.len(), 2);
        assert!(changes(&old, &new).is_empty(), "the same bytes: no change");
    }

    #[test]
    fn mtimes_alone_are_no_change() {
        let old = index_of(&[("f", "x")]);
        let mut new = old.clone();
        for node in &mut new.nodes {
            node.mtime = 1_700_000_000;
        }
        assert!(changes(&old, &new).is_empty());
    }

    #[test]
    fn unified_diffs_of_text_and_binary() {
        let mut budget = PatchBudget::default();
        let Patch::Text(text) = unified_diff(
            b"f.txt",
            Some(b"a\nb\nc\n"),
            Some(b"a\nB\nc\n"),
            &mut budget,
        ) else {
            panic!("not text")
        };
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
        );
        let Patch::Text(text) = unified_diff(b"new", None, Some(b"x"), &mut budget) else {
            panic!("not text")
        };
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "--- /dev/null\n+++ b/new\n@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n"
        );
        let Patch::Text(text) = unified_diff(b"l1", Some(b"caf\xe9\n"), None, &mut budget) else {
            panic!("not text")
        };
        assert_eq!(text, b"--- a/l1\n+++ /dev/null\n@@ -1 +0,0 @@\n-caf\xe9\n");
        assert_eq!(
            unified_diff(b"empty", None, Some(b""), &mut budget),
            Patch::Text(Vec::new())
        );
        assert_eq!(
            unified_diff(b"bin", Some(b"a\0b"), Some(b"text"), &mut budget),
            Patch::Binary
        );
    }
}
