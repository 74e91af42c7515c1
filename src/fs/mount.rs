//! Mounting a [`CheckpointFs`]: the FUSE session with ckptfs's mount options, and
//! nothing around it.
//!
//! Every mount is `nosuid,nodev,default_permissions` (the kernel checks permissions
//! against the attributes the filesystem reports), of type `fuse.ckptfs`, served by
//! `threads` request threads each with its own cloned `/dev/fuse` descriptor. The
//! adapter's notifier (which invalidates `commit/NAME` after a seal) is wired to the
//! session before any request is served.
//!
//! What a process does around a mount (daemonising, signals, refreshing the listing,
//! choosing directories) is the command's, in `commands/mount.rs`; this module never
//! prints and never exits.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use fuser::{Config, MountOption, SessionACL};

use super::CheckpointFs;
use super::fuse::FuseAdapter;

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
/// the mount goes away. Dropped without running, it unmounts.
pub struct Session {
    session: fuser::Session<FuseAdapter>,
}

/// Unmounts a [`Session`] from another thread (a signal handler).
pub struct Unmounter {
    unmounter: fuser::SessionUnmounter,
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
    let notifier = Arc::new(OnceLock::new());
    let adapter = FuseAdapter::new(fs, Arc::clone(&notifier));
    let session = fuser::Session::new(adapter, &options.mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    Ok(Session { session })
}

impl Session {
    /// A handle that unmounts this session, usable from any thread.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter {
            unmounter: self.session.unmount_callable(),
        }
    }

    /// Serves requests until the filesystem is unmounted (by [`Unmounter::unmount`],
    /// `fusermount3 -u` or `umount`).
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

impl Unmounter {
    /// Unmounts; a second call does nothing.
    pub fn unmount(&mut self) -> io::Result<()> {
        self.unmounter.unmount()
    }
}

/// Lazily detaches the mount on `mountpoint` (`umount -l`): it leaves the directory
/// tree at once, and the kernel ends it when the last process using it lets go. With
/// `umount2(MNT_DETACH)` where the caller may unmount (root), else with `fusermount3
/// -u -z` (the mount's owner). Returns which one worked.
pub fn detach(mountpoint: &Path) -> Result<&'static str, String> {
    let umount_error = match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH)
    {
        Ok(()) => return Ok("umount2(MNT_DETACH)"),
        Err(e) => io::Error::from(e),
    };
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
            "umount2: {umount_error}; fusermount3 -u -z: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("umount2: {umount_error}; fusermount3: {e}")),
    }
}
