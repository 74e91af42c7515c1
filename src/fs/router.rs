//! The router: [`CheckpointFs`] decodes an inode (or a file handle) once into the
//! subtree that owns it and hands the call on (see the module comment of `fs`); it
//! also holds what spans subtrees: deferring reads until a load ends
//! ([`CheckpointFs::prepare`]), `copy_file_range` from a checkpoint into `staging/`,
//! and the commit rule of `rename`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use super::checkpoints::{self, Checkpoints, Owners};
use super::error::FsError;
use super::forker::{FORK_ATTRIBUTE, ForkDone, Forker};
use super::inode::{self, Inode, Owner};
use super::listing::Catalog;
use super::loader::{Loader, LoaderConfig};
use super::primer::Primer;
use super::sealer::{SealDone, Sealer, SealerConfig};
use super::staging::{Caller, SetAttr, StagingTree};
use super::subtree::{DirEntry, Entry, KernelCache, Opened, Subtree};
use super::views::Views;
use super::{metrics, status};
use crate::archive::Limits;
use crate::cache::Cache;
use crate::checkpoint::Exact;
use crate::store::{ObjectStore, StoreError};

pub struct FsConfig {
    pub max_archive_size: u64,
    /// What one archive may be (its index at most `limits.max_index_bytes`).
    pub limits: Limits,
    /// The memory loaded indexes may take in all, beyond those in use.
    pub memory_budget: u64,
    /// Show every checkpoint entry as owned by this uid and gid.
    pub owner_override: Option<(u32, u32)>,
    /// Other users may use the mount (`--allow-other`): a checkpoint kept private by
    /// its own directory shows only what those who could enter it may read (see
    /// [`super::checkpoints::shown_perm`]).
    pub shared: bool,
    /// Owner of the virtual directories: the mounting user.
    pub uid: u32,
    pub gid: u32,
    /// Where sealed workspaces are archived before upload.
    pub work_dir: std::path::PathBuf,
    /// Compression threads for sealing.
    pub threads: usize,
    /// Gzip members of earlier captures, for sealing.
    pub members: Option<Arc<crate::members::store::MemberCache>>,
    /// Checkpoints loaded at once (see [`super::loader::default_loaders`]).
    pub loaders: usize,
    /// No `staging/` and no `commit/`.
    pub read_only: bool,
    /// Files are opened through the daemon, so that large checkpoint files can be
    /// read by FUSE passthrough; otherwise, on a read-only mount, the kernel opens
    /// files by itself (see [`CheckpointFs::open_is_free`]).
    pub passthrough: bool,
}

/// The most capture times a mount's first listing asks for (see
/// [`CheckpointFs::first_listing`]).
const FIRST_LISTING_REQUESTS: usize = 32;

/// The operations that read a tree: those [`CheckpointFs::prepare`] may defer until a
/// checkpoint is loaded. Reads come by inode where the kernel opens files by itself,
/// and a checkpoint may have been evicted since the file was opened (nothing told the
/// daemon it was): they wait for it to load again, like a first access. Releases go
/// by handle; changes are refused without looking inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    Lookup,
    Getattr,
    Readlink,
    Opendir,
    Readdir,
    Open,
    Read,
}

pub struct CheckpointFs {
    store: Arc<dyn ObjectStore>,
    catalog: Arc<Catalog>,
    loader: Arc<Loader>,
    views: Views,
    checkpoints: Arc<Checkpoints>,
    pub(super) staging: Arc<StagingTree>,
    sealer: Arc<Sealer>,
    /// Fills the member cache from checkpoints the next turn is likely made from.
    primer: Option<Arc<Primer>>,
    /// Makes workspaces from checkpoints in the daemon (`ckptfs fork`).
    forker: Arc<Forker>,
    latencies: Arc<metrics::Latencies>,
    /// Every open goes through the daemon: for passthrough, or because the mount is
    /// writable, so that the kernel would let checkpoint files be opened for writing.
    opens_checked: bool,
    /// Other users may use the mount (`--allow-other`): directories are opened
    /// through the daemon (see [`CheckpointFs::dirs_opened_freely`]).
    shared: bool,
    kernel: Arc<OnceLock<Arc<dyn KernelCache>>>,
}

