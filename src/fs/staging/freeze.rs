//! Freezing a workspace for a seal, and deleting it once sealed.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs as rfs;

use super::{Pin, Place, StagingTree, os};
use crate::beneath;
use crate::checkpoint::CheckpointId;
use crate::fs::error::FsError;

/// A workspace frozen for sealing: its directory, opened when it was frozen, and
/// every inode in it.
pub struct Frozen {
    pub name: Vec<u8>,
    pub dir: OwnedFd,
    inodes: Vec<u64>,
    /// The checkpoints its files had bytes copied from, as far as this mount saw.
    pub copied_from: HashSet<CheckpointId>,
    /// The key of the records of its capture after a fork, if it was forked.
    pub forked: Option<[u8; 32]>,
}

impl StagingTree {
    /// Freezes the workspace `name` for sealing: fails if it is not a directory, or is
    /// frozen already. Holds the gate for writing throughout, so that the set of frozen
    /// inodes is the whole workspace at one instant, and every write that began before
    /// has ended (writes come by inode and hold the gate: see `files.rs`).
    /// A workspace of more than `max_entries` entries is refused as soon as the walk
    /// passes that many (the mount could not read its checkpoint back), so that the
    /// gate is not held, nor memory taken, for longer than a readable one takes.
    pub fn freeze(&self, name: &[u8], max_entries: u64) -> Result<Frozen, FsError> {
        let _gate = self.gate.write().expect("staging gate");
        let dir =
            beneath::open_dir(&*self.root_fd, OsStr::from_bytes(name)).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::ELOOP | libc::ENOTDIR) => FsError::CommitOnly(super::NOT_SEALABLE),
                    _ => FsError::Os(e),
                }
            })?;
        let forked_from = rfs::fstat(&dir)
            .ok()
            .and_then(|stat| self.forked_from(&dir, &stat));
        let mut inodes = Vec::new();
        for_each_inode(&dir, &mut |ino| {
            if inodes.len() as u64 > max_entries {
                return Err(FsError::TooLarge(format!(
                    "the workspace has more than {max_entries} entries (--max-entries)"
                )));
            }
            inodes.push(self.fuse_ino(ino));
            Ok(())
        })?;
        let mut frozen = self.frozen.lock().expect("frozen lock");
        if inodes.iter().any(|i| frozen.contains(i)) {
            return Err(FsError::Busy);
        }
        frozen.extend(inodes.iter().copied());
        let copied_from = {
            let sources = self.copied_from.lock().expect("copied lock");
            inodes
                .iter()
                .filter_map(|i| sources.get(i).cloned())
                .chain(forked_from.as_ref().map(|(id, _)| id.clone()))
                .collect()
        };
        Ok(Frozen {
            name: name.to_vec(),
            dir,
            inodes,
            copied_from,
            forked: forked_from.map(|(_, records)| records),
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
            self.park_known(&frozen)?;
            let pins: Vec<_> = frozen
                .inodes
                .iter()
                .map(|&ino| self.pin_if_known(ino))
                .collect();
            beneath::remove_at(&*self.root_fd, name)?;
            pins.into_iter().for_each(Pin::keep);
            Ok(())
        })();
        if result.is_ok() {
            if let Some(&dir) = frozen.inodes.first() {
                self.forget_fork(dir);
            }
            let mut copied_from = self.copied_from.lock().expect("copied lock");
            for ino in &frozen.inodes {
                self.files.forget(*ino);
                copied_from.remove(ino);
            }
        }
        self.thaw(frozen);
        result
    }
}

impl StagingTree {
    /// Parks each regular file of the sealed workspace that the kernel still knows,
    /// by no name outside the workspace (see `files.rs`): the workspace is about to be
    /// deleted, and a process may hold such a file open.
    fn park_known(&self, frozen: &Frozen) -> std::io::Result<()> {
        let inside: HashSet<u64> = frozen.inodes.iter().copied().collect();
        walk(&frozen.dir, &mut |dir, name, backing_ino, kind| {
            if kind != rfs::FileType::RegularFile {
                return Ok(());
            }
            let ino = self.fuse_ino(backing_ino);
            let mut known = self.known.lock().expect("staging lock");
            let Some(entry) = known.get_mut(&ino) else {
                return Ok(());
            };
            let only_inside = match &entry.place {
                Place::Links(links) => links.iter().all(|(parent, _)| inside.contains(parent)),
                _ => false,
            };
            if only_inside && self.link_parked(dir, OsStr::from_bytes(name), ino) {
                entry.place = Place::Parked;
            }
            Ok(())
        })
        .map_err(|e| match e {
            FsError::Os(e) => e,
            other => std::io::Error::other(other.to_string()),
        })
    }
}

/// Calls `add` with the inode number of `dir` and of everything below it.
fn for_each_inode(
    dir: &OwnedFd,
    add: &mut dyn FnMut(u64) -> Result<(), FsError>,
) -> Result<(), FsError> {
    add(rfs::fstat(dir).map_err(os)?.st_ino)?;
    walk(dir, &mut |_, _, ino, _| add(ino))
}

/// What [`walk`] calls with each entry: the directory it is in, its name, its inode
/// number and its kind. An error stops the walk.
type Visit<'a> = dyn FnMut(BorrowedFd<'_>, &[u8], u64, rfs::FileType) -> Result<(), FsError> + 'a;

/// Calls `visit` with each entry below `dir`, entering directories through
/// descriptors only, one at a time (see [`beneath::Descent`]): a tree of any depth is
/// walked without exhausting the stack or the open files.
fn walk(dir: &OwnedFd, visit: &mut Visit<'_>) -> Result<(), FsError> {
    let top = beneath::open_dir(dir, OsStr::new(".")).map_err(FsError::Os)?;
    let mut walk = beneath::Descent::new(top);
    // Per level, the subdirectories still to enter.
    let mut pending: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut subdirs = list_entries(walk.dir(), visit)?;
    loop {
        match subdirs.pop() {
            Some(name) => {
                walk.enter(OsStr::from_bytes(&name)).map_err(FsError::Os)?;
                pending.push(std::mem::take(&mut subdirs));
                subdirs = list_entries(walk.dir(), visit)?;
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

/// Calls `visit` with each entry of `dir`; returns the names of its subdirectories.
fn list_entries(dir: BorrowedFd<'_>, visit: &mut Visit<'_>) -> Result<Vec<Vec<u8>>, FsError> {
    let mut subdirs = Vec::new();
    beneath::for_each_entry(dir, FsError::Os, |name, ino, kind| {
        visit(dir, name, ino, kind)?;
        if kind == rfs::FileType::Directory {
            subdirs.push(name.to_vec());
        }
        Ok(())
    })?;
    Ok(subdirs)
}
