//! The store commands (`put`, `get`, `verify`, `ls`) against both kinds of store.
//!
//! Each behavioural test is a function taking a [`TestStore`]; `both_stores!` turns it
//! into `store::local::NAME` and `store::s3::NAME`. Tests that only make sense on S3
//! (multipart, boto3 interop, endpoint flag) are plain tests named `s3_*`.

mod integrity;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::util::archive::{RawEntry, raw_tar_gz};
use crate::util::proxy::CuttingProxy;
use crate::util::tree::{
    assert_same_tree, list_paths, make_random_tree, make_sample_tree, make_small_tree,
    make_turn_tree, random_bytes, set_mtime, write_file,
};
use crate::util::{
    Output, TestStore, ckptfs, describe, is_sha256_hex, logged_count, parse_put_output,
    parse_rfc3339_utc, parse_verify_output, py_script, python, run, s3_endpoint, sha256_hex,
    temp_dir, unix_now, wait_output,
};

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[test]
                fn $name() {
                    super::$name(&crate::util::TestStore::local());
                }
            )*
        }
        mod s3 {
            $(
                #[test]
                fn $name() {
                    super::$name(&crate::util::TestStore::s3());
                }
            )*
        }
    };
}

both_stores!(
    round_trip_restores_every_entry,
    put_is_deterministic_and_skips_existing_objects,
    verify_reports_reference_corruptions,
    get_refuses_a_corrupt_object,
    get_rejects_hostile_archives,
    get_skips_device_files_and_fifos,
    get_accepts_unique_digest_prefixes,
    get_refuses_a_non_empty_destination,
    ls_lists_checkpoints_oldest_first,
    put_rejects_archives_over_the_limit,
    concurrent_puts_leave_one_intact_object,
    reads_archives_written_by_python_tarfile,
    archives_are_readable_by_other_tools,
    a_turn_compresses_only_what_changed,
    a_turn_reads_only_the_files_that_changed,
    a_full_temporary_directory_fails_put_and_get_and_leaves_nothing,
);

/// More than a second, so S3 LastModified and file times can tell writes apart.
const CLOCK_TICK: Duration = Duration::from_millis(1200);

/// The names a stored checkpoint `sha` occupies in the store, and nothing else.
fn expected_names(store: &TestStore, shas: &[&str]) -> Vec<String> {
    let mut names = Vec::new();
    for sha in shas {
        names.push(format!("{sha}.tar.gz"));
        if !store.is_s3() {
            names.push(format!("{sha}.tar.gz.meta.json"));
        }
    }
    names.sort();
    names
}

/// Checks that `sha`/`size` as printed by `put` describe the stored object exactly.
#[track_caller]
fn assert_stored(store: &TestStore, sha: &str, size: u64) {
    let bytes = store
        .object_bytes(sha)
        .unwrap_or_else(|| panic!("object {sha}.tar.gz is not in the store"));
    assert_eq!(
        sha256_hex(&bytes),
        sha,
        "object bytes do not hash to the name"
    );
    assert_eq!(
        bytes.len() as u64,
        size,
        "object length differs from the printed size"
    );
    let meta = store
        .object_meta(sha)
        .unwrap_or_else(|| panic!("object {sha} has no metadata"));
    assert_eq!(meta.sha256.as_deref(), Some(sha), "sha256 metadata");
    assert_eq!(meta.size, Some(size.to_string()), "size metadata");
}

// ---------------------------------------------------------------------------------------

fn round_trip_restores_every_entry(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);

    let (sha, size) = store.put(&src, &[]);
    assert_stored(store, &sha, size);
    assert_eq!(store.list_keys(), expected_names(store, &[&sha]));

    // DEST that does not exist yet.
    let dest = work.path().join("restored");
    store.get(&sha, &dest);
    assert_same_tree(&src, &dest);

    // DEST that exists and is empty.
    let dest2 = work.path().join("restored-into-empty");
    fs::create_dir(&dest2).unwrap();
    store.get(&sha, &dest2);
    assert_same_tree(&src, &dest2);

    let out = store.cmd("verify", [&sha]).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
    // A digest prefix names the same checkpoint; the report gives the full digest.
    let out = store.cmd("verify", [&sha[..8]]).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
}

fn put_is_deterministic_and_skips_existing_objects(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);

    let (sha, size) = store.put(&src, &[]);
    let stamp = store.object_stamp(&sha);
    std::thread::sleep(CLOCK_TICK);

    // The same tree again: same name, nothing uploaded.
    let out = run(ckptfs().arg("put").arg(store.url()).arg(&src)).success();
    assert_eq!(parse_put_output(&out), (sha.clone(), size), "{out}");
    assert!(
        out.stderr.contains("already present"),
        "second put must say `already present`: {out}"
    );
    assert_eq!(store.object_stamp(&sha), stamp, "the object was rewritten");

    // A copy with other inode numbers (and other atimes/ctimes) is the same checkpoint.
    let copy = work.path().join("copy");
    let cp = run(std::process::Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&copy))
    .success();
    drop(cp);
    assert_ne!(
        fs::metadata(src.join("hello.py")).unwrap().ino(),
        fs::metadata(copy.join("hello.py")).unwrap().ino()
    );
    let out = run(ckptfs().arg("put").arg(store.url()).arg(&copy)).success();
    assert_eq!(parse_put_output(&out), (sha.clone(), size), "{out}");
    assert!(out.stderr.contains("already present"), "{out}");
    assert_eq!(store.object_stamp(&sha), stamp, "the object was rewritten");
    assert_eq!(store.list_keys(), expected_names(store, &[&sha]));

    // An mtime is part of the checkpoint: changing one changes the name.
    set_mtime(&copy.join("hello.py"), 1_600_000_000);
    let (other, _) = store.put(&copy, &[]);
    assert_ne!(other, sha, "an mtime change must change the archive");
}

