//! Mounting a store for real, for the mount and capture suites: [`Mount`] builds a
//! `ckptfs mount --foreground` command, [`MountedStore`] runs it until dropped, and
//! [`Status`] reads `.status`.
//!
//! Every mount lives in a temp dir under the repository's `.tmp/tests/` (which
//! `scripts/test.sh` sweeps for leftover FUSE mounts): `mnt/` is the mount point,
//! `cache/` the default cache dir, `staging/` the staging dir when asked for
//! ([`Mount::staging`]), `mount.log` the daemon's stderr. A mount is always unmounted
//! on drop, also when the test panics: `fusermount3 -u`, then SIGTERM and a lazy
//! `fusermount3 -uz` if that fails.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::util::{TestStore, ckptfs, is_sha256_hex, parse_rfc3339_utc};

/// Longest wait for a mount to appear, or for something to show in `.status`.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

/// A fresh temp dir under the repository's `.tmp/tests/`.
pub fn repo_temp_dir(prefix: &str) -> TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tmp/tests");
    fs::create_dir_all(&base).expect("create .tmp/tests");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .expect("create temp dir under .tmp/tests")
}

/// What to mount, and how.
pub struct Mount {
    store_url: String,
    mountpoint: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    staging: bool,
    endpoint: Option<String>,
    open_file_limit: Option<u64>,
    default_log_level: bool,
    reachable_by_all: bool,
    args: Vec<OsString>,
}

impl Mount {
    pub fn new(store: &TestStore) -> Self {
        Mount {
            store_url: store.url(),
            mountpoint: None,
            cache_dir: None,
            staging: false,
            endpoint: None,
            open_file_limit: None,
            default_log_level: false,
            reachable_by_all: false,
            args: Vec::new(),
        }
    }

    /// Mounts on this existing mount point (kept by the caller, e.g. the dead mount
    /// of a killed daemon) instead of a fresh `WORK/mnt`; [`Mount::start`] then waits
    /// until the mount point answers, not only until it shows as a mount.
    pub fn mountpoint(mut self, dir: &Path) -> Self {
        self.mountpoint = Some(dir.to_owned());
        self
    }

    /// Uses this cache dir (kept by the caller, e.g. across a restart) instead of a
    /// fresh one.
    pub fn cache_dir(mut self, dir: &Path) -> Self {
        self.cache_dir = Some(dir.to_owned());
        self
    }

    /// Keeps staged workspaces in a fresh dir of the mount's own (`--staging-dir
    /// WORK/staging`), which [`MountedStore::staging_dir`] shows, instead of the
    /// default folder in the cache dir.
    pub fn staging(mut self) -> Self {
        self.staging = true;
        self
    }

    /// `--part-size SIZE`: the part size of multipart uploads when sealing.
    pub fn part_size(self, size: &str) -> Self {
        self.args(["--part-size", size])
    }

    /// `--max-archive-size SIZE`.
    pub fn max_archive_size(self, size: &str) -> Self {
        self.args(["--max-archive-size", size])
    }

    /// Talks to S3 through this endpoint (a proxy) instead of the test server.
    pub fn endpoint(mut self, url: &str) -> Self {
        self.endpoint = Some(url.to_owned());
        self
    }

    /// Extra `ckptfs mount` options.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the daemon with this limit on open files (soft and hard), which it
    /// cannot raise.
    /// The mount point (and the daemon's directories) in a 0755 directory of the
    /// system's temporary directory, not the checkout's, whose parents other users
    /// may not be allowed to enter.
    pub fn reachable_by_all(mut self) -> Self {
        self.reachable_by_all = true;
        self
    }

    /// The daemon logs at its own default level, not at `RUST_LOG=info`.
    pub fn default_log_level(mut self) -> Self {
        self.default_log_level = true;
        self
    }

    pub fn open_file_limit(mut self, limit: u64) -> Self {
        self.open_file_limit = Some(limit);
        self
    }

