//! The hostile-archive corpus (the security issue's acceptance test): every archive runs
//! through `verify`, `get` and the mount, and must end with a clear error or a safe
//! result, with no crash, no hang, bounded memory, and nothing outside DEST touched.
//!
//! The archives and the test are in [`corpus`]; this file holds the tools it needs:
//! running a command while reading its peak RSS (`wait4`), finding the mount daemon
//! and its peak RSS (`VmHWM`), the sandbox (an outside directory next to DEST), a
//! snapshot of everything an escape could change outside DEST, and a one-line-per-
//! entry description of what a restore left in DEST.

mod corpus;
mod deep;
mod dest_race;
mod memory;
mod review;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use tempfile::TempDir;

use crate::util::tree::{set_mtime, write_file};
use crate::util::{Output, describe, sha256_hex, temp_dir};

/// Most memory (peak RSS) a command may use.
pub const MAX_RSS_KIB: u64 = 150 * 1024;
/// Most memory (peak RSS) the mount daemon may use: what a command may, plus for each
/// of its loaders (2 on a 2-core machine) what member reuse holds on a load (up to
/// 4 MiB of compressed look-ahead and a member's tar kept for its record, a vector
/// growing to 4 MiB) and the allocator's slack. A corpus run reached 152.6 MiB.
pub const MAX_DAEMON_RSS_KIB: u64 = 200 * 1024;

/// A finished command, its peak RSS and how long it ran.
pub struct Measured {
    pub out: Output,
    pub max_rss_kib: u64,
    pub elapsed: Duration,
}

/// Runs `cmd` with stdout and stderr read on threads, under GNU `time` to learn its
/// peak RSS. (The `ru_maxrss` of a child of the test process itself counts the test
/// process's own memory, which the child shared until its `exec`: `time` is a small
/// parent.) The child gets a soft limit of 1024 open files, the usual default, so
/// that a restore that needs one descriptor per level of a deep tree shows it. After
/// `limit` the child is killed and `Err` says so.
pub fn run_measured(given: &mut Command, limit: Duration) -> Result<Measured, String> {
    let what = describe(given);
    let rss_file = tempfile::NamedTempFile::new().map_err(|e| format!("temp file: {e}"))?;
    let mut timed = Command::new("/usr/bin/time");
    timed
        .args(["-f", "%M", "-o"])
        .arg(rss_file.path())
        .arg(given.get_program())
        .args(given.get_args());
    for (key, value) in given.get_envs() {
        match value {
            Some(value) => timed.env(key, value),
            None => timed.env_remove(key),
        };
    }
    if let Some(dir) = given.get_current_dir() {
        timed.current_dir(dir);
    }
    // Its own process group, so that a timeout stops `time` and the command alike.
    timed.process_group(0);
    let cmd = &mut timed;
    // SAFETY: setrlimit is async-signal-safe and reads only the local struct.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                lim.rlim_cur = lim.rlim_cur.min(1024);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{what}`: {e}"))?;
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_reader = reader(Box::new(child.stdout.take().expect("piped")));
    let err_reader = reader(Box::new(child.stderr.take().expect("piped")));
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: status and usage are valid for writes; pid is our unreaped child.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(format!(
                "wait4 `{what}`: {}",
                std::io::Error::last_os_error()
            ));
        }
        if !timed_out && started.elapsed() > limit {
            timed_out = true;
            // SAFETY: kill has no memory-safety preconditions; the group is our child's.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if timed_out {
        return Err(format!(
            "`{what}` did not finish within {limit:?} (killed); stderr:\n{stderr}"
        ));
    }
    Ok(Measured {
        out: Output {
            what,
            status: ExitStatus::from_raw(status),
            stdout,
            stderr,
        },
        max_rss_kib: fs::read_to_string(rss_file.path())
            .ok()
            .and_then(|text| text.lines().last().and_then(|l| l.trim().parse().ok()))
            .unwrap_or(usage.ru_maxrss as u64),
        elapsed,
    })
}

/// The pid of the `ckptfs mount` process serving `mountpoint` (read from /proc).
pub fn daemon_pid(mountpoint: &Path) -> Option<u32> {
    let want = mountpoint.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_ckptfs = args.first()?.ends_with(b"ckptfs");
        (is_ckptfs && args.get(1) == Some(&&b"mount"[..]) && args.contains(&want)).then_some(pid)
    })
}

