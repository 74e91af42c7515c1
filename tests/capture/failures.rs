//! Seals that fail: the rename answers an errno, `staging/NAME` stays exactly as it was,
//! and the bucket holds no object and no pending multipart upload.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::Duration;

use super::cp_a;
use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::proxy::CuttingProxy;
use crate::util::sys::assert_errno;
use crate::util::tree::{assert_same_tree, make_random_tree, make_small_tree, write_file};
use crate::util::{
    TestStore, assert_recent_capture_time, ckptfs, parse_verify_output, run, s3_endpoint,
};

/// Asserts what every failed seal leaves: the staged workspace as it was, nothing under
/// `commit/`, an empty bucket, and the failure in `.status`.
#[track_caller]
fn assert_nothing_sealed(
    mount: &MountedStore,
    store: &TestStore,
    name: &str,
    tree: &std::path::Path,
) {
    assert_same_tree(tree, &mount.staged(name));
    assert!(
        fs::symlink_metadata(mount.committed(name)).is_err(),
        "commit/{name} exists after a failed seal"
    );
    assert_eq!(
        store.list_keys(),
        Vec::<String>::new(),
        "objects left behind"
    );
    assert_eq!(
        store.multipart_uploads(),
        Vec::<String>::new(),
        "multipart uploads left behind"
    );
    let status = mount.status_text();
    assert!(
        status.contains(&format!("# seal {name}: FAILED: ")),
        "the failure is not in .status:\n{status}"
    );
    assert!(!status.contains("# seal in progress"), "{status}");
    // Thawed: the workspace takes changes again (at its top, whose own metadata the
    // tree comparison leaves out).
    let scratch = mount.staged(name).join("scratch");
    fs::write(&scratch, b"thawed\n").expect("write into the workspace after the failure");
    fs::remove_file(&scratch).expect("unlink in the workspace after the failure");
    let leftovers: Vec<_> = fs::read_dir(mount.cache_dir().join("tmp"))
        .map(|dir| dir.map(|e| e.expect("tmp entry").file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "temporary archives left: {leftovers:?}"
    );
}

#[test]
fn a_workspace_over_the_archive_limit_fails_with_efbig() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-efbig-");
    let tree = work.path().join("tree");
    make_random_tree(&tree, 3 * 1024 * 1024, 31);
    let mount = Mount::new(&store)
        .staging()
        .max_archive_size("1MiB")
        .start();
    cp_a(&tree, &mount.staged("big"));

    let seal = || fs::rename(mount.staged("big"), mount.committed("big"));
    assert_errno(
        "sealing 3 MiB of random data under a 1 MiB limit",
        seal(),
        libc::EFBIG,
    );
    assert_nothing_sealed(&mount, &store, "big", &tree);
    // Failing again changes nothing.
    assert_errno("sealing it again", seal(), libc::EFBIG);
    assert_nothing_sealed(&mount, &store, "big", &tree);

    // The mount is still fine: a workspace within the limit seals.
    let small = work.path().join("small");
    make_small_tree(&small, "within-the-limit");
    cp_a(&small, &mount.staged("small"));
    fs::rename(mount.staged("small"), mount.committed("small"))
        .unwrap_or_else(|e| panic!("sealing a small workspace: {e}\n{}", mount.log_excerpt()));
    let sha = mount.commit_target("small");
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);
    assert_same_tree(&tree, &mount.staged("big"));
}

/// A seal refuses what the mount's own limits would refuse to read back (here more
/// entries than `--max-entries`): before, it stored the archive and deleted the
/// workspace, and `commit/NAME` then answered EIO.
#[test]
fn a_workspace_the_mount_could_not_read_back_fails_with_efbig() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-entries-");
    let tree = work.path().join("tree");
    for i in 0..150 {
        write_file(&tree.join(format!("f{i:03}")), b"x\n", 0o644);
    }
    let mount = Mount::new(&store)
        .staging()
        .args(["--max-entries", "100"])
        .start();
    cp_a(&tree, &mount.staged("many"));
    assert_errno(
        "sealing 150 files under --max-entries 100",
        fs::rename(mount.staged("many"), mount.committed("many")),
        libc::EFBIG,
    );
    assert_nothing_sealed(&mount, &store, "many", &tree);
    let status = mount.status_text();
    assert!(
        status.contains("--max-entries"),
        "the limit is named:\n{status}"
    );
}

