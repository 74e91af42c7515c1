//! `staging/`: a writable POSIX tree backed by a directory on local disk.
//!
//! Every inode the kernel knows is held as a name in its directory, and every
//! operation is a `*at()` call relative to a directory's `O_PATH` descriptor, the way
//! libfuse's passthrough filesystems work: renames, hard links and deletions are
//! handled by the backing filesystem. Directory descriptors are kept for the most
//! recently used [`DIR_FDS`] directories and opened again by name when needed, so a
//! writer cannot use up the daemon's descriptors by making directories. FUSE inode numbers are the
//! backing inode numbers with [`inode::STAGED_BIT`] set. Reads and writes come by inode,
//! since the kernel opens files without asking the daemon (see `files.rs`).
//!
//! While a workspace is being sealed, its inodes are *frozen*: any change to them, or
//! inside them, writes included, fails with `EBUSY`, so that the archive is a
//! consistent snapshot. The freeze is atomic with respect to every change: each
//! changing operation holds the read side of `gate` from its frozen check to the end
//! of its system call, and [`StagingTree::freeze`] holds the write side while it walks
//! the workspace and marks it, so no `mkdir`, `rename`, `link`, `create` or write can
//! slip in during the walk. Files open for writing do not hold a seal off (the daemon
//! does not see opens): what was written before the seal is sealed, and a write after
//! it finds the workspace gone (`ESTALE`).
//!
//! The tree is written by an untrusted party (the sandboxed agent, any uid with
//! `--allow-other`). Nothing here follows a symlink of the backing tree: names are
//! resolved with `O_NOFOLLOW` or `AT_SYMLINK_NOFOLLOW` in a directory's descriptor,
//! and a mode is never changed through a symlink (`EOPNOTSUPP`, as Linux does). The
//! backing directory is made 0700 and must belong to the daemon's user.
//!
//! New entries get exactly the mode the caller asked for (the kernel has already
//! applied the caller's umask; the daemon's own umask is undone with a `chmod`), and
//! the caller's uid and gid when the daemon runs as root (the gid of a set-group-ID
//! parent directory otherwise wins, as on a local disk). FIFOs and sockets may be
//! made; device files may not, since a device node in the backing directory would be
//! usable from the host whatever the mount's `nodev` says.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timespec};

mod changes;
mod files;
mod fork;
mod freeze;
mod inodes;

pub use fork::Forked;
pub use freeze::Frozen;
use inodes::{Known, Loc, Pin, Place, generation, parked_name};

use super::error::FsError;
use super::inode;
use super::subtree::{Attr, CopySource, DirEntry, Entry, FileKind, Opened, Subtree};
use crate::checkpoint::CheckpointId;

/// Staged entries change only through this mount, and the kernel drops what each
/// change makes stale (it learns the new attributes from the reply, and drops the
/// names a rename or an unlink replaced): names and attributes are cached for an hour,
/// so that a second pass over a workspace asks the daemon nothing.
pub const STAGED_TTL: Duration = Duration::from_secs(3600);

/// The graveyard, directly in the staging directory: where a parked file (see
/// `Place::Parked`) is kept, by a hard link named after its inode number, so that
/// its inode lives on, and its number is not given to a new file the kernel could
/// take for it. It is made empty at each start (the kernel knows nothing from an
/// earlier run), and `staging/` neither shows it nor lets anyone make, move or remove
/// an entry of that name.
const GRAVEYARD: &str = ".ckptfs-graveyard";

/// A time to set, as the kernel asks for it.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// What `setattr` may change.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub fh: Option<u64>,
}

/// The caller of an operation, whose ids new entries get.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling process (0 when it is in another PID namespace): where its
    /// supplementary groups are read when they matter (a FUSE request carries only
    /// the primary group).
    pub pid: u32,
}

/// Directory descriptors kept open at most: with the open files of `files.rs`, all the
/// descriptors staging holds, however many directories the kernel knows.
#[cfg(not(test))]
const DIR_FDS: usize = 1024;
/// A handful in unit tests, so that every test (the model test of `staging/` among
/// them) opens directories again by name all the time.
#[cfg(test)]
const DIR_FDS: usize = 3;

