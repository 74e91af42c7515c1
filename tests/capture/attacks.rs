//! `staging/` written by an attacker who wants the daemon's secrets: writers racing a
//! seal (file/symlink exchanges, directory storms while the workspace is frozen), chmod
//! of a staged symlink, a planted object under the name a seal will get, and a staging
//! or cache directory someone else could write to.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::cp_a;
use crate::util::mount::{Mount, repo_temp_dir};
use crate::util::sys::{FreshExt4, assert_errno, c_path};
use crate::util::tree::make_small_tree;
use crate::util::users::{as_nobody, shared_binary, shared_temp_dir};
use crate::util::{TestStore, ckptfs, run, sha256_hex};

const SECRET: &[u8] = b"AKIA-OUTSIDE-SECRET-0123456789";

fn rename_exchange(dir: &Path, a: &str, b: &str) -> std::io::Result<()> {
    crate::util::sys::rename_exchange(&dir.join(a), &dir.join(b))
}

fn tar_of(archive: &[u8]) -> Vec<u8> {
    let mut tar = Vec::new();
    flate2::read::MultiGzDecoder::new(archive)
        .read_to_end(&mut tar)
        .expect("a sealed archive decompresses");
    tar
}

/// Writers race every seal: one swaps a file and a symlink to a host secret with
/// `RENAME_EXCHANGE`, one makes and moves directories (holding such symlinks) into the
/// workspace as fast as it can. Over many seals, no archive may hold a byte of the
/// secret, and every seal either stores a checkpoint or fails with EBUSY and leaves
/// the workspace in place.
#[test]
fn racing_writers_cannot_put_outside_bytes_into_a_seal() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-race-");
    let secret = work.path().join("credentials");
    fs::write(&secret, SECRET).unwrap();
    let mount = Mount::new(&store).staging().start();
    let deadline = Instant::now() + Duration::from_secs(40);
    let (mut sealed, mut busy, mut round) = (0, 0, 0);
    // Writer operations the freeze refused (EBUSY): proof that writers hit the seal.
    let refused = Arc::new(AtomicUsize::new(0));
    while round < 40 && Instant::now() < deadline {
        round += 1;
        let name = format!("ws-{round}");
        let ws = mount.staged(&name);
        fs::create_dir_all(ws.join("d/sub")).unwrap();
        fs::write(ws.join("d/file"), b"harmless").unwrap();
        symlink(&secret, ws.join("d/link")).unwrap();
        symlink(work.path(), ws.join("d/dirlink")).unwrap();
        // Enough entries that the freeze and the archive take a while to race with.
        fs::create_dir(ws.join("bulk")).unwrap();
        for i in 0..300 {
            fs::write(ws.join(format!("bulk/f{i}")), i.to_string()).unwrap();
        }
        let outside_ws = mount.staged(&format!("storm-{round}"));
        fs::create_dir(&outside_ws).unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let swapper = {
            let (stop, swaps, refused, d) = (
                Arc::clone(&stop),
                Arc::clone(&swaps),
                Arc::clone(&refused),
                ws.join("d"),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (a, b) in [("file", "link"), ("sub", "dirlink")] {
                        match rename_exchange(&d, a, b) {
                            Ok(()) => swaps.fetch_add(1, Ordering::Relaxed),
                            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                                refused.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(_) => 0,
                        };
                    }
                }
            })
        };
        let storm = {
            let (stop, ws, outside, secret) = (
                Arc::clone(&stop),
                ws.clone(),
                outside_ws.clone(),
                secret.clone(),
            );
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let _ = fs::create_dir(ws.join(format!("storm-{i}")));
                    let made = outside.join(format!("moved-{i}"));
                    if fs::create_dir(&made).is_ok() {
                        let _ = symlink(&secret, made.join("key"));
                        let _ = fs::rename(&made, ws.join(format!("moved-{i}")));
                    }
                }
            })
        };
        // Start the seal once both writers are going.
        let started = Instant::now();
        while swaps.load(Ordering::Relaxed) < 2 && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let result = fs::rename(&ws, mount.committed(&name));
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        storm.join().unwrap();
        match result {
            Ok(()) => {
                sealed += 1;
                let target = fs::read_link(mount.committed(&name)).unwrap();
                let sha = target
                    .to_str()
                    .unwrap()
                    .trim_start_matches("../")
                    .to_owned();
                let object = store
                    .object_bytes(&sha)
                    .expect("the sealed object is stored");
                assert_eq!(sha256_hex(&object), sha);
                let tar = tar_of(&object);
                assert!(
                    !tar.windows(SECRET.len()).any(|w| w == SECRET),
                    "round {round}: the archive of {name} holds the outside secret"
                );
                assert!(
                    !ws.exists(),
                    "round {round}: a sealed workspace stayed staged"
                );
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                busy += 1;
                assert!(
                    ws.join("d").is_dir(),
                    "round {round}: a refused seal lost the workspace"
                );
            }
            Err(e) => panic!(
                "round {round}: the seal failed with {e}\n{}",
                mount.log_excerpt()
            ),
        }
        assert!(
            swaps.load(Ordering::Relaxed) > 0,
            "round {round}: the swapper never ran"
        );
    }
    let refused = refused.load(Ordering::Relaxed);
    eprintln!(
        "{round} rounds: {sealed} sealed, {busy} refused with EBUSY; \
         {refused} writer exchanges refused during seals"
    );
    assert!(
        sealed >= 5,
        "only {sealed} of {round} seals went through ({busy} EBUSY)"
    );
    assert!(refused > 0, "no writer ever raced a seal");
    assert_eq!(fs::read(&secret).unwrap(), SECRET);
}

