//! What refused operations answer around a seal: EEXIST onto an existing commit name,
//! EPERM for anything in `commit/` but a top-level `mv staging/NAME commit/`, EROFS
//! inside a checkpoint; a seal does not wait for files open for writing.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;

use super::{cp_a, sh};
use crate::util::TestStore;
use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::sys::{assert_errno, c_path, errno_of, libc_result};
use crate::util::tree::{assert_same_tree, make_small_tree, write_file};

/// `renameat2(from, to, RENAME_NOREPLACE)`, as `mv` does it.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    libc_result(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c_path(from).as_ptr(),
            libc::AT_FDCWD,
            c_path(to).as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
}

/// Stages a copy of a small tree tagged `tag` as `staging/NAME`; returns the tree.
fn stage(mount: &MountedStore, work: &Path, name: &str, tag: &str) -> std::path::PathBuf {
    let tree = work.join(tag);
    make_small_tree(&tree, tag);
    cp_a(&tree, &mount.staged(name));
    tree
}

/// Seals `staging/NAME` with a rename and returns its checkpoint's sha256.
#[track_caller]
fn seal(mount: &MountedStore, name: &str) -> String {
    fs::rename(mount.staged(name), mount.committed(name))
        .unwrap_or_else(|e| panic!("seal {name}: {e}\n{}", mount.log_excerpt()));
    mount.commit_target(name)
}

#[test]
fn committing_onto_an_existing_name_fails_with_eexist() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-eexist-");
    let mount = Mount::new(&store).staging().start();
    stage(&mount, work.path(), "turn", "first");
    let sha = seal(&mount, "turn");

    let second = stage(&mount, work.path(), "turn", "second");
    assert_errno(
        "renameat2(staging/turn, commit/turn, RENAME_NOREPLACE)",
        rename_noreplace(&mount.staged("turn"), &mount.committed("turn")),
        libc::EEXIST,
    );
    assert_same_tree(&second, &mount.staged("turn"));
    let out = sh(r#"mv "$1/staging/turn" "$1/commit/""#, &[mount.path()]);
    assert!(
        !out.status.success(),
        "mv onto an existing commit name: {out}"
    );
    let plain = errno_of(
        "rename(staging/turn, commit/turn)",
        fs::rename(mount.staged("turn"), mount.committed("turn")),
    );
    // The kernel itself refuses to replace a symlink with a directory.
    assert!(
        plain == libc::EEXIST || plain == libc::ENOTDIR,
        "plain rename onto commit/turn: {}",
        io::Error::from_raw_os_error(plain)
    );
    assert_same_tree(&second, &mount.staged("turn"));
    assert_eq!(
        mount.commit_target("turn"),
        sha,
        "commit/turn still names the first seal"
    );
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);

    // Under a fresh name it seals.
    fs::rename(mount.staged("turn"), mount.committed("turn-b"))
        .unwrap_or_else(|e| panic!("seal under another name: {e}\n{}", mount.log_excerpt()));
    let sha_b = mount.commit_target("turn-b");
    assert_ne!(sha_b, sha);
    assert_same_tree(&second, &mount.join(&sha_b));
}

