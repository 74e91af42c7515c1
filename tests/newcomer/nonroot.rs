//! A user who is not root mounts through `fusermount3`, browses, seals and unmounts;
//! with `user_allow_other` in `/etc/fuse.conf` a read-only mount lets other users in
//! (issue 27, "Where users run it"). The throwaway user is uid 65534; `/dev/fuse` and
//! `/etc/fuse.conf` are opened up for the test and put back after it.

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::util::mount::mount_entry;
use crate::util::tree::make_small_tree;
use crate::util::users::{FuseForUsers, as_nobody, nobodys_dir, shared_binary, shared_temp_dir};
use crate::util::{Output, run};

/// `ckptfs ARGS` as nobody.
fn ckptfs_as_nobody(args: &[&std::ffi::OsStr]) -> Output {
    run(as_nobody().arg(shared_binary()).args(args))
}

/// A daemon started as nobody: unmounted by nobody's `fusermount3 -u` when the test
/// says so, and detached and killed on drop if the test failed first.
struct NobodysMount {
    child: Option<Child>,
    mnt: std::path::PathBuf,
}

impl NobodysMount {
    /// `fusermount3 -u` as nobody, then the daemon's exit.
    fn unmount(mut self) {
        let out = run(as_nobody().arg("fusermount3").arg("-u").arg(&self.mnt));
        assert!(out.status.success(), "fusermount3 -u as nobody: {out}");
        let status = self.child.take().unwrap().wait().unwrap();
        assert!(status.success(), "the daemon exited with {status}");
        assert!(mount_entry(&self.mnt).is_none());
    }
}

impl Drop for NobodysMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `ckptfs mount ... --foreground` as nobody, once the mount shows.
fn mount_as_nobody(work: &Path, name: &str, extra: &[&str]) -> NobodysMount {
    let mnt = work.join(name);
    nobodys_dir(&mnt);
    nobodys_dir(&work.join(format!("{name}-cache")));
    let log = fs::File::create(work.join(format!("{name}.log"))).unwrap();
    let child = as_nobody()
        .arg(shared_binary())
        .arg("mount")
        .arg(work.join("store"))
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(work.join(format!("{name}-cache")))
        .arg("--foreground")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the daemon as nobody");
    let mounted = NobodysMount {
        child: Some(child),
        mnt,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while mount_entry(&mounted.mnt).is_none() {
        let log = fs::read_to_string(work.join(format!("{name}.log"))).unwrap_or_default();
        assert!(Instant::now() < deadline, "not mounted in time:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    mounted
}

#[test]
fn a_user_mounts_browses_seals_and_lets_others_in_without_root() {
    let _fuse = FuseForUsers::grant();
    let work = shared_temp_dir("ckptfs-nonroot-");
    let work = work.path();
    let tree = work.join("tree");
    make_small_tree(&tree, "nonroot");
    crate::util::run(
        std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(&tree),
    )
    .success();
    for dir in ["store", "staging"] {
        nobodys_dir(&work.join(dir));
    }
    ckptfs_as_nobody(&[
        "put".as_ref(),
        work.join("store").as_os_str(),
        tree.as_os_str(),
    ])
    .success();

    let daemon = mount_as_nobody(
        work,
        "mnt",
        &[
            "--staging-dir",
            work.join("staging/backing").to_str().unwrap(),
        ],
    );
    let mnt = daemon.mnt.clone();
    let entry = mount_entry(&mnt).unwrap();
    assert!(
        entry.mount_options.iter().any(|o| o == "nosuid")
            && entry.mount_options.iter().any(|o| o == "nodev"),
        "{:?}",
        entry.mount_options
    );
    // Browse as the user: ls, cat, diff -r.
    let sh = |script: &str| {
        run(as_nobody()
            .args(["sh", "-c", script, "sh"])
            .arg(&mnt)
            .arg(&tree))
    };
    sh("ls \"$1\" \"$1/latest/\" && cat \"$1/latest/note.txt\" && diff -r \"$1/latest\" \"$2\"")
        .success();
    // Seal a turn.
    sh("mkdir \"$1/staging/turn\" && cp -a \"$2/.\" \"$1/staging/turn/\" && echo more > \"$1/staging/turn/more.txt\" && mv \"$1/staging/turn\" \"$1/commit/turn\"")
        .success();
    let out =
        sh("readlink \"$1/commit/turn\" && cat \"$1/commit/turn/more.txt\" && ls \"$1/staging\"")
            .success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].len() == 67 && lines[1] == "more",
        "{out}"
    );
    // Root is not let in without allow_other, as for any user's FUSE mount.
    assert!(
        fs::read_dir(&mnt).is_err(),
        "root read another user's mount"
    );
    daemon.unmount();

    // A read-only mount with --allow-other (user_allow_other) lets root and others
    // in. Passthrough needs CAP_SYS_ADMIN: asked for, it is declined once, in the log.
    let daemon = mount_as_nobody(
        work,
        "shared",
        &["--read-only", "--allow-other", "--passthrough"],
    );
    let mnt = daemon.mnt.clone();
    let log = fs::read_to_string(work.join("shared.log")).unwrap();
    assert!(log.contains("--passthrough needs CAP_SYS_ADMIN"), "{log}");
    // The sealed turn, read by root.
    assert_eq!(fs::read(mnt.join("latest/more.txt")).unwrap(), b"more\n");
    let first = fs::read_dir(mnt.join("by-time")).unwrap().count();
    assert_eq!(first, 2, "two turns");
    assert_eq!(
        fs::read(mnt.join("latest/note.txt")).unwrap(),
        fs::read(tree.join("note.txt")).unwrap()
    );
    let listed: Vec<_> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed.len(), 5, "{listed:?}");
    daemon.unmount();
}

