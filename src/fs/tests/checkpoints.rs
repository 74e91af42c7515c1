//! Checkpoint contents: served only once verified, read-only, as `tar -x` would lay
//! them out.

use std::sync::atomic::Ordering;

use super::*;

#[test]
fn contents_are_served_once_verified() {
    let big = vec![7u8; 200_000];
    let (f, ids) = fixture(&[&[("a.txt", b"hello"), ("dir/b.txt", b"world"), ("big", &big)]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    assert_eq!(
        f.fs.lookup(dir, b"a.txt").unwrap_err().errno(),
        libc::EIO,
        "not before the load"
    );
    wait_loaded(&f.fs, dir);
    assert_eq!(names(&f.fs, dir), [".", "..", "a.txt", "big", "dir"]);
    let file = f.fs.lookup(dir, b"a.txt").unwrap();
    assert_eq!(file.ttl, crate::fs::checkpoints::IMMUTABLE_TTL);
    assert_eq!(read_all(&f.fs, file.attr.ino), b"hello");
    let opened = f.fs.open(file.attr.ino, libc::O_RDONLY).unwrap();
    assert!(
        opened.keep_cache && opened.backing.is_none(),
        "small files are packed"
    );
    assert_eq!(f.fs.read(file.attr.ino, opened.fh, 3, 100).unwrap(), b"lo");
    f.fs.release(opened.fh);
    let big_file = f.fs.lookup(dir, b"big").unwrap().attr;
    let opened = f.fs.open(big_file.ino, libc::O_RDONLY).unwrap();
    assert!(
        opened.backing.is_some(),
        "large files have a passthrough backing file"
    );
    f.fs.release(opened.fh);
    assert_eq!(read_all(&f.fs, big_file.ino), big);
    let sub = f.fs.lookup(dir, b"dir").unwrap().attr;
    let b = f.fs.lookup(sub.ino, b"b.txt").unwrap().attr;
    assert_eq!(read_all(&f.fs, b.ino), b"world");
    assert_eq!(f.faults.gets.load(Ordering::SeqCst), 1);
}

#[test]
fn a_checkpoint_deleted_since_the_listing_fails_until_the_next_listing_drops_it() {
    let (f, ids) = fixture(&[&[("a.txt", b"kept")], &[("b.txt", b"pruned")]]);
    let kept = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, kept);
    // Pruned while listed: what was loaded still reads; what was not fails its
    // verification ("missing"), which the SPEC answers with EIO.
    let store = crate::store::local::LocalStore::open(f.store_dir.path()).unwrap();
    for id in &ids {
        crate::store::ObjectStore::delete(&store, &id.object_name()).unwrap();
        assert!(!f.store_dir.path().join(id.object_name()).exists());
    }
    let pruned = checkpoint_dir(&f.fs, &ids[1]);
    wait_loaded(&f.fs, pruned);
    assert_eq!(f.fs.opendir(pruned).unwrap_err().errno(), libc::EIO);
    let text = status(&f.fs);
    assert!(
        text.contains("FAILED: Checkpoint object is missing"),
        "{text}"
    );
    let a = f.fs.lookup(kept, b"a.txt").unwrap().attr;
    assert_eq!(read_all(&f.fs, a.ino), b"kept");
    // The next listing drops both.
    f.fs.refresh().unwrap();
    assert_eq!(
        names(&f.fs, crate::fs::inode::ROOT)
            .iter()
            .filter(|n| n.len() == 64)
            .count(),
        0
    );
}

#[test]
fn a_corrupt_checkpoint_answers_eio_and_says_why() {
    let (f, ids) = fixture(&[&[("a.txt", b"good")], &[("b.txt", b"bad")]]);
    let object = f.store_dir.path().join(ids[1].object_name());
    let mut bytes = std::fs::read(&object).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();

    let bad = checkpoint_dir(&f.fs, &ids[1]);
    wait_loaded(&f.fs, bad);
    assert_eq!(f.fs.opendir(bad).unwrap_err().errno(), libc::EIO);
    assert_eq!(f.fs.lookup(bad, b"b.txt").unwrap_err().errno(), libc::EIO);
    let text = status(&f.fs);
    assert!(
        text.contains("FAILED: Checkpoint checksum mismatch"),
        "{text}"
    );
    // Its own directory still stats (from the listing), and the others are fine.
    assert_eq!(f.fs.getattr(bad).unwrap().attr.kind, FileKind::Directory);
    let good = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, good);
    assert_eq!(names(&f.fs, good), [".", "..", "a.txt"]);
}

