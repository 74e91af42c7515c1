//! A checkpoint's [`Index`] as paths.
//!
//! A path is a byte string relative to the checkpoint's root: names joined by `/`, no
//! leading `/`, the root itself not an entry. Path order is the order of those byte
//! strings (what `LC_ALL=C sort` gives). [`walk`] visits entries in that order without
//! holding every path: it keeps the current path and, for each directory on the way
//! down, the list of that directory's children, ordered so that a directory's own
//! entry (key `name`) and its contents (key `name/`) fall where their paths sort
//! (`a` < `a-b` < `a/x`: `-` sorts before `/`).
//!
//! Lookups never follow symlinks: a checkpoint is a record, and a link may point
//! anywhere (outside it, too).

use std::cmp::Ordering;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};
use xxhash_rust::xxh3::Xxh3;

use crate::archive::display_path;
use crate::archive::index::{FileLocation, Index, Node, NodeKind, ROOT};
use crate::cache::VerifiedCheckpoint;

/// The children of directory `dir` (none for anything else).
pub(super) fn children(index: &Index, dir: u32) -> &[(Vec<u8>, u32)] {
    match index.node(dir).map(|n| &n.kind) {
        Some(NodeKind::Dir { children }) => children,
        _ => &[],
    }
}

pub(super) fn is_dir(index: &Index, node: u32) -> bool {
    matches!(
        index.node(node).map(|n| &n.kind),
        Some(NodeKind::Dir { .. })
    )
}

/// Orders a directory's steps as their paths sort: the entry `name` itself, or
/// (`descend`) the paths below it, which all begin with `name/`.
pub(super) fn step_order(a: (&[u8], bool), b: (&[u8], bool)) -> Ordering {
    fn key((name, descend): (&[u8], bool)) -> impl Iterator<Item = &u8> {
        let slash: &'static [u8] = if descend { b"/" } else { b"" };
        name.iter().chain(slash)
    }
    key(a).cmp(key(b))
}

#[derive(Clone, Copy)]
struct Step<'a> {
    name: &'a [u8],
    node: u32,
    /// The paths below `name` rather than `name` itself.
    descend: bool,
}

fn steps(index: &Index, dir: u32) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    for (name, node) in children(index, dir) {
        let (name, node) = (name.as_slice(), *node);
        steps.push(Step {
            name,
            node,
            descend: false,
        });
        if is_dir(index, node) {
            steps.push(Step {
                name,
                node,
                descend: true,
            });
        }
    }
    steps.sort_by(|a, b| step_order((a.name, a.descend), (b.name, b.descend)));
    steps
}

/// One step of a walk in path order: a name, and whether the walk enters it (the
/// paths below a directory) or visits it.
pub(super) trait PathStep: Copy {
    fn name(&self) -> &[u8];
    fn descend(&self) -> bool;
}

/// Walks a tree depth first, in path order, without recursion (archives may nest
/// directories thousands deep): `below(step)` gives the steps inside a step that
/// descends, `visit(path, step)` sees the others, and the first error stops the walk.
pub(super) fn depth_first<S: PathStep, E>(
    top: Vec<S>,
    mut below: impl FnMut(S) -> Vec<S>,
    mut visit: impl FnMut(&[u8], S) -> Result<(), E>,
) -> Result<(), E> {
    struct Level<S> {
        steps: Vec<S>,
        next: usize,
        /// Length of the path prefix of this directory, `dir/` (0 for the top).
        base: usize,
    }
    let mut path = Vec::new();
    let mut stack = vec![Level {
        steps: top,
        next: 0,
        base: 0,
    }];
    while let Some(level) = stack.last_mut() {
        let Some(step) = level.steps.get(level.next).copied() else {
            stack.pop();
            continue;
        };
        level.next += 1;
        path.truncate(level.base);
        path.extend_from_slice(step.name());
        if step.descend() {
            path.push(b'/');
            let steps = below(step);
            stack.push(Level {
                steps,
                next: 0,
                base: path.len(),
            });
        } else {
            visit(&path, step)?;
        }
    }
    Ok(())
}

impl PathStep for Step<'_> {
    fn name(&self) -> &[u8] {
        self.name
    }

    fn descend(&self) -> bool {
        self.descend
    }
}

