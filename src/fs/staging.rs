//! `staging/`: a writable POSIX tree backed by a directory on local disk.
//!
//! Every inode the kernel knows is held as an `O_PATH` descriptor of the backing file,
//! and every operation is a `*at()` call relative to such descriptors, the way
//! libfuse's passthrough filesystems work: renames, hard links and deletions are
//! handled by the backing filesystem, and no path bookkeeping can go stale. FUSE
//! inode numbers are the backing inode numbers with [`STAGING_BIT`] set.
//!
//! While a workspace is being sealed, its inodes are *frozen*: any change to them, or
//! inside them, fails with `EBUSY`, so that the archive is a consistent snapshot. A
//! seal only starts when none of them is open for writing. The freeze is atomic with
//! respect to every change: each changing operation holds the read side of `gate`
//! from its frozen check to the end of its system call, and [`StagingTree::freeze`]
//! holds the write side while it walks the workspace and marks it, so no `mkdir`,
//! `rename`, `link` or `create` can slip a new inode in during the walk.
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
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timespec, Timestamps};

use super::inode;
use super::{Attr, DirEntry, FileKind, FsError};
use crate::beneath;

/// Set in every FUSE inode number and file handle that belongs to staging.
pub const STAGING_BIT: u64 = inode::STAGED_BIT;

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
}

/// An inode the kernel knows, with how to reach it. Directories keep an `O_PATH`
/// descriptor: they are few, and everything below them is reached through them.
/// Other files are reached by name in their directory, so that a workspace of any
/// size needs one descriptor per directory, not per file.
struct Known {
    lookups: u64,
    place: Place,
}

enum Place {
    Dir(Arc<OwnedFd>),
    /// The names (directory inode, name) the file is known by; kept up to date by
    /// rename, link and unlink, which all go through this tree. Empty once every
    /// name was unlinked: the file is then reachable only through an open handle.
    Links(Vec<(u64, Vec<u8>)>),
}

/// How a system call reaches an inode.
enum Loc {
    /// A directory's own descriptor.
    Dir(Arc<OwnedFd>),
    /// A name in a directory.
    At(Arc<OwnedFd>, Vec<u8>),
    /// An unlinked file, through one of its open handles.
    Open(Arc<Handle>),
}

/// An open file.
struct Handle {
    file: File,
    ino: u64,
    writable: bool,
}

