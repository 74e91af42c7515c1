//! The tree around the checkpoints (`by-time/`, `latest`, `.status`, new checkpoints
//! appearing), the read-only guarantee, ownership and mount options.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::mount::{Mount, mount_entry, repo_temp_dir};
use crate::util::sys::{c_path, errno_of, libc_result};
use crate::util::tree::{make_dir, make_sample_tree, make_small_tree, write_file};
use crate::util::{TestStore, parse_rfc3339_utc, run, unix_now};

pub(super) fn writes_inside_a_checkpoint_fail_with_erofs(store: &TestStore) {
    let work = repo_temp_dir("erofs-");
    let src = work.path().join("src");
    make_small_tree(&src, "erofs");
    make_dir(&src.join("emptydir"));
    write_file(&src.join("readonly.txt"), b"frozen\n", 0o444);
    let (sha, _) = store.put(&src, &[]);
    let mount = Mount::new(store).start();
    let ckpt = mount.join(&sha);
    let file = ckpt.join("note.txt");
    let before = fs::read(&file).expect("read before writes");

    type Attempt<'a> = (&'a str, Box<dyn Fn() -> io::Result<()> + 'a>);
    let attempts: Vec<Attempt> = vec![
        (
            "create a file",
            Box::new(|| fs::File::create(ckpt.join("new.txt")).map(drop)),
        ),
        (
            "create a file in a subdirectory",
            Box::new(|| fs::File::create(ckpt.join("sub/new.txt")).map(drop)),
        ),
        // The kernel opens files without asking the daemon (see the README), so an
        // open for writing succeeds; every write through it fails.
        (
            "write through an open for writing",
            Box::new(|| write_through(OpenOptions::new().write(true), &file)),
        ),
        (
            "write to a read-only file",
            Box::new(|| write_through(OpenOptions::new().write(true), &ckpt.join("readonly.txt"))),
        ),
        (
            "append",
            Box::new(|| write_through(OpenOptions::new().append(true), &file)),
        ),
        (
            "write through an open read-write",
            Box::new(|| write_through(OpenOptions::new().read(true).write(true), &file)),
        ),
        (
            "open with O_TRUNC",
            Box::new(|| {
                let path = c_path(&file);
                // SAFETY: path is a valid NUL-terminated string.
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_TRUNC) };
                if fd >= 0 {
                    // SAFETY: fd was just opened by us.
                    unsafe { libc::close(fd) };
                    return Ok(());
                }
                Err(io::Error::last_os_error())
            }),
        ),
        (
            "truncate",
            Box::new(|| {
                let path = c_path(&file);
                // SAFETY: path is a valid NUL-terminated string.
                libc_result(unsafe { libc::truncate(path.as_ptr(), 0) })
            }),
        ),
        (
            "chmod",
            Box::new(|| fs::set_permissions(&file, fs::Permissions::from_mode(0o600))),
        ),
        (
            "chmod the checkpoint directory",
            Box::new(|| fs::set_permissions(&ckpt, fs::Permissions::from_mode(0o777))),
        ),
        (
            "chown",
            Box::new(|| std::os::unix::fs::chown(&file, Some(1), Some(1))),
        ),
        (
            "set times",
            Box::new(|| {
                let path = c_path(&file);
                // SAFETY: path is valid; a null times pointer means "now".
                libc_result(unsafe {
                    libc::utimensat(libc::AT_FDCWD, path.as_ptr(), std::ptr::null(), 0)
                })
            }),
        ),
        ("unlink", Box::new(|| fs::remove_file(&file))),
        (
            "unlink in a subdirectory",
            Box::new(|| fs::remove_file(ckpt.join("sub/data.txt"))),
        ),
        ("rmdir", Box::new(|| fs::remove_dir(ckpt.join("emptydir")))),
        (
            "rename within the checkpoint",
            Box::new(|| fs::rename(&file, ckpt.join("renamed.txt"))),
        ),
        (
            "rename over another file",
            Box::new(|| fs::rename(&file, ckpt.join("readonly.txt"))),
        ),
        (
            "rename a directory",
            Box::new(|| fs::rename(ckpt.join("sub"), ckpt.join("sub2"))),
        ),
        ("mkdir", Box::new(|| fs::create_dir(ckpt.join("newdir")))),
        (
            "symlink",
            Box::new(|| std::os::unix::fs::symlink("note.txt", ckpt.join("newlink"))),
        ),
        (
            "hard link",
            Box::new(|| fs::hard_link(&file, ckpt.join("newhard"))),
        ),
        (
            "setxattr",
            Box::new(|| {
                let path = c_path(&file);
                let name = c"user.ckptfs-test";
                // SAFETY: path and name are valid strings; the value is 1 byte long.
                libc_result(unsafe {
                    libc::setxattr(path.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, 0)
                })
            }),
        ),
        (
            "removexattr",
            Box::new(|| {
                let path = c_path(&file);
                let name = c"user.ckptfs-test";
                // SAFETY: path and name are valid NUL-terminated strings.
                libc_result(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })
            }),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, attempt) in &attempts {
        match attempt() {
            Ok(()) => wrong.push(format!("{what}: succeeded")),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {}
            Err(e) => wrong.push(format!("{what}: {e} (expected EROFS)")),
        }
    }
    assert!(
        wrong.is_empty(),
        "writes inside a checkpoint must fail with EROFS:\n{}",
        wrong.join("\n")
    );
    // And nothing changed.
    assert_eq!(fs::read(&file).unwrap(), before);
    assert_eq!(
        fs::metadata(&file).unwrap().mode() & 0o7777,
        fs::metadata(src.join("note.txt")).unwrap().mode() & 0o7777
    );
    let names: Vec<_> = fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["emptydir", "note.txt", "readonly.txt", "sub"]);
    // `.status` is read-only too.
    let errno = errno_of(
        "write to .status",
        write_through(OpenOptions::new().write(true), &mount.join(".status")),
    );
    assert!(
        errno == libc::EROFS || errno == libc::EACCES,
        "write to .status: errno {errno}"
    );
}

