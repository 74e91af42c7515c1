//! A mounted checkpoint is what `tar -xzf` makes of the same archive, whoever wrote
//! it: GNU tar (gnu and pax formats), Python's tarfile, and `ckptfs put`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::archive::{RawEntry, raw_tar_gz};
use crate::util::mount::{Mount, repo_temp_dir};
use crate::util::tree::{
    BASE_MTIME, diff_trees, fix_mtimes, list_paths, make_dir, make_sample_tree, random_bytes,
    write_file,
};
use crate::util::{TestStore, py_script, python, run, sha256_hex};

/// Sets the mtime of `path` (not following symlinks) to `secs` + `nanos`.
fn set_mtime_ns(path: &Path, secs: i64, nanos: i64) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let time = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: nanos as _,
    };
    // SAFETY: c_path is NUL-terminated and the array holds two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            [time, time].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

/// The SPEC's reference tree plus what the mount handles specially: files just below
/// and at the own-file threshold (16 KiB), a directory too large for one readdir
/// reply, a file with three names, a hard-linked large file, a long symlink target
/// and a long name.
fn make_fidelity_tree(root: &Path) {
    make_sample_tree(root);
    write_file(
        &root.join("threshold/below.bin"),
        &random_bytes(16_383, 1),
        0o644,
    );
    write_file(
        &root.join("threshold/at.bin"),
        &random_bytes(16_384, 2),
        0o600,
    );
    write_file(
        &root.join("threshold/above.bin"),
        &random_bytes(16_385, 3),
        0o755,
    );
    fs::hard_link(
        root.join("threshold/at.bin"),
        root.join("threshold/at-link.bin"),
    )
    .expect("hard link to a large file");
    for i in 0..300 {
        write_file(
            &root.join(format!("many/entry-{i:03}-with-a-longish-name.txt")),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    fs::hard_link(root.join("hard-a"), root.join("threshold/hard-c")).expect("third hard link");
    write_file(
        &root.join(format!("long/{}", "n".repeat(200))),
        b"long name\n",
        0o644,
    );
    crate::util::tree::symlink(
        format!("../{}/{}", "t".repeat(80), "u".repeat(80)),
        &root.join("long/long-target"),
    );
    fix_mtimes(root);
}

/// Values that do not fit the old tar header and travel in pax records (pax format)
/// or base-256 fields (GNU format): a fractional mtime (Python writes it rounded into
/// the header, exact in a pax record), mtimes before 1970 and after 2242, owner ids
/// above 2097151.
fn make_wide_values_tree(root: &Path) {
    for name in ["fractional", "before-1970", "after-2242"] {
        write_file(&root.join("times").join(name), name.as_bytes(), 0o644);
    }
    write_file(&root.join("ids/huge"), b"huge owner ids\n", 0o644);
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::lchown(root.join("ids/huge"), Some(3_000_000), Some(3_000_001))
            .expect("chown to large ids");
    }
    fix_mtimes(root);
    set_mtime_ns(&root.join("times/fractional"), BASE_MTIME + 12, 700_000_000);
    set_mtime_ns(&root.join("times/before-1970"), -86_400, 0);
    set_mtime_ns(&root.join("times/after-2242"), 10_413_792_000, 0);
}

/// Reads at a few offsets (start, middle, near and past the end) of some files, packed
/// and own, comparing with the extraction.
fn check_random_access(label: &str, expected: &Path, mounted: &Path, failures: &mut Vec<String>) {
    use std::os::unix::fs::FileExt;
    for rel in [
        "big.txt",
        "threshold/at.bin",
        "threshold/below.bin",
        "hello.py",
    ] {
        let want = fs::read(expected.join(rel)).unwrap();
        let file = fs::File::open(mounted.join(rel)).unwrap();
        let len = want.len() as u64;
        for offset in [0, 1, len / 2, len.saturating_sub(10), len, len + 100] {
            let mut buf = vec![0u8; 3000];
            let n = file.read_at(&mut buf, offset).unwrap();
            let start = (offset as usize).min(want.len());
            let end = (start + buf.len()).min(want.len());
            if buf[..n] != want[start..end] {
                failures.push(format!("{label}: {rel}: pread at {offset} differs"));
            }
        }
    }
}

/// Writes `OUT` with `tar -czf OUT -C SRC .` in the given format.
fn gnu_tar(src: &Path, out: &Path, format: &str) {
    run(Command::new("tar")
        .arg(format!("--format={format}"))
        .arg("-czf")
        .arg(out)
        .arg("-C")
        .arg(src)
        .arg("."))
    .success();
}

fn python_tar(src: &Path, out: &Path, format: &str) {
    run(python()
        .arg(py_script("tarball.py"))
        .arg(src)
        .arg(out)
        .arg(format))
    .success();
}

/// Extracts `archive` into a new directory `dest` with GNU tar (as root: owners and
/// modes restored).
fn tar_extract(archive: &Path, dest: &Path) {
    make_dir(dest);
    run(Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(dest))
    .success();
}

/// `find -printf` of every entry under `root` (lstat, never following links): type,
/// mode, size (not for directories, whose size is the filesystem's business), mtime
/// (whole seconds), owner, link count, link target.
fn find_listing(root: &Path) -> Vec<String> {
    let out = run(Command::new("find")
        .arg(root)
        .arg("-mindepth")
        .arg("1")
        .arg("-printf")
        .arg("%P\\0%y\\0%m\\0%s\\0%T@\\0%U:%G\\0%n\\0%l\\n"))
    .success();
    let mut lines: Vec<String> = out
        .stdout
        .lines()
        .map(|line| {
            let mut fields: Vec<&str> = line.split('\0').collect();
            assert_eq!(fields.len(), 8, "bad find line {line:?}");
            if fields[1] == "d" {
                fields[3] = "-";
            }
            // Whole seconds: the mount does not keep sub-second times.
            fields[4] = fields[4].split('.').next().unwrap_or_default();
            fields.join(" | ")
        })
        .collect();
    lines.sort();
    lines
}

/// What `diff_trees` leaves out: link counts of every entry, and symlink mtimes.
fn link_counts_and_symlink_times(root: &Path) -> BTreeMap<PathBuf, (u64, Option<i64>)> {
    list_paths(root)
        .into_iter()
        .map(|rel| {
            let md = fs::symlink_metadata(root.join(&rel)).expect("lstat");
            let link_mtime = md.file_type().is_symlink().then_some(md.mtime());
            (rel, (md.nlink(), link_mtime))
        })
        .collect()
}

#[track_caller]
fn assert_like_extraction(
    label: &str,
    expected: &Path,
    mounted: &Path,
    failures: &mut Vec<String>,
) {
    let diff = run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(expected)
        .arg(mounted));
    if !diff.status.success() {
        failures.push(format!("{label}: diff -r --no-dereference: {diff}"));
    }
    let diffs = diff_trees(expected, mounted);
    if !diffs.is_empty() {
        failures.push(format!("{label}: lstat walk:\n{}", diffs.join("\n")));
    }
    let (want, got) = (find_listing(expected), find_listing(mounted));
    if want != got {
        let missing: Vec<_> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<_> = got.iter().filter(|l| !want.contains(l)).collect();
        failures.push(format!(
            "{label}: find -printf differs\n  tar -x only: {missing:#?}\n  mount only: {extra:#?}"
        ));
    }
    let (want, got) = (
        link_counts_and_symlink_times(expected),
        link_counts_and_symlink_times(mounted),
    );
    if want != got {
        let diffs: Vec<String> = want
            .iter()
            .filter(|(path, v)| got.get(*path) != Some(v))
            .map(|(path, v)| {
                format!(
                    "  {}: tar -x {v:?}, mount {:?}",
                    path.display(),
                    got.get(path)
                )
            })
            .collect();
        failures.push(format!(
            "{label}: (nlink, symlink mtime) differ:\n{}",
            diffs.join("\n")
        ));
    }
}

