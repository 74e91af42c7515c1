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

use crate::commands::say;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{cache_dir, compression_threads, member_cache, open_store};
use crate::cache::{self, Cache};
use crate::cli::{Cli, MountArgs};
use crate::fs::loader::default_loaders;
use crate::fs::mount::{self, MountOptions};
use crate::fs::{CheckpointFs, FsConfig, StagingTree};

/// Set in the daemon's environment: the file descriptor on which it reports readiness.
const READY_FD_ENV: &str = "CKPTFS_READY_FD";

pub(super) fn run(cli: &Cli, args: &MountArgs) -> Result<i32> {
    // Without root the daemon cannot give a file to the user who made it: with other
    // users let in, everything they made in staging/ would be the daemon's user's, and
    // the kernel's permission checks between them would mean nothing.
    if args.allow_other && !args.read_only && !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "--allow-other with a writable staging/ needs the daemon to run as root \
             (files other users make there must be theirs); add --read-only, or run it as root"
        );
    }
    detach_dead_mount(&args.mountpoint)?;
    check_mountpoint(&args.mountpoint)?;
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
    let exact = fs
        .first_listing()
        .with_context(|| format!("cannot list {}", args.store))?;
    spawn_refresher(Arc::downgrade(&fs), args.refresh, exact);

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
    let mut signals = 0;
    ctrlc::set_handler(move || {
        signals += 1;
        on_signal(signals, &mountpoint, &mut unmounter);
    })
    .context("cannot install the signal handler")?;
    tracing::info!(mountpoint = %args.mountpoint.display(), store = %args.store, "mounted");
    report_ready();
    session.run().context("the FUSE session failed")?;
    tracing::info!("unmounted");
    Ok(())
}

/// SIGINT or SIGTERM number `count`. The first unmounts, which fails while a process
/// uses the mount (its working directory or an open file there): the daemon then
/// goes on serving, since those processes would otherwise see errors. The second
/// detaches the mount lazily: it leaves the directory tree at once, and the daemon
/// exits when the last process using it lets go. The third exits at once.
fn on_signal(count: usize, mountpoint: &Path, unmounter: &mut mount::Unmounter) {
    let shown = mountpoint.display();
    match count {
        1 => {
            tracing::info!(mountpoint = %shown, "signal received; unmounting");
            if let Err(e) = unmounter.unmount() {
                tracing::warn!(
                    mountpoint = %shown,
                    error = %e,
                    "cannot unmount: a process is using the mount (`fuser -vm {shown}` \
                     names it); still serving. Send the signal again to detach the mount \
                     lazily, or end that process and unmount"
                );
            }
        }
        2 => {
            tracing::info!(mountpoint = %shown, "second signal: detaching the mount lazily");
            match unmounter.detach(mountpoint) {
                Ok(how) => tracing::info!(
                    mountpoint = %shown,
                    with = how,
                    "detached; the daemon exits when the last process using the mount \
                     leaves it (a third signal exits now)"
                ),
                Err(e) => {
                    tracing::error!(mountpoint = %shown, error = %e, "cannot detach the mount")
                }
            }
        }
        _ => {
            tracing::warn!(
                mountpoint = %shown,
                "third signal: exiting now; processes still using the mount get \
                 'Transport endpoint is not connected'"
            );
            std::process::exit(1);
        }
    }
}

/// Refuses a mount point that is missing, not a directory, not empty (mounting would
/// hide what is there) or already mounted (a second mount would stack on the first,
/// and one unmount would take both down).
fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags};
    let shown = mountpoint.display();
    let meta = match std::fs::metadata(mountpoint) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("mount point {shown} does not exist (create an empty directory)")
        }
        Err(e) => bail!("mount point {shown}: {e}"),
    };
    if !meta.is_dir() {
        bail!("mount point {shown} is not a directory");
    }
    let statx = rustix::fs::statx(
        CWD,
        mountpoint,
        AtFlags::NO_AUTOMOUNT,
        StatxFlags::BASIC_STATS,
    );
    if let Ok(statx) = statx
        && statx
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
        && statx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
    {
        bail!(
            "{shown} is already a mount point{}; unmount it first (`fusermount3 -u {shown}` \
             or `umount {shown}`)",
            mounted_source(mountpoint)
                .map(|source| format!(" (of {source})"))
                .unwrap_or_default()
        );
    }
    let entries = std::fs::read_dir(mountpoint)
        .with_context(|| format!("cannot read the mount point {shown}"))?
        .count();
    if entries > 0 {
        bail!(
            "mount point {shown} is not empty ({entries} {}): a mount would hide them; \
             use an empty directory",
            if entries == 1 { "entry" } else { "entries" }
        );
    }
    Ok(())
}

/// What is mounted on `mountpoint`, from `/proc/self/mounts`.
fn mounted_source(mountpoint: &Path) -> Option<String> {
    let target = std::fs::canonicalize(mountpoint).ok()?;
    // Spaces and the like are octal escapes there, as in fstab.
    let target = target
        .to_str()?
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let source = fields.next()?;
        (fields.next()? == target).then(|| source.to_owned())
    })
}

