//! Concurrent access: many readers of a cold checkpoint share one download, and a
//! checkpoint being verified never holds up the rest of the mount.
//!
//! Both tests put a [`GatedProxy`] between the mount and S3 that stalls one object's
//! download half-way, so "while it is being verified" is a fact, not a timing guess.

use std::fs;
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use super::gate::{GatedProxy, OpenOnDrop};
use crate::util::mount::{MOUNT_TIMEOUT, Mount, repo_temp_dir};
use crate::util::tree::{make_dir, make_random_tree, make_small_tree, random_bytes, write_file};
use crate::util::{TestStore, s3_endpoint};

const READERS: usize = 16;
/// Incompressible bytes in the large checkpoint: large enough that its download is
/// stalled well inside the streaming pass (the gate decides how long it lasts).
const LARGE: usize = 32 << 20;

#[test]
fn s3_parallel_readers_of_a_cold_checkpoint_share_one_download() {
    let store = TestStore::s3();
    let work = repo_temp_dir("readers-");
    let src = work.path().join("src");
    make_dir(&src);
    // Half the files packed, half in files of their own (>= 16 KiB).
    let contents: Vec<Vec<u8>> = (0..READERS)
        .map(|i| {
            let len = if i % 2 == 0 { 1000 + i } else { 70_000 + i };
            random_bytes(len, i as u64 + 100)
        })
        .collect();
    for (i, data) in contents.iter().enumerate() {
        write_file(&src.join(format!("dir{}/file-{i}.bin", i % 4)), data, 0o644);
    }
    let (sha, _) = store.put(&src, &[]);
    let proxy = GatedProxy::start(&s3_endpoint(), &sha, 16 * 1024);
    let mount = Mount::new(&store).endpoint(&proxy.endpoint()).start();
    let _gate = OpenOnDrop(&proxy);
    assert_eq!(mount.status().state(&sha), "listed");

    let barrier = Arc::new(Barrier::new(READERS + 1));
    let (done_tx, done_rx) = mpsc::channel();
    for i in 0..READERS {
        let path = mount.join(&sha).join(format!("dir{}/file-{i}.bin", i % 4));
        let barrier = Arc::clone(&barrier);
        let done = done_tx.clone();
        std::thread::spawn(move || {
            barrier.wait();
            let _ = done.send((i, fs::read(&path)));
        });
    }
    barrier.wait();
    // The download is under way and stalled; every reader is in (or about to enter)
    // the mount. Give them a moment to queue up: more overlap, not a pass criterion.
    assert!(
        proxy.wait_held(MOUNT_TIMEOUT),
        "the download never started\nlog:\n{}",
        mount.log_text()
    );
    std::thread::sleep(Duration::from_millis(300));
    let status = mount.status();
    assert_eq!(status.state(&sha), "verifying", "{}", status.text);
    assert_eq!(status.downloads, 1, "{}", status.text);
    proxy.open();

    for _ in 0..READERS {
        let (i, data) = done_rx
            .recv_timeout(MOUNT_TIMEOUT)
            .unwrap_or_else(|_| panic!("readers hang\nlog:\n{}", mount.log_text()));
        let data = data.unwrap_or_else(|e| panic!("reader {i}: {e}\nlog:\n{}", mount.log_text()));
        assert!(data == contents[i], "reader {i} got different bytes");
    }
    let status = mount.status();
    assert_eq!(status.state(&sha), "verified", "{}", status.text);
    assert_eq!(
        status.downloads, 1,
        "one download for all readers:\n{}",
        status.text
    );
    assert_eq!(proxy.gets(), 1, "one GET of the object");
}

#[test]
fn s3_a_checkpoint_being_verified_does_not_block_others() {
    let store = TestStore::s3();
    let work = repo_temp_dir("nonblocking-");
    let large = work.path().join("large");
    make_random_tree(&large, LARGE, 42);
    let small = work.path().join("small");
    make_small_tree(&small, "small");
    let (large_sha, _) = store.put(&large, &[]);
    let (small_sha, _) = store.put(&small, &[]);
    // Stall the large download after 4 MiB: well into the streaming pass.
    let proxy = GatedProxy::start(&s3_endpoint(), &large_sha, 4 << 20);
    let mount = Mount::new(&store)
        .endpoint(&proxy.endpoint())
        .args(["--threads", "2"])
        .start();
    let _gate = OpenOnDrop(&proxy);

    let large_dir = mount.join(&large_sha);
    let (large_tx, large_rx) = mpsc::channel();
    std::thread::spawn(move || large_tx.send(fs::read(large_dir.join("blob.bin"))));
    assert!(
        proxy.wait_held(MOUNT_TIMEOUT),
        "the large download never started\nlog:\n{}",
        mount.log_text()
    );
    assert_eq!(mount.status().state(&large_sha), "verifying");

    // The other checkpoint (listing, reading) and the root, while the large one is
    // stuck. Run in a thread only so that a hang fails the test instead of stalling it.
    let small_dir = mount.join(&small_sha);
    let root = mount.path().to_owned();
    let (small_tx, small_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = (|| -> std::io::Result<_> {
            let mut names: Vec<String> = fs::read_dir(&small_dir)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()?;
            names.sort();
            let note = fs::read(small_dir.join("note.txt"))?;
            let data = fs::read(small_dir.join("sub/data.txt"))?;
            let root_entries = fs::read_dir(&root)?.count();
            let by_time = fs::read_dir(root.join("by-time"))?.count();
            Ok((names, note, data, root_entries, by_time))
        })();
        let _ = small_tx.send(result);
    });
    let (names, note, data, root_entries, by_time) = small_rx
        .recv_timeout(MOUNT_TIMEOUT)
        .unwrap_or_else(|_| {
            proxy.open();
            panic!(
                "reading a small checkpoint hangs while another is being verified\nlog:\n{}",
                mount.log_text()
            )
        })
        .unwrap_or_else(|e| panic!("small checkpoint: {e}\nlog:\n{}", mount.log_text()));
    assert_eq!(names, ["note.txt", "sub"]);
    assert_eq!(note, b"checkpoint small\n");
    assert_eq!(data, "small".repeat(200).as_bytes());
    assert_eq!(
        root_entries, 7,
        "by-time, staging, commit, .status, latest, 2 checkpoints"
    );
    assert_eq!(by_time, 2);
    let status = mount.status();
    assert_eq!(status.state(&small_sha), "verified", "{}", status.text);
    assert_eq!(
        status.state(&large_sha),
        "verifying",
        "the small checkpoint was served while the large one was still verifying:\n{}",
        status.text
    );
    assert_eq!(proxy.held(), 1, "the large download is still stalled");
    assert!(
        large_rx.try_recv().is_err(),
        "the large read cannot be done yet"
    );

    proxy.open();
    let data = large_rx
        .recv_timeout(MOUNT_TIMEOUT)
        .unwrap_or_else(|_| panic!("the large read hangs\nlog:\n{}", mount.log_text()))
        .unwrap_or_else(|e| panic!("large read: {e}\nlog:\n{}", mount.log_text()));
    assert!(data == random_bytes(LARGE, 42), "large contents");
    let status = mount.status();
    assert_eq!(status.state(&large_sha), "verified", "{}", status.text);
    assert_eq!(status.downloads, 2, "{}", status.text);
}
