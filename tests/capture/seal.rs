//! Sealing: `mv staging/NAME commit/` stores exactly what `ckptfs put` would, makes it
//! browsable at once without a download, and is safe between replicas.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{cp_a, make_workspace, sh, tar_xzf};
use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::tree::{
    assert_same_tree, fix_mtimes, make_random_tree, make_small_tree, make_turn_tree,
};
use crate::util::{
    TestStore, assert_recent_capture_time, ckptfs, is_sha256_hex, logged_count, parse_put_output,
    parse_verify_output, run, sha256_hex,
};

/// Asserts that `staging/NAME` is gone, on the mount and on the backing disk.
#[track_caller]
fn assert_unstaged(mount: &MountedStore, name: &str) {
    let staged = mount.staged(name);
    assert!(
        fs::symlink_metadata(&staged).is_err(),
        "staging/{name} still exists after its seal"
    );
    assert!(
        !mount.staging_dir().join(name).exists(),
        "the staged copy of {name} is still on disk"
    );
}

#[test]
fn a_workspace_sealed_with_mv_is_what_put_stores() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-seal-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    let mount = Mount::new(&store).staging().start();

    cp_a(&tree, &mount.staged("turn-1"));
    assert_same_tree(&tree, &mount.staged("turn-1"));

    // The documented idiom, exactly: the link is there as soon as `mv` returns.
    let out = sh(
        r#"mv "$1/staging/turn-1" "$1/commit/" && readlink "$1/commit/turn-1""#,
        &[mount.path()],
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let target = out.stdout.trim();
    let sha = target
        .strip_prefix("../")
        .unwrap_or_else(|| panic!("readlink printed {target:?}, expected ../<sha256>"));
    assert!(is_sha256_hex(sha), "readlink printed {target:?}");
    let sha = sha.to_owned();
    assert_unstaged(&mount, "turn-1");
    let listed: Vec<_> = fs::read_dir(mount.join("commit"))
        .expect("list commit/")
        .map(|e| e.expect("commit/ entry").file_name())
        .collect();
    assert_eq!(listed, ["turn-1"], "commit/ lists the sealed workspace");

    // The object: named by its digest, with the metadata other readers rely on.
    assert_eq!(
        store.list_keys(),
        [TestStore::object_name(&sha)],
        "one object"
    );
    let bytes = store.object_bytes(&sha).expect("the sealed object exists");
    assert_eq!(sha256_hex(&bytes), sha, "the object hashes to its name");
    let meta = store.object_meta(&sha).expect("the object's metadata");
    assert_eq!(
        (meta.sha256.as_deref(), meta.size.clone()),
        (Some(sha.as_str()), Some(bytes.len().to_string()))
    );
    assert_recent_capture_time(&meta);
    assert!(
        store.multipart_uploads().is_empty(),
        "no upload left pending"
    );

    // What `tar -xzf` restores from it is the workspace.
    let extracted = work.path().join("extracted");
    tar_xzf(&bytes, &extracted);
    assert_same_tree(&tree, &extracted);

    // Browsable at once, without a download.
    assert_same_tree(&tree, &mount.join(&sha));
    let diff = run(std::process::Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&tree)
        .arg(mount.join(&sha)));
    assert!(diff.status.success(), "{diff}");
    let status = mount.status_text();
    assert!(
        status.contains(&format!("# seal turn-1: sealed as {sha} (stored)\n")),
        "{status}"
    );
    assert!(!status.contains("# seal in progress"), "{status}");
    assert_eq!(mount.downloads(), 0, "{status}");
    assert_eq!(
        fs::read_link(mount.join("latest")).expect("readlink latest"),
        Path::new(&sha),
        "latest names the new checkpoint"
    );
    let by_time: Vec<String> = fs::read_dir(mount.join("by-time"))
        .expect("list by-time/")
        .map(|e| e.expect("by-time entry").file_name().into_string().unwrap())
        .collect();
    assert!(
        by_time
            .iter()
            .any(|n| n.ends_with(&format!("-{}", &sha[..12]))),
        "by-time/ does not list the new checkpoint: {by_time:?}"
    );

    // The same tree again, through the mount and with `put`: same digest, no upload.
    let stamp = store.object_stamp(&sha);
    std::thread::sleep(Duration::from_millis(1100)); // a new upload would change LastModified
    cp_a(&tree, &mount.staged("turn-2"));
    fs::rename(mount.staged("turn-2"), mount.committed("turn-2"))
        .unwrap_or_else(|e| panic!("sealing the same tree again: {e}\n{}", mount.log_excerpt()));
    assert_eq!(mount.commit_target("turn-2"), sha, "same tree, same digest");
    assert_unstaged(&mount, "turn-2");
    assert_eq!(store.object_stamp(&sha), stamp, "the object was rewritten");

    let out = run(ckptfs().arg("put").arg(store.url()).arg(&tree)).success();
    assert_eq!(
        parse_put_output(&out),
        (sha.clone(), bytes.len() as u64),
        "put gives the digest the mount gave"
    );
    assert!(out.stderr.contains("already present"), "{out}");
    assert_eq!(store.object_stamp(&sha), stamp, "put rewrote the object");
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);

    assert_same_tree(&tree, &mount.join(&sha));
    assert_eq!(mount.downloads(), 0, "{}", mount.status_text());
}

