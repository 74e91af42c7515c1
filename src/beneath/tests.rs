use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};

fn root(path: &std::path::Path) -> OwnedFd {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

#[test]
fn walks_refuse_symlinks_and_files() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    symlink(outside.path(), tmp.path().join("link")).unwrap();
    let fd = root(tmp.path());
    assert!(open_dir_path(fd.as_fd(), &[b"d"]).is_ok());
    let err = open_dir_path(fd.as_fd(), &[b"link"]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    let err = open_dir_path(fd.as_fd(), &[b"f"]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    let mut made = 0;
    let mut cursor = DirCursor::new(fd.as_fd()).unwrap();
    let result = cursor.make(&[b"link", b"new"], 0o755, &mut || {
        made += 1;
        Ok(())
    });
    assert!(matches!(result, Err(WalkError::Symlink)));
    let result = cursor.make(&[b"f", b"new"], 0o755, &mut || Ok(()));
    assert!(matches!(result, Err(WalkError::NotADirectory)));
    assert_eq!(made, 0);
    assert!(!outside.path().join("new").exists());
    cursor
        .make(&[b"d", b"e", b"g"], 0o755, &mut || {
            made += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(made, 2);
    assert!(tmp.path().join("d/e/g").is_dir());
    let err = cursor.open(&[b"d", b"link"]).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "open creates nothing");
    symlink(outside.path(), tmp.path().join("d/e/link")).unwrap();
    let err = cursor.open(&[b"d", b"e", b"link"]).map(|_| ()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    let refused = cursor.make(&[b"d", b"x"], 0o755, &mut || Err(io::Error::other("limit")));
    assert!(matches!(refused, Err(WalkError::Io(_))));
    assert!(!tmp.path().join("d/x").exists());
}

fn identity_at(dir: BorrowedFd<'_>) -> (u64, u64) {
    identity(dir).unwrap()
}

#[test]
fn a_cursor_reaches_what_a_fresh_walk_reaches() {
    let tmp = tempfile::tempdir().unwrap();
    let fd = root(tmp.path());
    let mut cursor = DirCursor::new(fd.as_fd()).unwrap();
    let path = |depth: usize, last: &'static [u8]| -> Vec<&'static [u8]> {
        let mut parts = vec![&b"a"[..]; depth];
        parts.push(last);
        parts
    };
    // Down a spine past several strides, then to branches that leave it at kept
    // levels, between them, and at the root, in an order that goes up and down.
    let depths = [0, 1, 15, 16, 17, 40, 33, 32, 31, 47, 48, 49, 2, 0, 50];
    for &depth in depths.iter().chain(depths.iter().rev()) {
        for last in [&b"x"[..], b"y"] {
            let parts = path(depth, last);
            let got = identity_at(cursor.make(&parts, 0o755, &mut || Ok(())).unwrap());
            let want = identity(open_dir_path(fd.as_fd(), &parts).unwrap()).unwrap();
            assert_eq!(got, want, "at depth {depth}, {:?}", last);
            assert_eq!(cursor.kept.len(), parts.len() / CURSOR_STRIDE);
            assert_eq!(cursor.end.is_some(), parts.len() % CURSOR_STRIDE != 0);
        }
    }
    // A path of 2,047 levels holds 128 descriptors, not 2,047.
    let deep = vec![&b"d"[..]; 2047];
    cursor.make(&deep, 0o755, &mut || Ok(())).unwrap();
    assert_eq!(cursor.kept.len() + usize::from(cursor.end.is_some()), 128);
    cursor.clear();
    assert!(cursor.kept.is_empty() && cursor.end.is_none());
}

#[test]
fn a_forgotten_path_is_opened_again() {
    let tmp = tempfile::tempdir().unwrap();
    let fd = root(tmp.path());
    let mut cursor = DirCursor::new(fd.as_fd()).unwrap();
    let parts: Vec<&[u8]> = vec![b"a", b"b"];
    cursor.make(&parts, 0o755, &mut || Ok(())).unwrap();
    // `a` is replaced by a file: a kept descriptor of the old `a/b` would still
    // open, in a directory no longer reachable from the root.
    remove_at(&fd, OsStr::new("a")).unwrap();
    std::fs::write(tmp.path().join("a"), b"file").unwrap();
    cursor.forget(&[b"a"]);
    let result = cursor.make(&parts, 0o755, &mut || Ok(()));
    assert!(matches!(result, Err(WalkError::NotADirectory)));
    // Forgetting a path the cursor is not under, or below where it is, keeps it.
    std::fs::remove_file(tmp.path().join("a")).unwrap();
    cursor.make(&parts, 0o755, &mut || Ok(())).unwrap();
    let before = identity_at(cursor.open(&parts).unwrap());
    cursor.forget(&[b"c"]);
    cursor.forget(&[b"a", b"b", b"c"]);
    cursor.forget(&[]);
    assert_eq!(cursor.names.len(), 2);
    assert_eq!(identity_at(cursor.open(&parts).unwrap()), before);
    cursor.forget(&[b"a", b"b"]);
    assert_eq!(cursor.names.len(), 0, "a/ is not kept: back to the root");
}

#[test]
fn remove_never_follows_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"keep").unwrap();
    let mut deep = tmp.path().join("t");
    for i in 0..50 {
        deep = deep.join(format!("level{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("file"), b"x").unwrap();
    symlink(outside.path(), deep.join("escape")).unwrap();
    symlink(outside.path(), tmp.path().join("t/escape")).unwrap();
    let fd = root(tmp.path());
    remove_at(&fd, OsStr::new("t")).unwrap();
    assert!(!tmp.path().join("t").exists());
    assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"keep");
    // A symlink to a directory is removed as a link.
    symlink(outside.path(), tmp.path().join("l")).unwrap();
    remove_at(&fd, OsStr::new("l")).unwrap();
    assert!(outside.path().join("keep").exists());
}

#[test]
fn a_tree_deeper_than_the_open_file_limit_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let top = root(tmp.path());
    let mut dir =
        rfs::openat(&top, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..3000 {
        rfs::mkdirat(&dir, "a", Mode::from_raw_mode(0o755)).unwrap();
        rfs::openat(
            &dir,
            "f",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        dir = rfs::openat(&dir, "a", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    drop(dir);
    // One descriptor per level would need 3,000; the process limit may be 1,024
    // (the hostile corpus runs `get` under that limit on a tree like this one).
    remove_at(&top, OsStr::new("a")).unwrap();
    assert!(!tmp.path().join("a").exists());
}

#[test]
fn chmod_acts_on_the_entry_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink(outside.path(), tmp.path().join("link")).unwrap();
    std::fs::write(tmp.path().join("file"), b"x").unwrap();
    let fd = root(tmp.path());
    let err = chmod_at(&fd, OsStr::new("link"), 0o777).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP));
    let mode = std::fs::metadata(outside.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
    chmod_at(&fd, OsStr::new("file"), 0o640).unwrap();
    let mode = std::fs::metadata(tmp.path().join("file"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o640);
    // The fallback path, as on kernels without fchmodat2.
    let link = rfs::openat(&fd, "link", OFlags::PATH | OFlags::NOFOLLOW, Mode::empty()).unwrap();
    assert_eq!(
        chmod_opened(&link, 0o777).unwrap_err().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
}