/// Linux 6.6+ lets a process ask for a symlink's own mode to change
/// (`fchmodat2(AT_SYMLINK_NOFOLLOW)`); the kernel then sends SETATTR for the staged
/// symlink, which must not reach its target on the host.
#[test]
fn chmod_of_a_staged_symlink_never_reaches_its_target() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-chmod-");
    let target = work.path().join("host-file");
    fs::write(&target, b"host").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    let mount = Mount::new(&store).staging().start();
    let ws = mount.staged("ws");
    fs::create_dir(&ws).unwrap();
    symlink(&target, ws.join("abs-link")).unwrap();
    symlink(
        "../../../../../../../../../..".to_owned() + target.to_str().unwrap(),
        ws.join("rel-link"),
    )
    .unwrap();
    for link in ["abs-link", "rel-link"] {
        let path = c_path(&ws.join(link));
        // SAFETY: the path is NUL-terminated; fchmodat2 only reads it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fchmodat2,
                libc::AT_FDCWD,
                path.as_ptr(),
                0o777 as libc::mode_t,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        let result = crate::util::sys::libc_result(rc as libc::c_int);
        if result.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::ENOSYS) {
            eprintln!("fchmodat2 is not available on this kernel; nothing to test");
            return;
        }
        assert_errno(&format!("fchmodat2 of {link}"), result, libc::EOPNOTSUPP);
        let mode = fs::metadata(&target).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600, "{link}: the host file's mode changed");
    }
    // A chmod through the link follows it in the caller's own view: the caller's
    // business. The staged link itself is untouched.
    assert!(
        fs::symlink_metadata(ws.join("abs-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A damaged object planted under the name a tree will get (captures are
/// deterministic, so names are predictable) must not make the seal delete the only good
/// copy: the seal verifies what it found, replaces it, and only then drops the staged
/// workspace.
#[test]
fn a_planted_object_under_the_seals_name_is_replaced_before_the_workspace_goes() {
    let store = TestStore::s3();
    let work = repo_temp_dir("capture-planted-");
    let tree = work.path().join("tree");
    make_small_tree(&tree, "planted");
    // Learn the name from a scratch store: `put` and the seal write the same bytes.
    let scratch = TestStore::local();
    let (sha, size) = scratch.put(&tree, &[]);
    store.write_object_bytes(&sha, &vec![0u8; size as usize], Some((&sha, size)));

    let mount = Mount::new(&store).staging().start();
    cp_a(&tree, &mount.staged("turn"));
    fs::rename(mount.staged("turn"), mount.committed("turn")).expect("the seal succeeds");
    let object = store.object_bytes(&sha).unwrap();
    assert_eq!(
        sha256_hex(&object),
        sha,
        "the planted object is still there"
    );
    let status = fs::read_to_string(mount.join(".status")).unwrap();
    assert!(
        status.contains(&format!(
            "turn: sealed as {sha} (stored over a damaged copy"
        )),
        "{status}"
    );
    assert!(!mount.staged("turn").exists());
    crate::util::tree::assert_same_tree(&tree, &mount.join(&sha));
}

#[test]
fn a_staging_dir_is_made_private_and_must_be_ours() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-private-");
    let staging = work.path().join("staging");
    fs::create_dir(&staging).unwrap();
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o777)).unwrap();
    let mount = Mount::new(&store)
        .args([
            std::ffi::OsString::from("--staging-dir"),
            staging.clone().into(),
        ])
        .start();
    assert_eq!(fs::metadata(&staging).unwrap().mode() & 0o777, 0o700);
    drop(mount);

    // Owned by someone else: refused, with one clear line.
    let theirs = work.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    for flag in ["--staging-dir", "--cache-dir"] {
        let mnt = work.path().join(format!("mnt{flag}"));
        fs::create_dir(&mnt).unwrap();
        let mut cmd = ckptfs();
        cmd.arg("mount")
            .arg(store.url())
            .arg(&mnt)
            .arg("--foreground");
        if flag == "--staging-dir" {
            cmd.arg("--cache-dir").arg(work.path().join("cache"));
        }
        cmd.arg(flag).arg(&theirs);
        let out = run(&mut cmd).failure();
        assert!(out.stderr.contains("belongs to uid 65534"), "{flag}: {out}");
        assert_eq!(
            fs::metadata(&theirs).unwrap().mode() & 0o777,
            0o755,
            "{flag}: chmodded"
        );
    }
}