#[test]
fn commit_only_takes_top_level_workspaces_of_staging() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-eperm-");
    let mount = Mount::new(&store).staging().start();
    let tree = stage(&mount, work.path(), "outer", "nested");
    assert_errno(
        "rename(staging/outer/sub, commit/sub)",
        fs::rename(mount.staged("outer/sub"), mount.committed("sub")),
        libc::EPERM,
    );
    assert_same_tree(&tree, &mount.staged("outer"));
    assert!(fs::symlink_metadata(mount.committed("sub")).is_err());

    assert_errno(
        "create commit/new.txt",
        fs::File::create(mount.committed("new.txt")),
        libc::EPERM,
    );
    assert_errno(
        "mkdir commit/dir",
        fs::create_dir(mount.committed("dir")),
        libc::EPERM,
    );
    assert_errno(
        "symlink in commit/",
        std::os::unix::fs::symlink("../x", mount.committed("link")),
        libc::EPERM,
    );

    let sha = seal(&mount, "outer");
    assert_errno(
        "unlink commit/outer",
        fs::remove_file(mount.committed("outer")),
        libc::EPERM,
    );
    assert_errno(
        "rename commit/outer back into staging/",
        fs::rename(mount.committed("outer"), mount.staged("back")),
        libc::EPERM,
    );
    assert_errno(
        "rename a checkpoint's directory into commit/",
        fs::rename(
            mount.join(format!("{sha}/sub")),
            mount.committed("from-ckpt"),
        ),
        libc::EPERM,
    );
    assert_eq!(mount.commit_target("outer"), sha);
    let names: Vec<_> = fs::read_dir(mount.join("commit"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["outer"], "commit/ holds only the seal");

    // A plain file or a symlink is not a workspace: EPERM (as for everything else in
    // commit/ but a workspace), left alone, and not a failed seal in .status or the log.
    write_file(&mount.staged("loose.txt"), b"not a workspace\n", 0o644);
    std::os::unix::fs::symlink("outer", mount.staged("alias")).unwrap();
    for name in ["loose.txt", "alias"] {
        assert_errno(
            &format!("mv staging/{name} commit/"),
            fs::rename(mount.staged(name), mount.committed(name)),
            libc::EPERM,
        );
        assert!(fs::symlink_metadata(mount.committed(name)).is_err());
    }
    assert_eq!(
        fs::read(mount.staged("loose.txt")).unwrap(),
        b"not a workspace\n"
    );
    assert_eq!(
        fs::read_link(mount.staged("alias")).unwrap(),
        Path::new("outer")
    );
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);
    // Each refusal counts in .status, and the log says why (issue 27, item 12), once
    // per operation and reason, at info level: a refused rename is not a problem of
    // the daemon.
    let status = mount.status_text();
    assert!(!status.contains("FAILED"), "{status}");
    assert!(
        status.contains("# refused in commit/: ")
            && status.contains("(it only takes `mv staging/NAME commit/`)"),
        "{status}"
    );
    let log = mount.log_text();
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "a refused rename is not a problem of the daemon:\n{log}"
    );
    for why in [
        "only top-level entries of staging/ can be moved into commit/",
        "commit/ only takes `mv staging/NAME commit/`",
        "only a directory of staging/ can be moved into commit/",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("refused in commit/") && l.contains(why)),
            "{why:?} not in the log:\n{log}"
        );
    }
}

/// A file open for writing does not stop a seal. The seal takes what was written
/// before it (writes reach the daemon as they are made: nothing is held back in the
/// kernel). The writer keeps the file it holds, as on a local disk when a file is
/// deleted under an open descriptor: its later writes land there, in no workspace and
/// not in the checkpoint.
#[test]
fn a_file_open_for_writing_is_sealed_as_written_and_keeps_its_later_writes() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-open-writer-");
    let mount = Mount::new(&store).staging().start();
    let tree = stage(&mount, work.path(), "turn", "busy");

    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.staged("turn/sub/data.txt"))
        .expect("open a staged file for writing");
    writer
        .write_all_at(b"written before the seal", 0)
        .expect("write before the seal");
    let sha = seal(&mount, "turn");
    let sealed = fs::read(mount.join(&sha).join("sub/data.txt")).unwrap();
    writer
        .write_all_at(b"later", 0)
        .expect("write through a descriptor held across the seal");
    let mut held = vec![0u8; 23];
    writer.read_exact_at(&mut held, 0).unwrap();
    assert_eq!(held, b"lateren before the seal");
    drop(writer);
    // The checkpoint is the tree with the write made before the seal.
    let mut expected = fs::read(tree.join("sub/data.txt")).unwrap();
    expected[..23].copy_from_slice(b"written before the seal");
    assert_eq!(sealed, expected);
    assert_eq!(
        fs::read(mount.join(&sha).join("sub/data.txt")).unwrap(),
        expected
    );
    assert_eq!(
        fs::read(mount.join(&sha).join("note.txt")).unwrap(),
        fs::read(tree.join("note.txt")).unwrap()
    );
}