impl CheckpointFs {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        cache: Arc<Cache>,
        staging: StagingTree,
        config: FsConfig,
    ) -> Arc<Self> {
        let mounted_at = SystemTime::now();
        if let Some(members) = &config.members {
            cache.record_layouts_in(Arc::clone(members));
        }
        let catalog = Arc::new(Catalog::new(mounted_at, config.read_only));
        let loader = Arc::new(Loader::start(
            Arc::clone(&store),
            Arc::clone(&cache),
            Arc::clone(&catalog),
            LoaderConfig {
                workers: config.loaders,
                max_archive_size: config.max_archive_size,
                limits: config.limits,
                memory_budget: config.memory_budget,
            },
        ));
        let owners = Owners {
            override_: config.owner_override,
            mounting: (config.uid, config.gid),
            shared: config.shared,
        };
        let kernel = Arc::new(OnceLock::new());
        let checkpoints = Arc::new(Checkpoints::new(
            Arc::clone(&catalog),
            Arc::clone(&loader),
            owners,
            Arc::clone(&kernel),
        ));
        let staging = Arc::new(staging);
        let sealer = Arc::new(Sealer::new(
            Arc::clone(&staging),
            Arc::clone(&store),
            Arc::clone(&cache),
            Arc::clone(&catalog),
            Arc::clone(&loader),
            SealerConfig {
                max_archive_size: config.max_archive_size,
                limits: config.limits,
                work_dir: config.work_dir,
                threads: config.threads,
                members: config.members.clone(),
            },
        ));
        let primer = config
            .members
            .clone()
            .map(|members| Arc::new(Primer::new(members)));
        if let Some(primer) = primer.as_ref().filter(|_| !config.read_only) {
            // The newest turn is the one the next is most likely made from, and often
            // by a copy from outside the mount (a sandbox restoring its workspace),
            // which names no checkpoint: its members are primed once it is loaded, so
            // that the seal of the next turn compresses only what changed.
            let (catalog, primer) = (Arc::clone(&catalog), Arc::clone(primer));
            loader.on_loaded(Box::new(move |slot, checkpoint| {
                let listing = catalog.snapshot();
                if listing.newest().is_some_and(|n| n.info.id == slot.info.id) {
                    primer.prime(checkpoint);
                }
            }));
        }
        let forker = Arc::new(Forker {
            catalog: Arc::clone(&catalog),
            loader: Arc::clone(&loader),
            staging: Arc::clone(&staging),
            primer: primer.clone(),
            sealer: Arc::clone(&sealer),
            kernel: Arc::clone(&kernel),
            shown_owner: config.owner_override,
            shared: config.shared,
            running: Default::default(),
        });
        let latencies = Arc::new(metrics::Latencies::default());
        let status = status::Sources {
            store_name: store.describe(),
            cache,
            loader: Arc::clone(&loader),
            latencies: Arc::clone(&latencies),
        };
        let views = Views::new(
            Arc::clone(&catalog),
            Arc::clone(&checkpoints),
            Arc::clone(&staging),
            Arc::clone(&sealer),
            status,
            (config.uid, config.gid),
            mounted_at,
        );
        Arc::new(CheckpointFs {
            store,
            catalog,
            loader,
            views,
            checkpoints,
            staging,
            sealer,
            primer,
            forker,
            latencies,
            opens_checked: config.passthrough || !config.read_only,
            shared: config.shared,
            kernel,
        })
    }

    /// Connects the core to the kernel's caches, once mounted.
    pub fn attach_kernel(&self, kernel: Arc<dyn KernelCache>) {
        let _ = self.kernel.set(kernel);
    }

    /// Lists the store and swaps in the new listing, in capture order. On failure the
    /// previous listing stays, and the error shows in `.status`.
    pub fn refresh(&self) -> Result<(), StoreError> {
        self.catalog
            .refresh(self.store.as_ref(), Exact::All)
            .map(drop)
    }

    /// The first listing of a mount: at most [`FIRST_LISTING_REQUESTS`] capture times
    /// are asked for, newest first (enough for `latest` and the last turns unless a
    /// second holds more), so that a store filled in bursts does not hold the mount
    /// up with a `HeadObject` per checkpoint. Returns whether the whole order is
    /// exact; if not, a [`refresh`](Self::refresh) at once completes it.
    pub fn first_listing(&self) -> Result<bool, StoreError> {
        self.catalog
            .refresh(self.store.as_ref(), Exact::Requests(FIRST_LISTING_REQUESTS))
    }

    fn subtree(&self, owner: Owner) -> &dyn Subtree {
        match owner {
            Owner::Views => &self.views,
            Owner::Checkpoints => &*self.checkpoints,
            Owner::Staging => &*self.staging,
        }
    }

    fn of_inode(&self, ino: u64) -> &dyn Subtree {
        self.subtree(Owner::of_inode(ino))
    }

    fn of_handle(&self, fh: u64) -> &dyn Subtree {
        self.subtree(Owner::of_handle(fh))
    }

    /// Runs `then` now, or once the checkpoint `ino` belongs to is loaded (or failed
    /// to load) when `reading` needs its contents and it is not loaded yet. The one
    /// exception to "needs its contents": `stat` of a checkpoint's own directory,
    /// which the listing answers, but on a shared mount before its root was ever
    /// known: the kernel asks for it again when the provisional mode denied a user,
    /// who is then judged by the root's own (see `Checkpoints::root_entry`).
    pub fn prepare(
        self: &Arc<Self>,
        ino: u64,
        reading: Reading,
        then: impl FnOnce(&CheckpointFs) + Send + 'static,
    ) {
        let slot = match Inode::decode(ino) {
            Some(Inode::Node { node: 0, slot }) if reading == Reading::Getattr => {
                self.catalog.slot(slot).filter(|slot| {
                    self.shared && !self.checkpoints.root_known(slot) && self.loader.must_wait(slot)
                })
            }
            Some(Inode::Node { slot, .. }) => self
                .catalog
                .slot(slot)
                .filter(|slot| self.loader.must_wait(slot)),
            _ => None,
        };
        match slot {
            None => then(self),
            Some(slot) => {
                let fs = Arc::clone(self);
                self.loader.when_loaded(&slot, Box::new(move || then(&fs)));
            }
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        self.of_inode(parent).lookup(parent, name)
    }

    /// Whether `caller` (uid, gid, pid) may `need` directory `ino` itself, where the
    /// kernel may have checked it against attributes it held before a load (see
    /// [`Checkpoints::may_enter`]).
    pub fn may_enter(&self, ino: u64, caller: (u32, u32, u32), need: u32) -> Result<(), FsError> {
        match Owner::of_inode(ino) {
            Owner::Checkpoints => self.checkpoints.may_enter(ino, caller, need),
            _ => Ok(()),
        }
    }

    /// How long the kernel may remember that a name is absent from directory
    /// `parent`: for a day in a checkpoint (it never changes), as long as the names
    /// around it in `staging/` (see [`StagingTree::entry_in`]), not at all in the
    /// virtual tree (the listing changes).
    pub fn negative_ttl(&self, parent: u64) -> Duration {
        match Owner::of_inode(parent) {
            Owner::Checkpoints => checkpoints::IMMUTABLE_TTL,
            Owner::Staging => self.staging.negative_ttl(parent),
            Owner::Views => Duration::ZERO,
        }
    }

    /// The attributes of `ino`, asked by the kernel (see
    /// [`Checkpoints::root_failure`]).
    pub fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        if let Some(failure) = self.checkpoints.root_failure(ino) {
            return Err(failure);
        }
        self.of_inode(ino).getattr(ino)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        self.of_inode(ino).readlink(ino)
    }

    pub fn opendir(&self, ino: u64) -> Result<(), FsError> {
        self.of_inode(ino).opendir(ino)
    }

    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        self.of_inode(ino).readdir(ino, offset, add)
    }

    /// `readdir` with each entry looked up, as READDIRPLUS answers, so that `ls -l`
    /// needs no lookup per entry: `add(entry, found, next)` gets `None` for `.` and
    /// `..` (the kernel ignores their attributes). The kernel counts a lookup only for
    /// an entry it received: one that did not fit (`add` says the reply is full), or
    /// every one when the reply is an error, is forgotten again here. An entry gone
    /// since the listing was read is left out.
    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, Option<&Entry>, u64) -> bool,
    ) -> Result<(), FsError> {
        let (mut failure, mut sent) = (None, Vec::new());
        let result = self.readdir(ino, offset, &mut |entry, next| {
            if entry.name == b"." || entry.name == b".." {
                return add(entry, None, next);
            }
            let looked_up = match &entry.found {
                Some(found) => Ok(**found),
                None => self.lookup(ino, &entry.name),
            };
            let found = match looked_up {
                Ok(found) => found,
                // Gone since the listing was read: the listing goes on without it, as
                // a local directory's would.
                Err(e) if e.errno() == libc::ENOENT => return false,
                Err(e) => {
                    failure = Some(e);
                    return true;
                }
            };
            let full = add(entry, Some(&found), next);
            if full {
                self.forget(found.attr.ino, 1);
            } else {
                sent.push(found.attr.ino);
            }
            full
        });
        let result = result.and_then(|()| failure.map_or(Ok(()), Err));
        if result.is_err() {
            // An error is the whole reply: the kernel counts none of these lookups.
            for ino in sent {
                self.forget(ino, 1);
            }
        }
        result
    }

    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError> {
        self.of_inode(ino).open(ino, flags)
    }

    /// Answers the kernel's OPEN: opened by the daemon, or, once the file is found
    /// openable where opens are free ([`CheckpointFs::open_is_free`]), `None`: the
    /// kernel is to open it, and every file after it, by itself.
    pub fn open_for_kernel(&self, ino: u64, flags: i32) -> Result<Option<Opened>, FsError> {
        let opened = self.open(ino, flags)?;
        if self.open_is_free() {
            self.release(opened.fh);
            return Ok(None);
        }
        Ok(Some(opened))
    }

    /// Whether opening a file asks nothing of the daemon: on a read-only mount without
    /// passthrough, the adapter answers the first OPEN with ENOSYS, after which the
    /// kernel opens every file by itself (no round trip per open, and the page cache
    /// is kept across opens), and reads come with no handle ([`super::NO_HANDLE`]).
    ///
    /// Not on a writable mount: the kernel would then let a checkpoint file whose mode
    /// allows it (or any, for root) be opened for writing, and pages dirtied through a
    /// shared mapping stay in the page cache after their writeback fails, so that every
    /// reader would see bytes that were never verified. Opened by the daemon, a
    /// checkpoint file opened for writing is refused (`EROFS`).
    pub fn open_is_free(&self) -> bool {
        !self.opens_checked
    }

    /// Whether the kernel may open directories by itself (and keep their listings):
    /// not on a mount other users share, where a directory opened before its
    /// checkpoint was loaded, on the provisional mode of its own directory, would read
    /// the listing the kernel caches for its owner later (see
    /// [`Checkpoints::may_enter`]); there every `opendir` is checked by the daemon.
    pub fn dirs_opened_freely(&self) -> bool {
        !self.shared
    }

    /// Whether `caller` (uid, gid, pid) may reach entry `ino` (see
    /// [`Checkpoints::may_reach`]).
    pub fn may_reach(&self, ino: u64, caller: (u32, u32, u32)) -> Result<(), FsError> {
        match Owner::of_inode(ino) {
            Owner::Checkpoints => self.checkpoints.may_reach(ino, caller),
            _ => Ok(()),
        }
    }

    /// Whether directory `ino` never changes (a checkpoint's): its listing may be
    /// kept by the kernel across opens.
    pub fn dir_is_immutable(&self, ino: u64) -> bool {
        matches!(Owner::of_inode(ino), Owner::Checkpoints)
    }

    /// Reads file `ino`, through open handle `fh` or by inode ([`super::NO_HANDLE`]).
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.of_inode(ino).read(ino, fh, offset, size)
    }

    pub fn release(&self, fh: u64) {
        self.of_handle(fh).release(fh)
    }

    /// `copy_file_range` from any open file into a staged one, done by the kernel
    /// between the two backing files (a reflink where the filesystem has them): how
    /// `cp` starts a workspace from a checkpoint. Returns the bytes copied; fewer than
    /// `len` only at the end of the source.
    pub fn copy_file_range(
        &self,
        (ino_in, fh_in, offset_in): (u64, u64, u64),
        (ino_out, offset_out): (u64, u64),
        len: u64,
    ) -> Result<u32, FsError> {
        if Owner::of_inode(ino_out) != Owner::Staging {
            return Err(self.of_inode(ino_out).refusal(ino_out));
        }
        let source = self.of_inode(ino_in).copy_source(ino_in, fh_in)?;
        let copied = self
            .staging
            .copy_into(ino_out, offset_out, &source, offset_in, len)?;
        // A workspace is being started from this checkpoint: its seal will compress
        // only what changed, if the member cache has the rest.
        if let (Some(checkpoint), Some(primer)) = (&source.from, &self.primer) {
            primer.prime(checkpoint);
        }
        Ok(copied)
    }

    /// The kernel dropped `count` references to `ino` (only staging counts them).
    pub fn forget(&self, ino: u64, count: u64) {
        if Owner::of_inode(ino) == Owner::Staging {
            self.staging.forget(ino, count);
        }
    }

    /// Space of the disk that staging writes to: what `cp` and `df` care about.
    pub fn statfs(&self) -> Result<rustix::fs::StatVfs, FsError> {
        self.staging.statfs()
    }

    /// Where the adapter records how long each request took.
    pub fn latencies(&self) -> &metrics::Latencies {
        &self.latencies
    }

    pub fn status_text(&self) -> Vec<u8> {
        self.views.status_text()
    }

    /// Extended attributes are not part of checkpoints: "not supported" in staging
    /// (so that `cp -a` and `rsync -a` carry on without them), read-only elsewhere.
    /// The one taken is [`FORK_ATTRIBUTE`] on a workspace, a fork (see `forker.rs`).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], caller: Caller, done: ForkDone) {
        match Owner::of_inode(ino) {
            Owner::Staging if name == FORK_ATTRIBUTE.as_bytes() => {
                self.forker.fork(ino, value, caller, done)
            }
            Owner::Staging => done(Err(FsError::NotSupported(
                "extended attributes are not kept",
            ))),
            owner => done(Err(self.subtree(owner).refusal(ino))),
        }
    }

    /// There are none to remove in staging.
    pub fn removexattr(&self, ino: u64) -> FsError {
        match Owner::of_inode(ino) {
            Owner::Staging => FsError::NoAttribute,
            owner => self.subtree(owner).refusal(ino),
        }
    }

    /// The staging tree, when `ino` belongs to it; else why `ino` cannot change.
    fn staging_for(&self, ino: u64) -> Result<&StagingTree, FsError> {
        match Owner::of_inode(ino) {
            Owner::Staging => Ok(&self.staging),
            owner => Err(self.subtree(owner).refusal(ino)),
        }
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Entry, FsError> {
        let staging = self.staging_for(ino)?;
        Ok(staging.entry_in(ino, staging.setattr(ino, set)?))
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        caller: Caller,
    ) -> Result<Entry, FsError> {
        let staging = self.staging_for(parent)?;
        Ok(staging.entry_in(parent, staging.mkdir(parent, name, mode, caller)?))
    }

    /// Makes a FIFO or a socket in `staging/`.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Entry, FsError> {
        let staging = self.staging_for(parent)?;
        Ok(staging.entry_in(parent, staging.mknod(parent, name, mode, rdev, caller)?))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Entry, FsError> {
        let staging = self.staging_for(parent)?;
        Ok(staging.entry_in(parent, staging.symlink(parent, name, target, caller)?))
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Entry, FsError> {
        let staging = self.staging_for(new_parent)?;
        self.staging_for(ino)?;
        Ok(staging.entry_in(new_parent, staging.link(ino, new_parent, new_name)?))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.staging_for(parent)?.unlink(parent, name)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.staging_for(parent)?.rmdir(parent, name)
    }

    /// Creates and opens a file.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Entry, Opened), FsError> {
        let staging = self.staging_for(parent)?;
        let (attr, opened) = staging.create(parent, name, mode, flags, caller)?;
        Ok((staging.entry_in(parent, attr), opened))
    }

    /// Writes go by inode, handle or not (see `staging/files.rs`).
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        self.staging_for(ino)?.write(ino, offset, data)
    }

    pub fn fsync(&self, ino: u64) -> Result<(), FsError> {
        match Owner::of_inode(ino) {
            Owner::Staging => self.staging.fsync(ino),
            _ => Ok(()),
        }
    }

    /// Renames within `staging/`, or seals `staging/NAME` into `commit/NEW`; `done`
    /// gets the outcome (at once, or when the seal ends).
    pub fn rename(&self, from: (u64, &[u8]), to: (u64, &[u8]), flags: u32, done: SealDone) {
        let ((parent, name), (new_parent, new_name)) = (from, to);
        let owners = (Owner::of_inode(parent), Owner::of_inode(new_parent));
        if owners == (Owner::Staging, Owner::Staging) {
            return done(
                self.staging
                    .rename(parent, name, new_parent, new_name, flags),
            );
        }
        if new_parent == inode::COMMIT {
            let kernel = Arc::clone(&self.kernel);
            return self.sealer.commit(from, new_name, flags, kernel, done);
        }
        // Across subtrees: the side that is not staging/ says why not (a checkpoint
        // or the virtual tree is read-only).
        let (refusing, ino) = match owners {
            (Owner::Staging, other) => (other, new_parent),
            (other, _) => (other, parent),
        };
        done(Err(self.subtree(refusing).refusal(ino)))
    }
}
