//! Forks: an empty workspace filled by the daemon from a verified checkpoint, in one
//! request (`ckptfs fork`: `mkdir staging/NAME`, then a `setxattr` on it), instead of
//! the eight or so round trips per file a `cp -a` into the mount makes.
//!
//! Invariants:
//! - the tree is built in the graveyard, which nothing but the daemon reaches, and
//!   its top-level names are moved into the workspace once it is whole, while the
//!   kernel holds the workspace's lock for the request: no one sees a half-made tree,
//!   and a failure (a full disk) leaves the workspace empty and the graveyard clean;
//! - every byte comes from the checkpoint's verified cache files, copied by the kernel
//!   (`copy_file_range`: a reflink where the filesystem has them), on up to
//!   [`FILLERS`] threads; the cache is only read, so a write to a forked file never
//!   reaches the checkpoint; a fork holds at most [`FILL_QUEUE`] + [`FILLERS`]
//!   descriptors of files being filled;
//! - every entry is made new (`O_EXCL`, `mkdirat`, `symlinkat`, `linkat` of a file the
//!   fork made) in a directory the fork made, by a name from the verified index, and
//!   nothing is followed; the walk holds a few descriptors whatever the depth
//!   ([`beneath::Descent`]), and memory per hard-linked file, not per link;
//! - entries get the modes and times the checkpoint shows; when the daemon runs as
//!   root, the owners it shows for a root caller (as `cp -a` by root gives them), the
//!   caller's for anyone else; the daemon's own user's otherwise. The workspace's own
//!   directory is left as its maker made it, but for the mode of a checkpoint's root
//!   that keeps others out (a 0700 workspace), which it gets;
//! - a caller other than root and the daemon's own user forks only a checkpoint whose
//!   every directory it could list and search and whose every file it could read
//!   through the mount, under the owners and modes shown ([`may_copy_all`]): the
//!   daemon reads the cache as itself,
//!   and gives the copies to the caller, so without this check a fork would hand
//!   anyone on an `--allow-other` mount the files its permissions keep from them.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, RenameFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::{Caller, StagingTree, generation, os};
use crate::archive::index::{FileLocation, Index, Node, NodeKind};
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
#[derive(Debug)]
pub struct Forked {
    /// Entries made in the workspace.
    pub entries: u64,
    /// Bytes of regular files copied.
    pub bytes: u64,
    /// The workspace, open, for recording what a capture of it sees (see
    /// `crate::fs::forker`), under `records`.
    pub workspace: OwnedFd,
    pub records: [u8; 32],
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
    /// Fills the empty workspace directory `ino` (a name of `staging/` itself) for
    /// `caller` with the files of `checkpoint` (see the module comment), whose entries
    /// are shown as owned by `shown` if given. Returns what it made and the names it
    /// put in the workspace, which the kernel may remember as absent.
    pub fn fork(
        &self,
        ino: u64,
        checkpoint: &VerifiedCheckpoint,
        caller: Caller,
        (shown, shared): (Option<(u32, u32)>, bool),
    ) -> Result<(Forked, Vec<Vec<u8>>), FsError> {
        let owners = ForkOwners {
            can_chown: self.can_chown,
            caller,
            shown,
        };
        // The daemon's own user may read its cache directly; anyone else gets only
        // what the mount would let them read.
        if caller.uid != rustix::process::geteuid().as_raw() {
            may_copy_all(&checkpoint.index, caller, shown, shared)?;
        }
        let workspace = self.empty_workspace(ino)?;
        // Only into a workspace of the caller's own: a fork gives the workspace the
        // checkpoint's root mode, which only its owner may choose (another user may
        // set the attribute on a workspace whose mode lets them write it).
        let owner = rfs::fstat(&workspace).map_err(os)?.st_uid;
        if self.can_chown && caller.uid != 0 && owner != caller.uid {
            crate::fs::forker::log_refusal(
                "fork refused: the workspace is another user's",
                &format!("uid {}", caller.uid),
            );
            return Err(FsError::NotPermitted(
                "a fork fills a workspace of its caller's own",
            ));
        }
        let root = checkpoint.index.node(0).ok_or(FsError::NotADirectory)?;
        let NodeKind::Dir { children } = &root.kind else {
            return Err(FsError::NotADirectory);
        };
        let n = NEXT_FORK.fetch_add(1, Ordering::Relaxed);
        let (temp, links) = (format!("fork-{n}"), format!("fork-{n}-links"));
        let (temp, links) = (OsStr::new(&temp), OsStr::new(&links));
        let built = (|| {
            for dir in [temp, links] {
                rfs::mkdirat(&*self.graveyard, dir, Mode::from_raw_mode(0o700)).map_err(os)?;
            }
            let top = beneath::open_dir(&*self.graveyard, temp).map_err(FsError::Os)?;
            let links = beneath::open_dir(&*self.graveyard, links).map_err(FsError::Os)?;
            build(&top, &links, checkpoint, owners).map(|built| (top, built))
        })();
        let moved = built.and_then(|(top, (entries, bytes, top_dirs))| {
            let _changing = self.changing();
            self.check_not_frozen(ino)?;
            move_in(&top, &workspace, children)?;
            // Moved first: a directory its owner cannot write cannot move to another
            // parent (its `..` changes), for a daemon that is not root.
            for (name, node) in top_dirs {
                let node = checkpoint.index.node(node).ok_or(FsError::NotFound)?;
                set_dir_attrs(workspace.as_fd(), OsStr::from_bytes(name), node, owners)
                    .map_err(FsError::Os)?;
            }
            // A checkpoint kept private by its own directory stays so: the workspace
            // gets that directory's mode (see `crate::fs::checkpoints::shown_perm`).
            if !crate::fs::checkpoints::is_open(root) {
                rfs::fchmod(&workspace, Mode::from_raw_mode(root.mode & 0o1777)).map_err(os)?;
            }
            Ok((entries, bytes))
        });
        for dir in [temp, links] {
            if let Err(e) = beneath::remove_at(&*self.graveyard, dir) {
                tracing::warn!(error = %e, "cannot remove a fork's scratch; it goes at the next start");
            }
        }
        let (entries, bytes) = moved?;
        let stat = rfs::fstat(&workspace).map_err(os)?;
        let mut forked = self.forked.lock().expect("forked lock");
        if forked.len() >= FORKS_REMEMBERED
            && let Some(&some) = forked.keys().next()
        {
            forked.remove(&some);
        }
        let made = generation(&workspace, &stat);
        forked.insert(ino, (made, checkpoint.id.clone()));
        let names = children.iter().map(|(name, _)| name.clone()).collect();
        let records = records_key(&stat, made);
        Ok((
            Forked {
                entries,
                bytes,
                workspace,
                records,
            },
            names,
        ))
    }

