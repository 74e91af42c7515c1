//! The FUSE adapter: converts fuser's arguments and replies to and from
//! [`CheckpointFs`] calls, and does nothing else. The core decides what the kernel may
//! cache ([`super::Entry::ttl`], [`super::Opened`]), whether opens reach the daemon
//! ([`CheckpointFs::open_is_free`]) and which operations wait for a checkpoint to
//! load ([`CheckpointFs::prepare`]); replies to those are sent from the loader's
//! thread, as seal replies are sent from the seal's thread. What the core asks of the
//! kernel's caches outside of replies goes through [`SessionCache`]. Errors are logged
//! once here, with the errno sent.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::error::FsError;
use super::metrics::Op;
use super::passthrough::{self, Backing, BackingTable, Created};
use super::router::{CheckpointFs, Reading};
use super::staging::{Caller, SetAttr, SetTime};
use super::subtree::{Attr, Entry, FileKind, KernelCache};

pub struct FuseAdapter {
    fs: Arc<CheckpointFs>,
    /// Cleared when the kernel does not offer backing files.
    passthrough: Arc<AtomicBool>,
    /// Keeps each passthrough open's backing id alive until release.
    backing: Backing,
}

/// The kernel's caches, reached through the session's notifications.
pub struct SessionCache(pub Notifier);

impl KernelCache for SessionCache {
    fn store(&self, ino: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.store(INodeNo(ino), 0, data)
    }

    fn forget_entry(&self, parent: u64, name: &[u8]) {
        let _ = self.0.inval_entry(INodeNo(parent), OsStr::from_bytes(name));
    }

    fn forget_attributes(&self, ino: u64) {
        let _ = self.0.inval_inode(INodeNo(ino), 0, 0);
    }
}

impl FuseAdapter {
    pub fn new(fs: Arc<CheckpointFs>) -> Self {
        FuseAdapter {
            fs,
            passthrough: Arc::new(AtomicBool::new(false)),
            backing: Arc::new(Mutex::new(BackingTable::default())),
        }
    }

    fn reply_entry(
        &self,
        parent: u64,
        result: Result<Entry, FsError>,
        op: &str,
        reply: ReplyEntry,
    ) {
        match result {
            Ok(entry) => reply_with(reply, &entry),
            Err(e) => reply.error(errno(op, parent, &e)),
        }
    }
}

/// A lookup's (or a make's) reply: the name and the attributes each for as long as
/// the core allows.
fn reply_with(reply: ReplyEntry, entry: &Entry) {
    reply.entry_with_ttls(
        &entry.ttl,
        &entry.name_ttl,
        &file_attr(&entry.attr),
        Generation(entry.attr.generation.into()),
    );
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.mtime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Attributes for `.` and `..` in a readdirplus reply, which the kernel skips.
fn placeholder_attr(ino: u64) -> FileAttr {
    file_attr(&Attr {
        ino,
        generation: 0,
        kind: FileKind::Directory,
        size: 0,
        perm: 0o555,
        nlink: 2,
        uid: 0,
        gid: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
    })
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Directory => FileType::Directory,
        FileKind::File => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// Logs the failure (see `FsError::report`) and returns the errno to send.
fn errno(operation: &str, ino: u64, error: &FsError) -> Errno {
    Errno::from_i32(error.report(operation, ino))
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    })
}

const UNCACHED: Duration = Duration::ZERO;

