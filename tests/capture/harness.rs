//! Mounting a store for capture tests: [`CaptureMount`] runs `ckptfs mount
//! --foreground` on a mount point of its own under the repository's `.tmp/tests/` and
//! unmounts on drop, also when the test panics (`fusermount3 -u`, then SIGTERM and a
//! lazy unmount).
//!
//! A trimmed copy of `tests/mount/harness.rs` (that module is private to the read-only
//! mount tests), plus what capture needs: a staging dir, the seal lines of `.status`,
//! and the errno of a failed call.

use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::util::{TestStore, ckptfs};

/// Longest wait for a mount to appear.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

/// A fresh temp dir under the repository's `.tmp/tests/` (which `scripts/test.sh`
/// sweeps for leftover FUSE mounts).
pub fn repo_temp_dir(prefix: &str) -> TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tmp/tests");
    fs::create_dir_all(&base).expect("create .tmp/tests");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .expect("create temp dir under .tmp/tests")
}

/// What to mount, and how.
pub struct MountOptions {
    store_url: String,
    endpoint: Option<String>,
    args: Vec<String>,
}

impl MountOptions {
    pub fn new(store: &TestStore) -> Self {
        MountOptions {
            store_url: store.url(),
            endpoint: None,
            args: Vec::new(),
        }
    }

    /// Talks to S3 through this endpoint (a proxy) instead of the test server.
    pub fn endpoint(mut self, url: &str) -> Self {
        self.endpoint = Some(url.to_owned());
        self
    }

    /// Extra `ckptfs mount` options.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Mounts with `--cache-dir WORK/cache --staging-dir WORK/staging`, and returns once
    /// the mount shows in `/proc/self/mountinfo`.
    #[track_caller]
    pub fn start(self) -> CaptureMount {
        let work = repo_temp_dir("capture-mount-");
        let mountpoint = work.path().join("mnt");
        fs::create_dir(&mountpoint).expect("create mount point");
        let cache_dir = work.path().join("cache");
        let staging_dir = work.path().join("staging");
        let log = work.path().join("mount.log");
        let log_file = File::create(&log).expect("create mount log");
        let mut cmd = ckptfs();
        cmd.arg("mount")
            .arg(&self.store_url)
            .arg(&mountpoint)
            .arg("--foreground")
            .arg("--cache-dir")
            .arg(&cache_dir)
            .arg("--staging-dir")
            .arg(&staging_dir)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file);
        if let Some(endpoint) = &self.endpoint {
            cmd.env("AWS_ENDPOINT_URL", endpoint);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start ckptfs mount: {e}"));
        let mut mounted = CaptureMount {
            mountpoint,
            staging_dir,
            log,
            child: Some(child),
            work,
        };
        mounted.wait_mounted();
        mounted
    }
}

/// A running `ckptfs mount --foreground`, unmounted on drop.
pub struct CaptureMount {
    mountpoint: PathBuf,
    staging_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    // Dropped last: the mount point and log live in it.
    work: TempDir,
}

impl CaptureMount {
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

    /// The mount's `--cache-dir` (sealed archives are written in its `tmp/`).
    pub fn cache_dir(&self) -> PathBuf {
        self.work.path().join("cache")
    }

    /// The backing directory of `staging/` on local disk.
    pub fn staging_dir(&self) -> &Path {
        &self.staging_dir
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
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

    /// The text of `.status`.
    #[track_caller]
    pub fn status(&self) -> String {
        fs::read_to_string(self.join(".status"))
            .unwrap_or_else(|e| panic!("read .status: {e}\n{}", self.log_excerpt()))
    }

    /// `downloads: D` of the `.status` counters header.
    #[track_caller]
    pub fn downloads(&self) -> u64 {
        let text = self.status();
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
            crate::util::is_sha256_hex(sha),
            "commit/{name} -> {target}, expected ../<sha256>"
        );
        sha.to_owned()
    }

    #[track_caller]
    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if is_mounted(&self.mountpoint) {
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

    /// Unmounts (politely, then by force) and reaps the daemon.
    fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if is_mounted(&self.mountpoint) && !fusermount(&["-u"], &self.mountpoint) {
            // Busy or stuck: let the daemon unmount itself, then detach lazily.
            // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = wait_timeout(&mut child, Duration::from_secs(5));
            if is_mounted(&self.mountpoint) {
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

impl Drop for CaptureMount {
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

/// Whether `path` is a mount point (per `/proc/self/mountinfo`).
fn is_mounted(path: &Path) -> bool {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let want = path.as_os_str().as_bytes();
    text.lines().any(|line| {
        line.split(' ')
            .nth(4)
            .is_some_and(|field| unescape(field) == want)
    })
}

/// The raw OS error of `result`, panicking if it succeeded.
#[track_caller]
pub fn errno_of<T: std::fmt::Debug>(what: &str, result: io::Result<T>) -> i32 {
    match result {
        Ok(value) => panic!("{what} succeeded ({value:?}); expected an error"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what} failed without an errno: {e}")),
    }
}

/// Asserts that `result` failed with `expected` (an errno such as `libc::EFBIG`).
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(what: &str, result: io::Result<T>, expected: i32) {
    let got = errno_of(what, result);
    assert_eq!(
        got,
        expected,
        "{what}: expected {} ({expected}), got {} ({got})",
        io::Error::from_raw_os_error(expected),
        io::Error::from_raw_os_error(got)
    );
}
