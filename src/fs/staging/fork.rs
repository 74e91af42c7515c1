//! Forks: a workspace made in `staging/` from a verified checkpoint by the daemon, in
//! one request (`ckptfs fork`, a `setxattr` on `staging/`), instead of the eight or so
//! round trips per file a `cp -a` into the mount makes.
//!
//! Invariants:
//! - the tree is built in a directory of the graveyard, which nothing but the daemon
//!   reaches, and appears under its name in one `rename` that replaces nothing: no one
//!   sees a half-made workspace, and a failure (a full disk) leaves nothing behind;
//! - every byte comes from the checkpoint's verified cache files, copied by the kernel
//!   (`copy_file_range`: a reflink where the filesystem has them); the cache is only
//!   read, so a write to a forked file never reaches the checkpoint;
//! - every entry is made new (`O_EXCL`, `mkdirat`, `symlinkat`) in a directory the fork
//!   made, by a name from the verified index, and nothing is followed; the walk holds
//!   one descriptor whatever the depth ([`beneath::Descent`]);
//! - entries get the modes and times the checkpoint shows; when the daemon runs as
//!   root, the owners it shows for a root caller (as `cp -a` by root gives them), the
//!   caller's for anyone else; the daemon's own user's otherwise. The workspace's own
//!   directory is the caller's, made now, with the mode of the archive's root.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, RenameFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::{Caller, StagingTree, generation, os};
use crate::archive::index::{FileLocation, Node, NodeKind};
use crate::beneath;
use crate::cache::VerifiedCheckpoint;
use crate::checkpoint::CheckpointId;
use crate::fs::error::FsError;

/// Forked workspaces remembered at most (for their parent, see
/// [`StagingTree::forked_from`]); past this the record of an arbitrary one is dropped,
/// and its seal names no parent.
const FORKS_REMEMBERED: usize = 4096;

/// Names the directories forks are built in, in the graveyard; never hex alone, so
/// never a parked file's name.
static NEXT_FORK: AtomicU64 = AtomicU64::new(0);

/// The buffer of a copy the kernel cannot make between two filesystems.
const COPY_BUFFER: usize = 256 << 10;

/// What a fork made.
#[derive(Debug, Clone, Copy)]
pub struct Forked {
    /// The workspace's FUSE inode.
    pub ino: u64,
    /// Entries made, the workspace's own directory included.
    pub entries: u64,
    /// Bytes of regular files copied.
    pub bytes: u64,
}

/// Whose files a fork makes (see the module comment).
#[derive(Debug, Clone, Copy)]
struct ForkOwners {
    /// The daemon can give files away (it runs as root).
    can_chown: bool,
    caller: Caller,
    /// The owner every checkpoint entry is shown with, if one is.
    shown: Option<(u32, u32)>,
}

impl ForkOwners {
    fn of(&self, node: &Node) -> Option<(u32, u32)> {
        if !self.can_chown {
            None
        } else if self.caller.uid == 0 {
            Some(self.shown.unwrap_or((node.uid, node.gid)))
        } else {
            Some((self.caller.uid, self.caller.gid))
        }
    }
}

