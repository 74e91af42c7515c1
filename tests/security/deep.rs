//! `get` of a deep tree costs what the archive holds, not entries × depth: the restore
//! used to open every directory of each entry's path from DEST again, one `openat` per
//! component, so a small archive of many files 2,000 levels deep kept it busy for
//! minutes (40 million opens), where the mount's indexer took a second.
//!
//! The restored tree is deeper than `PATH_MAX`, so it is read here the way the restore
//! writes it: from descriptors, one name at a time.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use rustix::fs::{self as rfs, Mode, OFlags};
use tar::EntryType::{self, Directory, GNULongLink, GNULongName, Link, Regular};

use super::{MAX_RSS_KIB, run_measured};
use crate::util::archive::{TarGz, raw_header};
use crate::util::mount::Mount;
use crate::util::{TestStore, ckptfs, sha256_hex, temp_dir};

/// Directories of the spine, each `d`; 2,003 is not a multiple of any small stride a
/// restore might keep descriptors at, so the walk back up to the spine's end is
/// exercised too.
const DEPTH: usize = 2003;
/// Directories at the end of the spine; the files go round-robin among them, so every
/// entry's parent differs from the previous entry's in its last component.
const BRANCHES: usize = 100;
const FILES: usize = 20_000;
/// Hard links, each in the branch after its target's: a link's target differs from
/// the previous link's in its last two components.
const LINKS: usize = 1_000;
/// Reopening every level for every entry, this restore took 176 s in a debug build
/// (the one the tests run) on a 2-core machine; reusing the directories entries share,
/// 7.5 s.
const TIME_LIMIT: Duration = Duration::from_secs(60);

const SPINE_MODE: u32 = 0o751;
const BRANCH_MODE: u32 = 0o750;

fn spine() -> String {
    "d/".repeat(DEPTH)
}

fn branch(i: usize) -> String {
    format!("{}b{:02}", spine(), i % BRANCHES)
}

/// A member named `path` (any length: a GNU long name when it needs one).
fn long_member(t: &mut TarGz, path: &str, kind: EntryType, mode: u32, data: &[u8]) {
    t.gnu_long(GNULongName, path.as_bytes());
    t.member(raw_header(b"long", kind, mode, 0, b""), data);
}

/// The spine's directories, then the branches, then the files round-robin, then the
/// links: 23,103 entries, about 100 MB of tar that compress to a few hundred KB.
fn deep_archive() -> Vec<u8> {
    let mut t = TarGz::new();
    for level in 1..=DEPTH {
        long_member(&mut t, &"d/".repeat(level), Directory, SPINE_MODE, b"");
    }
    for b in 0..BRANCHES {
        long_member(
            &mut t,
            &format!("{}/", branch(b)),
            Directory,
            BRANCH_MODE,
            b"",
        );
    }
    for i in 0..FILES {
        let path = format!("{}/f{i:05}", branch(i));
        long_member(&mut t, &path, Regular, 0o644, format!("{i}\n").as_bytes());
    }
    for i in 0..LINKS {
        let target = format!("{}/f{i:05}", branch(i));
        t.gnu_long(GNULongLink, target.as_bytes());
        let path = format!("{}/l{i:05}", branch(i + 1));
        long_member(&mut t, &path, Link, 0o644, b"");
    }
    t.end().finish()
}

fn open_in(dir: impl AsFd, name: &str) -> OwnedFd {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap_or_else(|e| panic!("open {name}: {e}"))
}

/// The names in `dir`, sorted.
fn names(dir: impl AsFd) -> Vec<String> {
    let mut listing = rfs::Dir::read_from(dir).expect("read a directory");
    let mut names = Vec::new();
    while let Some(entry) = listing.read() {
        let name = entry
            .expect("a directory entry")
            .file_name()
            .to_bytes()
            .to_vec();
        if name != b"." && name != b".." {
            names.push(String::from_utf8(name).expect("an ASCII name"));
        }
    }
    names.sort();
    names
}

fn mode(fd: impl AsFd) -> u32 {
    rfs::fstat(fd).expect("fstat").st_mode & 0o7777
}

