//! The virtual tree built from the listing and the seals: the root (one directory
//! per checkpoint), `by-time/`, `latest`, `commit/`, and `.status`.
//!
//! Nothing here downloads: everything is answered from the current listing snapshot
//! and the sealer's records. `.status` is rendered when it is opened, without holding
//! any lock that other operations wait on. Where the kernel opens files by itself,
//! no open reaches the daemon: `.status` is rendered when it is looked up instead (its
//! name is never cached, so each path walk to it looks it up), and reads and `stat`s
//! get that render until the next lookup. A reader's last `stat`, made at the end to
//! see whether the file grew, thus finds the size it read. The kernel keeps a file's
//! cached pages until its size changes, so no render is as long as the one before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::checkpoints::{Checkpoints, IMMUTABLE_TTL};
use super::error::FsError;
use super::inode::{self, HANDLE_VIEW_BIT, Inode};
use super::listing::{Catalog, Listing, Slot};
use super::sealer::Sealer;
use super::staging::StagingTree;
use super::status::Sources;
use super::subtree::{
    Attr, DirEntry, Entry, FileKind, NO_HANDLE, Opened, Subtree, add_from, dot_entries,
};

/// Names in the root and `by-time/` follow the listing: cached for a second, so that
/// a checkpoint deleted from the store vanishes with the next listing.
pub const LISTING_TTL: Duration = Duration::from_secs(1);
/// `commit/NAME` turns from a directory into a symlink under the kernel's feet when
/// a seal ends: never cached.
pub const UNCACHED: Duration = Duration::ZERO;

/// The bytes that the renders kept for open handles of `.status` may take in all: any
/// user of a shared mount may open it as often as they like, and make it long (each
/// seal's outcome names its workspace). Past it, an open reads the one render shared
/// by reads without a handle ([`SHARED_RENDER`]), which the next open or lookup of
/// `.status` replaces: no one is refused, and only a reader that has not finished
/// when another opens it may read the rest from a newer render.
const STATUS_HELD: usize = if cfg!(test) { 64 << 10 } else { 16 << 20 };

/// The handle of an open of `.status` past [`STATUS_HELD`] (never given otherwise:
/// numbers start at 1).
const SHARED_RENDER: u64 = HANDLE_VIEW_BIT;

/// One rendering of `.status`.
type Render = Arc<Vec<u8>>;

pub struct Views {
    catalog: Arc<Catalog>,
    checkpoints: Arc<Checkpoints>,
    staging: Arc<StagingTree>,
    sealer: Arc<Sealer>,
    status: Sources,
    /// The mounting user, who owns the virtual entries.
    owner: (u32, u32),
    mounted_at: SystemTime,
    /// The render each open handle of `.status` reads, and their bytes in all (at
    /// most [`STATUS_HELD`]).
    texts: Mutex<(HashMap<u64, Render>, usize)>,
    next_fh: AtomicU64,
    /// The render of `.status` that reads without a handle get (see the module
    /// comment).
    rendered: Mutex<Arc<Vec<u8>>>,
}

impl Views {
    pub fn new(
        catalog: Arc<Catalog>,
        checkpoints: Arc<Checkpoints>,
        staging: Arc<StagingTree>,
        sealer: Arc<Sealer>,
        status: Sources,
        owner: (u32, u32),
        mounted_at: SystemTime,
    ) -> Self {
        Views {
            catalog,
            checkpoints,
            staging,
            sealer,
            status,
            owner,
            mounted_at,
            texts: Mutex::new((HashMap::new(), 0)),
            next_fh: AtomicU64::new(1),
            rendered: Mutex::new(Arc::new(Vec::new())),
        }
    }

    fn attr(
        &self,
        ino: u64,
        kind: FileKind,
        size: u64,
        perm: u16,
        nlink: u32,
        time: SystemTime,
    ) -> Attr {
        Attr {
            generation: 0,
            ino,
            kind,
            size,
            perm,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            atime: time,
            mtime: time,
            ctime: time,
        }
    }

    fn link(&self, ino: u64, target_len: usize, time: SystemTime) -> Attr {
        self.attr(ino, FileKind::Symlink, target_len as u64, 0o777, 1, time)
    }

    /// The text of `.status` now.
    pub fn status_text(&self) -> Vec<u8> {
        self.status
            .render(&self.catalog.snapshot(), &self.sealer.report())
    }