impl StagingTree {
    /// Makes workspace `staging/NAME` for `caller`, holding the files of `checkpoint`
    /// (see the module comment), whose entries are shown as owned by `shown` if
    /// given. Fails with `EEXIST` if `NAME` is there already.
    pub fn fork(
        &self,
        name: &[u8],
        checkpoint: &VerifiedCheckpoint,
        caller: Caller,
        shown: Option<(u32, u32)>,
    ) -> Result<Forked, FsError> {
        let owners = ForkOwners {
            can_chown: self.can_chown,
            caller,
            shown,
        };
        self.not_graveyard(crate::fs::inode::STAGING, name)?;
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(FsError::InvalidArgument);
        }
        let root = checkpoint.index.node(0).ok_or(FsError::NotADirectory)?;
        let temp = format!("fork-{}", NEXT_FORK.fetch_add(1, Ordering::Relaxed));
        let temp = OsStr::new(&temp);
        rfs::mkdirat(&*self.graveyard, temp, Mode::from_raw_mode(0o700)).map_err(os)?;
        let built = beneath::open_dir(&*self.graveyard, temp)
            .map_err(FsError::Os)
            .and_then(|top| {
                let (entries, bytes) = build(&top, checkpoint, owners)?;
                Ok((top, entries, bytes))
            });
        let (top, entries, bytes) = match built {
            Ok(built) => built,
            Err(e) => {
                self.discard(temp);
                return Err(e);
            }
        };
        {
            let _changing = self.changing();
            if let Err(e) = rfs::renameat_with(
                &*self.graveyard,
                temp,
                &*self.root_fd,
                OsStr::from_bytes(name),
                RenameFlags::NOREPLACE,
            ) {
                drop(_changing);
                self.discard(temp);
                return Err(match e {
                    rustix::io::Errno::EXIST => FsError::Exists,
                    e => os(e),
                });
            }
        }
        // After the move: a directory another user cannot write cannot be moved into
        // another directory (its `..` changes) by a daemon that is not root.
        set_root_attrs(&top, root, owners).map_err(FsError::Os)?;
        let stat = rfs::fstat(&top).map_err(os)?;
        let ino = self.fuse_ino(stat.st_ino);
        let mut forked = self.forked.lock().expect("forked lock");
        if forked.len() >= FORKS_REMEMBERED
            && let Some(&some) = forked.keys().next()
        {
            forked.remove(&some);
        }
        forked.insert(ino, (generation(&top, &stat), checkpoint.id.clone()));
        Ok(Forked {
            ino,
            entries: entries + 1,
            bytes,
        })
    }

    /// The checkpoint workspace directory `dir` (described by `stat`) was forked
    /// from, if it was, and is still the very directory made then.
    pub(super) fn forked_from(&self, dir: &OwnedFd, stat: &rfs::Stat) -> Option<CheckpointId> {
        let forked = self.forked.lock().expect("forked lock");
        let (made, id) = forked.get(&self.fuse_ino(stat.st_ino))?;
        (*made == generation(dir, stat)).then(|| id.clone())
    }

    /// Forgets the fork record of workspace directory `ino` (sealed or removed).
    pub(super) fn forget_fork(&self, ino: u64) {
        self.forked.lock().expect("forked lock").remove(&ino);
    }

    fn discard(&self, temp: &OsStr) {
        if let Err(e) = beneath::remove_at(&*self.graveyard, temp) {
            tracing::warn!(error = %e, "cannot remove a failed fork; it goes at the next start");
        }
    }
}

/// Makes the children of `checkpoint`'s root in `top`, depth first; returns the
/// entries made and the bytes copied. A directory gets its attributes once its
/// children are made, so that neither a read-only mode nor the new entries' own
/// `mtime` changes get in the way.
fn build(
    top: &OwnedFd,
    checkpoint: &VerifiedCheckpoint,
    owners: ForkOwners,
) -> Result<(u64, u64), FsError> {
    let index = &checkpoint.index;
    let mut walk =
        beneath::Descent::new(beneath::open_dir(top, OsStr::new(".")).map_err(FsError::Os)?);
    // (directory node, next child), from the root down to where the walk is.
    let mut stack: Vec<(u32, usize)> = vec![(0, 0)];
    let mut path: Vec<&[u8]> = Vec::new();
    // Where the first name of each file with several links was made.
    let mut first_links: HashMap<u32, (Vec<Vec<u8>>, Vec<u8>)> = HashMap::new();
    let (mut entries, mut bytes) = (0u64, 0u64);
    while let Some(&mut (dir, ref mut next)) = stack.last_mut() {
        let Some(NodeKind::Dir { children }) = index.node(dir).map(|n| &n.kind) else {
            return Err(FsError::NotADirectory);
        };
        let Some((name, child)) = children.get(*next) else {
            stack.pop();
            if let Some(name) = path.pop() {
                walk.leave().map_err(FsError::Os)?;
                let node = index.node(dir).ok_or(FsError::NotFound)?;
                set_dir_attrs(walk.dir(), OsStr::from_bytes(name), node, owners)
                    .map_err(FsError::Os)?;
            }
            continue;
        };
        *next += 1;
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(FsError::InvalidArgument);
        }
        let node = index.node(*child).ok_or(FsError::NotFound)?;
        let c_name = OsStr::from_bytes(name);
        let at = walk.dir();
        entries += 1;
        match &node.kind {
            NodeKind::Dir { .. } => {
                rfs::mkdirat(at, c_name, Mode::from_raw_mode(0o700)).map_err(os)?;
                walk.enter(c_name).map_err(FsError::Os)?;
                path.push(name);
                stack.push((*child, 0));
            }
            NodeKind::Symlink { target } => {
                rfs::symlinkat(OsStr::from_bytes(target), at, c_name).map_err(os)?;
                set_owner_and_times(at, c_name, node, owners).map_err(FsError::Os)?;
            }
            NodeKind::File { .. } if node.nlink > 1 && first_links.contains_key(child) => {
                let (dir_path, first) = &first_links[child];
                let parts: Vec<&[u8]> = dir_path.iter().map(Vec::as_slice).collect();
                let from = beneath::open_dir_path(top.as_fd(), &parts).map_err(FsError::Os)?;
                rfs::linkat(
                    &from,
                    OsStr::from_bytes(first),
                    at,
                    c_name,
                    AtFlags::empty(),
                )
                .map_err(os)?;
            }
            NodeKind::File { size, location, .. } => {
                bytes += copy_file(
                    at, c_name, checkpoint, *child, *size, *location, node, owners,
                )?;
                if node.nlink > 1 {
                    let dir_path = path.iter().map(|p| p.to_vec()).collect();
                    first_links.insert(*child, (dir_path, name.clone()));
                }
            }
        }
    }
    Ok((entries, bytes))
}

