//! Mounting a [`CheckpointFs`]: the FUSE session with ckptfs's mount options, and
//! nothing around it.
//!
//! Every mount is `nosuid,nodev,default_permissions` (the kernel checks permissions
//! against the attributes the filesystem reports), of type `fuse.ckptfs`, served by
//! `threads` request threads each with its own cloned `/dev/fuse` descriptor. The
//! core is connected to the kernel's caches (see [`super::KernelCache`]) before any
//! request is served.
//!
//! A root daemon mounts and unmounts by descriptor, never by path: whoever can write
//! a directory above the mount point could otherwise swap a path between a check and
//! `mount(2)` (and have root mount over any directory), or between the mount and
//! `umount(2)` (and have root unmount any mount). It opens the mount point once
//! ([`MountPoint`]), checks that very directory, mounts on it through
//! `/proc/self/fd`, and later unmounts the mount that its parent's descriptor and its
//! name lead to only if that is this session's (same device). Other users' daemons
//! mount and unmount through `fusermount3`, which may only touch their own mounts.
//!
//! What a process does around a mount (daemonising, signals, refreshing the listing,
//! choosing directories) is the command's, in `commands/mount.rs`; this module never
//! prints and never exits.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, StatxAttributes, StatxFlags};
use rustix::mount::{MountFlags, UnmountFlags};

use fuser::{Config, MountOption, SessionACL};

use super::fuse::{FuseAdapter, SessionCache};
use super::router::CheckpointFs;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// An existing directory.
    pub mountpoint: PathBuf,
    /// The mount's source as `mount` and `/proc/self/mountinfo` show it, such as
    /// `ckptfs:s3://bucket/prefix`.
    pub fsname: String,
    /// Let other users in (needs `user_allow_other` in `/etc/fuse.conf` for non-root).
    pub allow_other: bool,
    /// Request threads of the session (at least one).
    pub threads: usize,
    /// Mounted read-only (`ro`): the kernel refuses every write itself.
    pub read_only: bool,
}

/// A mounted filesystem, not yet serving requests: [`Session::run`] serves them until
/// the mount goes away. Dropped without running, a mount fuser made is unmounted; a
/// root daemon's is left for [`Unmounter`] (fuser would unmount it by path).
pub struct Session {
    session: fuser::Session<FuseAdapter>,
    /// Where a root daemon mounted (`None`: fuser and `fusermount3` did).
    at: Option<Arc<MountedAt>>,
}

/// Unmounts a [`Session`] from another thread (a signal handler).
pub enum Unmounter {
    Fuser(fuser::SessionUnmounter),
    Root(Arc<MountedAt>),
}

/// A mount point opened once: its parent directory by descriptor, its name there, and
/// the directory itself (which the mount goes on).
pub struct MountPoint {
    parent: OwnedFd,
    name: OsString,
    dir: OwnedFd,
}

/// The mount a root daemon made: where its parent's descriptor and name lead, and the
/// device of its filesystem, by which it is told from anything mounted there since.
pub struct MountedAt {
    parent: OwnedFd,
    name: OsString,
    dev: Option<u64>,
}

/// Mounts `fs` on `options.mountpoint`. Fails if the mount point is missing, not a
/// directory, or already a dead mount (the caller detaches those first).
pub fn mount(fs: Arc<CheckpointFs>, options: &MountOptions) -> io::Result<Session> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(options.fsname.clone()),
        // As a kernel option, not `MountOption::Subtype`: fuser hands that to
        // fusermount3 alone, and the direct mount(2) it makes as root would then be
        // of type `fuse`. The kernel and fusermount3 both take `subtype=`.
        MountOption::CUSTOM("subtype=ckptfs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
        // Checkpoints never change and staging/ is not archived with access times: a
        // read that invalidated the cached atime would cost a GETATTR at the next stat.
        MountOption::NoAtime,
    ];
    if options.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config.acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let adapter = FuseAdapter::new(Arc::clone(&fs));
    let (session, at) = if rustix::process::geteuid().is_root() {
        let point = MountPoint::open(&options.mountpoint)?;
        let device = mount_as_root(&point, options)?;
        let acl = config.acl;
        let session = fuser::Session::from_fd(adapter, device, acl, config)?;
        (session, Some(Arc::new(point.mounted())))
    } else {
        (
            fuser::Session::new(adapter, &options.mountpoint, &config)?,
            None,
        )
    };
    fs.attach_kernel(Arc::new(SessionCache(session.notifier())));
    if let Some(dev) = at.as_ref().and_then(|at| at.dev) {
        widen_readahead(dev);
    }
    Ok(Session { session, at })
}