/// A configured directory is resolved without following what another user placed:
/// a symlink planted as `--cache-dir` or `--staging-dir` in a directory anyone may
/// write (a sticky one, like /tmp) is refused, and the root-owned directory it points
/// to is neither made private nor written; so is a path through another user's
/// directory.
#[test]
fn a_planted_symlink_cannot_redirect_the_cache_or_staging() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-planted-dir-");
    let shared = work.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = work.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o755)).unwrap();
    let planted = shared.join("ckptfs");
    symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let theirs = work.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    for flag in ["--cache-dir", "--staging-dir"] {
        for (dir, why) in [
            (planted.clone(), "belongs to uid 65534"),
            (theirs.join("below"), "which belongs to uid 65534"),
        ] {
            let mnt = work.path().join("mnt");
            fs::create_dir_all(&mnt).unwrap();
            let mut cmd = ckptfs();
            cmd.arg("mount")
                .arg(store.url())
                .arg(&mnt)
                .arg("--foreground");
            if flag == "--staging-dir" {
                cmd.arg("--cache-dir").arg(work.path().join("cache"));
            }
            cmd.arg(flag).arg(&dir);
            let out = run(&mut cmd).failure();
            assert!(out.stderr.contains(why), "{flag} {}: {out}", dir.display());
        }
        assert_eq!(
            fs::metadata(&victim).unwrap().mode() & 0o7777,
            0o755,
            "{flag}: the victim was made private"
        );
        assert_eq!(
            fs::read_dir(&victim).unwrap().count(),
            0,
            "{flag}: written into"
        );
        assert!(
            !theirs.join("below").exists(),
            "{flag}: made in their directory"
        );
    }
}

/// Every staged path an attacker can name is opened without following symlinks: a
/// workspace whose top-level name is a symlink to a host directory cannot be sealed
/// (or deleted), and the host directory is untouched.
#[test]
fn a_symlink_cannot_be_sealed_in_place_of_a_workspace() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-symlink-ws-");
    let host = work.path().join("host-dir");
    fs::create_dir(&host).unwrap();
    fs::write(host.join("id_rsa"), SECRET).unwrap();
    let mount = Mount::new(&store).staging().start();
    symlink(&host, mount.staged("evil")).unwrap();
    let err = fs::rename(mount.staged("evil"), mount.committed("evil")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    assert_eq!(fs::read(host.join("id_rsa")).unwrap(), SECRET);
    assert!(store_is_empty(&store), "nothing may be stored");
}

fn store_is_empty(store: &TestStore) -> bool {
    store.list_keys().is_empty()
}