/// Records how long a request took when it goes out of scope (replied or failed).
struct Timer<'a>(&'a CheckpointFs, Op, Instant);

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.0.latencies().record(self.1, self.2.elapsed());
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Files created in staging/ are written around the page cache (see
        // `StagingTree::create`); this lets their creator map them all the same.
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough.store(true, Ordering::Relaxed);
        } else {
            tracing::info!(
                "the kernel does not offer FUSE passthrough; serving reads in user space"
            );
        }
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        let started = Instant::now();
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(parent.0, Reading::Lookup, move |fs| {
            let _timer = Timer(fs, Op::Lookup, started);
            let found = fs
                .may_enter(parent.0, who, 0o1)
                .and_then(|()| fs.lookup(parent.0, &name));
            match found {
                Ok(entry) => reply_with(reply, &entry),
                // Node 0: the kernel keeps the name's absence for as long as allowed.
                Err(e) if e.errno() == libc::ENOENT && !fs.negative_ttl(parent.0).is_zero() => {
                    let ttl = fs.negative_ttl(parent.0);
                    let absent = FileAttr {
                        ino: INodeNo(0),
                        ..placeholder_attr(0)
                    };
                    reply.entry_with_ttls(&ttl, &ttl, &absent, Generation(0));
                }
                Err(e) => reply.error(errno("lookup", parent.0, &e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let started = Instant::now();
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(ino.0, Reading::Getattr, move |fs| {
            let _timer = Timer(fs, Op::Getattr, started);
            match fs.may_reach(ino.0, who).and_then(|()| fs.getattr(ino.0)) {
                Ok(entry) => reply.attr(&entry.ttl, &file_attr(&entry.attr)),
                Err(e) => reply.error(errno("getattr", ino.0, &e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let started = Instant::now();
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(ino.0, Reading::Readlink, move |fs| {
            let _timer = Timer(fs, Op::Readlink, started);
            match fs.may_reach(ino.0, who).and_then(|()| fs.readlink(ino.0)) {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(errno("readlink", ino.0, &e)),
            }
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Directories are opened without asking the daemon: answering ENOSYS once
        // makes the kernel open every directory by itself from then on, and keep
        // their listings in its cache (revalidated by the directory's mtime), which
        // saves a round trip per directory `find` or `ls -R` enters. A checkpoint that
        // fails verification answers EIO when it is read (`readdir`, `lookup`). On a
        // mount other users share, each open is checked instead, and the listing kept
        // all the same (see `CheckpointFs::dirs_opened_freely`).
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(ino.0, Reading::Opendir, move |fs| {
            let opened = fs
                .opendir(ino.0)
                .and_then(|()| fs.may_enter(ino.0, who, 0o4));
            match opened {
                Ok(()) if fs.dirs_opened_freely() => reply.error(Errno::from_i32(libc::ENOSYS)),
                Ok(()) if fs.dir_is_immutable(ino.0) => reply.opened(
                    FileHandle(0),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
                ),
                Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(errno("opendir", ino.0, &e)),
            }
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(ino.0, Reading::Readdir, move |fs| {
            if let Err(e) = fs.may_enter(ino.0, who, 0o4) {
                return reply.error(errno("readdir", ino.0, &e));
            }
            let result = fs.readdir(ino.0, offset, &mut |entry, next| {
                let kind = file_type(entry.kind);
                reply.add(
                    INodeNo(entry.ino),
                    next,
                    kind,
                    OsStr::from_bytes(&entry.name),
                )
            });
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("readdir", ino.0, &e)),
            }
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // Entries with their attributes, so that `ls -l` needs no lookup per entry.
        let started = Instant::now();
        let who = (req.uid(), req.gid(), req.pid());
        self.fs.prepare(ino.0, Reading::Readdir, move |fs| {
            let _timer = Timer(fs, Op::Readdir, started);
            if let Err(e) = fs.may_enter(ino.0, who, 0o4) {
                return reply.error(errno("readdirplus", ino.0, &e));
            }
            // A directory one may list but not search gives names, not attributes.
            let searchable = fs.may_enter(ino.0, who, 0o1).is_ok();
            let result = fs.readdirplus(ino.0, offset, &mut |entry, found, next| {
                let name = OsStr::from_bytes(&entry.name);
                match found.filter(|_| searchable) {
                    // One lifetime for the name and the attributes here: the shorter.
                    Some(found) => reply.add(
                        INodeNo(found.attr.ino),
                        next,
                        name,
                        &found.name_ttl.min(found.ttl),
                        &file_attr(&found.attr),
                        Generation(found.attr.generation.into()),
                    ),
                    None => reply.add(
                        INodeNo(entry.ino),
                        next,
                        name,
                        &UNCACHED,
                        &placeholder_attr(entry.ino),
                        Generation(0),
                    ),
                }
            });
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("readdirplus", ino.0, &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        let (backing, started) = (Arc::clone(&self.backing), Instant::now());
        self.fs.prepare(ino.0, Reading::Open, move |fs| {
            let _timer = Timer(fs, Op::Open, started);
            let opened = match fs.open_for_kernel(ino.0, flags.0) {
                Ok(Some(opened)) => opened,
                // ENOSYS makes the kernel open every file by itself from now on.
                Ok(None) => return reply.error(Errno::from_i32(libc::ENOSYS)),
                Err(e) => return reply.error(errno("open", ino.0, &e)),
            };
            let fh = FileHandle(opened.fh);
            passthrough::answer(passthrough, &backing, ino.0, &opened, (reply, fh));
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timer = Timer(&self.fs, Op::Create, Instant::now());
        let created = self
            .fs
            .create(parent.0, name.as_bytes(), mode & !umask, flags, caller(req));
        let (entry, opened) = match created {
            Ok(created) => created,
            Err(e) => return reply.error(errno("create", parent.0, &e)),
        };
        // One TTL for the name and the attributes here: the name's.
        let created = Created {
            reply,
            ttl: entry.name_ttl,
            attr: file_attr(&entry.attr),
            generation: Generation(entry.attr.generation.into()),
            fh: FileHandle(opened.fh),
        };
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        passthrough::answer(passthrough, &self.backing, entry.attr.ino, &opened, created);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let started = Instant::now();
        self.fs.prepare(ino.0, Reading::Read, move |fs| {
            let _timer = Timer(fs, Op::Read, started);
            match fs.read(ino.0, fh.0, offset, size) {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno("read", ino.0, &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timer = Timer(&self.fs, Op::Write, Instant::now());
        match self.fs.write(ino.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(errno("write", ino.0, &e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let started = Instant::now();
        self.fs.prepare(ino_in.0, Reading::Read, move |fs| {
            let _timer = Timer(fs, Op::CopyFileRange, started);
            let from = (ino_in.0, fh_in.0, offset_in);
            match fs.copy_file_range(from, (ino_out.0, offset_out), len) {
                Ok(copied) => reply.written(copied),
                Err(e) => reply.error(errno("copy_file_range", ino_out.0, &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do on close (writes are not buffered here); ENOSYS makes the
        // kernel stop sending flush, which saves a round trip per close.
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = Timer(&self.fs, Op::Fsync, Instant::now());
        match self.fs.fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("fsync", ino.0, &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = Timer(&self.fs, Op::Release, Instant::now());
        self.backing.lock().expect("backing lock").release(fh.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno("statfs", ino.0, &e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // `default_permissions` makes the kernel check modes itself.
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // Extended attributes are not part of checkpoints. ENOSYS (rather than
        // ENODATA) makes the kernel stop asking for the whole mount: `ls -l` asks for
        // two or three attributes per entry, which would double its cost.
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // No file here is a terminal or a device: what `isatty` and friends expect.
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timer = Timer(&self.fs, Op::Setattr, Instant::now());
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| f.0),
        };
        match self.fs.setattr(ino.0, set) {
            Ok(entry) => reply.attr(&entry.ttl, &file_attr(&entry.attr)),
            Err(e) => reply.error(errno("setattr", ino.0, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timer = Timer(&self.fs, Op::Mknod, Instant::now());
        let mode = mode & !(umask & 0o7777);
        let result = self
            .fs
            .mknod(parent.0, name.as_bytes(), mode, rdev.into(), caller(req));
        self.reply_entry(parent.0, result, "mknod", reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _timer = Timer(&self.fs, Op::Mkdir, Instant::now());
        let result = self
            .fs
            .mkdir(parent.0, name.as_bytes(), mode & !umask, caller(req));
        self.reply_entry(parent.0, result, "mkdir", reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timer = Timer(&self.fs, Op::Symlink, Instant::now());
        let result = self.fs.symlink(
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            caller(req),
        );
        self.reply_entry(parent.0, result, "symlink", reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = Timer(&self.fs, Op::Link, Instant::now());
        let result = self.fs.link(ino.0, newparent.0, newname.as_bytes());
        self.reply_entry(newparent.0, result, "link", reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = Timer(&self.fs, Op::Unlink, Instant::now());
        match self.fs.unlink(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("unlink", parent.0, &e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = Timer(&self.fs, Op::Rmdir, Instant::now());
        match self.fs.rmdir(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("rmdir", parent.0, &e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (fs, started) = (Arc::clone(&self.fs), Instant::now());
        self.fs.rename(
            (parent.0, name.as_bytes()),
            (newparent.0, newname.as_bytes()),
            flags.bits(),
            Box::new(move |result| {
                let _timer = Timer(&fs, Op::Rename, started);
                match result {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno("rename", parent.0, &e)),
                }
            }),
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let done = Box::new(move |result: Result<(), FsError>| match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("setxattr", ino.0, &e)),
        });
        self.fs
            .setxattr(ino.0, name.as_bytes(), value, caller(req), done);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("removexattr", ino.0, &self.fs.removexattr(ino.0)));
    }
}