/// Makes file `name` in `dir` with the bytes of `node`, copied by the kernel from the
/// cache, and its attributes; returns its size.
#[allow(clippy::too_many_arguments)]
fn copy_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    checkpoint: &VerifiedCheckpoint,
    node_index: u32,
    size: u64,
    location: FileLocation,
    node: &Node,
    owners: ForkOwners,
) -> Result<u64, FsError> {
    let file: File = rfs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(os)?
    .into();
    let own;
    let (source, from) = match location {
        FileLocation::Own => {
            own = checkpoint
                .open_own(node_index)
                .map_err(FsError::CacheRead)?;
            (&own, 0)
        }
        FileLocation::Packed { offset } => (checkpoint.pack(), offset),
    };
    copy_range(source, from, &file, size)?;
    if let Some(owner) = owners.of(node) {
        let (uid, gid) = uid_gid(owner);
        rfs::fchown(&file, Some(uid), Some(gid)).map_err(os)?;
    }
    rfs::fchmod(&file, Mode::from_raw_mode(node.mode & 0o7777)).map_err(os)?;
    rfs::futimens(&file, &times(node)).map_err(os)?;
    Ok(size)
}

/// Copies `size` bytes of `source` from offset `from` to the start of the new file
/// `to`: in the kernel, or through a buffer between filesystems that do not copy to
/// each other (`EXDEV`: a staging directory on another disk than the cache).
fn copy_range(source: &File, mut from: u64, to: &File, size: u64) -> Result<(), FsError> {
    let short = || {
        FsError::CacheRead(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "a cache file is shorter than its checkpoint says",
        ))
    };
    let mut at = 0u64;
    while at < size {
        let want = (size - at).min(1 << 30) as usize;
        match rfs::copy_file_range(source, Some(&mut from), to, Some(&mut at), want) {
            Ok(0) => return Err(short()),
            Ok(_) => {}
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) if at == 0 => {
                break;
            }
            Err(e) => return Err(os(e)),
        }
    }
    let mut buffer = vec![0u8; COPY_BUFFER.min(size.saturating_sub(at) as usize)];
    while at < size {
        let want = buffer.len().min((size - at) as usize);
        let n = source
            .read_at(&mut buffer[..want], from)
            .map_err(FsError::CacheRead)?;
        if n == 0 {
            return Err(short());
        }
        to.write_all_at(&buffer[..n], at).map_err(FsError::Os)?;
        (from, at) = (from + n as u64, at + n as u64);
    }
    Ok(())
}

fn times(node: &Node) -> Timestamps {
    let at = Timespec {
        tv_sec: node.mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: at,
        last_modification: at,
    }
}

fn uid_gid((uid, gid): (u32, u32)) -> (rustix::fs::Uid, rustix::fs::Gid) {
    (
        rustix::process::Uid::from_raw(uid),
        rustix::process::Gid::from_raw(gid),
    )
}

/// Mode, owner and times of directory `name` in `dir`.
fn set_dir_attrs(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    node: &Node,
    owners: ForkOwners,
) -> std::io::Result<()> {
    beneath::chmod_at(dir, name, node.mode & 0o7777)?;
    set_owner_and_times(dir, name, node, owners)
}

/// The workspace's own directory: the caller's (when the daemon can give it away),
/// with the mode of the archive's root and the time it was made. The owner and time
/// of an archive's root are not part of a checkpoint (`put` does not store them), so
/// none is taken from it.
fn set_root_attrs(top: &OwnedFd, root: &Node, owners: ForkOwners) -> std::io::Result<()> {
    if owners.can_chown {
        let (uid, gid) = uid_gid((owners.caller.uid, owners.caller.gid));
        let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
        rfs::chownat(top, "", Some(uid), Some(gid), flags).map_err(std::io::Error::from)?;
    }
    beneath::chmod_opened(top, root.mode & 0o7777)
}

/// Owner and times of entry `name` in `dir`, never of what it points to (a
/// symlink has no mode of its own).
fn set_owner_and_times(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    node: &Node,
    owners: ForkOwners,
) -> std::io::Result<()> {
    if let Some(owner) = owners.of(node) {
        let (uid, gid) = uid_gid(owner);
        rfs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(std::io::Error::from)?;
    }
    rfs::utimensat(dir, name, &times(node), AtFlags::SYMLINK_NOFOLLOW).map_err(std::io::Error::from)
}
