//! The checkpoint trees: `MNT/<sha256>/...`, served from verified cache entries.
//!
//! Every inode here is a node of one checkpoint's index (node 0 is the checkpoint's
//! own directory). Nothing is answered from an archive before the loader verified it:
//! the router makes operations wait for the load ([`super::CheckpointFs::prepare`]),
//! and [`Loader::checkpoint`] answers EIO with the reason if it failed. Contents
//! never change, so the kernel may cache entries, attributes and pages for long.
//! `stat` of a checkpoint's own directory needs only the listing.

use std::collections::HashMap;

use lru::LruCache;
use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::FsError;
use super::inode::{self, Inode};
use super::listing::Load;
use super::listing::{Catalog, Slot};
use super::loader::Loader;
use super::readahead::ReadAhead;
use super::subtree::{
    Attr, CopySource, DirEntry, Entry, FileKind, KernelCache, NO_HANDLE, Opened, Subtree, add_from,
    dot_entries,
};
use crate::archive::index::{FileLocation, Node, NodeKind};
use crate::cache::VerifiedCheckpoint;

/// How long the kernel may keep what it learns of checkpoint contents.
pub const IMMUTABLE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Who owns what is shown.
#[derive(Debug, Clone, Copy)]
pub struct Owners {
    /// Show every checkpoint entry as owned by this uid and gid.
    pub override_: Option<(u32, u32)>,
    /// The mounting user, who owns each checkpoint's own directory.
    pub mounting: (u32, u32),
}

enum Handle {
    /// The checkpoint is held so that it is not evicted while open.
    Own {
        file: File,
        checkpoint: Arc<VerifiedCheckpoint>,
    },
    Packed {
        checkpoint: Arc<VerifiedCheckpoint>,
        start: u64,
        size: u64,
    },
    /// A file of its own, opened past [`HELD_FILES`]: read as reads without a handle
    /// are, through a few files kept open for all, so that readers holding many files
    /// open cannot run the daemon out of descriptors. No passthrough.
    Unheld {
        checkpoint: Arc<VerifiedCheckpoint>,
        node: u32,
    },
}

/// Handles that hold a descriptor of their own at most (each reader's open file of
/// 16 KiB or more holds one; with `--allow-other`, any user's).
const HELD_FILES: usize = if cfg!(test) { 2 } else { 16_384 };

pub struct Checkpoints {
    catalog: Arc<Catalog>,
    loader: Arc<Loader>,
    owners: Owners,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// How many of `handles` are [`Handle::Own`].
    held: AtomicUsize,
    next_fh: AtomicU64,
    /// Own files read without an open (see `read_unopened`), kept open a while.
    unopened: Mutex<LruCache<u64, Arc<File>>>,
    readahead: ReadAhead,
}

/// Own files kept open for reads that come without an open.
const UNOPENED_FILES: usize = 64;

