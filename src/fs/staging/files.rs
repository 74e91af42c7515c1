//! Reads and writes of staged files, which come by inode.
//!
//! The kernel opens files without asking the daemon (see `fuse.rs`), so no request
//! carries a handle that says which open file it is for: a read or a write names an
//! inode, and is served through a descriptor of that inode. Descriptors are opened
//! on first use and kept in a small cache ([`OPEN_FILES`]), keyed by FUSE inode
//! number. A cached descriptor is always of the inode its key names: it was checked
//! with `fstat` when opened, and while it is open the backing filesystem cannot give
//! that inode number to another file.
//!
//! A file whose last known name goes away (an unlink, a rename over it, the seal that
//! deletes its workspace) while the kernel still knows it may still be open in some
//! process, which POSIX lets go on reading and writing it: such a file is *parked*,
//! kept by a hard link in the graveyard (`GRAVEYARD` in `mod.rs`) named after its
//! inode number, until the kernel forgets the inode (which it does as soon as nothing
//! holds the file). A link costs no descriptor, so there is no bound to keep; and
//! while a file the kernel knows keeps its inode, the backing filesystem cannot give
//! its number to a new file that the kernel would take for it.

use std::ffi::OsStr;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use rustix::fs::{self as rfs, AtFlags, OFlags};

use super::{Known, Loc, Place, StagingTree, open_checked, os, parked_name};
use crate::fs::error::FsError;
use crate::fs::subtree::CopySource;

/// Staged files kept open for reads and writes.
const OPEN_FILES: usize = 64;

/// The most one `copy_file_range` request copies. Its reply could count up to 4 GiB,
/// but a request holds off a seal's freeze (and with it every change waiting behind
/// the freeze) while it runs; the kernel and `cp` ask again for the rest.
const MAX_COPY: u64 = 64 << 20;

/// An open descriptor of a staged file, and what it was opened for.
struct OpenFile {
    file: Arc<File>,
    readable: bool,
    writable: bool,
}

pub(super) struct OpenFiles(Mutex<LruCache<u64, OpenFile>>);

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles(Mutex::new(LruCache::new(
            NonZeroUsize::new(OPEN_FILES).expect("non-zero"),
        )))
    }
}

impl OpenFiles {
    fn get(&self, ino: u64, write: bool) -> Option<Arc<File>> {
        let mut files = self.0.lock().expect("open files lock");
        let open = files.get(&ino)?;
        let fits = if write { open.writable } else { open.readable };
        fits.then(|| Arc::clone(&open.file))
    }

    fn put(&self, ino: u64, file: File, flags: OFlags) -> Arc<File> {
        let file = Arc::new(file);
        let access = flags & OFlags::RWMODE;
        let open = OpenFile {
            file: Arc::clone(&file),
            readable: access != OFlags::WRONLY,
            writable: access != OFlags::RDONLY,
        };
        self.0.lock().expect("open files lock").put(ino, open);
        file
    }

    /// Closes `ino`'s descriptor, if one is open.
    pub(super) fn forget(&self, ino: u64) {
        self.0.lock().expect("open files lock").pop(&ino);
    }
}

impl StagingTree {
    /// A descriptor of regular file `ino`, open for writing if `write` (else for
    /// reading), opened now if none is kept.
    fn open_file(&self, ino: u64, write: bool) -> Result<Arc<File>, FsError> {
        if let Some(file) = self.files.get(ino, write) {
            return Ok(file);
        }
        let loc = self.loc(ino)?;
        let open = |flags: OFlags| match &loc {
            Loc::At(dir, name) => {
                open_checked(&**dir, OsStr::from_bytes(name), flags | OFlags::NOFOLLOW)
            }
            Loc::Dir(_) => Err(FsError::IsADirectory),
        };
        // Read and write through one descriptor where the file's mode allows it (a
        // daemon that is not root may not open a read-only file for writing).
        let base = OFlags::CLOEXEC;
        let mut flags = base | OFlags::RDWR;
        let fd = match open(flags) {
            Err(e) if e.errno() == libc::EACCES => {
                flags = base
                    | if write {
                        OFlags::WRONLY
                    } else {
                        OFlags::RDONLY
                    };
                open(flags)?
            }
            other => other?,
        };
        // What was opened must be the inode asked for: a name renamed over since the
        // kernel looked it up is refused, not served in its place.
        if self.fuse_ino(rfs::fstat(&fd).map_err(os)?.st_ino) != ino {
            return Err(FsError::Stale);
        }
        Ok(self.files.put(ino, fd.into(), flags))
    }

