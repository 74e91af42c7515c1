//! Starting and stopping: daemon mode returns once the mount is ready, SIGTERM
//! unmounts, a restart detaches the dead mount a killed daemon left, and a mount that
//! cannot happen fails with a one-line error.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::mount::{Mount, mount_entry, repo_temp_dir};
use crate::util::tree::make_small_tree;
use crate::util::{TestStore, ckptfs, run};

/// Lazily unmounts a mount point on drop, if something is still mounted there.
struct LazyUnmount(PathBuf);

impl Drop for LazyUnmount {
    fn drop(&mut self) {
        if mount_entry(&self.0).is_some() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.0)
                .status();
        }
    }
}

/// Whether process `pid` is gone (or a zombie waiting for whoever adopted it).
fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

#[test]
fn daemon_mode_returns_once_mounted_and_exits_on_unmount() {
    let store = TestStore::local();
    let work = repo_temp_dir("daemon-");
    let src = work.path().join("src");
    make_small_tree(&src, "daemon");
    let (sha, _) = store.put(&src, &[]);
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let cache = work.path().join("cache");
    let _unmount = LazyUnmount(mnt.clone());

    let out = run(ckptfs()
        .arg("mount")
        .arg(store.url())
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(&cache))
    .success();
    assert!(
        mount_entry(&mnt).is_some(),
        "mounted by the time the command returns: {out}"
    );
    let line = out.one_line_error().to_owned();
    assert!(line.starts_with("mounted "), "{out}");
    let pid: u32 = line
        .split_once("daemon pid ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {line:?}"));
    let log = line
        .split_once(", log ")
        .map(|(_, rest)| rest.trim_end_matches(')'))
        .unwrap_or_else(|| panic!("no log path in {line:?}"));
    assert!(Path::new(log).is_file(), "{log}");
    assert!(!process_gone(pid), "the daemon runs");

    assert_eq!(
        fs::read(mnt.join(&sha).join("note.txt")).unwrap(),
        b"checkpoint daemon\n"
    );

    run(Command::new("fusermount3").arg("-u").arg(&mnt)).success();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "the daemon is still running after the unmount; log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_unmounts_and_exits_cleanly() {
    let store = TestStore::local();
    let work = repo_temp_dir("sigterm-");
    make_small_tree(&work.path().join("src"), "sigterm");
    let (sha, _) = store.put(&work.path().join("src"), &[]);
    let mount = Mount::new(&store).start();
    assert!(mount.join(&sha).join("note.txt").is_file());
    let status = mount.terminate();
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

#[test]
fn a_restart_detaches_the_dead_mount_of_a_killed_daemon() {
    let store = TestStore::local();
    let work = repo_temp_dir("restart-");
    make_small_tree(&work.path().join("src"), "restart");
    let (sha, _) = store.put(&work.path().join("src"), &[]);
    let killed = Mount::new(&store).start();
    assert!(killed.join(&sha).join("note.txt").is_file());
    let mnt = killed.path().to_owned();

    let pid = killed.pid();
    // SAFETY: kill has no memory-safety preconditions; the pid is the test's child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        assert!(Instant::now() < deadline, "the daemon survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(mount_entry(&mnt).is_some(), "the dead mount stays behind");
    // ENOTCONN ("Transport endpoint is not connected"), or ECONNABORTED when the
    // kernel aborted the connection with requests in flight.
    let err = fs::read_dir(&mnt).expect_err("a dead mount cannot be listed");
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        ),
        "{err}"
    );
    let out = run(Command::new("ls").arg(&mnt)).failure();
    assert!(
        out.stderr.contains("Transport endpoint is not connected")
            || out.stderr.contains("Software caused connection abort"),
        "{out}"
    );

    // The same command again, on the same mount point and cache.
    let restarted = Mount::new(&store)
        .mountpoint(&mnt)
        .cache_dir(killed.cache_dir())
        .start();
    let note = fs::read(restarted.join(&sha).join("note.txt")).unwrap_or_else(|e| {
        panic!(
            "read through the new mount: {e}; log:\n{}",
            restarted.log_text()
        )
    });
    assert_eq!(note, b"checkpoint restart\n");
    let names: Vec<_> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&sha), "{names:?}");
    let log = restarted.log_text();
    assert!(
        log.contains("dead FUSE mount") && log.contains("detached the dead mount"),
        "the daemon says it detached the dead mount; log:\n{log}"
    );
    let status = restarted.unmount();
    assert!(status.success(), "exit status after unmount: {status}");
    assert!(
        mount_entry(&mnt).is_none(),
        "nothing stays mounted on {}",
        mnt.display()
    );
}

