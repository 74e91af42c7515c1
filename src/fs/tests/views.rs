//! The virtual tree: the root, `by-time/`, `latest`, `commit/` and `.status`, from the
//! listing alone.

use std::sync::atomic::Ordering;

use super::*;

#[test]
fn the_root_lists_checkpoints_without_downloading_any() {
    let (f, ids) = fixture(&[&[("a", b"1")], &[("b", b"2")]]);
    let root = names(&f.fs, inode::ROOT);
    for id in &ids {
        assert!(root.contains(&id.to_string()), "{root:?}");
    }
    for name in ["by-time", "staging", "commit", ".status", "latest"] {
        assert!(
            root.contains(&name.to_string()),
            "{name} missing from {root:?}"
        );
    }
    // `ls -l`: every checkpoint directory stats from the listing.
    for id in &ids {
        let attr = f.fs.getattr(checkpoint_dir(&f.fs, id)).unwrap().attr;
        assert_eq!((attr.kind, attr.perm), (FileKind::Directory, 0o555));
    }
    assert_eq!(
        f.faults.gets.load(Ordering::SeqCst),
        0,
        "nothing may be downloaded"
    );
    assert!(
        status(&f.fs)
            .lines()
            .filter(|l| l.ends_with("  listed"))
            .count()
            == 2
    );
}

#[test]
fn by_time_names_sort_by_time_and_link_to_their_checkpoint() {
    let (f, ids) = fixture(&[&[("a", b"1")], &[("b", b"2")], &[("c", b"3")]]);
    let by_time: Vec<_> = names(&f.fs, inode::BY_TIME).into_iter().skip(2).collect();
    assert_eq!(by_time.len(), 3);
    let mut sorted = by_time.clone();
    sorted.sort();
    assert_eq!(by_time, sorted, "name order is time order");
    for (name, id) in by_time.iter().zip(&ids) {
        assert!(name.ends_with(id.short()), "{name} for {id}");
        let link = f.fs.lookup(inode::BY_TIME, name.as_bytes()).unwrap().attr;
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(
            f.fs.readlink(link.ino).unwrap(),
            format!("../{id}").into_bytes()
        );
    }
    assert_eq!(
        f.fs.readlink(inode::LATEST).unwrap(),
        ids[2].as_str().as_bytes()
    );
}

