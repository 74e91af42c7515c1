//! `kill -9` of the daemon at the worst moments: during a verification pass, during a
//! seal (before, during and after the upload), and while readers are busy. Each time
//! `ckptfs mount` is started again on the same mount point, cache and staging
//! directory; it must detach the dead mount itself and come up, and then:
//! - the cache holds nothing unverified;
//! - staged workspaces are intact;
//! - an interrupted seal either completed (the object whole and verified) or left
//!   nothing behind, and no multipart upload is left pending.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::gate::GatedProxy;
use crate::util::mount::{MOUNT_TIMEOUT, Mount, MountedStore, repo_temp_dir};
use crate::util::proxy::{Fault, FaultProxy};
use crate::util::tree::{assert_same_tree, make_random_tree, make_small_tree};
use crate::util::{TestStore, s3_endpoint, sha256_hex};

fn kill9(mount: &MountedStore) {
    let pid = mount.pid();
    // SAFETY: kill has no memory-safety preconditions; the pid is the test's child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    // Dead once the leader is a zombie and no other thread is still exiting: until the
    // last one has, the process's descriptors (the cache's lock among them) are open.
    let dead = || {
        let zombie = fs::read_to_string(format!("/proc/{pid}/status"))
            .map_or(true, |status| status.contains("State:\tZ"));
        let threads = fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
        zombie && threads <= 1
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dead() {
        assert!(Instant::now() < deadline, "the daemon survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The same mount again, over the dead one.
fn restart(store: &TestStore, dead: &MountedStore, staging: Option<&Path>) -> MountedStore {
    let mut mount = Mount::new(store)
        .mountpoint(dead.path())
        .cache_dir(dead.cache_dir());
    if let Some(dir) = staging {
        mount = mount.args([std::ffi::OsString::from("--staging-dir"), dir.into()]);
    }
    mount.start()
}

/// Everything in the cache's entry directory is a finished entry (no `partial-*` or
/// `trash-*` survives a restart), and it holds exactly `expected`.
fn assert_cache_holds(mount: &MountedStore, expected: &[&str]) {
    let mut names: Vec<String> = fs::read_dir(mount.cache_dir().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "the cache after the restart");
}

fn staging_mount(
    store: &TestStore,
    staging: &Path,
    endpoint: Option<&str>,
    extra: &[&str],
) -> MountedStore {
    let mut mount =
        Mount::new(store).args([std::ffi::OsString::from("--staging-dir"), staging.into()]);
    if let Some(url) = endpoint {
        mount = mount.endpoint(url);
    }
    mount
        .args(extra.iter().map(std::ffi::OsString::from))
        .start()
}

#[test]
fn s3_kill_during_a_verification_pass() {
    let store = TestStore::s3();
    let work = repo_temp_dir("crash-verify-");
    let src = work.path().join("src");
    make_random_tree(&src, 8 << 20, 31);
    let (sha, _) = store.put(&src, &[]);
    let proxy = GatedProxy::start(&s3_endpoint(), &sha, 256 * 1024);
    let dead = Mount::new(&store).endpoint(&proxy.endpoint()).start();
    let reader = std::thread::spawn({
        let path = dead.join(&sha);
        move || fs::read_dir(path).map(|d| d.count())
    });
    assert!(proxy.wait_held(MOUNT_TIMEOUT), "the download never started");
    // The proxy may hold before the daemon has made its entry: the first bytes can sit
    // in the socket's buffer while the daemon is still starting the pass. Held, the
    // download cannot finish, so the entry in progress must appear.
    let partial = || {
        fs::read_dir(dead.cache_dir().join("checkpoints"))
            .unwrap()
            .any(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("partial-")
            })
    };
    let deadline = std::time::Instant::now() + MOUNT_TIMEOUT;
    while !partial() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(partial(), "the pass was not under way");
    kill9(&dead);
    proxy.open();
    assert!(
        reader.join().unwrap().is_err(),
        "a reader of a killed mount must fail"
    );

    let alive = restart(&store, &dead, None);
    assert_cache_holds(&alive, &[]);
    assert_same_tree(&src, &alive.join(&sha));
    assert_cache_holds(&alive, &[&sha]);
    drop(alive);
    drop(dead);
}

/// Seals `work/NAME` through `mount` on a thread; returns the rename's result.
fn seal_in_background(
    mount: &MountedStore,
    name: &str,
) -> std::thread::JoinHandle<std::io::Result<()>> {
    let (from, to) = (mount.staged(name), mount.committed(name));
    std::thread::spawn(move || fs::rename(from, to))
}

fn copy_into_staging(src: &Path, staged: &Path) {
    crate::capture::cp_a(src, staged);
}

#[test]
fn s3_kill_during_a_seal_before_during_and_after_the_upload() {
    let store = TestStore::s3();
    let work = repo_temp_dir("crash-seal-");
    let staging: PathBuf = work.path().join("staging");
    let proxy = FaultProxy::start(&s3_endpoint());
    let endpoint = proxy.endpoint();
    let cases = [
        ("before", 48 << 20),
        ("during", 16 << 20),
        ("after", 1 << 20),
    ];
    for (when, size) in cases {
        let src = work.path().join(format!("src-{when}"));
        make_random_tree(&src, size, size as u64);
        proxy.set(Fault::Pass);
        let dead = staging_mount(&store, &staging, Some(&endpoint), &["--part-size", "5MiB"]);
        copy_into_staging(&src, &dead.staged(when));
        let faulted = proxy.faulted();
        match when {
            // Compressing 48 MiB of random data takes seconds: kill while it runs.
            "before" => {}
            "during" => proxy.set(Fault::StallUploads(2 << 20)),
            _ => proxy.set(Fault::HoldUploadAnswers),
        }
        let seal = seal_in_background(&dead, when);
        match when {
            "before" => std::thread::sleep(Duration::from_millis(300)),
            _ => {
                let deadline = Instant::now() + MOUNT_TIMEOUT;
                while proxy.faulted() == faulted {
                    assert!(
                        Instant::now() < deadline,
                        "{when}: the upload never started"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                // Let the held upload reach the server.
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        kill9(&dead);
        proxy.set(Fault::Pass);
        assert!(
            seal.join().unwrap().is_err(),
            "{when}: the seal cannot have answered"
        );

        let alive = restart(&store, &dead, Some(&staging));
        // The staged workspace is intact in every case.
        assert_same_tree(&src, &alive.staged(when));
        assert_eq!(
            store.multipart_uploads(),
            Vec::<String>::new(),
            "{when}: an upload is left pending"
        );
        // Any object in the store is whole and verified.
        for key in store.list_keys() {
            let name = key.rsplit('/').next().unwrap();
            if let Some(sha) = name.strip_suffix(".tar.gz") {
                let bytes = store.object_bytes(sha).unwrap();
                assert_eq!(sha256_hex(&bytes), sha, "{when}: a damaged object was left");
            }
        }
        let log = alive.log_text();
        match when {
            "during" => assert!(
                log.contains("cleaned up an upload a killed daemon left")
                    && log.contains("aborted=1"),
                "{when}: the pending multipart upload was not abandoned:\n{log}"
            ),
            "after" => assert!(
                !store.list_keys().is_empty(),
                "{when}: the upload had not arrived"
            ),
            _ => {}
        }
        // And sealing again completes.
        fs::rename(alive.staged(when), alive.committed(when))
            .unwrap_or_else(|e| panic!("{when}: sealing again: {e}\n{}", alive.log_excerpt()));
        assert!(!alive.staged(when).exists());
        if when == "after" {
            let status = alive.status_text();
            assert!(status.contains("(already present, verified)"), "{status}");
        }
        drop(alive);
        drop(dead);
    }
}

#[test]
fn kill_while_readers_are_active() {
    let store = TestStore::local();
    let work = repo_temp_dir("crash-readers-");
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_small_tree(&a, "warm");
    make_random_tree(&b, 4 << 20, 77);
    let (sha_a, _) = store.put(&a, &[]);
    let (sha_b, _) = store.put(&b, &[]);
    let dead = Mount::new(&store).start();
    assert_same_tree(&a, &dead.join(&sha_a));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (stop, dir) = (
                std::sync::Arc::clone(&stop),
                dead.join(if i % 2 == 0 { &sha_a } else { &sha_b }),
            );
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match crate::util::tree::list_paths(&dir).len() {
                        0 => break,
                        n => reads += n as u64,
                    }
                }
                reads
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    kill9(&dead);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        // Readers see the mount die (their walk panics or ends); none may hang.
        let _ = reader.join();
    }
    let alive = restart(&store, &dead, None);
    let mut kept: Vec<String> = fs::read_dir(alive.cache_dir().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    kept.sort();
    assert!(
        kept.iter().all(|n| n == &sha_a || n == &sha_b),
        "unfinished entries survived: {kept:?}"
    );
    assert_same_tree(&a, &alive.join(&sha_a));
    assert_same_tree(&b, &alive.join(&sha_b));
    drop(alive);
    drop(dead);
}