/// Archives of `src` by every writer, stored in `store`: `(label, sha, archive file)`.
/// Python's archives go without metadata, as other tools may store them.
fn store_every_writers_archive(
    store: &TestStore,
    src: &Path,
    work: &Path,
) -> Vec<(String, String, PathBuf)> {
    let mut archives: Vec<(&str, PathBuf)> = Vec::new();
    for (label, format) in [("gnu-tar-gnu", "gnu"), ("gnu-tar-pax", "pax")] {
        let out = work.join(format!("{label}.tar.gz"));
        gnu_tar(src, &out, format);
        archives.push((label, out));
    }
    for (label, format) in [("python-pax", "pax"), ("python-gnu", "gnu")] {
        let out = work.join(format!("{label}.tar.gz"));
        python_tar(src, &out, format);
        archives.push((label, out));
    }
    let mut shas = Vec::new();
    for (label, path) in archives {
        let bytes = fs::read(&path).expect("read archive");
        let sha = sha256_hex(&bytes);
        let meta = (!label.starts_with("python")).then_some((sha.as_str(), bytes.len() as u64));
        store.write_object_bytes(&sha, &bytes, meta);
        shas.push((label.to_string(), sha, path));
    }
    let (put_sha, _) = store.put(src, &[]);
    let put_archive = work.join("ckptfs-put.tar.gz");
    fs::write(
        &put_archive,
        store.object_bytes(&put_sha).expect("put object"),
    )
    .unwrap();
    shas.push(("ckptfs-put".into(), put_sha, put_archive));
    shas
}