    /// Workspace directory `ino`, opened, if it is a name of `staging/` itself, not
    /// being sealed, and empty.
    fn empty_workspace(&self, ino: u64) -> Result<OwnedFd, FsError> {
        let top_level = matches!(
            self.known.lock().expect("staging lock").get(&ino),
            Some(super::Known { place: super::Place::Dir { parent, .. }, .. })
                if *parent == crate::fs::inode::STAGING
        );
        if !top_level {
            crate::fs::forker::log_refusal(
                "fork refused: forks make workspaces, directories of staging/ itself",
                "",
            );
            return Err(FsError::InvalidArgument);
        }
        self.check_not_frozen(ino)?;
        let fd = self.fd(ino)?;
        let workspace = beneath::open_dir(&*fd, OsStr::new(".")).map_err(FsError::Os)?;
        if !beneath::list(&workspace).map_err(FsError::Os)?.is_empty() {
            return Err(FsError::Os(std::io::Error::from_raw_os_error(
                libc::ENOTEMPTY,
            )));
        }
        Ok(workspace)
    }

    /// The checkpoint workspace directory `dir` (described by `stat`) was forked
    /// from, if it was, and is still the very directory filled then.
    /// With the key of the records of its capture ([`Forked::records`]).
    pub(super) fn forked_from(
        &self,
        dir: &OwnedFd,
        stat: &rfs::Stat,
    ) -> Option<(CheckpointId, [u8; 32])> {
        let forked = self.forked.lock().expect("forked lock");
        let (made, id) = forked.get(&self.fuse_ino(stat.st_ino))?;
        let now = generation(dir, stat);
        (*made == now).then(|| (id.clone(), records_key(stat, now)))
    }