fn verify_reports_reference_corruptions(store: &TestStore) {
    let work = temp_dir();
    let mut shas = Vec::new();
    for tag in [
        "checksum",
        "size",
        "missing",
        "intact",
        "bad-meta-sha",
        "bad-meta-size",
    ] {
        let dir = work.path().join(tag);
        make_small_tree(&dir, tag);
        let (sha, size) = store.put(&dir, &[]);
        shas.push((sha, size));
    }
    let [
        checksum,
        size_cut,
        missing,
        intact,
        bad_meta_sha,
        bad_meta_size,
    ] = &shas[..]
    else {
        unreachable!()
    };

    // Same length, one byte changed, no digest metadata.
    let mut bytes = store.object_bytes(&checksum.0).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    store.write_object_bytes(&checksum.0, &bytes, None);
    // Cut to its first 100 bytes, metadata kept.
    let bytes = store.object_bytes(&size_cut.0).unwrap();
    store.write_object_bytes(&size_cut.0, &bytes[..100], Some((&size_cut.0, size_cut.1)));
    // Deleted.
    store.delete_object(&missing.0);
    // Intact bytes, but metadata naming another digest / another size.
    let bytes = store.object_bytes(&bad_meta_sha.0).unwrap();
    store.write_object_bytes(&bad_meta_sha.0, &bytes, Some((&intact.0, bad_meta_sha.1)));
    let bytes = store.object_bytes(&bad_meta_size.0).unwrap();
    store.write_object_bytes(
        &bad_meta_size.0,
        &bytes,
        Some((&bad_meta_size.0, bad_meta_size.1 + 1)),
    );

    let expect = [
        (&checksum.0, "Checkpoint checksum mismatch"),
        (&size_cut.0, "Checkpoint size mismatch"),
        (&missing.0, "Checkpoint object is missing"),
        (&intact.0, "ok"),
        (&bad_meta_sha.0, "Checkpoint checksum mismatch"),
        (&bad_meta_size.0, "Checkpoint size mismatch"),
    ];

    // Named explicitly: every one is reported, the deleted one as missing.
    let out = store
        .cmd("verify", shas.iter().map(|(sha, _)| sha.as_str()))
        .failure();
    let verdicts = parse_verify_output(&out);
    assert_eq!(
        verdicts.len(),
        expect.len(),
        "one line per checkpoint: {out}"
    );
    for (sha, want) in expect {
        let got = verdicts
            .get(sha.as_str())
            .unwrap_or_else(|| panic!("verify did not report {sha}: {out}"));
        if want == "ok" {
            assert_eq!(got, "ok", "{sha}: {out}");
        } else {
            assert!(
                got.starts_with(want),
                "{sha}: want {want:?}, got {got:?}\n{out}"
            );
        }
    }

    // All checkpoints: the five still in the store (the deleted one is not listed).
    let out = store.cmd("verify", [] as [&str; 0]).failure();
    let verdicts = parse_verify_output(&out);
    let listed: BTreeSet<&str> = verdicts.keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = expect
        .iter()
        .map(|(sha, _)| sha.as_str())
        .filter(|sha| *sha != missing.0)
        .collect();
    assert_eq!(listed, want, "{out}");
    assert_eq!(verdicts[intact.0.as_str()], "ok", "{out}");
    assert!(verdicts[checksum.0.as_str()].starts_with("Checkpoint checksum mismatch"));
    assert!(verdicts[size_cut.0.as_str()].starts_with("Checkpoint size mismatch"));

    // Only the intact one: success.
    let out = store.cmd("verify", [&intact.0]).success();
    assert_eq!(out.lines(), vec![format!("{} ok", intact.0)], "{out}");
}

fn get_refuses_a_corrupt_object(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (sha, size) = store.put(&src, &[]);
    // Damage the end of the archive only: a streaming extractor would already have
    // written most files before noticing.
    let mut bytes = store.object_bytes(&sha).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n - 200..n - 100] {
        *b ^= 0x5a;
    }
    store.write_object_bytes(&sha, &bytes, Some((&sha, size)));

    let dest = work.path().join("dest");
    let out = store
        .cmd("get", [sha.as_str(), dest.to_str().unwrap()])
        .failure();
    out.one_line_error();
    assert!(
        list_paths(&dest).is_empty(),
        "get wrote files from an archive that did not verify: {:?}\n{out}",
        list_paths(&dest)
    );
}

/// One hostile archive: its entries, and a distinctive part of the offending entry's
/// name that the error must mention.
struct Hostile<'a> {
    what: &'a str,
    entries: Vec<RawEntry<'a>>,
    needle: &'a str,
}

fn get_rejects_hostile_archives(store: &TestStore) {
    let base = temp_dir();
    let base_path = base.path().to_str().unwrap().to_string();
    let outside = base.path().join("outside");
    let secret = outside.join("secret");
    write_file(&secret, b"secret\n", 0o644);
    fs::create_dir(base.path().join("work")).unwrap();
    let dest = base.path().join("work/dest");

    let abs_file = format!("{base_path}/abs-target/evil");
    let outside_str = format!("{base_path}/outside");
    let abs_secret = format!("{base_path}/outside/secret");
    let cases = vec![
        Hostile {
            what: "parent-directory path",
            entries: vec![RawEntry::File {
                name: b"../escape",
                data: b"escaped\n",
            }],
            needle: "escape",
        },
        Hostile {
            what: "parent-directory path inside a subdirectory",
            entries: vec![
                RawEntry::Dir { name: b"a/" },
                RawEntry::File {
                    name: b"a/../../escape-nested",
                    data: b"escaped\n",
                },
            ],
            needle: "escape-nested",
        },
        Hostile {
            what: "absolute path",
            entries: vec![RawEntry::File {
                name: abs_file.as_bytes(),
                data: b"absolute\n",
            }],
            needle: "abs-target",
        },
        Hostile {
            what: "file written through an absolute symlink",
            entries: vec![
                RawEntry::Symlink {
                    name: b"escape-link",
                    target: outside_str.as_bytes(),
                },
                RawEntry::File {
                    name: b"escape-link/evil",
                    data: b"through the link\n",
                },
            ],
            needle: "escape-link",
        },
        Hostile {
            what: "file written through a relative symlink",
            entries: vec![
                RawEntry::Symlink {
                    name: b"up-link",
                    target: b"../..",
                },
                RawEntry::File {
                    name: b"up-link/evil2",
                    data: b"through the link\n",
                },
            ],
            needle: "up-link",
        },
        Hostile {
            what: "hard link to a parent-directory path",
            entries: vec![
                RawEntry::HardLink {
                    name: b"hardlink-rel",
                    target: b"../../outside/secret",
                },
                RawEntry::File {
                    name: b"hardlink-rel",
                    data: b"overwritten\n",
                },
            ],
            needle: "hardlink-rel",
        },
        Hostile {
            what: "hard link to an absolute path",
            entries: vec![
                RawEntry::HardLink {
                    name: b"hardlink-abs",
                    target: abs_secret.as_bytes(),
                },
                RawEntry::File {
                    name: b"hardlink-abs",
                    data: b"overwritten\n",
                },
            ],
            needle: "hardlink-abs",
        },
        Hostile {
            what: "hard link through a symlink",
            entries: vec![
                RawEntry::Symlink {
                    name: b"side-link",
                    target: outside_str.as_bytes(),
                },
                RawEntry::HardLink {
                    name: b"hardlink-via-symlink",
                    target: b"side-link/secret",
                },
            ],
            needle: "hardlink-via-symlink",
        },
    ];

    let before = list_paths(base.path());
    let mut failures = Vec::new();
    for case in &cases {
        let archive = raw_tar_gz(&case.entries);
        let sha = sha256_hex(&archive);
        store.write_object_bytes(&sha, &archive, Some((&sha, archive.len() as u64)));
        let _ = fs::remove_dir_all(&dest);

        let out = run(ckptfs().arg("get").arg(store.url()).arg(&sha).arg(&dest));
        if out.status.success() {
            failures.push(format!("{}: get succeeded\n{out}", case.what));
        } else {
            let lines: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            if lines.len() != 1 || !lines[0].contains(case.needle) {
                failures.push(format!(
                    "{}: want a one-line error naming {:?}\n{out}",
                    case.what, case.needle
                ));
            }
        }

        // Nothing outside DEST was created, changed or linked to.
        let after: BTreeSet<PathBuf> = list_paths(base.path())
            .into_iter()
            .filter(|p| !p.starts_with("work/dest"))
            .collect();
        if after != before {
            failures.push(format!(
                "{}: paths outside DEST changed: created {:?}, removed {:?}",
                case.what,
                after.difference(&before).collect::<Vec<_>>(),
                before.difference(&after).collect::<Vec<_>>()
            ));
        }
        let md = fs::metadata(&secret).unwrap();
        if fs::read(&secret).unwrap() != b"secret\n" || md.nlink() != 1 {
            failures.push(format!(
                "{}: the file outside DEST was modified or hard-linked (nlink {})",
                case.what,
                md.nlink()
            ));
            write_file(&secret, b"secret\n", 0o644);
        }
    }
    assert!(
        failures.is_empty(),
        "hostile archives:\n{}",
        failures.join("\n\n")
    );
}