#[test]
fn a_seal_whose_upload_is_cut_fails_with_eio_and_a_retry_succeeds() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-eio-");
    let tree = work.path().join("tree");
    make_random_tree(&tree, 15 * 1024 * 1024, 41);
    // Declared before the mount, so that it outlives the daemon that talks through it.
    let proxy = CuttingProxy::start(&s3_endpoint(), 1024 * 1024);
    let mount = Mount::new(&store)
        .staging()
        .endpoint(&proxy.endpoint())
        .part_size("5MiB")
        .start();
    cp_a(&tree, &mount.staged("turn"));

    let seal = || fs::rename(mount.staged("turn"), mount.committed("turn"));
    // While the upload is retried, the seal shows in `.status` and the workspace's
    // files cannot be written; files elsewhere in staging/ can. (Only operations that
    // take no lock held by the kernel for the rename are tried: it locks staging/,
    // commit/ and the workspace directory itself until the seal ends.)
    write_file(&mount.staged("other/notes.txt"), b"elsewhere\n", 0o644);
    let (result, tried_during_seal) = std::thread::scope(|s| {
        let sealer = s.spawn(seal);
        let mut tried = false;
        while !sealer.is_finished() {
            if !tried && mount.status_text().contains("# seal in progress: turn\n") {
                let writer = OpenOptions::new()
                    .write(true)
                    .open(mount.staged("turn/README"))
                    .and_then(|mut f| f.write_all(b"written during a seal\n"));
                let elsewhere = OpenOptions::new()
                    .append(true)
                    .open(mount.staged("other/notes.txt"))
                    .and_then(|mut f| f.write_all(b"written during a seal\n"));
                if mount.status_text().contains("# seal in progress: turn\n") {
                    tried = true;
                    assert_errno(
                        "writing to a file of a workspace being sealed",
                        writer,
                        libc::EBUSY,
                    );
                    elsewhere.expect("writing elsewhere in staging/ during a seal");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (sealer.join().expect("sealer thread"), tried)
    });
    assert_errno("sealing while every upload is cut", result, libc::EIO);
    assert!(
        tried_during_seal,
        "`# seal in progress: turn` never showed in .status long enough to try writes"
    );
    assert!(
        proxy.connections_cut() >= 1,
        "the proxy never cut a connection: {:#?}",
        proxy.request_lines()
    );
    assert!(
        proxy
            .request_lines()
            .iter()
            .any(|l| l.starts_with("POST ") && l.contains("uploads")),
        "no multipart upload was attempted: {:#?}",
        proxy.request_lines()
    );
    // Checked on the server directly, not through the proxy.
    assert_nothing_sealed(&mount, &store, "turn", &tree);

    // Same mount, same command, once the store is reachable again.
    proxy.set_cutting(false);
    seal().unwrap_or_else(|e| panic!("retrying the seal: {e}\n{}", mount.log_excerpt()));
    let sha = mount.commit_target("turn");
    assert!(
        fs::symlink_metadata(mount.staged("turn")).is_err(),
        "staging/turn is still there after its seal"
    );
    assert_eq!(store.list_keys(), [TestStore::object_name(&sha)]);
    assert!(store.multipart_uploads().is_empty());
    let size = store.object_bytes(&sha).expect("the object").len();
    let meta = store.object_meta(&sha).expect("the object's metadata");
    assert_eq!(
        (meta.sha256.as_deref(), meta.size.clone()),
        (Some(sha.as_str()), Some(size.to_string()))
    );
    assert_recent_capture_time(&meta);
    let out = run(ckptfs().arg("verify").arg(store.url())).success();
    assert_eq!(parse_verify_output(&out)[&sha], "ok", "{out}");
    assert_same_tree(&tree, &mount.join(&sha));
    assert_eq!(mount.downloads(), 0, "{}", mount.status_text());
    let status = mount.status_text();
    assert!(
        status.contains(&format!("# seal turn: sealed as {sha} (stored)\n")),
        "{status}"
    );
}