/// Checks the restored tree: the spine (each level holding only the next, with its
/// mode), the branches (modes, names), every file's contents, every link's inode.
fn check_tree(dest: &std::path::Path) {
    let mut dir =
        rfs::open(dest, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("open DEST");
    for level in 1..=DEPTH {
        assert_eq!(names(&dir), ["d"], "level {level} of the spine");
        dir = open_in(&dir, "d");
        assert_eq!(mode(&dir), SPINE_MODE, "mode of spine level {level}");
    }
    let branches: Vec<String> = (0..BRANCHES).map(|b| format!("b{b:02}")).collect();
    assert_eq!(names(&dir), branches);
    for (b, name) in branches.iter().enumerate() {
        let branch = open_in(&dir, name);
        assert_eq!(mode(&branch), BRANCH_MODE, "mode of {name}");
        let mut want: Vec<String> = (b..FILES)
            .step_by(BRANCHES)
            .map(|i| format!("f{i:05}"))
            .collect();
        let links: Vec<usize> = (0..LINKS).filter(|i| (i + 1) % BRANCHES == b).collect();
        want.extend(links.iter().map(|i| format!("l{i:05}")));
        want.sort();
        assert_eq!(names(&branch), want, "the names in {name}");
        for i in (b..FILES).step_by(BRANCHES) {
            let mut data = String::new();
            std::fs::File::from(open_in(&branch, &format!("f{i:05}")))
                .read_to_string(&mut data)
                .expect("read a restored file");
            assert_eq!(data, format!("{i}\n"), "contents of {name}/f{i:05}");
        }
        for i in links {
            let target = open_in(&dir, &format!("b{:02}", i % BRANCHES));
            let stat = |dir: &OwnedFd, file: &str| {
                rfs::statat(
                    dir,
                    OsStr::from_bytes(file.as_bytes()),
                    rfs::AtFlags::empty(),
                )
                .expect("stat a restored file")
            };
            let (link, file) = (
                stat(&branch, &format!("l{i:05}")),
                stat(&target, &format!("f{i:05}")),
            );
            assert_eq!(
                (link.st_ino, link.st_nlink),
                (file.st_ino, 2),
                "{name}/l{i:05} is a hard link to its target"
            );
        }
    }
}

/// An archive planted in a local store, and where it is restored.
struct Planted {
    store: TestStore,
    sha: String,
    work: tempfile::TempDir,
}

impl Planted {
    fn dest(&self) -> std::path::PathBuf {
        self.work.path().join("dest")
    }
}

/// Plants `bytes` as a checkpoint and runs `ckptfs get` of it under [`TIME_LIMIT`].
fn planted_and_got(bytes: &[u8]) -> (Planted, super::Measured) {
    let sha = sha256_hex(bytes);
    let store = TestStore::local();
    store.write_object_bytes(&sha, bytes, Some((&sha, bytes.len() as u64)));
    let planted = Planted {
        store,
        sha,
        work: temp_dir(),
    };
    let mut get = ckptfs();
    get.arg("get")
        .arg(planted.store.url())
        .arg(&planted.sha)
        .arg(planted.dest());
    let measured = run_measured(&mut get, TIME_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    (planted, measured)
}

#[test]
fn a_deep_tree_of_many_files_is_restored_in_linear_time() {
    let bytes = deep_archive();
    let (planted, measured) = planted_and_got(&bytes);
    let dest = planted.dest();
    println!(
        "get of {} bytes ({FILES} files, {LINKS} links, {DEPTH} levels deep): {:.2} s, {} KiB peak RSS",
        bytes.len(),
        measured.elapsed.as_secs_f64(),
        measured.max_rss_kib
    );
    let out = measured.out.success();
    assert!(
        out.stderr
            .contains(&format!("{} entries", DEPTH + BRANCHES + FILES + LINKS)),
        "the summary counts every entry: {out}"
    );
    assert!(
        measured.max_rss_kib <= MAX_RSS_KIB,
        "get used {} KiB",
        measured.max_rss_kib
    );
    check_tree(&dest);
}

/// Entries that jump between two trees 2,040 levels deep: each one's parent shares
/// nothing with the previous one's, and a restore must reopen 2,040 directories for
/// it. The directories a path enters anew beyond 32 count as entries, in `get` and in
/// the mount alike, so this small archive (20,000 such entries) is refused after about
/// 1,000 of them, in seconds; a restore that did not count them took 15 s for 2,000
/// entries (debug build), minutes for all.
#[test]
fn entries_jumping_between_deep_trees_count_the_directories_they_enter_again() {
    let deep = "d/".repeat(2040);
    let mut t = TarGz::new();
    for i in 0..FILES {
        let tree = if i % 2 == 0 { "x" } else { "y" };
        long_member(
            &mut t,
            &format!("{tree}/{deep}f{i:05}"),
            Regular,
            0o644,
            b"x",
        );
    }
    let bytes = t.end().finish();
    let (planted, measured) = planted_and_got(&bytes);
    let (store, sha) = (&planted.store, &planted.sha);
    let dest = planted.dest();
    println!(
        "get of {} bytes ({FILES} files alternating between two trees 2,040 deep): {:.2} s",
        bytes.len(),
        measured.elapsed.as_secs_f64()
    );
    let out = measured.out.failure();
    assert!(
        out.one_line_error()
            .contains("more than 2000000 entries (--max-entries)"),
        "{out}"
    );
    assert!(!dest.exists(), "a failed get removes the DEST it made");

    let mount = Mount::new(store).start();
    let err = std::fs::read_dir(mount.join(sha)).map(drop).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let state = mount.status().state(sha).to_owned();
    assert!(state.contains("(--max-entries)"), "{state}");
}