    /// Forgets the fork record of workspace directory `ino` (sealed or removed).
    pub(super) fn forget_fork(&self, ino: u64) {
        self.forked.lock().expect("forked lock").remove(&ino);
    }
}

/// Whether `caller` could copy every entry of `index` through the mount, as `cp -a`
/// run by that user would: list and search every directory, read every file, under
/// the owners the mount shows (`shown`, or each entry's own) and the entries' modes.
/// Root may. The class of bits is chosen as the kernel chooses it: the owner's, else
/// the group's for a caller in the entry's group (its primary group, or one of its
/// supplementary groups, read from `/proc`: a FUSE request carries only the first),
/// else the others'; where the supplementary groups cannot be known (a caller in
/// another PID namespace), only what both the group's and the others' bits allow.
/// So an entry that shuts its group out (`0604`) is not forked for its members.
/// The checkpoint's own directory counts, with the bits the mount shows for each
/// entry ([`crate::fs::checkpoints::shown_perm`]). Refused with `EACCES`, the first
/// entry refused logged.
pub(crate) fn may_copy_all(
    index: &Index,
    caller: Caller,
    shown: Option<(u32, u32)>,
    shared: bool,
) -> Result<(), FsError> {
    if caller.uid == 0 {
        return Ok(());
    }
    let root = index
        .node(crate::archive::index::ROOT)
        .ok_or(FsError::NotFound)?;
    let groups = crate::fs::checkpoints::supplementary_groups(caller.pid);
    let may = |node: &Node, need: u32| {
        let (uid, gid) = shown.unwrap_or((node.uid, node.gid));
        let mode = crate::fs::checkpoints::shown_perm(root, node, shown, shared);
        let bits = if uid == caller.uid {
            mode >> 6
        } else if gid == caller.gid {
            mode >> 3
        } else {
            match &groups {
                Some(groups) if groups.contains(&gid) => mode >> 3,
                Some(_) => mode,
                // Groups unknown: only what both classes allow.
                None => (mode >> 3) & mode,
            }
        } & 0o7;
        bits & need == need
    };
    if !may(root, 0o5) {
        crate::fs::forker::log_refusal(
            "fork refused: the caller may not read every entry of the checkpoint",
            &format!(
                "uid {} may not read the checkpoint's own directory",
                caller.uid
            ),
        );
        return Err(FsError::Os(std::io::Error::from_raw_os_error(libc::EACCES)));
    }
    // (directory, next child), from the root down, and the names on the way.
    let mut stack: Vec<(u32, usize)> = vec![(crate::archive::index::ROOT, 0)];
    let mut path: Vec<&[u8]> = Vec::new();
    while let Some(&mut (dir, ref mut next)) = stack.last_mut() {
        let Some(NodeKind::Dir { children }) = index.node(dir).map(|n| &n.kind) else {
            return Err(FsError::NotADirectory);
        };
        let Some((name, child)) = children.get(*next) else {
            stack.pop();
            path.pop();
            continue;
        };
        *next += 1;
        let node = index.node(*child).ok_or(FsError::NotFound)?;
        let allowed = match &node.kind {
            NodeKind::Dir { .. } => may(node, 0o5),
            NodeKind::File { .. } => may(node, 0o4),
            NodeKind::Symlink { .. } => true,
        };
        if !allowed {
            path.push(name);
            crate::fs::forker::log_refusal(
                "fork refused: the caller may not read every entry of the checkpoint",
                &format!(
                    "uid {} may not read {}",
                    caller.uid,
                    crate::printable::escape(&path.join(&b'/'))
                ),
            );
            return Err(FsError::Os(std::io::Error::from_raw_os_error(libc::EACCES)));
        }
        if matches!(node.kind, NodeKind::Dir { .. }) {
            path.push(name);
            stack.push((*child, 0));
        }
    }
    Ok(())
}

/// Names the records a capture of a forked workspace keeps (see
/// `crate::members::tree`): by the directory itself, which keeps them across renames
/// within `staging/`, and not past its removal.
fn records_key(stat: &rfs::Stat, generation: u32) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut key = Sha256::new();
    key.update(b"ckptfs forked workspace\0");
    key.update(stat.st_dev.to_le_bytes());
    key.update(stat.st_ino.to_le_bytes());
    key.update(generation.to_le_bytes());
    key.finalize().into()
}

