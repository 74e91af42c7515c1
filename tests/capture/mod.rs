//! Capture through the mount (SPEC section 4): workspaces made in `MNT/staging/` with
//! ordinary tools (`cp -a`, `tar -x`, `git`, `std::fs`) and sealed with
//! `mv MNT/staging/NAME MNT/commit/`, on a real FUSE mount of a bucket on the test S3
//! server (moto, started by `scripts/test.sh`).
//!
//! - [`seal`]: a full workspace sealed and checked against the object, `tar -xzf`, the
//!   mounted checkpoint and `ckptfs put`; two replicas sealing the same tree at once;
//!   the same tree sealed again while its checkpoint is being read.
//! - [`failures`]: a seal over the archive limit (EFBIG) and one whose upload is cut
//!   (EIO), each leaving the staged workspace and the bucket untouched; then a retry.
//! - [`posix`]: `staging/` as a POSIX directory: an fsx-style randomized run, the usual
//!   edge cases, a file open several times at once, and the tools that build workspaces
//!   (`tar -x`, `git`, `rsync -a` when installed).
//! - [`fork`]: `ckptfs fork`: the checkpoint's tree, sealed as `put` would with it as
//!   parent, written without touching the checkpoint, refused without leftovers.
//! - [`errnos`]: what refused operations answer (EEXIST, EPERM, EBUSY, EROFS).
//! - [`attacks`]: a hostile writer in staging: writers racing seals, chmod of staged
//!   symlinks, a planted object under a seal's name, staging and cache directories
//!   that are not the daemon's own.
//!
//! Every test has its own bucket, cache, staging dir and mount point under
//! `.tmp/tests/` (see [`crate::util::mount`]), and unmounts on drop. Needs root (or fuse access), `fusermount3` and
//! GNU tools.

mod attacks;
mod errnos;
mod failures;
mod fork;
mod posix;
mod seal;

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use crate::util::tree::{fix_mtimes, make_sample_tree, random_bytes, write_file};
use crate::util::{Output, run};

/// Size of the sparse file of [`make_workspace`]: 1 MiB of data, a hole, 1 MiB of data.
const SPARSE_SIZE: u64 = 20 * 1024 * 1024;

/// A workspace with every kind of entry a capture must carry: the reference tree of
/// `util::tree` (nested dirs, symlinks, a hard-link pair, an executable, an empty file
/// and dir, a non-UTF-8 name, odd modes and owners) plus a 20 MB sparse file with a
/// hole in the middle. Mtimes are fixed whole seconds.
pub fn make_workspace(root: &Path) {
    make_sample_tree(root);
    write_file(&root.join("data/.keep"), b"", 0o644);
    let sparse = File::create(root.join("data/sparse.img")).expect("create sparse file");
    let mib = 1024 * 1024;
    sparse
        .write_all_at(&random_bytes(mib, 11), 0)
        .expect("write sparse head");
    sparse
        .write_all_at(&random_bytes(mib, 12), SPARSE_SIZE - mib as u64)
        .expect("write sparse tail");
    drop(sparse);
    fix_mtimes(root);
}

/// `cp -a SRC DST`, expected to succeed.
#[track_caller]
pub fn cp_a(src: &Path, dst: &Path) {
    run(Command::new("cp").arg("-a").arg(src).arg(dst)).success();
}

/// `sh -c SCRIPT sh ARGS...`, whatever its exit status.
pub fn sh(script: &str, args: &[&Path]) -> Output {
    run(Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args))
}

/// `tar -xzf` of `archive` (bytes) into a new directory `dest`.
#[track_caller]
pub fn tar_xzf(archive: &[u8], dest: &Path) {
    let file = dest.with_extension("tar.gz");
    fs::write(&file, archive).expect("write the archive");
    fs::create_dir_all(dest).expect("create extraction dir");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&file)
        .arg("-C")
        .arg(dest))
    .success();
}