    /// Mounts, and returns once the mount shows in `/proc/self/mountinfo`.
    #[track_caller]
    pub fn start(self) -> MountedStore {
        let work = if self.reachable_by_all {
            crate::util::users::shared_temp_dir("ckptfs-mount-")
        } else {
            repo_temp_dir("mount-")
        };
        // Canonical, as /proc/self/mountinfo shows it.
        let work_path = fs::canonicalize(work.path()).expect("canonical temp dir");
        let reused_mountpoint = self.mountpoint.is_some();
        let mountpoint = self.mountpoint.unwrap_or_else(|| {
            let mountpoint = work_path.join("mnt");
            fs::create_dir(&mountpoint).expect("create mount point");
            mountpoint
        });
        let cache_dir = self.cache_dir.unwrap_or_else(|| work_path.join("cache"));
        let staging_dir = self.staging.then(|| work_path.join("staging"));
        let log = work_path.join("mount.log");
        let log_file = File::create(&log).expect("create mount log");
        let mut cmd = ckptfs();
        cmd.arg("mount")
            .arg(&self.store_url)
            .arg(&mountpoint)
            .arg("--foreground")
            .arg("--cache-dir")
            .arg(&cache_dir);
        if let Some(dir) = &staging_dir {
            cmd.arg("--staging-dir").arg(dir);
        }
        cmd.args(&self.args);
        if self.default_log_level {
            cmd.env_remove("RUST_LOG");
        } else {
            cmd.env("RUST_LOG", "info");
        }
        cmd.stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file);
        if let Some(endpoint) = &self.endpoint {
            cmd.env("AWS_ENDPOINT_URL", endpoint);
        }
        if let Some(limit) = self.open_file_limit {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: setrlimit is async-signal-safe and only reads `rlimit`, which the
            // closure owns.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start ckptfs mount: {e}"));
        let mut mounted = MountedStore {
            mountpoint,
            cache_dir,
            staging_dir,
            log,
            child: Some(child),
            _work: work,
        };
        mounted.wait_mounted(reused_mountpoint);
        mounted
    }
}

/// A running `ckptfs mount --foreground`, unmounted on drop.
pub struct MountedStore {
    mountpoint: PathBuf,
    cache_dir: PathBuf,
    staging_dir: Option<PathBuf>,
    log: PathBuf,
    child: Option<Child>,
    // Dropped last: the mount point and log live in it.
    _work: TempDir,
}

impl MountedStore {
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// A path inside the mount.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// `MNT/staging/NAME`.
    pub fn staged(&self, name: &str) -> PathBuf {
        self.mountpoint.join("staging").join(name)
    }

    /// `MNT/commit/NAME`.
    pub fn committed(&self, name: &str) -> PathBuf {
        self.mountpoint.join("commit").join(name)
    }