pub(super) fn every_writer_mounts_like_tar_x(store: &TestStore) {
    let work = repo_temp_dir("fidelity-");
    let src = work.path().join("src");
    make_fidelity_tree(&src);
    let shas = store_every_writers_archive(store, &src, work.path());
    let mount = Mount::new(store).start();

    // Listing the root (and stat of every checkpoint directory) downloads nothing.
    let ls = run(Command::new("ls").arg("-la").arg(mount.path())).success();
    let status = mount.status();
    assert_eq!(
        status.downloads, 0,
        "ls -la of the root downloaded:\n{}",
        status.text
    );
    for (label, sha, _) in &shas {
        assert!(
            ls.stdout.contains(sha.as_str()),
            "{label} {sha} not listed: {ls}"
        );
        assert_eq!(status.state(sha), "listed", "{label}:\n{}", status.text);
    }

    let mut failures = Vec::new();
    for (label, sha, archive) in &shas {
        let extracted = work.path().join(format!("x-{label}"));
        tar_extract(archive, &extracted);
        assert_like_extraction(label, &extracted, &mount.join(sha), &mut failures);
        check_random_access(label, &extracted, &mount.join(sha), &mut failures);
    }
    // Copying a checkpoint out with `cp -a` gives the same tree again.
    let (label, sha, _) = &shas[0];
    let copy = work.path().join("cp-a");
    run(Command::new("cp").arg("-a").arg(mount.join(sha)).arg(&copy)).success();
    let diffs = diff_trees(&work.path().join(format!("x-{label}")), &copy);
    if !diffs.is_empty() {
        failures.push(format!("cp -a of {label}:\n{}", diffs.join("\n")));
    }
    assert!(
        failures.is_empty(),
        "{}\nlog:\n{}",
        failures.join("\n\n"),
        mount.log_text()
    );

    let status = mount.status();
    for (label, sha, _) in &shas {
        assert_eq!(status.state(sha), "verified", "{label}:\n{}", status.text);
    }
    assert_eq!(status.downloads, shas.len() as u64, "{}", status.text);
}

