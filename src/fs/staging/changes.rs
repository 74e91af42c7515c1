//! The changes `staging/` takes: attributes, new entries, links, removals, renames,
//! creates and writes. Each one holds the read side of the freeze gate from its frozen
//! check to the end of its system call (see the module comment of `staging`), and
//! acts on names in a directory's descriptor without following symlinks.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timestamps};

use super::{Caller, Handle, Loc, OMIT, SetAttr, StagingTree, open_checked, os, timespec};
use crate::beneath;
use crate::fs::inode;
use crate::fs::{Attr, CopySource, FsError, Opened};

/// The most one `copy_file_range` request copies. Its reply could count up to 4 GiB,
/// but a request holds off a seal's freeze (and with it every change waiting behind
/// the freeze) while it runs; the kernel and `cp` ask again for the rest.
const MAX_COPY: u64 = 64 << 20;

impl StagingTree {
    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Attr, FsError> {
        if ino == inode::STAGING {
            // Its backing directory must stay private (see `StagingTree::at`).
            return Err(FsError::NotPermitted("staging/ itself cannot be changed"));
        }
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
                (None, Loc::At(dir, name)) => open_checked(
                    &**dir,
                    OsStr::from_bytes(name),
                    OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                )?
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
        self.attr_of(ino)
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
        self.lookup_attr(parent, name)
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
        self.lookup_attr(parent, name)
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
        self.lookup_attr(parent, name)
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
            // As link(2) answers: an existing new name first, then the kind.
            Loc::Dir(_) if self.child_ino(&parent_fd, new_name).is_some() => {
                return Err(FsError::Exists);
            }
            Loc::Dir(_) => return Err(FsError::NotPermitted("hard links to directories")),
            Loc::Open(_) => return Err(FsError::Stale),
        }
        .map_err(os)?;
        self.lookup_attr(new_parent, new_name)
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

    /// Creates and opens a file.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, Opened), FsError> {
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
                open_checked(&*parent_fd, os_name, flags - OFlags::CREATE)?
            }
            Err(e) => return Err(os(e)),
        }
        .into();
        let attr = self.lookup_attr(parent, name)?;
        let opened = self.register_file(&mut handles, file, attr.ino, true)?;
        Ok((attr, opened))
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

    /// Writes up to `len` bytes of `source` from `source_offset` into the staged file
    /// `fh` at `offset`, copied by the kernel between the two files on disk. Like a
    /// write, refused while the file's workspace is frozen for a seal. The count fits
    /// the reply (`u32`); the caller asks again for the rest.
    pub fn copy_into(
        &self,
        fh: u64,
        offset: u64,
        source: &CopySource,
        source_offset: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        let _changing = self.changing();
        let handle = self.handle(fh);
        let Some(Handle { file, ino, .. }) = handle.as_deref() else {
            return Err(FsError::BadHandle);
        };
        self.check_not_frozen(*ino)?;
        // Never past the source's own bytes: a packed file is a range of the pack.
        let mut remaining = len
            .min(source.size.saturating_sub(source_offset))
            .min(MAX_COPY);
        let mut from = source.start.saturating_add(source_offset);
        let mut to = offset;
        let mut copied = 0u64;
        while remaining > 0 {
            let n = match rustix::fs::copy_file_range(
                &source.file,
                Some(&mut from),
                file,
                Some(&mut to),
                remaining as usize,
            ) {
                Ok(n) => n as u64,
                // What was copied is in the file: say so, and let the next request
                // meet the error (a full disk, a file too large).
                Err(_) if copied > 0 => break,
                Err(e) => return Err(os(e)),
            };
            if n == 0 {
                break; // the end of the source file
            }
            copied += n;
            remaining -= n;
        }
        Ok(copied as u32)
    }
}
