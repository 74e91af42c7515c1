//! A store that fails: downloads cut part-way, 500 and 503 answers, a server that goes
//! away and comes back, a slow server, a stalled download. The mount keeps serving
//! what it has, answers EIO with a reason for what it cannot verify, never serves or
//! keeps anything unverified, and recovers on its own once the store is back.
//!
//! Each test puts a [`FaultProxy`] between the mount and the S3 test server and
//! changes its fault while the mount runs.

use std::fs;
use std::time::{Duration, Instant};

use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::proxy::{Fault, FaultProxy};
use crate::util::tree::{assert_same_tree, make_random_tree, make_small_tree};
use crate::util::{TestStore, ckptfs, run, s3_endpoint};

/// Verified checkpoints in the mount's cache, and anything else found there.
fn cache_entries(mount: &MountedStore) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(mount.cache_dir().join("checkpoints"))
        .map(|dir| {
            dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Lists directory `path` whole (opening a directory asks nothing of the daemon: the
/// first `readdir` is what meets a checkpoint's state).
fn list(path: &std::path::Path) -> std::io::Result<usize> {
    fs::read_dir(path)?
        .map(|e| e.map(drop))
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.len())
}

/// Retries `read` until it succeeds or `limit` passes (failures are remembered for a
/// second before a checkpoint is tried again).
fn eventually<T>(
    limit: Duration,
    mut read: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        match read() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

#[test]
fn s3_a_download_cut_part_way_leaves_nothing_unverified_and_recovers() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fault-cut-");
    let src = work.path().join("src");
    make_random_tree(&src, 4 << 20, 21);
    let (sha, _) = store.put(&src, &[]);
    let proxy = FaultProxy::start(&s3_endpoint());
    let mount = Mount::new(&store).endpoint(&proxy.endpoint()).start();
    // Every download is cut after 64 KiB, however often it is retried.
    proxy.set(Fault::CutAfter(64 * 1024));
    let err = list(&mount.join(&sha)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let state = mount.status().state(&sha).to_owned();
    assert!(state.starts_with("FAILED: "), "{state}");
    assert!(
        proxy.faulted() >= 3,
        "the load was tried {} times",
        proxy.faulted()
    );
    assert_eq!(
        cache_entries(&mount),
        Vec::<String>::new(),
        "nothing unverified is kept"
    );
    // The store answers again: the next access serves the checkpoint, right.
    proxy.set(Fault::Pass);
    if let Err(e) = eventually(Duration::from_secs(30), || list(&mount.join(&sha))) {
        panic!(
            "{sha} still unreadable: {e}\ndaemon log:\n{}",
            mount.log_text()
        );
    }
    assert_same_tree(&src, &mount.join(&sha));
    assert_eq!(cache_entries(&mount), vec![sha.clone()]);
    assert_eq!(mount.status().state(&sha), "verified");
}

#[test]
fn s3_transient_server_errors_are_retried() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fault-503-");
    let proxy = FaultProxy::start(&s3_endpoint());
    let mount = Mount::new(&store)
        .endpoint(&proxy.endpoint())
        .args(["--refresh", "0.5"])
        .start();
    for code in [503, 500] {
        let src = work.path().join(format!("src-{code}"));
        make_small_tree(&src, &format!("retried-{code}"));
        let (sha, _) = store.put(&src, &[]);
        // Listings are spaced by the time the last one took (nine times it): on a
        // busy machine where moto answers slowly, the next may be many seconds away.
        eventually(Duration::from_secs(60), || {
            fs::symlink_metadata(mount.join(&sha))
        })
        .unwrap();
        // A second of errors, then the server is fine: the first access succeeds.
        proxy.set(Fault::Status(code));
        let before = proxy.faulted();
        let reader = std::thread::spawn({
            let path = mount.join(&sha);
            move || list(&path)
        });
        std::thread::sleep(Duration::from_secs(1));
        proxy.set(Fault::Pass);
        let listed = reader.join().unwrap();
        assert!(
            listed.is_ok(),
            "HTTP {code}: {listed:?}\n{}",
            mount.log_excerpt()
        );
        assert!(
            proxy.faulted() > before,
            "HTTP {code}: no request met the fault"
        );
        assert_same_tree(&src, &mount.join(&sha));
    }
}

#[test]
fn s3_a_store_unreachable_at_mount_time_gives_one_clear_line() {
    let store = TestStore::s3();
    let proxy = FaultProxy::start(&s3_endpoint());
    proxy.set(Fault::Down);
    let work = repo_temp_dir("fault-down-");
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let started = Instant::now();
    let out = run(ckptfs()
        .env("AWS_ENDPOINT_URL", proxy.endpoint())
        .arg("mount")
        .arg(store.url())
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(work.path().join("cache")))
    .failure();
    let line = out.one_line_error();
    assert!(line.contains(&store.url()), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn s3_a_running_mount_survives_the_store_going_away_and_coming_back() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fault-away-");
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_small_tree(&a, "first");
    make_small_tree(&b, "second");
    let (sha_a, _) = store.put(&a, &[]);
    let (sha_b, _) = store.put(&b, &[]);
    let proxy = FaultProxy::start(&s3_endpoint());
    let mount = Mount::new(&store)
        .endpoint(&proxy.endpoint())
        .args(["--refresh", "0.5"])
        .start();
    assert_same_tree(&a, &mount.join(&sha_a));

    proxy.set(Fault::Down);
    // Each step waits up to WAIT (a load under a dead store takes about 10 s of
    // retries) and fails with the daemon's log, which says what it was doing.
    const WAIT: Duration = Duration::from_secs(30);
    let log = || format!("daemon log:\n{}", mount.log_text());
    // What is verified keeps being served; what is not answers EIO with a reason.
    assert_same_tree(&a, &mount.join(&sha_a));
    let err = list(&mount.join(&sha_b)).expect_err(&log());
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}\n{}", log());
    let listing_failed = eventually(WAIT, || {
        let text = mount.status_text();
        if text.contains("# listing failed: ") {
            Ok(text)
        } else {
            Err(std::io::Error::other("not yet"))
        }
    });
    assert!(listing_failed.is_ok(), "{}\n{}", mount.status_text(), log());
    // The root still lists both checkpoints (from the last good listing).
    let root: Vec<_> = fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        root.iter().any(|n| n.to_str() == Some(sha_b.as_str())),
        "{root:?}\n{}",
        log()
    );

    proxy.set(Fault::Pass);
    if let Err(e) = eventually(WAIT, || list(&mount.join(&sha_b))) {
        panic!("{sha_b} still unreadable: {e}\n{}", log());
    }
    assert_same_tree(&b, &mount.join(&sha_b));
    let recovered = eventually(WAIT, || {
        if mount.status_text().contains("listing failed") {
            Err(std::io::Error::other("still failing"))
        } else {
            Ok(())
        }
    });
    assert!(recovered.is_ok(), "{}\n{}", mount.status_text(), log());
}

#[test]
fn s3_a_slow_or_stalled_store_delays_only_what_it_serves() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fault-slow-");
    let (small, big) = (work.path().join("small"), work.path().join("big"));
    make_small_tree(&small, "small");
    make_random_tree(&big, 2 << 20, 5);
    let (sha_small, _) = store.put(&small, &[]);
    let (sha_big, _) = store.put(&big, &[]);
    let proxy = FaultProxy::start(&s3_endpoint());
    let mount = Mount::new(&store).endpoint(&proxy.endpoint()).start();

    // Stalled: the big checkpoint's first access waits; the root and `.status` answer.
    proxy.set(Fault::Stall);
    let reader = std::thread::spawn({
        let path = mount.join(&sha_big);
        move || list(&path)
    });
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    assert!(fs::read_dir(mount.path()).unwrap().count() > 2);
    assert!(mount.status_text().contains(&format!("{sha_big}  ")));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the root waited {:?}",
        started.elapsed()
    );
    // Slow, then: correct, just late; and the small one loads meanwhile.
    proxy.set(Fault::Slow(1 << 20));
    assert_same_tree(&small, &mount.join(&sha_small));
    assert!(reader.join().unwrap().is_ok());
    assert_same_tree(&big, &mount.join(&sha_big));
}

