//! The filesystem logic, free of FUSE types, so that it can be tested by calling it.
//!
//! The tree (SPEC section 4) has two parts:
//! - a virtual part built from store listings alone: the root with one directory per
//!   checkpoint, `by-time/`, `latest`, `.status`, and the capture directories;
//! - each checkpoint's contents, served from a [`VerifiedCheckpoint`] of the cache.
//!
//! Invariants:
//! - listing the root, or `stat` of a checkpoint's directory, never downloads;
//! - nothing inside a checkpoint is answered before the cache has verified it: an
//!   operation that needs the contents waits for the load ([`CheckpointFs::ensure_loaded`])
//!   on the loader's thread, never on a FUSE request thread, and a failed load
//!   answers EIO with its reason in `.status`; a later access tries again;
//! - checkpoint contents never change, so the adapter may let the kernel cache them.

pub mod commit;
pub mod error;
pub mod fuse;
pub mod inode;
pub mod mount;
pub mod staging;

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::archive::Limits;
use crate::archive::index::{FileLocation, Node, NodeKind};
use crate::cache::{Cache, VerifiedCheckpoint};
use crate::checkpoint::{self, CheckpointId, CheckpointInfo};
use crate::store::{ObjectStore, StoreError};

pub use error::FsError;
use inode::Inode;
pub use staging::{Caller, SetAttr, SetTime, StagingTree};

/// A failed verification is reported as is to accesses within this time, so that one
/// `ls` does not download a bad object once per system call.
const FAILURE_REUSE: Duration = Duration::from_secs(1);

