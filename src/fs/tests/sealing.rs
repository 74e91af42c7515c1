//! Capture: `staging/` as the adapter drives it, and seals by rename into `commit/`.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use super::*;

const ROOT_CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn seal(fs: &CheckpointFs, name: &[u8]) -> Result<(), FsError> {
    let (tx, rx) = mpsc::channel();
    fs.rename(
        (inode::STAGING, name),
        (inode::COMMIT, name),
        0,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    rx.recv_timeout(Duration::from_secs(60)).unwrap()
}

/// Makes `staging/NAME/file` with `contents`; returns the workspace's inode.
fn stage(fs: &CheckpointFs, name: &[u8], contents: &[u8]) -> u64 {
    let ws = fs
        .mkdir(inode::STAGING, name, 0o755, ROOT_CALLER)
        .unwrap()
        .attr
        .ino;
    let (entry, opened) = fs
        .create(ws, b"file", 0o644, libc::O_WRONLY, ROOT_CALLER)
        .unwrap();
    assert_eq!(
        fs.write(entry.attr.ino, 0, contents).unwrap() as usize,
        contents.len()
    );
    fs.release(opened.fh);
    assert_eq!(entry.attr.kind, FileKind::File);
    ws
}

#[test]
fn a_seal_stores_the_workspace_and_serves_it_without_a_download() {
    let (f, _) = fixture(&[]);
    stage(&f.fs, b"turn-1", b"captured");
    seal(&f.fs, b"turn-1").unwrap();
    let link = f.fs.lookup(inode::COMMIT, b"turn-1").unwrap();
    assert_eq!(link.ttl, Duration::ZERO);
    let target = f.fs.readlink(link.attr.ino).unwrap();
    let id = CheckpointId::parse(std::str::from_utf8(&target[3..]).unwrap()).unwrap();
    assert!(f.store_dir.path().join(id.object_name()).exists());
    let dir = checkpoint_dir(&f.fs, &id);
    wait_loaded(&f.fs, dir);
    let file = f.fs.lookup(dir, b"file").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, file), b"captured");
    assert_eq!(
        f.faults.gets.load(Ordering::SeqCst),
        0,
        "the seal indexed what it stored"
    );
    assert_eq!(
        f.fs.lookup(inode::STAGING, b"turn-1").unwrap_err().errno(),
        libc::ENOENT
    );
    assert!(status(&f.fs).contains(&format!("# seal turn-1: sealed as {id} (stored)")));
}

#[test]
fn a_failed_upload_is_eio_and_leaves_the_workspace_as_it_was() {
    let (f, _) = fixture(&[]);
    stage(&f.fs, b"ws", b"keep me");
    f.faults.failing_puts.store(true, Ordering::SeqCst);
    assert_eq!(seal(&f.fs, b"ws").unwrap_err().errno(), libc::EIO);
    let ws = f.fs.lookup(inode::STAGING, b"ws").unwrap().attr.ino;
    let file = f.fs.lookup(ws, b"file").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, file), b"keep me");
    assert_eq!(
        std::fs::read_dir(f.store_dir.path()).unwrap().count(),
        0,
        "nothing stored"
    );
    // Thawed: the workspace takes changes again, and a retry succeeds.
    f.fs.unlink(ws, b"file").unwrap();
    f.faults.failing_puts.store(false, Ordering::SeqCst);
    seal(&f.fs, b"ws").unwrap();
}