/// Calls `visit(path, node index, node)` for every entry of `index`, in path order;
/// stops at the first error and returns it.
pub fn walk<E>(
    index: &Index,
    mut visit: impl FnMut(&[u8], u32, &Node) -> Result<(), E>,
) -> Result<(), E> {
    depth_first(
        steps(index, ROOT),
        |step| match index.node(step.node) {
            Some(_) => steps(index, step.node),
            None => Vec::new(),
        },
        |path, step| match index.node(step.node) {
            Some(node) => visit(path, step.node, node),
            None => Ok(()),
        },
    )
}

/// How many entries and regular files a checkpoint has (a hard-linked file counts
/// once per path), and the bytes of its file contents (each stored content once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSummary {
    pub entries: u64,
    pub files: u64,
    pub unpacked_bytes: u64,
}

pub fn summarize(index: &Index) -> TreeSummary {
    let mut summary = TreeSummary {
        unpacked_bytes: index.unpacked_bytes,
        ..TreeSummary::default()
    };
    let mut dirs = vec![ROOT];
    while let Some(dir) = dirs.pop() {
        for &(_, node) in children(index, dir) {
            summary.entries += 1;
            match index.node(node).map(|n| &n.kind) {
                Some(NodeKind::Dir { .. }) => dirs.push(node),
                Some(NodeKind::File { .. }) => summary.files += 1,
                _ => {}
            }
        }
    }
    summary
}

/// Why a path does not name a file that can be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path}: {prefix} is not a directory")]
    NotADirectory { path: String, prefix: String },
    #[error("{path}: {prefix} is a symbolic link to {target} (links are not followed)")]
    ThroughSymlink {
        path: String,
        prefix: String,
        target: String,
    },
    #[error("{path}: `..` is not allowed in a path")]
    DotDot { path: String },
    #[error("{path} is a directory")]
    IsADirectory { path: String },
    #[error("{path} is a symbolic link to {target}")]
    IsASymlink { path: String, target: String },
}

/// The node at `path`: a leading `/`, empty and `.` components are ignored; symlinks
/// are not followed.
pub fn lookup(index: &Index, path: &[u8]) -> Result<u32, PathError> {
    let shown = || display_path(path);
    let mut node = ROOT;
    let mut walked: Vec<u8> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => continue,
            b".." => return Err(PathError::DotDot { path: shown() }),
            _ => {}
        }
        match index.node(node).map(|n| &n.kind) {
            Some(NodeKind::Dir { .. }) => {}
            Some(NodeKind::Symlink { target }) => {
                return Err(PathError::ThroughSymlink {
                    path: shown(),
                    prefix: display_path(&walked),
                    target: display_path(target),
                });
            }
            _ => {
                return Err(PathError::NotADirectory {
                    path: shown(),
                    prefix: display_path(&walked),
                });
            }
        }
        node = index
            .lookup(node, part)
            .ok_or_else(|| PathError::NotFound { path: shown() })?;
        if !walked.is_empty() {
            walked.push(b'/');
        }
        walked.extend_from_slice(part);
    }
    Ok(node)
}

/// The regular file at `path`, to read; directories and symlinks are errors that say
/// what is there instead.
pub fn open_file<'a>(
    checkpoint: &'a VerifiedCheckpoint,
    path: &[u8],
) -> Result<FileReader<'a>, OpenError> {
    let node = lookup(&checkpoint.index, path)?;
    let shown = || {
        let trimmed = display_path(path);
        if trimmed.trim_matches('/').is_empty() {
            "/".to_owned()
        } else {
            trimmed
        }
    };
    match checkpoint.index.node(node).map(|n| &n.kind) {
        Some(NodeKind::File { .. }) => Ok(FileReader::new(checkpoint, node)?),
        Some(NodeKind::Symlink { target }) => Err(PathError::IsASymlink {
            path: shown(),
            target: display_path(target),
        }
        .into()),
        _ => Err(PathError::IsADirectory { path: shown() }.into()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("cannot read the cached contents: {0}")]
    Io(#[from] io::Error),
}

/// The contents of one file of a verified checkpoint, from the cache. At the end they
/// are checked once more against the size and xxh3 checksum in the index: a read
/// error, not short or wrong data, if the cache was changed behind our back.
pub struct FileReader<'a> {
    source: Source<'a>,
    size: u64,
    checksum: u64,
    read: u64,
    hasher: Xxh3,
    checked: bool,
}

enum Source<'a> {
    Packed {
        checkpoint: &'a VerifiedCheckpoint,
        start: u64,
    },
    Own(File),
}