#[test]
fn two_replicas_sealing_the_same_tree_at_once_leave_one_object() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-replicas-");
    let tree = work.path().join("tree");
    // Above the part size: both replicas race through a multipart upload.
    make_random_tree(&tree, 7 * 1024 * 1024, 21);
    make_small_tree(&tree.join("notes"), "replicas");
    fix_mtimes(&tree);
    let mounts: Vec<MountedStore> = (0..2)
        .map(|_| Mount::new(&store).staging().part_size("5MiB").start())
        .collect();
    for mount in &mounts {
        cp_a(&tree, &mount.staged("turn"));
    }

    let barrier = Barrier::new(mounts.len());
    let results: Vec<_> = std::thread::scope(|s| {
        let sealers: Vec<_> = mounts
            .iter()
            .map(|mount| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    fs::rename(mount.staged("turn"), mount.committed("turn"))
                })
            })
            .collect();
        sealers
            .into_iter()
            .map(|t| t.join().expect("sealer thread"))
            .collect()
    });
    for (mount, result) in mounts.iter().zip(&results) {
        assert!(
            result.is_ok(),
            "a replica's seal failed: {result:?}\n{}",
            mount.log_excerpt()
        );
    }

    let shas: Vec<String> = mounts.iter().map(|m| m.commit_target("turn")).collect();
    assert_eq!(shas[0], shas[1], "both replicas name the same checkpoint");
    let sha = &shas[0];
    assert_eq!(store.list_keys(), [TestStore::object_name(sha)]);
    assert!(
        store.multipart_uploads().is_empty(),
        "pending uploads: {:?}",
        store.multipart_uploads()
    );
    let out = run(ckptfs().arg("verify").arg(store.url())).success();
    let verdicts = parse_verify_output(&out);
    assert_eq!(verdicts.len(), 1, "{out}");
    assert_eq!(verdicts[sha], "ok", "{out}");
    for mount in &mounts {
        assert_unstaged(mount, "turn");
        assert_same_tree(&tree, &mount.join(sha));
        assert_eq!(mount.downloads(), 0, "{}", mount.status_text());
    }
}

#[test]
fn resealing_the_same_tree_keeps_its_checkpoint_readable() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-reseal-");
    let tree = work.path().join("tree");
    make_random_tree(&tree, 8 * 1024 * 1024, 51);
    let mount = Mount::new(&store).staging().start();
    cp_a(&tree, &mount.staged("turn-0"));
    fs::rename(mount.staged("turn-0"), mount.committed("turn-0"))
        .unwrap_or_else(|e| panic!("first seal: {e}\n{}", mount.log_excerpt()));
    let sha = mount.commit_target("turn-0");
    let blob = mount.join(&sha).join("blob.bin");
    let expected = fs::read(tree.join("blob.bin")).expect("read the original");

    // One reader opens and reads the checkpoint's big file again and again while the
    // same tree is sealed again: an already-present checkpoint must stay readable.
    let stop = AtomicBool::new(false);
    let (reads, failures) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut reads, mut failures) = (0u32, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                // Only the head, so that opens come often.
                let mut head = vec![0u8; 64 * 1024];
                match fs::File::open(&blob).and_then(|f| f.read_exact_at(&mut head, 0)) {
                    Ok(()) if head[..] == expected[..head.len()] => {}
                    Ok(()) => failures.push("read wrong bytes".to_owned()),
                    Err(e) => failures.push(e.to_string()),
                }
                reads += 1;
            }
            (reads, failures)
        });
        for i in 1..=4 {
            let name = format!("turn-{i}");
            cp_a(&tree, &mount.staged(&name));
            let sealed = fs::rename(mount.staged(&name), mount.committed(&name));
            if let Err(e) = sealed {
                stop.store(true, Ordering::SeqCst);
                panic!("reseal {name}: {e}\n{}", mount.log_excerpt());
            }
            assert_eq!(mount.commit_target(&name), sha);
        }
        stop.store(true, Ordering::SeqCst);
        reader.join().expect("reader thread")
    });
    assert!(reads > 0);
    assert!(
        failures.is_empty(),
        "{} of {reads} reads of {sha}/blob.bin failed while the same tree was sealed \
         again: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        mount.log_excerpt()
    );
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);
}