    /// Renders `.status` for the reads to come; returns its size, never the size of
    /// the last render, so that the kernel drops the pages it kept of that one.
    fn render_status(&self) -> u64 {
        self.share_render(self.status_text())
    }

    /// Makes `text` the render that reads without a handle (and opens past
    /// [`STATUS_HELD`]) get; returns its size (see [`Views::render_status`]).
    fn share_render(&self, mut text: Vec<u8>) -> u64 {
        let mut last = self.rendered.lock().expect("rendered lock");
        if text.len() == last.len() {
            text.push(b'\n');
        }
        let size = text.len() as u64;
        *last = Arc::new(text);
        size
    }

    /// The size of the last render of `.status` (rendering it if there was none).
    fn status_size(&self) -> u64 {
        let size = self.rendered.lock().expect("rendered lock").len();
        match size {
            0 => self.render_status(),
            size => size as u64,
        }
    }

    fn listed(&self, listing: &Listing, slot: usize) -> Result<Arc<Slot>, FsError> {
        listing
            .order
            .iter()
            .find(|s| s.index == slot)
            .cloned()
            .or_else(|| self.catalog.slot(slot))
            .ok_or(FsError::NotFound)
    }
}

impl Subtree for Views {
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        let listing = self.catalog.snapshot();
        let (ino, ttl) = match Inode::decode(parent).ok_or(FsError::NotFound)? {
            Inode::Root => (listing.root_child(name), LISTING_TTL),
            Inode::ByTime => (listing.by_time_child(name), LISTING_TTL),
            Inode::Commit => {
                let index = self.sealer.committed(name);
                (
                    index.map(|index| Inode::CommitLink { index }.encode()),
                    UNCACHED,
                )
            }
            _ => return Err(FsError::NotADirectory),
        };
        let ino = ino.ok_or(FsError::NotFound)?;
        let attr = match Inode::decode(ino) {
            // A checkpoint's own directory: its attributes for no longer than its name
            // (for no time before it is loaded, but on a shared mount: see
            // `Checkpoints::root_entry`).
            Some(Inode::Node { .. }) => {
                let found = self.checkpoints.getattr(ino)?;
                return Ok(Entry {
                    attr: found.attr,
                    ttl: found.ttl.min(ttl),
                    name_ttl: ttl,
                });
            }
            Some(Inode::Staging) => self.staging.attr_of(ino)?,
            // Rendered at each lookup, as if opened; its name and attributes are
            // never cached, so each path walk looks it up.
            Some(Inode::Status) => {
                self.render_status();
                return self.getattr(ino);
            }
            _ => self.getattr(ino)?.attr,
        };
        Ok(Entry::new(attr, ttl))
    }

    fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        let listing = self.catalog.snapshot();
        let changed = listing.changed_at;
        let (attr, ttl) = match Inode::decode(ino).ok_or(FsError::NotFound)? {
            Inode::Root => {
                let nlink = 2 + listing.order.len() as u32 + 3;
                (
                    self.attr(ino, FileKind::Directory, 4096, 0o755, nlink, changed),
                    LISTING_TTL,
                )
            }
            Inode::ByTime => (
                self.attr(ino, FileKind::Directory, 4096, 0o555, 2, changed),
                LISTING_TTL,
            ),
            // Shared like staging/ (sticky, writable by all the mount lets in): anyone
            // may seal a workspace of theirs; staging/'s sticky bit keeps them from
            // moving someone else's, and nothing but a seal can change commit/.
            Inode::Commit => (
                self.attr(ino, FileKind::Directory, 4096, 0o1777, 2, self.mounted_at),
                LISTING_TTL,
            ),
            Inode::Latest => {
                let newest = listing.newest().ok_or(FsError::NotFound)?;
                (self.link(ino, 64, newest.info.last_modified), LISTING_TTL)
            }
            Inode::Status => {
                let time = listing.listed_at.unwrap_or(self.mounted_at);
                let size = self.status_size();
                (
                    self.attr(ino, FileKind::File, size, 0o444, 1, time),
                    UNCACHED,
                )
            }
            Inode::ByTimeLink { slot } => {
                let slot = self.listed(&listing, slot)?;
                (
                    self.link(ino, 3 + 64, slot.info.last_modified),
                    IMMUTABLE_TTL,
                )
            }
            Inode::CommitLink { index } => {
                self.sealer.sealed(index).ok_or(FsError::NotFound)?;
                (self.link(ino, 3 + 64, self.mounted_at), UNCACHED)
            }
            _ => return Err(FsError::NotFound),
        };
        Ok(Entry::new(attr, ttl))
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let listing = self.catalog.snapshot();
        match Inode::decode(ino).ok_or(FsError::NotFound)? {
            Inode::CommitLink { index } => {
                let id = self.sealer.sealed(index).ok_or(FsError::NotFound)?;
                Ok(format!("../{id}").into_bytes())
            }
            Inode::Latest => {
                let newest = listing.newest().ok_or(FsError::NotFound)?;
                Ok(newest.info.id.as_str().as_bytes().to_vec())
            }
            Inode::ByTimeLink { slot } => {
                let slot = self.listed(&listing, slot)?;
                Ok(format!("../{}", slot.info.id).into_bytes())
            }
            _ => Err(FsError::NotASymlink),
        }
    }

    fn opendir(&self, ino: u64) -> Result<(), FsError> {
        match Inode::decode(ino) {
            Some(Inode::Root | Inode::ByTime | Inode::Commit) => Ok(()),
            Some(_) => Err(FsError::NotADirectory),
            None => Err(FsError::NotFound),
        }
    }

    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        let listing = self.catalog.snapshot();
        let commit;
        let entries: &[DirEntry] = match Inode::decode(ino).ok_or(FsError::NotFound)? {
            Inode::Root => &listing.root,
            Inode::ByTime => &listing.by_time,
            Inode::Commit => {
                let mut entries = dot_entries(ino, inode::ROOT).to_vec();
                for (index, name) in self.sealer.names() {
                    entries.push(DirEntry {
                        ino: Inode::CommitLink { index }.encode(),
                        kind: FileKind::Symlink,
                        name,
                        found: None,
                    });
                }
                commit = entries;
                &commit
            }
            _ => return Err(FsError::NotADirectory),
        };
        add_from(entries, offset, add);
        Ok(())
    }

    fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(self.refusal(ino));
        }
        if Inode::decode(ino) != Some(Inode::Status) {
            return Err(FsError::IsADirectory);
        }
        let fh = HANDLE_VIEW_BIT | self.next_fh.fetch_add(1, Ordering::Relaxed);
        let text = self.status_text();
        let mut texts = self.texts.lock().expect("texts lock");
        let fh = if texts.1 + text.len() > STATUS_HELD {
            drop(texts);
            if crate::fs::error::first_time("opens of .status at their bound") {
                tracing::warn!(
                    held = STATUS_HELD,
                    "the renders kept for open handles of .status are at their bound; further opens share one"
                );
            }
            self.share_render(text);
            SHARED_RENDER
        } else {
            texts.1 += text.len();
            texts.0.insert(fh, Arc::new(text));
            fh
        };
        // Its size is not known in advance: bypass the page cache.
        Ok(Opened {
            fh,
            backing: None,
            keep_cache: false,
            direct_io: true,
        })
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        if Inode::decode(ino) != Some(Inode::Status) {
            return Err(FsError::IsADirectory);
        }
        let text = if fh == NO_HANDLE || fh == SHARED_RENDER {
            Some(Arc::clone(&self.rendered.lock().expect("rendered lock")))
        } else {
            self.texts.lock().expect("texts lock").0.get(&fh).cloned()
        };
        let text = text.ok_or(FsError::BadHandle)?;
        let start = (offset as usize).min(text.len());
        let end = (start + size as usize).min(text.len());
        Ok(text[start..end].to_vec())
    }

    fn release(&self, fh: u64) {
        let mut texts = self.texts.lock().expect("texts lock");
        if let Some(text) = texts.0.remove(&fh) {
            texts.1 -= text.len();
        }
    }

    /// `commit/` only changes through seals; everything else here is read-only.
    fn refusal(&self, ino: u64) -> FsError {
        match Inode::decode(ino) {
            Some(Inode::Commit | Inode::CommitLink { .. }) => {
                FsError::CommitOnly("commit/ only takes `mv staging/NAME commit/`")
            }
            _ => FsError::ReadOnly,
        }
    }
}