/// A daemon that is not root forks a checkpoint holding directories it cannot write
/// (0555, 0000) and hard links into them; a fork that fails part way (a full staging
/// disk) leaves an empty graveyard, removable by the daemon's user, and the mount
/// starts again on the same staging directory.
#[test]
fn a_daemon_that_is_not_root_forks_read_only_trees_and_cleans_up_a_failed_fork() {
    use crate::util::tree::{random_bytes, write_file};
    use std::os::unix::fs::PermissionsExt;

    let _fuse = FuseForUsers::grant();
    let work = shared_temp_dir("ckptfs-nonroot-fork-");
    let work = work.path();
    let tree = work.join("tree");
    make_small_tree(&tree, "fork");
    write_file(&tree.join("a-locked/f"), b"locked\n", 0o644);
    write_file(&tree.join("b-read-only/g"), b"read-only\n", 0o644);
    fs::hard_link(tree.join("a-locked/f"), tree.join("link-to-f")).unwrap();
    write_file(&tree.join("zz-big"), &random_bytes(3 << 20, 7), 0o644);
    fs::set_permissions(tree.join("a-locked"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(tree.join("b-read-only"), fs::Permissions::from_mode(0o555)).unwrap();
    let store = work.join("store");
    crate::util::run(
        crate::util::ckptfs()
            .arg("put")
            .arg(&store)
            .arg(&tree)
            .arg("--member-cache-size")
            .arg("0"),
    )
    .success();
    crate::util::run(
        std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(&store),
    )
    .success();

    // Forked whole onto a disk with room.
    nobodys_dir(&work.join("staging"));
    let staging = work.join("staging/backing");
    let daemon = mount_as_nobody(work, "mnt", &["--staging-dir", staging.to_str().unwrap()]);
    let mnt = daemon.mnt.clone();
    let out = run(as_nobody()
        .arg(shared_binary())
        .arg("fork")
        .arg(&mnt)
        .arg("latest")
        .arg("w"));
    assert!(out.status.success(), "{out}");
    let forked = staging.join("w");
    assert_eq!(
        fs::read(forked.join("zz-big")).unwrap(),
        fs::read(tree.join("zz-big")).unwrap()
    );
    assert_eq!(
        fs::read(forked.join("b-read-only/g")).unwrap(),
        b"read-only\n"
    );
    assert_eq!(
        fs::metadata(forked.join("b-read-only"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o555
    );
    assert_eq!(
        fs::metadata(forked.join("a-locked"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o000
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(forked.join("link-to-f")).unwrap()),
        std::os::unix::fs::MetadataExt::ino(
            &fs::symlink_metadata(staging.join("w/a-locked/f")).unwrap()
        )
    );
    daemon.unmount();

    // A staging disk too small: the fork fails after making the read-only directories.
    let small = work.join("small");
    let _disk = crate::util::SmallDisk::mount(&small, "size=1m,mode=0700,uid=65534,gid=65534");
    let small_staging = small.join("staging");
    let daemon = mount_as_nobody(
        work,
        "full",
        &["--staging-dir", small_staging.to_str().unwrap()],
    );
    let binary = shared_binary();
    let out = run(as_nobody()
        .arg(&binary)
        .arg("fork")
        .arg(&daemon.mnt)
        .arg("latest")
        .arg("w"));
    assert!(
        !out.status.success() && out.stderr.contains("No space left"),
        "{out}"
    );
    let graveyard = small_staging.join(".ckptfs-graveyard");
    assert_eq!(
        fs::read_dir(&graveyard).unwrap().count(),
        0,
        "a failed fork left its tree"
    );
    assert!(!small_staging.join("w").exists());
    daemon.unmount();
    // The same staging directory serves a new mount.
    let daemon = mount_as_nobody(
        work,
        "again",
        &["--staging-dir", small_staging.to_str().unwrap()],
    );
    run(as_nobody()
        .arg("test")
        .arg("-d")
        .arg(daemon.mnt.join("staging")))
    .success();
    daemon.unmount();
}
