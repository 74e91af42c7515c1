//! The on-disk cache: reused after a restart, damaged entries detected and fetched
//! again, bounded by `--cache-size` with least-recently-used eviction.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::util::TestStore;
use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::tree::{
    assert_same_tree, make_random_tree, make_sample_tree, make_turn_tree, random_bytes, write_file,
};

/// Every regular file under `dir`, recursively, with its size.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let md = fs::symlink_metadata(entry.path()).unwrap();
        if md.is_dir() {
            out.extend(files_under(&entry.path()));
        } else {
            out.push((entry.path(), md.len()));
        }
    }
    out
}

/// Checkpoint directories in the cache (`checkpoints/<sha256>`), sorted.
fn cached_checkpoints(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(cache.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| crate::util::is_sha256_hex(n))
        .collect();
    names.sort();
    names
}

/// Flips every byte of `path`, keeping its length.
fn corrupt_same_length(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    assert!(!bytes.is_empty(), "{} is empty", path.display());
    for b in &mut bytes {
        *b ^= 0x5a;
    }
    fs::write(path, &bytes).unwrap();
}

#[track_caller]
fn assert_mode(path: &Path, want: u32) {
    let mode = fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, want, "mode of {}", path.display());
}

#[track_caller]
fn assert_counters(mount: &MountedStore, downloads: u64, from_cache: u64) {
    let status = mount.status();
    assert_eq!(
        (status.downloads, status.loaded_from_cache),
        (downloads, from_cache),
        "(downloads, loaded from cache):\n{}\nlog:\n{}",
        status.text,
        mount.log_text()
    );
}

pub(super) fn cache_is_reused_and_repaired_after_restarts(store: &TestStore) {
    let work = repo_temp_dir("cache-");
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (sha, _) = store.put(&src, &[]);
    let original = store.object_bytes(&sha).unwrap();
    let cache = work.path().join("cache");

    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&src, &mount.join(&sha));
    assert_counters(&mount, 1, 0);
    assert_eq!(mount.status().state(&sha), "verified");
    let status = mount.unmount();
    assert!(status.success(), "the daemon exits 0 on unmount: {status}");

    // The layout, private to the mounting user.
    let entry = cache.join("checkpoints").join(&sha);
    assert_mode(&cache, 0o700);
    assert_mode(&cache.join("checkpoints"), 0o700);
    assert_mode(&entry, 0o700);
    assert!(entry.join("index").is_file());
    assert!(entry.join("pack").is_file());
    let own_files = files_under(&entry.join("files"));
    assert!(
        own_files
            .iter()
            .any(|(_, len)| *len == 300 * 1024 || *len > 64 * 1024),
        "big.txt (300 KiB) has a file of its own: {own_files:?}"
    );
    for (path, _) in files_under(&cache.join("checkpoints")) {
        assert_mode(&path, 0o600);
    }

    // Restart: served from the cache. The store's copy is now corrupt, so a download
    // would fail: the contents can only come from the cache.
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    store.write_object_bytes(&sha, &bad, None);
    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_eq!(mount.status().state(&sha), "listed");
    assert_counters(&mount, 0, 0);
    assert_same_tree(&src, &mount.join(&sha));
    assert_counters(&mount, 0, 1);
    drop(mount);
    store.write_object_bytes(&sha, &original, Some((&sha, original.len() as u64)));

    // A damaged own file (same length, other bytes): detected, fetched again.
    let (own, _) = files_under(&entry.join("files"))
        .into_iter()
        .max_by_key(|(_, len)| *len)
        .expect("an own file");
    corrupt_same_length(&own);
    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&src, &mount.join(&sha));
    assert_counters(&mount, 1, 0);
    drop(mount);

    // A damaged pack: the same.
    corrupt_same_length(&entry.join("pack"));
    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&src, &mount.join(&sha));
    assert_counters(&mount, 1, 0);
    drop(mount);

    // And the repaired entry is good again.
    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&src, &mount.join(&sha));
    assert_counters(&mount, 0, 1);
}