#[test]
fn commit_takes_only_top_level_workspaces_once() {
    let (f, _) = fixture(&[]);
    let ws = stage(&f.fs, b"ws", b"x");
    f.fs.mkdir(ws, b"inner", 0o755, ROOT_CALLER).unwrap();
    let (tx, rx) = mpsc::channel();
    f.fs.rename(
        (ws, b"inner"),
        (inode::COMMIT, b"inner"),
        0,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    assert_eq!(rx.recv().unwrap().unwrap_err().errno(), libc::EPERM);
    let (tx, rx) = mpsc::channel();
    let exchange = libc::RENAME_EXCHANGE;
    f.fs.rename(
        (inode::STAGING, b"ws"),
        (inode::COMMIT, b"ws"),
        exchange,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    assert_eq!(rx.recv().unwrap().unwrap_err().errno(), libc::EINVAL);
    seal(&f.fs, b"ws").unwrap();
    stage(&f.fs, b"ws", b"y");
    assert_eq!(seal(&f.fs, b"ws").unwrap_err().errno(), libc::EEXIST);
}

/// `commit/` keeps each user's newest seals only (3 in tests, 10,000 otherwise):
/// anyone may seal empty workspaces under new names without end, but cannot push
/// another user's names out (to take them). The entries it keeps keep their numbers,
/// and a name it dropped may be sealed again.
#[test]
fn commit_lists_the_newest_seals_only() {
    let (f, _) = fixture(&[]);
    // Another user's seal, first (where the daemon can give workspaces away).
    let other = rustix::process::geteuid().is_root();
    if other {
        let caller = Caller {
            uid: 1000,
            gid: 1000,
            pid: 0,
        };
        f.fs.mkdir(inode::STAGING, b"theirs", 0o755, caller)
            .unwrap();
        seal(&f.fs, b"theirs").unwrap();
    }
    let names: [&[u8]; 5] = [b"s0", b"s1", b"s2", b"s3", b"s4"];
    let mut inos = Vec::new();
    for name in names {
        stage(&f.fs, name, b"same tree");
        seal(&f.fs, name).unwrap();
        inos.push(f.fs.lookup(inode::COMMIT, name).unwrap().attr.ino);
    }
    let mut listed = Vec::new();
    f.fs.readdir(inode::COMMIT, 0, &mut |entry, _| {
        listed.push((entry.name.clone(), entry.ino));
        false
    })
    .unwrap();
    let mut listed: Vec<_> = listed.into_iter().filter(|(n, _)| n[0] != b'.').collect();
    if other {
        assert_eq!(listed.remove(0).0, b"theirs");
        assert!(f.fs.lookup(inode::COMMIT, b"theirs").is_ok());
    }
    let kept: Vec<_> = names[2..]
        .iter()
        .map(|n| n.to_vec())
        .zip(inos[2..].iter().copied())
        .collect();
    assert_eq!(listed, kept);
    for (name, ino) in names.iter().zip(&inos) {
        let found = f.fs.lookup(inode::COMMIT, name).map(|e| e.attr.ino);
        match inos[2..].contains(ino) {
            true => assert_eq!(found.unwrap(), *ino),
            false => assert_eq!(found.unwrap_err().errno(), libc::ENOENT),
        }
    }
    assert!(
        f.fs.readlink(inos[0]).is_err(),
        "a dropped entry still links"
    );
    stage(&f.fs, b"s0", b"again");
    seal(&f.fs, b"s0").unwrap();
}

#[test]
fn a_frozen_tree_refuses_every_change_and_an_open_writer_does_not_hold_off_a_seal() {
    let (f, _) = fixture(&[]);
    let ws = stage(&f.fs, b"ws", b"x");
    let file = f.fs.lookup(ws, b"file").unwrap().attr.ino;
    // Where the kernel sends opens, an open is only checked: writes come by inode
    // and the freeze refuses them, so a file open for writing does not stop a seal.
    let writer = f.fs.open(file, libc::O_WRONLY).unwrap();
    let frozen = f.fs.staging.freeze(b"ws", u64::MAX).unwrap();
    f.fs.release(writer.fh);
    // Frozen by hand, as a seal does: every change inside answers EBUSY, writes and
    // copies into a file included.
    let busy = |r: Result<(), FsError>| assert_eq!(r.unwrap_err().errno(), libc::EBUSY);
    busy(f.fs.write(file, 0, b"y").map(drop));
    busy(
        f.fs.copy_file_range((file, NO_HANDLE, 0), (file, 1), 1)
            .map(drop),
    );
    // Reads go on.
    assert_eq!(f.fs.read(file, NO_HANDLE, 0, 10).unwrap(), b"x");
    busy(f.fs.mkdir(ws, b"d", 0o755, ROOT_CALLER).map(drop));
    busy(f.fs.unlink(ws, b"file"));
    busy(f.fs.open(file, libc::O_WRONLY).map(drop));
    busy(
        f.fs.setattr(
            file,
            SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        )
        .map(drop),
    );
    busy(
        f.fs.create(ws, b"n", 0o644, libc::O_WRONLY, ROOT_CALLER)
            .map(drop),
    );
    f.fs.staging.thaw(frozen);
    f.fs.mkdir(ws, b"d", 0o755, ROOT_CALLER).unwrap();
}

#[test]
fn new_entries_get_exactly_the_mode_asked_for() {
    let (f, _) = fixture(&[]);
    // SAFETY: umask has no preconditions; the daemon's usual umask is set and put back.
    let old = unsafe { libc::umask(0o022) };
    let ws =
        f.fs.mkdir(inode::STAGING, b"ws", 0o777, ROOT_CALLER)
            .unwrap()
            .attr;
    let (file, opened) =
        f.fs.create(ws.ino, b"f", 0o666, libc::O_WRONLY, ROOT_CALLER)
            .unwrap();
    f.fs.release(opened.fh);
    let fifo =
        f.fs.mknod(ws.ino, b"p", libc::S_IFIFO | 0o662, 0, ROOT_CALLER)
            .unwrap();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    assert_eq!(
        (ws.perm, file.attr.perm, fifo.attr.perm),
        (0o777, 0o666, 0o662)
    );
    assert_eq!(fifo.attr.kind, FileKind::Fifo);
    let on_disk = std::fs::metadata(f.staging_dir.join("ws/f")).unwrap();
    assert_eq!(on_disk.permissions().mode() & 0o777, 0o666);
    let device = f.fs.mknod(
        ws.ino,
        b"null",
        libc::S_IFCHR | 0o666,
        libc::makedev(1, 3),
        ROOT_CALLER,
    );
    assert_eq!(device.unwrap_err().errno(), libc::EPERM);
}

/// A name can change between the kernel's lookup and its open: the open must never
/// block on a FIFO swapped in (that would hang a request thread), nor serve another
/// file in place of the one asked for.
#[test]
fn an_open_refuses_a_name_swapped_under_it() {
    let (f, _) = fixture(&[]);
    let ws = stage(&f.fs, b"ws", b"mine");
    let backing = f.staging_dir.join("ws");
    // Made on disk, so that no descriptor of it is kept from its creation: the open
    // goes by name.
    std::fs::write(backing.join("on-disk"), b"mine").unwrap();
    let file = f.fs.lookup(ws, b"on-disk").unwrap().attr.ino;
    std::fs::rename(backing.join("on-disk"), backing.join("moved")).unwrap();
    let fifo = std::ffi::CString::new(
        backing
            .join("on-disk")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: the path is NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    let (tx, rx) = mpsc::channel();
    let fs = Arc::clone(&f.fs);
    std::thread::spawn(move || {
        tx.send(fs.open(file, libc::O_RDONLY).map(|o| o.fh))
            .unwrap()
    });
    let opened = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the open blocked");
    assert!(opened.is_err(), "a FIFO was opened in place of the file");
    // Another regular file in its place is not served either.
    std::fs::remove_file(backing.join("on-disk")).unwrap();
    std::fs::write(backing.join("on-disk"), b"someone else's").unwrap();
    assert!(f.fs.open(file, libc::O_RDONLY).is_err());
    assert!(f.fs.read(file, NO_HANDLE, 0, 100).is_err());
}

/// A hard link outside a sealed workspace keeps working after the workspace's
/// directory is deleted (its remembered name went stale).
#[test]
fn a_hard_link_outside_a_sealed_workspace_still_reads() {
    let (f, _) = fixture(&[]);
    let ws = stage(&f.fs, b"ws", b"shared");
    let keep =
        f.fs.mkdir(inode::STAGING, b"keep", 0o755, ROOT_CALLER)
            .unwrap()
            .attr
            .ino;
    let file = f.fs.lookup(ws, b"file").unwrap().attr.ino;
    f.fs.link(file, keep, b"t").unwrap();
    seal(&f.fs, b"ws").unwrap();
    // Directories made afterwards may reuse the sealed workspace's inode numbers.
    for i in 0..50 {
        let name = format!("new{i}");
        let dir =
            f.fs.mkdir(inode::STAGING, name.as_bytes(), 0o755, ROOT_CALLER)
                .unwrap()
                .attr
                .ino;
        let (created, opened) =
            f.fs.create(dir, b"file", 0o600, libc::O_WRONLY, ROOT_CALLER)
                .unwrap();
        f.fs.write(created.attr.ino, 0, b"someone else's").unwrap();
        f.fs.release(opened.fh);
    }
    assert_eq!(read_all(&f.fs, file), b"shared");
}

#[test]
fn staging_is_not_served_by_passthrough_and_staging_itself_cannot_change() {
    let (f, _) = fixture(&[]);
    let ws = stage(&f.fs, b"ws", b"x");
    let file = f.fs.lookup(ws, b"file").unwrap().attr.ino;
    let reader = f.fs.open(file, libc::O_RDONLY).unwrap();
    let writer = f.fs.open(file, libc::O_RDWR).unwrap();
    // A mapped passthrough writer could escape the freeze; the kernel wants all opens
    // of an inode passthrough or none.
    assert!(reader.backing.is_none() && writer.backing.is_none());
    f.fs.release(reader.fh);
    f.fs.release(writer.fh);
    let root = f.fs.getattr(inode::STAGING).unwrap().attr;
    assert_eq!(
        root.perm, 0o1777,
        "staging/ shows as a shared sticky directory"
    );
    let chmod = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(
        f.fs.setattr(inode::STAGING, chmod).unwrap_err().errno(),
        libc::EPERM
    );
    let mode = std::fs::metadata(&f.staging_dir)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o700, "the backing directory stays private");
}

/// A seal whose cache fails (here, no entry can be started) cannot rely on its
/// indexer to say whether the mount could read the archive back: it reads the archive
/// once more, and refuses one past the mount's limits before anything is stored or
/// deleted (here, an index larger than half the memory budget, which the freeze's
/// count of entries does not see).
#[test]
fn a_seal_without_its_cache_still_refuses_what_the_mount_could_not_read() {
    use crate::archive::index::BUILD_NODE_MEMORY;
    let (f, _) = fixture_with(
        &[],
        Options {
            memory_budget: 2 * 500 * BUILD_NODE_MEMORY,
            ..Options::default()
        },
    );
    let ws = stage(&f.fs, b"many", b"x");
    for i in 0..1_000 {
        let name = format!("f{i:04}");
        let (_, opened) =
            f.fs.create(ws, name.as_bytes(), 0o644, libc::O_WRONLY, ROOT_CALLER)
                .unwrap();
        f.fs.release(opened.fh);
    }
    std::fs::remove_dir_all(&f.cache_entries).unwrap();
    std::fs::write(&f.cache_entries, b"in the way").unwrap();
    let err = seal(&f.fs, b"many").unwrap_err();
    assert_eq!(err.errno(), libc::EFBIG, "{err}");
    assert!(err.to_string().contains("half of --memory-budget"), "{err}");
    assert_eq!(names(&f.fs, ws).len(), 1_003, "the workspace is kept");
    assert!(
        std::fs::read_dir(f.store_dir.path())
            .unwrap()
            .next()
            .is_none(),
        "nothing is stored"
    );
}

/// Sets `user.ckptfs.fork` to `value` on `ino` and waits for the answer.
fn fork(fs: &CheckpointFs, ino: u64, value: &[u8]) -> Result<(), FsError> {
    let (tx, rx) = mpsc::channel();
    let done = Box::new(move |r| tx.send(r).unwrap());
    fs.setxattr(ino, b"user.ckptfs.fork", value, ROOT_CALLER, done);
    rx.recv_timeout(Duration::from_secs(60)).unwrap()
}

/// A fork fills an empty workspace with the checkpoint's tree, built out of sight (the
/// graveyard is empty after it), and its seal names the checkpoint as its parent; a
/// fork into a workspace that is not empty, into `staging/` itself, into a file or
/// from a checkpoint that is not there fails and changes nothing.
#[test]
fn a_fork_fills_a_workspace_and_its_seal_names_its_parent() {
    let (f, ids) = fixture(&[&[
        ("a.txt", b"one"),
        ("d/e/f.txt", b"deep"),
        ("big", &[7; 100_000]),
    ]]);
    let id = &ids[0].as_str()[..12];
    let ws_ino =
        f.fs.mkdir(inode::STAGING, b"ws", 0o755, ROOT_CALLER)
            .unwrap()
            .attr
            .ino;
    fork(&f.fs, ws_ino, id.as_bytes()).unwrap();
    let ws = f.staging_dir.join("ws");
    assert_eq!(std::fs::read(ws.join("a.txt")).unwrap(), b"one");
    assert_eq!(std::fs::read(ws.join("d/e/f.txt")).unwrap(), b"deep");
    assert_eq!(std::fs::read(ws.join("big")).unwrap(), [7; 100_000]);
    let graveyard = f.staging_dir.join(".ckptfs-graveyard");
    assert_eq!(std::fs::read_dir(&graveyard).unwrap().count(), 0);

    let errno = |ino, value: &[u8]| fork(&f.fs, ino, value).unwrap_err().errno();
    assert_eq!(errno(ws_ino, id.as_bytes()), libc::ENOTEMPTY);
    assert_eq!(errno(inode::STAGING, id.as_bytes()), libc::EINVAL);
    let a = f.fs.lookup(ws_ino, b"a.txt").unwrap().attr.ino;
    assert_eq!(errno(a, id.as_bytes()), libc::EINVAL);
    let other =
        f.fs.mkdir(inode::STAGING, b"other", 0o755, ROOT_CALLER)
            .unwrap()
            .attr
            .ino;
    assert_eq!(errno(other, b"0123456789abcdef"), libc::ENOENT);
    assert_eq!(errno(other, b"0123"), libc::EINVAL);
    assert_eq!(
        std::fs::read_dir(f.staging_dir.join("other"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(std::fs::read_dir(&graveyard).unwrap().count(), 0);
    assert_eq!(std::fs::read(ws.join("a.txt")).unwrap(), b"one");

    let (entry, opened) =
        f.fs.create(ws_ino, b"new.txt", 0o644, libc::O_WRONLY, ROOT_CALLER)
            .unwrap();
    f.fs.write(entry.attr.ino, 0, b"turn 2").unwrap();
    f.fs.release(opened.fh);
    seal(&f.fs, b"ws").unwrap();
    let link = f.fs.lookup(inode::COMMIT, b"ws").unwrap();
    let target = f.fs.readlink(link.attr.ino).unwrap();
    let sealed = CheckpointId::parse(std::str::from_utf8(&target[3..]).unwrap()).unwrap();
    let store = LocalStore::open(f.store_dir.path()).unwrap();
    assert_eq!(
        checkpoint::claimed_parent(&store, &sealed).unwrap(),
        Some(ids[0].clone())
    );
}
