use super::*;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{PermissionsExt, symlink};

fn dir_fd(path: &Path) -> OwnedFd {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

fn archive_of(
    path: &Path,
    out: &mut Vec<u8>,
    options: &WriterOptions,
) -> Result<WrittenArchive, ArchiveError> {
    write_archive(dir_fd(path).as_fd(), out, options)
}

fn options() -> WriterOptions {
    WriterOptions {
        max_size: u64::MAX,
        max_unpacked: u64::MAX,
        threads: 2,
        members: None,
        tree: None,
    }
}

fn sample_tree(root: &Path, create_order_reversed: bool) {
    let mut names = vec!["b.txt", "a.txt", "c"];
    if create_order_reversed {
        names.reverse();
    }
    for name in names {
        if name == "c" {
            fs::create_dir(root.join(name)).unwrap();
            fs::write(root.join("c/inner"), b"inner").unwrap();
        } else {
            fs::write(root.join(name), name.as_bytes()).unwrap();
        }
    }
    symlink("a.txt", root.join("link")).unwrap();
    fs::set_permissions(root.join("a.txt"), fs::Permissions::from_mode(0o755)).unwrap();
    for p in ["a.txt", "b.txt", "c/inner", "c", ""] {
        let f = File::open(root.join(p)).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000))
            .unwrap();
    }
    // The symlink's own time too: two trees made across a second boundary must not
    // differ in it.
    let when = rustix::fs::Timespec {
        tv_sec: 1_700_000_000,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: when,
        last_modification: when,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        root.join("link"),
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

#[test]
fn same_tree_gives_same_bytes_whatever_the_creation_order() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    sample_tree(a.path(), false);
    sample_tree(b.path(), true);
    let mut out_a = Vec::new();
    let mut out_b = Vec::new();
    let wa = archive_of(a.path(), &mut out_a, &options()).unwrap();
    let wb = archive_of(b.path(), &mut out_b, &options()).unwrap();
    assert_eq!(wa, wb);
    assert_eq!(out_a, out_b);
    assert_eq!(wa.size, out_a.len() as u64);
    assert_eq!(wa.sha256, hex::encode(Sha256::digest(&out_a)));
}

#[test]
fn entries_are_sorted_and_relative() {
    let dir = tempfile::tempdir().unwrap();
    sample_tree(dir.path(), true);
    let entries = |mode: u32| -> Vec<(String, u32, u64)> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let mut out = Vec::new();
        archive_of(dir.path(), &mut out, &options()).unwrap();
        let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&out[..]));
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let header = e.header();
                let path = e.path().unwrap().display().to_string();
                (path, header.mode().unwrap(), header.mtime().unwrap())
            })
            .collect()
    };
    let names = |entries: &[(String, u32, u64)]| -> Vec<String> {
        entries.iter().map(|(p, _, _)| p.clone()).collect()
    };
    let open = entries(0o755);
    assert_eq!(names(&open), ["a.txt", "b.txt", "c", "c/inner", "link"]);
    // A root that keeps others out is written last, as `./`, with its mode, time 0.
    let private = entries(0o700);
    assert_eq!(names(&private[..5]), names(&open));
    assert_eq!(private[5], ("./".to_owned(), 0o700, 0));
    // So is one others may search but not list: its names are kept from them.
    // And one that keeps its group out.
    for mode in [0o711, 0o751, 0o744, 0o705] {
        assert_eq!(entries(mode)[5], ("./".to_owned(), mode, 0), "{mode:o}");
    }
    assert_eq!(entries(0o555).len(), 5);
}

#[test]
fn stops_at_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let noise: Vec<u8> = (0..200_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    fs::write(dir.path().join("noise"), noise).unwrap();
    let err = archive_of(
        dir.path(),
        &mut Vec::new(),
        &WriterOptions {
            max_size: 10_000,
            max_unpacked: u64::MAX,
            threads: 1,
            members: None,
            tree: None,
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, ArchiveError::TooLarge { limit: 10_000 }),
        "{err}"
    );
}

fn tar_bytes(archive: &[u8]) -> Vec<u8> {
    let mut tar = Vec::new();
    flate2::read::MultiGzDecoder::new(archive)
        .read_to_end(&mut tar)
        .unwrap();
    tar
}