impl<'a> FileReader<'a> {
    /// A reader of file node `node`; `InvalidInput` if it is not a regular file.
    pub fn new(checkpoint: &'a VerifiedCheckpoint, node: u32) -> io::Result<Self> {
        let Some(NodeKind::File {
            size,
            location,
            checksum,
        }) = checkpoint.index.node(node).map(|n| &n.kind)
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        };
        let source = match location {
            FileLocation::Packed { offset } => Source::Packed {
                checkpoint,
                start: *offset,
            },
            FileLocation::Own => Source::Own(checkpoint.open_own(node)?),
        };
        Ok(FileReader {
            source,
            size: *size,
            checksum: *checksum,
            read: 0,
            hasher: Xxh3::new(),
            checked: false,
        })
    }

    /// The file's size as the index records it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The cache file that holds a file of its own (device and inode): files of two
    /// checkpoints with the same one hold the same bytes, the cache sharing files by
    /// their SHA-256.
    fn own_file(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        match &self.source {
            Source::Own(file) => file.metadata().ok().map(|m| (m.dev(), m.ino())),
            Source::Packed { .. } => None,
        }
    }

    fn check_end(&mut self) -> io::Result<()> {
        if self.checked {
            return Ok(());
        }
        if self.read != self.size || self.hasher.digest() != self.checksum {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the cached copy no longer matches the verified checksum \
                 (was the cache directory changed?)",
            ));
        }
        self.checked = true;
        Ok(())
    }

    /// The whole contents, or `None` (reading nothing) when the file is larger than
    /// `max` bytes.
    pub fn read_all(mut self, max: u64) -> io::Result<Option<Vec<u8>>> {
        if self.size > max {
            return Ok(None);
        }
        let mut data = Vec::with_capacity(self.size as usize);
        self.read_to_end(&mut data)?;
        Ok(Some(data))
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = match &mut self.source {
            Source::Packed { checkpoint, start } => {
                let want = (buf.len() as u64).min(self.size - self.read) as usize;
                let data = checkpoint.read_packed(*start, self.read, want)?;
                buf[..data.len()].copy_from_slice(&data);
                data.len()
            }
            Source::Own(file) => file.read(buf)?,
        };
        if n == 0 {
            self.check_end()?;
            return Ok(0);
        }
        self.read += n as u64;
        if self.read > self.size {
            self.check_end()?;
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// [`super::diff::SameBytes`] for two verified checkpoints: the same file of the
/// cache, or the same bytes read back (each side checked against its index as it is
/// read). A file that cannot be read counts as changed; showing it then says why.
pub fn same_bytes<'a>(
    old: &'a VerifiedCheckpoint,
    new: &'a VerifiedCheckpoint,
) -> impl FnMut(u32, u32) -> bool + 'a {
    move |a, b| {
        let (Ok(x), Ok(y)) = (FileReader::new(old, a), FileReader::new(new, b)) else {
            return false;
        };
        let shared = x.own_file();
        if shared.is_some() && shared == y.own_file() {
            return true;
        }
        crate::cache::blobs::same_contents(x, y).unwrap_or(false)
    }
}

/// The PATTERN of `find`: a shell glob (`*`, `?`, `[...]`, `{a,b}`, `**`). A pattern
/// without `/` is matched against each entry's name, one with `/` against its whole
/// path from the checkpoint's root (a leading `/` is ignored). `*`, `?` and `[...]`
/// never match `/`; `**` matches any number of directories; a leading `.` is not
/// special; `\` quotes the next character. Matching is on bytes (names need not be
/// UTF-8), so `?` and `[...]` match one byte, not one multi-byte character.
pub struct PathFilter {
    matcher: GlobMatcher,
    names_only: bool,
}

impl PathFilter {
    pub fn new(pattern: &str) -> Result<Self, globset::Error> {
        let names_only = !pattern.contains('/');
        let glob = GlobBuilder::new(pattern.trim_start_matches('/'))
            .literal_separator(true)
            .backslash_escape(true)
            .build()?;
        Ok(PathFilter {
            matcher: glob.compile_matcher(),
            names_only,
        })
    }

    pub fn matches(&self, path: &[u8]) -> bool {
        let subject = if self.names_only {
            path.rsplit(|&b| b == b'/').next().unwrap_or(path)
        } else {
            path
        };
        self.matcher.is_match(Path::new(OsStr::from_bytes(subject)))
    }
}

#[cfg(test)]
pub(super) mod tests;