/// `by-time/<time>Z-<12 hex>` -> `../<sha>` and `latest` -> `<sha>` resolve and read;
/// a checkpoint put while mounted shows up after the refresh interval, one deleted
/// from the store leaves the listings.
pub(super) fn time_views_resolve_and_follow_new_checkpoints(store: &TestStore) {
    let work = repo_temp_dir("views-");
    let first = work.path().join("first");
    make_small_tree(&first, "first");
    let (first_sha, _) = store.put(&first, &[]);
    let mount = Mount::new(store).args(["--refresh", "1"]).start();

    let by_time = || -> Vec<(String, PathBuf)> {
        let mut entries: Vec<(String, PathBuf)> = fs::read_dir(mount.join("by-time"))
            .expect("list by-time")
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().into_string().expect("UTF-8 by-time name");
                let target = fs::read_link(e.path()).expect("readlink by-time entry");
                (name, target)
            })
            .collect();
        entries.sort();
        entries
    };
    let root = || -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(mount.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let check_entry = |(name, target): &(String, PathBuf), sha: &str| {
        let (time, short) = name
            .rsplit_once('-')
            .unwrap_or_else(|| panic!("by-time name {name:?}"));
        assert_eq!(short, &sha[..12], "{name}");
        assert!(
            time.len() == 20 && time.ends_with('Z'),
            "whole seconds: {name}"
        );
        let secs = parse_rfc3339_utc(time).unwrap_or_else(|| panic!("RFC 3339 UTC: {name}"));
        assert!(
            (secs - unix_now()).abs() < 600,
            "{name} is the object's time, which is about now"
        );
        assert_eq!(target, &Path::new("..").join(sha), "{name}");
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "{what} within 10 s (--refresh 1)\nlog:\n{}",
                mount.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    let entries = by_time();
    assert_eq!(entries.len(), 1, "{entries:?}");
    check_entry(&entries[0], &first_sha);
    let via_by_time = mount.join("by-time").join(&entries[0].0);
    assert!(
        fs::symlink_metadata(&via_by_time)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read(via_by_time.join("note.txt")).unwrap(),
        b"checkpoint first\n"
    );
    assert_eq!(
        fs::read_link(mount.join("latest")).unwrap(),
        PathBuf::from(&first_sha)
    );
    assert_eq!(
        fs::read(mount.join("latest/note.txt")).unwrap(),
        b"checkpoint first\n"
    );
    let cat = run(Command::new("cat").arg(mount.join("latest/sub/data.txt"))).success();
    assert_eq!(cat.stdout, "first".repeat(200));

    // Object times have whole seconds; make sure the second one is newer.
    std::thread::sleep(Duration::from_millis(1100));
    let second = work.path().join("second");
    make_small_tree(&second, "second");
    let (second_sha, _) = store.put(&second, &[]);
    wait_for("a checkpoint put while mounted appears", &|| {
        mount.join(&second_sha).exists()
    });
    let mut want = vec![
        ".status".to_owned(),
        "by-time".into(),
        "commit".into(),
        "latest".into(),
        "staging".into(),
        first_sha.clone(),
        second_sha.clone(),
    ];
    want.sort();
    assert_eq!(root(), want);
    wait_for("latest moves to the new checkpoint", &|| {
        fs::read_link(mount.join("latest")).unwrap() == Path::new(&second_sha)
    });
    assert_eq!(
        fs::read(mount.join("latest/note.txt")).unwrap(),
        b"checkpoint second\n"
    );
    let entries = by_time();
    assert_eq!(entries.len(), 2, "{entries:?}");
    check_entry(&entries[0], &first_sha);
    check_entry(&entries[1], &second_sha);
    assert_eq!(
        fs::read(
            mount
                .join("by-time")
                .join(&entries[1].0)
                .join("sub/data.txt")
        )
        .unwrap(),
        "second".repeat(200).as_bytes()
    );
    assert_eq!(mount.status().checkpoints, 2);
    for dir in ["staging", "commit"] {
        assert!(fs::metadata(mount.join(dir)).unwrap().is_dir(), "{dir}/");
    }

    // Deleted from the store: no longer listed in the root nor in by-time/.
    store.delete_object(&first_sha);
    wait_for("a deleted checkpoint leaves the root listing", &|| {
        !root().contains(&first_sha)
    });
    let entries = by_time();
    assert_eq!(entries.len(), 1, "{entries:?}");
    check_entry(&entries[0], &second_sha);
    assert_eq!(
        fs::read_link(mount.join("latest")).unwrap(),
        PathBuf::from(&second_sha)
    );
    let status = mount.status();
    assert_eq!(status.checkpoints, 1, "{}", status.text);
}

/// `mknod` (a FIFO here) inside a checkpoint is a write like any other: EROFS.
pub(super) fn mknod_inside_a_checkpoint_fails_with_erofs(store: &TestStore) {
    let work = repo_temp_dir("mknod-");
    let src = work.path().join("src");
    make_small_tree(&src, "mknod");
    let (sha, _) = store.put(&src, &[]);
    let mount = Mount::new(store).start();
    for dir in [mount.join(&sha), mount.join(&sha).join("sub")] {
        let path = c_path(&dir.join("fifo"));
        // SAFETY: path is a valid NUL-terminated string.
        let result = libc_result(unsafe { libc::mkfifo(path.as_ptr(), 0o644) });
        assert_eq!(
            errno_of("mkfifo in a checkpoint", result),
            libc::EROFS,
            "mkfifo in {}",
            dir.display()
        );
    }
}

/// A checkpoint deleted from the store goes away entirely after a refresh: also a
/// path that was looked up before is not kept alive by the kernel's entry cache.
pub(super) fn a_deleted_checkpoint_leaves_no_stale_entry(store: &TestStore) {
    let work = repo_temp_dir("deleted-");
    let mut shas = Vec::new();
    for tag in ["kept", "deleted"] {
        make_small_tree(&work.path().join(tag), tag);
        shas.push(store.put(&work.path().join(tag), &[]).0);
    }
    let (kept, deleted) = (&shas[0], &shas[1]);
    let mount = Mount::new(store).args(["--refresh", "1"]).start();
    assert!(mount.join(deleted).join("note.txt").is_file());
    store.delete_object(deleted);
    let listed = |name: &str| {
        fs::read_dir(mount.path())
            .unwrap()
            .any(|e| e.unwrap().file_name() == name)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed(deleted) {
        assert!(
            Instant::now() < deadline,
            "a deleted checkpoint is still listed after 10 s (--refresh 1)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(listed(kept));
    // Past the short validity (1 s) of what the kernel caches about the root.
    std::thread::sleep(Duration::from_millis(1500));
    let errno = errno_of(
        "stat of a deleted checkpoint",
        fs::symlink_metadata(mount.join(deleted)),
    );
    assert_eq!(
        errno,
        libc::ENOENT,
        "stat of a deleted checkpoint's directory"
    );
}

/// Owners are the archive's numeric ones, or the mounting user's with
/// `--owner-self`; the mount is `nosuid,nodev`.
pub(super) fn owners_and_mount_options(store: &TestStore) {
    let work = repo_temp_dir("owners-");
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (sha, _) = store.put(&src, &[]);
    let owned = Path::new("owned/by-1234.txt");
    let src_owner = {
        let md = fs::symlink_metadata(src.join(owned)).unwrap();
        (md.uid(), md.gid())
    };
    // SAFETY: getuid and getgid cannot fail.
    let me = unsafe { (libc::getuid(), libc::getgid()) };
    assert_ne!(
        src_owner, me,
        "the sample tree has files owned by someone else"
    );

    let mount = Mount::new(store).start();
    let entry = mount_entry(mount.path()).expect("mounted");
    for option in ["nosuid", "nodev"] {
        assert!(
            entry.mount_options.iter().any(|o| o == option),
            "mount options lack {option}: {entry:?}"
        );
    }
    assert!(entry.fs_type.starts_with("fuse"), "{entry:?}");
    let md = fs::symlink_metadata(mount.join(&sha).join(owned)).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        src_owner,
        "numeric owner from the archive"
    );
    drop(mount);

    let mount = Mount::new(store).args(["--owner-self"]).start();
    let mut seen = 0;
    for rel in crate::util::tree::list_paths(&mount.join(&sha)) {
        let md = fs::symlink_metadata(mount.join(&sha).join(&rel)).unwrap();
        assert_eq!(
            (md.uid(), md.gid()),
            me,
            "{} with --owner-self",
            rel.display()
        );
        seen += 1;
    }
    assert!(seen > 10, "walked the whole checkpoint");
    let md = fs::metadata(mount.join(&sha)).unwrap();
    assert_eq!((md.uid(), md.gid()), me, "the checkpoint directory itself");
    let ls = run(Command::new("ls")
        .arg("-ln")
        .arg(mount.join(&sha).join("owned")))
    .success();
    assert!(
        ls.stdout.contains(&format!(" {} {} ", me.0, me.1)),
        "ls -ln shows the mounting user: {ls}"
    );
}

/// Opens `path` with `options` and writes a byte through the descriptor.
fn write_through(options: &OpenOptions, path: &std::path::Path) -> io::Result<()> {
    use std::io::Write;
    options.open(path)?.write_all(b"x")
}
