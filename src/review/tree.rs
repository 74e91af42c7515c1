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
pub(super) mod tests {
    use super::*;

    /// Builds an index from `(path, kind)` pairs: `"d"` a directory, `"l:TARGET"` a
    /// symlink, anything else a file with those contents (checksum = xxh3).
    pub fn index_of(entries: &[(&str, &str)]) -> Index {
        let mut nodes = vec![Node {
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            nlink: 2,
            kind: NodeKind::Dir {
                children: Vec::new(),
            },
        }];
        for (path, what) in entries {
            let parts: Vec<&str> = path.split('/').collect();
            let (name, parents) = parts.split_last().unwrap();
            let mut dir = ROOT;
            for part in parents {
                dir = nodes_lookup(&nodes, dir, part.as_bytes()).expect("parent listed first");
            }
            let kind = if *what == "d" {
                NodeKind::Dir {
                    children: Vec::new(),
                }
            } else if let Some(target) = what.strip_prefix("l:") {
                NodeKind::Symlink {
                    target: target.as_bytes().to_vec(),
                }
            } else {
                NodeKind::File {
                    size: what.len() as u64,
                    location: FileLocation::Packed { offset: 0 },
                    checksum: xxhash_rust::xxh3::xxh3_64(what.as_bytes()),
                }
            };
            let mode = if *what == "d" { 0o755 } else { 0o644 };
            nodes.push(Node {
                mode,
                uid: 1000,
                gid: 1000,
                mtime: 0,
                nlink: 1,
                kind,
            });
            let new = (nodes.len() - 1) as u32;
            let NodeKind::Dir { children } = &mut nodes[dir as usize].kind else {
                panic!("{path}: parent is not a directory")
            };
            children.push((name.as_bytes().to_vec(), new));
            children.sort();
        }
        Index {
            nodes,
            unpacked_bytes: 0,
        }
    }

    fn nodes_lookup(nodes: &[Node], dir: u32, name: &[u8]) -> Option<u32> {
        match &nodes[dir as usize].kind {
            NodeKind::Dir { children } => children
                .iter()
                .find(|(n, _)| n.as_slice() == name)
                .map(|(_, i)| *i),
            _ => None,
        }
    }