/// `VmHWM` (peak RSS, KiB) of a live process.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `VmRSS` (resident memory now, KiB) of a live process.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What an escape could change under `base`, path by path: type, mode, link count,
/// size, mtime and ctime (ns), and the content's hash or the link's target. DEST and
/// everything in it are left out; its parent, whose times and link count move when
/// DEST comes and goes, is recorded by type and mode only (an entry an escape puts
/// there still shows as a new path).
pub fn snapshot(base: &Path, dest: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(path: &Path, base: &Path, dest: &Path, out: &mut BTreeMap<PathBuf, String>) {
        if path.starts_with(dest) {
            return;
        }
        let md = fs::symlink_metadata(path).expect("lstat under the base dir");
        let rel = path.strip_prefix(base).unwrap().to_path_buf();
        let kind = md.file_type();
        let mut line = format!("mode={:o}", md.mode());
        if Some(path) != dest.parent() {
            line += &format!(
                " nlink={} size={} mtime={}.{} ctime={}.{}",
                md.nlink(),
                md.size(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec()
            );
            if kind.is_file() {
                line += &format!(" sha256={}", sha256_hex(&fs::read(path).expect("read")));
            } else if kind.is_symlink() {
                line += &format!(" -> {}", fs::read_link(path).unwrap().display());
            }
        }
        out.insert(rel, line);
        if kind.is_dir() {
            let mut children: Vec<PathBuf> = fs::read_dir(path)
                .expect("read dir under the base dir")
                .map(|e| e.expect("dir entry").path())
                .collect();
            children.sort();
            for child in children {
                walk(&child, base, dest, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(base, base, dest, &mut out);
    out
}

/// The differences between two snapshots, one line each.
pub fn snapshot_diff(
    before: &BTreeMap<PathBuf, String>,
    after: &BTreeMap<PathBuf, String>,
) -> Vec<String> {
    let mut diff = Vec::new();
    for (path, was) in before {
        match after.get(path) {
            None => diff.push(format!("removed {}", path.display())),
            Some(now) if now != was => {
                diff.push(format!("changed {}: {was} => {now}", path.display()))
            }
            Some(_) => {}
        }
    }
    for (path, now) in after {
        if !before.contains_key(path) {
            diff.push(format!("created {} ({now})", path.display()));
        }
    }
    diff
}

/// The test's base dir: `outside/` (the target of every escape: `secret`, mode 0600
/// with an old mtime, and `sub/keep`) next to `work/`, the parent of DEST.
struct Sandbox {
    base: TempDir,
    dest: PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        let base = temp_dir();
        let dest = base.path().join("work/dest");
        let sandbox = Sandbox { base, dest };
        sandbox.build();
        sandbox
    }

    fn outside(&self) -> PathBuf {
        self.base.path().join("outside")
    }

    fn build(&self) {
        let outside = self.outside();
        write_file(&outside.join("secret"), b"secret\n", 0o600);
        write_file(&outside.join("sub/keep"), b"keep\n", 0o644);
        fs::create_dir_all(self.base.path().join("work")).unwrap();
        for (path, time) in [("secret", 1_000_000_000), ("sub/keep", 1_000_000_100)] {
            set_mtime(&outside.join(path), time);
        }
        set_mtime(&outside.join("sub"), 1_000_000_200);
        set_mtime(&outside, 1_000_000_300);
    }

    /// Puts everything back after a case changed something outside DEST.
    fn reset(&self) {
        for entry in fs::read_dir(self.base.path()).unwrap() {
            remove_tree(&entry.unwrap().path());
        }
        self.build();
    }

    fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        snapshot(self.base.path(), &self.dest)
    }
}

/// Removes a tree whatever its modes (a restore may leave 0555 directories).
fn remove_tree(path: &Path) {
    let Ok(md) = fs::symlink_metadata(path) else {
        return;
    };
    if !md.is_dir() {
        return fs::remove_file(path).unwrap();
    }
    if fs::remove_dir_all(path).is_err() {
        let _ = Command::new("chmod")
            .arg("-R")
            .arg("u+rwx")
            .arg(path)
            .status();
        fs::remove_dir_all(path).unwrap_or_else(|e| panic!("remove {}: {e}", path.display()));
    }
}

/// DEST as sorted lines: `dir/ MODE`, `file MODE =CONTENT` (or `<N bytes>` past 32),
/// `link -> TARGET`; names and contents escaped as ASCII.
fn describe_tree(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().as_bytes().escape_ascii());
            let md = fs::symlink_metadata(entry.path()).unwrap();
            let mode = md.permissions().mode() & 0o7777;
            if md.is_dir() {
                out.push(format!("{name}/ {mode:o}"));
                walk(&entry.path(), &format!("{name}/"), out);
            } else if md.is_symlink() {
                let target = fs::read_link(entry.path()).unwrap();
                out.push(format!(
                    "{name} -> {}",
                    target.as_os_str().as_bytes().escape_ascii()
                ));
            } else if md.is_file() {
                let data = fs::read(entry.path()).unwrap();
                let shown = if data.len() <= 32 {
                    format!("={}", data.escape_ascii())
                } else {
                    format!("<{} bytes>", data.len())
                };
                out.push(format!("{name} {mode:o} {shown}"));
            } else {
                out.push(format!("{name} ?{mode:o}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out);
    out.sort();
    out
}

/// One case's outcome, for the report.
struct Outcome {
    id: &'static str,
    what: &'static str,
    get: String,
    rss_kib: u64,
    secs: f64,
    mount: String,
}

/// Prints the outcomes, one case a line (shown with `--nocapture`).
fn report(title: &str, outcomes: &[Outcome]) {
    println!("{title}");
    for o in outcomes {
        let rss = o.rss_kib as f64 / 1024.0;
        println!(
            "{:4} {:<62} get {:5.1} MiB {:5.2} s  {}",
            o.id, o.what, rss, o.secs, o.get
        );
        if !o.mount.is_empty() {
            println!("{:67} mount: {}", "", o.mount);
        }
    }
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(listing) = fs::read_dir(dir) else {
        return 0;
    };
    listing
        .flatten()
        .map(|e| match e.metadata() {
            Ok(md) if md.is_dir() => dir_bytes(&e.path()),
            Ok(md) => md.len(),
            Err(_) => 0,
        })
        .sum()
}