#[test]
fn a_mount_that_cannot_happen_fails_with_one_line() {
    let store = TestStore::local();
    let work = repo_temp_dir("nomount-");
    let missing = work.path().join("no-such-dir");
    for foreground in [true, false] {
        let mut cmd = ckptfs();
        cmd.arg("mount")
            .arg(store.url())
            .arg(&missing)
            .arg("--cache-dir")
            .arg(work.path().join("cache"));
        if foreground {
            cmd.arg("--foreground");
        }
        let _unmount = LazyUnmount(missing.clone());
        let out = run(&mut cmd).failure();
        // In the foreground stderr is also the daemon's log; the error comes last.
        let line = if foreground {
            out.stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
        } else {
            out.one_line_error()
        };
        assert!(
            line.starts_with("ckptfs: error:") && line.contains("no-such-dir"),
            "foreground={foreground}: the error says what failed: {out}"
        );
    }
}

/// Unmounts a tmpfs on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn on(dir: &Path) -> Tmpfs {
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "ckptfs-test-tmpfs"])
            .arg(dir))
        .success();
        fs::write(dir.join("kept"), b"kept\n").unwrap();
        Tmpfs(dir.to_owned())
    }

    fn still_mounted(&self) -> bool {
        mount_entry(&self.0).is_some() && fs::read(self.0.join("kept")).is_ok()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The daemon pid in `ckptfs mount`'s line.
fn daemon_pid_of(out: &crate::util::Output) -> u32 {
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("mounted "))
        .unwrap_or_else(|| panic!("no `mounted` line: {out}"));
    line.split_once("daemon pid ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {line:?}"))
}