const CACHE_SIZE: u64 = 1 << 20;
const BLOB: usize = 600 * 1024;

pub(super) fn eviction_keeps_the_cache_under_its_bound(store: &TestStore) {
    let work = repo_temp_dir("evict-");
    let shas: Vec<String> = (0..3)
        .map(|i| {
            let dir = work.path().join(format!("ckpt{i}"));
            make_random_tree(&dir, BLOB, 1000 + i);
            store.put(&dir, &[]).0
        })
        .collect();
    let cache = work.path().join("cache");
    let mount = Mount::new(store)
        .cache_dir(&cache)
        .args(["--cache-size", "1MiB"])
        .start();

    // Each in turn, then the first two again (evicted by then).
    for (round, i) in [0usize, 1, 2, 0, 1].into_iter().enumerate() {
        let ckpt = mount.join(&shas[i]);
        let blob = fs::read(ckpt.join("blob.bin"))
            .unwrap_or_else(|e| panic!("round {round}: read: {e}\nlog:\n{}", mount.log_text()));
        assert!(
            blob == random_bytes(BLOB, 1000 + i as u64),
            "round {round}: contents of checkpoint {i}"
        );
        assert_eq!(fs::read(ckpt.join("README")).unwrap(), b"random payload\n");

        let on_disk: u64 = files_under(&cache.join("checkpoints"))
            .iter()
            .map(|(_, len)| len)
            .sum();
        let cached = cached_checkpoints(&cache);
        let status = mount.status();
        assert!(
            on_disk <= CACHE_SIZE,
            "round {round}: {on_disk} bytes in the cache, bound {CACHE_SIZE}: {cached:?}\n{}",
            status.text
        );
        assert!(status.cache_bytes <= CACHE_SIZE, "{}", status.text);
        assert!(
            cached.contains(&shas[i]),
            "round {round}: the checkpoint just read is cached: {cached:?}"
        );
        assert_eq!(cached.len(), 1, "round {round}: only one fits: {cached:?}");
        assert_eq!(status.cache_entries, 1, "{}", status.text);
        assert_eq!(status.downloads, round as u64 + 1, "{}", status.text);
    }

    // On a writable mount every open goes through the daemon (see README, "Opening a
    // file"): a checkpoint with an open file is not evicted, and the rest of the file
    // is read from the cache, with no download.
    let open = fs::File::open(mount.join(&shas[1]).join("blob.bin")).unwrap();
    let mut first = vec![0u8; 1000];
    std::io::Read::read_exact(&mut &open, &mut first).unwrap();
    for i in [2usize, 0] {
        let blob = fs::read(mount.join(&shas[i]).join("blob.bin")).unwrap();
        assert!(blob == random_bytes(BLOB, 1000 + i as u64));
    }
    assert!(
        cached_checkpoints(&cache).contains(&shas[1]),
        "evicted while open"
    );
    drop_cached_pages(&open);
    let downloads = mount.status().downloads;
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut &open, &mut rest).unwrap();
    first.extend(rest);
    assert!(
        first == random_bytes(BLOB, 1001),
        "reading a file held open"
    );
    assert_eq!(
        mount.status().downloads,
        downloads,
        "no download for an open file"
    );
    drop(open);
    drop(mount);

    // With --passthrough, files are opened through the daemon, which keeps a
    // checkpoint with an open file from eviction.
    let mount = Mount::new(store)
        .cache_dir(&cache)
        .args(["--cache-size", "1MiB", "--passthrough"])
        .start();
    let open = fs::File::open(mount.join(&shas[1]).join("blob.bin")).unwrap();
    for i in [2usize, 0] {
        let blob = fs::read(mount.join(&shas[i]).join("blob.bin")).unwrap();
        assert!(blob == random_bytes(BLOB, 1000 + i as u64));
        let cached = cached_checkpoints(&cache);
        assert!(
            cached.contains(&shas[1]),
            "a checkpoint with a file open through the daemon was evicted: {cached:?}"
        );
    }
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut &open, &mut data).unwrap();
    assert!(
        data == random_bytes(BLOB, 1001),
        "reading the pinned checkpoint"
    );
    drop(open);
    // Once closed it can go: the next load brings the cache back under its bound.
    let blob = fs::read(mount.join(&shas[2]).join("blob.bin")).unwrap();
    assert!(blob == random_bytes(BLOB, 1002));
    let cached = cached_checkpoints(&cache);
    assert_eq!(
        cached,
        [shas[2].as_str()],
        "after the pinned file was closed"
    );
}