/// A file mapped for writing changes the file only when the kernel writes its pages
/// back, and that comes to the daemon as writes: refused (EBUSY) while a seal has the
/// workspace frozen, and with no file left to land in once it is sealed. The archive is
/// the snapshot the freeze took: what the mount shows of the checkpoint is what was
/// stored, whatever the mapping does before, during or after the seal.
#[test]
fn a_writable_mapping_cannot_change_a_workspace_behind_its_seal() {
    let store = TestStore::local();
    let mount = Mount::new(&store).staging().start();
    let ws = mount.staged("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("mapped"), vec![b'A'; 1 << 20]).unwrap();
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ws.join("mapped"))
        .unwrap();
    // SAFETY: a fresh shared mapping of 1 MiB of an open file; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            1 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    drop(file);
    // SAFETY: `map` is a live writable mapping of 1 MiB.
    unsafe { std::ptr::write_bytes(map as *mut u8, b'B', 1 << 20) };
    let map = map as usize;
    let writer = std::thread::spawn(move || {
        for round in 0..200u32 {
            // SAFETY: the mapping stays live until this thread is joined.
            unsafe {
                std::ptr::write_bytes(map as *mut u8, b'C' + (round % 20) as u8, 1 << 20);
                libc::msync(map as *mut libc::c_void, 1 << 20, libc::MS_ASYNC);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        map
    });
    fs::rename(&ws, mount.committed("ws")).expect("the seal succeeds");
    let map = writer.join().unwrap() as *mut libc::c_void;
    // SAFETY: unmapping what was mapped above (its writeback has nowhere to go now).
    unsafe { libc::munmap(map, 1 << 20) };
    let sha = fs::read_link(mount.committed("ws")).unwrap();
    let sha = sha.file_name().unwrap().to_str().unwrap().to_owned();
    let shown = fs::read(mount.join(&sha).join("mapped")).unwrap();
    assert_eq!(shown.len(), 1 << 20);
    let archive = store.object_bytes(&sha).expect("the object is stored");
    assert_eq!(sha256_hex(&archive), sha, "the object hashes to its name");
    let tar = tar_of(&archive);
    let stored = tar
        .windows(1 << 16)
        .position(|w| w == &shown[..1 << 16])
        .map(|at| &tar[at..at + (1 << 20)])
        .expect("the file's bytes are in the archive");
    assert!(stored == shown, "the mount shows what was stored");
}

/// `staging/` itself is shared (sticky, like /tmp) and cannot be chmodded or
/// chowned: its backing directory stays the daemon's, 0700. With `--allow-other`,
/// another user makes workspaces there and seals them, and only theirs.
#[test]
fn staging_itself_cannot_be_opened_up_and_other_users_get_and_seal_their_own_workspaces() {
    let store = TestStore::local();
    // Somewhere the other user can reach, whatever the checkout's parents allow.
    let mount = Mount::new(&store)
        .staging()
        .reachable_by_all()
        .args(["--allow-other"])
        .start();
    let staging = mount.join("staging");
    assert_eq!(fs::metadata(&staging).unwrap().mode() & 0o7777, 0o1777);
    let err = fs::set_permissions(&staging, fs::Permissions::from_mode(0o777)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    let err = std::os::unix::fs::chown(&staging, Some(65534), None).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    assert_eq!(
        fs::metadata(mount.staging_dir()).unwrap().mode() & 0o777,
        0o700
    );
    // Another user makes a workspace, which is theirs.
    let out = run(as_nobody().arg("mkdir").arg(staging.join("nobody-ws")));
    assert!(out.status.success(), "{out}");
    assert_eq!(
        fs::metadata(staging.join("nobody-ws")).unwrap().uid(),
        65534
    );
    // And cannot remove someone else's.
    fs::create_dir(staging.join("root-ws")).unwrap();
    let out = run(as_nobody().arg("rmdir").arg(staging.join("root-ws")));
    assert!(!out.status.success(), "{out}");
    assert!(staging.join("root-ws").is_dir());
    // They seal their own workspace (commit/ lets anyone the mount lets in move a
    // workspace there), and cannot seal someone else's (staging/ is sticky).
    fs::write(staging.join("nobody-ws/f"), b"theirs\n").unwrap();
    let sh_as_nobody = |script: &str| {
        run(as_nobody()
            .args(["sh", "-c", script])
            .current_dir(mount.path()))
    };
    let out = sh_as_nobody("mv staging/nobody-ws commit/nobody-ws");
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let sha = mount.commit_target("nobody-ws");
    assert_eq!(fs::read(mount.join(&sha).join("f")).unwrap(), b"theirs\n");
    let out = sh_as_nobody("mv staging/root-ws commit/root-ws");
    assert!(!out.status.success(), "{out}");
    assert!(staging.join("root-ws").is_dir());
}

/// The backing filesystem gives a deleted file's inode number to the next file it
/// makes, and staged inode numbers are the backing ones. A file someone holds open
/// across the seal that deletes its workspace is still known to the kernel under
/// that number: the holder must never reach a file made after (another workspace's,
/// another user's). The seal parks each file the kernel still knows, so its number
/// is not reused while it is known; the holder keeps its own file, as on a local disk,
/// until it lets go. (Each entry also carries a generation from the backing file's
/// handle, for the kernel to retire an inode whose number came back.)
#[test]
fn a_file_held_open_across_its_seal_never_reaches_a_file_made_after() {
    use std::os::unix::fs::FileExt;
    let store = TestStore::local();
    let disk = FreshExt4::new("inode-reuse-");
    let staging = disk.path().join("staging");
    let mount = Mount::new(&store)
        .args([std::ffi::OsStr::new("--staging-dir"), staging.as_os_str()])
        .start();
    let old = mount.staged("old");
    fs::create_dir(&old).unwrap();
    let held: Vec<fs::File> = (0..40)
        .map(|i| {
            let path = old.join(format!("f{i}"));
            fs::write(&path, format!("old {i}\n")).unwrap();
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        })
        .collect();
    let held_inos: std::collections::HashSet<u64> =
        held.iter().map(|f| f.metadata().unwrap().ino()).collect();
    fs::rename(&old, mount.committed("old")).expect("the seal succeeds");
    assert!(
        !staging.join("old").exists(),
        "the sealed workspace is deleted"
    );

    let new = mount.staged("new");
    fs::create_dir(&new).unwrap();
    let secret = |j: usize| format!("secret {j}\n").into_bytes();
    for j in 0..200 {
        let path = new.join(format!("s{j}"));
        fs::write(&path, secret(j)).unwrap();
        let ino = fs::metadata(&path).unwrap().ino();
        assert!(
            !held_inos.contains(&ino),
            "s{j} got the number of a file still held open"
        );
    }
    for (i, file) in held.iter().enumerate() {
        let mut buf = [0u8; 64];
        let n = file.read_at(&mut buf, 0).expect("a held file still reads");
        assert_eq!(&buf[..n], format!("old {i}\n").as_bytes());
        file.write_at(b"still mine", 0)
            .expect("a held file still takes writes, as on a local disk");
    }
    for j in 0..200 {
        assert_eq!(fs::read(new.join(format!("s{j}"))).unwrap(), secret(j));
    }
    // Once let go and forgotten by the kernel (which keeps unused inodes cached
    // until it needs the memory: made to drop them here), they are deleted.
    let graveyard = staging.join(".ckptfs-graveyard");
    assert_eq!(fs::read_dir(&graveyard).unwrap().count(), held.len());
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_dir(&graveyard).unwrap().count() > 0 && Instant::now() < deadline {
        fs::write("/proc/sys/vm/drop_caches", "2").expect("drop the kernel's unused inodes");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        fs::read_dir(&graveyard).unwrap().count(),
        0,
        "files the kernel forgot are deleted"
    );
}

/// A commit name is the writer's: one holding a newline and a line of `.status`'s own
/// shape cannot add that line to `.status`, to the daemon's log or to `ckptfs status
/// --json`, which all show the one real seal.
#[test]
fn a_commit_name_cannot_forge_a_line_of_status() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-forged-name-");
    let tree = work.path().join("tree");
    make_small_tree(&tree, "forged");
    let mount = Mount::new(&store).staging().start();
    let fake = "f".repeat(64);
    let name = format!("turn\n# seal x: sealed as {fake} (stored)");
    cp_a(&tree, &mount.staged(&name));
    fs::rename(mount.staged(&name), mount.committed(&name)).unwrap();
    let sha = mount.commit_target(&name);

    let status = mount.status_text();
    let seals: Vec<&str> = status
        .lines()
        .filter(|l| l.starts_with("# seal "))
        .collect();
    assert_eq!(
        seals,
        [format!(
            "# seal turn\\n# seal x\\x3a sealed as {fake} (stored): sealed as {sha} (stored)"
        )],
        "one seal, one line:\n{status}"
    );
    let log = mount.log_text();
    assert!(
        !log.lines().any(|l| l.starts_with("# seal x")),
        "the log has a line of the name's: {log}"
    );
    let out = run(ckptfs().arg("status").arg(mount.path()).arg("--json")).success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        json["seals"],
        serde_json::json!([{
            "workspace": name,
            "outcome": "sealed",
            "checkpoint": sha,
            "how": "stored",
            "error": null,
        }]),
        "JSON carries the name itself: {out}"
    );
}

/// A daemon that is not root cannot give a file to the user who made it: with other
/// users let in, everything they made in `staging/` would be the daemon's user's. It
/// refuses `--allow-other` with a writable `staging/`, saying why.
#[test]
fn a_daemon_without_root_does_not_let_other_users_into_staging() {
    let store = TestStore::local();
    let work = shared_temp_dir("capture-nonroot-other-");
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = run(as_nobody()
        .arg(shared_binary())
        .arg("mount")
        .arg(store.url())
        .arg(&mnt)
        .args(["--foreground", "--allow-other"]))
    .failure();
    assert!(
        out.stderr
            .contains("--allow-other with a writable staging/ needs the daemon to run as root"),
        "{out}"
    );
    assert!(crate::util::mount::mount_entry(&mnt).is_none(), "mounted");
}

/// A writer repeating a request that fails (readlink of a symlink it removed while it
/// holds it: ESTALE) cannot grow the daemon's log: the failure is logged once, not
/// once per request (an attacker review wrote 3 MB a second).
#[test]
fn a_failing_request_repeated_is_logged_once() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let store = TestStore::local();
    let mount = Mount::new(&store).staging().start();
    let ws = mount.staged("ws");
    fs::create_dir(&ws).unwrap();
    std::os::unix::fs::symlink("target", ws.join("s")).unwrap();
    let path = c_path(&ws.join("s"));
    // SAFETY: a NUL-terminated path; the descriptor is owned at once.
    let fd = unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(fd)
    };
    fs::remove_file(ws.join("s")).unwrap();
    let mut failed = 0;
    for _ in 0..2000 {
        let mut buf = [0u8; 64];
        // SAFETY: an empty NUL-terminated path and a buffer of its stated length.
        let n = unsafe {
            libc::readlinkat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        failed += usize::from(n < 0);
    }
    assert_eq!(failed, 2000, "readlink of the removed symlink succeeded");
    let log = mount.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("request failed") && l.contains("readlink"))
        .count();
    assert!(
        lines <= 1,
        "{lines} lines for one repeated failure:\n{}",
        mount.log_excerpt()
    );
}

