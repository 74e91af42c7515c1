//! Forks: `ckptfs fork MNT REF NAME` makes `staging/NAME` from a checkpoint in the
//! daemon. The workspace is the checkpoint's tree (what `tar -xzf` restores), its seal
//! is what `put` stores and names the checkpoint as parent, writing to it never
//! reaches the checkpoint, and a fork that cannot be made leaves nothing behind.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use super::{cp_a, make_workspace, sh};
use crate::util::mount::{Mount, repo_temp_dir};
use crate::util::tree::{
    assert_same_tree, fix_mtimes, list_paths, make_small_tree, random_bytes, set_mtime, write_file,
};
use crate::util::{SmallDisk, TestStore, ckptfs, logged_count, run, sha256_hex};

/// What the daemon logs once it recorded a forked workspace for its seal, or gave up.
const RECORDED: &str = "recorded what the forked workspace holds";
const STOPPED: &str = "a fork's capture stopped";

/// `ckptfs fork MNT REF NAME`, whatever its outcome.
fn fork(mount: &Path, reference: &str, name: &str) -> crate::util::Output {
    run(ckptfs().arg("fork").arg(mount).arg(reference).arg(name))
}

#[test]
fn a_fork_is_the_checkpoint_and_its_seal_names_it_as_parent() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    // Hard links across directories, one of them read-only once made.
    fs::hard_link(tree.join("hello.py"), tree.join("src/hello-again.py")).unwrap();
    fs::create_dir(tree.join("read-only")).unwrap();
    fs::write(tree.join("read-only/kept"), "kept\n").unwrap();
    fs::hard_link(tree.join("read-only/kept"), tree.join("z-kept")).unwrap();
    fix_mtimes(&tree);
    fs::set_permissions(
        tree.join("read-only"),
        std::os::unix::fs::PermissionsExt::from_mode(0o555),
    )
    .unwrap();
    let (first, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store).staging().start();

    // By a prefix, before the checkpoint was ever opened: the fork waits for its load.
    let out = fork(mount.path(), &first[..10], "turn-2").success();
    assert!(out.stderr.contains("forked"), "{out}");
    let forked = mount.staged("turn-2");
    assert_same_tree(&tree, &forked);
    assert_same_tree(&mount.join(&first), &forked);
    for (a, b) in [
        ("hello.py", "src/hello-again.py"),
        ("read-only/kept", "z-kept"),
    ] {
        let ino = |name| fs::metadata(forked.join(name)).unwrap().ino();
        assert_eq!(ino(a), ino(b), "hard links stay links");
    }

    // One change, sealed: the object `put` makes of the same tree, its parent the fork's.
    fs::write(forked.join("hello.py"), "print('turn 2')\n").unwrap();
    fs::write(forked.join("added.txt"), "new in turn 2\n").unwrap();
    let local = work.path().join("turn-2");
    cp_a(&forked, &local);
    let out = sh(
        r#"mv "$1/staging/turn-2" "$1/commit/" && readlink "$1/commit/turn-2""#,
        &[mount.path()],
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let second = out.stdout.trim().trim_start_matches("../").to_owned();
    let meta = store.object_meta(&second).expect("the sealed object");
    assert_eq!(meta.parent.as_deref(), Some(first.as_str()));
    let (want, _) = store.put(&local, &[]);
    assert_eq!(second, want, "the seal of a fork is not what put stores");

    // `latest` is the turn just sealed; the mount's log says what a fork did.
    fork(mount.path(), "latest", "turn-3").success();
    let restored = work.path().join("restored");
    store.get(&second, &restored);
    assert_same_tree(&restored, &mount.staged("turn-3"));
    assert!(
        mount.log_text().contains("forked"),
        "{}",
        mount.log_excerpt()
    );
}

