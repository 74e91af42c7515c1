//! Thin helpers around system calls and their errors: C paths, libc results as
//! `io::Result`s, and assertions on the errno of a failed call.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `path` as a NUL-terminated C string.
pub fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path without NUL")
}

/// The result of a libc call returning 0 or -1, as an `io::Result`.
pub fn libc_result(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

/// A fresh ext4 (`mkfs.ext4` defaults, with a journal) mounted by loop in a temp dir,
/// unmounted on drop: for tests that need a disk which gives a deleted file's inode
/// number to the next file at once (an ext4 without a journal, as some VM images
/// have, holds freed numbers back for minutes).
pub struct FreshExt4 {
    mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl FreshExt4 {
    #[track_caller]
    pub fn new(prefix: &str) -> FreshExt4 {
        use std::process::Command;
        let dir = crate::util::mount::repo_temp_dir(prefix);
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(256 << 20))
            .expect("create the disk image");
        crate::util::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image)).success();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("create the mount point");
        crate::util::run(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mnt),
        )
        .success();
        FreshExt4 { mnt, _dir: dir }
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for FreshExt4 {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut cmd = std::process::Command::new("umount");
            if lazy {
                cmd.arg("-l");
            }
            cmd.arg(&self.mnt)
                .status()
                .is_ok_and(|status| status.success())
        };
        if !umount(false) {
            umount(true);
        }
    }
}

/// `renameat2(a, b, RENAME_EXCHANGE)`: the two names swap what they name, at once.
pub fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    let (a, b) = (c_path(a), c_path(b));
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    libc_result(rc)
}