/// With other users let in (`--allow-other`) on a writable mount, a checkpoint file
/// whose mode lets a user write it cannot be opened for writing: once the kernel
/// opened files by itself, such a user mapped one shared and writable, and the pages
/// they dirtied stayed in the page cache after the writeback failed, so that root read
/// bytes that were never verified (attacker review).
#[test]
fn another_user_cannot_open_a_checkpoint_file_for_writing() {
    let store = TestStore::local();
    let tree = shared_temp_dir("capture-mmap-tree-");
    let file = tree.path().join("theirs.sh");
    fs::write(&file, format!("echo benign\n{}\n", "#".repeat(40_000))).unwrap();
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    let out = run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let sha = out.stdout.split_whitespace().next().unwrap().to_owned();
    let mount = Mount::new(&store)
        .staging()
        .reachable_by_all()
        .args(["--allow-other"])
        .start();
    let shown = mount.join(&sha).join("theirs.sh");
    // A first read by root, as a reviewer's would be.
    assert!(fs::read(&shown).unwrap().starts_with(b"echo benign"));
    let out = run(as_nobody()
        .args(["sh", "-c", "exec 3<>\"$1\" && echo opened", "sh"])
        .arg(&shown));
    assert!(
        !out.status.success() && out.stderr.contains("Read-only file system"),
        "another user opened a checkpoint file for writing: {out}"
    );
    assert!(fs::read(&shown).unwrap().starts_with(b"echo benign"));
    drop(mount);

    // Root, on a writable mount without --allow-other, after a first read: the same
    // (the fifth review did it as root, whom no mode stops).
    let mount = Mount::new(&store).staging().start();
    let shown = mount.join(&sha).join("theirs.sh");
    assert!(fs::read(&shown).unwrap().starts_with(b"echo benign"));
    let err = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shown)
        .expect_err("root opened a checkpoint file for writing");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
}

