//! Workspace trees for the tests: builders that cover every kind of entry a checkpoint
//! must carry, and a comparison that checks what `tar -xzf` would restore.
//!
//! Compared per entry (with `lstat`, never following links): name, file type,
//! `mode & 0o7777`, mtime (seconds), numeric owner, size, contents, symlink target,
//! and which regular files are hard links of each other. Not compared: the root's own
//! metadata, atime/ctime, inode numbers, and the mode and mtime of symlinks (Linux
//! ignores symlink modes, and Python's `tarfile` does not restore symlink mtimes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mtime base used for trees (2023-11-14), far from "now", whole seconds.
pub const BASE_MTIME: i64 = 1_700_000_000;

/// A file name that is not valid UTF-8 (`caf\xe9.txt`, Latin-1 "café").
pub fn non_utf8_name() -> OsString {
    OsStr::from_bytes(b"caf\xe9.txt").to_os_string()
}

/// Sets the mtime (and atime) of `path` to `secs`, without following a symlink.
pub fn set_mtime(path: &Path, secs: i64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let times = [
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: 0,
        },
    ];
    // SAFETY: c_path is a valid NUL-terminated string and times points to two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        rc,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Writes a file with the given contents and permission bits, creating parent dirs.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent dirs");
    }
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod file");
}

/// Creates a directory (and its parents).
pub fn make_dir(path: &Path) {
    fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

/// Sets the permission bits of `path`.
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Creates a symlink at `path` pointing to `target` (which need not exist).
pub fn symlink(target: impl AsRef<Path>, path: &Path) {
    std::os::unix::fs::symlink(target.as_ref(), path)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", path.display()));
}

/// Deterministic pseudo-random (incompressible) bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Gives every entry under `root` (and `root` itself) a fixed mtime derived from its
/// relative path, children before their directory so directory times stick.
pub fn fix_mtimes(root: &Path) {
    fn visit(root: &Path, path: &Path) {
        let md = fs::symlink_metadata(path).expect("lstat");
        if md.is_dir() {
            let mut children: Vec<PathBuf> = fs::read_dir(path)
                .expect("read_dir")
                .map(|e| e.expect("dir entry").path())
                .collect();
            children.sort();
            for child in children {
                visit(root, &child);
            }
        }
        let rel = path.strip_prefix(root).unwrap();
        // FNV-1a of the relative path, so times differ per entry but never per run.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in rel.as_os_str().as_bytes() {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        set_mtime(path, BASE_MTIME + (hash % 10_000_000) as i64);
    }
    visit(root, root);
}

/// Builds the reference workspace at `root` (created if needed): nested directories, a
/// deep and a long (>100 bytes) path, an empty file and an empty directory, modes 0755,
/// 0644, 0600, 0555 and 0700, relative, absolute, directory and dangling symlinks, a hard
/// link pair in different directories, a non-UTF-8 name, spaces and Unicode, a
/// compressible 300 KiB file, and (when running as root) a file and a directory owned
/// by uids/gids that have no name. Mtimes are fixed whole seconds.
pub fn make_sample_tree(root: &Path) {
    make_dir(root);
    write_file(
        &root.join("hello.py"),
        b"print('hello, checkpoint')\n",
        0o644,
    );
    write_file(&root.join("run.sh"), b"#!/bin/sh\necho run\n", 0o755);
    write_file(&root.join("empty"), b"", 0o644);
    write_file(
        &root.join("private.key"),
        b"-----not really a key-----\n",
        0o600,
    );
    let mut big = Vec::new();
    let mut i = 0u64;
    while big.len() < 300 * 1024 {
        big.extend_from_slice(format!("line {i:08}: the quick brown fox {}\n", i * i).as_bytes());
        i += 1;
    }
    write_file(&root.join("big.txt"), &big, 0o644);
    write_file(&root.join(non_utf8_name()), b"latin-1 name\n", 0o644);
    write_file(
        &root.join("with space & \u{fc}n\u{ef}c\u{f6}d\u{e9}.txt"),
        b"unicode\n",
        0o644,
    );
    write_file(
        &root.join("src/lib.rs"),
        b"pub fn answer() -> u32 { 42 }\n",
        0o644,
    );
    write_file(
        &root.join("src/nested/deep/dir/file.txt"),
        b"deep file\n",
        0o640,
    );
    let long_dir = root.join("src").join("d".repeat(60));
    write_file(
        &long_dir.join(format!("{}.txt", "long-name-".repeat(8))),
        b"a path longer than 100 bytes\n",
        0o644,
    );
    write_file(&root.join("bin/tool"), &random_bytes(10_000, 7), 0o755);
    make_dir(&root.join("emptydir"));
    chmod(&root.join("emptydir"), 0o700);
    write_file(&root.join("readonly/frozen.txt"), b"frozen\n", 0o444);
    symlink("hello.py", &root.join("link-rel"));
    symlink("src/nested", &root.join("link-dir"));
    symlink("does/not/exist", &root.join("dangling"));
    symlink("/nonexistent/absolute/target", &root.join("link-abs"));
    write_file(&root.join("hard-a"), b"shared by two names\n", 0o644);
    fs::hard_link(root.join("hard-a"), root.join("src/hard-b")).expect("hard link");
    // Numeric owners without a name; only root can give files away.
    write_file(&root.join("owned/by-1234.txt"), b"owned\n", 0o664);
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::lchown(root.join("owned/by-1234.txt"), Some(1234), Some(5678))
            .expect("chown file");
        std::os::unix::fs::lchown(root.join("owned"), Some(4321), Some(8765)).expect("chown dir");
    }
    chmod(&root.join("readonly"), 0o555);
    chmod(root, 0o755);
    fix_mtimes(root);
}