pub struct StagingTree {
    root_fd: Arc<OwnedFd>,
    root_ino: u64,
    known: Mutex<HashMap<u64, Known>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Directory listings being read, by directory.
    listings: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    /// Held for reading by every change from its frozen check to its end, and for
    /// writing by a freeze: see the module comment.
    gate: RwLock<()>,
    frozen: Mutex<HashSet<u64>>,
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

fn os(e: rustix::io::Errno) -> FsError {
    FsError::Os(std::io::Error::from(e))
}

fn proc_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
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

/// A workspace frozen for sealing: its directory, opened when it was frozen, and
/// every inode in it.
pub struct Frozen {
    pub name: Vec<u8>,
    pub dir: OwnedFd,
    inodes: Vec<u64>,
}

impl StagingTree {
    /// Opens (creating if needed) the backing directory, and makes it private: it
    /// must belong to the daemon's user, and becomes mode 0700, so that no other user
    /// of the host can change a workspace behind a seal's back.
    pub fn at(root: &Path) -> Result<Self, FsError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(FsError::Os)?;
        let dir = rfs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let stat = rfs::fstat(&dir).map_err(os)?;
        if stat.st_uid != rustix::process::geteuid().as_raw() {
            return Err(FsError::Os(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to uid {}, not to the daemon's user; staged workspaces must be private",
                    root.display(),
                    stat.st_uid
                ),
            )));
        }
        rfs::fchmod(&dir, Mode::from_raw_mode(0o700)).map_err(os)?;
        let root_fd = rfs::openat(
            &dir,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let root_ino = stat.st_ino;
        Ok(StagingTree {
            root_fd: Arc::new(root_fd),
            root_ino,
            known: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            gate: RwLock::new(()),
            frozen: Mutex::new(HashSet::new()),
            can_chown: rustix::process::geteuid().is_root(),
        })
    }

    pub fn owns_inode(ino: u64) -> bool {
        ino == inode::STAGING || ino & STAGING_BIT != 0
    }

    pub fn owns_handle(fh: u64) -> bool {
        fh & STAGING_BIT != 0
    }

    fn fuse_ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            inode::STAGING
        } else {
            STAGING_BIT | backing_ino
        }
    }

    /// The descriptor of directory `ino`.
    fn fd(&self, ino: u64) -> Result<Arc<OwnedFd>, FsError> {
        if ino == inode::STAGING {
            return Ok(Arc::clone(&self.root_fd));
        }
        match self.known.lock().expect("staging lock").get(&ino) {
            Some(Known {
                place: Place::Dir(fd),
                ..
            }) => Ok(Arc::clone(fd)),
            Some(_) => Err(FsError::NotADirectory),
            None => Err(FsError::Stale),
        }
    }

    fn loc(&self, ino: u64) -> Result<Loc, FsError> {
        if ino == inode::STAGING {
            return Ok(Loc::Dir(Arc::clone(&self.root_fd)));
        }
        let link = match self.known.lock().expect("staging lock").get(&ino) {
            Some(Known {
                place: Place::Dir(fd),
                ..
            }) => return Ok(Loc::Dir(Arc::clone(fd))),
            Some(Known {
                place: Place::Links(links),
                ..
            }) => links.first().cloned(),
            None => return Err(FsError::Stale),
        };
        if let Some((parent, name)) = link {
            return Ok(Loc::At(self.fd(parent)?, name));
        }
        let handles = self.handles.lock().expect("handles lock");
        handles
            .values()
            .find(|h| matches!(***h, Handle { ino: i, .. } if i == ino))
            .map(|h| Loc::Open(Arc::clone(h)))
            .ok_or(FsError::Stale)
    }

    fn stat(&self, loc: &Loc) -> Result<rfs::Stat, FsError> {
        match loc {
            Loc::Dir(fd) => rfs::fstat(&**fd),
            Loc::At(dir, name) => {
                rfs::statat(&**dir, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            }
            Loc::Open(handle) => rfs::fstat(&handle.file),
        }
        .map_err(os)
    }

    /// Records one more kernel reference to `ino`, reached as `parent/name`; a
    /// directory comes with its descriptor.
    fn remember(&self, ino: u64, parent: u64, name: &[u8], dir_fd: Option<OwnedFd>) {
        let mut known = self.known.lock().expect("staging lock");
        let entry = known.entry(ino).or_insert_with(|| Known {
            lookups: 0,
            place: Place::Links(Vec::new()),
        });
        entry.lookups += 1;
        match dir_fd {
            Some(fd) => {
                if !matches!(entry.place, Place::Dir(_)) {
                    entry.place = Place::Dir(Arc::new(fd));
                }
            }
            None => {
                if matches!(entry.place, Place::Dir(_)) {
                    // The backing inode number now belongs to another kind of file.
                    entry.place = Place::Links(Vec::new());
                }
                if let Place::Links(links) = &mut entry.place
                    && !links.iter().any(|(p, n)| *p == parent && n == name)
                {
                    links.push((parent, name.to_vec()));
                }
            }
        }
    }

    /// Keeps the names of known files right after `parent/name` changed.
    fn renamed(&self, ino: u64, from: (u64, &[u8]), to: Option<(u64, &[u8])>) {
        let mut known = self.known.lock().expect("staging lock");
        if let Some(Known {
            place: Place::Links(links),
            ..
        }) = known.get_mut(&ino)
        {
            links.retain(|(p, n)| !(*p == from.0 && n == from.1));
            if let Some((parent, name)) = to {
                links.push((parent, name.to_vec()));
            }
        }
    }

    /// The FUSE inode number of `parent/name`, if it exists.
    fn child_ino(&self, parent: &OwnedFd, name: &[u8]) -> Option<u64> {
        rfs::statat(parent, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|stat| self.fuse_ino(stat.st_ino))
    }

    fn attr(&self, stat: &rfs::Stat) -> Attr {
        let kind = file_kind(rfs::FileType::from_raw_mode(stat.st_mode));
        Attr {
            ino: self.fuse_ino(stat.st_ino),
            kind,
            size: stat.st_size as u64,
            perm: (stat.st_mode & 0o7777) as u16,
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

    /// Refuses changes to `parent/name` or to `parent` while either is being sealed.
    fn check_child_not_frozen(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.check_not_frozen(parent)?;
        let fd = self.fd(parent)?;
        if let Ok(stat) = rfs::statat(&*fd, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW) {
            self.check_not_frozen(self.fuse_ino(stat.st_ino))?;
        }
        Ok(())
    }

    /// Registers one more kernel reference to `parent/name` and returns its attributes.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let parent_fd = self.fd(parent)?;
        let os_name = OsStr::from_bytes(name);
        let mut stat = rfs::statat(&*parent_fd, os_name, AtFlags::SYMLINK_NOFOLLOW).map_err(os)?;
        let mut dir_fd = None;
        if rfs::FileType::from_raw_mode(stat.st_mode) == rfs::FileType::Directory {
            let fd = rfs::openat(
                &*parent_fd,
                os_name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(os)?;
            // What was opened is what is described, even if the name just changed.
            stat = rfs::fstat(&fd).map_err(os)?;
            dir_fd = Some(fd);
        }
        let attr = self.attr(&stat);
        if attr.ino != inode::STAGING {
            self.remember(attr.ino, parent, name, dir_fd);
        }
        Ok(attr)
    }

    /// The kernel dropped `count` references to `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        let mut known = self.known.lock().expect("staging lock");
        if let Some(k) = known.get_mut(&ino) {
            k.lookups = k.lookups.saturating_sub(count);
            if k.lookups == 0 {
                known.remove(&ino);
            }
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        let attr = self.attr(&self.stat(&self.loc(ino)?)?);
        if attr.ino != ino {
            return Err(FsError::Stale);
        }
        Ok(attr)
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Attr, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(ino)?;
        let loc = self.loc(ino)?;
        let open_file = |handle: &Arc<Handle>| handle.file.try_clone().map_err(FsError::Os);
        if let Some(mode) = set.mode {
            // On the entry itself: a symlink's own mode cannot change (EOPNOTSUPP),
            // and what it points to is never touched.
            let mode = mode & 0o7777;
            match &loc {
                Loc::Dir(fd) => beneath::chmod_opened(&**fd, mode),
                Loc::At(dir, name) => beneath::chmod_at(&**dir, OsStr::from_bytes(name), mode),
                Loc::Open(handle) => rfs::fchmod(&handle.file, Mode::from_raw_mode(mode))
                    .map_err(std::io::Error::from),
            }
            .map_err(FsError::Os)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.map(rustix::process::Uid::from_raw);
            let gid = set.gid.map(rustix::process::Gid::from_raw);
            match &loc {
                Loc::Dir(fd) => rfs::chownat(
                    &**fd,
                    "",
                    uid,
                    gid,
                    AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
                ),
                Loc::At(dir, name) => rfs::chownat(
                    &**dir,
                    OsStr::from_bytes(name),
                    uid,
                    gid,
                    AtFlags::SYMLINK_NOFOLLOW,
                ),
                Loc::Open(handle) => rfs::fchown(open_file(handle)?, uid, gid),
            }
            .map_err(os)?;
        }
        if let Some(size) = set.size {
            let file = match (set.fh.and_then(|fh| self.handle(fh)), &loc) {
                (Some(handle), _) => open_file(&handle)?,
                (None, Loc::Open(handle)) => open_file(handle)?,
                (None, Loc::At(dir, name)) => rfs::openat(
                    &**dir,
                    OsStr::from_bytes(name),
                    OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(os)?
                .into(),
                (None, Loc::Dir(_)) => return Err(FsError::IsADirectory),
            };
            file.set_len(size).map_err(FsError::Os)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = Timestamps {
                last_access: set.atime.map_or(OMIT, timespec),
                last_modification: set.mtime.map_or(OMIT, timespec),
            };
            match &loc {
                Loc::Dir(fd) => rfs::utimensat(
                    &**fd,
                    "",
                    &times,
                    AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
                ),
                Loc::At(dir, name) => rfs::utimensat(
                    &**dir,
                    OsStr::from_bytes(name),
                    &times,
                    AtFlags::SYMLINK_NOFOLLOW,
                ),
                Loc::Open(handle) => rfs::futimens(open_file(handle)?, &times),
            }
            .map_err(os)?;
        }
        self.getattr(ino)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        match self.loc(ino)? {
            Loc::At(dir, name) => Ok(rfs::readlinkat(&*dir, OsStr::from_bytes(&name), Vec::new())
                .map_err(os)?
                .into_bytes()),
            _ => Err(FsError::InvalidArgument),
        }
    }

    /// Gives a new entry its caller's ids (when the daemon may) and exactly the mode
    /// asked for, acting on the descriptor `entry` of what was created (`None` for a
    /// symlink, which is changed by name without following it). The gid stays the
    /// parent's when the parent is set-group-ID, and a directory keeps the set-group-ID
    /// bit it inherited, as a local filesystem does.
    fn give_to(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        entry: Option<&OwnedFd>,
        mode: Option<u32>,
        caller: Caller,
    ) -> Result<(), FsError> {
        let parent_sgid = rfs::fstat(parent).map_err(os)?.st_mode & libc::S_ISGID != 0;
        if self.can_chown {
            let uid = Some(rustix::process::Uid::from_raw(caller.uid));
            let gid = (!parent_sgid).then(|| rustix::process::Gid::from_raw(caller.gid));
            match entry {
                // AT_EMPTY_PATH: the descriptor may be O_PATH, which fchown refuses.
                Some(fd) => rfs::chownat(
                    fd,
                    "",
                    uid,
                    gid,
                    AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
                ),
                None => rfs::chownat(parent, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW),
            }
            .map_err(os)?;
        }
        if let (Some(fd), Some(mode)) = (entry, mode) {
            let stat = rfs::fstat(fd).map_err(os)?;
            let is_dir = rfs::FileType::from_raw_mode(stat.st_mode) == rfs::FileType::Directory;
            let inherited = if is_dir {
                stat.st_mode & libc::S_ISGID
            } else {
                0
            };
            let wanted = (mode & 0o7777) | inherited;
            if stat.st_mode & 0o7777 != wanted {
                beneath::chmod_opened(fd, wanted).map_err(FsError::Os)?;
            }
        }
        Ok(())
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(parent)?;
        let parent_fd = self.fd(parent)?;
        let os_name = OsStr::from_bytes(name);
        rfs::mkdirat(&*parent_fd, os_name, Mode::from_raw_mode(mode & 0o7777)).map_err(os)?;
        let dir = rfs::openat(
            &*parent_fd,
            os_name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        self.give_to(&parent_fd, os_name, Some(&dir), Some(mode), caller)?;
        self.lookup(parent, name)
    }

    /// Makes a FIFO or a socket; device files are refused (see the module comment),
    /// but for the whiteout (a character device numbered 0:0, which no driver
    /// answers), which Linux lets any user make.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let kind = rfs::FileType::from_raw_mode(mode);
        let allowed = match kind {
            rfs::FileType::Fifo | rfs::FileType::Socket => true,
            rfs::FileType::CharacterDevice => rdev == 0,
            _ => false,
        };
        if !allowed {
            return Err(FsError::NotPermitted(
                "device files cannot be made in staging/",
            ));
        }
        let _changing = self.changing();
        self.check_not_frozen(parent)?;
        let parent_fd = self.fd(parent)?;
        let os_name = OsStr::from_bytes(name);
        rfs::mknodat(
            &*parent_fd,
            os_name,
            kind,
            Mode::from_raw_mode(mode & 0o7777),
            rdev,
        )
        .map_err(os)?;
        let node = rfs::openat(
            &*parent_fd,
            os_name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        self.give_to(&parent_fd, os_name, Some(&node), Some(mode), caller)?;
        self.lookup(parent, name)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(parent)?;
        let parent_fd = self.fd(parent)?;
        let os_name = OsStr::from_bytes(name);
        rfs::symlinkat(OsStr::from_bytes(target), &*parent_fd, os_name).map_err(os)?;
        self.give_to(&parent_fd, os_name, None, None, caller)?;
        self.lookup(parent, name)
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(ino)?;
        self.check_not_frozen(new_parent)?;
        let parent_fd = self.fd(new_parent)?;
        let new_name_os = OsStr::from_bytes(new_name);
        match self.loc(ino)? {
            Loc::At(dir, name) => rfs::linkat(
                &*dir,
                OsStr::from_bytes(&name),
                &*parent_fd,
                new_name_os,
                AtFlags::empty(),
            ),
            Loc::Dir(_) => return Err(FsError::NotPermitted("hard links to directories")),
            Loc::Open(_) => return Err(FsError::Stale),
        }
        .map_err(os)?;
        self.lookup(new_parent, new_name)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        let _changing = self.changing();
        self.check_child_not_frozen(parent, name)?;
        let fd = self.fd(parent)?;
        let victim = self.child_ino(&fd, name);
        rfs::unlinkat(&*fd, OsStr::from_bytes(name), AtFlags::empty()).map_err(os)?;
        if let Some(victim) = victim {
            self.renamed(victim, (parent, name), None);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        let _changing = self.changing();
        self.check_child_not_frozen(parent, name)?;
        let fd = self.fd(parent)?;
        rfs::unlinkat(&*fd, OsStr::from_bytes(name), AtFlags::REMOVEDIR).map_err(os)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        let _changing = self.changing();
        self.check_child_not_frozen(parent, name)?;
        self.check_child_not_frozen(new_parent, new_name)?;
        let from = self.fd(parent)?;
        let to = self.fd(new_parent)?;
        let moved = self.child_ino(&from, name);
        let replaced = self.child_ino(&to, new_name);
        rfs::renameat_with(
            &*from,
            OsStr::from_bytes(name),
            &*to,
            OsStr::from_bytes(new_name),
            rfs::RenameFlags::from_bits_retain(flags),
        )
        .map_err(os)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if let Some(replaced) = replaced
            && Some(replaced) != moved
        {
            let back = exchange.then_some((parent, name));
            self.renamed(replaced, (new_parent, new_name), back);
        }
        if let Some(moved) = moved {
            self.renamed(moved, (parent, name), Some((new_parent, new_name)));
        }
        Ok(())
    }

    /// Keeps `file` as a new handle; returns it with a second descriptor of the file,
    /// for use as a passthrough backing file.
    fn register_file(
        &self,
        handles: &mut HashMap<u64, Arc<Handle>>,
        file: File,
        ino: u64,
        writable: bool,
    ) -> Result<(u64, File), FsError> {
        let backing = file.try_clone().map_err(FsError::Os)?;
        let fh = STAGING_BIT | self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = Handle {
            file,
            ino,
            writable,
        };
        handles.insert(fh, Arc::new(handle));
        Ok((fh, backing))
    }

    /// Opens a file; returns the handle and the open file (usable as a passthrough
    /// backing file).
    pub fn open(&self, ino: u64, flags: i32) -> Result<(u64, File), FsError> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let _changing = writable.then(|| self.changing());
        let loc = self.loc(ino)?;
        // The frozen check and the handle's registration happen under the gate (for
        // writers) and the handles lock, both of which `freeze` takes: a seal cannot
        // start between the two and miss a writer.
        let mut handles = self.handles.lock().expect("handles lock");
        if writable {
            self.check_not_frozen(ino)?;
        }
        let keep = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW);
        let flags = OFlags::from_bits_retain(keep as u32) | OFlags::CLOEXEC;
        let file: File = match &loc {
            Loc::At(dir, name) => rfs::openat(
                &**dir,
                OsStr::from_bytes(name),
                flags | OFlags::NOFOLLOW,
                Mode::empty(),
            ),
            Loc::Dir(fd) => rfs::open(proc_path(&**fd), flags, Mode::empty()),
            Loc::Open(handle) => rfs::open(proc_path(&handle.file), flags, Mode::empty()),
        }
        .map_err(os)?
        .into();
        let (fh, backing) = self.register_file(&mut handles, file, ino, writable)?;
        Ok((fh, backing))
    }

    /// Creates and opens a file.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, u64, File), FsError> {
        let _changing = self.changing();
        let parent_fd = self.fd(parent)?;
        // As in `open`: checked and registered under the locks `freeze` takes.
        let mut handles = self.handles.lock().expect("handles lock");
        self.check_not_frozen(parent)?;
        let os_name = OsStr::from_bytes(name);
        let flags = OFlags::from_bits_retain(flags as u32) | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let created = rfs::openat(
            &*parent_fd,
            os_name,
            flags | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(mode & 0o7777),
        );
        let file: File = match created {
            Ok(fd) => {
                // Only what this call created gets the caller's ids and mode.
                self.give_to(&parent_fd, os_name, Some(&fd), Some(mode), caller)?;
                fd
            }
            // Another writer made it first; without O_EXCL the caller opens theirs.
            Err(rustix::io::Errno::EXIST) if !flags.contains(OFlags::EXCL) => {
                rfs::openat(&*parent_fd, os_name, flags - OFlags::CREATE, Mode::empty())
                    .map_err(os)?
            }
            Err(e) => return Err(os(e)),
        }
        .into();
        let attr = self.lookup(parent, name)?;
        let (fh, backing) = self.register_file(&mut handles, file, attr.ino, true)?;
        Ok((attr, fh, backing))
    }

    fn handle(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles.lock().expect("handles lock").get(&fh).cloned()
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let handle = self.handle(fh);
        let Some(Handle { file, .. }) = handle.as_deref() else {
            return Err(FsError::BadHandle);
        };
        crate::cache::read_at(file, offset, size as usize).map_err(FsError::Os)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let _changing = self.changing();
        let handle = self.handle(fh);
        let Some(Handle { file, ino, .. }) = handle.as_deref() else {
            return Err(FsError::BadHandle);
        };
        self.check_not_frozen(*ino)?;
        file.write_all_at(data, offset).map_err(FsError::Os)?;
        Ok(data.len() as u32)
    }

    pub fn fsync(&self, fh: u64) -> Result<(), FsError> {
        if let Some(Handle { file, .. }) = self.handle(fh).as_deref() {
            file.sync_all().map_err(FsError::Os)?;
        }
        Ok(())
    }

    pub fn release(&self, fh: u64) {
        self.handles.lock().expect("handles lock").remove(&fh);
    }

    /// Lists directory `ino` from `offset`. The kernel opens directories without
    /// asking the daemon (see `fuse.rs`), so a listing is read whole when it starts
    /// (offset 0) and kept, per directory, until it has been read to its end: offsets
    /// stay valid while it is listed.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        let entries = {
            let mut listings = self.listings.lock().expect("listings lock");
            match listings.get(&ino) {
                Some(entries) if offset != 0 => Arc::clone(entries),
                _ => {
                    let entries = Arc::new(self.read_dir(ino)?);
                    listings.insert(ino, Arc::clone(&entries));
                    entries
                }
            }
        };
        let mut full = false;
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            if add(entry, i as u64 + 1) {
                full = true;
                break;
            }
        }
        if !full {
            self.listings.lock().expect("listings lock").remove(&ino);
        }
        Ok(())
    }

    fn read_dir(&self, ino: u64) -> Result<Vec<DirEntry>, FsError> {
        let fd = self.fd(ino)?;
        let dir_fd = rfs::openat(
            &*fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        let mut entries = Vec::new();
        let mut dir = rfs::Dir::new(dir_fd).map_err(os)?;
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(os)?;
            let name = entry.file_name().to_bytes();
            let kind = file_kind(entry.file_type());
            let entry_ino = match name {
                b"." => ino,
                b".." if ino == inode::STAGING => inode::ROOT,
                _ => self.fuse_ino(entry.ino()),
            };
            entries.push(DirEntry {
                ino: entry_ino,
                kind,
                name: name.to_vec(),
            });
        }
        Ok(entries)
    }

    pub fn statfs(&self) -> Result<rfs::StatVfs, FsError> {
        rfs::fstatvfs(&*self.root_fd).map_err(os)
    }

    /// Freezes the workspace `name` for sealing: fails if it is not a directory or if
    /// any of its files is open for writing. Holds the gate for writing throughout, so
    /// that the set of frozen inodes is the whole workspace at one instant.
    pub fn freeze(&self, name: &[u8]) -> Result<Frozen, FsError> {
        let _gate = self.gate.write().expect("staging gate");
        let dir =
            beneath::open_dir(&*self.root_fd, OsStr::from_bytes(name)).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::ELOOP | libc::ENOTDIR) => FsError::NotADirectory,
                    _ => FsError::Os(e),
                }
            })?;
        let mut inodes = Vec::new();
        for_each_inode(&dir, &mut |ino| inodes.push(self.fuse_ino(ino)))?;
        let handles = self.handles.lock().expect("handles lock");
        let mut frozen = self.frozen.lock().expect("frozen lock");
        let set: HashSet<u64> = inodes.iter().copied().collect();
        let busy = handles
            .values()
            .any(|h| matches!(**h, Handle { ino, writable: true, .. } if set.contains(&ino)));
        if busy || inodes.iter().any(|i| frozen.contains(i)) {
            return Err(FsError::Busy);
        }
        frozen.extend(inodes.iter().copied());
        Ok(Frozen {
            name: name.to_vec(),
            dir,
            inodes,
        })
    }

    pub fn thaw(&self, frozen: Frozen) {
        let mut set = self.frozen.lock().expect("frozen lock");
        for ino in &frozen.inodes {
            set.remove(ino);
        }
    }

    /// Deletes a sealed workspace, if `staging/NAME` is still the directory that was
    /// frozen (it cannot have been renamed or replaced meanwhile: it is frozen), and
    /// thaws its inode numbers.
    pub fn remove_sealed(&self, frozen: Frozen) -> std::io::Result<()> {
        let name = OsStr::from_bytes(&frozen.name);
        let same = |a: &rfs::Stat, b: &rfs::Stat| (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino);
        let result = (|| {
            let now = beneath::open_dir(&*self.root_fd, name)?;
            let (now, then) = (rfs::fstat(&now)?, rfs::fstat(&frozen.dir)?);
            if !same(&now, &then) {
                return Err(std::io::Error::other(
                    "the workspace was replaced during the seal",
                ));
            }
            beneath::remove_at(&*self.root_fd, name)
        })();
        self.thaw(frozen);
        result
    }
}