pub fn time_from_secs(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

fn entry(attr: Attr) -> Entry {
    Entry::new(attr, IMMUTABLE_TTL)
}

impl Checkpoints {
    pub fn new(
        catalog: Arc<Catalog>,
        loader: Arc<Loader>,
        owners: Owners,
        kernel: Arc<OnceLock<Arc<dyn KernelCache>>>,
    ) -> Self {
        Checkpoints {
            readahead: ReadAhead::start(kernel),
            catalog,
            loader,
            owners,
            handles: Mutex::new(HashMap::new()),
            held: AtomicUsize::new(0),
            next_fh: AtomicU64::new(1),
            unopened: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(UNOPENED_FILES).expect("non-zero"),
            )),
        }
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, FsError> {
        let handles = self.handles.lock().expect("handles lock");
        handles.get(&fh).cloned().ok_or(FsError::BadHandle)
    }

    /// Reads file `ino` without a handle (the kernel opened it by itself): its
    /// checkpoint is loaded (the kernel looked the file up first), and a large file's
    /// own cache file is kept open for the next reads.
    fn read_unopened(
        &self,
        node: u32,
        checkpoint: &VerifiedCheckpoint,
        ino: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, FsError> {
        let NodeKind::File {
            size: file_size,
            location,
            ..
        } = checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
        else {
            return Err(FsError::IsADirectory);
        };
        match location {
            FileLocation::Packed { offset: start } => {
                let len = (size as u64).min(file_size.saturating_sub(offset)) as usize;
                checkpoint
                    .read_packed(start, offset, len)
                    .map_err(FsError::CacheRead)
            }
            FileLocation::Own => {
                let cached = self.unopened.lock().expect("files lock").get(&ino).cloned();
                let file = match cached {
                    Some(file) => file,
                    None => {
                        let file = Arc::new(checkpoint.open_own(node).map_err(FsError::CacheRead)?);
                        self.unopened
                            .lock()
                            .expect("files lock")
                            .put(ino, Arc::clone(&file));
                        file
                    }
                };
                crate::cache::read_at(&file, offset, size as usize).map_err(FsError::CacheRead)
            }
        }
    }

    /// A file's bytes for a copy made by the kernel, found by inode (the kernel opened
    /// the file by itself). The copy holds the checkpoint while it runs.
    fn copy_source_unopened(&self, ino: u64) -> Result<CopySource, FsError> {
        let (_, node, checkpoint) = self.node(ino)?;
        let NodeKind::File { size, location, .. } =
            checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
        else {
            return Err(FsError::IsADirectory);
        };
        let (file, start, size) = match location {
            FileLocation::Own => (
                checkpoint.open_own(node).map_err(FsError::CacheRead)?,
                0,
                u64::MAX,
            ),
            FileLocation::Packed { offset } => (
                checkpoint.pack().try_clone().map_err(FsError::CacheRead)?,
                offset,
                size,
            ),
        };
        Ok(CopySource {
            file,
            start,
            size,
            from: Some(checkpoint),
        })
    }

    fn slot(&self, index: usize) -> Result<Arc<Slot>, FsError> {
        self.catalog.slot(index).ok_or(FsError::NotFound)
    }

    /// The verified contents `ino` belongs to, and its node index.
    fn node(&self, ino: u64) -> Result<(usize, u32, Arc<VerifiedCheckpoint>), FsError> {
        let Some(Inode::Node { slot, node }) = Inode::decode(ino) else {
            return Err(FsError::NotFound);
        };
        let checkpoint = self.loader.checkpoint(&*self.slot(slot)?)?;
        Ok((slot, node, checkpoint))
    }

    fn node_attr(&self, slot: usize, index: u32, node: &Node) -> Attr {
        let (kind, size) = match &node.kind {
            NodeKind::Dir { .. } => (FileKind::Directory, 4096),
            NodeKind::File { size, .. } => (FileKind::File, *size),
            NodeKind::Symlink { target } => (FileKind::Symlink, target.len() as u64),
        };
        let (uid, gid) = self.owners.override_.unwrap_or((node.uid, node.gid));
        let time = time_from_secs(node.mtime);
        Attr {
            ino: Inode::Node { slot, node: index }.encode(),
            generation: 0,
            kind,
            size,
            perm: (node.mode & 0o7777) as u16,
            nlink: node.nlink,
            uid,
            gid,
            atime: time,
            mtime: time,
            ctime: time,
        }
    }

    /// A checkpoint's own directory, known from the listing alone: `ls -l` of the
    /// root downloads nothing. Once loaded, it has the archive's link count.
    fn root_attr(&self, slot: &Slot) -> Attr {
        let nlink = match &*slot.load.lock().expect("slot lock") {
            Load::Loaded(c) => c.index.node(0).map_or(2, |n| n.nlink),
            _ => 2,
        };
        let time = slot.info.last_modified;
        let (uid, gid) = self.owners.override_.unwrap_or(self.owners.mounting);
        Attr {
            ino: Inode::Node {
                slot: slot.index,
                node: 0,
            }
            .encode(),
            generation: 0,
            kind: FileKind::Directory,
            size: 4096,
            perm: 0o555,
            nlink,
            uid,
            gid,
            atime: time,
            mtime: time,
            ctime: time,
        }
    }
}

impl Subtree for Checkpoints {
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        let (slot, node, checkpoint) = self.node(parent)?;
        let dir = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
        if !matches!(dir.kind, NodeKind::Dir { .. }) {
            return Err(FsError::NotADirectory);
        }
        let child = checkpoint
            .index
            .lookup(node, name)
            .ok_or(FsError::NotFound)?;
        let child_node = checkpoint.index.node(child).ok_or(FsError::NotFound)?;
        Ok(entry(self.node_attr(slot, child, child_node)))
    }

    fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        if let Some(Inode::Node { slot, node: 0 }) = Inode::decode(ino) {
            let slot = self.slot(slot)?;
            // Before a load, the listing answers; a failed checkpoint still stats.
            if !matches!(*slot.load.lock().expect("slot lock"), Load::Loaded(_)) {
                return Ok(entry(self.root_attr(&slot)));
            }
        }
        let (slot, node, checkpoint) = self.node(ino)?;
        if node == 0 {
            return Ok(entry(self.root_attr(&*self.slot(slot)?)));
        }
        let found = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
        Ok(entry(self.node_attr(slot, node, found)))
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let (_, node, checkpoint) = self.node(ino)?;
        match &checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind {
            NodeKind::Symlink { target } => Ok(target.clone()),
            _ => Err(FsError::NotASymlink),
        }
    }

    /// Opening a checkpoint's directory is what verifies it: a bad checkpoint
    /// answers EIO.
    fn opendir(&self, ino: u64) -> Result<(), FsError> {
        let (_, node, checkpoint) = self.node(ino)?;
        match checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind {
            NodeKind::Dir { .. } => Ok(()),
            _ => Err(FsError::NotADirectory),
        }
    }

    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        let (slot, node, checkpoint) = self.node(ino)?;
        let NodeKind::Dir { children } =
            &checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
        else {
            return Err(FsError::NotADirectory);
        };
        let parent = if node == 0 { inode::ROOT } else { ino };
        let dots = dot_entries(ino, parent);
        if add_from(&dots, offset, add) {
            return Ok(());
        }
        // The children (entries 2 and on) are made only as far as the reply takes them.
        let skipped = usize::try_from(offset.saturating_sub(2)).unwrap_or(usize::MAX);
        for (i, (name, child)) in children.iter().enumerate().skip(skipped) {
            let child_node = checkpoint.index.node(*child).ok_or(FsError::NotFound)?;
            let entry = DirEntry {
                ino: Inode::Node { slot, node: *child }.encode(),
                kind: self.node_attr(slot, *child, child_node).kind,
                name: name.clone(),
            };
            if add(&entry, i as u64 + 3) {
                break;
            }
        }
        Ok(())
    }

    fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
        }
        let (_, node, checkpoint) = self.node(ino)?;
        let NodeKind::File { size, location, .. } =
            checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
        else {
            return Err(FsError::IsADirectory);
        };
        let (handle, backing) = match location {
            FileLocation::Own if self.held.fetch_add(1, Ordering::Relaxed) >= HELD_FILES => {
                self.held.fetch_sub(1, Ordering::Relaxed);
                (Handle::Unheld { checkpoint, node }, None)
            }
            FileLocation::Own => {
                let opened = checkpoint.open_own(node).and_then(|file| {
                    let backing = file.try_clone()?;
                    Ok((file, backing))
                });
                let (file, backing) = opened.map_err(|e| {
                    self.held.fetch_sub(1, Ordering::Relaxed);
                    FsError::CacheRead(e)
                })?;
                (Handle::Own { file, checkpoint }, Some(backing))
            }
            FileLocation::Packed { offset } => (
                Handle::Packed {
                    checkpoint,
                    start: offset,
                    size,
                },
                None,
            ),
        };
        // An inode that others read by passthrough refuses cached opens beside them;
        // direct I/O may coexist.
        let direct_io = matches!(handle, Handle::Unheld { .. });
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .expect("handles lock")
            .insert(fh, Arc::new(handle));
        Ok(Opened {
            fh,
            backing,
            keep_cache: true,
            direct_io,
        })
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let (slot, node, checkpoint) = self.node(ino)?;
        if offset == 0 {
            self.readahead.first_read(slot, node, &checkpoint);
        }
        if fh == NO_HANDLE {
            return self.read_unopened(node, &checkpoint, ino, offset, size);
        }
        match &*self.handle(fh)? {
            Handle::Own { file, .. } => {
                crate::cache::read_at(file, offset, size as usize).map_err(FsError::CacheRead)
            }
            Handle::Unheld { checkpoint, node } => {
                self.read_unopened(*node, checkpoint, ino, offset, size)
            }
            Handle::Packed {
                checkpoint,
                start,
                size: file_size,
            } => {
                let len = (size as u64).min(file_size.saturating_sub(offset)) as usize;
                checkpoint
                    .read_packed(*start, offset, len)
                    .map_err(FsError::CacheRead)
            }
        }
    }

    fn copy_source(&self, ino: u64, fh: u64) -> Result<CopySource, FsError> {
        if fh == NO_HANDLE {
            return self.copy_source_unopened(ino);
        }
        let handle = self.handle(fh)?;
        let (file, start, size, from) = match &*handle {
            Handle::Unheld { .. } => return self.copy_source_unopened(ino),
            Handle::Own { file, checkpoint } => (file, 0, u64::MAX, checkpoint),
            Handle::Packed {
                checkpoint,
                start,
                size,
            } => (checkpoint.pack(), *start, *size, checkpoint),
        };
        Ok(CopySource {
            file: file.try_clone().map_err(FsError::CacheRead)?,
            start,
            size,
            from: Some(Arc::clone(from)),
        })
    }

    fn release(&self, fh: u64) {
        let removed = self.handles.lock().expect("handles lock").remove(&fh);
        if removed.is_some_and(|h| matches!(*h, Handle::Own { .. })) {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn refusal(&self, _ino: u64) -> FsError {
        FsError::ReadOnly
    }
}