impl MountPoint {
    /// Opens the directory `path` names now (links in it followed, as given) and
    /// checks it: a directory, not a mount's root, empty. The mount goes on this very
    /// directory whatever its path holds later.
    pub fn open(path: &Path) -> io::Result<MountPoint> {
        let (parent, name) = open_parent(path)?;
        let dir = crate::beneath::open_dir(&parent, &name)?;
        if mount_root_at(&dir, OsStr::new(""))?.0 {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the mount point is already a mount point",
            ));
        }
        if !crate::beneath::list(&dir)?.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                "the mount point is not empty",
            ));
        }
        Ok(MountPoint { parent, name, dir })
    }

    /// Where the mount on this directory now is, with its filesystem's device: none
    /// if the name no longer leads to a mount (the directory was renamed while it was
    /// mounted on), and the daemon then leaves unmounting to `fusermount3 -u`.
    fn mounted(self) -> MountedAt {
        let dev = match mount_root_at(&self.parent, &self.name) {
            Ok((true, dev)) => Some(dev),
            _ => None,
        };
        MountedAt {
            parent: self.parent,
            name: self.name,
            dev,
        }
    }
}

/// `/proc/self/fd/FD`, or `/proc/self/fd/FD/NAME`: a path that leads to what the
/// descriptor holds (then to `name` in it), whatever has been renamed since.
fn through_fd(fd: impl AsFd, name: Option<&OsStr>) -> PathBuf {
    let mut path = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()).into_bytes();
    if let Some(name) = name {
        path.push(b'/');
        path.extend_from_slice(name.as_bytes());
    }
    PathBuf::from(OsString::from_vec(path))
}

/// Mounts a new FUSE connection on `point`'s directory, as fuser does for root, but
/// on the directory held rather than on a path; returns the connection's `/dev/fuse`.
fn mount_as_root(point: &MountPoint, options: &MountOptions) -> io::Result<OwnedFd> {
    let device = rfs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let root_mode = rfs::fstat(&point.dir)?.st_mode;
    let mut data = format!(
        "fd={},rootmode={:o},user_id=0,group_id=0,subtype=ckptfs,default_permissions",
        device.as_raw_fd(),
        root_mode
    );
    if options.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME;
    if options.read_only {
        flags |= MountFlags::RDONLY;
    }
    let data = std::ffi::CString::new(data).map_err(io::Error::other)?;
    rustix::mount::mount(
        options.fsname.as_str(),
        through_fd(&point.dir, None),
        "fuse",
        flags,
        Some(data.as_c_str()),
    )?;
    Ok(device)
}

impl MountedAt {
    /// Unmounts (`detach`: lazily) the mount its parent's descriptor and name lead to,
    /// if that is still this one: never another mount put there since (after a lazy
    /// detach of this one, say), and never through a symlink put in its name's place.
    fn unmount(&self, detach: bool) -> io::Result<()> {
        let Some(dev) = self.dev else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the mount point was renamed while it was mounted on; unmount it with \
                 fusermount3 -u where it is now",
            ));
        };
        if !is_mount_of(&self.parent, &self.name, Some(dev))? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the mount point no longer holds this mount",
            ));
        }
        let mut flags = UnmountFlags::NOFOLLOW;
        if detach {
            flags |= UnmountFlags::DETACH;
        }
        rustix::mount::unmount(through_fd(&self.parent, Some(&self.name)), flags)?;
        Ok(())
    }
}

/// Whether `name` in `parent` is a mount's root (of device `dev`, if given).
fn is_mount_of(parent: impl AsFd, name: &OsStr, dev: Option<u64>) -> io::Result<bool> {
    let (root, device) = mount_root_at(parent, name)?;
    Ok(root && dev.is_none_or(|dev| dev == device))
}

/// Whether `name` in `parent` (never a symlink's target; `parent` itself for an empty
/// name) is a mount's root, and the device of its filesystem. From what the kernel
/// holds: asking for no attribute and not to sync sends a FUSE daemon no request (it
/// may not serve yet, or be gone), and is answered for another user's FUSE mount too.
fn mount_root_at(parent: impl AsFd, name: &OsStr) -> io::Result<(bool, u64)> {
    let flags = AtFlags::EMPTY_PATH
        | AtFlags::SYMLINK_NOFOLLOW
        | AtFlags::NO_AUTOMOUNT
        | AtFlags::STATX_DONT_SYNC;
    let stat = rfs::statx(parent, name, flags, StatxFlags::empty())?;
    let root = stat
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
        && stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
    let device = rustix::fs::makedev(stat.stx_dev_major, stat.stx_dev_minor);
    Ok((root, device))
}