pub struct StagingTree {
    root_fd: Arc<OwnedFd>,
    root_ino: u64,
    known: Mutex<HashMap<u64, Known>>,
    /// Descriptors of known directories, the most recently used kept (see [`Known`]).
    dirs: Mutex<LruCache<u64, Arc<OwnedFd>>>,
    /// Directories removed (rmdir, a rename over them, a seal) while the kernel still
    /// knows them: their descriptors stay open until it forgets them, so that the
    /// backing filesystem cannot give their inode numbers to new directories that the
    /// kernel's old inode would reach. Each stands for a reference someone holds (a
    /// working directory, an open descriptor), as a parked file does.
    pinned: Mutex<HashMap<u64, Arc<OwnedFd>>>,
    /// [`GRAVEYARD`], where parked files are kept.
    graveyard: Arc<OwnedFd>,
    /// Files opened for reads and writes, which come by inode (see `files.rs`).
    files: files::OpenFiles,
    /// Held for reading by every change from its frozen check to its end, and for
    /// writing by a freeze: see the module comment.
    gate: RwLock<()>,
    frozen: Mutex<HashSet<u64>>,
    /// The checkpoint each staged file had bytes copied from (`copy_file_range`),
    /// while the kernel knows the file: what a seal records as the workspace's parent.
    copied_from: Mutex<HashMap<u64, CheckpointId>>,
    /// The checkpoint each forked workspace was made from, by its directory's FUSE
    /// inode, with that directory's generation (see `fork.rs`).
    forked: Mutex<HashMap<u64, (u32, CheckpointId)>>,
    /// Whether new entries can be given to their caller (the daemon runs as root).
    can_chown: bool,
}

fn file_kind(kind: rfs::FileType) -> FileKind {
    match kind {
        rfs::FileType::Directory => FileKind::Directory,
        rfs::FileType::Symlink => FileKind::Symlink,
        rfs::FileType::Fifo => FileKind::Fifo,
        rfs::FileType::Socket => FileKind::Socket,
        rfs::FileType::CharacterDevice => FileKind::CharDevice,
        rfs::FileType::BlockDevice => FileKind::BlockDevice,
        _ => FileKind::File,
    }
}

/// Opens `name` for a client without blocking (a FIFO or a device swapped in for a
/// file would otherwise hang the daemon's thread), and only a regular file or a
/// directory. Blocking mode is restored unless it was asked for.
fn open_checked(dir: impl AsFd, name: &OsStr, flags: OFlags) -> Result<OwnedFd, FsError> {
    let fd = rfs::openat(dir, name, flags | OFlags::NONBLOCK, Mode::empty()).map_err(os)?;
    match rfs::FileType::from_raw_mode(rfs::fstat(&fd).map_err(os)?.st_mode) {
        rfs::FileType::RegularFile | rfs::FileType::Directory => {}
        _ => return Err(FsError::InvalidArgument),
    }
    if !flags.contains(OFlags::NONBLOCK) {
        let status = rfs::fcntl_getfl(&fd).map_err(os)?;
        rfs::fcntl_setfl(&fd, status - OFlags::NONBLOCK).map_err(os)?;
    }
    Ok(fd)
}

fn os(e: rustix::io::Errno) -> FsError {
    FsError::Os(std::io::Error::from(e))
}

fn timespec(t: SetTime) -> Timespec {
    match t {
        SetTime::Now => Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_NOW,
        },
        SetTime::At(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
            Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as _,
            }
        }
    }
}

fn time_of(secs: i64, nanos: impl TryInto<u32>) -> SystemTime {
    let nanos = Duration::from_nanos(nanos.try_into().unwrap_or(0).into());
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

const OMIT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: rfs::UTIME_OMIT,
};

