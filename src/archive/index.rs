//! Indexes a tar stream in one pass, laying its file contents out for serving.
//!
//! The result is what `tar -xzf` would have produced, held as an [`Index`] (the tree,
//! with every entry's metadata) plus the file contents, written into a
//! [`ContentSink`] that the cache provides (and whose layout it owns):
//! - files of [`OWN_FILE_THRESHOLD`] bytes and more get a file of their own, which
//!   the mount hands to the kernel as a passthrough backing file;
//! - smaller files are appended to one pack and served by offset.
//!
//! tar semantics are followed where archives are ambiguous: a later duplicate entry
//! replaces an earlier one, parent directories that only appear implicitly are created,
//! a leading `/` is stripped (as GNU tar does). Entries with `..` components are
//! skipped, as are device files and FIFOs, which a checkpoint never honours.
//! Set-user/group-ID bits are dropped. Every content byte gets an xxh3 checksum, so a
//! cache entry damaged on disk is detected when it is loaded again.
//!
//! The archive is read with [`super::for_each_entry`], so its limits hold: entries
//! (implicit directories too, and directories re-entered from afar, counted exactly as
//! a restore counts them) and unpacked bytes are counted, and no record is buffered
//! beyond a fixed cap. The tree is built in memory from names alone: nothing
//! an archive says is ever used as a path on disk (contents are numbered by node).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use tar::EntryType;
use xxhash_rust::xxh3::Xxh3;

use super::{
    ArchiveError, Entry, EntryMeta, Limits, PreviousPath, Tally, clean_path, display_path,
    entry_meta, fill,
};

/// Files at least this large are stored in a file of their own. Files of their own
/// are shared by content between the cache's entries (turns that did not change a
/// file hold it once), packs are not: the lower the threshold, the less a turn costs
/// in the cache, at one inode per file.
pub const OWN_FILE_THRESHOLD: u64 = 16 * 1024;