#[test]
fn every_change_inside_a_checkpoint_is_erofs() {
    let (f, ids) = fixture(&[&[("a.txt", b"x"), ("d/e", b"y")]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let file = f.fs.lookup(dir, b"a.txt").unwrap().attr.ino;
    let caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let erofs = |r: Result<(), FsError>| assert_eq!(r.unwrap_err().errno(), libc::EROFS);
    erofs(f.fs.open(file, libc::O_WRONLY).map(drop));
    erofs(f.fs.open(file, libc::O_RDONLY | libc::O_TRUNC).map(drop));
    erofs(f.fs.unlink(dir, b"a.txt"));
    erofs(f.fs.rmdir(dir, b"d"));
    erofs(f.fs.mkdir(dir, b"new", 0o755, caller).map(drop));
    erofs(f.fs.symlink(dir, b"l", b"a.txt", caller).map(drop));
    erofs(
        f.fs.create(dir, b"n", 0o644, libc::O_WRONLY, caller)
            .map(drop),
    );
    erofs(
        f.fs.setattr(
            file,
            SetAttr {
                mode: Some(0o777),
                ..SetAttr::default()
            },
        )
        .map(drop),
    );
    erofs(f.fs.link(file, dir, b"hard").map(drop));
    let (tx, rx) = mpsc::channel();
    f.fs.rename(
        (dir, b"a.txt"),
        (dir, b"b.txt"),
        0,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    erofs(rx.recv().unwrap());
}

#[test]
fn lookups_and_links_answer_like_a_local_disk() {
    let (f, ids) = fixture(&[&[("a.txt", b"x")]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let file = f.fs.lookup(dir, b"a.txt").unwrap().attr.ino;
    assert_eq!(f.fs.lookup(file, b"x").unwrap_err().errno(), libc::ENOTDIR);
    assert_eq!(
        f.fs.lookup(dir, b"missing").unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(f.fs.readlink(file).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        f.fs.open(dir, libc::O_RDONLY).unwrap_err().errno(),
        libc::EISDIR
    );
}

#[test]
fn hard_links_share_one_inode_and_count_their_names() {
    let store_dir = tempfile::tempdir().unwrap();
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("one"), b"shared").unwrap();
    std::fs::hard_link(tree.path().join("one"), tree.path().join("two")).unwrap();
    let store = LocalStore::open(store_dir.path()).unwrap();
    let options = PutOptions {
        max_archive_size: u64::MAX,
        max_unpacked: u64::MAX,
        temp_dir: store_dir.path(),
        threads: 1,
        members: None,
        parent: None,
        settle: std::time::Duration::ZERO,
    };
    checkpoint::put(&store, tree.path(), &options, &|_, _| {}).unwrap();
    let (f, _) = fixture(&[]);
    for entry in std::fs::read_dir(store_dir.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), f.store_dir.path().join(entry.file_name())).unwrap();
    }
    f.fs.refresh().unwrap();
    let id = f.fs.readlink(inode::LATEST).unwrap();
    let dir = f.fs.lookup(inode::ROOT, &id).unwrap().attr.ino;
    wait_loaded(&f.fs, dir);
    let one = f.fs.lookup(dir, b"one").unwrap().attr;
    let two = f.fs.lookup(dir, b"two").unwrap().attr;
    assert_eq!(one.ino, two.ino);
    assert_eq!(one.nlink, 2);
    assert_eq!(read_all(&f.fs, two.ino), b"shared");
}

#[test]
fn files_are_read_without_opening_them() {
    let big = vec![9u8; 150_000];
    let (f, ids) = fixture_with(
        &[&[("small", b"tiny"), ("big", &big)]],
        Options {
            read_only: true,
            ..Options::default()
        },
    );
    assert!(f.fs.open_is_free());
    let root = names(&f.fs, inode::ROOT);
    assert!(
        !root.contains(&"staging".to_string()) && !root.contains(&"commit".to_string()),
        "{root:?}"
    );
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let small = f.fs.lookup(dir, b"small").unwrap().attr.ino;
    let big_ino = f.fs.lookup(dir, b"big").unwrap().attr.ino;
    assert_eq!(f.fs.read(small, NO_HANDLE, 1, 10).unwrap(), b"iny");
    assert_eq!(
        f.fs.read(big_ino, NO_HANDLE, 149_990, 100).unwrap(),
        vec![9u8; 10]
    );
    assert_eq!(
        f.fs.read(dir, NO_HANDLE, 0, 10).unwrap_err().errno(),
        libc::EISDIR
    );
    // `.status` is rendered when the kernel asks for its attributes, as it does at
    // each open (they are never cached).
    assert_eq!(f.fs.getattr(inode::STATUS).unwrap().ttl, Duration::ZERO);
    let text = f.fs.read(inode::STATUS, NO_HANDLE, 0, 1 << 16).unwrap();
    assert!(
        String::from_utf8(text)
            .unwrap()
            .contains(" from the store\n")
    );
}

/// What the core pushed into a kernel's page cache, for tests without a kernel.
#[derive(Default)]
struct PushedPages(std::sync::Mutex<Vec<(u64, Vec<u8>)>>);

impl KernelCache for PushedPages {
    fn store(&self, ino: u64, data: &[u8]) -> io::Result<()> {
        self.0.lock().unwrap().push((ino, data.to_vec()));
        Ok(())
    }
    fn forget_entry(&self, _parent: u64, _name: &[u8]) {}
    fn forget_attributes(&self, _ino: u64) {}
}

impl PushedPages {
    /// The files pushed so far, once `count` were (or after 10 s), by name; each
    /// must have been pushed with its contents, `files[name]`.
    fn names(
        &self,
        fs: &CheckpointFs,
        dir: u64,
        files: &std::collections::BTreeMap<String, Vec<u8>>,
        count: usize,
    ) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.0.lock().unwrap().len() < count && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Give a push beyond the expected count a moment to show up.
        std::thread::sleep(Duration::from_millis(50));
        let pushed = self.0.lock().unwrap();
        pushed
            .iter()
            .map(|(ino, data)| {
                let (name, contents) = files
                    .iter()
                    .find(|(n, _)| fs.lookup(dir, n.as_bytes()).unwrap().attr.ino == *ino)
                    .expect("a pushed inode is a file of the checkpoint");
                assert!(data == contents, "{name} pushed with its contents");
                name.clone()
            })
            .collect()
    }
}

#[test]
fn a_reader_going_through_files_in_order_finds_the_next_ones_pushed() {
    let mut names: std::collections::BTreeMap<String, Vec<u8>> = (0..40)
        .map(|i| (format!("f{i:02}"), vec![i as u8; 100 + i * 1000]))
        .collect();
    names.insert("f09z-huge".into(), vec![1u8; 2 << 20]);
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_slice()))
        .collect();
    let (f, ids) = fixture(&[&files]);
    let pushed = Arc::new(PushedPages::default());
    f.fs.attach_kernel(Arc::clone(&pushed) as Arc<dyn KernelCache>);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let ino = |name: &str| f.fs.lookup(dir, name.as_bytes()).unwrap().attr.ino;

    // A first read starts a stream: the next four files are pushed.
    f.fs.read(ino("f00"), NO_HANDLE, 0, 4096).unwrap();
    let seen = pushed.names(&f.fs, dir, &names, 4);
    assert_eq!(seen, ["f01", "f02", "f03", "f04"]);
    // Reads inside a file push nothing.
    f.fs.read(ino("f00"), NO_HANDLE, 10, 10).unwrap();
    // The reader lands where it was expected: the window doubles, beyond the pushed.
    f.fs.read(ino("f05"), NO_HANDLE, 0, 4096).unwrap();
    let seen = pushed.names(&f.fs, dir, &names, 12);
    assert_eq!(
        seen[4..],
        ["f06", "f07", "f08", "f09", "f10", "f11", "f12", "f13"]
    );
    assert!(
        !seen.iter().any(|n| n.contains("huge")),
        "files over 1 MiB are left to the kernel's read-ahead: {seen:?}"
    );
    // A jump elsewhere starts a stream of its own, small again.
    pushed.0.lock().unwrap().clear();
    f.fs.read(ino("f30"), NO_HANDLE, 0, 4096).unwrap();
    assert_eq!(
        pushed.names(&f.fs, dir, &names, 4),
        ["f31", "f32", "f33", "f34"]
    );
}

