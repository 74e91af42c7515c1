//! The vocabulary the router and its subtrees share: attributes, entries, what an
//! open gives the adapter, and the [`Subtree`] trait each subtree implements. No
//! FUSE types: the adapter converts these, and tests call the subtrees with them.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::error::FsError;

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
    /// Tells apart files that had the same inode number at different times: 0 but in
    /// `staging/`, where the backing filesystem reuses the numbers of deleted files
    /// (see [`super::StagingTree`]). Given with each new entry, never with `getattr`.
    pub generation: u32,
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

/// An inode's attributes and how long the kernel may keep them, and the name that
/// led to it (for a lookup or a create).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub attr: Attr,
    /// How long the kernel may keep the attributes.
    pub ttl: Duration,
    /// How long it may keep the name: shorter than `ttl` where a name can change
    /// under the kernel's feet.
    pub name_ttl: Duration,
}

impl Entry {
    /// Attributes and name kept alike for `ttl`.
    pub fn new(attr: Attr, ttl: Duration) -> Entry {
        Entry {
            attr,
            ttl,
            name_ttl: ttl,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
    /// The entry as a lookup of its name would give it, where the listing has it at
    /// hand (a checkpoint's, which never changes): `readdirplus` then makes no lookup
    /// of its own, which took two thirds of its time on 100,000 files. Boxed: the
    /// root's listings keep a `DirEntry` per checkpoint, without one.
    pub found: Option<Box<Entry>>,
}

/// The handle of reads of files that were not opened through the daemon (see
/// [`super::CheckpointFs::open_is_free`]); no open ever returns it.
pub const NO_HANDLE: u64 = 0;

/// What the core may ask of the kernel's caches, outside of replies: implemented by
/// the FUSE adapter over its session, absent in tests without a kernel. Failures
/// only cost speed, and are not reported.
pub trait KernelCache: Send + Sync {
    /// Puts `data` in the page cache of file `ino` from offset 0, as if it had been
    /// read. Fails with `ENOENT` if the kernel does not know `ino`.
    fn store(&self, ino: u64, data: &[u8]) -> std::io::Result<()>;
    /// Drops the kernel's entry for `parent/name`.
    fn forget_entry(&self, parent: u64, name: &[u8]);
    /// Drops the kernel's attributes of `ino`, and its cached listing or pages.
    fn forget_attributes(&self, ino: u64);
}

/// What the adapter needs to answer an `open`.
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    /// A file holding exactly the contents, for the kernel to read directly
    /// (FUSE passthrough) when it can.
    pub backing: Option<File>,
    /// The contents never change: the kernel may keep its page cache across opens.
    pub keep_cache: bool,
    /// The size is not known in advance (`.status`): bypass the page cache.
    pub direct_io: bool,
}

/// An open file's contents as bytes `start..start + size` of `file`.
pub struct CopySource {
    /// A descriptor of its own (`dup`), valid after the handle is released or its
    /// checkpoint evicted.
    pub file: std::fs::File,
    pub start: u64,
    pub size: u64,
    /// The checkpoint the bytes belong to, if any: a workspace is being started
    /// from it.
    pub from: Option<Arc<crate::cache::VerifiedCheckpoint>>,
}

/// What each subtree answers. Changes are not part of it: only `staging/` takes
/// them, and the others say why not with [`Subtree::refusal`].
pub trait Subtree: Send + Sync {
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError>;
    fn getattr(&self, ino: u64) -> Result<Entry, FsError>;
    fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError>;
    /// Checks that directory `ino` can be listed.
    fn opendir(&self, ino: u64) -> Result<(), FsError>;
    /// Calls `add(entry, next_offset)` for the entries from `offset` on, until it
    /// returns true (the reply buffer is full).
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError>;
    /// Opens a file with `open(2)` flags (asked only when the kernel sends opens).
    fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError>;
    /// Reads file `ino`, through open handle `fh`, or [`NO_HANDLE`] for a file the
    /// kernel opened by itself.
    fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError>;
    /// The bytes of file `ino` (open as `fh`, or [`NO_HANDLE`]) as a range of a file
    /// on disk, so that the kernel can copy them itself (`copy_file_range`).
    /// `ENOTSUP` where there is no such file: the kernel then copies through `read`
    /// and `write`.
    fn copy_source(&self, _ino: u64, _fh: u64) -> Result<CopySource, FsError> {
        Err(FsError::NotSupported("copy_file_range"))
    }
    fn release(&self, fh: u64);
    /// Why `ino`, or an entry in it, cannot be changed.
    fn refusal(&self, ino: u64) -> FsError;
}

/// A directory's `.` and `..`.
pub fn dot_entries(ino: u64, parent: u64) -> [DirEntry; 2] {
    let dir = |ino, name: &[u8]| DirEntry {
        ino,
        kind: FileKind::Directory,
        name: name.to_vec(),
        found: None,
    };
    [dir(ino, b"."), dir(parent, b"..")]
}

/// Hands `entries` from `offset` on to `add` (see [`Subtree::readdir`]), each with the
/// offset of the entry after it, until `add` says the reply is full; says whether it
/// was.
pub fn add_from(
    entries: &[DirEntry],
    offset: u64,
    add: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> bool {
    let from = usize::try_from(offset).unwrap_or(usize::MAX);
    for (i, entry) in entries.iter().enumerate().skip(from) {
        if add(entry, i as u64 + 1) {
            return true;
        }
    }
    false
}