/// Index of the root directory in [`Index::nodes`].
pub const ROOT: u32 = 0;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Index {
    pub nodes: Vec<Node>,
    /// Bytes of file contents on disk (pack plus own files).
    pub unpacked_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// Permission bits (`0o7777` without set-ID bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub nlink: u32,
    pub kind: NodeKind,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum NodeKind {
    /// Children sorted by name bytes.
    Dir {
        children: Vec<(Vec<u8>, u32)>,
    },
    File {
        size: u64,
        location: FileLocation,
        checksum: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum FileLocation {
    /// At this offset in `pack`.
    Packed { offset: u64 },
    /// In `files/<node index>`.
    Own,
}

/// What one node of a loaded index takes in memory: the node itself and the
/// allocator's overhead for a directory's list of children.
pub const NODE_MEMORY: u64 = (std::mem::size_of::<Node>() + 16) as u64;

/// What one entry of a directory's children takes besides the bytes of its name: the
/// slot in the list and the smallest allocation the name gets. Counted per name, not
/// per node: hard links are names without nodes of their own. (Measured together
/// with [`NODE_MEMORY`]: 131 bytes a node for an index of 2 million directories.)
pub const CHILD_MEMORY: u64 = (std::mem::size_of::<(Vec<u8>, u32)>() + 32) as u64;

/// What one entry may take in memory while its archive is being indexed: a loaded
/// node's share, plus the map of a directory's children that the builder keeps until
/// the end. Measured: an archive implying 2 million directories took a daemon to
/// 876 MiB while it was indexed, 460 bytes an entry; every entry is counted as a
/// directory.
pub const BUILD_NODE_MEMORY: u64 = 464;

#[cfg(test)]
impl Node {
    /// A node for tests of what is shown of it: mtime 0, one link.
    pub(crate) fn for_test(mode: u32, uid: u32, gid: u32, kind: NodeKind) -> Node {
        Node {
            mode,
            uid,
            gid,
            mtime: 0,
            nlink: 1,
            kind,
        }
    }
}

impl Index {
    /// About what the index takes in memory: what a mount counts against its memory
    /// budget for a loaded checkpoint.
    pub fn memory(&self) -> u64 {
        let names: u64 = self
            .nodes
            .iter()
            .map(|node| match &node.kind {
                NodeKind::Dir { children } => children
                    .iter()
                    .map(|(n, _)| CHILD_MEMORY + n.len() as u64)
                    .sum(),
                NodeKind::Symlink { target } => target.len() as u64,
                NodeKind::File { .. } => 0,
            })
            .sum();
        self.nodes.capacity() as u64 * NODE_MEMORY + names
    }

    pub fn node(&self, index: u32) -> Option<&Node> {
        self.nodes.get(index as usize)
    }

    /// The child `name` of directory `dir`.
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Option<u32> {
        match &self.node(dir)?.kind {
            NodeKind::Dir { children } => children
                .binary_search_by(|(n, _)| n.as_slice().cmp(name))
                .ok()
                .map(|i| children[i].1),
            _ => None,
        }
    }
}

/// Where the indexer puts file contents. The cache provides it and owns the layout;
/// the index only records a [`FileLocation`] per file.
pub trait ContentSink {
    /// Appends a small file's contents to the pack; returns their offset in it.
    fn pack(&mut self, data: &[u8]) -> io::Result<u64>;
    /// A new file of its own for node `node`'s contents.
    fn own_file(&mut self, node: u32) -> io::Result<Box<dyn Write + '_>>;
    /// Node `node`'s contents are the `len` bytes at `offset` of the tar stream
    /// (called before they are read; the cache records it to rebuild members).
    fn contents_at(&mut self, _node: u32, _offset: u64, _len: u64) {}
}

/// A sink that keeps nothing: for reading an archive only to see whether it can be
/// indexed within limits.
pub struct Discard;

impl ContentSink for Discard {
    fn pack(&mut self, _data: &[u8]) -> io::Result<u64> {
        Ok(0)
    }

    fn own_file(&mut self, _node: u32) -> io::Result<Box<dyn Write + '_>> {
        Ok(Box::new(io::sink()))
    }
}

fn cache_error(cause: io::Error) -> ArchiveError {
    ArchiveError::Io {
        context: "cannot write the cache".into(),
        cause,
    }
}

struct Builder<'a> {
    sink: &'a mut dyn ContentSink,
    nodes: Vec<Node>,
    /// Directory children while building; turned into sorted vectors at the end.
    children: Vec<Option<BTreeMap<Vec<u8>, u32>>>,
    /// Bytes of file contents written so far.
    unpacked: u64,
    default_mtime: i64,
    /// For reading file contents: a small file whole, a large one in pieces. One
    /// allocation, zeroed once, per archive: a vector grown per file (and zeroed by
    /// `read_to_end` at each call) took a tenth of the indexing of 100,000 tiny files.
    buf: Vec<u8>,
    /// The previous entry's parent and the previous hard link's target directory, for
    /// [`Tally::reentered`].
    previous_parent: PreviousPath,
    previous_target: PreviousPath,
}

/// Reads the whole tar stream, writing file contents into `sink`. `default_mtime`
/// dates directories that only appear implicitly.
pub fn build(
    tar: impl Read,
    sink: &mut dyn ContentSink,
    limits: Limits,
    default_mtime: i64,
) -> Result<Index, ArchiveError> {
    let mut builder = Builder {
        sink,
        nodes: Vec::new(),
        children: Vec::new(),
        unpacked: 0,
        default_mtime,
        buf: vec![0; 256 * 1024],
        previous_parent: PreviousPath::default(),
        previous_target: PreviousPath::default(),
    };
    builder.new_dir(0o755, 0, 0, default_mtime);
    super::for_each_entry(tar, limits, |entry, tally| builder.add(entry, tally))?;
    builder.finish()
}

impl Builder<'_> {
    fn new_node(&mut self, node: Node) -> u32 {
        self.nodes.push(node);
        self.children.push(None);
        (self.nodes.len() - 1) as u32
    }

    fn new_dir(&mut self, mode: u32, uid: u32, gid: u32, mtime: i64) -> u32 {
        let index = self.new_node(Node {
            mode,
            uid,
            gid,
            mtime,
            nlink: 2,
            kind: NodeKind::Dir {
                children: Vec::new(),
            },
        });
        self.children[index as usize] = Some(BTreeMap::new());
        index
    }

    fn child(&self, dir: u32, name: &[u8]) -> Option<u32> {
        self.children[dir as usize].as_ref()?.get(name).copied()
    }

    /// The directory at `parts`, an entry's parent, creating missing ones (each counts
    /// as an entry, and so do existing ones it enters anew beyond a few, as a restore
    /// counts them); `None` if a non-directory is in the way (tar would fail that entry
    /// too).
    fn dir_at(&mut self, parts: &[&[u8]], tally: &mut Tally) -> Result<Option<u32>, ArchiveError> {
        let shared = self.previous_parent.follow(parts);
        let (mut dir, mut reentered) = (ROOT, 0);
        let mut found = None;
        for (depth, part) in parts.iter().enumerate() {
            dir = match self.child(dir, part) {
                Some(child) if self.children[child as usize].is_some() => {
                    reentered += usize::from(depth >= shared);
                    child
                }
                Some(_) => break,
                None => {
                    tally.entry()?;
                    let child = self.new_dir(0o755, 0, 0, self.default_mtime);
                    self.link(dir, part, child);
                    child
                }
            };
            if depth + 1 == parts.len() {
                found = Some(dir);
            }
        }
        if parts.is_empty() {
            found = Some(ROOT);
        }
        tally.reentered(reentered)?;
        Ok(found)
    }

    /// The node a hard link's target path names, if the archive made it; the
    /// directories on the way count as [`Self::dir_at`]'s existing ones do.
    fn link_target(
        &mut self,
        target: &[u8],
        tally: &mut Tally,
    ) -> Result<Option<u32>, ArchiveError> {
        let trimmed = target.strip_prefix(b"/").unwrap_or(target);
        let Ok(parts) = clean_path(trimmed) else {
            return Ok(None);
        };
        let Some((name, parents)) = parts.split_last() else {
            return Ok(None);
        };
        let shared = self.previous_target.follow(parents);
        let (mut dir, mut reentered) = (Some(ROOT), 0);
        for (depth, part) in parents.iter().enumerate() {
            dir = dir.and_then(|dir| self.child(dir, part));
            match dir {
                Some(_) => reentered += usize::from(depth >= shared),
                None => break,
            }
        }
        tally.reentered(reentered)?;
        Ok(dir.and_then(|dir| self.child(dir, name)))
    }

    /// Points `dir/name` at `node`, unlinking whatever was there.
    fn link(&mut self, dir: u32, name: &[u8], node: u32) {
        let previous = self.children[dir as usize]
            .as_mut()
            .expect("link into a directory")
            .insert(name.to_vec(), node);
        if let Some(previous) = previous {
            let old = &mut self.nodes[previous as usize];
            old.nlink = old.nlink.saturating_sub(1);
        }
    }

    fn add<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        tally: &mut Tally,
    ) -> Result<(), ArchiveError> {
        let raw = entry.path_bytes().into_owned();
        let trimmed = raw.strip_prefix(b"/").unwrap_or(&raw);
        let parts = match clean_path(trimmed) {
            Ok(parts) => parts,
            Err(reason) => {
                tracing::warn!(entry = %display_path(&raw), "skipping entry: {reason}");
                return Ok(());
            }
        };
        let EntryMeta { mtime, uid, gid } = entry_meta(entry)?;
        let (uid, gid) = (uid as u32, gid as u32);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o1777;
        let Some((name, parents)) = parts.split_last() else {
            // The archive's own root (`./`): its attributes become the root's.
            if kind == EntryType::Directory {
                let root = &mut self.nodes[ROOT as usize];
                (root.mode, root.uid, root.gid, root.mtime) = (mode, uid, gid, mtime);
            }
            return Ok(());
        };
        let Some(parent) = self.dir_at(parents, tally)? else {
            tracing::warn!(entry = %display_path(&raw), "skipping entry: a parent is not a directory");
            return Ok(());
        };
        let attrs = |kind| Node {
            mode,
            uid,
            gid,
            mtime,
            nlink: 1,
            kind,
        };
        match kind {
            EntryType::Directory => match self.child(parent, name) {
                Some(existing) if self.children[existing as usize].is_some() => {
                    let dir = &mut self.nodes[existing as usize];
                    (dir.mode, dir.uid, dir.gid, dir.mtime) = (mode, uid, gid, mtime);
                }
                _ => {
                    let dir = self.new_dir(mode, uid, gid, mtime);
                    self.link(parent, name, dir);
                }
            },
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let node = self.new_node(attrs(NodeKind::Symlink { target: Vec::new() }));
                self.add_file(entry, node, tally)?;
                self.link(parent, name, node);
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let node = self.new_node(attrs(NodeKind::Symlink { target }));
                self.link(parent, name, node);
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if !self.add_hard_link(parent, name, &target, tally)? {
                    tracing::warn!(
                        entry = %display_path(&raw),
                        target = %display_path(&target),
                        "skipping hard link to a file not in the archive"
                    );
                }
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                tracing::debug!(entry = %display_path(&raw), "skipping device file or FIFO");
            }
            other => {
                tracing::debug!(entry = %display_path(&raw), kind = ?other, "skipping entry");
            }
        }
        Ok(())
    }

    /// Gives file `node` its contents: where they are in the tar stream (for the
    /// sink) and where the sink stores them.
    fn add_file<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        node: u32,
        tally: &mut Tally,
    ) -> Result<(), ArchiveError> {
        if entry.header().entry_type() != EntryType::GNUSparse {
            // Sparse contents are not the stream's bytes as they are.
            self.sink
                .contents_at(node, entry.raw_file_position(), entry.size());
        }
        let (size, location, checksum) = self.store_contents(entry, node, tally)?;
        self.nodes[node as usize].kind = NodeKind::File {
            size,
            location,
            checksum,
        };
        Ok(())
    }

    /// Links `parent/name` to the file at `target`, which an earlier entry made; false
    /// if there is no such file.
    fn add_hard_link(
        &mut self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        tally: &mut Tally,
    ) -> Result<bool, ArchiveError> {
        match self.link_target(target, tally)? {
            Some(node) if self.children[node as usize].is_none() => {
                if self.child(parent, name) != Some(node) {
                    self.nodes[node as usize].nlink += 1;
                    self.link(parent, name, node);
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn store_contents(
        &mut self,
        entry: &mut impl Read,
        node: u32,
        tally: &mut Tally,
    ) -> Result<(u64, FileLocation, u64), ArchiveError> {
        let mut hasher = Xxh3::new();
        let buf = &mut self.buf;
        // Small files are read whole first, so that they can go into the pack.
        let filled =
            fill(entry, &mut buf[..OWN_FILE_THRESHOLD as usize]).map_err(ArchiveError::Corrupt)?;
        let head = &buf[..filled];
        let mut size = head.len() as u64;
        tally.bytes(size)?;
        hasher.update(head);
        if size < OWN_FILE_THRESHOLD {
            let offset = self.sink.pack(head).map_err(cache_error)?;
            self.unpacked += size;
            return Ok((size, FileLocation::Packed { offset }, hasher.digest()));
        }
        let mut file = self.sink.own_file(node).map_err(cache_error)?;
        file.write_all(head).map_err(cache_error)?;
        loop {
            let n = fill(entry, buf).map_err(ArchiveError::Corrupt)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            tally.bytes(n as u64)?;
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n]).map_err(cache_error)?;
        }
        file.flush().map_err(cache_error)?;
        self.unpacked += size;
        Ok((size, FileLocation::Own, hasher.digest()))
    }

    fn finish(mut self) -> Result<Index, ArchiveError> {
        for (index, children) in self.children.into_iter().enumerate() {
            if let Some(children) = children {
                let subdirs = children
                    .values()
                    .filter(|&&c| matches!(self.nodes[c as usize].kind, NodeKind::Dir { .. }))
                    .count();
                let node = &mut self.nodes[index];
                node.nlink = 2 + subdirs as u32;
                node.kind = NodeKind::Dir {
                    children: children.into_iter().collect(),
                };
            }
        }
        // Without the spare room a growing vector keeps (up to as much again).
        self.nodes.shrink_to_fit();
        Ok(Index {
            nodes: self.nodes,
            unpacked_bytes: self.unpacked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what the indexer hands over: the pack, and each file of its own.
    #[derive(Default)]
    struct Kept {
        pack: Vec<u8>,
        own: BTreeMap<u32, Vec<u8>>,
    }

    impl ContentSink for Kept {
        fn pack(&mut self, data: &[u8]) -> io::Result<u64> {
            self.pack.extend_from_slice(data);
            Ok((self.pack.len() - data.len()) as u64)
        }

        fn own_file(&mut self, node: u32) -> io::Result<Box<dyn Write + '_>> {
            Ok(Box::new(self.own.entry(node).or_default()))
        }
    }

    #[test]
    fn files_under_the_threshold_are_packed_and_the_rest_get_a_file_each() {
        let threshold = OWN_FILE_THRESHOLD as usize;
        let sizes = [
            0,
            1,
            threshold - 1,
            threshold,
            threshold + 1,
            3 * threshold + 7,
        ];
        let mut builder = tar::Builder::new(Vec::new());
        for (i, size) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..*size).map(|b| (b % 251) as u8 ^ i as u8).collect();
            let mut header = tar::Header::new_gnu();
            header.set_size(*size as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, format!("f{i}"), &data[..])
                .unwrap();
        }
        let tar = builder.into_inner().unwrap();
        let mut kept = Kept::default();
        let index = build(&tar[..], &mut kept, Limits::DEFAULT, 0).unwrap();
        for (i, size) in sizes.iter().enumerate() {
            let node = index.lookup(0, format!("f{i}").as_bytes()).unwrap();
            let NodeKind::File {
                size: got,
                location,
                ..
            } = index.node(node).unwrap().kind
            else {
                panic!("f{i} is not a file");
            };
            assert_eq!(got, *size as u64);
            let expected: Vec<u8> = (0..*size).map(|b| (b % 251) as u8 ^ i as u8).collect();
            let bytes = match location {
                FileLocation::Packed { offset } => {
                    assert!(*size < threshold, "f{i} of {size} bytes packed");
                    kept.pack[offset as usize..offset as usize + size].to_vec()
                }
                FileLocation::Own => {
                    assert!(*size >= threshold, "f{i} of {size} bytes on its own");
                    kept.own[&node].clone()
                }
            };
            assert_eq!(bytes, expected, "f{i}");
        }
    }
}
