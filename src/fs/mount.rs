//! Mounting a [`CheckpointFs`]: the FUSE session with ckptfs's mount options, and
//! nothing around it.
//!
//! Every mount is `nosuid,nodev,default_permissions` (the kernel checks permissions
//! against the attributes the filesystem reports), of type `fuse.ckptfs`, served by
//! `threads` request threads each with its own cloned `/dev/fuse` descriptor. The
//! core is connected to the kernel's caches (see [`super::KernelCache`]) before any
//! request is served.
//!
//! What a process does around a mount (daemonising, signals, refreshing the listing,
//! choosing directories) is the command's, in `commands/mount.rs`; this module never
//! prints and never exits.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

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
    let session = fuser::Session::new(adapter, &options.mountpoint, &config)?;
    fs.attach_kernel(Arc::new(SessionCache(session.notifier())));
    widen_readahead(&options.mountpoint);
    Ok(Session { session })
}

/// The kernel reads ahead 128 KiB at a time in a FUSE file unless told otherwise
/// (the init reply can only lower it): raise it to the largest read request, 1 MiB,
/// so that a large file is read in eight times fewer requests. Only root may; others
/// keep the kernel's default.
fn widen_readahead(mountpoint: &Path) {
    let Some(device) = mount_device(mountpoint) else {
        return;
    };
    let knob = format!("/sys/class/bdi/{device}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, "1024") {
        tracing::debug!(knob, error = %e, "cannot widen the kernel's read-ahead");
    }
}

/// `MAJOR:MINOR` of the filesystem mounted on `mountpoint`, from
/// `/proc/self/mountinfo` (a `stat` of the mount point would ask the session, which
/// does not serve requests yet).
fn mount_device(mountpoint: &Path) -> Option<String> {
    let wanted = std::fs::canonicalize(mountpoint).ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The last mount on that point is ours: fields 3 and 5 are the device and the
    // mount point (with spaces and the like octal-escaped).
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let (device, point) = (fields.get(2)?, fields.get(4)?);
        (unescape_mountinfo(point) == wanted.as_os_str().as_encoded_bytes())
            .then(|| device.to_string())
    })
}

fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |n, d| n.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
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