/// Mtimes and owners that need pax records or base-256 numbers come out as `tar -x`
/// restores them, from every writer.
pub(super) fn wide_header_values_mount_like_tar_x(store: &TestStore) {
    let work = repo_temp_dir("wide-");
    let src = work.path().join("src");
    make_wide_values_tree(&src);
    let shas = store_every_writers_archive(store, &src, work.path());
    let mount = Mount::new(store).start();
    let mut failures = Vec::new();
    for (label, sha, archive) in &shas {
        let extracted = work.path().join(format!("x-{label}"));
        tar_extract(archive, &extracted);
        assert_like_extraction(label, &extracted, &mount.join(sha), &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Entries `tar -xzf` treats specially: duplicates (the last one wins), parents that
/// only appear implicitly, device files and FIFOs (never shown), set-ID bits (dropped).
pub(super) fn special_entries_follow_tar_semantics(store: &TestStore) {
    let archive = raw_tar_gz(&[
        RawEntry::File {
            name: b"dup.txt",
            data: b"first version\n",
        },
        RawEntry::File {
            name: b"implicit/parents/file.txt",
            data: b"no directory entries above me\n",
        },
        RawEntry::Fifo { name: b"fifo" },
        RawEntry::CharDevice {
            name: b"implicit/null",
            major: 1,
            minor: 3,
        },
        RawEntry::HardLink {
            name: b"early-link",
            target: b"dup.txt",
        },
        RawEntry::File {
            name: b"dup.txt",
            data: b"second version wins\n",
        },
        RawEntry::HardLink {
            name: b"dup-link",
            target: b"dup.txt",
        },
    ]);
    let raw_sha = sha256_hex(&archive);
    store.write_object_bytes(&raw_sha, &archive, Some((&raw_sha, archive.len() as u64)));

    // Set-ID bits, written by GNU tar from a real tree.
    let work = repo_temp_dir("special-");
    let src = work.path().join("src");
    write_file(&src.join("setuid"), b"#!/bin/sh\n", 0o4755);
    write_file(&src.join("setgid"), b"#!/bin/sh\n", 0o2750);
    make_dir(&src.join("sticky"));
    crate::util::tree::chmod(&src.join("sticky"), 0o1777);
    fix_mtimes(&src);
    let tarball = work.path().join("setid.tar.gz");
    gnu_tar(&src, &tarball, "gnu");
    let bytes = fs::read(&tarball).unwrap();
    let setid_sha = sha256_hex(&bytes);
    store.write_object_bytes(&setid_sha, &bytes, Some((&setid_sha, bytes.len() as u64)));

    // Paths that would leave the extraction directory: a leading `/` is stripped (as
    // GNU tar does), `..` entries are skipped; symlink targets are only data.
    let hostile = raw_tar_gz(&[
        RawEntry::File {
            name: b"../escaped.txt",
            data: b"outside\n",
        },
        RawEntry::File {
            name: b"/abs/file.txt",
            data: b"absolute\n",
        },
        RawEntry::File {
            name: b"inside/../../escaped-too.txt",
            data: b"outside\n",
        },
        RawEntry::Symlink {
            name: b"passwd",
            target: b"../../../../etc/passwd",
        },
        RawEntry::File {
            name: b"ok.txt",
            data: b"fine\n",
        },
    ]);
    let hostile_sha = sha256_hex(&hostile);
    store.write_object_bytes(
        &hostile_sha,
        &hostile,
        Some((&hostile_sha, hostile.len() as u64)),
    );

    let mount = Mount::new(store).start();
    let root = mount.join(&hostile_sha);
    let mut names: Vec<String> = list_paths(&root)
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["abs", "abs/file.txt", "ok.txt", "passwd"]);
    assert_eq!(fs::read(root.join("abs/file.txt")).unwrap(), b"absolute\n");
    assert_eq!(
        fs::read_link(root.join("passwd")).unwrap(),
        Path::new("../../../../etc/passwd")
    );
    assert!(!mount.path().join("escaped.txt").exists());
    assert!(!mount.path().join("escaped-too.txt").exists());

    let root = mount.join(&raw_sha);
    let names: Vec<PathBuf> = list_paths(&root).into_iter().collect();
    let want: Vec<PathBuf> = [
        "dup-link",
        "dup.txt",
        "early-link",
        "implicit",
        "implicit/parents",
        "implicit/parents/file.txt",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(names, want, "FIFOs and devices are not shown; parents are");
    assert_eq!(
        fs::read(root.join("dup.txt")).unwrap(),
        b"second version wins\n"
    );
    let (a, b) = (
        fs::metadata(root.join("dup.txt")).unwrap(),
        fs::metadata(root.join("dup-link")).unwrap(),
    );
    assert_eq!(
        (a.ino(), a.nlink()),
        (b.ino(), 2),
        "hard link to the last version"
    );
    // A link made before the duplicate keeps the first version, as with `tar -x`.
    let early = fs::metadata(root.join("early-link")).unwrap();
    assert_eq!(
        fs::read(root.join("early-link")).unwrap(),
        b"first version\n"
    );
    assert_eq!(early.nlink(), 1);
    assert_ne!(early.ino(), a.ino());
    let parents = fs::metadata(root.join("implicit/parents")).unwrap();
    assert!(parents.is_dir());
    assert_eq!(
        parents.mode() & 0o7777,
        0o755,
        "implicit directories are 0755"
    );
    assert_eq!(
        fs::read(root.join("implicit/parents/file.txt")).unwrap(),
        b"no directory entries above me\n"
    );

    let root = mount.join(&setid_sha);
    let mode = |name: &str| fs::metadata(root.join(name)).unwrap().mode() & 0o7777;
    assert_eq!(mode("setuid"), 0o755, "setuid bit dropped");
    assert_eq!(mode("setgid"), 0o750, "setgid bit dropped");
    assert_eq!(mode("sticky"), 0o1777, "the sticky bit is not a set-ID bit");
    assert_eq!(
        fs::metadata(root.join("setuid")).unwrap().mtime(),
        fs::metadata(src.join("setuid")).unwrap().mtime()
    );
}