/// Calls `add` with the inode number of `dir` and of everything below it, entering
/// directories through descriptors only, one at a time (see [`beneath::Descent`]):
/// a tree of any depth is walked without exhausting the stack or the open files.
fn for_each_inode(dir: &OwnedFd, add: &mut dyn FnMut(u64)) -> Result<(), FsError> {
    add(rfs::fstat(dir).map_err(os)?.st_ino);
    let top = beneath::open_dir(dir, OsStr::new(".")).map_err(FsError::Os)?;
    let mut walk = beneath::Descent::new(top);
    // Per level, the subdirectories still to enter.
    let mut pending: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut subdirs = list_inodes(walk.dir(), add)?;
    loop {
        match subdirs.pop() {
            Some(name) => {
                walk.enter(OsStr::from_bytes(&name)).map_err(FsError::Os)?;
                pending.push(std::mem::take(&mut subdirs));
                subdirs = list_inodes(walk.dir(), add)?;
            }
            None => match pending.pop() {
                Some(above) => {
                    walk.leave().map_err(FsError::Os)?;
                    subdirs = above;
                }
                None => return Ok(()),
            },
        }
    }
}

/// Calls `add` with the inode number of each entry of `dir`; returns the names of its
/// subdirectories.
fn list_inodes(
    dir: std::os::fd::BorrowedFd<'_>,
    add: &mut dyn FnMut(u64),
) -> Result<Vec<Vec<u8>>, FsError> {
    let mut subdirs = Vec::new();
    let mut listing = rfs::Dir::read_from(dir).map_err(os)?;
    while let Some(entry) = listing.read() {
        let entry = entry.map_err(os)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        add(entry.ino());
        let is_dir = match entry.file_type() {
            rfs::FileType::Unknown => {
                beneath::kind_at(dir, OsStr::from_bytes(name)).map_err(FsError::Os)?
                    == Some(rfs::FileType::Directory)
            }
            kind => kind == rfs::FileType::Directory,
        };
        if is_dir {
            subdirs.push(name.to_vec());
        }
    }
    Ok(subdirs)
}