/// Readers holding many large files open (any user's, with `--allow-other`) cannot run
/// the daemon out of descriptors: past a bound, a handle holds none of its own and
/// reads through the files kept for reads without a handle (attacker review, issue 24).
#[test]
fn handles_past_the_bound_hold_no_descriptor_and_still_read() {
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (f, ids) = fixture(&[&[("big", &big)]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let ino = f.fs.lookup(dir, b"big").unwrap().attr.ino;
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let opened: Vec<_> = (0..6)
        .map(|_| f.fs.open(ino, libc::O_RDONLY).unwrap())
        .collect();
    // The first two hold a descriptor (and offer passthrough); the others do not.
    let backed: Vec<bool> = opened.iter().map(|o| o.backing.is_some()).collect();
    assert_eq!(backed, [true, true, false, false, false, false]);
    // Direct I/O, which the kernel lets coexist with the passthrough opens.
    let direct: Vec<bool> = opened.iter().map(|o| o.direct_io).collect();
    assert_eq!(direct, [false, false, true, true, true, true]);
    let before = fds();
    let more: Vec<_> = (0..50)
        .map(|_| f.fs.open(ino, libc::O_RDONLY).unwrap())
        .collect();
    // (Other tests run beside this one and open files too: a margin.)
    assert!(
        fds() < before + 20,
        "{} descriptors for 50 opens",
        fds() - before
    );
    for o in opened.iter().chain(&more) {
        assert_eq!(f.fs.read(ino, o.fh, 1000, 10).unwrap(), big[1000..1010]);
    }
    for o in opened.into_iter().chain(more) {
        f.fs.release(o.fh);
    }
    // Released, the bound is free again.
    let again = f.fs.open(ino, libc::O_RDONLY).unwrap();
    assert!(again.backing.is_some());
    f.fs.release(again.fh);
}

#[test]
fn readdirplus_of_a_checkpoint_gives_what_a_lookup_of_each_name_gives() {
    let big = vec![3u8; 100_000];
    let (f, ids) = fixture(&[&[("a.txt", b"one"), ("big", &big), ("dir/b.txt", b"two")]]);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let sub = f.fs.lookup(dir, b"dir").unwrap().attr.ino;
    for ino in [dir, sub] {
        let mut listed = Vec::new();
        f.fs.readdirplus(ino, 0, &mut |entry, found, _| {
            listed.push((entry.name.clone(), found.copied()));
            false
        })
        .unwrap();
        assert_eq!(listed.len(), names(&f.fs, ino).len());
        for (name, found) in listed {
            if name == b"." || name == b".." {
                assert_eq!(found, None);
                continue;
            }
            assert_eq!(found, Some(f.fs.lookup(ino, &name).unwrap()), "{name:?}");
        }
    }
}