    /// Keeps `file`, just created as `ino` and opened with `flags`, for the writes
    /// that follow.
    pub(super) fn keep_open(&self, ino: u64, file: File, flags: OFlags) {
        self.files.put(ino, file, flags);
    }

    /// Checks that file `ino` can be opened with `open(2)` flags `flags` (only asked
    /// when the kernel sends opens, see `fuse.rs`): it is reachable, a regular file,
    /// and not frozen when opened for writing.
    pub(super) fn check_open(&self, ino: u64, flags: i32) -> Result<(), FsError> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if write {
            self.check_not_frozen(ino)?;
        }
        self.open_file(ino, write).map(drop)
    }

    pub(super) fn read_file(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let file = self.open_file(ino, false)?;
        crate::cache::read_at(&file, offset, size as usize).map_err(FsError::Os)
    }

    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(ino)?;
        let file = self.open_file(ino, true)?;
        file.write_all_at(data, offset).map_err(FsError::Os)?;
        Ok(data.len() as u32)
    }

    pub fn fsync(&self, ino: u64) -> Result<(), FsError> {
        self.open_file(ino, false)?.sync_all().map_err(FsError::Os)
    }

    /// File `ino`'s bytes, for a copy made by the kernel into another staged file.
    pub(super) fn copy_source_of(&self, ino: u64) -> Result<CopySource, FsError> {
        let file = self.open_file(ino, false)?;
        Ok(CopySource {
            file: file.try_clone().map_err(FsError::Os)?,
            start: 0,
            size: u64::MAX,
            from: None,
        })
    }

    /// Writes up to `len` bytes of `source` from `source_offset` into staged file
    /// `ino` at `offset`, copied by the kernel between the two files on disk. Like a
    /// write, refused while the file's workspace is frozen for a seal. The count fits
    /// the reply (`u32`); the caller asks again for the rest.
    pub fn copy_into(
        &self,
        ino: u64,
        offset: u64,
        source: &CopySource,
        source_offset: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        let _changing = self.changing();
        self.check_not_frozen(ino)?;
        let file = self.open_file(ino, true)?;
        // Never past the source's own bytes: a packed file is a range of the pack.
        let mut remaining = len
            .min(source.size.saturating_sub(source_offset))
            .min(MAX_COPY);
        let mut from = source.start.saturating_add(source_offset);
        let mut to = offset;
        let mut copied = 0u64;
        while remaining > 0 {
            let n = match rfs::copy_file_range(
                &source.file,
                Some(&mut from),
                &*file,
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
        if copied > 0
            && let Some(checkpoint) = &source.from
        {
            let mut copied_from = self.copied_from.lock().expect("copied lock");
            copied_from.insert(ino, checkpoint.id.clone());
        }
        Ok(copied as u32)
    }

    /// Before `dir/name` (described by `stat`) is removed or replaced: if it is a
    /// regular file the kernel knows by no other name, links it into the graveyard
    /// (see the module comment); returns whether it did.
    pub(super) fn park(&self, dir: &OwnedFd, name: &[u8], parent: u64, stat: &rfs::Stat) -> bool {
        if rfs::FileType::from_raw_mode(stat.st_mode) != rfs::FileType::RegularFile {
            return false;
        }
        let ino = self.fuse_ino(stat.st_ino);
        match self.known.lock().expect("staging lock").get(&ino) {
            Some(Known {
                place: Place::Links(links),
                ..
            }) if links.iter().all(|(p, n)| *p == parent && n == name) => {}
            _ => return false,
        }
        self.link_parked(dir, OsStr::from_bytes(name), ino)
    }

    /// Links `dir/name` into the graveyard as parked file `ino`.
    pub(super) fn link_parked(&self, dir: impl AsFd, name: &OsStr, ino: u64) -> bool {
        let parked = parked_name(ino);
        match rfs::linkat(
            dir,
            name,
            &*self.graveyard,
            OsStr::from_bytes(&parked),
            AtFlags::empty(),
        ) {
            // Already there: another name of the same file was parked first.
            Ok(()) | Err(rustix::io::Errno::EXIST) => true,
            Err(e) => {
                tracing::debug!(ino, error = %e, "cannot park a file; its holders lose it");
                false
            }
        }
    }
}
