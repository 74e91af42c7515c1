//! `get`'s restore on arbitrary tar streams: whatever the archive says, nothing outside
//! DEST is created, changed, linked or chmodded, and a failed restore leaves DEST empty.
#![no_main]

use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use ckptfs::archive::{Limits, extract};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_entries: 10_000,
    max_unpacked_bytes: 16 << 20,
    max_metadata_bytes: 16 << 20,
};

/// (path, kind, mode, nlink, size, mtime) of everything under `root` but DEST.
fn snapshot(root: &Path) -> Vec<(String, u32, u32, u64, u64, i64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if path == root.join("work/dest") {
                continue;
            }
            let m = fs::symlink_metadata(&path).unwrap();
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.push((path.display().to_string(), m.mode() & 0o170000, m.mode() & 0o7777, m.nlink(), m.size(), m.mtime()));
        }
    }
    out.sort();
    out
}

fuzz_target!(|data: &[u8]| {
    let base = tempfile::tempdir().unwrap();
    let root = base.path();
    // An outside world for the archive to aim at: absolute and relative links to it
    // are what hostile archives name (`../outside/secret`, `/tmp/.../outside`).
    fs::create_dir_all(root.join("outside/dir")).unwrap();
    fs::write(root.join("outside/secret"), b"secret").unwrap();
    fs::create_dir(root.join("work")).unwrap();
    symlink(root.join("outside"), root.join("work/link-to-outside")).unwrap();
    // DEST exists and is empty, so that the restore changes nothing around it.
    let dest = root.join("work/dest");
    fs::create_dir(&dest).unwrap();
    let before = snapshot(root);
    let result = extract::extract(data, &dest, LIMITS);
    assert_eq!(snapshot(root), before, "something outside DEST changed");
    assert_eq!(fs::read(root.join("outside/secret")).unwrap(), b"secret");
    if result.is_err() {
        assert!(!dest.exists() || fs::read_dir(&dest).unwrap().next().is_none(), "a failed restore left files in DEST");
    }
});
