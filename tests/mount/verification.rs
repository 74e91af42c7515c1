//! Nothing unverified is served: the SPEC's three reference corruptions answer EIO
//! with their reason in `.status` and the log, good checkpoints beside them keep
//! working, and a failed checkpoint is tried again on a later access.

use std::fs;
use std::time::{Duration, Instant};

use crate::util::mount::{Mount, repo_temp_dir};
use crate::util::sys::errno_of;
use crate::util::tree::{make_random_tree, make_small_tree, write_file};
use crate::util::{TestStore, sha256_hex};

pub(super) fn corrupt_checkpoints_answer_eio(store: &TestStore) {
    let work = repo_temp_dir("corrupt-");
    let mut shas = Vec::new();
    for tag in ["checksum", "size", "missing", "good"] {
        let dir = work.path().join(tag);
        make_small_tree(&dir, tag);
        shas.push(store.put(&dir, &[]));
    }
    let [
        (checksum, _),
        (size_cut, size_cut_len),
        (missing, _),
        (good, _),
    ] = &shas[..]
    else {
        unreachable!()
    };
    // Same length, one byte changed, no digest metadata.
    let original = store.object_bytes(checksum).unwrap();
    let mut bytes = original.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    store.write_object_bytes(checksum, &bytes, None);
    // Cut to its first 100 bytes, metadata kept.
    let bytes = store.object_bytes(size_cut).unwrap();
    store.write_object_bytes(size_cut, &bytes[..100], Some((size_cut, *size_cut_len)));

    // No refresh during the test: the deleted object stays listed.
    let mount = Mount::new(store).args(["--refresh", "3600"]).start();
    // Deleted after the mount listed it.
    store.delete_object(missing);
    assert_eq!(mount.status().state(missing), "listed");

    let cases = [
        (checksum, "Checkpoint checksum mismatch"),
        (size_cut, "Checkpoint size mismatch"),
        (missing, "Checkpoint object is missing"),
    ];
    for (sha, reason) in cases {
        let errno = errno_of(&format!("ls {sha}"), list_dir(&mount.join(sha)));
        assert_eq!(
            errno,
            libc::EIO,
            "ls of a {reason} checkpoint\nlog:\n{}",
            mount.log_text()
        );
        // Nothing inside is served either.
        let errno = errno_of(
            &format!("read {sha}/note.txt"),
            fs::read(mount.join(sha).join("note.txt")),
        );
        assert_eq!(errno, libc::EIO, "{reason}: reading a file");
        let status = mount.status();
        let state = status.state(sha);
        let detail = state
            .strip_prefix("FAILED: ")
            .unwrap_or_else(|| panic!("{sha} should have failed:\n{}", status.text));
        assert!(
            detail.starts_with(reason),
            "want {reason:?}, got {state:?}\n{}",
            status.text
        );
        for other in cases.iter().map(|(_, r)| *r).filter(|r| *r != reason) {
            assert!(!detail.starts_with(other), "{state}");
        }
        assert!(
            mount.log_text().contains(reason),
            "the log names the reason {reason:?}:\n{}",
            mount.log_text()
        );
        // The good checkpoint in the same mount still reads fine.
        assert_eq!(
            fs::read(mount.join(good).join("note.txt")).unwrap(),
            b"checkpoint good\n"
        );
    }
    let status = mount.status();
    assert_eq!(status.state(good), "verified", "{}", status.text);
    // A mounted directory the kernel knows can still be stat'ed (from the listing).
    assert!(fs::metadata(mount.join(checksum)).unwrap().is_dir());

    // Repaired in the store: a later access tries again and succeeds.
    store.write_object_bytes(checksum, &original, None);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match fs::read(mount.join(checksum).join("note.txt")) {
            Ok(data) => {
                assert_eq!(data, b"checkpoint checksum\n");
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EIO) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!(
                "a repaired checkpoint is not retried: {e}\n{}\nlog:\n{}",
                mount.status().text,
                mount.log_text()
            ),
        }
    }
    assert_eq!(mount.status().state(checksum), "verified");
}

