use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::archive::gz::MemberSource;
use crate::archive::writer::{WriterOptions, write_archive};

/// Text that compresses as source code does; `seed` makes each file its own.
fn text(lines: u64, seed: u64) -> Vec<u8> {
    (0..lines)
        .map(|i| format!("let v{i} = {};\n", (i * 2_654_435_761) ^ seed))
        .collect::<String>()
        .into_bytes()
}

/// How long before a capture a change makes a file read, here (`put --settle`).
const SETTLE: Duration = Duration::from_millis(500);

/// A tree of 60 small files and one of 2 MiB, settled (see [`SETTLE`]).
fn settled_tree(root: &Path) -> u64 {
    let mut total = 0;
    for d in 0..3u64 {
        fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
        for f in 0..20u64 {
            let bytes = text(400 + f * 7, d * 100 + f);
            total += bytes.len() as u64;
            fs::write(root.join(format!("d{d}/f{f:02}")), bytes).unwrap();
        }
    }
    let big = text(90_000, 5);
    total += big.len() as u64;
    fs::write(root.join("d1/big"), big).unwrap();
    std::thread::sleep(SETTLE * 2);
    total
}

fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    dir
}

struct Capture {
    archive: Vec<u8>,
    unread: u64,
    read_again: u64,
}

/// Archives `tree` with the member cache in `cache` and the tree's records, and
/// saves this capture's records.
fn capture(tree: &Path, cache: &Path) -> Capture {
    fs::create_dir_all(cache).unwrap();
    let (archive, records) = capture_copying(tree, cache, None);
    records.save().unwrap();
    Capture {
        archive,
        unread: records.unread.load(Ordering::Relaxed),
        read_again: records.read_again.load(Ordering::Relaxed),
    }
}

/// Archives `tree` with the member cache in `cache` and the tree's records, also
/// into `copy` when given; the archive, and the records (not saved).
fn capture_copying(
    tree: &Path,
    cache: &Path,
    copy: Option<&mut Vec<u8>>,
) -> (Vec<u8>, Arc<TreeMembers>) {
    let members = Arc::new(MemberCache::open(&cache.join("members"), 1 << 30).unwrap());
    let root = fs::File::open(tree).unwrap();
    let records = Arc::new(TreeMembers::open(Arc::clone(&members), tree, &root, SETTLE).unwrap());
    let options = WriterOptions {
        max_size: u64::MAX,
        max_unpacked: u64::MAX,
        threads: 2,
        members: Some(members as Arc<dyn MemberSource>),
        tree: Some(Arc::clone(&records) as Arc<dyn TreeRecords>),
    };
    let mut archive = Vec::new();
    match copy {
        Some(copy) => crate::archive::writer::write_archive_with_copy(
            root.as_fd(),
            &mut archive,
            &options,
            copy,
        ),
        None => write_archive(root.as_fd(), &mut archive, &options),
    }
    .unwrap();
    (archive, records)
}

fn plain(tree: &Path) -> Vec<u8> {
    let root = fs::File::open(tree).unwrap();
    let mut archive = Vec::new();
    write_archive(
        root.as_fd(),
        &mut archive,
        &WriterOptions {
            max_size: u64::MAX,
            max_unpacked: u64::MAX,
            threads: 1,
            members: None,
            tree: None,
        },
    )
    .unwrap();
    archive
}