fn get_skips_device_files_and_fifos(store: &TestStore) {
    let archive = raw_tar_gz(&[
        RawEntry::Dir { name: b"dev/" },
        RawEntry::File {
            name: b"dev/regular",
            data: b"plain data\n",
        },
        RawEntry::Fifo { name: b"dev/fifo" },
        RawEntry::CharDevice {
            name: b"dev/null",
            major: 1,
            minor: 3,
        },
    ]);
    let sha = sha256_hex(&archive);
    store.write_object_bytes(&sha, &archive, Some((&sha, archive.len() as u64)));
    let work = temp_dir();
    let dest = work.path().join("dest");
    store.get(&sha, &dest);
    assert_eq!(fs::read(dest.join("dev/regular")).unwrap(), b"plain data\n");
    let paths = list_paths(&dest);
    let expected: BTreeSet<PathBuf> = ["dev", "dev/regular"].iter().map(PathBuf::from).collect();
    assert_eq!(paths, expected, "special files must be skipped");
}

fn get_accepts_unique_digest_prefixes(store: &TestStore) {
    let work = temp_dir();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_small_tree(&a, "prefix-a");
    make_sample_tree(&b);
    let (sha_a, _) = store.put(&a, &[]);
    let (sha_b, _) = store.put(&b, &[]);

    let dest = work.path().join("dest-b");
    store.get(&sha_b[..8], &dest);
    assert_same_tree(&b, &dest);
    let dest = work.path().join("dest-a");
    store.get(&sha_a[..12], &dest);
    assert_same_tree(&a, &dest);

    // A prefix that matches nothing.
    let unknown = if sha_a.starts_with('f') || sha_b.starts_with('f') {
        if sha_a.starts_with('0') || sha_b.starts_with('0') {
            "7777777"
        } else {
            "0000000"
        }
    } else {
        "fffffff"
    };
    let dest = work.path().join("dest-unknown");
    let out = store
        .cmd("get", [unknown, dest.to_str().unwrap()])
        .failure();
    out.one_line_error();
    assert!(!dest.exists() || list_paths(&dest).is_empty(), "{out}");

    // A prefix that matches two objects.
    for fake in [
        format!("abcdef01{}", "1".repeat(56)),
        format!("abcdef01{}", "2".repeat(56)),
    ] {
        store.write_object_bytes(&fake, b"not an archive", None);
    }
    let dest = work.path().join("dest-ambiguous");
    let out = store
        .cmd("get", ["abcdef01", dest.to_str().unwrap()])
        .failure();
    out.one_line_error();
    assert!(!dest.exists() || list_paths(&dest).is_empty(), "{out}");
}

fn get_refuses_a_non_empty_destination(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_small_tree(&src, "dest");
    let (sha, _) = store.put(&src, &[]);
    let dest = work.path().join("dest");
    write_file(&dest.join("keep.txt"), b"mine\n", 0o644);
    let out = store
        .cmd("get", [sha.as_str(), dest.to_str().unwrap()])
        .failure();
    out.one_line_error();
    assert_eq!(
        list_paths(&dest),
        BTreeSet::from([PathBuf::from("keep.txt")]),
        "{out}"
    );
    assert_eq!(fs::read(dest.join("keep.txt")).unwrap(), b"mine\n");
}

fn ls_lists_checkpoints_oldest_first(store: &TestStore) {
    let work = temp_dir();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_small_tree(&a, "ls-a");
    make_small_tree(&b, "ls-b");
    // Learn both names first (archives are deterministic), then store the one with the
    // larger name first, so that time order and name order disagree.
    let scratch = TestStore::local();
    let (sha_a, _) = scratch.put(&a, &[]);
    let (sha_b, _) = scratch.put(&b, &[]);
    let (first_dir, second_dir) = if sha_a > sha_b { (&a, &b) } else { (&b, &a) };

    let empty = store.cmd("ls", [] as [&str; 0]).success();
    assert!(empty.lines().is_empty(), "empty store: {empty}");
    let json = store.cmd("ls", ["--json"]).success();
    let parsed: serde_json::Value = serde_json::from_str(&json.stdout)
        .unwrap_or_else(|e| panic!("ls --json is not JSON ({e}): {json}"));
    assert_eq!(parsed, serde_json::json!([]), "{json}");

    let (first, first_size) = store.put(first_dir, &[]);
    std::thread::sleep(CLOCK_TICK);
    let (second, second_size) = store.put(second_dir, &[]);
    // Other keys under the prefix are not checkpoints.
    store.write_raw("notes.txt", b"not a checkpoint");
    store.write_raw("tmp/partial.tar.gz", b"not a checkpoint either");

    let out = store.cmd("ls", [] as [&str; 0]).success();
    let lines = out.lines();
    assert_eq!(lines.len(), 2, "{out}");
    let mut times = Vec::new();
    for (line, (sha, size)) in lines
        .iter()
        .zip([(&first, first_size), (&second, second_size)])
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "want `<sha256>  <size>  <time>`: {out}");
        assert!(
            line.contains("  "),
            "fields are separated by two spaces: {line:?}"
        );
        assert_eq!(fields[0], sha.as_str(), "oldest first: {out}");
        assert_eq!(fields[1], size.to_string(), "{out}");
        let t = parse_rfc3339_utc(fields[2])
            .unwrap_or_else(|| panic!("not an RFC 3339 UTC time: {:?}\n{out}", fields[2]));
        assert!((t - unix_now()).abs() < 600, "time far from now: {line:?}");
        times.push(fields[2].to_string());
    }
    assert!(
        parse_rfc3339_utc(&times[0]) < parse_rfc3339_utc(&times[1]),
        "{out}"
    );

    let out = store.cmd("ls", ["--json"]).success();
    let parsed: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("ls --json is not JSON ({e}): {out}"));
    let items = parsed
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {out}"));
    assert_eq!(items.len(), 2, "{out}");
    for (i, (sha, size)) in [(&first, first_size), (&second, second_size)]
        .into_iter()
        .enumerate()
    {
        let item = &items[i];
        assert_eq!(
            item["sha256"],
            serde_json::json!(sha),
            "oldest first: {out}"
        );
        assert_eq!(item["size"], serde_json::json!(size), "{out}");
        let when = item["last_modified"]
            .as_str()
            .unwrap_or_else(|| panic!("last_modified is not a string: {out}"));
        assert_eq!(
            parse_rfc3339_utc(when),
            parse_rfc3339_utc(&times[i]),
            "text and JSON times differ: {out}"
        );
    }
}

