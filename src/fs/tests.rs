//! Unit tests of the filesystem core, without a kernel: a local store, a cache and a
//! staging directory in temporary folders, and the core called as the adapter would.

use super::*;
use crate::checkpoint::{self, CheckpointId, PutOptions};
use crate::store::local::LocalStore;
use std::sync::mpsc;

struct Fixture {
    fs: Arc<CheckpointFs>,
    store_dir: tempfile::TempDir,
    _cache_dir: tempfile::TempDir,
}

fn fixture(trees: &[&[(&str, &[u8])]]) -> (Fixture, Vec<CheckpointId>) {
    let store_dir = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::open(store_dir.path()).unwrap());
    let mut ids = Vec::new();
    for files in trees {
        let tree = tempfile::tempdir().unwrap();
        for (name, contents) in *files {
            let path = tree.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
        let options = PutOptions {
            max_archive_size: u64::MAX,
            temp_dir: cache_dir.path(),
            threads: 1,
        };
        let report = checkpoint::put(store.as_ref(), tree.path(), &options, &|_, _| {}).unwrap();
        ids.push(report.id);
    }
    let cache = Arc::new(Cache::open(&cache_dir.path().join("cache"), 1 << 30).unwrap());
    let staging = StagingTree::at(&cache_dir.path().join("staging")).unwrap();
    let fs = CheckpointFs::new(
        store,
        cache,
        staging,
        FsConfig {
            max_archive_size: 1 << 30,
            limits: Limits {
                max_entries: 1000,
                max_unpacked_bytes: 1 << 30,
            },
            owner_override: None,
            uid: 0,
            gid: 0,
            work_dir: cache_dir.path().to_owned(),
            threads: 1,
            loaders: 2,
        },
    );
    fs.refresh().unwrap();
    let fixture = Fixture {
        fs,
        store_dir,
        _cache_dir: cache_dir,
    };
    (fixture, ids)
}

fn names(fs: &CheckpointFs, ino: u64) -> Vec<String> {
    fs.opendir(ino).unwrap();
    let mut names = Vec::new();
    fs.readdir(ino, 0, &mut |e, _| {
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        false
    })
    .unwrap();
    names
}

/// Loads the checkpoint `ino` belongs to, the way the adapter does.
fn wait_loaded(fs: &Arc<CheckpointFs>, ino: u64) {
    let (tx, rx) = mpsc::channel();
    fs.prepare(ino, Reading::Opendir, move |_| tx.send(()).unwrap());
    rx.recv().unwrap();
}

#[test]
fn lists_from_the_listing_alone_and_serves_verified_contents() {
    let (f, ids) = fixture(&[&[("a.txt", b"hello"), ("dir/b.txt", b"world")]]);
    let root = names(&f.fs, inode::ROOT);
    assert!(root.contains(&ids[0].to_string()), "{root:?}");
    assert!(root.contains(&"latest".to_string()));
    assert_eq!(
        f.fs.readlink(inode::LATEST).unwrap(),
        ids[0].as_str().as_bytes()
    );

    let dir =
        f.fs.lookup(inode::ROOT, ids[0].as_str().as_bytes())
            .unwrap()
            .attr;
    // stat of the checkpoint's directory needs no download...
    assert_eq!(
        f.fs.getattr(dir.ino).unwrap().attr.kind,
        FileKind::Directory
    );
    assert!(
        String::from_utf8(f.fs.status_text())
            .unwrap()
            .contains("listed")
    );
    // ...but its contents do.
    wait_loaded(&f.fs, dir.ino);
    assert_eq!(names(&f.fs, dir.ino), [".", "..", "a.txt", "dir"]);
    let file = f.fs.lookup(dir.ino, b"a.txt").unwrap().attr;
    let opened = f.fs.open(file.ino, libc::O_RDONLY).unwrap();
    assert_eq!(f.fs.read(opened.fh, 0, 100).unwrap(), b"hello");
    assert_eq!(f.fs.read(opened.fh, 3, 100).unwrap(), b"lo");
    f.fs.release(opened.fh);
    assert_eq!(
        f.fs.open(file.ino, libc::O_WRONLY).unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(
        f.fs.unlink(dir.ino, b"a.txt").unwrap_err().errno(),
        libc::EROFS
    );
    assert!(
        String::from_utf8(f.fs.status_text())
            .unwrap()
            .contains("verified")
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

    let bad =
        f.fs.lookup(inode::ROOT, ids[1].as_str().as_bytes())
            .unwrap()
            .attr;
    wait_loaded(&f.fs, bad.ino);
    let err = f.fs.opendir(bad.ino).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    let status = String::from_utf8(f.fs.status_text()).unwrap();
    assert!(
        status.contains("FAILED: Checkpoint checksum mismatch"),
        "{status}"
    );

    let good =
        f.fs.lookup(inode::ROOT, ids[0].as_str().as_bytes())
            .unwrap()
            .attr;
    wait_loaded(&f.fs, good.ino);
    assert_eq!(names(&f.fs, good.ino), [".", "..", "a.txt"]);
}