    /// The daemon's process id.
    #[track_caller]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// The mount's `--cache-dir` (sealed archives are written in its `tmp/`).
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// The backing directory of `staging/` on local disk; the mount must have been
    /// started with [`Mount::staging`].
    #[track_caller]
    pub fn staging_dir(&self) -> &Path {
        self.staging_dir
            .as_deref()
            .expect("mounted without Mount::staging")
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's log once it holds any of `lines`, waiting up to `timeout`.
    #[track_caller]
    pub fn wait_for_log(&self, lines: &[&str], timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let log = self.log_text();
            if lines.iter().any(|line| log.contains(line)) {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "none of {lines:?} in the log:\n{}",
                self.log_excerpt()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The daemon's warnings and errors so far (the last 40), for failure messages.
    pub fn log_excerpt(&self) -> String {
        let text = strip_ansi(&self.log_text());
        let notable: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        let start = notable.len().saturating_sub(40);
        format!(
            "daemon warnings and errors:\n{}",
            notable[start..].join("\n")
        )
    }

    /// The text of `.status`, as it is.
    #[track_caller]
    pub fn status_text(&self) -> String {
        fs::read_to_string(self.join(".status")).unwrap_or_else(|e| {
            panic!(
                "read .status: {e} (daemon: {})\nlog:\n{}",
                self.daemon_state(),
                self.log_text()
            )
        })
    }

    /// `.status`, parsed (and checked line by line).
    #[track_caller]
    pub fn status(&self) -> Status {
        Status::parse(&self.status_text())
    }

    /// `downloads: D` of the `.status` counters header, read without checking the rest
    /// of `.status`.
    #[track_caller]
    pub fn downloads(&self) -> u64 {
        let text = self.status_text();
        let header = text
            .lines()
            .find(|l| l.starts_with("# checkpoints: "))
            .unwrap_or_else(|| panic!("no `# checkpoints:` header in .status:\n{text}"));
        let after = header
            .split("; downloads: ")
            .nth(1)
            .unwrap_or_else(|| panic!("no `downloads:` counter in .status:\n{text}"));
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("bad downloads counter in .status:\n{text}"))
    }

    /// `commit/NAME`'s target, which must be `../<sha256>`; returns the sha256.
    #[track_caller]
    pub fn commit_target(&self, name: &str) -> String {
        let target = fs::read_link(self.committed(name))
            .unwrap_or_else(|e| panic!("readlink commit/{name}: {e}\n{}", self.log_excerpt()));
        let target = target.to_str().expect("UTF-8 link target");
        let sha = target
            .strip_prefix("../")
            .unwrap_or_else(|| panic!("commit/{name} -> {target}, expected ../<sha256>"));
        assert!(
            is_sha256_hex(sha),
            "commit/{name} -> {target}, expected ../<sha256>"
        );
        sha.to_owned()
    }

    /// The daemon's process state from `/proc` (`R`, `S`, `Z`...), for messages.
    pub fn daemon_state(&self) -> String {
        let Some(child) = &self.child else {
            return "reaped".into();
        };
        match fs::read_to_string(format!("/proc/{}/stat", child.id())) {
            Ok(stat) => stat
                .rsplit_once(") ")
                .map_or(stat.clone(), |(_, rest)| rest[..1].to_owned()),
            Err(e) => format!("unknown ({e})"),
        }
    }

    /// Waits until the mount shows in mountinfo; with `answering`, also until the
    /// mount point answers `statfs` (a dead mount there shows in mountinfo too, and a
    /// `stat` of it may answer from the kernel's attribute cache). The probe comes
    /// first: once it succeeds the dead mount is gone, so a mount shown after it is
    /// the new one.
    #[track_caller]
    fn wait_mounted(&mut self, answering: bool) {
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if (!answering || answers_statfs(&self.mountpoint))
                && mount_entry(&self.mountpoint).is_some()
            {
                return;
            }
            let child = self.child.as_mut().expect("daemon running");
            if let Some(status) = child.try_wait().expect("poll mount daemon") {
                self.child = None;
                panic!(
                    "ckptfs mount exited ({status}) before mounting; log:\n{}",
                    self.log_text()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{} did not show up as a mount within {MOUNT_TIMEOUT:?}; log:\n{}",
                    self.mountpoint.display(),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
    }

    /// The daemon's exit status, once it exited within `timeout`; `None` while it runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let status = wait_timeout(child, timeout)?;
        self.child = None;
        Some(status)
    }

    /// Whether the mount point shows in `/proc/self/mountinfo`.
    pub fn is_mounted(&self) -> bool {
        mount_entry(&self.mountpoint).is_some()
    }

    /// Unmounts with `fusermount3 -u` and returns the daemon's exit status.
    #[track_caller]
    pub fn unmount(mut self) -> ExitStatus {
        let status = self.stop();
        assert!(
            mount_entry(&self.mountpoint).is_none(),
            "{} is still mounted",
            self.mountpoint.display()
        );
        status.unwrap_or_else(|| panic!("the mount daemon had already exited"))
    }

    /// Sends SIGTERM and returns the daemon's exit status once it exited (after
    /// unmounting itself, as it should); panics if it does not exit within 10 s.
    #[track_caller]
    pub fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let status = wait_timeout(&mut child, Duration::from_secs(10));
        if status.is_none() {
            self.child = Some(child);
            panic!(
                "the daemon did not exit within 10 s of SIGTERM; log:\n{}",
                self.log_text()
            );
        }
        let still_mounted = mount_entry(&self.mountpoint).is_some();
        if still_mounted {
            fusermount(&["-u", "-z"], &self.mountpoint);
        }
        assert!(
            !still_mounted,
            "the daemon exited on SIGTERM without unmounting; log:\n{}",
            self.log_text()
        );
        status.unwrap()
    }

    /// Unmounts (politely, then by force) and reaps the daemon.
    fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if mount_entry(&self.mountpoint).is_some() && !fusermount(&["-u"], &self.mountpoint) {
            // Busy or stuck: let the daemon unmount itself, then detach lazily.
            // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = wait_timeout(&mut child, Duration::from_secs(5));
            if mount_entry(&self.mountpoint).is_some() {
                fusermount(&["-u", "-z"], &self.mountpoint);
            }
        }
        match wait_timeout(&mut child, Duration::from_secs(10)) {
            Some(status) => Some(status),
            None => {
                let _ = child.kill();
                child.wait().ok()
            }
        }
    }
}

impl Drop for MountedStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The text without ANSI colour sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `statfs(path)` succeeds; on a FUSE mount the kernel always asks the daemon.
fn answers_statfs(path: &Path) -> bool {
    let path = crate::util::sys::c_path(path);
    // SAFETY: `path` is NUL-terminated and `buf` is a writable statfs, both live
    // across the call.
    unsafe {
        let mut buf: libc::statfs = std::mem::zeroed();
        libc::statfs(path.as_ptr(), &mut buf) == 0
    }
}

fn fusermount(flags: &[&str], mountpoint: &Path) -> bool {
    Command::new("fusermount3")
        .args(flags)
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// Per-mount options (`rw,nosuid,nodev,...`).
    pub mount_options: Vec<String>,
    pub fs_type: String,
}

/// Undoes the octal escapes (`\040`) of mountinfo fields.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The mountinfo entry whose mount point is `path`, if mounted.
pub fn mount_entry(path: &Path) -> Option<MountEntry> {
    use std::os::unix::ffi::OsStrExt;
    let text = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let want = path.as_os_str().as_bytes();
    text.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 10 || unescape(fields[4]) != want {
            return None;
        }
        let dash = fields.iter().position(|f| *f == "-")?;
        Some(MountEntry {
            mount_options: fields[5].split(',').map(str::to_owned).collect(),
            fs_type: fields.get(dash + 1)?.to_string(),
        })
    })
}
/// `.status`, parsed: the counters header and one state per checkpoint.
#[derive(Debug, Clone)]
pub struct Status {
    pub text: String,
    pub checkpoints: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    pub downloads: u64,
    pub loaded_from_cache: u64,
    /// sha256 -> (size, time, state).
    pub lines: BTreeMap<String, StatusLine>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusLine {
    pub size: u64,
    pub time: String,
    /// `listed`, `verifying`, `verified` or `FAILED: <reason>`.
    pub state: String,
    /// For `verified`, where the verdict comes from and when: `<time> from the store`,
    /// `<time> when sealed by this mount`, or `<time> from the store, served from the
    /// cache (re-checked <time>)`.
    pub verdict: Option<String>,
}

impl Status {
    #[track_caller]
    pub fn parse(text: &str) -> Status {
        let mut counters = None;
        let mut lines = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(header) = line.strip_prefix('#') {
                if let Some(rest) = header.trim().strip_prefix("checkpoints: ") {
                    counters = Some(parse_counters(rest, text));
                }
                continue;
            }
            let fields: Vec<&str> = line.splitn(4, "  ").collect();
            assert!(
                fields.len() == 4 && is_sha256_hex(fields[0]),
                "bad .status line {line:?}:\n{text}"
            );
            let size = fields[1]
                .parse()
                .unwrap_or_else(|_| panic!("bad size in .status line {line:?}:\n{text}"));
            assert!(
                parse_rfc3339_utc(fields[2]).is_some(),
                "bad time in .status line {line:?}:\n{text}"
            );
            let (state, verdict) = match fields[3].strip_prefix("verified ") {
                Some(verdict) => ("verified".to_owned(), Some(verdict.to_owned())),
                None => (fields[3].to_owned(), None),
            };
            assert!(
                ["listed", "verifying"].contains(&state.as_str())
                    || state.starts_with("FAILED: ")
                    || verdict.as_deref().is_some_and(valid_verdict),
                "bad state in .status line {line:?}:\n{text}"
            );
            let previous = lines.insert(
                fields[0].to_owned(),
                StatusLine {
                    size,
                    time: fields[2].to_owned(),
                    state,
                    verdict,
                },
            );
            assert!(previous.is_none(), "checkpoint shown twice:\n{text}");
        }
        let [
            checkpoints,
            cache_bytes,
            cache_entries,
            downloads,
            loaded_from_cache,
        ] = counters
            .unwrap_or_else(|| panic!("no `# checkpoints: ...` header in .status:\n{text}"));
        assert_eq!(
            checkpoints,
            lines.len() as u64,
            "checkpoint count disagrees with the lines:\n{text}"
        );
        Status {
            text: text.to_owned(),
            checkpoints,
            cache_bytes,
            cache_entries,
            downloads,
            loaded_from_cache,
            lines,
        }
    }