/// After a fork the daemon captures the new workspace as its seal would, writing
/// nothing, and keeps what it saw of each file: the seal then reads only the files
/// changed since. A file rewritten with bytes of the same length and its old mtime
/// put back is read all the same (its change time moved), as are a grown file, a
/// new one and one whose mode changed; the object is the one `put` makes of the
/// same tree, and the checkpoint, loaded from the store, shows that tree.
#[test]
fn the_seal_of_a_fork_reads_only_the_files_changed_since() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-records-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    for i in 0..40 {
        let name = format!("lib/part-{i:02}.bin");
        write_file(&tree.join(name), &random_bytes(96 << 10, 100 + i), 0o644);
    }
    fix_mtimes(&tree);
    let (first, _) = store.put(&tree, &[]);
    let tree_bytes: u64 = list_paths(&tree)
        .iter()
        .map(|p| fs::symlink_metadata(tree.join(p)).unwrap())
        .filter(fs::Metadata::is_file)
        .map(|m| m.len())
        .sum();
    let mount = Mount::new(&store).staging().start();
    fork(mount.path(), &first, "w").success();
    mount.wait_for_log(&[RECORDED], Duration::from_secs(120));

    let forked = mount.staged("w");
    let same_length = forked.join("lib/part-07.bin");
    let before = fs::metadata(&same_length).unwrap();
    fs::write(&same_length, random_bytes(96 << 10, 999)).unwrap();
    set_mtime(&same_length, before.mtime());
    let after = fs::metadata(&same_length).unwrap();
    assert_eq!((after.len(), after.mtime()), (before.len(), before.mtime()));
    let mut grown = fs::OpenOptions::new()
        .append(true)
        .open(forked.join("lib/part-20.bin"))
        .unwrap();
    std::io::Write::write_all(&mut grown, b"one more line\n").unwrap();
    drop(grown);
    fs::set_permissions(
        forked.join("lib/part-30.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    fs::write(forked.join("lib/new.txt"), "new in turn 2\n").unwrap();
    fs::remove_file(forked.join("lib/part-39.bin")).unwrap();
    let local = work.path().join("turn-2");
    cp_a(&forked, &local);

    let out = sh(
        r#"mv "$1/staging/w" "$1/commit/" && readlink "$1/commit/w""#,
        &[mount.path()],
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let second = out.stdout.trim().trim_start_matches("../").to_owned();
    assert_eq!(
        store.object_meta(&second).unwrap().parent.as_deref(),
        Some(first.as_str())
    );
    let (want, _) = store.put(&local, &[]);
    assert_eq!(second, want, "the seal of a fork is not what put stores");
    let log = mount.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("left unread as the fork's capture saw them"))
        .unwrap_or_else(|| panic!("the seal read every file:\n{log}"));
    let (unread, read_again) = (
        logged_count(line, "unread"),
        logged_count(line, "read_again"),
    );
    // Each changed file is read; so are the files left unread that share a member
    // with one (`read_again`, counted within `unread`).
    assert!(
        unread <= tree_bytes && unread - read_again >= tree_bytes / 2,
        "{unread} bytes left unread and {read_again} read again of {tree_bytes}: {line}"
    );
    assert_same_tree(&local, &mount.join(&second));
    let restored = work.path().join("restored");
    store.get(&second, &restored);
    assert_same_tree(&local, &restored);
}

/// What is written into a forked workspace is the seal's to read: a file made huge
/// and sparse there right after the fork stops the capture that records the fork
/// once it has read twice the fork's bytes (and 64 MiB), and the seal reads it.
#[test]
fn a_huge_file_made_after_a_fork_stops_its_capture() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-huge-");
    let tree = work.path().join("tree");
    make_small_tree(&tree, "huge");
    let (id, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store).staging().start();
    fork(mount.path(), &id, "w").success();
    let huge = fs::File::create(mount.staged("w").join("huge")).unwrap();
    huge.set_len(8 << 30).unwrap();
    drop(huge);
    let log = mount.wait_for_log(&[STOPPED, RECORDED], Duration::from_secs(120));
    let stopped = log
        .lines()
        .find(|l| l.contains(STOPPED))
        .unwrap_or_else(|| panic!("the capture read the huge file:\n{log}"));
    assert!(stopped.contains("unpacks to more than"), "{stopped}");
    fs::remove_file(mount.staged("w").join("huge")).unwrap();
    fs::write(mount.staged("w").join("after.txt"), "after\n").unwrap();
    let local = work.path().join("local");
    cp_a(&mount.staged("w"), &local);
    let out = sh(
        r#"mv "$1/staging/w" "$1/commit/" && readlink "$1/commit/w""#,
        &[mount.path()],
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let sealed = out.stdout.trim().trim_start_matches("../").to_owned();
    assert!(
        !mount
            .log_text()
            .contains("left unread as the fork's capture saw them"),
        "{}",
        mount.log_excerpt()
    );
    assert_eq!(store.put(&local, &[]).0, sealed);
}

#[test]
fn writing_to_a_forked_file_never_changes_its_checkpoint() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-write-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    let (id, _) = store.put(&tree, &[]);
    let cache = work.path().join("cache");
    let mount = Mount::new(&store).staging().cache_dir(&cache).start();
    let checkpoint_file = mount.join(&id).join("big.txt");
    let small_file = mount.join(&id).join("hello.py");
    let want = (
        sha256_hex(&fs::read(&checkpoint_file).unwrap()),
        sha256_hex(&fs::read(&small_file).unwrap()),
    );
    fork(mount.path(), &id, "w").success();

    // A reader holds the checkpoint's file open while the fork's copies are
    // rewritten, truncated and grown in place.
    let mut reader = fs::File::open(&checkpoint_file).unwrap();
    let mut head = [0u8; 4096];
    reader.read_exact(&mut head).unwrap();
    for name in ["big.txt", "hello.py"] {
        let copy = fs::OpenOptions::new()
            .write(true)
            .open(mount.staged("w").join(name))
            .unwrap();
        copy.write_all_at(&[b'X'; 8192], 0).unwrap();
        copy.set_len(100).unwrap();
        copy.write_all_at(b"grown", 1 << 20).unwrap();
        drop(copy);
    }
    fs::set_permissions(
        mount.staged("w").join("big.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    let mut whole = head.to_vec();
    whole.extend_from_slice(&rest);
    assert_eq!(
        sha256_hex(&whole),
        want.0,
        "read while the fork was written"
    );
    let now = (
        sha256_hex(&fs::read(&checkpoint_file).unwrap()),
        sha256_hex(&fs::read(&small_file).unwrap()),
    );
    assert_eq!(now, want, "the checkpoint changed");
    assert_eq!(
        fs::metadata(&checkpoint_file).unwrap().mode() & 0o7777,
        0o644
    );

    // The cache files themselves are untouched: a new mount over the same cache
    // serves the same bytes, after checking them.
    drop(mount);
    let again = Mount::new(&store).cache_dir(&cache).start();
    let read = fs::read(again.join(&id).join("big.txt")).unwrap();
    assert_eq!(sha256_hex(&read), want.0);
    assert_eq!(again.downloads(), 0, "{}", again.status_text());
}

#[test]
fn a_fork_that_cannot_be_made_leaves_nothing_behind() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-refused-");
    let tree = work.path().join("tree");
    make_small_tree(&tree, "one");
    let (id, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store).staging().start();
    fs::create_dir(mount.staged("taken")).unwrap();
    fs::write(mount.staged("taken").join("mine"), "kept\n").unwrap();

    let out = fork(mount.path(), &id, "taken").failure();
    assert!(out.stderr.contains("exists"), "{out}");
    // Straight to the daemon: a workspace that is not empty.
    let not_empty = rustix::fs::setxattr(
        mount.staged("taken"),
        "user.ckptfs.fork",
        id.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
    assert_eq!(not_empty, Err(rustix::io::Errno::NOTEMPTY));
    assert_eq!(
        fs::read_to_string(mount.staged("taken").join("mine")).unwrap(),
        "kept\n"
    );
    assert_eq!(fs::read_dir(mount.staged("taken")).unwrap().count(), 1);

    let out = fork(mount.path(), "0123456789abcdef", "x").failure();
    assert!(out.stderr.contains("no checkpoint"), "{out}");
    let out = fork(mount.path(), "not-hex", "x").failure();
    assert!(out.stderr.contains("REF"), "{out}");
    let out = fork(mount.path(), &id, "a/b").failure();
    assert!(out.stderr.contains("one path component"), "{out}");
    let out = fork(mount.path(), &id, ".ckptfs-graveyard").failure();
    assert!(!out.status.success(), "{out}");
    // Straight to the daemon, with what the command would not send: values that name
    // no checkpoint, `staging/` itself, a file.
    fs::create_dir(mount.staged("empty")).unwrap();
    fs::write(mount.staged("taken").join("file"), "").unwrap();
    for (target, value) in [
        (mount.staged("empty"), &b"no-hex"[..]),
        (mount.staged("empty"), b"0123"),
        (mount.staged("empty"), &[id.as_bytes(), b"/x"].concat()),
        (mount.join("staging"), id.as_bytes()),
        (mount.staged("taken").join("file"), id.as_bytes()),
    ] {
        let result = rustix::fs::setxattr(
            &target,
            "user.ckptfs.fork",
            value,
            rustix::fs::XattrFlags::empty(),
        );
        assert!(
            result.is_err(),
            "{:?} was taken",
            String::from_utf8_lossy(value)
        );
    }
    assert_eq!(fs::read_dir(mount.staged("empty")).unwrap().count(), 0);
    fs::remove_dir(mount.staged("empty")).unwrap();
    fs::remove_file(mount.staged("taken").join("file")).unwrap();
    let names: Vec<_> = fs::read_dir(mount.join("staging"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["taken"],
        "staging/ holds only what was made by hand"
    );

    // Another attribute is still "not kept".
    let other = rustix::fs::setxattr(
        mount.staged("taken"),
        "user.other",
        b"x",
        rustix::fs::XattrFlags::empty(),
    );
    assert_eq!(other, Err(rustix::io::Errno::NOTSUP));
    let read_only = Mount::new(&store).args(["--read-only"]).start();
    let out = fork(read_only.path(), &id, "x").failure();
    assert!(out.stderr.contains("read-only"), "{out}");
}

/// A staging disk too small for the checkpoint: the fork fails with the disk's error
/// and leaves neither the workspace nor its partial copy.
#[test]
fn a_fork_onto_a_full_disk_fails_and_leaves_nothing() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fork-full-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    let (id, _) = store.put(&tree, &[]);
    let small = work.path().join("small");
    let _disk = SmallDisk::mount(&small, "size=1m,mode=0700");
    let staging = small.join("staging");
    {
        let mount = Mount::new(&store)
            .args([std::ffi::OsStr::new("--staging-dir"), staging.as_os_str()])
            .start();
        let out = fork(mount.path(), &id, "w").failure();
        assert!(out.stderr.contains("No space left"), "{out}");
        assert!(fs::symlink_metadata(mount.staged("w")).is_err());
        let graveyard = staging.join(".ckptfs-graveyard");
        assert_eq!(
            fs::read_dir(&graveyard).unwrap().count(),
            0,
            "a partial fork is left"
        );
        // The disk is usable again: a small workspace is made by hand.
        fs::create_dir(mount.staged("hand")).unwrap();
        fs::write(mount.staged("hand").join("f"), "fits\n").unwrap();
    }
}

/// The daemon copies a fork from its cache as itself and gives the copies to the
/// caller: on a shared mount (`--allow-other`, a root daemon) another user forks only
/// a checkpoint whose every entry they could read through the mount, as their own
/// `cp -a` could, and a refused fork leaves nothing. Root forks anything.
#[test]
fn a_fork_gives_no_one_what_they_could_not_read() {
    use crate::util::users::{as_nobody, shared_binary};
    use std::os::unix::fs::PermissionsExt;
    let store = TestStore::local();
    let work = repo_temp_dir("fork-perms-");
    let (closed, open) = (work.path().join("closed"), work.path().join("open"));
    for tree in [&closed, &open] {
        fs::create_dir_all(tree.join("secret")).unwrap();
        fs::write(tree.join("pub.txt"), "public\n").unwrap();
        fs::write(tree.join("secret/id_rsa"), "PRIVATE KEY\n").unwrap();
    }
    let mode = |path: &Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    };
    mode(&closed.join("secret/id_rsa"), 0o600);
    mode(&closed.join("secret"), 0o700);
    let (closed_id, _) = store.put(&closed, &[]);
    let (open_id, _) = store.put(&open, &[]);
    let mount = Mount::new(&store)
        .staging()
        .reachable_by_all()
        .args(["--allow-other"])
        .start();
    let fork_as_nobody = |id: &str, name: &str| {
        run(as_nobody()
            .arg(shared_binary())
            .arg("fork")
            .arg(mount.path())
            .arg(id)
            .arg(name))
    };
    // What the mount itself refuses them...
    let out = run(as_nobody()
        .arg("cat")
        .arg(mount.join(&closed_id).join("secret/id_rsa")));
    assert!(!out.status.success(), "{out}");
    // ...a fork does not give them.
    let out = fork_as_nobody(&closed_id, "steal");
    assert!(!out.status.success(), "{out}");
    assert!(out.stderr.contains("ermission denied"), "{out}");
    assert!(!mount.staged("steal").exists());
    let log = mount.wait_for_log(&["may not read every entry"], Duration::from_secs(10));
    assert!(log.contains("secret"), "{log}");
    // Asking again and again does not fill the log: the reason is logged once.
    for i in 0..10 {
        assert!(
            !fork_as_nobody(&closed_id, &format!("again-{i}"))
                .status
                .success()
        );
    }
    let refusals = mount.log_text().matches("may not read every entry").count();
    assert_eq!(refusals, 1, "{}", mount.log_excerpt());

    // A checkpoint they may read, forked as theirs.
    let out = fork_as_nobody(&open_id, "theirs");
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let theirs = mount.staged("theirs");
    for name in ["pub.txt", "secret/id_rsa"] {
        assert_eq!(
            fs::read(theirs.join(name)).unwrap(),
            fs::read(open.join(name)).unwrap()
        );
    }
    let file = fs::metadata(theirs.join("secret/id_rsa")).unwrap();
    assert_eq!((file.uid(), file.gid()), (65534, 65534));

    // Root forks the closed one, owners as shown.
    let out = fork(mount.path(), &closed_id, "roots");
    assert!(out.status.success(), "{out}");
    assert_same_tree(&closed, &mount.staged("roots"));
}
