//! The FUSE adapter: converts fuser's arguments and replies to and from
//! [`CheckpointFs`] calls, and does nothing else.
//!
//! Operations that need a checkpoint's contents are deferred with
//! [`CheckpointFs::ensure_loaded`] so that the request threads stay free while a
//! checkpoint downloads; their reply is sent from the loader thread. Errors are
//! logged once here, with the errno sent.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::{Attr, CheckpointFs, FileKind, FsError};

/// How long the kernel may trust what it learns about checkpoint contents, which
/// never change, and about the virtual tree, which changes with each listing.
const IMMUTABLE_TTL: Duration = Duration::from_secs(24 * 3600);
const VIRTUAL_TTL: Duration = Duration::from_secs(1);

pub struct FuseAdapter {
    fs: Arc<CheckpointFs>,
    /// Cleared when the kernel refuses backing files (old kernel, no CAP_SYS_ADMIN).
    passthrough: AtomicBool,
    /// Keeps each passthrough open's backing id alive until release.
    backing: Arc<Mutex<HashMap<u64, BackingId>>>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<CheckpointFs>) -> Self {
        FuseAdapter {
            fs,
            passthrough: AtomicBool::new(false),
            backing: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn ttl(&self, ino: u64) -> Duration {
        if self.fs.is_immutable(ino) {
            IMMUTABLE_TTL
        } else {
            VIRTUAL_TTL
        }
    }

    /// Runs `work` now, or once the checkpoint `ino` belongs to is loaded.
    fn dispatch(&self, ino: u64, getattr: bool, work: impl FnOnce(&CheckpointFs) + Send + 'static) {
        match self.fs.slot_needing_load(ino, getattr) {
            None => work(&self.fs),
            Some(slot) => {
                let fs = Arc::clone(&self.fs);
                self.fs.ensure_loaded(slot, Box::new(move || work(&fs)));
            }
        }
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.mtime,
        mtime: attr.mtime,
        ctime: attr.mtime,
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

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Directory => FileType::Directory,
        FileKind::File => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
    }
}

/// Logs the cause of failures worth knowing about and returns the errno to send.
fn errno(operation: &str, ino: u64, error: &FsError) -> Errno {
    if error.is_notable() {
        tracing::warn!(operation, ino, error = %error, "request failed");
    } else {
        tracing::debug!(operation, ino, error = %error, "request refused");
    }
    Errno::from_i32(error.errno())
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_PASSTHROUGH;
        if config.add_capabilities(wanted).is_ok() && config.set_max_stack_depth(1).is_ok() {
            self.passthrough.store(true, Ordering::Relaxed);
        } else {
            tracing::info!(
                "the kernel does not offer FUSE passthrough; serving reads in user space"
            );
        }
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        let ttl_fs = Arc::clone(&self.fs);
        self.dispatch(parent.0, false, move |fs| {
            match fs.lookup(parent.0, &name) {
                Ok(attr) => {
                    let ttl = if ttl_fs.is_immutable(attr.ino) {
                        IMMUTABLE_TTL
                    } else {
                        VIRTUAL_TTL
                    };
                    reply.entry(&ttl, &file_attr(&attr), Generation(0))
                }
                Err(e) => reply.error(errno("lookup", parent.0, &e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.ttl(ino.0);
        self.dispatch(ino.0, true, move |fs| match fs.getattr(ino.0) {
            Ok(attr) => reply.attr(&ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno("getattr", ino.0, &e)),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.dispatch(ino.0, false, move |fs| match fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno("readlink", ino.0, &e)),
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Opening a checkpoint's directory is what verifies it: a bad checkpoint
        // answers EIO here, before any entry is listed.
        self.dispatch(ino.0, false, move |fs| {
            match fs.getattr(ino.0).and_then(|a| {
                if a.kind == FileKind::Directory {
                    Ok(())
                } else {
                    Err(FsError::NotADirectory)
                }
            }) {
                Ok(()) => match fs.readdir(ino.0, u64::MAX, &mut |_, _| true) {
                    Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                    Err(e) => reply.error(errno("opendir", ino.0, &e)),
                },
                Err(e) => reply.error(errno("opendir", ino.0, &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.dispatch(ino.0, false, move |fs| {
            let result = fs.readdir(ino.0, offset, &mut |entry, next| {
                reply.add(
                    INodeNo(entry.ino),
                    next,
                    file_type(entry.kind),
                    OsStr::from_bytes(&entry.name),
                )
            });
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("readdir", ino.0, &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        let backing_ids = Arc::clone(&self.backing);
        self.dispatch(ino.0, false, move |fs| {
            let opened = match fs.open(ino.0, write) {
                Ok(opened) => opened,
                Err(e) => return reply.error(errno("open", ino.0, &e)),
            };
            let mut flags = FopenFlags::empty();
            if opened.keep_cache {
                flags |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            if opened.direct_io {
                flags |= FopenFlags::FOPEN_DIRECT_IO;
            }
            if passthrough && let Some(file) = &opened.backing {
                match reply.open_backing(file) {
                    Ok(id) => {
                        reply.opened_passthrough(FileHandle(opened.fh), flags, &id);
                        backing_ids.lock().expect("backing lock").insert(opened.fh, id);
                        return;
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "passthrough refused; serving reads in user space");
                    }
                }
            }
            reply.opened(FileHandle(opened.fh), flags);
        });
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
        match self.fs.read(fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno("read", ino.0, &e)),
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
        self.backing.lock().expect("backing lock").remove(&fh.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // Archives' extended attributes are not kept.
        reply.error(Errno::from_i32(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // `default_permissions` makes the kernel check modes itself.
        reply.ok();
    }

    // Everything below would change the tree: checkpoints are read-only, and so is
    // the virtual tree around them.

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(errno("setattr", ino.0, &FsError::ReadOnly));
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno("mknod", parent.0, &FsError::ReadOnly));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno("mkdir", parent.0, &FsError::ReadOnly));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("unlink", parent.0, &FsError::ReadOnly));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("rmdir", parent.0, &FsError::ReadOnly));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(errno("symlink", parent.0, &FsError::ReadOnly));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(errno("rename", parent.0, &FsError::ReadOnly));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(errno("link", ino.0, &FsError::ReadOnly));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(errno("create", parent.0, &FsError::ReadOnly));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(errno("write", ino.0, &FsError::ReadOnly));
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(errno("setxattr", ino.0, &FsError::ReadOnly));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("removexattr", ino.0, &FsError::ReadOnly));
    }
}