/// Whether process `pid` is gone within 10 s.
fn gone_soon(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A root daemon unmounts its own mount, never what the mount point's path leads to
/// at the time: a user who can write a directory above the mount point moved it away
/// and put a symlink to another mount in its place (its SIGTERM then unmounted that
/// mount, a tmpfs here, and left its own); and after an administrator's `umount -l`
/// and a new mount on the same directory, the old daemon's exit took the new mount
/// down with it.
#[test]
fn a_root_daemon_unmounts_its_own_mount_and_nothing_else() {
    use crate::util::users::{as_nobody, nobodys_dir, shared_temp_dir};
    let store = TestStore::local();
    let work = shared_temp_dir("ckptfs-unmount-");
    make_small_tree(&work.path().join("src"), "own");
    store.put(&work.path().join("src"), &[]);
    let victim_dir = work.path().join("victim");
    fs::create_dir(&victim_dir).unwrap();
    let victim = Tmpfs::on(&victim_dir);

    let home = work.path().join("home");
    nobodys_dir(&home);
    run(as_nobody().args(["mkdir", "-p"]).arg(home.join("sub/ckpt"))).success();
    let _unmount = LazyUnmount(home.join("sub.moved/ckpt"));
    let out = run(ckptfs()
        .arg("mount")
        .arg(store.url())
        .arg(home.join("sub/ckpt"))
        .arg("--cache-dir")
        .arg(work.path().join("cache1")))
    .success();
    let pid = daemon_pid_of(&out);
    let swap = format!(
        "mv {home}/sub {home}/sub.moved && mkdir {home}/sub && ln -s {victim} {home}/sub/ckpt",
        home = home.display(),
        victim = victim_dir.display()
    );
    run(as_nobody().args(["sh", "-c", &swap])).success();
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
    let gone = gone_soon(pid);
    assert!(
        victim.still_mounted(),
        "the daemon's stop unmounted the tmpfs"
    );
    assert!(gone, "the daemon still runs after SIGTERM");
    assert!(mount_entry(&home.join("sub.moved/ckpt")).is_none());

    // Detached by hand while in use, a tmpfs mounted in its place: the old daemon
    // exits when the last user leaves, and the tmpfs stays.
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = run(ckptfs()
        .arg("mount")
        .arg(store.url())
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(work.path().join("cache2")))
    .success();
    let pid = daemon_pid_of(&out);
    let mut user = Command::new("sleep")
        .arg("600")
        .current_dir(mnt.join("latest"))
        .spawn()
        .unwrap();
    run(Command::new("umount").arg("-l").arg(&mnt)).success();
    let replacement = Tmpfs::on(&mnt);
    user.kill().unwrap();
    user.wait().unwrap();
    assert!(gone_soon(pid), "the old daemon still runs");
    assert!(
        replacement.still_mounted(),
        "the old daemon's exit unmounted the tmpfs"
    );
}

/// Exchanges two names (`renameat2(RENAME_EXCHANGE)`) in a loop on a thread of its
/// own, as an attacker racing a check and an action would, until dropped.
struct Swapper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapper {
    fn start(a: &Path, b: &Path, paused: bool) -> Swapper {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let pause = Arc::new(AtomicBool::new(paused));
        let a = CString::new(a.as_os_str().as_bytes()).unwrap();
        let b = CString::new(b.as_os_str().as_bytes()).unwrap();
        let (stopped, held) = (Arc::clone(&stop), Arc::clone(&pause));
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if held.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                // SAFETY: two valid C strings; renameat2 has no other preconditions.
                unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    );
                }
            }
        });
        Swapper {
            stop,
            paused: pause,
            thread: Some(thread),
        }
    }

    /// Holds the swapping (and lets a swap under way end) or lets it go on.
    fn hold(&self, held: bool) {
        self.paused
            .store(held, std::sync::atomic::Ordering::Relaxed);
        if held {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A root daemon mounts on the very directory it checked: with the mount point's name
/// swapped in a loop (`renameat2` exchange) between an empty directory and a symlink
/// to a directory that is not empty, a start checked one and mounted on the other
/// (7 and 8 of 30 starts landed on the non-empty directory, hiding it, before the
/// daemon held the directory from its check to its mount). A race: correct code never
/// lands there; the old code would miss it in all 30 starts about twice in 10,000 runs.
#[test]
fn a_root_daemon_mounts_on_the_directory_it_checked() {
    let store = TestStore::local();
    let work = repo_temp_dir("swap-");
    make_small_tree(&work.path().join("src"), "swap");
    store.put(&work.path().join("src"), &[]);
    let victim = work.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("config"), b"root's\n").unwrap();
    let (m, alt) = (work.path().join("m"), work.path().join("m_alt"));
    fs::create_dir(&m).unwrap();
    std::os::unix::fs::symlink(&victim, &alt).unwrap();

    let swapper = Swapper::start(&m, &alt, false);
    let mut on_victim = 0;
    for attempt in 0..30 {
        let out = run(ckptfs()
            .arg("mount")
            .arg(store.url())
            .arg(&m)
            .arg("--cache-dir")
            .arg(work.path().join(format!("cache{attempt}"))));
        swapper.hold(true);
        if mount_entry(&victim).is_some() {
            on_victim += 1;
            let _ = Command::new("umount").arg("-l").arg(&victim).status();
        }
        for point in [&m, &alt] {
            if mount_entry(point).is_some() {
                let _ = Command::new("umount").arg("-l").arg(point).status();
            }
        }
        if out.status.success() {
            let pid = daemon_pid_of(&out);
            assert!(gone_soon(pid), "daemon {pid} still runs after its unmount");
        }
        swapper.hold(false);
    }
    drop(swapper);
    assert_eq!(on_victim, 0, "mounted over the non-empty directory");
    assert_eq!(fs::read(victim.join("config")).unwrap(), b"root's\n");
}

/// A root daemon started on a dead mount detaches that mount and no other: with the
/// path to it exchanged in a loop with a path to a live mount (two symlinks swapped by
/// `renameat2`), a start probed the dead mount by one resolution of the path and
/// detached what another resolution led to (the thirteenth review's tmpfs, at the
/// third and fifth tries). A race: correct code never detaches the live mount.
#[test]
fn a_root_daemon_detaches_the_dead_mount_it_probed_and_no_other() {
    let store = TestStore::local();
    let work = repo_temp_dir("dead-swap-");
    make_small_tree(&work.path().join("src"), "dead");
    store.put(&work.path().join("src"), &[]);
    let (dead_home, live_home) = (work.path().join("A"), work.path().join("T"));
    fs::create_dir_all(dead_home.join("shm")).unwrap();
    fs::create_dir_all(live_home.join("shm")).unwrap();
    let live = Tmpfs::on(&live_home.join("shm"));
    let (x, y) = (work.path().join("x"), work.path().join("y"));
    std::os::unix::fs::symlink(&dead_home, &x).unwrap();
    std::os::unix::fs::symlink(&live_home, &y).unwrap();
    let dead_point = dead_home.join("shm");
    let _unmount = LazyUnmount(dead_point.clone());

    let swapper = Swapper::start(&x, &y, true);
    for attempt in 0..20 {
        // A dead mount on A/shm: a daemon killed.
        let out = run(ckptfs()
            .arg("mount")
            .arg(store.url())
            .arg(&dead_point)
            .arg("--cache-dir")
            .arg(work.path().join(format!("dead{attempt}"))))
        .success();
        let pid = daemon_pid_of(&out);
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
        assert!(gone_soon(pid));
        swapper.hold(false);
        let out = run(ckptfs()
            .arg("mount")
            .arg(store.url())
            .arg(x.join("shm"))
            .arg("--cache-dir")
            .arg(work.path().join(format!("again{attempt}"))));
        swapper.hold(true);
        assert!(
            live.still_mounted(),
            "attempt {attempt} detached the live mount: {out}"
        );
        if out.status.success() {
            // SAFETY: as above.
            unsafe { libc::kill(daemon_pid_of(&out) as libc::pid_t, libc::SIGKILL) };
        }
        while mount_entry(&dead_point).is_some() {
            run(Command::new("umount").arg("-l").arg(&dead_point)).success();
        }
    }
}
