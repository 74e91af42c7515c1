//! The changes `staging/` takes: attributes, new entries, links, removals, renames,
//! creates and writes. Each one holds the read side of the freeze gate from its frozen
//! check to the end of its system call (see the module comment of `staging`), and
//! acts on names in a directory's descriptor without following symlinks.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timestamps};

use super::{Caller, Loc, OMIT, SetAttr, StagingTree, open_checked, os, timespec};
use crate::beneath;
use crate::fs::error::FsError;
use crate::fs::inode;
use crate::fs::inode::STAGED_BIT;
use crate::fs::subtree::{Attr, Opened};

impl StagingTree {
    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Attr, FsError> {
        if ino == inode::STAGING {
            // Its backing directory must stay private (see `StagingTree::at`).
            return Err(FsError::NotPermitted("staging/ itself cannot be changed"));
        }
        let _changing = self.changing();
        self.check_not_frozen(ino)?;
        let loc = self.loc(ino)?;
        if let Some(mode) = set.mode {
            // On the entry itself: a symlink's own mode cannot change (EOPNOTSUPP),
            // and what it points to is never touched.
            let mode = mode & 0o7777;
            match &loc {
                Loc::Dir(fd) => beneath::chmod_opened(&**fd, mode),
                Loc::At(dir, name) => beneath::chmod_at(&**dir, OsStr::from_bytes(name), mode),
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
            }
            .map_err(os)?;
        }
        if let Some(size) = set.size {
            let flags = OFlags::WRONLY | OFlags::CLOEXEC;
            let file: File = match &loc {
                Loc::At(dir, name) => {
                    open_checked(&**dir, OsStr::from_bytes(name), flags | OFlags::NOFOLLOW)?
                }
                Loc::Dir(_) => return Err(FsError::IsADirectory),
            }
            .into();
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
        self.not_graveyard(parent, name)?;
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
        self.not_graveyard(parent, name)?;
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
        self.not_graveyard(parent, name)?;
        self.check_not_frozen(parent)?;
        let parent_fd = self.fd(parent)?;
        let os_name = OsStr::from_bytes(name);
        rfs::symlinkat(OsStr::from_bytes(target), &*parent_fd, os_name).map_err(os)?;
        self.give_to(&parent_fd, os_name, None, None, caller)?;
        self.lookup_attr(parent, name)
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr, FsError> {
        let _changing = self.changing();
        self.not_graveyard(new_parent, new_name)?;
        self.check_not_frozen(ino)?;
        self.check_not_frozen(new_parent)?;
        let parent_fd = self.fd(new_parent)?;
        let new_name_os = OsStr::from_bytes(new_name);
        match self.loc(ino)? {
            // As link(2) answers for a file with no name left.
            loc if self.is_parked(&loc) => return Err(FsError::NotFound),
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
        }
        .map_err(os)?;
        self.lookup_attr(new_parent, new_name)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        let _changing = self.changing();
        let (fd, victim) = self.child_not_frozen(parent, name)?;
        let parked = victim.is_some_and(|v| self.park(&fd, name, parent, &v));
        rfs::unlinkat(&*fd, OsStr::from_bytes(name), AtFlags::empty()).map_err(os)?;
        if let Some(victim) = victim {
            let ino = self.fuse_ino(victim.st_ino);
            self.renamed(ino, (parent, name), None, parked);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        let _changing = self.changing();
        let (fd, victim) = self.child_not_frozen(parent, name)?;
        let pin = victim.map(|v| self.pin_if_known(self.fuse_ino(v.st_ino)));
        rfs::unlinkat(&*fd, OsStr::from_bytes(name), AtFlags::REMOVEDIR).map_err(os)?;
        if let Some(pin) = pin {
            pin.keep();
        }
        if let Some(victim) = victim {
            self.forget_fork(self.fuse_ino(victim.st_ino));
        }
        Ok(())
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
        let (from, moved) = self.child_not_frozen(parent, name)?;
        let (to, replaced) = self.child_not_frozen(new_parent, new_name)?;
        let ino = |stat: &Option<rfs::Stat>| stat.as_ref().map(|s| self.fuse_ino(s.st_ino));
        let (moved_ino, replaced_ino) = (ino(&moved), ino(&replaced));
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let is_dir =
            |s: &rfs::Stat| rfs::FileType::from_raw_mode(s.st_mode) == rfs::FileType::Directory;
        let pin = match &replaced {
            Some(stat) if !exchange && replaced_ino != moved_ino && is_dir(stat) => {
                Some(self.pin_if_known(self.fuse_ino(stat.st_ino)))
            }
            _ => None,
        };
        let parked = match &replaced {
            Some(stat) if !exchange && replaced_ino != moved_ino => {
                self.park(&to, new_name, new_parent, stat)
            }
            _ => false,
        };
        rfs::renameat_with(
            &*from,
            OsStr::from_bytes(name),
            &*to,
            OsStr::from_bytes(new_name),
            rfs::RenameFlags::from_bits_retain(flags),
        )
        .map_err(os)?;
        if let Some(pin) = pin {
            pin.keep();
        }
        if let Some(replaced) = replaced_ino
            && Some(replaced) != moved_ino
        {
            let back = exchange.then_some((parent, name));
            self.renamed(replaced, (new_parent, new_name), back, parked);
        }
        if let Some(moved) = moved_ino {
            self.renamed(moved, (parent, name), Some((new_parent, new_name)), false);
        }
        Ok(())
    }

    /// Creates and opens a file. The descriptor is kept for the writes that follow
    /// (reads and writes come by inode, see `files.rs`); the handle is only a mark.
    /// Writes through it bypass the kernel's page cache: the file is being written,
    /// and a copy in the page cache as well as on disk would cost twice the memory
    /// and twice the copying (other opens, made by the kernel, read through the cache).
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, Opened), FsError> {
        let _changing = self.changing();
        self.not_graveyard(parent, name)?;
        let parent_fd = self.fd(parent)?;
        self.check_not_frozen(parent)?;
        let os_name = OsStr::from_bytes(name);
        let asked = OFlags::from_bits_retain(flags as u32);
        // The descriptor kept serves every later read and write, at the offsets the
        // kernel gives: never in append or direct mode, whatever the caller asked.
        let base = OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let created = rfs::openat(
            &*parent_fd,
            os_name,
            base | OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(mode & 0o7777),
        );
        let (file, access): (File, OFlags) = match created {
            Ok(fd) => {
                // Only what this call created gets the caller's ids and mode.
                self.give_to(&parent_fd, os_name, Some(&fd), Some(mode), caller)?;
                (fd.into(), OFlags::RDWR)
            }
            // Another writer made it first; without O_EXCL the caller opens theirs.
            Err(rustix::io::Errno::EXIST) if !asked.contains(OFlags::EXCL) => {
                let access = asked & OFlags::RWMODE;
                let flags = base | access | (asked & OFlags::TRUNC);
                (open_checked(&*parent_fd, os_name, flags)?.into(), access)
            }
            Err(e) => return Err(os(e)),
        };
        let attr = self.lookup_attr(parent, name)?;
        self.keep_open(attr.ino, file, access);
        let opened = Opened {
            fh: STAGED_BIT,
            backing: None,
            keep_cache: true,
            direct_io: true,
        };
        Ok((attr, opened))
    }
}