pub struct FsConfig {
    pub max_archive_size: u64,
    pub limits: Limits,
    /// Show every checkpoint entry as owned by this uid and gid.
    pub owner_override: Option<(u32, u32)>,
    /// Owner of the virtual directories: the mounting user.
    pub uid: u32,
    pub gid: u32,
    /// Where sealed workspaces are archived before upload.
    pub work_dir: std::path::PathBuf,
    /// Compression threads for sealing.
    pub threads: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    Symlink,
    /// Only in `staging/`: checkpoints never hold FIFOs, sockets or devices.
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

/// What the adapter needs to answer an `open`.
#[derive(Debug)]
pub struct OpenFile {
    pub fh: u64,
    /// A file holding exactly the contents, for the kernel to read directly.
    pub backing: Option<File>,
    /// The contents never change: the kernel may keep its page cache across opens.
    pub keep_cache: bool,
    /// The size is not known in advance (`.status`): bypass the page cache.
    pub direct_io: bool,
}

type Waiter = Box<dyn FnOnce() + Send>;

enum Load {
    Unloaded,
    Loading(Vec<Waiter>),
    Loaded(Arc<VerifiedCheckpoint>),
    Failed { reason: String, at: Instant },
}

struct Slot {
    info: CheckpointInfo,
    /// In the latest listing (a checkpoint deleted from the store keeps its slot).
    listed: bool,
    load: Load,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    by_id: HashMap<CheckpointId, usize>,
    /// Listed slots, oldest first.
    order: Vec<usize>,
    root: Arc<Vec<DirEntry>>,
    by_time: Arc<Vec<DirEntry>>,
    /// Name to inode for `root` and `by_time`, so that lookups stay O(1) with
    /// thousands of checkpoints.
    root_names: HashMap<Vec<u8>, u64>,
    by_time_names: HashMap<Vec<u8>, u64>,
    listing_error: Option<String>,
    listed_at: Option<SystemTime>,
    /// When the set of listed checkpoints last changed: the root's and `by-time/`'s
    /// mtime, by which the kernel knows to drop its cached listings of them.
    changed_at: Option<SystemTime>,
}

impl State {
    /// The slot of checkpoint `info`, created (unlisted, unloaded) if it is new.
    fn slot_for(&mut self, info: &CheckpointInfo) -> usize {
        if let Some(&slot) = self.by_id.get(&info.id) {
            return slot;
        }
        self.slots.push(Slot {
            info: info.clone(),
            listed: false,
            load: Load::Unloaded,
        });
        self.by_id.insert(info.id.clone(), self.slots.len() - 1);
        self.slots.len() - 1
    }
}

enum Handle {
    /// The checkpoint is held so that it is not evicted while open.
    Own {
        file: File,
        _pin: Arc<VerifiedCheckpoint>,
    },
    Packed {
        checkpoint: Arc<VerifiedCheckpoint>,
        start: u64,
        size: u64,
    },
    Text(Vec<u8>),
}

pub struct CheckpointFs {
    store: Arc<dyn ObjectStore>,
    cache: Arc<Cache>,
    staging: StagingTree,
    seals: Mutex<commit::Seals>,
    config: FsConfig,
    state: Mutex<State>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    mounted_at: SystemTime,
}

fn by_time_name(info: &CheckpointInfo) -> Vec<u8> {
    format!(
        "{}-{}",
        humantime::format_rfc3339_seconds(info.last_modified),
        info.id.short()
    )
    .into_bytes()
}

fn dir_entry(ino: u64, kind: FileKind, name: &[u8]) -> DirEntry {
    DirEntry {
        ino,
        kind,
        name: name.to_vec(),
    }
}

fn epoch_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn time_from_secs(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

impl CheckpointFs {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        cache: Arc<Cache>,
        staging: StagingTree,
        config: FsConfig,
    ) -> Arc<Self> {
        let fs = Arc::new(CheckpointFs {
            store,
            cache,
            staging,
            seals: Mutex::new(commit::Seals::default()),
            config,
            state: Mutex::new(State::default()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            mounted_at: SystemTime::now(),
        });
        fs.rebuild_views(&mut fs.lock());
        fs
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("filesystem state lock")
    }

    /// Lists the store and updates the virtual tree. On failure the previous listing
    /// stays, and the error shows in `.status`.
    pub fn refresh(&self) -> Result<(), StoreError> {
        let listed = checkpoint::list(self.store.as_ref());
        let mut state = self.lock();
        match listed {
            Ok(checkpoints) => {
                for slot in &mut state.slots {
                    slot.listed = false;
                }
                let mut order = Vec::with_capacity(checkpoints.len());
                for info in checkpoints {
                    let index = state.slot_for(&info);
                    let slot = &mut state.slots[index];
                    slot.info = info;
                    slot.listed = true;
                    order.push(index);
                }
                if state.order != order {
                    state.changed_at = Some(SystemTime::now());
                }
                state.order = order;
                state.listing_error = None;
                state.listed_at = Some(SystemTime::now());
                self.rebuild_views(&mut state);
                Ok(())
            }
            Err(e) => {
                state.listing_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn rebuild_views(&self, state: &mut State) {
        let mut root = vec![
            dir_entry(inode::ROOT, FileKind::Directory, b"."),
            dir_entry(inode::ROOT, FileKind::Directory, b".."),
            dir_entry(inode::BY_TIME, FileKind::Directory, b"by-time"),
            dir_entry(inode::STAGING, FileKind::Directory, b"staging"),
            dir_entry(inode::COMMIT, FileKind::Directory, b"commit"),
            dir_entry(inode::STATUS, FileKind::File, b".status"),
        ];
        if !state.order.is_empty() {
            root.push(dir_entry(inode::LATEST, FileKind::Symlink, b"latest"));
        }
        let mut by_time = vec![
            dir_entry(inode::BY_TIME, FileKind::Directory, b"."),
            dir_entry(inode::ROOT, FileKind::Directory, b".."),
        ];
        for &slot in &state.order {
            let info = &state.slots[slot].info;
            root.push(dir_entry(
                Inode::Node { slot, node: 0 }.encode(),
                FileKind::Directory,
                info.id.as_str().as_bytes(),
            ));
            by_time.push(dir_entry(
                Inode::ByTimeLink { slot }.encode(),
                FileKind::Symlink,
                &by_time_name(info),
            ));
        }
        let names = |entries: &[DirEntry]| -> HashMap<Vec<u8>, u64> {
            entries
                .iter()
                .skip(2)
                .map(|e| (e.name.clone(), e.ino))
                .collect()
        };
        state.root_names = names(&root);
        state.by_time_names = names(&by_time);
        state.root = Arc::new(root);
        state.by_time = Arc::new(by_time);
    }

    /// Lists a checkpoint this mount just stored, at once, with its verified contents
    /// when they are at hand.
    fn add_checkpoint(&self, info: CheckpointInfo, verified: Option<Arc<VerifiedCheckpoint>>) {
        let mut state = self.lock();
        let slot = state.slot_for(&info);
        if !state.slots[slot].listed {
            state.slots[slot].listed = true;
            state.order.push(slot);
            state.changed_at = Some(SystemTime::now());
        }
        if let Some(verified) = verified
            && !matches!(state.slots[slot].load, Load::Loading(_))
        {
            state.slots[slot].load = Load::Loaded(verified);
        }
        self.rebuild_views(&mut state);
    }

    /// Whether the kernel may cache what it learns about `ino` for a long time.
    pub fn is_immutable(&self, ino: u64) -> bool {
        matches!(
            Inode::decode(ino),
            Some(Inode::Node { .. } | Inode::ByTimeLink { .. })
        )
    }

    /// The checkpoint that must be loaded before an operation on `ino` can be
    /// answered, if it is not loaded yet. `stat` of a checkpoint's own directory
    /// needs only the listing.
    pub fn slot_needing_load(&self, ino: u64, getattr: bool) -> Option<usize> {
        let Some(Inode::Node { slot, node }) = Inode::decode(ino) else {
            return None;
        };
        if getattr && node == 0 {
            return None;
        }
        let state = self.lock();
        match &state.slots.get(slot)?.load {
            Load::Loaded(_) => None,
            Load::Failed { at, .. } if at.elapsed() < FAILURE_REUSE => None,
            _ => Some(slot),
        }
    }

    /// Runs `waiter` once checkpoint `slot` is loaded or has failed to load. The
    /// download runs on a thread of its own; concurrent callers share it.
    pub fn ensure_loaded(self: &Arc<Self>, slot: usize, waiter: Waiter) {
        let mut state = self.lock();
        let Some(entry) = state.slots.get_mut(slot) else {
            drop(state);
            return waiter();
        };
        match &mut entry.load {
            Load::Loaded(_) => {
                drop(state);
                waiter()
            }
            Load::Loading(waiters) => waiters.push(waiter),
            Load::Unloaded | Load::Failed { .. } => {
                entry.load = Load::Loading(vec![waiter]);
                let info = entry.info.clone();
                drop(state);
                let fs = Arc::clone(self);
                std::thread::Builder::new()
                    .name(format!("ckptfs-load-{}", info.id.short()))
                    .spawn(move || fs.load(slot, info))
                    .expect("spawning a loader thread");
            }
        }
    }

    fn load(&self, slot: usize, info: CheckpointInfo) {
        let started = Instant::now();
        let result = self.cache.load(
            self.store.as_ref(),
            &info.id,
            self.config.max_archive_size,
            self.config.limits,
            epoch_secs(info.last_modified),
        );
        let waiters = {
            let mut state = self.lock();
            let new = match result {
                Ok(checkpoint) => {
                    tracing::info!(checkpoint = %info.id, elapsed = ?started.elapsed(), "checkpoint verified");
                    Load::Loaded(checkpoint)
                }
                Err(e) => {
                    tracing::error!(checkpoint = %info.id, error = %e, "checkpoint failed verification");
                    Load::Failed {
                        reason: e.to_string(),
                        at: Instant::now(),
                    }
                }
            };
            match std::mem::replace(&mut state.slots[slot].load, new) {
                Load::Loading(waiters) => waiters,
                _ => Vec::new(),
            }
        };
        self.evict(&info.id);
        for waiter in waiters {
            waiter();
        }
    }

    /// Keeps the cache within its bound. Checkpoints with open files stay, and so
    /// does `keep`, the one just loaded: a checkpoint larger than the whole cache is
    /// still served, and evicted when the next one comes.
    fn evict(&self, keep: &CheckpointId) {
        let mut state = self.lock();
        let in_use = |id: &CheckpointId| {
            id == keep
                || state
                    .by_id
                    .get(id)
                    .is_some_and(|&slot| match &state.slots[slot].load {
                        Load::Loaded(c) => Arc::strong_count(c) > 1,
                        Load::Loading(_) => true,
                        _ => false,
                    })
        };
        let evicted = self.cache.evict(in_use);
        for id in evicted {
            if let Some(&slot) = state.by_id.get(&id)
                && matches!(state.slots[slot].load, Load::Loaded(_))
            {
                state.slots[slot].load = Load::Unloaded;
            }
        }
    }

    /// The verified contents of `slot`, or why they cannot be served.
    fn checkpoint(&self, slot: usize) -> Result<Arc<VerifiedCheckpoint>, FsError> {
        let state = self.lock();
        let entry = state.slots.get(slot).ok_or(FsError::NotFound)?;
        match &entry.load {
            Load::Loaded(c) => {
                self.cache.promote(&c.id);
                Ok(Arc::clone(c))
            }
            Load::Failed { reason, .. } => Err(FsError::Unverified {
                id: entry.info.id.to_string(),
                reason: reason.clone(),
            }),
            Load::Unloaded | Load::Loading(_) => Err(FsError::Unverified {
                id: entry.info.id.to_string(),
                reason: "not verified yet (evicted while in use); try again".into(),
            }),
        }
    }

    fn virtual_dir(&self, ino: u64, mtime: SystemTime, nlink: u32, perm: u16) -> Attr {
        Attr {
            ino,
            kind: FileKind::Directory,
            size: 4096,
            perm,
            nlink,
            uid: self.config.uid,
            gid: self.config.gid,
            atime: mtime,
            mtime,
            ctime: mtime,
        }
    }

    fn virtual_link(&self, ino: u64, target_len: usize, mtime: SystemTime) -> Attr {
        Attr {
            ino,
            kind: FileKind::Symlink,
            size: target_len as u64,
            perm: 0o777,
            nlink: 1,
            uid: self.config.uid,
            gid: self.config.gid,
            atime: mtime,
            mtime,
            ctime: mtime,
        }
    }

    fn node_attr(&self, slot: usize, index: u32, node: &Node) -> Attr {
        let (kind, size) = match &node.kind {
            NodeKind::Dir { .. } => (FileKind::Directory, 4096),
            NodeKind::File { size, .. } => (FileKind::File, *size),
            NodeKind::Symlink { target } => (FileKind::Symlink, target.len() as u64),
        };
        let (uid, gid) = self.config.owner_override.unwrap_or((node.uid, node.gid));
        Attr {
            ino: Inode::Node { slot, node: index }.encode(),
            kind,
            size,
            perm: (node.mode & 0o7777) as u16,
            nlink: node.nlink,
            uid,
            gid,
            atime: time_from_secs(node.mtime),
            mtime: time_from_secs(node.mtime),
            ctime: time_from_secs(node.mtime),
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(ino) {
            return self.staging.getattr(ino);
        }
        let inode = Inode::decode(ino).ok_or(FsError::NotFound)?;
        if let Inode::CommitLink { index } = inode {
            let seals = self.seals.lock().expect("seals lock");
            seals.sealed.get(index).ok_or(FsError::NotFound)?;
            return Ok(self.virtual_link(ino, 3 + 64, self.mounted_at));
        }
        let state = self.lock();
        let root_mtime = state.changed_at.unwrap_or(self.mounted_at);
        Ok(match inode {
            Inode::Root => {
                self.virtual_dir(ino, root_mtime, 2 + state.order.len() as u32 + 3, 0o755)
            }
            Inode::ByTime => self.virtual_dir(ino, root_mtime, 2, 0o555),
            Inode::Commit => self.virtual_dir(ino, self.mounted_at, 2, 0o755),
            Inode::Staging | Inode::Staged(_) | Inode::CommitLink { .. } => {
                unreachable!("handled above")
            }
            Inode::Latest => {
                let newest = state.order.last().ok_or(FsError::NotFound)?;
                self.virtual_link(ino, 64, state.slots[*newest].info.last_modified)
            }
            Inode::Status => Attr {
                ino,
                kind: FileKind::File,
                size: self.status_text_locked(&state).len() as u64,
                perm: 0o444,
                nlink: 1,
                uid: self.config.uid,
                gid: self.config.gid,
                atime: state.listed_at.unwrap_or(self.mounted_at),
                mtime: state.listed_at.unwrap_or(self.mounted_at),
                ctime: state.listed_at.unwrap_or(self.mounted_at),
            },
            Inode::ByTimeLink { slot } => {
                let info = &state.slots.get(slot).ok_or(FsError::NotFound)?.info;
                self.virtual_link(ino, 3 + 64, info.last_modified)
            }
            Inode::Node { slot, node: 0 } => {
                // Known from the listing alone: `ls -l` of the root downloads nothing.
                let entry = state.slots.get(slot).ok_or(FsError::NotFound)?;
                let nlink = match &entry.load {
                    Load::Loaded(c) => c.index.node(0).map_or(2, |n| n.nlink),
                    _ => 2,
                };
                let mut attr = self.virtual_dir(ino, entry.info.last_modified, nlink, 0o555);
                if let Some((uid, gid)) = self.config.owner_override {
                    (attr.uid, attr.gid) = (uid, gid);
                }
                attr
            }
            Inode::Node { slot, node } => {
                drop(state);
                let checkpoint = self.checkpoint(slot)?;
                let entry = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
                self.node_attr(slot, node, entry)
            }
        })
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.lookup(parent, name);
        }
        match Inode::decode(parent).ok_or(FsError::NotFound)? {
            Inode::Commit => {
                let index = self
                    .seals
                    .lock()
                    .expect("seals lock")
                    .committed(name)
                    .ok_or(FsError::NotFound)?;
                self.getattr(Inode::CommitLink { index }.encode())
            }
            Inode::Root => {
                let ino = self.lock().root_names.get(name).copied();
                self.getattr(ino.ok_or(FsError::NotFound)?)
            }
            Inode::ByTime => {
                let ino = self.lock().by_time_names.get(name).copied();
                self.getattr(ino.ok_or(FsError::NotFound)?)
            }
            Inode::Node { slot, node } => {
                let checkpoint = self.checkpoint(slot)?;
                let entry = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
                if !matches!(entry.kind, NodeKind::Dir { .. }) {
                    return Err(FsError::NotADirectory);
                }
                let child = checkpoint
                    .index
                    .lookup(node, name)
                    .ok_or(FsError::NotFound)?;
                let child_node = checkpoint.index.node(child).ok_or(FsError::NotFound)?;
                Ok(self.node_attr(slot, child, child_node))
            }
            _ => Err(FsError::NotADirectory),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        if StagingTree::owns_inode(ino) {
            return self.staging.readlink(ino);
        }
        let state = self.lock();
        match Inode::decode(ino).ok_or(FsError::NotFound)? {
            Inode::CommitLink { index } => {
                let seals = self.seals.lock().expect("seals lock");
                let (_, id) = seals.sealed.get(index).ok_or(FsError::NotFound)?;
                Ok(format!("../{id}").into_bytes())
            }
            Inode::Latest => {
                let newest = state.order.last().ok_or(FsError::NotFound)?;
                Ok(state.slots[*newest].info.id.as_str().as_bytes().to_vec())
            }
            Inode::ByTimeLink { slot } => {
                let info = &state.slots.get(slot).ok_or(FsError::NotFound)?.info;
                Ok(format!("../{}", info.id).into_bytes())
            }
            Inode::Node { slot, node } => {
                drop(state);
                let checkpoint = self.checkpoint(slot)?;
                match &checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind {
                    NodeKind::Symlink { target } => Ok(target.clone()),
                    _ => Err(FsError::NotASymlink),
                }
            }
            _ => Err(FsError::NotASymlink),
        }
    }

    /// Checks that directory `ino` can be listed. Opening a checkpoint's directory is
    /// what verifies it: a bad checkpoint answers EIO.
    pub fn opendir(&self, ino: u64) -> Result<(), FsError> {
        if self.getattr(ino)?.kind != FileKind::Directory {
            return Err(FsError::NotADirectory);
        }
        if let Some(Inode::Node { slot, .. }) = Inode::decode(ino) {
            self.checkpoint(slot)?;
        }
        Ok(())
    }

    /// Calls `add(entry, next_offset)` for the entries of directory `ino` from
    /// `offset` on, until it returns true (the reply buffer is full).
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        if StagingTree::owns_inode(ino) {
            return self.staging.readdir(ino, offset, add);
        }
        let listing = |entries: &Arc<Vec<DirEntry>>,
                       add: &mut dyn FnMut(&DirEntry, u64) -> bool| {
            for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
                if add(entry, i as u64 + 1) {
                    break;
                }
            }
        };
        match Inode::decode(ino).ok_or(FsError::NotFound)? {
            Inode::Root => {
                let root = Arc::clone(&self.lock().root);
                listing(&root, add);
            }
            Inode::ByTime => {
                let by_time = Arc::clone(&self.lock().by_time);
                listing(&by_time, add);
            }
            Inode::Commit => {
                let mut entries = vec![
                    dir_entry(ino, FileKind::Directory, b"."),
                    dir_entry(inode::ROOT, FileKind::Directory, b".."),
                ];
                let seals = self.seals.lock().expect("seals lock");
                for (index, (name, _)) in seals.sealed.iter().enumerate() {
                    entries.push(dir_entry(
                        Inode::CommitLink { index }.encode(),
                        FileKind::Symlink,
                        name,
                    ));
                }
                drop(seals);
                listing(&Arc::new(entries), add);
            }
            Inode::Node { slot, node } => {
                let checkpoint = self.checkpoint(slot)?;
                let NodeKind::Dir { children } =
                    &checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
                else {
                    return Err(FsError::NotADirectory);
                };
                let parent = if node == 0 { inode::ROOT } else { ino };
                let dots = [(ino, &b"."[..]), (parent, &b".."[..])];
                for i in offset as usize..children.len() + 2 {
                    let entry = if i < 2 {
                        dir_entry(dots[i].0, FileKind::Directory, dots[i].1)
                    } else {
                        let (name, child) = &children[i - 2];
                        let child_node = checkpoint.index.node(*child).ok_or(FsError::NotFound)?;
                        let kind = self.node_attr(slot, *child, child_node).kind;
                        dir_entry(Inode::Node { slot, node: *child }.encode(), kind, name)
                    };
                    if add(&entry, i as u64 + 1) {
                        break;
                    }
                }
            }
            _ => return Err(FsError::NotADirectory),
        }
        Ok(())
    }

    /// Opens a file with `open(2)` flags; checkpoints refuse any write access.
    pub fn open(&self, ino: u64, flags: i32) -> Result<OpenFile, FsError> {
        if StagingTree::owns_inode(ino) {
            let (fh, file) = self.staging.open(ino, flags)?;
            return Ok(OpenFile {
                fh,
                backing: Some(file),
                keep_cache: false,
                direct_io: false,
            });
        }
        let inode = Inode::decode(ino).ok_or(FsError::NotFound)?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
        }
        let (handle, backing, keep_cache, direct_io) = match inode {
            Inode::Status => (Handle::Text(self.status_text()), None, false, true),
            Inode::Node { slot, node } => {
                let checkpoint = self.checkpoint(slot)?;
                let NodeKind::File { size, location, .. } =
                    checkpoint.index.node(node).ok_or(FsError::NotFound)?.kind
                else {
                    return Err(FsError::IsADirectory);
                };
                match location {
                    FileLocation::Own => {
                        let file = checkpoint.open_own(node).map_err(FsError::Io)?;
                        let backing = file.try_clone().map_err(FsError::Io)?;
                        (
                            Handle::Own {
                                file,
                                _pin: checkpoint,
                            },
                            Some(backing),
                            true,
                            false,
                        )
                    }
                    FileLocation::Packed { offset } => (
                        Handle::Packed {
                            checkpoint,
                            start: offset,
                            size,
                        },
                        None,
                        true,
                        false,
                    ),
                }
            }
            _ => return Err(FsError::IsADirectory),
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .expect("handles lock")
            .insert(fh, Arc::new(handle));
        Ok(OpenFile {
            fh,
            backing,
            keep_cache,
            direct_io,
        })
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        if StagingTree::owns_handle(fh) {
            return self.staging.read(fh, offset, size);
        }
        let handle = self.handles.lock().expect("handles lock").get(&fh).cloned();
        match handle.as_deref().ok_or(FsError::BadHandle)? {
            Handle::Own { file, .. } => {
                crate::cache::read_at(file, offset, size as usize).map_err(FsError::Io)
            }
            Handle::Packed {
                checkpoint,
                start,
                size: file_size,
            } => {
                let len = (size as u64).min(file_size.saturating_sub(offset)) as usize;
                Ok(checkpoint
                    .read_packed(*start, offset, len)
                    .map_err(FsError::Io)?)
            }
            Handle::Text(text) => {
                let start = (offset as usize).min(text.len());
                let end = (start + size as usize).min(text.len());
                Ok(text[start..end].to_vec())
            }
        }
    }

    pub fn release(&self, fh: u64) {
        if StagingTree::owns_handle(fh) {
            return self.staging.release(fh);
        }
        self.handles.lock().expect("handles lock").remove(&fh);
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        if StagingTree::owns_handle(fh) {
            return self.staging.write(fh, offset, data);
        }
        Err(FsError::ReadOnly)
    }

    pub fn fsync(&self, fh: u64) -> Result<(), FsError> {
        if StagingTree::owns_handle(fh) {
            return self.staging.fsync(fh);
        }
        Ok(())
    }

    pub fn forget(&self, ino: u64, count: u64) {
        if StagingTree::owns_inode(ino) {
            self.staging.forget(ino, count);
        }
    }

    /// Space of the disk that staging writes to: what `cp` and `df` care about.
    pub fn statfs(&self) -> Result<rustix::fs::StatVfs, FsError> {
        self.staging.statfs()
    }

    /// Why `parent` cannot be changed: checkpoints are read-only, and `commit/` and
    /// the root only change through seals and listings.
    fn refuse_change(&self, parent: u64) -> FsError {
        match Inode::decode(parent) {
            Some(Inode::Commit | Inode::CommitLink { .. }) => {
                FsError::NotPermitted("commit/ only takes `mv staging/NAME commit/`")
            }
            _ => FsError::ReadOnly,
        }
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(ino) {
            return self.staging.setattr(ino, set);
        }
        Err(self.refuse_change(ino))
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.mkdir(parent, name, mode, caller);
        }
        Err(self.refuse_change(parent))
    }

    /// Makes a FIFO or a socket in `staging/`.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.mknod(parent, name, mode, rdev, caller);
        }
        Err(self.refuse_change(parent))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.symlink(parent, name, target, caller);
        }
        Err(self.refuse_change(parent))
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr, FsError> {
        if StagingTree::owns_inode(ino) && StagingTree::owns_inode(new_parent) {
            return self.staging.link(ino, new_parent, new_name);
        }
        Err(self.refuse_change(new_parent))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.unlink(parent, name);
        }
        Err(self.refuse_change(parent))
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        if StagingTree::owns_inode(parent) {
            return self.staging.rmdir(parent, name);
        }
        Err(self.refuse_change(parent))
    }