/// The store, the cache, the staging tree, and the filesystem over them.
fn build_filesystem(cli: &Cli, args: &MountArgs) -> Result<Arc<CheckpointFs>> {
    let store = open_store(cli, &args.store, args.part_size)?;
    // Resolved once, out of other users' reach; everything below goes by this path.
    let cache_dir = cache_dir(args.cache_dir.as_deref())?;
    // Cache errors name the directory.
    let cache = Arc::new(Cache::open(&cache_dir, args.cache_size)?);
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let staging_dir = args
        .staging_dir
        .clone()
        .unwrap_or_else(|| cache_dir.staging());
    let staging = StagingTree::at(&staging_dir).with_context(|| {
        format!(
            "cannot open the staging directory {}",
            staging_dir.display()
        )
    })?;
    let work_dir = cache_dir.work();
    cache::private_dir(&work_dir)
        .with_context(|| format!("cannot create {}", work_dir.display()))?;
    Ok(CheckpointFs::new(
        store,
        cache,
        staging,
        FsConfig {
            max_archive_size: cli.max_archive_size,
            limits: crate::archive::Limits {
                max_index_bytes: args.memory_budget / 2,
                ..args.limits.limits()
            },
            memory_budget: args.memory_budget,
            owner_override: args.owner_self.then_some((uid, gid)),
            shared: args.allow_other,
            uid,
            gid,
            work_dir,
            threads: compression_threads(),
            members: member_cache(&cache_dir, args.member_cache_size),
            loaders: args.loaders.unwrap_or_else(default_loaders),
            read_only: args.read_only,
            passthrough: passthrough(args.passthrough),
        },
    ))
}

/// `--passthrough` unless the kernel would refuse it: registering a backing file
/// needs CAP_SYS_ADMIN, which a daemon that is not root lacks. Said once, here, and
/// not per file.
fn passthrough(asked: bool) -> bool {
    if asked && !rustix::process::geteuid().is_root() {
        tracing::warn!(
            "--passthrough needs CAP_SYS_ADMIN (a root daemon); the daemon serves reads itself"
        );
        return false;
    }
    asked
}

/// Staging keeps a bounded number of descriptors (see `fs/staging`), but loads, seals
/// and read-ahead each hold some at once: raise the limit on open files as far as
/// allowed (the system's maximum where the daemon may raise its hard limit, else the
/// hard limit), so that busy moments never meet the usual soft limit of 1,024.
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
    match getrlimit(Resource::Nofile).current {
        Some(limit) => tracing::info!(limit, "open file limit"),
        None => tracing::info!("no open file limit"),
    }
}

/// Lists the store every `every`; at once if the first listing's order was not
/// exact throughout (see `CheckpointFs::first_listing`).
fn spawn_refresher(fs: Weak<CheckpointFs>, every: Duration, exact: bool) {
    std::thread::Builder::new()
        .name("ckptfs-refresh".into())
        .spawn(move || {
            let mut wait = if exact { every } else { Duration::ZERO };
            loop {
                std::thread::sleep(wait);
                let Some(fs) = fs.upgrade() else { return };
                let started = std::time::Instant::now();
                wait = match fs.refresh() {
                    Ok(_) => next_listing_in(every, started.elapsed()),
                    // A failed listing's time is the store's timeouts, not its size:
                    // the store is tried again as often as ever.
                    Err(e) => {
                        tracing::warn!(error = %e, "listing the store failed; keeping the previous listing");
                        every.max(Duration::from_millis(200))
                    }
                };
            }
        })
        .expect("spawning the refresh thread");
}

/// How long to wait before listing again, after a listing that took `took`: `every`
/// (`--refresh`, at least 200 ms), or nine times what the listing took, so that a
/// bucket of millions of names keeps the daemon listing a tenth of the time at most.
fn next_listing_in(every: Duration, took: Duration) -> Duration {
    every.max(Duration::from_millis(200)).max(took * 9)
}

/// If `mountpoint` is a FUSE mount whose daemon is gone (ENOTCONN), detaches it (see
/// [`mount::detach_if_dead`]). Anything else at the mount point is left for the mount
/// to judge.
fn detach_dead_mount(mountpoint: &Path) -> Result<()> {
    let shown = mountpoint.display();
    match mount::detach_if_dead(mountpoint) {
        Ok(None) => Ok(()),
        Ok(Some(how)) => {
            tracing::warn!(
                mountpoint = %shown,
                with = how,
                "the mount point was a dead FUSE mount (its daemon was killed): detached the dead mount"
            );
            Ok(())
        }
        Err(e) => bail!("cannot detach the dead mount on {shown}: {e}"),
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
    let log_path = cache_dir(args.cache_dir.as_deref())?.log();
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
    let mut own_args = std::env::args_os();
    // The same program name too: a mount helper's arguments (`mount.fuse.ckptfs
    // SOURCE MOUNTPOINT`, which need not have `-o`) are known as such by that name.
    if let Some(program) = own_args.next() {
        command.arg0(program);
    }
    command
        .args(own_args)
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
        say::note!(
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
        .find_map(last_error)
        .or_else(|| {
            log_text
                .lines()
                .rev()
                .find(|l| l.contains("error"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "see the log".to_owned());
    bail!(
        "the mount daemon exited ({}) before the mount was ready: {last} (log: {})",
        status.map_or("unknown status".into(), |s| s.to_string()),
        log_path.display()
    )
}

/// The message of the daemon's closing error line in its log, text or JSON.
fn last_error(line: &str) -> Option<String> {
    if let Some(message) = line.strip_prefix("ckptfs: error: ") {
        return Some(message.to_owned());
    }
    let json: serde_json::Value = serde_json::from_str(line).ok()?;
    (json["level"] == "ERROR")
        .then(|| json["fields"]["message"].as_str().map(str::to_owned))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_listing_spaces_the_next() {
        let every = Duration::from_secs(5);
        assert_eq!(next_listing_in(every, Duration::from_millis(30)), every);
        assert_eq!(
            next_listing_in(every, Duration::from_secs(20)),
            Duration::from_secs(180)
        );
        assert_eq!(
            next_listing_in(Duration::ZERO, Duration::ZERO),
            Duration::from_millis(200)
        );
    }
}