fn put_rejects_archives_over_the_limit(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_random_tree(&src, 200 * 1024, 11);
    let out = run(ckptfs()
        .arg("put")
        .arg(store.url())
        .arg(&src)
        .args(["--max-archive-size", "65536"]))
    .failure();
    let line = out.one_line_error().to_lowercase();
    assert!(
        line.contains("too large") || line.contains("limit"),
        "the error must say the archive is too large: {out}"
    );
    assert!(out.stdout.trim().is_empty(), "{out}");
    assert_eq!(
        store.list_keys(),
        Vec::<String>::new(),
        "nothing may be stored"
    );
    assert_eq!(store.multipart_uploads(), Vec::<String>::new());

    // The same tree under a limit it fits.
    let (sha, size) = store.put(&src, &["--max-archive-size", "1MiB"]);
    assert_stored(store, &sha, size);
}

fn concurrent_puts_leave_one_intact_object(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_random_tree(&src, 3 << 20, 21);
    let spawn = || {
        let mut cmd = ckptfs();
        cmd.arg("put").arg(store.url()).arg(&src);
        let what = describe(&cmd);
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn put");
        (child, what)
    };
    let (c1, w1) = spawn();
    let (c2, w2) = spawn();
    let o1 = wait_output(c1, w1).success();
    let o2 = wait_output(c2, w2).success();
    let (sha, size) = parse_put_output(&o1);
    assert_eq!(parse_put_output(&o2), (sha.clone(), size));
    assert_stored(store, &sha, size);
    assert_eq!(store.list_keys(), expected_names(store, &[&sha]));
    assert_eq!(store.multipart_uploads(), Vec::<String>::new());
    let out = store.cmd("verify", [] as [&str; 0]).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
}

/// Builds an archive of `src` with Python's tarfile; returns `(sha, size, path)`.
fn python_archive(
    src: &Path,
    out_dir: &Path,
    label: &str,
    flags: &[&str],
) -> (String, u64, PathBuf) {
    let path = out_dir.join(format!("{label}.tar.gz"));
    let out = run(python()
        .arg(py_script("interop.py"))
        .arg("build")
        .arg(src)
        .arg(&path)
        .args(flags))
    .success();
    let (sha, size) = parse_put_output(&out);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(sha256_hex(&bytes), sha);
    (sha, size, path)
}