/// Moves the built tree's top-level `names` from `top` (in the graveyard) into the
/// workspace; on a failure, moves back what it moved. The kernel holds the
/// workspace's lock while the fork's request waits, so nothing is made in it
/// meanwhile through the mount.
fn move_in(top: &OwnedFd, workspace: &OwnedFd, names: &[(Vec<u8>, u32)]) -> Result<(), FsError> {
    for (done, (name, _)) in names.iter().enumerate() {
        let name = OsStr::from_bytes(name);
        if let Err(e) = rfs::renameat_with(top, name, workspace, name, RenameFlags::NOREPLACE) {
            for (back, _) in &names[..done] {
                let back = OsStr::from_bytes(back);
                let _ = rfs::renameat_with(workspace, back, top, back, RenameFlags::NOREPLACE);
            }
            return Err(match e {
                Errno::EXIST => FsError::Os(std::io::Error::from_raw_os_error(libc::ENOTEMPTY)),
                e => os(e),
            });
        }
    }
    Ok(())
}

/// Entries made, bytes copied, and the top-level directories (name, node).
type Built<'a> = (u64, u64, Vec<(&'a [u8], u32)>);

/// Makes the tree of `checkpoint`'s root in `top`, depth first; returns the entries
/// made, the bytes copied, and the top-level directories, whose attributes are for the
/// caller to set once they are moved. A directory gets its attributes once its
/// children are made, so that neither a read-only mode nor the new entries' own
/// `mtime` changes get in the way. The first name of a file with several links is
/// also linked into `links` by its node number, and its other names are made from
/// there: a name a directory away costs neither memory for its path nor opening that
/// path again. The walk makes each file empty and hands it to up to [`FILLERS`]
/// threads, which copy its bytes and set its attributes on its descriptor (so a
/// directory made read-only meanwhile does not stop them, and writing a file leaves
/// its directory's `mtime` as set); they are all done, or the fork failed with the
/// first error, when this returns.
fn build<'a>(
    top: &OwnedFd,
    links: &OwnedFd,
    checkpoint: &'a VerifiedCheckpoint,
    owners: ForkOwners,
) -> Result<Built<'a>, FsError> {
    let fillers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(FILLERS);
    if fillers < 2 {
        return make_tree(top, links, checkpoint, owners, &mut |job| {
            job.fill(checkpoint, owners)
        });
    }
    let (queue, jobs) = std::sync::mpsc::sync_channel::<Fill<'a>>(FILL_QUEUE);
    let jobs = std::sync::Mutex::new(jobs);
    let failed: std::sync::Mutex<Option<FsError>> = std::sync::Mutex::new(None);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let walked = std::thread::scope(|scope| {
        for _ in 0..fillers {
            scope.spawn(|| {
                loop {
                    // The lock is held while waiting, by one filler at a time.
                    let Ok(job) = jobs.lock().expect("fill queue lock").recv() else {
                        return;
                    };
                    if stop.load(Ordering::Relaxed) {
                        continue; // dropped: the fork failed, its tree goes
                    }
                    if let Err(e) = job.fill(checkpoint, owners) {
                        stop.store(true, Ordering::Relaxed);
                        failed.lock().expect("fill error lock").get_or_insert(e);
                    }
                }
            });
        }
        let walked = make_tree(top, links, checkpoint, owners, &mut |job| {
            if stop.load(Ordering::Relaxed) {
                return Err(FsError::Busy); // a filler failed; its error is the fork's
            }
            queue
                .send(job)
                .map_err(|_| FsError::Os(std::io::Error::other("the fork's fillers stopped")))
        });
        if walked.is_err() {
            stop.store(true, Ordering::Relaxed); // what is queued is not filled
        }
        drop(queue);
        walked
    });
    match failed.into_inner().expect("fill error lock") {
        Some(e) => Err(e),
        None => walked,
    }
}

/// Threads that fill a fork's files at most: writing into new page-cache pages costs
/// each CPU its share (a 300 MiB tree copied by two `cp -a` at once took 0.6 of the
/// time of one, by hand).
const FILLERS: usize = 4;

/// Files made and waiting for a filler at most (each holds a descriptor).
const FILL_QUEUE: usize = 64;

