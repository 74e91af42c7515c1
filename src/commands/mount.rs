//! `ckptfs mount STORE MOUNTPOINT`: the daemon. It builds the filesystem (store,
//! cache, staging tree), mounts it, keeps the listing fresh, and unmounts cleanly on
//! SIGINT or SIGTERM.
//!
//! Without `--foreground` the command starts itself again in the background (a
//! fresh process, since forking a process that runs threads is unsafe), waits until
//! that daemon says the mount is ready, and exits 0; or non-zero with the daemon's
//! error if it could not mount.
//!
//! A daemon that was killed (`kill -9`, the OOM killer) leaves its mount behind,
//! dead: accesses to the mount point answer ENOTCONN ("Transport endpoint is not
//! connected"). Starting the daemon again on that mount point detaches the dead mount
//! first, and says so in the log.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{compression_threads, open_store};
use crate::cache::{self, Cache};
use crate::cli::{Cli, MountArgs};
use crate::fs::loader::default_loaders;
use crate::fs::mount::{self, MountOptions};
use crate::fs::{CheckpointFs, FsConfig, StagingTree};

/// Set in the daemon's environment: the file descriptor on which it reports readiness.
const READY_FD_ENV: &str = "CKPTFS_READY_FD";

pub(super) fn run(cli: &Cli, args: &MountArgs) -> Result<i32> {
    if args.foreground {
        serve(cli, args)?;
    } else {
        spawn_daemon(args)?;
    }
    Ok(0)
}

/// The daemon itself: mounts, reports readiness, serves until unmounted.
fn serve(cli: &Cli, args: &MountArgs) -> Result<()> {
    raise_open_file_limit();
    let fs = build_filesystem(cli, args)?;
    fs.refresh()
        .with_context(|| format!("cannot list {}", args.store))?;
    spawn_refresher(Arc::downgrade(&fs), args.refresh);

    detach_dead_mount(&args.mountpoint)?;
    let options = MountOptions {
        mountpoint: args.mountpoint.clone(),
        fsname: format!("ckptfs:{}", args.store),
        allow_other: args.allow_other,
        threads: args.threads,
        read_only: args.read_only,
    };
    let mut session = mount::mount(fs, &options)
        .with_context(|| format!("cannot mount on {}", args.mountpoint.display()))?;
    let mut unmounter = session.unmounter();
    let mountpoint = args.mountpoint.clone();
    ctrlc::set_handler(move || {
        tracing::info!(mountpoint = %mountpoint.display(), "signal received; unmounting");
        if let Err(e) = unmounter.unmount() {
            tracing::error!(error = %e, "unmount failed");
        }
    })
    .context("cannot install the signal handler")?;
    tracing::info!(mountpoint = %args.mountpoint.display(), store = %args.store, "mounted");
    report_ready();
    session.run().context("the FUSE session failed")?;
    tracing::info!("unmounted");
    Ok(())
}

/// The store, the cache, the staging tree, and the filesystem over them.
fn build_filesystem(cli: &Cli, args: &MountArgs) -> Result<Arc<CheckpointFs>> {
    let store = open_store(cli, &args.store, args.part_size)?;
    let cache_dir = cache_dir(args)?;
    let cache = Arc::new(
        Cache::open(&cache_dir, args.cache_size)
            .with_context(|| format!("cannot open cache {}", cache_dir.display()))?,
    );
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let staging_dir = args
        .staging_dir
        .clone()
        .unwrap_or_else(|| cache_dir.join("staging"));
    let staging = StagingTree::at(&staging_dir).with_context(|| {
        format!(
            "cannot open the staging directory {}",
            staging_dir.display()
        )
    })?;
    let work_dir = cache_dir.join("tmp");
    cache::private_dir(&work_dir)
        .with_context(|| format!("cannot create {}", work_dir.display()))?;
    Ok(CheckpointFs::new(
        store,
        cache,
        staging,
        FsConfig {
            max_archive_size: cli.max_archive_size,
            limits: args.limits.limits(),
            owner_override: args.owner_self.then_some((uid, gid)),
            uid,
            gid,
            work_dir,
            threads: compression_threads(),
            loaders: args.loaders.unwrap_or_else(default_loaders),
            read_only: args.read_only,
        },
    ))
}

/// Staging holds one descriptor per inode the kernel knows (see `staging.rs`), and a
/// workspace easily has tens of thousands: raise the limit on open files as far as
/// allowed (the system's maximum where the daemon may raise its hard limit, else the
/// hard limit).
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let current = getrlimit(Resource::Nofile);
    let system_max = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let raised = system_max.is_some_and(|max| {
        let limit = Rlimit {
            current: Some(max),
            maximum: Some(max),
        };
        setrlimit(Resource::Nofile, limit).is_ok()
    });
    if !raised {
        let limit = Rlimit {
            current: current.maximum,
            maximum: current.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %e, "could not raise the open file limit");
        }
    }
    tracing::info!(limit = ?getrlimit(Resource::Nofile).current, "open file limit");
}