/// A replica that only opened turn N (another machine captured it) seals turn N+1,
/// a copy with one file changed, compressing and sending little more than that file:
/// the mount recorded the layout of turn N's object when it downloaded and verified
/// it (the store copies the members the two turns share), and the copy into
/// `staging/` made it put turn N's members in its member cache in the background.
/// The object is the one `ckptfs put` makes of that tree.
#[test]
fn a_replica_that_opened_turn_n_seals_turn_n_plus_1_by_its_change_only() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-replica-");
    let (turn_n, turn_n1) = (work.path().join("n"), work.path().join("n1"));
    make_turn_tree(&turn_n, 60, None);
    make_turn_tree(&turn_n1, 60, Some(30));
    // Captured elsewhere: no member cache, so no layout but the mount's own.
    let put = |tree: &Path, store: &TestStore| {
        let out = run(ckptfs()
            .arg("put")
            .arg(store.url())
            .arg(tree)
            .args(["--member-cache-size", "0"]))
        .success();
        parse_put_output(&out)
    };
    let (sha_n, _) = put(&turn_n, &store);
    let (want, size) = put(&turn_n1, &TestStore::local());

    let mount = Mount::new(&store).staging().part_size("5MiB").start();
    let staged = mount.staged("turn-n1");
    fs::create_dir(&staged).unwrap();
    cp_a(&mount.join(&sha_n).join("."), &staged);
    cp_a(&turn_n1.join("f030.bin"), &staged.join("f030.bin"));
    // As while an agent works on the turn: the priming ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let primed = loop {
        let log = mount.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("member cache primed")) {
            break logged_count(line, "members");
        }
        assert!(std::time::Instant::now() < deadline, "never primed:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(primed >= 60, "{primed} members primed");
    fs::rename(&staged, mount.committed("turn-n1"))
        .unwrap_or_else(|e| panic!("seal turn N+1: {e}\n{}", mount.log_excerpt()));
    assert_eq!(
        mount.commit_target("turn-n1"),
        want,
        "not the tree put makes"
    );

    let log = mount.log_text();
    let sealed = log.lines().rfind(|l| l.contains(" sealed ")).unwrap();
    let compressed = logged_count(sealed, "members_compressed");
    assert!(
        compressed <= 2,
        "the seal compressed {compressed} members: {sealed}"
    );
    let (sent, copied) = (logged_count(sealed, "sent"), logged_count(sealed, "copied"));
    assert_eq!(sent + copied, size, "{sealed}");
    assert!(sent <= 10 << 20 && copied >= 8 << 20, "{sealed}");
    let bytes = store.object_bytes(&want).expect("the sealed object");
    assert_eq!(sha256_hex(&bytes), want);
}

/// A workspace started with `cp -a MNT/<sha>/. staging/NAME/` (the kernel copies
/// large files with `copy_file_range`, which the mount sees) records that checkpoint
/// as its parent when sealed, and `log` compares the new turn with it; a workspace
/// made from a local directory records none.
#[test]
fn a_workspace_copied_from_one_checkpoint_records_it_as_its_parent() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-parent-");
    let tree = work.path().join("tree");
    make_workspace(&tree);
    let (first, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store).staging().start();

    let seal = |name: &str| -> String {
        let out = sh(
            r#"mv "$1/staging/$2" "$1/commit/" && readlink "$1/commit/$2""#,
            &[mount.path(), Path::new(name)],
        );
        assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
        out.stdout.trim().trim_start_matches("../").to_owned()
    };
    let from_checkpoint = mount.staged("from-checkpoint");
    run(std::process::Command::new("cp")
        .arg("-a")
        .arg(mount.join(&first).join("."))
        .arg(&from_checkpoint))
    .success();
    fs::write(from_checkpoint.join("changed.txt"), "a change\n").unwrap();
    let second = seal("from-checkpoint");
    let meta = store.object_meta(&second).expect("the sealed object");
    assert_eq!(
        meta.parent.as_deref(),
        Some(first.as_str()),
        "{}",
        mount.log_excerpt()
    );

    cp_a(&tree, &mount.staged("from-disk"));
    fs::write(mount.staged("from-disk").join("other.txt"), "other\n").unwrap();
    let third = seal("from-disk");
    assert_eq!(
        store.object_meta(&third).expect("the sealed object").parent,
        None
    );

    let log = store.cmd("log", [] as [&str; 0]).success();
    let line = log
        .lines()
        .into_iter()
        .find(|l| l.contains(&second[..12]))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("+1 ~0 -0")
            && line.ends_with(&format!("parent {} (from metadata)", &first[..12])),
        "{}",
        log.stdout
    );
}
