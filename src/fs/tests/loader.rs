//! The loader: one download per checkpoint however many wait for it, a bounded pool,
//! retries of broken transfers, remembered failures, eviction.

use std::sync::atomic::Ordering;

use super::*;

#[test]
fn concurrent_first_accesses_share_one_download() {
    let (f, ids) = fixture(&[&[("a", b"1")]]);
    f.faults.get_delay_ms.store(300, Ordering::SeqCst);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    let (tx, rx) = mpsc::channel();
    for _ in 0..16 {
        let tx = tx.clone();
        f.fs.prepare(dir, Reading::Readdir, move |fs| {
            tx.send(fs.lookup(dir, b"a").map(|e| e.attr.size)).unwrap()
        });
    }
    for _ in 0..16 {
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap(),
            1
        );
    }
    assert_eq!(f.faults.gets.load(Ordering::SeqCst), 1);
}

#[test]
fn first_accesses_beyond_the_pool_wait_in_order() {
    let trees: Vec<Vec<(String, Vec<u8>)>> = (0..5)
        .map(|i| vec![(format!("f{i}"), vec![i as u8])])
        .collect();
    let trees: Vec<Vec<(&str, &[u8])>> = trees
        .iter()
        .map(|t| t.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect())
        .collect();
    let refs: Vec<&[(&str, &[u8])]> = trees.iter().map(|t| t.as_slice()).collect();
    let (f, ids) = fixture_with(
        &refs,
        Options {
            loaders: 1,
            ..Options::default()
        },
    );
    f.faults.get_delay_ms.store(200, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel();
    for (i, id) in ids.iter().enumerate() {
        let tx = tx.clone();
        f.fs.prepare(checkpoint_dir(&f.fs, id), Reading::Opendir, move |_| {
            tx.send(i).unwrap()
        });
    }
    // One loader: the others wait, and are served in the order they came.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        status(&f.fs).contains("# loads waiting for a loader: 4"),
        "{}",
        status(&f.fs)
    );
    let order: Vec<usize> = (0..5)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    assert_eq!(order, [0, 1, 2, 3, 4]);
}

#[test]
fn a_download_cut_part_way_is_retried_and_leaves_nothing_unverified() {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let (f, ids) = fixture(&[&[("big", &big)]]);
    f.faults.cut_after.store(200, Ordering::SeqCst);
    f.faults.cut_gets.store(1, Ordering::SeqCst);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    let file = f.fs.lookup(dir, b"big").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, file), big);
    assert_eq!(
        f.faults.gets.load(Ordering::SeqCst),
        2,
        "one cut download, one retry"
    );
    // Nothing half-written is left beside the verified entry.
    let entries: Vec<_> = std::fs::read_dir(&f.cache_entries)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, vec![ids[0].to_string()]);
}

#[test]
fn persistent_failures_answer_eio_and_are_tried_again_later() {
    let (f, ids) = fixture(&[&[("a", b"1")]]);
    f.faults.cut_after.store(0, Ordering::SeqCst);
    f.faults.cut_gets.store(100, Ordering::SeqCst);
    let dir = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, dir);
    assert_eq!(f.fs.opendir(dir).unwrap_err().errno(), libc::EIO);
    assert_eq!(
        f.faults.gets.load(Ordering::SeqCst),
        3,
        "three attempts with backoff"
    );
    // Within a second, the failure is answered as is; after it, tried again.
    wait_loaded(&f.fs, dir);
    assert_eq!(f.faults.gets.load(Ordering::SeqCst), 3);
    f.faults.cut_gets.store(0, Ordering::SeqCst);
    std::thread::sleep(crate::fs::loader::FAILURE_REUSE);
    wait_loaded(&f.fs, dir);
    assert_eq!(names(&f.fs, dir), [".", "..", "a"]);
}

#[test]
fn eviction_keeps_the_bound_and_spares_open_files() {
    let blob = |seed: u8| -> Vec<u8> {
        (0..100_000u32)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect()
    };
    let (a, b, c) = (blob(3), blob(5), blob(7));
    let (f, ids) = fixture_with(
        &[&[("f", &a)], &[("f", &b)], &[("f", &c)]],
        Options {
            cache_bytes: 150_000,
            ..Options::default()
        },
    );
    let dirs: Vec<u64> = ids.iter().map(|id| checkpoint_dir(&f.fs, id)).collect();
    wait_loaded(&f.fs, dirs[0]);
    let file0 = f.fs.lookup(dirs[0], b"f").unwrap().attr.ino;
    let open = f.fs.open(file0, libc::O_RDONLY).unwrap();
    wait_loaded(&f.fs, dirs[1]);
    wait_loaded(&f.fs, dirs[2]);
    // 0 is open and 2 was just loaded: 1 had to go.
    // Two entries of 100,000 bytes of contents, and their small indexes.
    assert!(
        f.cache.stats().used_bytes < 210_000,
        "{:?}",
        f.cache.stats()
    );
    assert_eq!(
        f.fs.read(file0, open.fh, 0, 100_000).unwrap(),
        a,
        "an open file keeps its checkpoint"
    );
    assert!(status(&f.fs).contains(&format!("{}  ", ids[1])));
    f.fs.release(open.fh);
    // An evicted checkpoint loads again on access.
    let gets = f.faults.gets.load(Ordering::SeqCst);
    wait_loaded(&f.fs, dirs[1]);
    let file1 = f.fs.lookup(dirs[1], b"f").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, file1), b);
    assert_eq!(f.faults.gets.load(Ordering::SeqCst), gets + 1);
}