/// `--cache-dir`, or `$XDG_CACHE_HOME/ckptfs`, `$HOME/.cache/ckptfs`, and for root
/// without either `/var/cache/ckptfs`. Never a shared temporary directory, where
/// another user could have made the directory first.
fn cache_dir(args: &MountArgs) -> Result<PathBuf> {
    if let Some(dir) = &args.cache_dir {
        return Ok(dir.clone());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| Path::new(&h).join(".cache"))
        });
    match base {
        Some(base) => Ok(base.join("ckptfs")),
        None if rustix::process::geteuid().is_root() => Ok(PathBuf::from("/var/cache/ckptfs")),
        None => bail!("no cache directory: set --cache-dir, XDG_CACHE_HOME or HOME"),
    }
}

fn spawn_refresher(fs: Weak<CheckpointFs>, every: Duration) {
    std::thread::Builder::new()
        .name("ckptfs-refresh".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every.max(Duration::from_millis(200)));
                let Some(fs) = fs.upgrade() else { return };
                if let Err(e) = fs.refresh() {
                    tracing::warn!(error = %e, "listing the store failed; keeping the previous listing");
                }
            }
        })
        .expect("spawning the refresh thread");
}

/// If `mountpoint` is a FUSE mount whose daemon is gone (ENOTCONN), detaches it:
/// `umount2(MNT_DETACH)` where the daemon may unmount (root), else `fusermount3 -u -z`
/// (the mount's owner). Anything else at the mount point is left for the mount to
/// judge. The probe is `statfs`, which the kernel always asks the daemon: a `stat`
/// of the mount's root can still answer from the attribute cache for a moment after
/// the daemon died.
fn detach_dead_mount(mountpoint: &Path) -> Result<()> {
    // A connection the kernel aborted answers ECONNABORTED instead.
    match rustix::fs::statfs(mountpoint) {
        Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED) => {}
        _ => return Ok(()),
    }
    tracing::warn!(
        mountpoint = %mountpoint.display(),
        "the mount point is a dead FUSE mount (its daemon was killed); detaching it"
    );
    let how = match umount_detach(mountpoint) {
        Ok(()) => "umount2(MNT_DETACH)",
        Err(umount_error) => {
            let fusermount = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(mountpoint)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output();
            match fusermount {
                Ok(out) if out.status.success() => "fusermount3 -u -z",
                Ok(out) => bail!(
                    "cannot detach the dead mount on {}: umount2: {umount_error}; \
                     fusermount3 -u -z: {}",
                    mountpoint.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => bail!(
                    "cannot detach the dead mount on {}: umount2: {umount_error}; \
                     fusermount3: {e}",
                    mountpoint.display()
                ),
            }
        }
    };
    tracing::info!(mountpoint = %mountpoint.display(), with = how, "detached the dead mount");
    Ok(())
}

/// `umount2(path, MNT_DETACH)`.
fn umount_detach(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `path` is a NUL-terminated string that lives across the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// In the daemon: tells the waiting parent that the mount is up.
fn report_ready() {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: the parent passed this descriptor for us alone; it is closed here once.
    let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let _ = pipe.write_all(b"ready\n");
}

/// Starts `ckptfs mount ... --foreground` as a detached daemon and waits for it to
/// report that the mount is ready.
fn spawn_daemon(args: &MountArgs) -> Result<()> {
    let cache_dir = cache_dir(args)?;
    cache::private_dir(&cache_dir)
        .with_context(|| format!("cannot use the cache directory {}", cache_dir.display()))?;
    let log_path = cache_dir.join("ckptfs.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log_path)
        .with_context(|| format!("cannot open the log {}", log_path.display()))?;
    let (reader, writer) = std::io::pipe().context("cannot create a pipe")?;
    let writer_fd = std::os::fd::AsRawFd::as_raw_fd(&writer);
    let mut command = Command::new(std::env::current_exe().context("cannot find own executable")?);
    command
        .args(std::env::args_os().skip(1))
        .arg("--foreground")
        .env(READY_FD_ENV, writer_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.try_clone()?);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal
    // session so that the shell's hang-up does not stop it. Clearing FD_CLOEXEC keeps
    // the readiness pipe open across exec.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            let flags = libc::fcntl(writer_fd, libc::F_GETFD);
            libc::fcntl(writer_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = command.spawn().context("cannot start the daemon")?;
    drop(writer);
    let mut line = String::new();
    let _ = BufReader::new(reader).read_line(&mut line);
    if line.trim() == "ready" {
        eprintln!(
            "mounted {} on {} (daemon pid {}, log {})",
            args.store,
            args.mountpoint.display(),
            child.id(),
            log_path.display()
        );
        return Ok(());
    }
    let status = child.wait().ok();
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let last = log_text
        .lines()
        .rev()
        .find(|l| l.contains("error"))
        .unwrap_or("see the log");
    bail!(
        "the mount daemon exited ({}) before the mount was ready: {last} (log: {})",
        status.map_or("unknown status".into(), |s| s.to_string()),
        log_path.display()
    )
}