    pub fn paths(index: &Index) -> Vec<String> {
        let mut out = Vec::new();
        walk::<()>(index, |path, _, _| {
            out.push(String::from_utf8(path.to_vec()).unwrap());
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn walk_gives_byte_order_of_whole_paths() {
        let index = index_of(&[
            ("a", "d"),
            ("a/x", "1"),
            ("a/y", "d"),
            ("a/y/z", "2"),
            ("a-b", "3"),
            ("a.c", "d"),
            ("a.c/q", "4"),
            ("B", "l:a"),
            ("a0", "5"),
        ]);
        let got = paths(&index);
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(got, sorted);
        assert_eq!(
            got,
            ["B", "a", "a-b", "a.c", "a.c/q", "a/x", "a/y", "a/y/z", "a0"]
        );
    }

    #[test]
    fn summary_counts_entries_and_files() {
        let index = index_of(&[("a", "d"), ("a/x", "1"), ("l", "l:a"), ("f", "22")]);
        let summary = summarize(&index);
        assert_eq!((summary.entries, summary.files), (4, 2));
    }

    #[test]
    fn lookup_does_not_follow_links() {
        let index = index_of(&[("a", "d"), ("a/x", "1"), ("link", "l:a"), ("f", "2")]);
        assert_eq!(lookup(&index, b"a/x"), Ok(2));
        assert_eq!(lookup(&index, b"/a//./x"), Ok(2));
        assert_eq!(lookup(&index, b""), Ok(ROOT));
        assert_eq!(
            lookup(&index, b"a/nope").unwrap_err().to_string(),
            "a/nope: no such file or directory"
        );
        assert_eq!(
            lookup(&index, b"link/x").unwrap_err().to_string(),
            "link/x: link is a symbolic link to a (links are not followed)"
        );
        assert_eq!(
            lookup(&index, b"f/x").unwrap_err().to_string(),
            "f/x: f is not a directory"
        );
        assert_eq!(
            lookup(&index, b"a/../f").unwrap_err().to_string(),
            "a/../f: `..` is not allowed in a path"
        );
    }

    /// A real cache entry of a tar holding `small` (packed), `big` (a file of its own),
    /// `dir/` and `link -> small`.
    fn cached_checkpoint() -> (
        tempfile::TempDir,
        std::sync::Arc<VerifiedCheckpoint>,
        Vec<u8>,
    ) {
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut tar = tar::Builder::new(Vec::new());
        let mut add = |path: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(0o644);
            header.set_size(data.len() as u64);
            if let Some(link) = link {
                header.set_link_name(link).unwrap();
            }
            tar.append_data(&mut header, path, data).unwrap();
        };
        add("small", tar::EntryType::Regular, b"small file\n", None);
        add("big", tar::EntryType::Regular, &big, None);
        add("dir", tar::EntryType::Directory, b"", None);
        add("link", tar::EntryType::Symlink, b"", Some("small"));
        let tar = tar.into_inner().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let cache =
            crate::cache::Cache::open(&crate::cache::CacheDir::open(dir.path()).unwrap(), u64::MAX)
                .unwrap();
        let id = crate::checkpoint::CheckpointId::parse(&"a".repeat(64)).unwrap();
        let mut pending = cache.begin().unwrap();
        let index = crate::archive::index::build(
            &tar[..],
            &mut pending,
            crate::archive::Limits::DEFAULT,
            0,
        )
        .unwrap();
        let provenance = crate::cache::Provenance::Store {
            verified_at: std::time::SystemTime::now(),
        };
        let checkpoint = cache.finish(pending, &id, index, provenance).unwrap();
        (dir, checkpoint, big)
    }

    fn read(checkpoint: &VerifiedCheckpoint, path: &[u8]) -> io::Result<Vec<u8>> {
        let mut data = Vec::new();
        open_file(checkpoint, path)
            .map_err(|e| io::Error::other(e.to_string()))?
            .read_to_end(&mut data)?;
        Ok(data)
    }

    #[test]
    fn files_read_back_verified_from_the_cache() {
        let (dir, checkpoint, big) = cached_checkpoint();
        assert_eq!(read(&checkpoint, b"small").unwrap(), b"small file\n");
        assert_eq!(read(&checkpoint, b"/big").unwrap(), big);
        let node = lookup(&checkpoint.index, b"big").unwrap();
        let reader = FileReader::new(&checkpoint, node).unwrap();
        assert_eq!(reader.size(), big.len() as u64);
        assert_eq!(reader.read_all(1000).unwrap(), None, "over the bound");
        for (path, error) in [
            (&b"dir"[..], "dir is a directory"),
            (b"link", "link is a symbolic link to small"),
            (b"", "/ is a directory"),
        ] {
            let Err(e) = open_file(&checkpoint, path) else {
                panic!("{path:?} opened")
            };
            assert_eq!(e.to_string(), error);
        }

        // Changed behind our back after the load: a read error, not other data.
        let entry = dir.path().join("checkpoints").join("a".repeat(64));
        let pack = entry.join("pack");
        let mut packed = std::fs::read(&pack).unwrap();
        packed[0] ^= 1;
        std::fs::write(&pack, &packed).unwrap();
        let e = read(&checkpoint, b"small").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let own = entry.join("files").join(node.to_string());
        let mut file = std::fs::OpenOptions::new().append(true).open(&own).unwrap();
        std::io::Write::write_all(&mut file, b"more").unwrap();
        let e = read(&checkpoint, b"big").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn patterns_match_names_or_whole_paths() {
        let matches =
            |pattern: &str, path: &str| PathFilter::new(pattern).unwrap().matches(path.as_bytes());
        assert!(matches("*.rs", "lib.rs"));
        assert!(matches("*.rs", "src/deep/lib.rs"));
        assert!(!matches("*.rs", "src/lib.rs/x"));
        assert!(matches("src/*.rs", "src/lib.rs"));
        assert!(matches("/src/*.rs", "src/lib.rs"));
        assert!(!matches("src/*.rs", "src/a/lib.rs"));
        assert!(!matches("src/*.rs", "x/src/lib.rs"));
        assert!(matches("src/**/*.rs", "src/a/b/lib.rs"));
        assert!(matches("src/**", "src/a/b/lib.rs"));
        assert!(matches("**/lib.rs", "lib.rs"));
        assert!(matches("*.{py,sh}", "run.sh"));
        assert!(matches(".*", ".hidden"));
        assert!(matches("*", ".hidden"));
        assert!(matches("\\*", "*"));
        assert!(!matches("\\*", "x"));
        // Matching is on bytes: `?` is one byte, not one UTF-8 character.
        assert!(matches("caf??.txt", "caf\u{e9}.txt"));
        assert!(!matches("caf?.txt", "caf\u{e9}.txt"));
        assert!(matches("caf*.txt", "caf\u{e9}.txt"));
        let filter = PathFilter::new("caf*").unwrap();
        assert!(filter.matches(b"dir/caf\xe9.txt"), "non-UTF-8 names match");
        assert!(PathFilter::new("[").is_err());
    }
}