    /// The state of checkpoint `sha` (`listed`, `verifying`, `verified`, `FAILED: ...`).
    #[track_caller]
    pub fn state(&self, sha: &str) -> &str {
        &self.line(sha).state
    }

    /// Where checkpoint `sha`'s verdict comes from, if verified (see [`StatusLine`]).
    #[track_caller]
    pub fn verdict(&self, sha: &str) -> Option<&str> {
        self.line(sha).verdict.as_deref()
    }

    #[track_caller]
    fn line(&self, sha: &str) -> &StatusLine {
        match self.lines.get(sha) {
            Some(line) => line,
            None => panic!("{sha} is not in .status:\n{}", self.text),
        }
    }
}

/// `<time> from the store`, `<time> when sealed by this mount`, or `<time> from the
/// store, served from the cache (re-checked <time>)`.
fn valid_verdict(verdict: &str) -> bool {
    let Some((time, rest)) = verdict.split_once(' ') else {
        return false;
    };
    let rechecked = rest
        .strip_prefix("from the store, served from the cache (re-checked ")
        .and_then(|r| r.strip_suffix(')'));
    parse_rfc3339_utc(time).is_some()
        && (rest == "from the store"
            || rest == "when sealed by this mount"
            || rechecked.is_some_and(|t| parse_rfc3339_utc(t).is_some()))
}

/// `N; cache: B bytes in E checkpoints; downloads: D; loaded from cache: R`.
#[track_caller]
fn parse_counters(rest: &str, text: &str) -> [u64; 5] {
    let bad = || -> ! { panic!("bad counters header in .status:\n{text}") };
    let numbers: Vec<u64> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or_else(|_| bad()))
        .collect();
    let expected_shape = format!(
        "{}; cache: {} bytes in {} checkpoints; downloads: {}; loaded from cache: {}",
        numbers.first().unwrap_or_else(|| bad()),
        numbers.get(1).unwrap_or_else(|| bad()),
        numbers.get(2).unwrap_or_else(|| bad()),
        numbers.get(3).unwrap_or_else(|| bad()),
        numbers.get(4).unwrap_or_else(|| bad()),
    );
    if rest.trim() != expected_shape || numbers.len() != 5 {
        bad();
    }
    [numbers[0], numbers[1], numbers[2], numbers[3], numbers[4]]
}