#[test]
fn latest_is_absent_from_an_empty_store() {
    let (f, _) = fixture(&[]);
    assert!(!names(&f.fs, inode::ROOT).contains(&"latest".to_string()));
    assert_eq!(
        f.fs.lookup(inode::ROOT, b"latest").unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn a_new_checkpoint_appears_and_a_deleted_one_vanishes_at_the_next_refresh() {
    let (f, ids) = fixture(&[&[("a", b"1")]]);
    let old_dir = checkpoint_dir(&f.fs, &ids[0]);
    let root_mtime = f.fs.getattr(inode::ROOT).unwrap().attr.mtime;
    std::thread::sleep(Duration::from_millis(20));
    let new = put_tree(f.store_dir.path(), &[("b", b"2")]);
    std::fs::remove_file(f.store_dir.path().join(ids[0].object_name())).unwrap();
    f.fs.refresh().unwrap();
    let root = names(&f.fs, inode::ROOT);
    assert!(root.contains(&new.to_string()) && !root.contains(&ids[0].to_string()));
    assert_ne!(
        f.fs.getattr(inode::ROOT).unwrap().attr.mtime,
        root_mtime,
        "the kernel must see the change"
    );
    // The deleted checkpoint's inode still answers (an open file may use it).
    assert_eq!(
        f.fs.getattr(old_dir).unwrap().attr.kind,
        FileKind::Directory
    );
}

#[test]
fn a_failed_listing_keeps_the_previous_one_and_says_why() {
    let (f, ids) = fixture(&[&[("a", b"1")]]);
    f.faults.failing_lists.store(1, Ordering::SeqCst);
    assert!(f.fs.refresh().is_err());
    assert!(names(&f.fs, inode::ROOT).contains(&ids[0].to_string()));
    assert!(
        status(&f.fs).contains("# listing failed: "),
        "{}",
        status(&f.fs)
    );
    f.fs.refresh().unwrap();
    assert!(!status(&f.fs).contains("listing failed"));
}

#[test]
fn the_virtual_tree_refuses_changes_with_the_right_errno() {
    let (f, _) = fixture(&[&[("a", b"1")]]);
    let caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };
    assert_eq!(
        f.fs.mkdir(inode::ROOT, b"x", 0o755, caller)
            .unwrap_err()
            .errno(),
        libc::EROFS
    );
    assert_eq!(
        f.fs.mkdir(inode::COMMIT, b"x", 0o755, caller)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    assert_eq!(
        f.fs.create(inode::COMMIT, b"x", 0o644, libc::O_WRONLY, caller)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    assert_eq!(
        f.fs.unlink(inode::BY_TIME, b"x").unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(
        f.fs.open(inode::STATUS, libc::O_WRONLY)
            .unwrap_err()
            .errno(),
        libc::EROFS
    );
    let setxattr = |ino: u64, name: &[u8]| {
        let (sender, answer) = std::sync::mpsc::channel();
        let done = Box::new(move |result: Result<(), FsError>| sender.send(result).unwrap());
        f.fs.setxattr(
            ino,
            name,
            b"x",
            Caller {
                uid: 0,
                gid: 0,
                pid: 0,
            },
            done,
        );
        answer.recv().unwrap().unwrap_err().errno()
    };
    assert_eq!(setxattr(inode::ROOT, b"user.x"), libc::EROFS);
    assert_eq!(setxattr(inode::STAGING, b"user.x"), libc::ENOTSUP);
    // The fork attribute, with a value that names no checkpoint.
    assert_eq!(setxattr(inode::STAGING, b"user.ckptfs.fork"), libc::EINVAL);
}

#[test]
fn status_is_read_from_a_snapshot_taken_at_open() {
    let (f, ids) = fixture(&[&[("a", b"1")]]);
    let opened = f.fs.open(inode::STATUS, libc::O_RDONLY).unwrap();
    assert!(opened.direct_io, ".status has no size known in advance");
    wait_loaded(&f.fs, checkpoint_dir(&f.fs, &ids[0]));
    let text = String::from_utf8(f.fs.read(inode::STATUS, opened.fh, 0, 1 << 20).unwrap()).unwrap();
    assert!(
        text.contains(&format!("{}  ", ids[0])) && text.contains("  listed\n"),
        "{text}"
    );
    f.fs.release(opened.fh);
    assert!(status(&f.fs).contains(" from the store\n"));
    assert_eq!(
        f.fs.read(inode::STATUS, opened.fh, 0, 10)
            .unwrap_err()
            .errno(),
        libc::EBADF
    );
}

/// Each open `.status` keeps its render, up to a bound on their bytes in all (any user
/// of a shared mount may open it without end); past it, opens share one render, so
/// that no one is refused, and memory stays bounded.
#[test]
fn open_status_texts_are_bounded() {
    let (f, _) = fixture(&[&[("a", b"1")]]);
    let mut handles = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let opened = f.fs.open(inode::STATUS, libc::O_RDONLY).unwrap();
        let text = f.fs.read(inode::STATUS, opened.fh, 0, 1 << 20).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("# "));
        handles.insert(opened.fh);
    }
    assert!(
        (3..1_000).contains(&handles.len()),
        "{} distinct handles: renders kept without bound",
        handles.len()
    );
    for fh in handles {
        f.fs.release(fh);
    }
}

/// Each subtree's listing read one entry per reply, each reply starting at the offset
/// the one before gave (as the kernel reads a large directory), is its whole listing.
#[test]
fn listings_resume_at_the_offsets_they_give() {
    let files: Vec<(String, Vec<u8>)> = (0..5).map(|i| (format!("f{i}"), vec![b'x'; i])).collect();
    let tree: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_slice()))
        .collect();
    let (f, ids) = fixture(&[&tree, &[("other", b"2")]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let ws =
        f.fs.mkdir(
            inode::STAGING,
            b"ws",
            0o755,
            Caller {
                uid: 0,
                gid: 0,
                pid: 0,
            },
        )
        .unwrap()
        .attr
        .ino;
    for (name, _) in &files {
        std::fs::write(f.staging_dir.join("ws").join(name), b"").unwrap();
    }
    for ino in [inode::ROOT, dir, ws, inode::COMMIT] {
        let (mut offset, mut pieces) = (0, Vec::new());
        // Bounded: an offset that does not move on would list the same entry forever.
        for _ in 0..100 {
            let mut got = None;
            f.fs.readdir(ino, offset, &mut |entry, next| {
                if got.is_some() {
                    return true; // the reply is full after one entry
                }
                got = Some((String::from_utf8_lossy(&entry.name).into_owned(), next));
                false
            })
            .unwrap();
            let Some((name, next)) = got else { break };
            pieces.push(name);
            offset = next;
        }
        let mut whole = names(&f.fs, ino);
        assert!(whole.len() >= 2, "{whole:?}");
        if ino == ws {
            // Staging lists in the backing directory's order, which is not sorted.
            pieces.sort();
            whole.sort();
        }
        assert_eq!(pieces, whole, "directory {ino:#x}");
    }
}
