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
    /// Other users may use the mount (see [`shown_perm`]).
    pub shared: bool,
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
    /// A file of its own, opened past [`held_files`]: read as reads without a handle
    /// are, through a few files kept open for all, so that readers holding many files
    /// open cannot run the daemon out of descriptors. No passthrough.
    Unheld {
        checkpoint: Arc<VerifiedCheckpoint>,
        node: u32,
    },
}

/// Handles that hold a descriptor of their own at most (each reader's open file of
/// 16 KiB or more holds one; with `--allow-other`, any user's): 16,384, or half the
/// daemon's open file limit if that is lower (a daemon that could not raise it), so
/// that readers leave descriptors for loads, `staging/` and seals.
fn held_files() -> usize {
    static HELD: OnceLock<usize> = OnceLock::new();
    if cfg!(test) {
        return 2;
    }
    *HELD.get_or_init(|| {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        limit.map_or(16_384, |limit| (limit / 2).min(16_384) as usize)
    })
}

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
    /// The own directory (`./`, without its children) of each checkpoint loaded since
    /// the mount started, by slot: shown even once the checkpoint is evicted, since
    /// the kernel may still hold its entries (see [`Checkpoints::root_entry`]).
    roots: Mutex<HashMap<usize, Node>>,
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
            roots: Mutex::new(HashMap::new()),
        }
    }

    /// The own directory of the checkpoint in `slot`, without its children: from its
    /// index if it is loaded (and remembered), as remembered if it was loaded before.
    fn root_of(&self, slot: &Slot) -> Option<Node> {
        let loaded = match &*slot.load.lock().expect("slot lock") {
            Load::Loaded(c) => c.index.node(0).map(|root| Node {
                mode: root.mode,
                uid: root.uid,
                gid: root.gid,
                mtime: root.mtime,
                nlink: root.nlink,
                kind: NodeKind::Dir {
                    children: Vec::new(),
                },
            }),
            _ => None,
        };
        let mut roots = self.roots.lock().expect("roots lock");
        match loaded {
            Some(root) => {
                roots.insert(slot.index, root.clone());
                Some(root)
            }
            None => roots.get(&slot.index).cloned(),
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

    fn node_attr(&self, slot: usize, index: u32, node: &Node, root: &Node) -> Attr {
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
            perm: shown_perm(root, node, self.owners.override_, self.owners.shared) as u16,
            nlink: node.nlink,
            uid,
            gid,
            atime: time,
            mtime: time,
            ctime: time,
        }
    }

    /// A checkpoint's own directory, known from the listing alone: `ls -l` of the
    /// root downloads nothing. It is shown `0555`, owned by the mounting user, as
    /// ckptfs writes every root open to all (see `crate::archive::writer`), and as an
    /// archive without `./` has it; before the checkpoint is loaded its mode is not
    /// known, so that is shown for no time at all (the kernel asks again before it
    /// next checks a permission on it).
    ///
    /// On a shared mount, a root that keeps others out (see [`is_open`]) is shown with
    /// its own mode and owner once its checkpoint was loaded, and still after it is
    /// evicted (see [`shown_perm`]). Before the first load there, the root is shown
    /// `0500` (the mounting user's), which lets no other user in by the kernel's own
    /// checks: things the kernel admits without asking the daemon (an inotify watch,
    /// a `stat` from its cache, an `O_PATH` open below) must not be admitted on a mode
    /// not yet known. Denied, the kernel asks for the attributes again before it
    /// gives up, and that `getattr` waits for the load (see `CheckpointFs::prepare`),
    /// so everyone is then judged by the root's own mode. The first lookup or listing
    /// is also checked by the daemon ([`Checkpoints::may_enter`]).
    fn root_entry(&self, slot: &Slot) -> Entry {
        let loaded = self.root_of(slot);
        let (perm, (uid, gid), nlink) = match &loaded {
            Some(root) if self.owners.shared && !is_open(root) => (
                shown_perm(root, root, self.owners.override_, true),
                self.owners.override_.unwrap_or((root.uid, root.gid)),
                root.nlink,
            ),
            None if self.owners.shared => (0o500, self.owners.mounting, 2),
            found => (
                0o555,
                self.owners.override_.unwrap_or(self.owners.mounting),
                found.as_ref().map_or(2, |root| root.nlink),
            ),
        };
        let time = slot.info.last_modified;
        let attr = Attr {
            ino: Inode::Node {
                slot: slot.index,
                node: 0,
            }
            .encode(),
            generation: 0,
            kind: FileKind::Directory,
            size: 4096,
            perm: perm as u16,
            nlink,
            uid,
            gid,
            atime: time,
            mtime: time,
            ctime: time,
        };
        match loaded {
            Some(_) => entry(attr),
            // Kept no longer than the name (a second, see `Views`): the kernel then asks
            // again, and a denied user's `getattr` waits for the load. The kernel is not
            // told to drop it at the load: that would make it drop the answer to the
            // `getattr` waiting for it, and judge the user by this one again.
            None if self.owners.shared => entry(attr),
            None => Entry {
                attr,
                ttl: Duration::ZERO,
                name_ttl: IMMUTABLE_TTL,
            },
        }
    }

    /// Whether `caller` may `need` (`0o1` search, `0o4` list) checkpoint directory `ino`
    /// itself, if it is one kept private by its root on a shared mount (see
    /// [`shown_perm`]); anything else passes. The kernel checks permissions itself,
    /// but before a checkpoint is loaded it knows only the provisional mode of its
    /// directory (see [`Checkpoints::root_entry`]): the lookups and listings that load
    /// it are checked here too, so that no other user sees the attributes of its
    /// top-level entries whatever the kernel admitted. Supplementary
    /// groups are read from `/proc/<pid>/status` (a caller in another PID namespace
    /// has none here).
    pub fn may_enter(&self, ino: u64, caller: (u32, u32, u32), need: u32) -> Result<(), FsError> {
        let (uid, gid, pid) = caller;
        if !self.owners.shared || uid == 0 {
            return Ok(());
        }
        let Some(Inode::Node { slot, node: 0 }) = Inode::decode(ino) else {
            return Ok(());
        };
        let Some(root) = self.root_of(&*self.slot(slot)?) else {
            return Ok(());
        };
        if is_open(&root) {
            return Ok(());
        }
        let (root_uid, root_gid) = self.owners.override_.unwrap_or((root.uid, root.gid));
        let mode = shown_perm(&root, &root, self.owners.override_, true);
        let bits = if uid == root_uid {
            mode >> 6
        } else if gid == root_gid || in_group(pid, root_gid) {
            mode >> 3
        } else {
            mode
        } & 0o7;
        if bits & need == need {
            Ok(())
        } else {
            Err(FsError::Os(std::io::Error::from_raw_os_error(libc::EACCES)))
        }
    }

    /// Whether `caller` may reach entry `ino` of a checkpoint (its attributes, its
    /// link's target): on a shared mount, inside a checkpoint whose root keeps others
    /// out, only if the caller may search that root. The kernel checks the root
    /// itself, but it may share another caller's lookup of the same name while the
    /// checkpoint loads, so the attributes of such entries are given for no time
    /// ([`Checkpoints::entry_in`]) and each request for them is checked here.
    pub fn may_reach(&self, ino: u64, caller: (u32, u32, u32)) -> Result<(), FsError> {
        match Inode::decode(ino) {
            Some(Inode::Node { slot, node }) if node != 0 => {
                self.may_enter(Inode::Node { slot, node: 0 }.encode(), caller, 0o1)
            }
            _ => Ok(()),
        }
    }

    /// The entry for `attr`, of a node of the checkpoint in `slot` other than its own
    /// directory: kept by the kernel for a day, or for no time inside a checkpoint kept
    /// private on a shared mount (see [`Checkpoints::may_reach`]).
    fn entry_in(&self, root: &Node, attr: Attr) -> Entry {
        if self.owners.shared && root.mode & 0o001 == 0 {
            Entry {
                attr,
                ttl: Duration::ZERO,
                name_ttl: IMMUTABLE_TTL,
            }
        } else {
            entry(attr)
        }
    }

    /// Why checkpoint directory `ino` failed to load, if it did, on a shared mount
    /// where its root was never known: the kernel asks for its attributes when its
    /// provisional `0500` denied a user, and the answer must be the failure, or the
    /// user would read "permission denied" for a checkpoint that did not verify.
    pub fn root_failure(&self, ino: u64) -> Option<FsError> {
        let Some(Inode::Node { slot, node: 0 }) = Inode::decode(ino) else {
            return None;
        };
        let slot = self.slot(slot).ok()?;
        let failed = matches!(*slot.load.lock().expect("slot lock"), Load::Failed { .. });
        if !failed || !self.owners.shared || self.root_of(&slot).is_some() {
            return None;
        }
        self.loader.checkpoint(&slot).err()
    }

    /// Whether the root of the checkpoint in `slot` was known once since the mount
    /// started (loaded now or before).
    pub fn root_known(&self, slot: &Slot) -> bool {
        self.root_of(slot).is_some()
    }
}