/// Drops the pages the kernel keeps of `file` (as memory pressure would).
fn drop_cached_pages(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the advice only drops clean cached pages.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
}

/// A checkpoint larger than the whole cache bound is still served (and does not
/// push itself out while it is being opened).
pub(super) fn a_checkpoint_larger_than_the_cache_still_reads(store: &TestStore) {
    let work = repo_temp_dir("oversize-");
    let dir = work.path().join("big");
    make_random_tree(&dir, BLOB, 7);
    let (sha, _) = store.put(&dir, &[]);
    let mount = Mount::new(store).args(["--cache-size", "100KiB"]).start();
    let names: Vec<String> = fs::read_dir(mount.join(&sha))
        .unwrap_or_else(|e| {
            panic!(
                "ls: {e}\n{}\nlog:\n{}",
                mount.status().text,
                mount.log_text()
            )
        })
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let blob = fs::read(mount.join(&sha).join("blob.bin")).unwrap_or_else(|e| {
        panic!(
            "read: {e}\n{}\nlog:\n{}",
            mount.status().text,
            mount.log_text()
        )
    });
    assert!(blob == random_bytes(BLOB, 7));
}

/// Bytes of the checkpoints in the cache directory `cache` (entries and the blobs
/// they share; not the member cache beside them, which a writable mount fills from
/// the newest checkpoint), each inode counted once (as `du` counts).
fn distinct_bytes(cache: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::BTreeSet::new();
    let mut files = files_under(&cache.join("checkpoints"));
    files.extend(files_under(&cache.join("blobs")));
    files
        .into_iter()
        .filter(|(path, _)| seen.insert(fs::symlink_metadata(path).unwrap().ino()))
        .map(|(_, len)| len)
        .sum()
}

/// Two turns of twelve files differing by one, put in `store`: their trees and digests.
fn put_two_turns(store: &TestStore, work: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let trees: Vec<PathBuf> = (0..2)
        .map(|turn| {
            let dir = work.join(format!("turn{turn}"));
            make_turn_tree(&dir, 12, (turn == 1).then_some(4));
            dir
        })
        .collect();
    let shas = trees.iter().map(|t| store.put(t, &[]).0).collect();
    (trees, shas)
}

/// Two turns that differ by one file of twelve hold their eleven common files once
/// in the cache, and the cache counts them once; a shared file damaged on disk is
/// found in both entries after a restart, and both are fetched again and right.
pub(super) fn turns_share_their_unchanged_files_in_the_cache(store: &TestStore) {
    let work = repo_temp_dir("shared-");
    let (trees, shas) = put_two_turns(store, work.path());
    let cache = work.path().join("cache");
    let mount = Mount::new(store).cache_dir(&cache).start();
    for (tree, sha) in trees.iter().zip(&shas) {
        assert_same_tree(tree, &mount.join(sha));
    }
    let file = 300 * 1024;
    let on_disk = distinct_bytes(&cache);
    // 13 distinct files of 300 KiB, plus the packs and indexes (a few KiB).
    assert!(
        (13 * file..13 * file + 64 * 1024).contains(&on_disk),
        "{on_disk} bytes on disk for 13 distinct files of {file}"
    );
    let status = mount.status();
    assert!(
        status.cache_bytes <= on_disk && status.cache_bytes + 64 * 1024 >= on_disk,
        "the cache counts {} bytes, {on_disk} on disk\n{}",
        status.cache_bytes,
        status.text
    );
    drop(mount);

    let shared = cache
        .join("checkpoints")
        .join(&shas[0])
        .join("files")
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(p).unwrap().nlink() == 3
        })
        .expect("a file linked from both entries and the blob pool");
    corrupt_same_length(&shared);
    let mount = Mount::new(store).cache_dir(&cache).start();
    for (tree, sha) in trees.iter().zip(&shas) {
        assert_same_tree(tree, &mount.join(sha));
    }
    assert_counters(&mount, 2, 0);
    drop(mount);
    assert!(distinct_bytes(&cache) <= 13 * file + 64 * 1024);
}