fn reads_archives_written_by_python_tarfile(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    let variants: [(&str, &[&str], bool); 4] = [
        ("ustar-prefix-field", &["--format", "ustar"], true),
        ("pax-with-metadata", &["--format", "pax"], true),
        (
            "gnu-dot-prefix-no-metadata",
            &["--format", "gnu", "--dot"],
            false,
        ),
        (
            "pax-multi-member-gzip",
            &["--format", "pax", "--multi-member"],
            true,
        ),
    ];
    let mut shas = Vec::new();
    for (label, flags, with_meta) in variants {
        let (sha, size, path) = python_archive(&src, work.path(), label, flags);
        match store {
            TestStore::S3 { bucket, prefix } => {
                let mut cmd = python();
                cmd.arg(py_script("interop.py"))
                    .arg("upload")
                    .arg(s3_endpoint())
                    .arg(bucket)
                    .arg(prefix)
                    .arg(&path);
                if !with_meta {
                    cmd.arg("--no-metadata");
                }
                let out = run(&mut cmd).success();
                assert_eq!(parse_put_output(&out), (sha.clone(), size));
            }
            TestStore::Local(_) => {
                let bytes = fs::read(&path).unwrap();
                store.write_object_bytes(&sha, &bytes, with_meta.then_some((sha.as_str(), size)));
            }
        }
        shas.push((label, sha, size));
    }

    let out = store.cmd("ls", ["--json"]).success();
    let parsed: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let listed: BTreeSet<(String, u64)> = parsed
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["sha256"].as_str().unwrap().to_string(),
                i["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: BTreeSet<(String, u64)> = shas.iter().map(|(_, s, n)| (s.clone(), *n)).collect();
    assert_eq!(listed, want, "{out}");

    let out = store.cmd("verify", [] as [&str; 0]).success();
    let verdicts = parse_verify_output(&out);
    for (label, sha, _) in &shas {
        assert_eq!(
            verdicts.get(sha).map(String::as_str),
            Some("ok"),
            "{label}: {out}"
        );
    }

    let mut failures = Vec::new();
    for (label, sha, _) in &shas {
        let dest = work.path().join(format!("restored-{label}"));
        let out = run(ckptfs().arg("get").arg(store.url()).arg(sha).arg(&dest));
        if !out.status.success() {
            failures.push(format!("{label}: {out}"));
            continue;
        }
        let diffs = crate::util::tree::diff_trees(&src, &dest);
        if !diffs.is_empty() {
            failures.push(format!(
                "{label}: restored tree differs:\n{}",
                diffs.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn archives_are_readable_by_other_tools(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (sha, size) = store.put(&src, &[]);
    let archive = work.path().join("downloaded.tar.gz");
    match store {
        TestStore::S3 { bucket, .. } => {
            // boto3 sees the object, its metadata and its digest as the format says.
            let out = run(python()
                .arg(py_script("interop.py"))
                .arg("inspect")
                .arg(s3_endpoint())
                .arg(bucket)
                .arg(store.key(&TestStore::object_name(&sha)))
                .arg(&archive))
            .success();
            let info: serde_json::Value = serde_json::from_str(out.stdout.trim())
                .unwrap_or_else(|e| panic!("inspect output ({e}): {out}"));
            assert_eq!(
                info["sha256"],
                serde_json::json!(sha),
                "digest of the bytes: {out}"
            );
            assert_eq!(info["length"], serde_json::json!(size), "{out}");
            assert_eq!(info["content_length"], serde_json::json!(size), "{out}");
            assert_eq!(info["metadata"]["sha256"], serde_json::json!(sha), "{out}");
            assert_eq!(
                info["metadata"]["size"],
                serde_json::json!(size.to_string()),
                "{out}"
            );
            let captured = info["metadata"]["captured"]
                .as_str()
                .expect("a capture time");
            humantime::parse_rfc3339(captured).expect("an RFC 3339 capture time");
        }
        TestStore::Local(dir) => {
            let object = dir.path().join(format!("{sha}.tar.gz"));
            let bytes = fs::read(&object).unwrap();
            assert_eq!(sha256_hex(&bytes), sha);
            assert_eq!(bytes.len() as u64, size);
            let sidecar = fs::read_to_string(dir.path().join(format!("{sha}.tar.gz.meta.json")))
                .expect("sidecar");
            let meta: serde_json::Value = serde_json::from_str(&sidecar).unwrap();
            let captured = meta["captured"].as_str().expect("a capture time");
            humantime::parse_rfc3339(captured).expect("an RFC 3339 capture time");
            assert_eq!(
                meta,
                serde_json::json!({"sha256": sha, "size": size, "captured": captured}),
                "{sidecar}"
            );
            fs::copy(&object, &archive).unwrap();
        }
    }

    // GNU tar restores it exactly.
    let dest = work.path().join("gnu-tar");
    fs::create_dir(&dest).unwrap();
    run(std::process::Command::new("tar")
        .arg("--numeric-owner")
        .arg("-xpzf")
        .arg(&archive)
        .arg("-C")
        .arg(&dest))
    .success();
    assert_same_tree(&src, &dest);
}

// ---------------------------------------------------------------------------------------
// S3 only.

#[test]
fn s3_large_archives_go_up_in_parts() {
    let store = TestStore::s3();
    let work = temp_dir();
    let src = work.path().join("src");
    make_random_tree(&src, 13 << 20, 5);
    let (sha, size) = store.put(&src, &["--part-size", "5MiB"]);
    assert!(size > 13 << 20, "random data should not compress");
    assert_stored(&store, &sha, size);
    let etag = store.etag(&sha);
    let parts: u64 = etag
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("ETag {etag:?} is not a multipart ETag"));
    assert!(parts >= 2, "ETag {etag:?}: want at least 2 parts");
    assert_eq!(store.multipart_uploads(), Vec::<String>::new());

    let dest = work.path().join("dest");
    store.get(&sha, &dest);
    assert_same_tree(&src, &dest);
    let out = store.cmd("verify", [&sha]).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
}

#[test]
fn s3_failed_multipart_upload_is_aborted() {
    let store = TestStore::s3();
    let work = temp_dir();
    let src = work.path().join("src");
    make_random_tree(&src, 7 << 20, 9);
    // Every connection that carries more than 1 MiB towards the server is cut: part
    // uploads fail on every retry, small requests (create, abort) go through.
    let proxy = CuttingProxy::start(&s3_endpoint(), 1 << 20);
    let out = run(ckptfs()
        .env_remove("AWS_ENDPOINT_URL")
        .arg("put")
        .arg("--endpoint-url")
        .arg(proxy.endpoint())
        .arg(store.url())
        .arg(&src)
        .args(["--part-size", "5MiB"]))
    .failure();
    out.one_line_error();
    assert!(out.stdout.trim().is_empty(), "{out}");
    assert!(
        proxy.connections_cut() >= 1,
        "the proxy never cut a connection: {out}"
    );
    let requests = proxy.request_lines();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("POST ") && r.contains("uploads")),
        "no CreateMultipartUpload went through the proxy: {requests:#?}"
    );
    // Checked directly on the server, not through the proxy.
    assert_eq!(
        store.multipart_uploads(),
        Vec::<String>::new(),
        "the failed multipart upload was not aborted; requests: {requests:#?}"
    );
    assert_eq!(
        store.list_keys(),
        Vec::<String>::new(),
        "no object may be left"
    );
}

#[test]
fn s3_bucket_root_store_with_endpoint_flag() {
    // `s3://BUCKET` (empty prefix), endpoint given only by --endpoint-url.
    let store = TestStore::s3_with_prefix("");
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    let with_flag = |sub: &str| {
        let mut cmd = ckptfs();
        cmd.env_remove("AWS_ENDPOINT_URL")
            .arg(sub)
            .arg("--endpoint-url")
            .arg(s3_endpoint())
            .arg(store.url());
        cmd
    };
    let out = run(with_flag("put").arg(&src)).success();
    let (sha, size) = parse_put_output(&out);
    assert!(is_sha256_hex(&sha));
    assert_eq!(store.list_keys(), vec![format!("{sha}.tar.gz")]);
    assert_stored(&store, &sha, size);

    let out = run(&mut with_flag("ls")).success();
    assert_eq!(out.lines().len(), 1, "{out}");
    let fields: Vec<&str> = out.lines()[0].split_whitespace().collect();
    assert_eq!(fields[..2], [sha.as_str(), &size.to_string()], "{out}");
    let out = run(&mut with_flag("verify")).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
    let dest = work.path().join("dest");
    run(with_flag("get").arg(&sha[..10]).arg(&dest)).success();
    assert_same_tree(&src, &dest);
}

/// `ckptfs -v put` of `tree` with its member cache (and layouts) in `cache`.
fn put_cached(store: &TestStore, tree: &Path, cache: &Path, extra: &[&str]) -> Output {
    run(ckptfs()
        .args(["-v", "put"])
        .arg(store.url())
        .arg(tree)
        .arg("--cache-dir")
        .arg(cache)
        .args(extra))
    .success()
}

/// The digest and size of a put of `tree` without any cache, to a store of its own.
fn uncached_put(tree: &Path) -> (String, u64) {
    let out = run(ckptfs()
        .arg("put")
        .arg(TestStore::local().url())
        .arg(tree)
        .args(["--member-cache-size", "0"]))
    .success();
    parse_put_output(&out)
}

/// A second capture after a small change takes every unchanged gzip member from the
/// member cache of the first, and writes the same bytes as a capture without it:
/// restored by `get` and by `tar -xzf` alike.
/// A `--temp-dir` too small for the archive (a 1 MiB tmpfs, which takes `O_DIRECT` on
/// current kernels, so the spool's direct writes are the ones that meet the full
/// disk): `put` and `get` fail with the disk's error, the store gets nothing, the
/// temporary directory is left empty and the destination absent; with room, both work.
fn a_full_temporary_directory_fails_put_and_get_and_leaves_nothing(store: &TestStore) {
    use std::ffi::OsStr;
    let work = temp_dir();
    let src = work.path().join("src");
    // 3 MiB that gzip cannot shrink: the archive cannot fit in 1 MiB.
    write_file(&src.join("noise.bin"), &random_bytes(3 << 20, 7), 0o644);
    write_file(&src.join("note.txt"), b"small\n", 0o644);
    let small = work.path().join("small");
    let _disk = crate::util::SmallDisk::mount(&small, "size=1m,mode=0700");
    let empty = |dir: &Path| fs::read_dir(dir).unwrap().count() == 0;

    let before = store.list_keys();
    let out = store
        .cmd(
            "put",
            [src.as_os_str(), OsStr::new("--temp-dir"), small.as_os_str()],
        )
        .failure();
    assert!(out.stderr.contains("No space left"), "{out}");
    assert_eq!(
        store.list_keys(),
        before,
        "a failed put stored something: {out}"
    );
    assert!(empty(&small), "the put's spool was left behind");

    let (sha, _) = store.put(&src, &[]);
    let dest = work.path().join("dest");
    let out = store
        .cmd(
            "get",
            [
                OsStr::new(&sha),
                dest.as_os_str(),
                OsStr::new("--temp-dir"),
                small.as_os_str(),
            ],
        )
        .failure();
    assert!(out.stderr.contains("No space left"), "{out}");
    assert!(!dest.exists(), "a failed get made {dest:?}");
    assert!(empty(&small), "the get's download was left behind");
    store.get(&sha, &dest);
    assert_same_tree(&src, &dest);
}

/// The compressed length of each gzip member of `archive`, in order.
fn member_lengths(mut archive: &[u8]) -> Vec<usize> {
    let mut lengths = Vec::new();
    while !archive.is_empty() {
        let mut member = flate2::bufread::GzDecoder::new(archive);
        std::io::copy(&mut member, &mut std::io::sink()).unwrap();
        let rest = member.into_inner();
        lengths.push(archive.len() - rest.len());
        archive = rest;
    }
    lengths
}

fn a_turn_compresses_only_what_changed(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    for d in 0..8 {
        for f in 0..12 {
            // Text that compresses about as source code does, so that every member
            // is worth keeping in the cache.
            let text: String = (0..2000 + d * 100 + f)
                .map(|i| {
                    let v = (i as u64 * 2_654_435_761) ^ (d * 31 + f) as u64;
                    format!("let v{i} = {};\n", v % 1_000_003)
                })
                .collect();
            write_file(
                &src.join(format!("pkg{d}/f{f:02}.txt")),
                text.as_bytes(),
                0o644,
            );
        }
    }
    let cache = work.path().join("cache");
    let put = |tree: &Path| put_cached(store, tree, &cache, &[]);
    let first = put(&src);
    let members = logged_count(&first.stderr, "compressed");
    assert!(members >= 6, "{first}");
    assert_eq!(logged_count(&first.stderr, "reused"), 0, "{first}");
    // Members under the member cache's 4 KiB are not kept, so compressed every time.
    let (first_sha, _) = parse_put_output(&first);
    let small = member_lengths(&store.object_bytes(&first_sha).unwrap())
        .into_iter()
        .filter(|&length| length < 4096)
        .count() as u64;

    write_file(&src.join("pkg3/f05.txt"), b"changed\n", 0o644);
    let second = put(&src);
    let (sha, size) = parse_put_output(&second);
    let compressed = logged_count(&second.stderr, "compressed");
    let reused = logged_count(&second.stderr, "reused");
    // The member holding the edit, and the one after it when the edit moves the cut
    // between them (README, "Archive encoding").
    assert!(
        compressed <= 2 + small && reused + 2 + small >= members,
        "{small} small members; {second}"
    );

    // The same bytes without any cache; none is even made.
    let other = TestStore::local();
    let unused = work.path().join("unused-cache");
    let out = run(ckptfs()
        .arg("put")
        .arg(other.url())
        .arg(&src)
        .args(["--member-cache-size", "0", "--cache-dir"])
        .arg(&unused))
    .success();
    assert_eq!(parse_put_output(&out), (sha.clone(), size), "{out}");
    assert!(
        !unused.exists(),
        "a put that keeps no members made {unused:?}"
    );

    let restored = work.path().join("restored");
    run(ckptfs()
        .arg("get")
        .arg(store.url())
        .arg(&sha)
        .arg(&restored))
    .success();
    assert_same_tree(&src, &restored);
    let archive = work.path().join("turn.tar.gz");
    fs::write(&archive, store.object_bytes(&sha).unwrap()).unwrap();
    let untarred = work.path().join("untarred");
    fs::create_dir(&untarred).unwrap();
    run(std::process::Command::new("tar")
        .arg("-xzpf")
        .arg(&archive)
        .arg("-C")
        .arg(&untarred))
    .success();
    assert_same_tree(&src, &untarred);
}

/// A put of a directory captured before leaves unread the files whose stamp (inode,
/// size, times) the last capture saw, taking their members as it recorded them, and
/// writes the object a put without any cache writes. A changed file is read (also one
/// whose modification time was set back: its change time moved, and one replaced by a
/// file of the same size and time: another inode), and so are the unchanged files
/// that share its member; what was removed or added is seen.
fn a_turn_reads_only_the_files_that_changed(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    let mut total = 0u64;
    for d in 0..6u64 {
        for f in 0..20u64 {
            let text: String = (0..1500 + d * 200 + f)
                .map(|i| format!("let v{i} = {};\n", (i * 2_654_435_761) ^ (d * 31 + f)))
                .collect();
            total += text.len() as u64;
            write_file(
                &src.join(format!("pkg{d}/f{f:02}.txt")),
                text.as_bytes(),
                0o644,
            );
        }
    }
    let big = random_bytes(3 << 20, 7);
    total += big.len() as u64;
    write_file(&src.join("pkg2/blob.bin"), &big, 0o644);
    // Files changed within `--settle` of a put are always read (their stamp could
    // stay the same through a second change): let these settle.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let cache = work.path().join("cache");
    let put = |tree: &Path| put_cached(store, tree, &cache, &["--settle", "1"]);
    let first = put(&src);
    assert_eq!(logged_count(&first.stderr, "unread"), 0, "{first}");

    let again = put(&src);
    assert_eq!(logged_count(&again.stderr, "unread"), total, "{again}");
    assert_eq!(logged_count(&again.stderr, "read_again"), 0, "{again}");
    assert_eq!(parse_put_output(&again), parse_put_output(&first));

    // One file changed in place with its size and modification time kept, one added,
    // one removed.
    let edited = src.join("pkg4/f07.txt");
    let mut bytes = fs::read(&edited).unwrap();
    let mtime = fs::metadata(&edited).unwrap().modified().unwrap();
    bytes[100] ^= 1;
    fs::write(&edited, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&edited)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    // Another replaced by a new file of the same size and modification time, renamed
    // over it (a new inode).
    let replaced = src.join("pkg0/f03.txt");
    let mut other = fs::read(&replaced).unwrap();
    other[10] ^= 1;
    let fresh = src.join("pkg0/.f03.new");
    fs::write(&fresh, &other).unwrap();
    fs::File::options()
        .write(true)
        .open(&fresh)
        .unwrap()
        .set_modified(fs::metadata(&replaced).unwrap().modified().unwrap())
        .unwrap();
    fs::rename(&fresh, &replaced).unwrap();
    write_file(&src.join("pkg1/new.txt"), b"new\n", 0o644);
    fs::remove_file(src.join("pkg5/f19.txt")).unwrap();
    // Settled again, so that only the change time tells the edit.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let third = put(&src);
    let (sha, size) = parse_put_output(&third);
    let unread = logged_count(&third.stderr, "unread");
    let read_again = logged_count(&third.stderr, "read_again");
    // The four changes sit in four groups of files (members of up to a MiB, in a
    // tree of 9 MiB): the unchanged files of those groups are read again.
    assert!(
        unread > total * 8 / 10 && read_again < total / 2,
        "{total} bytes, {unread} left unread, {read_again} read after all: {third}"
    );

    assert_eq!(uncached_put(&src), (sha.clone(), size));
    let restored = work.path().join("restored");
    store.get(&sha, &restored);
    assert_same_tree(&src, &restored);

    // With the default `--settle` (60 s), files changed seconds ago are all read.
    let careful = put_cached(store, &src, &cache, &[]);
    assert_eq!(logged_count(&careful.stderr, "unread"), 0, "{careful}");
    assert_eq!(parse_put_output(&careful), (sha, size));
}

/// A turn that changes one file of 60 sends about S3's minimum part around the change
/// and has the store copy the rest from the turn before (`UploadPartCopy`); the object
/// is the one a capture without any cache writes, and restores. When the source was
/// deleted, or changed under its name, between the turns, everything is sent instead
/// and the object is still right; no multipart upload is left behind.
#[test]
fn s3_a_turn_copies_unchanged_ranges_in_the_store() {
    let store = TestStore::s3();
    let work = temp_dir();
    let cache = work.path().join("cache");
    let put = |tree: &Path| {
        let out = put_cached(&store, tree, &cache, &["--part-size", "5MiB"]);
        let (sha, size) = parse_put_output(&out);
        assert_stored(&store, &sha, size);
        (sha, size, out)
    };
    let turn = |n: usize, edited: Option<usize>| {
        let dir = work.path().join(format!("turn{n}"));
        make_turn_tree(&dir, 60, edited);
        dir
    };
    let (first, _, out) = put(&turn(0, None));
    assert_eq!(logged_count(&out.stderr, "copied"), 0, "{out}");

    // One file in the middle changed: at most two minimum parts are sent.
    let tree = turn(1, Some(30));
    let (second, size, out) = put(&tree);
    let (sent, copied) = (
        logged_count(&out.stderr, "sent"),
        logged_count(&out.stderr, "copied"),
    );
    assert_eq!(sent + copied, size, "{out}");
    assert!(sent <= 10 << 20 && copied >= 8 << 20, "{out}");
    assert_eq!(uncached_put(&tree), (second.clone(), size));
    let restored = work.path().join("restored");
    store.get(&second, &restored);
    assert_same_tree(&tree, &restored);

    // The store (moto) gave no SHA-256 of a copied part, so the object was read back,
    // and the next put may send instead of copying (below): forgotten here, so that
    // it copies.
    forget_copy_costs(&cache);
    // The source changed under its name (same length): the copy's ETag is not the
    // MD5 of the bytes expected, and the whole object is sent.
    let planted = {
        let mut bytes = store.object_bytes(&second).unwrap();
        bytes[size as usize / 8] ^= 0xff;
        bytes
    };
    store.write_object_bytes(&second, &planted, Some((&second, size)));
    store.delete_object(&first);
    let tree = turn(2, Some(20));
    let (third, size, out) = put(&tree);
    assert!(out.stderr.contains("is not the bytes expected"), "{out}");
    assert_eq!(logged_count(&out.stderr, "sent"), size, "{out}");
    assert_eq!(store.multipart_uploads(), Vec::<String>::new());
    let restored = work.path().join("restored-3");
    store.get(&third, &restored);
    assert_same_tree(&tree, &restored);

    // Every source deleted: nothing to copy, nothing tried.
    store.delete_object(&second);
    store.delete_object(&third);
    let tree = turn(3, Some(10));
    let (fourth, size, out) = put(&tree);
    assert_eq!(logged_count(&out.stderr, "sent"), size, "{out}");
    assert!(!out.stderr.contains("failed"), "{out}");
    let restored = work.path().join("restored-4");
    store.get(&fourth, &restored);
    assert_same_tree(&tree, &restored);
}

/// The files where the member cache in `cache` keeps what each store's copies cost.
fn copy_costs_files(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for encoder in fs::read_dir(cache.join("members")).unwrap() {
        let stores = encoder.unwrap().path().join("stores");
        if let Ok(entries) = fs::read_dir(&stores) {
            files.extend(entries.map(|e| e.unwrap().path()));
        }
    }
    files
}

fn forget_copy_costs(cache: &Path) {
    for file in copy_costs_files(cache) {
        fs::remove_file(file).unwrap();
    }
}

/// Sets what the member cache in `cache` measured of the store's upload rate (the
/// one store it knows), keeping the rest.
fn set_upload_rate(cache: &Path, rate: &str) {
    let files = copy_costs_files(cache);
    assert_eq!(files.len(), 1, "{files:?}");
    let text = fs::read_to_string(&files[0]).unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("upload=")).collect();
    fs::write(&files[0], format!("{}\nupload={rate}\n", kept.join("\n"))).unwrap();
}

/// A store that vouches for a copied part by its MD5 alone (moto) makes each copy
/// cost a read-back of the whole object: the first turn that copies learns that and
/// how fast the read-back went; a later turn copies again only if reading back costs
/// less than sending the bytes the copy saves, by the rates measured, and says what
/// it chose. Either way the object is right.
#[test]
fn s3_a_store_that_vouches_for_copies_by_md5_alone_is_sent_the_bytes_when_cheaper() {
    let store = TestStore::s3();
    let work = temp_dir();
    let cache = work.path().join("cache");
    let put = |n: usize, edited: Option<usize>| {
        let tree = work.path().join(format!("turn{n}"));
        make_turn_tree(&tree, 40, edited);
        let out = put_cached(&store, &tree, &cache, &["--part-size", "5MiB"]);
        let (sha, size) = parse_put_output(&out);
        assert_stored(&store, &sha, size);
        let restored = work.path().join(format!("restored-{n}"));
        store.get(&sha, &restored);
        assert_same_tree(&tree, &restored);
        (size, out)
    };
    let sending = "sending instead of copying";
    let reading_back = "reading back an object the store assembled";
    put(0, None);
    let (_, out) = put(1, Some(10));
    assert!(logged_count(&out.stderr, "copied") > 0, "{out}");
    assert!(out.stderr.contains(reading_back), "{out}");
    let text = fs::read_to_string(&copy_costs_files(&cache)[0]).unwrap();
    assert!(text.contains("vouched=no\n"), "{text}");
    assert!(!text.contains("download=\n"), "{text}");

    // Sending as fast as anything: reading back would cost more.
    set_upload_rate(&cache, "1000000000000");
    let (size, out) = put(2, Some(20));
    assert!(out.stderr.contains(sending), "{out}");
    assert_eq!(logged_count(&out.stderr, "copied"), 0, "{out}");
    assert_eq!(logged_count(&out.stderr, "sent"), size, "{out}");
    assert!(!out.stderr.contains(reading_back), "{out}");

    // Sending at a byte a second: copying and reading back wins.
    set_upload_rate(&cache, "1");
    let (_, out) = put(3, Some(30));
    assert!(!out.stderr.contains(sending), "{out}");
    assert!(logged_count(&out.stderr, "copied") > 0, "{out}");
    assert!(out.stderr.contains(reading_back), "{out}");
}

/// Two 128-byte blocks with the same MD5 after the first 3,001,088 bytes of the
/// archive of [`collision_tree`] (made with fastcoll for that prefix). Incompressible
/// data is stored verbatim in deflate's stored blocks, so a staged file can place
/// either block in an archive at an offset its author can predict.
const C1: &str = "d537788d9f973e66331bb12868ea169436a2da3443f1b0621d5a82bed092a3c61dfac1edd8b217facb413c3a4012a16c54468acb2eba7d2bf2a4fcb14db8762e3f04420237a5afff5d95dd0bcde51a43ce0ba63d2f3a0016cd7716c9d9717db2317197ba5a138e237b90c0af8f89534a8062500e30f259003f6fe87d89320890";
const C2: &str = "d537788d9f973e66331bb12868ea169436a2dab443f1b0621d5a82bed092a3c61dfac1edd8b217facb413c3a4092a16c54468acb2eba7d2bf2a4fc314db8762e3f04420237a5afff5d95dd0bcde51a43ce0ba6bd2f3a0016cd7716c9d9717db2317197ba5a138e237b90c0af8f09534a8062500e30f259003f6fe8fd89320890";
const COLLISION_AT: usize = 3_001_088;

/// One file, `F`: random bytes with [`C1`] where the archive puts it at
/// [`COLLISION_AT`].
fn collision_tree(dir: &Path) {
    let mut data = random_bytes(3_000_019, 7);
    data.extend_from_slice(&hex::decode(C1).unwrap());
    data.extend_from_slice(&random_bytes((7 << 20) - 3_000_019, 8));
    write_file(&dir.join("F"), &data, 0o644);
    set_mtime(&dir.join("F"), 1_700_000_000);
}

/// An attacker who can write to the bucket swaps, in the object of turn N, a block
/// for another with the same MD5; turn N+1 copies that range. The copied part's
/// ETag (an MD5) matches the bytes expected, and moto gives no SHA-256 of a copied
/// part: the object must be read back, found wrong, and replaced, never reported as
/// stored with bytes that do not hash to its name.
#[test]
fn s3_a_copy_whose_md5_collides_is_caught_and_replaced() {
    let store = TestStore::s3();
    let work = temp_dir();
    let cache = work.path().join("cache");
    let put = |tree: &Path| put_cached(&store, tree, &cache, &["--part-size", "5MiB"]);
    let first = work.path().join("first");
    collision_tree(&first);
    let (sha, size) = parse_put_output(&put(&first));
    let good = store.object_bytes(&sha).unwrap();
    let (c1, c2) = (hex::decode(C1).unwrap(), hex::decode(C2).unwrap());
    assert_eq!(
        good[COLLISION_AT..COLLISION_AT + 128],
        c1[..],
        "the archive encoding moved the block: make a new collision for this test"
    );
    let mut planted = good.clone();
    planted[COLLISION_AT..COLLISION_AT + 128].copy_from_slice(&c2);
    let md5 = |b: &[u8]| hex::encode(<md5::Md5 as md5::Digest>::digest(b));
    assert_eq!(md5(&planted), md5(&good), "the blocks must collide");
    assert_ne!(sha256_hex(&planted), sha);
    store.write_object_bytes(&sha, &planted, Some((&sha, size)));

    let second = work.path().join("second");
    collision_tree(&second);
    write_file(&second.join("zz"), b"turn 2\n", 0o644);
    let out = put(&second);
    let (sha2, size2) = parse_put_output(&out);
    assert!(
        out.stderr.contains("replacing a damaged copy"),
        "the colliding copy was not caught: {out}"
    );
    assert_stored(&store, &sha2, size2);
    let restored = work.path().join("restored");
    store.get(&sha2, &restored);
    assert_same_tree(&second, &restored);
}

/// A bucket with versioning and S3 Object Lock (default retention, governance mode):
/// `put` stores into it (uploads carry the checksums Object Lock requires); a
/// checkpoint deleted (a delete marker) is reported by `verify --history` and restored
/// byte for byte by `get`; a name overwritten with other bytes is reported as
/// tampered, and `get` restores the version that verifies.
#[test]
fn s3_a_locked_history_shows_deleted_and_overwritten_checkpoints() {
    use aws_sdk_s3::types::{
        DefaultRetention, ObjectLockConfiguration, ObjectLockEnabled, ObjectLockRetentionMode,
        ObjectLockRule,
    };
    let bucket = crate::util::unique_name("ckptfs-locked");
    let client = crate::util::s3();
    crate::util::block_on(
        client
            .create_bucket()
            .bucket(&bucket)
            .object_lock_enabled_for_bucket(true)
            .send(),
    )
    .expect("create a bucket with Object Lock");
    let retention = DefaultRetention::builder()
        .mode(ObjectLockRetentionMode::Governance)
        .days(1)
        .build();
    crate::util::block_on(
        client
            .put_object_lock_configuration()
            .bucket(&bucket)
            .object_lock_configuration(
                ObjectLockConfiguration::builder()
                    .object_lock_enabled(ObjectLockEnabled::Enabled)
                    .rule(
                        ObjectLockRule::builder()
                            .default_retention(retention)
                            .build(),
                    )
                    .build(),
            )
            .send(),
    )
    .expect("default retention");
    let store = TestStore::S3 {
        bucket: bucket.clone(),
        prefix: "sandbox/ckpts".into(),
    };
    let work = temp_dir();
    let (one, two) = (work.path().join("one"), work.path().join("two"));
    make_sample_tree(&one);
    fs::create_dir(&two).unwrap();
    write_file(&two.join("f"), b"two\n", 0o644);
    let (sha_one, _) = store.put(&one, &[]);
    let (sha_two, _) = store.put(&two, &[]);
    let clean = store.cmd("verify", ["--history"]).success();
    assert_eq!(clean.lines().len(), 2, "{clean}");

    // Whoever can write the bucket deletes one checkpoint and overwrites the other.
    let key = |sha: &str| store.key(&TestStore::object_name(sha));
    crate::util::block_on(
        client
            .delete_object()
            .bucket(&bucket)
            .key(key(&sha_one))
            .send(),
    )
    .expect("delete");
    crate::util::block_on(
        client
            .put_object()
            .bucket(&bucket)
            .key(key(&sha_two))
            .body(b"other bytes".to_vec().into())
            .content_md5(base64_md5(b"other bytes"))
            .send(),
    )
    .expect("overwrite");
    let listed = store.cmd("ls", [] as [&str; 0]).success();
    assert_eq!(
        listed.lines().len(),
        1,
        "the listing no longer shows the deleted one"
    );

    let history = store.cmd("verify", ["--history"]);
    assert_eq!(history.status.code(), Some(1), "{history}");
    let line = |prefix: &str| {
        history
            .lines()
            .into_iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix}...: {history}"))
            .to_owned()
    };
    assert!(
        line(&format!("{sha_one} HIDDEN: deleted ")).contains("verifies"),
        "{history}"
    );
    assert!(
        line(&format!("{sha_two} TAMPERED: version ")).contains("(the current one)"),
        "{history}"
    );
    assert!(
        line(&format!("{sha_two} FAILED: ")).contains("mismatch"),
        "{history}"
    );
    // A bound on the versions downloaded per name: the older ones are reported.
    let bounded = store.cmd("verify", ["--history", "--max-versions", "1"]);
    assert_eq!(bounded.status.code(), Some(1), "{bounded}");
    assert!(
        bounded.stdout.contains(&format!(
            "{sha_two} NOT CHECKED: 1 older versions past --max-versions 1"
        )),
        "{bounded}"
    );

    // Both restore byte for byte from the versions that verify.
    for (sha, tree) in [(&sha_one, &one), (&sha_two, &two)] {
        let dest = work.path().join(format!("restored-{}", &sha[..8]));
        let out = store.get(sha, &dest);
        assert!(out.stderr.contains("which verifies"), "{out}");
        assert_same_tree(tree, &dest);
    }

    // The review commands read them the same way.
    let cat = store.cmd("cat", [sha_one.as_str(), "hello.py"]).success();
    assert_eq!(cat.stdout, "print('hello, checkpoint')\n", "{cat}");
    assert!(cat.stderr.contains("which verifies"), "{cat}");
    let cat = store.cmd("cat", [sha_two.as_str(), "f"]).success();
    assert_eq!(cat.stdout, "two\n", "{cat}");

    // A prune on this bucket hides what it deletes, and says the bytes stay.
    write_file(&two.join("f"), b"three\n", 0o644);
    let (sha_three, _) = store.put(&two, &[]);
    let pruned = store
        .cmd("prune", ["--keep-last", "1", "--grace", "0s"])
        .success();
    assert!(
        pruned.stderr.contains("hidden behind delete markers"),
        "{pruned}"
    );
    let history = store.cmd("verify", ["--history"]);
    assert!(
        history
            .stdout
            .contains(&format!("{sha_two} HIDDEN: deleted ")),
        "{history}"
    );
    assert!(
        history.stdout.contains(&format!("{sha_three} ok")),
        "{history}"
    );
}

fn base64_md5(bytes: &[u8]) -> String {
    aws_smithy_types::base64::encode(<md5::Md5 as md5::Digest>::digest(bytes))
}