impl StagingTree {
    /// Opens (creating if needed) the backing directory, and makes it private: it
    /// must belong to the daemon's user, and becomes mode 0700, so that no other user
    /// of the host can change a workspace behind a seal's back.
    pub fn at(root: &Path) -> Result<Self, FsError> {
        // Out of other users' reach, or another directory could be served here.
        let root = &crate::trusted::trusted_dir(root).map_err(|e| {
            FsError::Os(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                e.to_string(),
            ))
        })?;
        let dir = rfs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        // `trusted_dir` found it ours and made it 0700.
        let stat = rfs::fstat(&dir).map_err(os)?;
        let root_fd = rfs::openat(
            &dir,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let root_ino = stat.st_ino;
        match crate::beneath::remove_at(&dir, OsStr::new(GRAVEYARD)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(FsError::Os(e)),
            _ => {}
        }
        rfs::mkdirat(&dir, GRAVEYARD, Mode::from_raw_mode(0o700)).map_err(os)?;
        let graveyard = rfs::openat(
            &dir,
            GRAVEYARD,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        Ok(StagingTree {
            root_fd: Arc::new(root_fd),
            root_ino,
            known: Mutex::new(HashMap::new()),
            dirs: Mutex::new(LruCache::new(NonZeroUsize::new(DIR_FDS).expect("non-zero"))),
            pinned: Mutex::new(HashMap::new()),
            graveyard: Arc::new(graveyard),
            files: files::OpenFiles::default(),
            gate: RwLock::new(()),
            frozen: Mutex::new(HashSet::new()),
            copied_from: Mutex::new(HashMap::new()),
            forked: Mutex::new(HashMap::new()),
            can_chown: rustix::process::geteuid().is_root(),
        })
    }

    fn stat(&self, loc: &Loc) -> Result<rfs::Stat, FsError> {
        match loc {
            Loc::Dir(fd) => rfs::fstat(&**fd),
            Loc::At(dir, name) => {
                rfs::statat(&**dir, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            }
        }
        .map_err(os)
    }

    fn attr(&self, stat: &rfs::Stat) -> Attr {
        let kind = file_kind(rfs::FileType::from_raw_mode(stat.st_mode));
        let ino = self.fuse_ino(stat.st_ino);
        // `staging/` itself shows as a shared, sticky directory (like /tmp): anyone
        // the mount lets in makes workspaces there, and only their owner can remove
        // or rename them. Its backing directory stays the daemon's, 0700.
        let perm = if ino == inode::STAGING {
            0o1777
        } else {
            (stat.st_mode & 0o7777) as u16
        };
        Attr {
            ino,
            generation: 0,
            kind,
            size: stat.st_size as u64,
            perm,
            nlink: stat.st_nlink as u32,
            uid: stat.st_uid,
            gid: stat.st_gid,
            atime: time_of(stat.st_atime, stat.st_atime_nsec),
            mtime: time_of(stat.st_mtime, stat.st_mtime_nsec),
            ctime: time_of(stat.st_ctime, stat.st_ctime_nsec),
        }
    }

    /// Enters a change: the freeze cannot start until the returned guard is dropped.
    fn changing(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().expect("staging gate")
    }

    fn check_not_frozen(&self, ino: u64) -> Result<(), FsError> {
        if self.frozen.lock().expect("frozen lock").contains(&ino) {
            return Err(FsError::Busy);
        }
        Ok(())
    }

    /// Refuses changes to `parent/name` or to `parent` while either is being sealed;
    /// returns `parent`'s descriptor and what `name` is in it now, if anything.
    fn child_not_frozen(
        &self,
        parent: u64,
        name: &[u8],
    ) -> Result<(Arc<OwnedFd>, Option<rfs::Stat>), FsError> {
        self.not_graveyard(parent, name)?;
        self.check_not_frozen(parent)?;
        let fd = self.fd(parent)?;
        let stat = rfs::statat(&*fd, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW).ok();
        if let Some(stat) = &stat {
            self.check_not_frozen(self.fuse_ino(stat.st_ino))?;
        }
        Ok((fd, stat))
    }

    /// Registers one more kernel reference to `parent/name` and returns its attributes,
    /// with its generation (see [`generation`]).
    fn lookup_attr(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        if self.not_graveyard(parent, name).is_err() {
            return Err(FsError::NotFound);
        }
        let parent_fd = self.fd(parent)?;
        // Opened without following a symlink (and not for I/O), so that the attributes
        // and the generation are of one inode, even if the name just changed.
        let fd = rfs::openat(
            &*parent_fd,
            OsStr::from_bytes(name),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let stat = rfs::fstat(&fd).map_err(os)?;
        let attr = Attr {
            generation: generation(&fd, &stat),
            ..self.attr(&stat)
        };
        let is_dir = rfs::FileType::from_raw_mode(stat.st_mode) == rfs::FileType::Directory;
        if attr.ino != inode::STAGING {
            self.remember(attr.ino, parent, name, is_dir.then_some(fd));
        }
        Ok(attr)
    }

    pub fn attr_of(&self, ino: u64) -> Result<Attr, FsError> {
        let loc = self.loc(ino)?;
        let mut attr = self.attr(&self.stat(&loc)?);
        if attr.ino != ino {
            return Err(FsError::Stale);
        }
        if self.is_parked(&loc) {
            // The graveyard's link is not one of the file's names.
            attr.nlink = attr.nlink.saturating_sub(1);
        }
        Ok(attr)
    }

    /// Refuses a change that names the graveyard directly in `staging/`: it is not
    /// there for anyone but the daemon (see [`GRAVEYARD`]).
    fn not_graveyard(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        if parent == inode::STAGING && name == GRAVEYARD.as_bytes() {
            return Err(FsError::NotPermitted("a name reserved by ckptfs"));
        }
        Ok(())
    }

    /// The entry for `attr`, found or made in directory `parent`: names and
    /// attributes are cached ([`STAGED_TTL`]), but for the top-level names of
    /// `staging/`, which are never cached (a seal turns `commit/NAME` from a directory
    /// into a symlink under the kernel's feet). Their attributes are: the kernel then
    /// checks the name again on each path walk through it, but not the attributes too.
    pub fn entry_in(&self, parent: u64, attr: Attr) -> Entry {
        Entry {
            attr,
            ttl: STAGED_TTL,
            name_ttl: self.negative_ttl(parent),
        }
    }

    /// How long the kernel may keep the names of directory `parent`, also the absence
    /// of one (see [`Self::entry_in`]).
    pub fn negative_ttl(&self, parent: u64) -> Duration {
        if parent == inode::STAGING {
            Duration::ZERO
        } else {
            STAGED_TTL
        }
    }

    /// Lists directory `ino` from `offset`. The offsets given to the kernel are the
    /// backing directory's own positions (its `telldir` cookies), so each request
    /// reads on from where the last stopped and nothing is kept between requests: the
    /// directories a writer makes, however many or large, and listings left half read,
    /// cost the daemon no memory. (The kernel opens directories without asking the
    /// daemon, see `fuse.rs`, so there is no handle to keep a listing with.)
    fn list(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        let fd = self.fd(ino)?;
        let dir_fd = rfs::openat(
            &*fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let mut dir = rfs::Dir::new(dir_fd).map_err(os)?;
        if offset != 0 {
            // The cookie is the kernel's own, passed back bit for bit.
            dir.seek(offset as i64).map_err(os)?;
        }
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(os)?;
            let name = entry.file_name().to_bytes();
            let entry_ino = match name {
                b"." => ino,
                b".." if ino == inode::STAGING => inode::ROOT,
                _ if ino == inode::STAGING && name == GRAVEYARD.as_bytes() => continue,
                _ => self.fuse_ino(entry.ino()),
            };
            let listed = DirEntry {
                ino: entry_ino,
                kind: file_kind(entry.file_type()),
                name: name.to_vec(),
                found: None,
            };
            if add(&listed, entry.offset() as u64) {
                break;
            }
        }
        Ok(())
    }

    pub fn statfs(&self) -> Result<rfs::StatVfs, FsError> {
        rfs::fstatvfs(&*self.root_fd).map_err(os)
    }

    /// Refuses, before a seal starts, a name of `staging/` that is not a directory:
    /// only workspaces can be sealed. The seal itself opens the directory again (no
    /// symlink followed), so a swap after this check only fails the seal. Returns the
    /// workspace's owner, who seals it (only they may move it, `staging/` being sticky).
    pub fn check_sealable(&self, name: &[u8]) -> Result<u32, FsError> {
        if self.not_graveyard(inode::STAGING, name).is_err() {
            return Err(FsError::NotFound);
        }
        let stat = rfs::statat(
            &*self.root_fd,
            OsStr::from_bytes(name),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(os)?;
        if rfs::FileType::from_raw_mode(stat.st_mode) != rfs::FileType::Directory {
            return Err(FsError::CommitOnly(NOT_SEALABLE));
        }
        Ok(stat.st_uid)
    }
}

/// Why a file, symlink or other non-directory cannot go into `commit/`.
pub(crate) const NOT_SEALABLE: &str =
    "only a directory of staging/ can be moved into commit/ (sealed as a checkpoint)";

impl Subtree for StagingTree {
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, FsError> {
        Ok(self.entry_in(parent, self.lookup_attr(parent, name)?))
    }

    fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        Ok(Entry::new(self.attr_of(ino)?, STAGED_TTL))
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        match self.loc(ino)? {
            Loc::At(dir, name) => Ok(rfs::readlinkat(&*dir, OsStr::from_bytes(&name), Vec::new())
                .map_err(os)?
                .into_bytes()),
            _ => Err(FsError::InvalidArgument),
        }
    }

    fn opendir(&self, ino: u64) -> Result<(), FsError> {
        self.fd(ino).map(drop)
    }

    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        self.list(ino, offset, add)
    }

    /// Asked only where the kernel sends opens (see `fuse.rs`): reads and writes come
    /// by inode either way, so the handle is only a mark of staging's.
    fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError> {
        // Holds the gate so that the frozen check stands while the file is opened.
        let _changing = self.changing();
        self.check_open(ino, flags)?;
        Ok(Opened {
            fh: inode::STAGED_BIT,
            backing: None,
            keep_cache: true,
            direct_io: false,
        })
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.read_file(ino, offset, size)
    }

    fn copy_source(&self, ino: u64, _fh: u64) -> Result<CopySource, FsError> {
        self.copy_source_of(ino)
    }

    fn release(&self, _fh: u64) {}

    /// Staging takes changes: the router asks the other side of a move that leaves
    /// it. Should it ever ask staging, a move across the mount's subtrees is refused
    /// as one across filesystems.
    fn refusal(&self, _ino: u64) -> FsError {
        FsError::Os(std::io::Error::from_raw_os_error(libc::EXDEV))
    }
}