#[test]
fn writes_inside_a_sealed_checkpoint_fail_with_erofs() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-erofs-");
    let mount = Mount::new(&store).staging().start();
    let tree = stage(&mount, work.path(), "turn", "readonly");
    let sha = seal(&mount, "turn");
    let ckpt = mount.join(&sha);
    let file = ckpt.join("note.txt");

    type Attempt<'a> = (&'a str, Box<dyn Fn() -> io::Result<()> + 'a>);
    let attempts: Vec<Attempt> = vec![
        (
            "create a file",
            Box::new(|| fs::File::create(ckpt.join("new")).map(drop)),
        ),
        (
            "create in a subdirectory",
            Box::new(|| fs::File::create(ckpt.join("sub/new")).map(drop)),
        ),
        (
            "open for writing",
            Box::new(|| OpenOptions::new().write(true).open(&file).map(drop)),
        ),
        (
            "open for appending",
            Box::new(|| OpenOptions::new().append(true).open(&file).map(drop)),
        ),
        ("mkdir", Box::new(|| fs::create_dir(ckpt.join("dir")))),
        ("unlink", Box::new(|| fs::remove_file(&file))),
        ("rmdir", Box::new(|| fs::remove_dir(ckpt.join("sub")))),
        (
            "rename within",
            Box::new(|| fs::rename(&file, ckpt.join("renamed"))),
        ),
        (
            "rename into staging/",
            Box::new(|| fs::rename(&file, mount.staged("stolen"))),
        ),
        (
            "symlink",
            Box::new(|| std::os::unix::fs::symlink("note.txt", ckpt.join("link"))),
        ),
        (
            "hard link",
            Box::new(|| fs::hard_link(&file, ckpt.join("hard"))),
        ),
        (
            "chmod",
            Box::new(|| fs::set_permissions(&file, fs::Permissions::from_mode(0o600))),
        ),
        (
            "truncate",
            Box::new(|| {
                // SAFETY: the path is NUL-terminated.
                libc_result(unsafe { libc::truncate(c_path(&file).as_ptr(), 0) })
            }),
        ),
    ];
    for (what, attempt) in &attempts {
        assert_errno(what, attempt(), libc::EROFS);
    }
    assert_same_tree(&tree, &ckpt);
    assert_eq!(mount.downloads(), 0, "{}", mount.status_text());
}

/// A path longer than Linux's `PATH_MAX` cannot be stored: the seal answers
/// ENAMETOOLONG, not the EIO kept for the store, and names the whole path (issue 27,
/// item 11). The workspace stays as it was.
#[test]
fn a_path_too_long_to_store_is_enametoolong_with_the_path() {
    let store = TestStore::local();
    let mount = Mount::new(&store).staging().start();
    let component = "p".repeat(250);
    fs::create_dir(mount.staged("long")).unwrap();
    // Seventeen levels of 251 bytes: 4,266 bytes, more than PATH_MAX, made one level
    // at a time by descriptor (the whole path is too long for one system call).
    let name = c_path(Path::new(&component));
    let mut dir = fs::File::open(mount.staged("long")).unwrap();
    for _ in 0..17 {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: `dir` is an open directory and `name` a NUL-terminated string; the
        // descriptor openat returns is owned by the new File.
        unsafe {
            libc_result(libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755)).unwrap();
            let fd = libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            );
            assert!(fd >= 0, "openat: {}", io::Error::last_os_error());
            dir = fs::File::from_raw_fd(fd);
        }
    }
    assert_errno(
        "mv staging/long commit/",
        fs::rename(mount.staged("long"), mount.committed("long")),
        libc::ENAMETOOLONG,
    );
    assert!(store.list_keys().is_empty());
    let status = mount.status_text();
    let line = status
        .lines()
        .find(|l| l.starts_with("# seal long: FAILED:"))
        .unwrap_or_else(|| panic!("no failed seal:\n{status}"));
    let whole = std::iter::repeat_n(component.as_str(), 17)
        .collect::<Vec<_>>()
        .join("/");
    assert!(
        line.contains(&format!("the path {whole}")) && line.contains("longer than 4096 bytes"),
        "{line}"
    );
    assert!(mount.staged("long").join(&component).is_dir());
}