/// A file the walk made, empty, for a filler to fill: its bytes, copied by the kernel
/// from the cache, then its owner, mode and times, all on its descriptor.
struct Fill<'a> {
    file: File,
    node_index: u32,
    size: u64,
    location: FileLocation,
    node: &'a Node,
}

impl Fill<'_> {
    fn fill(self, checkpoint: &VerifiedCheckpoint, owners: ForkOwners) -> Result<(), FsError> {
        let own;
        let (source, from) = match self.location {
            FileLocation::Own => {
                own = checkpoint
                    .open_own(self.node_index)
                    .map_err(FsError::CacheRead)?;
                (&own, 0)
            }
            FileLocation::Packed { offset } => (checkpoint.pack(), offset),
        };
        copy_range(source, from, &self.file, self.size)?;
        if let Some(owner) = owners.of(self.node) {
            let (uid, gid) = uid_gid(owner);
            rfs::fchown(&self.file, Some(uid), Some(gid)).map_err(os)?;
        }
        rfs::fchmod(&self.file, Mode::from_raw_mode(self.node.mode & 0o7777)).map_err(os)?;
        rfs::futimens(&self.file, &times(self.node)).map_err(os)
    }
}

/// [`build`]'s walk, which makes every entry and hands each new file, empty, to
/// `fill`.
fn make_tree<'a>(
    top: &OwnedFd,
    links: &OwnedFd,
    checkpoint: &'a VerifiedCheckpoint,
    owners: ForkOwners,
    fill: &mut dyn FnMut(Fill<'a>) -> Result<(), FsError>,
) -> Result<Built<'a>, FsError> {
    let index = &checkpoint.index;
    let mut walk =
        beneath::Descent::new(beneath::open_dir(top, OsStr::new(".")).map_err(FsError::Os)?);
    // (directory node, next child), from the root down to where the walk is.
    let mut stack: Vec<(u32, usize)> = vec![(0, 0)];
    let mut path: Vec<&[u8]> = Vec::new();
    let mut linked: HashSet<u32> = HashSet::new();
    let mut top_dirs = Vec::new();
    let (mut entries, mut bytes) = (0u64, 0u64);
    while let Some(&mut (dir, ref mut next)) = stack.last_mut() {
        let Some(NodeKind::Dir { children }) = index.node(dir).map(|n| &n.kind) else {
            return Err(FsError::NotADirectory);
        };
        let Some((name, child)) = children.get(*next) else {
            stack.pop();
            if let Some(name) = path.pop() {
                walk.leave().map_err(FsError::Os)?;
                if path.is_empty() {
                    top_dirs.push((name, dir));
                } else {
                    let node = index.node(dir).ok_or(FsError::NotFound)?;
                    set_dir_attrs(walk.dir(), OsStr::from_bytes(name), node, owners)
                        .map_err(FsError::Os)?;
                }
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
        let link_name = child.to_string();
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
            NodeKind::File { .. } if node.nlink > 1 && linked.contains(child) => {
                rfs::linkat(links, link_name.as_str(), at, c_name, AtFlags::empty()).map_err(os)?;
            }
            NodeKind::File { size, location, .. } => {
                let file: File = rfs::openat(
                    at,
                    c_name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(os)?
                .into();
                bytes += size;
                fill(Fill {
                    file,
                    node_index: *child,
                    size: *size,
                    location: *location,
                    node,
                })?;
                if node.nlink > 1 {
                    rfs::linkat(at, c_name, links, link_name.as_str(), AtFlags::empty())
                        .map_err(os)?;
                    linked.insert(*child);
                }
            }
        }
    }
    Ok((entries, bytes, top_dirs))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(mode: u32, uid: u32, gid: u32, kind: NodeKind) -> Node {
        Node::for_test(mode, uid, gid, kind)
    }

    fn file() -> NodeKind {
        NodeKind::File {
            size: 0,
            location: FileLocation::Own,
            checksum: 0,
        }
    }

    /// A root holding `dir/` (mode `dir_mode`, owned by 1:1) with `f` in it (mode
    /// `file_mode`, owned by 1:1), and a symlink no one can read.
    fn index(dir_mode: u32, file_mode: u32) -> Index {
        let dir = NodeKind::Dir {
            children: vec![(b"f".to_vec(), 2)],
        };
        let root = NodeKind::Dir {
            children: vec![(b"dir".to_vec(), 1), (b"link".to_vec(), 3)],
        };
        let link = NodeKind::Symlink {
            target: b"/etc/shadow".to_vec(),
        };
        Index {
            nodes: vec![
                node(0o755, 0, 0, root),
                node(dir_mode, 1, 1, dir),
                node(file_mode, 1, 1, file()),
                node(0o000, 0, 0, link),
            ],
            unpacked_bytes: 0,
        }
    }

    fn may(index: &Index, uid: u32, gid: u32, shown: Option<(u32, u32)>) -> bool {
        may_copy_all(index, Caller { uid, gid, pid: 0 }, shown, true).is_ok()
    }

    /// The group's bits for a caller in the entry's group through a supplementary
    /// group (read from `/proc` for the calling process), even where the others'
    /// would allow more: a `0604` file of that group was forked for its members,
    /// whom the mount refuses.
    #[test]
    fn a_fork_judges_supplementary_groups_as_the_kernel_does() {
        // A caller with a supplementary group: a process that setpriv gives group
        // 4242 (root may; others skip).
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let mut member = std::process::Command::new("setpriv")
            .args(["--reuid=7", "--regid=7", "--groups=4242", "sleep", "30"])
            .spawn()
            .expect("setpriv");
        let pid = member.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while crate::fs::checkpoints::supplementary_groups(pid) != Some(vec![4242]) {
            assert!(
                std::time::Instant::now() < deadline,
                "no group 4242 on {pid}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let caller = Caller {
            uid: 7,
            gid: 7,
            pid,
        };
        let with_group = |gid: u32, file_mode: u32| {
            let mut tree = index(0o755, file_mode);
            tree.nodes[2].gid = gid;
            tree
        };
        let verdicts = [
            may_copy_all(&with_group(4242, 0o604), caller, None, true).is_ok(),
            may_copy_all(&with_group(4242, 0o640), caller, None, true).is_ok(),
            may_copy_all(&with_group(4343, 0o604), caller, None, true).is_ok(),
        ];
        let _ = member.kill();
        let _ = member.wait();
        assert_eq!(
            verdicts,
            [false, true, true],
            "group 4242's 0604 file refused to its member, 0640 given, another group's 0604 given"
        );
    }

    #[test]
    fn a_fork_takes_only_what_its_caller_could_copy() {
        let open = index(0o755, 0o644);
        assert!(may(&open, 7, 7, None), "others may read and search");
        // A file only its owner may read, a directory only its owner may enter.
        for closed in [
            index(0o755, 0o600),
            index(0o700, 0o644),
            index(0o711, 0o644),
        ] {
            assert!(!may(&closed, 7, 7, None));
            assert!(may(&closed, 1, 7, None), "the owner may");
            assert!(may(&closed, 0, 0, None), "root may");
        }
        // The class is the kernel's: the owner's bits alone for the owner, then the
        // group's for the group, even where others' would allow more.
        assert!(!may(&index(0o755, 0o044), 1, 1, None));
        assert!(!may(&index(0o755, 0o604), 7, 1, None));
        assert!(may(&index(0o755, 0o640), 7, 1, None));
        // A caller whose supplementary groups cannot be known: only what both the
        // group's and the others' bits allow (it may be in the entry's group).
        assert!(!may(&index(0o755, 0o604), 7, 7, None));
        assert!(may(&index(0o755, 0o644), 7, 7, None));
        // Every entry shown as owned by one user: that user's bits.
        assert!(may(&index(0o700, 0o600), 7, 7, Some((7, 7))));
        assert!(!may(&index(0o700, 0o600), 1, 1, Some((7, 7))));
        // The checkpoint's own directory counts: a workspace only its owner could
        // enter forks for that owner alone, whatever its files' own modes.
        let mut private = index(0o755, 0o644);
        (
            private.nodes[0].mode,
            private.nodes[0].uid,
            private.nodes[0].gid,
        ) = (0o700, 1, 1);
        assert!(!may(&private, 7, 7, None));
        assert!(
            !may(&private, 7, 1, None),
            "the root's group may not enter it either"
        );
        assert!(may(&private, 1, 1, None));
    }
}