/// The kernel reads ahead 128 KiB at a time in a FUSE file unless told otherwise
/// (the init reply can only lower it): raise it to the largest read request, 1 MiB,
/// so that a large file is read in eight times fewer requests. Only root may (and
/// does, for the device of the mount it made); others keep the kernel's default.
fn widen_readahead(dev: u64) {
    let device = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    let knob = format!("/sys/class/bdi/{device}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, "1024") {
        tracing::debug!(knob, error = %e, "cannot widen the kernel's read-ahead");
    }
}

impl Session {
    /// A handle that unmounts this session, usable from any thread.
    pub fn unmounter(&mut self) -> Unmounter {
        match &self.at {
            Some(at) => Unmounter::Root(Arc::clone(at)),
            None => Unmounter::Fuser(self.session.unmount_callable()),
        }
    }

    /// Serves requests until the filesystem is unmounted (by [`Unmounter::unmount`],
    /// `fusermount3 -u` or `umount`).
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

impl Unmounter {
    /// Unmounts; fails while the mount is in use.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self {
            Unmounter::Fuser(unmounter) => unmounter.unmount(),
            Unmounter::Root(at) => at.unmount(false),
        }
    }

    /// Lazily detaches the mount (`umount -l`): it leaves the directory tree at once,
    /// and the kernel ends it when the last process using it lets go. Returns how.
    pub fn detach(&mut self, mountpoint: &Path) -> Result<&'static str, String> {
        match self {
            Unmounter::Fuser(_) => detach(mountpoint),
            Unmounter::Root(at) => at
                .unmount(true)
                .map(|()| "umount2(MNT_DETACH)")
                .map_err(|e| format!("umount2: {e}")),
        }
    }
}

/// Lazily detaches the mount on `mountpoint` (`umount -l`) with `fusermount3 -u -z`,
/// which lets a user touch only their own mounts: for daemons that are not root.
pub fn detach(mountpoint: &Path) -> Result<&'static str, String> {
    let fusermount = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match fusermount {
        Ok(out) if out.status.success() => Ok("fusermount3 -u -z"),
        Ok(out) => Err(format!(
            "fusermount3 -u -z: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("fusermount3: {e}")),
    }
}

/// If `mountpoint` is a FUSE mount whose daemon is gone, detaches it lazily and says
/// how; `None` if it is not one. The probe is `statfs`, which the kernel always asks
/// the daemon (ENOTCONN, or ECONNABORTED for a connection it aborted): a `stat` of the
/// mount's root can still answer from the attribute cache for a moment after the
/// daemon died. As root, the mount probed is the one the path's parent, opened once,
/// and its name lead to, and the mount detached is that same one (same device, never
/// through a symlink): a user who can write a directory above the mount point cannot
/// swap in a path to another mount between the two. Others go through `fusermount3`.
pub fn detach_if_dead(mountpoint: &Path) -> Result<Option<&'static str>, String> {
    let dead = |e: rustix::io::Errno| {
        matches!(
            e,
            rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED
        )
    };
    if !rustix::process::geteuid().is_root() {
        return match rustix::fs::statfs(mountpoint) {
            Err(e) if dead(e) => detach(mountpoint).map(Some),
            _ => Ok(None),
        };
    }
    let Ok((parent, name)) = open_parent(mountpoint) else {
        return Ok(None);
    };
    let Ok(root) = rfs::openat(
        &parent,
        name.as_os_str(),
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    match rfs::fstatfs(&root) {
        Err(e) if dead(e) => {}
        _ => return Ok(None),
    }
    let (_, device) = mount_root_at(&root, OsStr::new("")).map_err(|e| format!("statx: {e}"))?;
    if !is_mount_of(&parent, &name, Some(device)).map_err(|e| format!("statx: {e}"))? {
        return Err("the mount point changed while it was being checked".into());
    }
    let flags = UnmountFlags::DETACH | UnmountFlags::NOFOLLOW;
    rustix::mount::unmount(through_fd(&parent, Some(&name)), flags)
        .map_err(|e| format!("umount2: {e}"))?;
    Ok(Some("umount2(MNT_DETACH)"))
}

/// The directory that holds `path` (links on the way followed, once) and the name of
/// `path` in it; a path ending in `.` or `..` is resolved whole first.
fn open_parent(path: &Path) -> io::Result<(OwnedFd, OsString)> {
    let resolved;
    let path = match path.file_name() {
        Some(_) => path,
        None => {
            resolved = std::fs::canonicalize(path)?;
            &resolved
        }
    };
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => (parent, name),
        (_, Some(name)) => (Path::new("."), name),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a directory's entry",
            ));
        }
    };
    let parent = rfs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok((parent, name.to_owned()))
}