/// A mount that stops at once, while its loaders are still starting, stops: a loader
/// between its look at the stop flag and its wait must not miss the wake-up (a test
/// run once hung so, in the loader's drop). Four threads at once, so that loaders are
/// preempted there.
#[test]
fn a_filesystem_dropped_as_it_starts_stops_its_loaders() {
    let (done, finished) = mpsc::channel();
    for _ in 0..4 {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..1000 {
                drop(fixture(&[]));
            }
            let _ = done.send(());
        });
    }
    for _ in 0..4 {
        assert!(
            finished.recv_timeout(Duration::from_secs(120)).is_ok(),
            "a loader never stopped"
        );
    }
}

/// Loaded indexes stay within the memory budget: a checkpoint nobody uses is unloaded
/// to make room for the index a load may build (it stays on disk and loads again from
/// there, with no download), and an archive whose index alone would take more than
/// half the budget is refused, with the limit named in `.status`.
#[test]
fn loaded_indexes_stay_within_the_memory_budget() {
    use crate::archive::index::{BUILD_NODE_MEMORY, CHILD_MEMORY, NODE_MEMORY};
    let tree = |prefix: char, n: usize| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| (format!("{prefix}{i:04}"), b"x".to_vec()))
            .collect()
    };
    let mut trees: Vec<_> = "abcdef".chars().map(|c| tree(c, 200)).collect();
    trees.push(tree('g', 2000));
    let borrowed: Vec<Vec<(&str, &[u8])>> = trees
        .iter()
        .map(|t| t.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect())
        .collect();
    let refs: Vec<&[(&str, &[u8])]> = borrowed.iter().map(Vec::as_slice).collect();
    // Half the budget is room for one small index being built (200 entries, names of
    // 5 bytes); the other half holds `kept` of them loaded (201 nodes each).
    // (and the archive's root, `./`, 2 bytes of path).
    let building = 200 * (BUILD_NODE_MEMORY + 5) + BUILD_NODE_MEMORY + 2;
    let loaded = 201 * NODE_MEMORY + 200 * (CHILD_MEMORY + 5);
    let kept = (building / loaded) as usize;
    assert!((1..5).contains(&kept), "sizes changed: {building} {loaded}");
    let (f, ids) = fixture_with(
        &refs,
        Options {
            memory_budget: 2 * building,
            loaders: 1,
            ..Options::default()
        },
    );
    let dirs: Vec<u64> = ids.iter().map(|id| checkpoint_dir(&f.fs, id)).collect();
    let state = |i: usize| -> String {
        let text = status(&f.fs);
        text.lines()
            .find(|l| l.starts_with(ids[i].as_str()))
            .unwrap_or_else(|| panic!("no line for {i}:\n{text}"))
            .to_owned()
    };
    for &dir in &dirs[..6] {
        wait_loaded(&f.fs, dir);
    }
    // Before the sixth load, `kept` stayed: the oldest went.
    for i in 0..6 {
        if i < 5 - kept {
            assert!(state(i).ends_with("listed"), "unloaded: {}", state(i));
        } else {
            assert!(state(i).contains("verified"), "{}", state(i));
        }
    }
    // It loads again from disk.
    let gets = f.faults.gets.load(Ordering::SeqCst);
    wait_loaded(&f.fs, dirs[0]);
    assert_eq!(names(&f.fs, dirs[0]).len(), 202);
    assert_eq!(f.faults.gets.load(Ordering::SeqCst), gets, "no download");
    // Too large for the budget alone.
    wait_loaded(&f.fs, dirs[6]);
    assert!(state(6).contains("half of --memory-budget"), "{}", state(6));
}

/// Loads at once reserve what their archives may build (see `index_estimate`), not
/// half the budget each: two small loads running together once reserved the whole
/// budget and unloaded every idle checkpoint, which then had to be re-checked on its
/// next use.
#[test]
fn small_loads_at_once_unload_nothing() {
    let trees: Vec<Vec<(String, Vec<u8>)>> = (0..8)
        .map(|t| {
            (0..50)
                .map(|i| (format!("t{t}-{i}"), vec![b'x'; 10]))
                .collect()
        })
        .collect();
    let borrowed: Vec<Vec<(&str, &[u8])>> = trees
        .iter()
        .map(|t| t.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect())
        .collect();
    let refs: Vec<&[(&str, &[u8])]> = borrowed.iter().map(Vec::as_slice).collect();
    let (f, ids) = fixture_with(
        &refs,
        Options {
            memory_budget: 64 << 20,
            loaders: 2,
            ..Options::default()
        },
    );
    let fs = Arc::clone(&f.fs);
    let dirs: Vec<u64> = ids.iter().map(|id| checkpoint_dir(&fs, id)).collect();
    for round in dirs.chunks(2) {
        let threads: Vec<_> = round
            .iter()
            .map(|&dir| {
                let fs = Arc::clone(&fs);
                std::thread::spawn(move || wait_loaded(&fs, dir))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
    let text = status(&fs);
    for id in &ids {
        let line = text.lines().find(|l| l.starts_with(id.as_str())).unwrap();
        assert!(line.contains("verified"), "unloaded: {line}\n{text}");
    }
}