    /// Creates and opens a file.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, OpenFile), FsError> {
        if !StagingTree::owns_inode(parent) {
            return Err(self.refuse_change(parent));
        }
        let (attr, fh, file) = self.staging.create(parent, name, mode, flags, caller)?;
        Ok((
            attr,
            OpenFile {
                fh,
                backing: Some(file),
                keep_cache: false,
                direct_io: false,
            },
        ))
    }

    /// Renames within `staging/`, or seals `staging/NAME` into `commit/NEW`; `done`
    /// gets the outcome (at once, or when the seal ends).
    pub fn rename(
        self: &Arc<Self>,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        flags: u32,
        done: commit::SealDone,
    ) {
        let ((parent, name), (new_parent, new_name)) = (from, to);
        if StagingTree::owns_inode(parent) && StagingTree::owns_inode(new_parent) {
            return done(
                self.staging
                    .rename(parent, name, new_parent, new_name, flags),
            );
        }
        if new_parent == inode::COMMIT {
            if parent != inode::STAGING {
                return done(Err(FsError::NotPermitted(
                    "only top-level entries of staging/ can be moved into commit/",
                )));
            }
            if flags & libc::RENAME_EXCHANGE != 0 {
                return done(Err(FsError::InvalidArgument));
            }
            return self.seal(name.to_vec(), new_name.to_vec(), done);
        }
        done(Err(self.refuse_change(parent)))
    }

    pub fn status_text(&self) -> Vec<u8> {
        self.status_text_locked(&self.lock())
    }

    fn status_text_locked(&self, state: &State) -> Vec<u8> {
        let mut text = format!("# ckptfs: {}\n", self.store.describe());
        if let Some(at) = state.listed_at {
            text += &format!("# listed: {}\n", humantime::format_rfc3339_seconds(at));
        }
        if let Some(error) = &state.listing_error {
            text += &format!("# listing failed: {error}\n");
        }
        let cache = self.cache.stats();
        text += &format!(
            "# checkpoints: {}; cache: {} bytes in {} checkpoints; downloads: {}; loaded from cache: {}\n",
            state.order.len(),
            cache.used_bytes,
            cache.entries,
            cache.downloads,
            cache.reuses,
        );
        let seals = self.seals.lock().expect("seals lock");
        for name in &seals.in_progress {
            text += &format!("# seal in progress: {}\n", String::from_utf8_lossy(name));
        }
        for outcome in &seals.outcomes {
            text += &format!("# seal {outcome}\n");
        }
        drop(seals);
        for &slot in &state.order {
            let Slot { info, load, .. } = &state.slots[slot];
            let status = match load {
                Load::Unloaded => "listed".to_owned(),
                Load::Loading(_) => "verifying".to_owned(),
                Load::Loaded(_) => "verified".to_owned(),
                Load::Failed { reason, .. } => format!("FAILED: {reason}"),
            };
            text += &format!(
                "{}  {}  {}  {status}\n",
                info.id,
                info.size,
                humantime::format_rfc3339_seconds(info.last_modified)
            );
        }
        text.into_bytes()
    }
}

#[cfg(test)]
mod tests;
