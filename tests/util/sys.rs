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