/// (rebuilt, inflated) gzip members of the mount's downloads, from `.status`.
fn members_rebuilt(mount: &MountedStore) -> (u64, u64) {
    let text = mount.status_text();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("# gzip members of downloads: "))
        .unwrap_or_else(|| panic!("no member counts in .status:\n{text}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{line}");
    (numbers[0], numbers[1])
}

/// A fresh mount whose cache holds turn N opens turn N+1 by rebuilding the gzip
/// members the two share from turn N's files instead of inflating them, and shows
/// exactly turn N+1; with turn N's files damaged on disk meanwhile, it inflates them
/// and still shows exactly turn N+1.
pub(super) fn turn_n_plus_1_is_rebuilt_from_turn_n_in_the_cache(store: &TestStore) {
    let work = repo_temp_dir("rebuild-");
    let (trees, shas) = put_two_turns(store, work.path());
    let cache = work.path().join("cache");
    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&trees[0], &mount.join(&shas[0]));
    let (rebuilt, members) = members_rebuilt(&mount);
    assert_eq!(rebuilt, 0);
    assert!(members >= 10, "about one member per file: {members}");
    drop(mount);
    let damaged = work.path().join("damaged");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&cache)
        .arg(&damaged)
        .status()
        .unwrap();
    assert!(copied.success());

    let mount = Mount::new(store).cache_dir(&cache).start();
    assert_same_tree(&trees[1], &mount.join(&shas[1]));
    let (rebuilt, inflated) = members_rebuilt(&mount);
    assert_eq!(
        rebuilt + inflated,
        members,
        "the two turns have as many members"
    );
    assert!(
        rebuilt >= members - 3,
        "{rebuilt} of {members} members rebuilt (one file changed):\n{}",
        mount.log_text()
    );
    drop(mount);

    let entry = damaged.join("checkpoints").join(&shas[0]);
    for (path, _) in files_under(&entry.join("files")) {
        corrupt_same_length(&path);
    }
    let mount = Mount::new(store).cache_dir(&damaged).start();
    assert_same_tree(&trees[1], &mount.join(&shas[1]));
    assert_eq!(members_rebuilt(&mount).0, 0, "{}", mount.log_text());
}

/// Eviction counts a shared file as freed once the last checkpoint using it goes,
/// also when two of them go in one pass: it evicts no more than it must.
pub(super) fn eviction_frees_shared_files_once_and_no_more(store: &TestStore) {
    let work = repo_temp_dir("evict-shared-");
    const MIB: usize = 1 << 20;
    // 1 and 2 share a 1 MiB file; 3 and 4 have one each.
    let files = [(1u64, 10u64), (1, 20), (2, 30), (3, 40)];
    let shas: Vec<String> = files
        .iter()
        .enumerate()
        .map(|(i, &(big, small))| {
            let dir = work.path().join(format!("ckpt{i}"));
            write_file(&dir.join("big.bin"), &random_bytes(MIB, big), 0o644);
            write_file(
                &dir.join("small.txt"),
                format!("{small}\n").as_bytes(),
                0o644,
            );
            store.put(&dir, &[]).0
        })
        .collect();
    let cache = work.path().join("cache");
    let mount = Mount::new(store)
        .cache_dir(&cache)
        .args(["--cache-size", "2700KiB"])
        .start();
    for (i, sha) in shas.iter().enumerate() {
        let data = fs::read(mount.join(sha).join("big.bin")).unwrap();
        assert!(data == random_bytes(MIB, files[i].0), "checkpoint {i}");
    }
    // 1, 2 and 3 held 2 MiB; 4 made it 3 MiB: evicting 1 and 2 frees 1 MiB, enough.
    let cached = cached_checkpoints(&cache);
    let status = mount.status();
    assert!(
        cached.contains(&shas[2]) && cached.contains(&shas[3]) && cached.len() == 2,
        "{cached:?}\n{}",
        status.text
    );
    assert!(status.cache_bytes <= 2700 * 1024, "{}", status.text);
}