/// What the security model says of `CAP_SYS_ADMIN`: remounted read-write, a
/// `--read-only --passthrough` mount still refuses a checkpoint file opened for
/// writing (every open goes through the daemon), where a plain `--read-only` one
/// leaves it to the mount's flags (the sixth attacker review remounted one).
#[test]
fn a_read_only_passthrough_mount_remounted_rw_still_refuses_writes() {
    let store = TestStore::local();
    let tree = crate::util::temp_dir();
    fs::write(tree.path().join("big.txt"), "A".repeat(40_000)).unwrap();
    let out = run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let sha = out.stdout.split_whitespace().next().unwrap().to_owned();
    let mount = Mount::new(&store)
        .args(["--read-only", "--passthrough"])
        .start();
    let shown = mount.join(&sha).join("big.txt");
    assert_eq!(fs::read(&shown).unwrap().len(), 40_000);
    run(std::process::Command::new("mount")
        .args(["-i", "-o", "remount,rw"])
        .arg(mount.path()))
    .success();
    let err = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shown)
        .expect_err("opened for writing after a remount");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
}

/// `ckptfs status DIR` of a directory that only looks like a mount (any user can
/// make one with a `.status` file) prints its control characters escaped: the
/// mount's own `.status` never holds any, a forged one cannot drive the terminal.
#[test]
fn status_of_a_forged_mount_cannot_drive_the_terminal() {
    let work = crate::util::mount::repo_temp_dir("forged-status-");
    fs::write(
        work.path().join(".status"),
        "# ckptfs: store\x1b[2J\x1b]0;pwned\x07\n# seal x: sealed\n",
    )
    .unwrap();
    let out = run(ckptfs().arg("status").arg(work.path())).success();
    assert!(
        !out.stdout.contains('\x1b') && !out.stdout.contains('\x07'),
        "{out}"
    );
    assert!(out.stdout.contains("# seal x: sealed\n"), "{out}");
}