/// A writer racing the archive swaps a file for a symlink to a secret outside the
/// tree, over and over, with `RENAME_EXCHANGE`: the archive may hold the file, the
/// link, or fail with "changed type", but never a byte of the secret.
#[test]
fn a_racing_writer_cannot_make_it_read_outside_the_tree() {
    let tree = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("credentials");
    fs::write(&secret, b"AKIA-SECRET-OUTSIDE-THE-TREE").unwrap();
    fs::create_dir(tree.path().join("d")).unwrap();
    fs::write(tree.path().join("d/file"), b"harmless contents").unwrap();
    symlink(&secret, tree.path().join("d/link")).unwrap();
    symlink(outside.path(), tree.path().join("d/dirlink")).unwrap();
    fs::create_dir(tree.path().join("d/sub")).unwrap();
    fs::write(tree.path().join("d/sub/file"), b"x").unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = std::sync::Arc::clone(&stop);
        let d = dir_fd(&tree.path().join("d"));
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (a, b) in [("file", "link"), ("sub", "dirlink")] {
                    rfs::renameat_with(&d, a, &d, b, rfs::RenameFlags::EXCHANGE).unwrap();
                    swaps += 1;
                }
            }
            swaps
        })
    };
    let (mut written, mut refused) = (0, 0);
    for _ in 0..400 {
        let mut out = Vec::new();
        match archive_of(tree.path(), &mut out, &options()) {
            Ok(_) => {
                written += 1;
                let tar = tar_bytes(&out);
                assert!(
                    !tar.windows(11).any(|w| w == b"AKIA-SECRET"),
                    "an archive holds the outside secret"
                );
            }
            Err(ArchiveError::Source { reason, .. }) if reason.contains("changed type") => {
                refused += 1
            }
            Err(ArchiveError::Io { cause, .. }) if cause.kind() == io::ErrorKind::NotFound => {
                refused += 1
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the race did not run ({swaps} swaps)");
    assert!(written > 0, "no archive was written ({refused} refused)");
    assert_eq!(fs::read(&secret).unwrap(), b"AKIA-SECRET-OUTSIDE-THE-TREE");
}

#[test]
fn deep_trees_do_not_exhaust_the_stack_and_long_paths_are_refused() {
    let tree = tempfile::tempdir().unwrap();
    let mut dir = dir_fd(tree.path());
    // 3,000 levels, built by descriptor: deeper than PATH_MAX allows as one path.
    for _ in 0..3000 {
        rfs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rfs::openat(&dir, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let err = archive_of(tree.path(), &mut Vec::new(), &options()).unwrap_err();
    assert!(err.to_string().contains("longer than 4096 bytes"), "{err}");
    crate::beneath::remove_at(dir_fd(tree.path()), OsStr::new("d")).unwrap();
}

/// The gzip members of an archive, each as its compressed bytes.
fn members(archive: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = archive;
    while !rest.is_empty() {
        let mut decoder = flate2::bufread::GzDecoder::new(rest);
        io::copy(&mut decoder, &mut io::sink()).unwrap();
        let left = decoder.into_inner().len();
        out.push(rest[..rest.len() - left].to_vec());
        rest = &rest[rest.len() - left..];
    }
    out
}

/// A workspace of 400 small text files in 20 directories and 6 large files of
/// 0.3-2.5 MiB.
fn workspace(root: &Path) {
    for d in 0..20 {
        let dir = root.join(format!("src/mod{d:02}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            let text: String = (0..(50 + (d * 20 + f) % 200))
                .map(|i| format!("fn f{d}_{f}_{i}() -> u64 {{ {} }}\n", i * 7919 % 1000))
                .collect();
            fs::write(dir.join(format!("f{f:02}.rs")), text).unwrap();
        }
    }
    for (i, kib) in [300u64, 700, 1200, 2500, 400, 900].into_iter().enumerate() {
        let data: Vec<u8> = (0..kib * 1024)
            .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i as u8)
            .collect();
        fs::write(root.join(format!("src/mod{:02}/blob{i}.bin", i * 3)), data).unwrap();
    }
}

/// Members of `after` that `before` does not have.
fn new_members(before: &[u8], after: &[u8]) -> (usize, usize) {
    let old: std::collections::HashSet<Vec<u8>> = members(before).into_iter().collect();
    let new = members(after);
    let changed = new.iter().filter(|m| !old.contains(*m)).count();
    (changed, new.len())
}

/// An edit, an addition or a removal changes only the members around it, wherever
/// it is in the tree: the member cuts do not move with the bytes before them.
#[test]
fn one_change_changes_only_the_members_around_it() {
    let tree = tempfile::tempdir().unwrap();
    workspace(tree.path());
    let mut first = Vec::new();
    archive_of(tree.path(), &mut first, &options()).unwrap();
    let count = members(&first).len();
    assert!(count >= 8, "{count} members");

    let mut previous = first;
    type Change = (&'static str, Box<dyn Fn(&Path)>);
    let changes: [Change; 4] = [
        (
            "edit early in the tree",
            Box::new(|r: &Path| fs::write(r.join("src/mod00/f03.rs"), "fn edited() {}\n").unwrap()),
        ),
        (
            "add a file",
            Box::new(|r: &Path| fs::write(r.join("src/mod05/new.rs"), "fn new() {}\n").unwrap()),
        ),
        (
            "remove a file",
            Box::new(|r: &Path| fs::remove_file(r.join("src/mod11/f07.rs")).unwrap()),
        ),
        (
            "grow a large file",
            Box::new(|r: &Path| {
                let path = r.join("src/mod03/blob1.bin");
                let mut data = fs::read(&path).unwrap();
                data.splice(1000..1000, b"inserted".iter().copied());
                fs::write(path, data).unwrap();
            }),
        ),
    ];
    for (what, change) in changes {
        change(tree.path());
        let mut next = Vec::new();
        archive_of(tree.path(), &mut next, &options()).unwrap();
        let (changed, total) = new_members(&previous, &next);
        // The member with the change, and where the change ends a group early or
        // makes a large file one chunk longer, the next one.
        assert!(changed <= 2, "{what}: {changed} of {total} members changed");
        assert!(changed >= 1, "{what}: no member changed");
        previous = next;
    }
}

/// The member cache changes how fast a capture is, never what it writes: a warm
/// cache, a cold one, none, and one with damaged or planted members all give the
/// same bytes, and damage is found and repaired.
#[test]
fn the_member_cache_reuses_members_and_never_changes_the_archive() {
    use crate::members::store::{MIN_KEPT, MemberCache};
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;
    use std::sync::atomic::Ordering::Relaxed;
    let tree = tempfile::tempdir().unwrap();
    workspace(tree.path());
    let cache_dir = tempfile::tempdir().unwrap();
    let members_dir = cache_dir.path().join("members");
    let open = |limit| Arc::new(MemberCache::open(&members_dir, limit).unwrap());
    // The encoder's directory, and the members in it.
    let encoder_dir = || {
        fs::read_dir(&members_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("v1-"))
            .unwrap()
    };
    let cached = || -> Vec<PathBuf> {
        let mut files: Vec<_> = fs::read_dir(encoder_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    };
    let with = |members: Option<Arc<MemberCache>>| {
        let mut out = Vec::new();
        let options = WriterOptions {
            members: members.map(|m| m as Arc<dyn MemberSource>),
            ..options()
        };
        archive_of(tree.path(), &mut out, &options).unwrap();
        out
    };
    let plain = with(None);
    let cold = open(u64::MAX);
    assert_eq!(with(Some(Arc::clone(&cold))), plain);
    let count = members(&plain).len() as u64;
    assert_eq!(cold.stats.compressed.load(Relaxed), count);

    // One file changed: every other member worth keeping comes from the cache.
    fs::write(tree.path().join("src/mod07/f11.rs"), "fn changed() {}\n").unwrap();
    let plain = with(None);
    let kept = members(&plain)
        .iter()
        .filter(|m| m.len() >= MIN_KEPT)
        .count() as u64;
    let warm = open(u64::MAX);
    assert_eq!(with(Some(Arc::clone(&warm))), plain);
    let reused = warm.stats.reused.load(Relaxed);
    assert!(
        reused + 2 >= kept && reused < count,
        "{reused} of {kept} reused"
    );

    // Damage, under the names of members this tree needs (a cache of this tree
    // only): a truncated member, garbage, a valid member of other data, a FIFO
    // (which must not block), and a symlink to a file outside.
    fs::remove_dir_all(&members_dir).unwrap();
    assert_eq!(with(Some(open(u64::MAX))), plain);
    let files = cached();
    assert!(files.len() >= 6, "{} members kept", files.len());
    let member = fs::read(&files[0]).unwrap();
    fs::write(&files[0], &member[..member.len() / 2]).unwrap();
    fs::write(&files[1], b"not gzip at all").unwrap();
    fs::write(&files[2], fs::read(&files[3]).unwrap()).unwrap();
    fs::remove_file(&files[4]).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &files[4],
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let outside = cache_dir.path().join("outside");
    fs::write(&outside, fs::read(&files[5]).unwrap()).unwrap();
    fs::remove_file(&files[5]).unwrap();
    symlink(&outside, &files[5]).unwrap();
    let repaired = open(u64::MAX);
    assert_eq!(with(Some(Arc::clone(&repaired))), plain);
    assert!(repaired.stats.damaged.load(Relaxed) >= 5);
    let again = open(u64::MAX);
    assert_eq!(with(Some(Arc::clone(&again))), plain);
    assert_eq!(
        again.stats.damaged.load(Relaxed),
        0,
        "damage was not repaired"
    );

    // Bounded by disk blocks: the least recently used members go first, and
    // nothing but members is removed (not what a symlink in the cache points to).
    symlink(&outside, encoder_dir().join("a".repeat(64))).unwrap();
    let small = open(64 << 10);
    assert_eq!(with(Some(small)), plain);
    let on_disk: u64 = cached()
        .iter()
        .map(|p| fs::symlink_metadata(p).unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum();
    assert!(on_disk <= 64 << 10, "{on_disk} bytes kept");
    assert!(outside.exists(), "trim removed a file outside the cache");

    // A member directory that is a symlink is refused, not followed.
    let elsewhere = tempfile::tempdir().unwrap();
    let linked = cache_dir.path().join("linked");
    symlink(elsewhere.path(), &linked).unwrap();
    assert!(MemberCache::open(&linked, 1 << 20).is_err());
}

/// A capture that fails (here: over the archive limit) still trims what it kept.
#[test]
fn a_failed_capture_leaves_the_member_cache_within_its_bound() {
    use crate::members::store::MemberCache;
    use std::os::unix::fs::MetadataExt;
    let tree = tempfile::tempdir().unwrap();
    workspace(tree.path());
    let cache_dir = tempfile::tempdir().unwrap();
    let members_dir = cache_dir.path().join("members");
    for round in 0..3 {
        fs::write(
            tree.path().join("src/mod00/f00.rs"),
            format!("round {round}\n"),
        )
        .unwrap();
        let options = WriterOptions {
            max_size: 100 << 10,
            members: Some(std::sync::Arc::new(
                MemberCache::open(&members_dir, 256 << 10).unwrap(),
            )),
            ..options()
        };
        let err = archive_of(tree.path(), &mut Vec::new(), &options).unwrap_err();
        assert!(matches!(err, ArchiveError::TooLarge { .. }), "{err}");
    }
    let mut on_disk = 0;
    for dir in fs::read_dir(&members_dir).unwrap() {
        for file in fs::read_dir(dir.unwrap().path()).unwrap() {
            on_disk += file.unwrap().metadata().unwrap().blocks() * 512;
        }
    }
    assert!(
        on_disk <= 256 << 10,
        "{on_disk} bytes kept after failed captures"
    );
}

/// A file whose change or modification time is within `RACY` of the capture is not
/// taken by its stamp: a second write in the same tick could leave the stamp as it was;
/// times without nanoseconds (a filesystem that keeps whole seconds) wait longer.
#[test]
fn recently_changed_files_are_not_taken_by_their_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, b"x").unwrap();
    let stat = rfs::stat(&file).unwrap();
    let walk_at = |start: SystemTime| Walk {
        hard_links: HashMap::new(),
        headers: tar::Builder::new(Vec::new()),
        start,
    };
    let changed =
        SystemTime::UNIX_EPOCH + Duration::new(stat.st_ctime as u64, stat.st_ctime_nsec as u32);
    assert!(!walk_at(changed).settled(&stat, Duration::ZERO));
    assert!(!walk_at(changed + RACY / 2).settled(&stat, Duration::ZERO));
    let fine = stat.st_ctime_nsec != 0 || stat.st_mtime_nsec != 0;
    assert_eq!(
        walk_at(changed + RACY * 2).settled(&stat, Duration::ZERO),
        fine
    );
    assert!(walk_at(changed + RACY_COARSE * 2).settled(&stat, Duration::ZERO));
    // A longer settling time asked for is kept.
    let minute = Duration::from_secs(60);
    assert!(!walk_at(changed + RACY_COARSE * 2).settled(&stat, minute));
    assert!(walk_at(changed + minute * 2).settled(&stat, minute));
    // Whole seconds only.
    let mut coarse = stat;
    coarse.st_ctime_nsec = 0;
    coarse.st_mtime_nsec = 0;
    let second = SystemTime::UNIX_EPOCH + Duration::from_secs(stat.st_ctime as u64);
    assert!(!walk_at(second + RACY * 2).settled(&coarse, Duration::ZERO));
    assert!(!walk_at(second + RACY_COARSE - RACY).settled(&coarse, Duration::ZERO));
    assert!(walk_at(second + RACY_COARSE * 2).settled(&coarse, Duration::ZERO));
    // An old modification time does not hide a recent change.
    let old = SystemTime::now() - Duration::from_secs(3600);
    File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert!(!walk_at(SystemTime::now()).settled(&rfs::stat(&file).unwrap(), Duration::ZERO));
}

/// Contents left unread are read again beneath the root only: another file under the
/// name is read (as a file that changes during a capture is) and reported, something
/// else than a file or a symlink on the way is an error.
#[test]
fn unread_contents_are_read_again_only_from_the_stamped_inode() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let path = dir.path().join("sub/f");
    fs::write(&path, b"0123456789").unwrap();
    let files = TreeFiles {
        root: dir_fd(dir.path()),
    };
    let meta = fs::metadata(&path).unwrap();
    let unread = |stamp| UnreadFile {
        stamp,
        path: b"sub/f".to_vec(),
        ids_and_mode: (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta),
            std::os::unix::fs::MetadataExt::mode(&meta) & 0o7777,
        ),
    };
    let stamped = stamp(&rfs::stat(&path).unwrap()).unwrap();
    let mut out = b"head".to_vec();
    assert!(files.read_at(&unread(stamped), 2, 5, &mut out).unwrap());
    assert_eq!(out, b"head23456");
    // Rewritten in place: read, not the same stamp.
    fs::write(&path, b"abcdefghij").unwrap();
    let mut out = Vec::new();
    assert!(!files.read_at(&unread(stamped), 0, 3, &mut out).unwrap());
    assert_eq!(out, b"abc");
    // Shrunk: the header promised more.
    fs::write(&path, b"ab").unwrap();
    let err = files
        .read_at(&unread(stamped), 0, 10, &mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("shrank"), "{err}");
    // Another file under the name (saved by a rename): read, not the same stamp.
    let other = dir.path().join("sub/other");
    fs::write(&other, b"0123456789").unwrap();
    fs::rename(&other, &path).unwrap();
    let mut out = Vec::new();
    assert!(!files.read_at(&unread(stamped), 0, 3, &mut out).unwrap());
    assert_eq!(out, b"012");
    // Another file of another mode (one only its owner may read, exchanged for the
    // stamped one): refused, its bytes would go out under the other's header.
    let private = dir.path().join("sub/private");
    fs::write(&private, b"SECRET7890").unwrap();
    fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    fs::rename(&private, &path).unwrap();
    let err = files
        .read_at(&unread(stamped), 0, 3, &mut Vec::new())
        .unwrap_err();
    assert!(
        err.to_string().contains("another owner, group or mode"),
        "{err}"
    );
    // Something else than a file, or a symlink on the way: refused.
    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    let err = files
        .read_at(&unread(stamped), 0, 3, &mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("sub/f"), "{err}");
    fs::remove_dir(&path).unwrap();
    fs::write(&path, b"0123456789").unwrap();
    fs::rename(dir.path().join("sub"), dir.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", dir.path().join("sub")).unwrap();
    let moved = stamp(&rfs::stat(dir.path().join("real/f")).unwrap()).unwrap();
    assert!(
        files
            .read_at(&unread(moved), 0, 3, &mut Vec::new())
            .is_err()
    );
}