/// A large file (3 MiB) that a later checkpoint holds too is not written again when
/// that checkpoint loads: compared with the first one's as it comes, and linked to it
/// (`.status` counts the bytes). Both checkpoints show their own bytes.
pub(super) fn a_large_file_of_an_earlier_checkpoint_is_linked_unwritten(store: &TestStore) {
    let work = repo_temp_dir("large-linked-");
    const SIZE: usize = 3 << 20;
    let shas: Vec<String> = (0..2u64)
        .map(|turn| {
            let dir = work.path().join(format!("turn{turn}"));
            write_file(&dir.join("big.bin"), &random_bytes(SIZE, 7), 0o644);
            write_file(
                &dir.join("small.txt"),
                format!("{turn}\n").as_bytes(),
                0o644,
            );
            store.put(&dir, &[]).0
        })
        .collect();
    let mount = Mount::new(store)
        .cache_dir(&work.path().join("cache"))
        .start();
    let linked = |mount: &MountedStore| -> u64 {
        let text = mount.status_text();
        let line = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "# large files of checkpoints linked to an earlier entry's, unwritten: ",
                )
            })
            .unwrap_or_else(|| panic!("no such line in .status:\n{text}"));
        line.trim_end_matches(" bytes").parse().unwrap()
    };
    for (turn, sha) in shas.iter().enumerate() {
        let data = fs::read(mount.join(sha).join("big.bin")).unwrap();
        assert!(data == random_bytes(SIZE, 7), "turn {turn}");
        let small = fs::read_to_string(mount.join(sha).join("small.txt")).unwrap();
        assert_eq!(small, format!("{turn}\n"));
        assert_eq!(
            linked(&mount),
            turn as u64 * SIZE as u64,
            "after turn {turn}"
        );
    }
}

/// Past the bound on descriptors readers' handles hold (16,384), a file of its own is
/// opened without one; when the kernel already reads that file through a passthrough
/// backing file (someone has it open), such an open must reuse it, or the kernel
/// refuses it (EIO): one user holding the bound open would otherwise make every file
/// they opened once unreadable to everyone, root included.
#[test]
fn files_opened_past_the_bound_on_held_descriptors_still_read() {
    const OPENS: u64 = 16_384 + 64;
    let store = TestStore::local();
    let work = repo_temp_dir("held-");
    let src = work.path().join("src");
    write_file(&src.join("big.bin"), &random_bytes(64 << 10, 7), 0o644);
    let (sha, _) = store.put(&src, &[]);
    // This process needs as many descriptors (root may raise its own limit).
    let wanted = OPENS + 1024;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted;
            limit.rlim_max = limit.rlim_max.max(wanted);
            assert_eq!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit),
                0,
                "cannot raise the open file limit to {wanted}"
            );
        }
    }
    let mount = Mount::new(&store).start();
    let path = mount.join(&sha).join("big.bin");
    let held: Vec<fs::File> = (0..OPENS).map(|_| fs::File::open(&path).unwrap()).collect();
    let out = std::process::Command::new("cat")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout == random_bytes(64 << 10, 7),
        "read past the bound: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        mount.log_excerpt()
    );
    drop(held);
}