/// Checkpoints over the mount's limits (archive size, entries, unpacked size: a gzip
/// bomb), and objects that hash right but are no tar.gz, are refused with their reason
/// in `.status`; the good checkpoint beside them is served.
pub(super) fn oversized_and_unusable_checkpoints_are_refused(store: &TestStore) {
    let work = repo_temp_dir("limits-");
    let put = |name: &str, build: &dyn Fn(&std::path::Path)| {
        let dir = work.path().join(name);
        build(&dir);
        store.put(&dir, &[]).0
    };
    let good = put("good", &|d| make_small_tree(d, "good"));
    let many = put("many", &|d| {
        for i in 0..50 {
            write_file(&d.join(format!("f{i}")), b"x", 0o644);
        }
    });
    let bulky = put("bulky", &|d| make_random_tree(d, 200 << 10, 9));
    let bomb = put("bomb", &|d| {
        write_file(&d.join("zeros"), &vec![0u8; 1 << 20], 0o644)
    });
    let raw = |bytes: &[u8]| {
        let sha = sha256_hex(bytes);
        store.write_object_bytes(&sha, bytes, Some((&sha, bytes.len() as u64)));
        sha
    };
    let not_gzip = raw(b"this is not a gzip stream, but its digest is right");
    let good_bytes = store.object_bytes(&good).unwrap();
    let cut_gzip = raw(&good_bytes[..good_bytes.len() / 2]);

    let mount = Mount::new(store)
        .max_archive_size("100KiB")
        .args(["--max-entries", "20"])
        .args(["--max-unpacked-size", "512KiB"])
        .start();
    let cases = [
        (&bulky, "102400"),
        (&many, "20"),
        (&bomb, "524288"),
        (&not_gzip, ""),
        (&cut_gzip, ""),
    ];
    for (sha, limit) in cases {
        if sha == &bulky && !mount.join(sha).exists() {
            continue; // "Larger objects are not mounted": not listing them is fine too.
        }
        let errno = errno_of(&format!("ls {sha}"), list_dir(&mount.join(sha)));
        assert!(
            errno == libc::EIO || errno == libc::EFBIG,
            "{sha}: errno {errno}\nlog:\n{}",
            mount.log_text()
        );
        let status = mount.status();
        let state = status.state(sha);
        assert!(
            state.starts_with("FAILED: ") && state.contains(limit),
            "{sha}: the reason names the limit {limit}: {state}\n{}",
            status.text
        );
    }
    assert_eq!(
        fs::read(mount.join(&good).join("note.txt")).unwrap(),
        b"checkpoint good\n"
    );
    let status = mount.status();
    assert_eq!(status.state(&good), "verified", "{}", status.text);
    // Nothing of the refused ones stays in the cache.
    let cached: Vec<String> = fs::read_dir(mount.cache_dir().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        cached,
        [good.as_str()],
        "only the good checkpoint is cached"
    );
}

/// What `ls` does: open the directory and read it. The mount answers a bad
/// checkpoint's EIO on the read (directories open without asking the daemon).
fn list_dir(path: &std::path::Path) -> std::io::Result<Vec<fs::DirEntry>> {
    fs::read_dir(path)?.collect()
}

/// The tar crate's errors quote an entry's name and header fields as they are: the
/// reason a hostile archive fails is shown on one line, in `.status` and in the log,
/// so that it cannot forge lines of its own (here, names and a size field holding
/// newlines).
#[test]
fn a_failing_archives_reason_cannot_forge_lines() {
    use std::io::Write;
    let mut header = [0u8; 512];
    let name = b"x\nFORGED-LINE-FROM-NAME";
    header[..name.len()].copy_from_slice(name);
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(b"1\nFORGEDSZ\0\0");
    header[136..148].copy_from_slice(b"00000000000\0");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut tar = header.to_vec();
    tar.extend_from_slice(&[0u8; 512 * 3]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let sha = sha256_hex(&gz);
    let store = TestStore::local();
    store.write_object_bytes(&sha, &gz, Some((&sha, gz.len() as u64)));

    let mount = Mount::new(&store).start();
    let listed = fs::read_dir(mount.join(&sha)).map(drop);
    assert_eq!(errno_of("ls of the hostile checkpoint", listed), libc::EIO);
    let status = mount.status_text();
    let line = status
        .lines()
        .find(|l| l.starts_with(&sha))
        .unwrap_or_else(|| panic!("no line for the checkpoint:\n{status}"));
    assert!(
        line.contains("FAILED: ") && line.contains("\\nFORGED"),
        "{line}"
    );
    for (what, text) in [("status", &status), ("log", &mount.log_text())] {
        assert!(
            !text.lines().any(|l| l.starts_with("FORGED")),
            "a forged line in the {what}:\n{text}"
        );
    }
}
