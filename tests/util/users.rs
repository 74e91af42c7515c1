//! Acting as another user (uid 65534, `nobody`): a place every user can reach, the
//! binary copied there, and the system settings a non-root FUSE mount needs, changed
//! for a test and restored after it.
//!
//! The checkout may sit under a directory other users cannot enter (a 0700 home, or
//! `mktemp -d`), so nothing another user runs or opens is taken from it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use tempfile::TempDir;

pub const NOBODY: u32 = 65534;

/// A command that runs what follows as user and group 65534, no other groups, with
/// `HOME` somewhere it cannot write.
pub fn as_nobody() -> Command {
    as_user(NOBODY)
}

/// A command that runs what follows as user and group `id` (no account needed), no
/// other groups, with `HOME` somewhere it cannot write.
pub fn as_user(id: u32) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg("--reuid")
        .arg(id.to_string())
        .arg("--regid")
        .arg(id.to_string())
        .arg("--clear-groups")
        .env("HOME", "/nonexistent")
        .env_remove("XDG_CACHE_HOME");
    cmd
}

/// A fresh directory under the system's temporary directory, 0755: every user can
/// reach what is in it.
pub fn shared_temp_dir(prefix: &str) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create a temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The ckptfs binary, copied once to a place every user can run it from.
pub fn shared_binary() -> PathBuf {
    static COPY: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = COPY.get_or_init(|| {
        let dir = shared_temp_dir("ckptfs-bin-");
        let path = dir.path().join("ckptfs");
        fs::copy(env!("CARGO_BIN_EXE_ckptfs"), &path).expect("copy the binary");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    });
    path.clone()
}

/// A directory of `shared_temp_dir`'s, made and owned by nobody.
pub fn nobodys_dir(path: &Path) {
    fs::create_dir(path).unwrap();
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

/// While held, other users may open `/dev/fuse` (0666, as most distributions ship
/// it) and mount with `allow_other` (`user_allow_other` in `/etc/fuse.conf`); both
/// are put back as they were when it is dropped, even by a panic. Tests that hold
/// one run one at a time.
pub struct FuseForUsers {
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    dev_mode: u32,
    conf: Option<Vec<u8>>,
}

const FUSE_CONF: &str = "/etc/fuse.conf";

impl FuseForUsers {
    pub fn grant() -> Self {
        static ONE: Mutex<()> = Mutex::new(());
        let guard = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dev_mode = fs::metadata("/dev/fuse")
            .expect("/dev/fuse")
            .permissions()
            .mode();
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        let conf = fs::read(FUSE_CONF).ok();
        let mut granted = conf.clone().unwrap_or_default();
        if !granted.ends_with(b"\n") && !granted.is_empty() {
            granted.push(b'\n');
        }
        granted.extend_from_slice(b"user_allow_other\n");
        fs::write(FUSE_CONF, granted).unwrap();
        FuseForUsers {
            _one_at_a_time: guard,
            dev_mode,
            conf,
        }
    }
}

impl Drop for FuseForUsers {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.dev_mode));
        let _ = match &self.conf {
            Some(bytes) => fs::write(FUSE_CONF, bytes),
            None => fs::remove_file(FUSE_CONF),
        };
    }
}