/// A workspace kept private by its own directory (`mkdir -m 700`) stays private once
/// sealed, on a mount other users share: the checkpoint's own directory shows the
/// workspace's mode, and its entries show no bits but those of who could enter it,
/// so another user reads nothing of it, even once its owner opened it (the kernel
/// holding its entries). The same for a 0700 directory `put` by root.
#[test]
fn a_private_workspace_stays_private_once_sealed() {
    use crate::util::users::{as_nobody, as_user};
    let store = TestStore::local();
    let work = repo_temp_dir("private-put-");
    let tree = work.path().join("tree");
    fs::create_dir(&tree).unwrap();
    fs::write(tree.join("cfg"), "root only by its directory\n").unwrap();
    fs::set_permissions(tree.join("cfg"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(&tree, fs::Permissions::from_mode(0o700)).unwrap();
    let (put_sha, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store)
        .staging()
        .reachable_by_all()
        .args(["--allow-other"])
        .start();
    let as_1000 = |script: &str| {
        run(as_user(1000)
            .args(["sh", "-c", script])
            .current_dir(mount.path()))
    };
    // Before anything loaded the 0700 tree put by root, the kernel knows its directory
    // only as `0555`: opening it (to read its listing later, from the kernel's cache,
    // once its owner listed it), the lookups and the listing that load it are refused
    // all the same, and none of its entries' attributes is shown. (A directory listed
    // first: the kernel would then open directories without asking, were it let.)
    fs::read_dir(mount.path()).unwrap().for_each(drop);
    let out = run(as_nobody()
        .args([
            "/usr/bin/python3",
            "-I",
            "-c",
            "import os, sys\ntry:\n    os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\nexcept PermissionError:\n    sys.exit(13)",
        ])
        .arg(mount.join(&put_sha)));
    assert_eq!(out.status.code(), Some(13), "opened before the load: {out}");
    for command in [
        &["stat", "cfg"][..],
        &["ls", "-la", "."],
        &["readlink", "cfg"],
    ] {
        let out = run(as_nobody().args(command).current_dir(mount.join(&put_sha)));
        assert!(!out.status.success(), "{command:?} before the load: {out}");
        assert!(!out.stdout.contains("cfg"), "{out}");
    }
    let out = as_1000(
        "umask 022 && mkdir -m 700 staging/p && echo private notes > staging/p/notes.txt \
         && mv staging/p commit/p && cat commit/p/notes.txt",
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    assert_eq!(out.stdout, "private notes\n");
    let sha = mount.commit_target("p");
    let dir = fs::metadata(mount.join(&sha)).unwrap();
    assert_eq!((dir.mode() & 0o7777, dir.uid()), (0o700, 1000));
    let notes = mount.join(&sha).join("notes.txt");
    assert_eq!(fs::metadata(&notes).unwrap().mode() & 0o777, 0o600);
    let out = run(as_nobody().arg("cat").arg(&notes));
    assert!(!out.status.success(), "another user read it: {out}");
    assert!(out.stderr.contains("ermission denied"), "{out}");
    let out = run(as_nobody().arg("ls").arg(mount.join(&sha)));
    assert!(!out.status.success(), "another user listed it: {out}");
    // Its owner still reads it, and so does root.
    assert_eq!(
        as_1000(&format!("cat {sha}/notes.txt")).stdout,
        "private notes\n"
    );
    assert_eq!(fs::read_to_string(&notes).unwrap(), "private notes\n");
    // Forked by its owner, the next turn is as private: the workspace gets the
    // checkpoint's own directory's mode, and its seal keeps it.
    let fork = run(as_user(1000)
        .arg(crate::util::users::shared_binary())
        .arg("fork")
        .arg(mount.path())
        .arg(&sha)
        .arg("q"));
    assert!(fork.status.success(), "{fork}\n{}", mount.log_excerpt());
    assert_eq!(
        fs::metadata(mount.staged("q")).unwrap().mode() & 0o7777,
        0o700
    );
    let out = as_1000("echo more >> staging/q/notes.txt && mv staging/q commit/q");
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let next = mount.commit_target("q");
    let out = run(as_nobody()
        .arg("cat")
        .arg(mount.join(&next).join("notes.txt")));
    assert!(
        !out.status.success(),
        "another user read the next turn: {out}"
    );

    // The 0700 tree put by root, opened by root first.
    let cfg = mount.join(&put_sha).join("cfg");
    assert_eq!(
        fs::read_to_string(&cfg).unwrap(),
        "root only by its directory\n"
    );
    let out = run(as_nobody().arg("cat").arg(&cfg));
    assert!(!out.status.success(), "another user read it: {out}");
}

/// Before a checkpoint was ever loaded, a shared mount cannot know whether its own
/// directory keeps others out, so it shows it as its own user's `0500`: the kernel
/// lets no one else in on that, not even where it would not ask the daemon (an
/// inotify watch, whose events would name the entries its owner then opens; a `stat`
/// from the kernel's cache). Denied, the kernel asks again, the daemon loads the
/// checkpoint, and everyone is judged by the root's own mode: its owner reads it at
/// the first try, and so does anyone a public checkpoint. A root others may search
/// but not list (0711) keeps its names from them once sealed and once forked, while a
/// file they can name stays theirs to read, as on a disk; and no one forks into
/// another user's workspace.
#[test]
fn a_private_checkpoint_admits_no_one_before_its_load() {
    use crate::util::users::{as_nobody, as_user};
    let store = TestStore::local();
    let work = repo_temp_dir("private-unloaded-");
    let tree = |name: &str, owner: u32, mode: u32, file_mode: u32| {
        let tree = work.path().join(name);
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("salary.txt"), format!("{name}\n")).unwrap();
        fs::set_permissions(
            tree.join("salary.txt"),
            fs::Permissions::from_mode(file_mode),
        )
        .unwrap();
        for path in [tree.join("salary.txt"), tree.clone()] {
            std::os::unix::fs::chown(&path, Some(owner), Some(owner)).unwrap();
        }
        fs::set_permissions(&tree, fs::Permissions::from_mode(mode)).unwrap();
        store.put(&tree, &[]).0
    };
    let probed = tree("a", 1000, 0o700, 0o640);
    let first = tree("b", 1000, 0o700, 0o640);
    let public = tree("c", 0, 0o755, 0o644);
    let broken = tree("d", 0, 0o755, 0o644);
    let mut bytes = store.object_bytes(&broken).unwrap();
    let last = bytes.len() - 1;
    bytes[last / 2] ^= 0xff;
    store.write_object_bytes(&broken, &bytes, Some((&broken, bytes.len() as u64)));
    let mount = Mount::new(&store)
        .staging()
        .reachable_by_all()
        .args(["--allow-other"])
        .start();
    // The first access of all to a checkpoint, by its owner, and to a public one by
    // anyone: at the first try.
    let out = run(as_user(1000)
        .arg("cat")
        .arg(mount.join(&first).join("salary.txt")));
    assert_eq!(out.stdout, "b\n", "{out}\n{}", mount.log_excerpt());
    let out = run(as_nobody()
        .arg("cat")
        .arg(mount.join(&public).join("salary.txt")));
    assert_eq!(out.stdout, "c\n", "{out}\n{}", mount.log_excerpt());
    // A checkpoint that does not verify says so, to everyone.
    for _ in 0..2 {
        let out = run(as_nobody().arg("ls").arg(mount.join(&broken)));
        assert!(out.stderr.contains("Input/output error"), "{out}");
    }

    let root = mount.join(&probed);
    let watch = |who: &mut std::process::Command| {
        run(who
            .args([
                "/usr/bin/python3",
                "-I",
                "-c",
                "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n\
                 fd = libc.inotify_init1(0)\n\
                 wd = libc.inotify_add_watch(fd, sys.argv[1].encode(), 0xfff)\n\
                 sys.exit(0 if wd >= 0 else 13 if ctypes.get_errno() == 13 else 1)",
            ])
            .arg(&root))
    };
    let mode = run(as_nobody().args(["stat", "-c", "%a %u"]).arg(&root));
    assert_eq!(mode.stdout.trim(), "500 0", "{mode}");
    let out = watch(&mut as_nobody());
    assert_eq!(
        out.status.code(),
        Some(13),
        "watched before the load: {out}"
    );
    let out = run(as_nobody()
        .args(["stat", "--cached=always"])
        .arg(root.join("salary.txt")));
    assert!(!out.status.success(), "stat before the load: {out}");
    let out = run(as_user(1000).arg("cat").arg(root.join("salary.txt")));
    assert_eq!(out.stdout, "a\n", "{out}\n{}", mount.log_excerpt());
    let mode = run(as_nobody().args(["stat", "-c", "%a %u"]).arg(&root));
    assert_eq!(mode.stdout.trim(), "700 1000", "{mode}");
    assert_eq!(watch(&mut as_nobody()).status.code(), Some(13));
    let out = run(as_nobody()
        .args(["stat", "--cached=always"])
        .arg(root.join("salary.txt")));
    assert!(!out.status.success(), "stat after the load: {out}");

    let as_1000 = |script: &str| {
        run(as_user(1000)
            .args(["sh", "-c", script])
            .current_dir(mount.path()))
    };
    let out = as_1000(
        "umask 022 && mkdir -m 711 staging/s && echo known > staging/s/named \
         && mv staging/s commit/s",
    );
    assert!(out.status.success(), "{out}\n{}", mount.log_excerpt());
    let sha = mount.commit_target("s");
    let sealed = mount.join(&sha);
    let out = run(as_nobody().arg("ls").arg(&sealed));
    assert!(!out.status.success(), "listed a 0711 checkpoint: {out}");
    let out = run(as_nobody().arg("cat").arg(sealed.join("named")));
    assert_eq!(out.stdout, "known\n", "{out}");
    // Forked by its owner, the workspace is as closed.
    let fork = run(as_user(1000)
        .arg(crate::util::users::shared_binary())
        .arg("fork")
        .arg(mount.path())
        .arg(&sha)
        .arg("f"));
    assert!(fork.status.success(), "{fork}\n{}", mount.log_excerpt());
    assert_eq!(
        fs::metadata(mount.staged("f")).unwrap().mode() & 0o7777,
        0o711
    );
    let out = run(as_nobody().arg("ls").arg(mount.staged("f")));
    assert!(
        !out.status.success(),
        "listed a fork of a 0711 checkpoint: {out}"
    );
    // Another user's workspace open to all is not nobody's to fork into.
    assert!(as_1000("mkdir -m 777 staging/open").status.success());
    let out = run(as_nobody()
        .args([
            "/usr/bin/python3",
            "-I",
            "-c",
            "import errno, os, sys\ntry:\n    os.setxattr(sys.argv[1], 'user.ckptfs.fork', sys.argv[2].encode())\n\
             except PermissionError:\n    sys.exit(13)",
        ])
        .arg(mount.staged("open"))
        .arg(&public));
    assert_eq!(
        out.status.code(),
        Some(13),
        "forked into another's workspace: {out}"
    );
    assert_eq!(
        fs::metadata(mount.staged("open")).unwrap().mode() & 0o7777,
        0o777
    );
}