/// A small tree whose contents depend on `tag` (distinct tags give distinct archives).
pub fn make_small_tree(root: &Path, tag: &str) {
    make_dir(root);
    write_file(
        &root.join("note.txt"),
        format!("checkpoint {tag}\n").as_bytes(),
        0o644,
    );
    write_file(
        &root.join("sub/data.txt"),
        tag.repeat(200).as_bytes(),
        0o644,
    );
    fix_mtimes(root);
}

/// A tree holding `len` bytes of incompressible data in `blob.bin`, plus a small file.
pub fn make_random_tree(root: &Path, len: usize, seed: u64) {
    make_dir(root);
    write_file(&root.join("blob.bin"), &random_bytes(len, seed), 0o644);
    write_file(&root.join("README"), b"random payload\n", 0o644);
    fix_mtimes(root);
}

/// Every path under `root` (not following symlinks), relative, sorted; `root` excluded.
pub fn list_paths(root: &Path) -> BTreeSet<PathBuf> {
    fn visit(root: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            out.insert(path.strip_prefix(root).unwrap().to_path_buf());
            if fs::symlink_metadata(&path)
                .map(|m| m.is_dir())
                .unwrap_or(false)
            {
                visit(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    visit(root, root, &mut out);
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    File { size: u64, sha256: String },
    Dir,
    Symlink { target: PathBuf },
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: Kind,
    /// `mode & 0o7777`; `None` for symlinks.
    mode: Option<u32>,
    /// Whole seconds; `None` for symlinks.
    mtime: Option<i64>,
    uid: u32,
    gid: u32,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::File { size, sha256 } => write!(f, "file size={size} sha256={}", &sha256[..12])?,
            Kind::Dir => write!(f, "dir")?,
            Kind::Symlink { target } => write!(f, "symlink -> {}", target.display())?,
            Kind::Other(what) => write!(f, "{what}")?,
        }
        if let Some(mode) = self.mode {
            write!(f, " mode={mode:04o}")?;
        }
        if let Some(mtime) = self.mtime {
            write!(f, " mtime={mtime}")?;
        }
        write!(f, " owner={}:{}", self.uid, self.gid)
    }
}

struct Scan {
    entries: BTreeMap<PathBuf, Entry>,
    /// Sets of paths that share an inode (only groups of two or more).
    hard_links: BTreeSet<Vec<PathBuf>>,
}

fn scan(root: &Path) -> Scan {
    let mut entries = BTreeMap::new();
    let mut by_inode: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    for rel in list_paths(root) {
        let path = root.join(&rel);
        let md =
            fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
        let ft = md.file_type();
        let kind = if ft.is_file() {
            by_inode
                .entry((md.dev(), md.ino()))
                .or_default()
                .push(rel.clone());
            let data = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            Kind::File {
                size: md.len(),
                sha256: super::sha256_hex(&data),
            }
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink {
                target: fs::read_link(&path).expect("readlink"),
            }
        } else {
            Kind::Other(format!("special file (mode {:o})", md.mode()))
        };
        let is_link = ft.is_symlink();
        entries.insert(
            rel,
            Entry {
                kind,
                mode: (!is_link).then_some(md.mode() & 0o7777),
                mtime: (!is_link).then_some(md.mtime()),
                uid: md.uid(),
                gid: md.gid(),
            },
        );
    }
    let hard_links = by_inode
        .into_values()
        .filter(|paths| paths.len() > 1)
        .map(|mut paths| {
            paths.sort();
            paths
        })
        .collect();
    Scan {
        entries,
        hard_links,
    }
}

/// Differences between the trees at `expected` and `actual`, one readable line each
/// (empty when they match).
pub fn diff_trees(expected: &Path, actual: &Path) -> Vec<String> {
    let a = scan(expected);
    let b = scan(actual);
    let mut diffs = Vec::new();
    for (path, ea) in &a.entries {
        match b.entries.get(path) {
            None => diffs.push(format!("missing: {} ({ea})", path.display())),
            Some(eb) if ea != eb => diffs.push(format!(
                "differs: {}\n    expected {ea}\n    actual   {eb}",
                path.display()
            )),
            Some(_) => {}
        }
    }
    for (path, eb) in &b.entries {
        if !a.entries.contains_key(path) {
            diffs.push(format!("unexpected: {} ({eb})", path.display()));
        }
    }
    if a.hard_links != b.hard_links {
        diffs.push(format!(
            "hard-link groups differ:\n    expected {:?}\n    actual   {:?}",
            a.hard_links, b.hard_links
        ));
    }
    diffs
}

/// Panics with a readable diff unless the trees match (see the module docs).
#[track_caller]
pub fn assert_same_tree(expected: &Path, actual: &Path) {
    let diffs = diff_trees(expected, actual);
    assert!(
        diffs.is_empty(),
        "tree {} differs from {}:\n{}",
        actual.display(),
        expected.display(),
        diffs.join("\n")
    );
}

#[test]
fn tree_comparison_sees_every_attribute() {
    let work = super::temp_dir();
    let a = work.path().join("a");
    make_sample_tree(&a);
    let copy = |name: &str| {
        let dst = work.path().join(name);
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(&a)
            .arg(&dst)
            .status()
            .expect("run cp");
        assert!(status.success());
        assert!(
            diff_trees(&a, &dst).is_empty(),
            "{:?}",
            diff_trees(&a, &dst)
        );
        dst
    };
    type Change<'a> = (&'a str, &'a dyn Fn(&Path));
    let changes: [Change; 8] = [
        ("mode", &|t| chmod(&t.join("run.sh"), 0o744)),
        ("mtime", &|t| {
            set_mtime(&t.join("src/lib.rs"), BASE_MTIME - 1)
        }),
        ("dir mtime", &|t| set_mtime(&t.join("src"), BASE_MTIME - 1)),
        ("contents", &|t| {
            let p = t.join("hello.py");
            let md = fs::metadata(&p).unwrap();
            fs::write(&p, b"print('HELLO, checkpoint')\n").unwrap();
            set_mtime(&p, md.mtime());
        }),
        ("symlink target", &|t| {
            fs::remove_file(t.join("link-rel")).unwrap();
            symlink("run.sh", &t.join("link-rel"));
        }),
        ("hard link", &|t| {
            let p = t.join("src/hard-b");
            let md = fs::metadata(&p).unwrap();
            fs::remove_file(&p).unwrap();
            write_file(&p, b"shared by two names\n", 0o644);
            set_mtime(&p, md.mtime());
            set_mtime(&t.join("src"), fs::metadata(a.join("src")).unwrap().mtime());
        }),
        ("missing entry", &|t| {
            fs::remove_dir(t.join("emptydir")).unwrap()
        }),
        ("extra entry", &|t| write_file(&t.join("extra"), b"", 0o644)),
    ];
    for (i, (what, change)) in changes.iter().enumerate() {
        let b = copy(&format!("b{i}"));
        change(&b);
        let diffs = diff_trees(&a, &b);
        assert!(!diffs.is_empty(), "a {what} change went unnoticed");
        if *what == "hard link" {
            assert_eq!(diffs.len(), 1, "{diffs:?}");
            assert!(diffs[0].starts_with("hard-link groups differ"), "{diffs:?}");
        }
    }
}

/// A workspace of `files` random (incompressible) files of 300 KiB, `f000.bin`..., in
/// which file number `edited` (if any) has other contents: two turns that differ by
/// one file in the middle.
pub fn make_turn_tree(root: &Path, files: usize, edited: Option<usize>) {
    make_dir(root);
    for i in 0..files {
        let seed = if Some(i) == edited { 1_000_000 + i } else { i } as u64;
        write_file(
            &root.join(format!("f{i:03}.bin")),
            &random_bytes(300 << 10, seed),
            0o644,
        );
    }
    fix_mtimes(root);
}