#[test]
fn s3_a_download_that_stalls_for_good_fails_with_a_reason_instead_of_hanging() {
    let store = TestStore::s3();
    let work = repo_temp_dir("fault-stall-");
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_small_tree(&a, "fine");
    make_random_tree(&b, 2 << 20, 6);
    let (sha_a, _) = store.put(&a, &[]);
    let (sha_b, _) = store.put(&b, &[]);
    let proxy = FaultProxy::start(&s3_endpoint());
    let mount = Mount::new(&store)
        .endpoint(&proxy.endpoint())
        .args(["--stall-timeout", "1"])
        .start();
    proxy.set(Fault::Stall);
    let started = Instant::now();
    let err = list(&mount.join(&sha_b)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // Three attempts, each given up after a second of silence, with backoff between.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let state = mount.status().state(&sha_b).to_owned();
    assert!(state.contains("stalled"), "{state}");
    proxy.set(Fault::Pass);
    assert_same_tree(&a, &mount.join(&sha_a));
    if let Err(e) = eventually(Duration::from_secs(30), || list(&mount.join(&sha_b))) {
        panic!(
            "{sha_b} still unreadable: {e}\ndaemon log:\n{}",
            mount.log_text()
        );
    }
    assert_same_tree(&b, &mount.join(&sha_b));
}