/// Every file of the member cache's encoder directory (members, not directories).
fn member_files(cache: &Path) -> Vec<std::path::PathBuf> {
    let encoder = fs::read_dir(cache.join("members"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("v1-"))
        .unwrap();
    fs::read_dir(encoder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect()
}

#[test]
fn an_unchanged_tree_is_not_read_and_gives_the_same_archive() {
    let work = private_dir();
    let tree = work.path().join("tree");
    let total = settled_tree(&tree);
    let cache = work.path().join("cache");
    let first = capture(&tree, &cache);
    assert_eq!((first.unread, first.read_again), (0, 0));
    assert_eq!(first.archive, plain(&tree));
    let second = capture(&tree, &cache);
    assert_eq!((second.unread, second.read_again), (total, 0));
    assert_eq!(second.archive, first.archive);
}

/// A damaged member makes the capture read its files again; the records themselves
/// garbled, truncated or emptied make it read everything. The archive never changes.
#[test]
fn damaged_members_or_records_cost_reading_never_other_bytes() {
    let work = private_dir();
    let tree = work.path().join("tree");
    let total = settled_tree(&tree);
    let cache = work.path().join("cache");
    let first = capture(&tree, &cache);
    let members = member_files(&cache);
    assert!(!members.is_empty());
    for member in &members {
        let mut bytes = fs::read(member).unwrap();
        let last = bytes.len() - 9;
        bytes[last] ^= 0x40;
        fs::write(member, bytes).unwrap();
    }
    let damaged = capture(&tree, &cache);
    assert_eq!(damaged.archive, first.archive);
    assert!(damaged.read_again > total / 2, "{}", damaged.read_again);
    // Deleted: the same.
    for member in member_files(&cache) {
        fs::remove_file(member).unwrap();
    }
    let deleted = capture(&tree, &cache);
    assert_eq!(deleted.archive, first.archive);
    assert!(deleted.read_again > total / 2, "{}", deleted.read_again);

    let records: Vec<_> = fs::read_dir(member_files(&cache)[0].parent().unwrap().join("trees"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(records.len(), 1);
    let good = fs::read(&records[0]).unwrap();
    // One byte of a member's recorded digest, then of its key: that member is made
    // again from its files, the others are taken.
    let stamps = u64::from_le_bytes(good[MAGIC.len()..MAGIC.len() + 8].try_into().unwrap());
    let member = MAGIC.len() + 8 + stamps as usize * STAMP + 8;
    for field in [64, 32] {
        let mut bad = good.clone();
        bad[member + field + 5] ^= 1;
        fs::write(&records[0], bad).unwrap();
        let again = capture(&tree, &cache);
        assert_eq!(again.archive, first.archive);
        assert_eq!(again.unread, total);
        assert!(again.read_again > 0, "a damaged record was used");
        fs::write(&records[0], &good).unwrap();
    }
    for bad in [
        good[..good.len() / 2].to_vec(),
        [&good[..], b"trailing"].concat(),
        good.iter().map(|b| b ^ 0x5a).collect(),
        Vec::new(),
    ] {
        fs::write(&records[0], bad).unwrap();
        let again = capture(&tree, &cache);
        assert_eq!(again.archive, first.archive);
        assert_eq!(again.unread, 0, "unreadable records were used");
    }
}

/// Records belong to one directory: another at the same path (made again) or one
/// given the records of another reads all its files.
#[test]
fn records_of_another_tree_are_not_used() {
    let work = private_dir();
    let cache = work.path().join("cache");
    let tree = work.path().join("tree");
    settled_tree(&tree);
    capture(&tree, &cache);
    fs::rename(&tree, work.path().join("moved")).unwrap();
    let total = settled_tree(&tree);
    let again = capture(&tree, &cache);
    assert_eq!(again.unread, 0);
    assert_eq!(again.archive, plain(&tree));
    // The records file of one tree planted under the other's name: no stamp matches
    // (other inodes), so nothing is left unread.
    let trees = member_files(&cache)[0].parent().unwrap().join("trees");
    let mut names: Vec<_> = fs::read_dir(&trees)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort_by_key(|p| fs::metadata(p).unwrap().modified().unwrap());
    assert_eq!(names.len(), 2);
    fs::copy(&names[0], &names[1]).unwrap();
    let planted = capture(&tree, &cache);
    assert_eq!(planted.unread, 0);
    assert_eq!(planted.archive, plain(&tree));
    assert!(total > 0);
}

#[test]
fn records_round_trip_and_stay_bounded() {
    let mut records = Records::default();
    records.stamps.insert(7);
    records.members.insert(
        [1; 32],
        Recorded {
            key: [2; 32],
            digest: [3; 32],
            length: 10,
            check: 11,
            data_length: 20,
            inline: Some(b"0123456789".to_vec()),
        },
    );
    records.members.insert(
        [4; 32],
        Recorded {
            key: [5; 32],
            digest: [6; 32],
            length: 9000,
            check: 12,
            data_length: 20000,
            inline: None,
        },
    );
    let bytes = encode(&records);
    let back = parse(&bytes).unwrap();
    assert_eq!(back.stamps, records.stamps);
    assert_eq!(back.members, records.members);
    // A count far past what the file holds is refused without allocating for it.
    let mut huge = MAGIC.to_vec();
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(parse(&huge).is_none());
}

/// A capture whose records would pass their bound keeps none in memory and writes
/// none, and forgets the older ones: the next capture reads every file.
#[test]
fn records_past_their_bound_are_dropped_not_kept() {
    let work = private_dir();
    let tree = work.path().join("tree");
    settled_tree(&tree);
    let cache = work.path().join("cache");
    capture(&tree, &cache);
    let members = Arc::new(MemberCache::open(&cache.join("members"), 1 << 30).unwrap());
    let root = fs::File::open(&tree).unwrap();
    let records = TreeMembers::open(members, &tree, &root, SETTLE).unwrap();
    let stamp = FileStamp {
        dev: 1,
        ino: 2,
        size: 3,
        mtime: (4, 5),
        ctime: (6, 7),
    };
    let mut n = 0u64;
    while !records.now.lock().unwrap().overflow {
        let member = Compressed {
            bytes: vec![7; MIN_KEPT - 1],
            digest: [0; 32],
            key: [0; 32],
        };
        let mut fingerprint = [0u8; 32];
        fingerprint[..8].copy_from_slice(&n.to_le_bytes());
        records.record(fingerprint, &member, 10, &[stamp]);
        n += 1;
        assert!(n < 10_000, "the records never reached their bound");
    }
    assert!(n * MIN_KEPT as u64 > MAX_RECORDS / 2, "{n} members");
    {
        let now = records.now.lock().unwrap();
        assert!(now.members.is_empty() && now.stamps.is_empty());
    }
    records.save().unwrap();
    let again = capture(&tree, &cache);
    assert_eq!(again.unread, 0, "the records before were used");
}

/// With records and a copy of the tar stream (a seal of a forked workspace), the
/// copy is the tar stream with zeros for the contents left unread: entries, names
/// and sizes as they are, for a reader's limits to be checked on; the archive is the
/// same.
#[test]
fn a_copy_beside_records_has_zeros_for_contents_left_unread() {
    let work = private_dir();
    let tree = work.path().join("tree");
    let total = settled_tree(&tree);
    let cache = work.path().join("cache");
    let first = capture(&tree, &cache);
    let mut copy = Vec::new();
    let (archive, records) = capture_copying(&tree, &cache, Some(&mut copy));
    assert_eq!(records.unread.load(Ordering::Relaxed), total);
    assert_eq!(archive, first.archive);
    let mut tar = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(&archive[..]),
        &mut tar,
    )
    .unwrap();
    assert_eq!(copy.len(), tar.len());
    let mut entries = tar::Archive::new(&copy[..]);
    let mut files = 0;
    for entry in entries.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut contents = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut contents).unwrap();
        let path = entry.path().unwrap().into_owned();
        if entry.header().entry_type().is_file() {
            assert_eq!(
                contents.len() as u64,
                fs::metadata(tree.join(&path)).unwrap().len()
            );
            assert!(contents.iter().all(|&b| b == 0), "{}", path.display());
            files += 1;
        }
    }
    assert_eq!(files, 61);
}

/// The records of forked workspaces are kept apart from the trees of `put`: however
/// many forks are recorded, a put's records stay.
#[test]
fn forks_cannot_push_out_the_records_of_a_put() {
    let work = private_dir();
    let tree = work.path().join("tree");
    let total = settled_tree(&tree);
    let cache = work.path().join("cache");
    capture(&tree, &cache);
    let members = Arc::new(MemberCache::open(&cache.join("members"), 1 << 30).unwrap());
    for k in 0..TREES_KEPT as u8 * 2 {
        TreeMembers::of_fork(Arc::clone(&members), &[k; 32])
            .save()
            .unwrap();
    }
    assert_eq!(capture(&tree, &cache).unread, total);
}