/// Whether a checkpoint's own directory lets its group and every other user list and
/// search it (see [`crate::archive::root_is_open`]): only then does a shared mount
/// show it as `0555`.
pub(crate) fn is_open(root: &Node) -> bool {
    crate::archive::root_is_open(root.mode)
}

/// Whether process `pid` has `gid` among its supplementary groups.
fn in_group(pid: u32, gid: u32) -> bool {
    supplementary_groups(pid).is_some_and(|groups| groups.contains(&gid))
}

/// The supplementary groups of process `pid` (`Groups:` of `/proc/PID/status`), or
/// `None` when they cannot be known (pid 0: a caller in another PID namespace).
pub(crate) fn supplementary_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let groups = status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))?;
    Some(
        groups
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// The permission bits the mount shows for `node` of a checkpoint whose own directory
/// (the archive's `./`) is `root`, with every entry shown as owned by `owner` if
/// given. An archive's root may have kept its tree private (a 0700 workspace): where
/// it lets others search it, every entry shows its own bits; where it does not, only
/// those who could pass it keep theirs, as the kernel would choose them: the owner's
/// bits where the entry's owner is the root's and the root lets its owner in, the
/// group's where the entry's group is the root's and the root lets its group in, and
/// no one else's. So no one reads through the mount what the workspace's own
/// directory kept from them, whatever the kernel has cached of the directory itself.
/// An archive without `./` (ckptfs before it wrote one, other tools) has a `0755`
/// root: every entry shows its own bits. So does every entry on a mount no other user
/// may use (`shared` false): there, privacy between users is not the mount's to keep,
/// and a reviewer reading a sandbox's 0700 workspace as another uid sees its modes.
pub(crate) fn shown_perm(root: &Node, node: &Node, owner: Option<(u32, u32)>, shared: bool) -> u32 {
    let mode = node.mode & 0o7777;
    if !shared || root.mode & 0o001 != 0 {
        return mode;
    }
    let (root_uid, root_gid) = owner.unwrap_or((root.uid, root.gid));
    let (uid, gid) = owner.unwrap_or((node.uid, node.gid));
    let mut keep = 0o1000;
    if uid == root_uid && root.mode & 0o100 != 0 {
        keep |= 0o700;
    }
    if gid == root_gid && root.mode & 0o010 != 0 {
        keep |= 0o070;
    }
    mode & keep
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
        let root = checkpoint.index.node(0).ok_or(FsError::NotFound)?;
        Ok(self.entry_in(root, self.node_attr(slot, child, child_node, root)))
    }

    fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        if let Some(Inode::Node { slot, node: 0 }) = Inode::decode(ino) {
            let slot = self.slot(slot)?;
            // Before a load, the listing answers; a failed checkpoint still stats.
            if !matches!(*slot.load.lock().expect("slot lock"), Load::Loaded(_)) {
                return Ok(self.root_entry(&slot));
            }
        }
        let (slot, node, checkpoint) = self.node(ino)?;
        if node == 0 {
            return Ok(self.root_entry(&*self.slot(slot)?));
        }
        let found = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
        let root = checkpoint.index.node(0).ok_or(FsError::NotFound)?;
        Ok(self.entry_in(root, self.node_attr(slot, node, found, root)))
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
        let root = checkpoint.index.node(0).ok_or(FsError::NotFound)?;
        for (i, (name, child)) in children.iter().enumerate().skip(skipped) {
            let child_node = checkpoint.index.node(*child).ok_or(FsError::NotFound)?;
            let attr = self.node_attr(slot, *child, child_node, root);
            let entry = DirEntry {
                ino: attr.ino,
                kind: attr.kind,
                name: name.clone(),
                // What `lookup` of the name gives.
                found: Some(Box::new(self.entry_in(root, attr))),
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
            FileLocation::Own if self.held.fetch_add(1, Ordering::Relaxed) >= held_files() => {
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

#[cfg(test)]
mod tests {
    use super::{is_open, shown_perm};
    use crate::archive::index::{Node, NodeKind};

    fn node(mode: u32, uid: u32, gid: u32) -> Node {
        Node::for_test(mode, uid, gid, NodeKind::Symlink { target: Vec::new() })
    }

    #[test]
    fn entries_show_only_what_their_checkpoints_own_directory_let_through() {
        // A root others may search (every archive without `./` has one): own bits.
        for root in [node(0o755, 1, 1), node(0o711, 1, 1), node(0o701, 1, 1)] {
            assert_eq!(shown_perm(&root, &node(0o644, 2, 2), None, true), 0o644);
        }
        // A 0700 workspace: its owner's entries keep their owner's bits, nothing else.
        let private = node(0o700, 1, 1);
        assert_eq!(shown_perm(&private, &node(0o644, 1, 1), None, true), 0o600);
        assert_eq!(
            shown_perm(&private, &node(0o1777, 1, 1), None, true),
            0o1700
        );
        assert_eq!(shown_perm(&private, &node(0o644, 2, 1), None, true), 0o000);
        // 0750: the root's group keeps its bits on entries of that group.
        let group = node(0o750, 1, 5);
        assert_eq!(shown_perm(&group, &node(0o664, 1, 5), None, true), 0o660);
        assert_eq!(shown_perm(&group, &node(0o664, 1, 6), None, true), 0o600);
        // A root its owner may not search: no one's bits but the sticky one.
        assert_eq!(
            shown_perm(&node(0o070, 1, 1), &node(0o644, 1, 2), None, true),
            0o000
        );
        // A mount no other user may use: every entry's own bits.
        assert_eq!(shown_perm(&private, &node(0o644, 2, 1), None, false), 0o644);
        // Only a root every user may list and search is shown as one (`0555`).
        assert!(is_open(&node(0o755, 1, 1)) && is_open(&node(0o555, 1, 1)));
        for private in [0o711, 0o744, 0o705, 0o750] {
            assert!(!is_open(&node(private, 1, 1)), "{private:o}");
        }
        // Every entry shown as owned by one user: that user is the root's owner too.
        assert_eq!(
            shown_perm(&private, &node(0o644, 2, 2), Some((9, 9)), true),
            0o600
        );
    }
}
