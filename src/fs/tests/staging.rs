//! Reads and writes of staged files, which come by inode (the kernel opens files by
//! itself): files kept open, files whose names went away while a process may still
//! hold them, and what the kernel's offsets mean.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;

const ROOT_CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn workspace(fs: &CheckpointFs, name: &[u8]) -> (u64, std::path::PathBuf) {
    let ws = fs.mkdir(inode::STAGING, name, 0o755, ROOT_CALLER).unwrap();
    (
        ws.attr.ino,
        std::path::PathBuf::from(OsStr::from_bytes(name)),
    )
}

fn size_of(fs: &CheckpointFs, ino: u64) -> u64 {
    fs.getattr(ino).unwrap().attr.size
}

/// POSIX lets a process go on using a file after its last name is gone. The daemon
/// never saw the open (the kernel opened the file by itself), so it keeps any file
/// the kernel knows whose last known name is removed, until the kernel forgets it.
#[test]
fn a_file_whose_name_is_removed_is_still_read_and_written_until_the_kernel_forgets_it() {
    let (f, _) = fixture(&[]);
    let (ws, dir) = workspace(&f.fs, b"ws");
    // Made on disk, so that no descriptor of it is kept from its creation.
    for name in ["unlinked", "replaced", "other"] {
        std::fs::write(f.staging_dir.join(&dir).join(name), name).unwrap();
    }
    let unlinked = f.fs.lookup(ws, b"unlinked").unwrap().attr.ino;
    let replaced = f.fs.lookup(ws, b"replaced").unwrap().attr.ino;
    f.fs.lookup(ws, b"other").unwrap();
    f.fs.unlink(ws, b"unlinked").unwrap();
    f.fs.staging
        .rename(ws, b"other", ws, b"replaced", 0)
        .unwrap();
    assert_eq!(
        f.fs.lookup(ws, b"unlinked").unwrap_err().errno(),
        libc::ENOENT
    );

    for (ino, was) in [(unlinked, &b"unlinked"[..]), (replaced, b"replaced")] {
        assert_eq!(f.fs.read(ino, NO_HANDLE, 0, 100).unwrap(), was);
        assert_eq!(f.fs.write(ino, was.len() as u64, b"+more").unwrap(), 5);
        assert_eq!(size_of(&f.fs, ino), was.len() as u64 + 5);
        let truncate = SetAttr {
            size: Some(2),
            mode: Some(0o600),
            ..SetAttr::default()
        };
        let attr = f.fs.setattr(ino, truncate).unwrap().attr;
        assert_eq!((attr.size, attr.perm), (2, 0o600));
        assert_eq!(f.fs.read(ino, NO_HANDLE, 0, 100).unwrap(), &was[..2]);
    }
    // The name that replaced the other still reads as itself.
    let other = f.fs.lookup(ws, b"replaced").unwrap().attr.ino;
    assert_eq!(read_all(&f.fs, other), b"other");

    f.fs.forget(unlinked, 1);
    assert_eq!(
        f.fs.read(unlinked, NO_HANDLE, 0, 100).unwrap_err().errno(),
        libc::ESTALE
    );
}

/// A move out of `staging/` into a checkpoint or the virtual tree is refused by the
/// side that is not staging: read-only (a writer once brought the daemon down so).
#[test]
fn a_move_out_of_staging_is_refused_by_the_other_side() {
    let (f, ids) = fixture(&[&[("dir/file", b"x")]]);
    let (ws, _) = workspace(&f.fs, b"ws");
    let (made, opened) =
        f.fs.create(ws, b"f", 0o644, libc::O_WRONLY, ROOT_CALLER)
            .unwrap();
    f.fs.release(opened.fh);
    let ckpt = checkpoint_dir(&f.fs, &ids[0]);
    wait_loaded(&f.fs, ckpt);
    let dir = f.fs.lookup(ckpt, b"dir").unwrap().attr.ino;
    for (to, errno) in [
        (dir, libc::EROFS),
        (inode::BY_TIME, libc::EROFS),
        (inode::ROOT, libc::EROFS),
    ] {
        let (tx, rx) = std::sync::mpsc::channel();
        f.fs.rename(
            (ws, b"f"),
            (to, b"f"),
            0,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        assert_eq!(rx.recv().unwrap().unwrap_err().errno(), errno, "into {to}");
        let (tx, rx) = std::sync::mpsc::channel();
        f.fs.rename(
            (to, b"x"),
            (ws, b"x"),
            0,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        assert_eq!(rx.recv().unwrap().unwrap_err().errno(), errno, "from {to}");
    }
    assert_eq!(read_all(&f.fs, made.attr.ino), b"");
}

/// The kernel gives every write its offset, also for a file opened to append: the
/// descriptor the daemon writes through must not append on its own.
#[test]
fn writes_land_at_the_offsets_the_kernel_gives() {
    let (f, _) = fixture(&[]);
    let (ws, _) = workspace(&f.fs, b"ws");
    let flags = libc::O_WRONLY | libc::O_APPEND;
    let (entry, opened) = f.fs.create(ws, b"log", 0o644, flags, ROOT_CALLER).unwrap();
    f.fs.release(opened.fh);
    let ino = entry.attr.ino;
    f.fs.write(ino, 0, b"abcdef").unwrap();
    f.fs.write(ino, 1, b"X").unwrap();
    f.fs.write(ino, 6, b"gh").unwrap();
    assert_eq!(read_all(&f.fs, ino), b"aXcdefgh");
}

/// A file created read-only can still be written by its creator, as on a local disk
/// (the kernel checked the caller's rights when it opened the file).
#[test]
fn a_file_created_read_only_takes_its_creators_writes() {
    let (f, _) = fixture(&[]);
    let (ws, _) = workspace(&f.fs, b"ws");
    let (entry, opened) =
        f.fs.create(ws, b"ro", 0o444, libc::O_WRONLY, ROOT_CALLER)
            .unwrap();
    f.fs.release(opened.fh);
    assert_eq!(entry.attr.perm, 0o444);
    f.fs.write(entry.attr.ino, 0, b"written").unwrap();
    assert_eq!(read_all(&f.fs, entry.attr.ino), b"written");
}

/// A parked file is kept by a link in a graveyard that `staging/` does not show and
/// nobody can touch through the mount; the link goes once the kernel forgets it.
#[test]
fn parked_files_are_kept_out_of_sight_until_the_kernel_forgets_them() {
    let (f, _) = fixture(&[]);
    let (ws, dir) = workspace(&f.fs, b"ws");
    std::fs::write(f.staging_dir.join(&dir).join("gone"), b"kept").unwrap();
    let gone = f.fs.lookup(ws, b"gone").unwrap().attr.ino;
    f.fs.unlink(ws, b"gone").unwrap();
    let graveyard = f.staging_dir.join(".ckptfs-graveyard");
    assert_eq!(std::fs::read_dir(&graveyard).unwrap().count(), 1);
    assert_eq!(read_all(&f.fs, gone), b"kept");
    assert_eq!(f.fs.getattr(gone).unwrap().attr.nlink, 0, "no name is left");
    let mut listed = names(&f.fs, inode::STAGING);
    listed.sort();
    assert_eq!(listed, [".", "..", "ws"]);
    let name = b".ckptfs-graveyard";
    assert_eq!(
        f.fs.lookup(inode::STAGING, name).unwrap_err().errno(),
        libc::ENOENT
    );
    let refused = [
        f.fs.mkdir(inode::STAGING, name, 0o755, ROOT_CALLER)
            .map(drop),
        f.fs.rmdir(inode::STAGING, name),
        f.fs.unlink(inode::STAGING, name),
        f.fs.staging.rename(inode::STAGING, name, ws, b"x", 0),
        f.fs.staging.rename(ws, b"x", inode::STAGING, name, 0),
    ];
    for result in refused {
        assert_eq!(result.unwrap_err().errno(), libc::EPERM);
    }
    f.fs.forget(gone, 1);
    assert_eq!(std::fs::read_dir(&graveyard).unwrap().count(), 0);
}

/// The generation the kernel gets with each entry (see `staging::generation`) is the
/// same for every name of one file, and differs between files.
#[test]
fn each_file_has_a_generation_of_its_own_shared_by_its_names() {
    let (f, _) = fixture(&[]);
    let (ws, dir) = workspace(&f.fs, b"ws");
    let backing = f.staging_dir.join(&dir);
    std::fs::write(backing.join("a"), b"a").unwrap();
    std::fs::write(backing.join("b"), b"b").unwrap();
    std::fs::hard_link(backing.join("a"), backing.join("a2")).unwrap();
    let generation = |name: &[u8]| f.fs.lookup(ws, name).unwrap().attr.generation;
    assert_eq!(generation(b"a"), generation(b"a2"));
    assert_ne!(generation(b"a"), generation(b"b"));
    assert_eq!(generation(b"a"), generation(b"a"));
}

/// A directory removed while the kernel still knows it (someone's working directory)
/// keeps its inode, as on a local disk: it still answers, with no link left, however
/// many directories are used since (more than the daemon keeps descriptors for), and
/// its inode number goes to no new directory.
#[test]
fn a_removed_directory_the_kernel_knows_keeps_its_inode() {
    let (f, _) = fixture(&[]);
    let caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let ws =
        f.fs.mkdir(inode::STAGING, b"ws", 0o755, caller)
            .unwrap()
            .attr
            .ino;
    let gone = f.fs.mkdir(ws, b"gone", 0o755, caller).unwrap().attr.ino;
    f.fs.rmdir(ws, b"gone").unwrap();
    let made: Vec<u64> = (0..20)
        .map(|i| {
            let name = format!("d{i}");
            f.fs.mkdir(ws, name.as_bytes(), 0o755, caller)
                .unwrap()
                .attr
                .ino
        })
        .collect();
    let attr = f.fs.getattr(gone).unwrap().attr;
    assert_eq!((attr.ino, attr.nlink), (gone, 0));
    assert!(
        !made.contains(&gone),
        "a new directory got the removed one's number"
    );
    // Once the kernel forgets it, it is gone.
    f.fs.forget(gone, 1);
    assert!(f.fs.getattr(gone).is_err());
}

/// Reopening a deep directory whose descriptor is not kept keeps only that one: the
/// climb does not push out the descriptors of the directories in use (an attacker's
/// 100,000-deep workspace once made every request re-open its whole chain). A
/// directory whose descriptor is kept is still used by it after a rename behind the
/// daemon's back; one opened again by name would be stale.
#[test]
fn reopening_a_deep_directory_keeps_the_other_descriptors() {
    let (f, _) = fixture(&[]);
    let (deep_ws, deep_dir) = workspace(&f.fs, b"deep");
    let (ws, dir) = workspace(&f.fs, b"ws");
    let chain: std::path::PathBuf = std::iter::repeat_n("d", 12).collect();
    std::fs::create_dir_all(f.staging_dir.join(&deep_dir).join(&chain)).unwrap();
    let mut deep = deep_ws;
    for _ in 0..12 {
        deep = f.fs.lookup(deep, b"d").unwrap().attr.ino;
    }
    let shallow: Vec<u64> = ["s1", "s2"]
        .iter()
        .map(|name| {
            std::fs::create_dir(f.staging_dir.join(&dir).join(name)).unwrap();
            f.fs.lookup(ws, name.as_bytes()).unwrap().attr.ino
        })
        .collect();
    // DIR_FDS is 3 in tests: the workspace, s1 and s2 are kept, the chain is not.
    for &ino in &shallow {
        let _ = f.fs.lookup(ino, b"nothing");
    }
    assert_eq!(
        f.fs.lookup(deep, b"nothing").unwrap_err().errno(),
        libc::ENOENT
    );
    for (name, ino) in [("s1", shallow[0]), ("s2", shallow[1])] {
        let moved = format!("{name}-moved");
        std::fs::rename(
            f.staging_dir.join(&dir).join(name),
            f.staging_dir.join(&dir).join(&moved),
        )
        .unwrap();
        assert_eq!(
            f.fs.lookup(ino, b"nothing").unwrap_err().errno(),
            libc::ENOENT,
            "{name} was opened again by name"
        );
    }
}

/// READDIRPLUS looks each entry up; the kernel counts the lookup only for an entry it
/// received, so one that did not fit in the reply is forgotten again: a file the
/// kernel was never told of is not kept once its name goes.
#[test]
fn readdirplus_counts_a_lookup_only_for_the_entries_sent() {
    let (f, _) = fixture(&[]);
    // The file of each workspace, listed into a reply with room for it or without.
    let listed = |name: &[u8], room: bool| {
        let (ws, dir) = workspace(&f.fs, name);
        std::fs::write(f.staging_dir.join(&dir).join("f"), name).unwrap();
        let mut file = None;
        f.fs.readdirplus(ws, 0, &mut |entry, found, _| {
            match found {
                None => assert!(entry.name == b"." || entry.name == b".."),
                Some(found) => {
                    assert_eq!(entry.name, b"f");
                    // A generation comes with entries only, never with getattr.
                    let attr = Attr {
                        generation: 0,
                        ..found.attr
                    };
                    assert_eq!(attr, f.fs.getattr(found.attr.ino).unwrap().attr);
                    file = Some(found.attr.ino);
                    return !room;
                }
            }
            false
        })
        .unwrap();
        f.fs.unlink(ws, b"f").unwrap();
        file.expect("f listed")
    };
    let sent = listed(b"sent", true);
    let not_sent = listed(b"not-sent", false);
    assert_eq!(f.fs.read(sent, NO_HANDLE, 0, 100).unwrap(), b"sent");
    assert!(f.fs.read(not_sent, NO_HANDLE, 0, 100).is_err());
}

/// A name removed between the listing and its lookup is left out of READDIRPLUS, as
/// a local directory's listing goes on without it, instead of failing the listing.
#[test]
fn readdirplus_leaves_out_a_name_gone_since_the_listing() {
    let (f, _) = fixture(&[]);
    let (ws, dir) = workspace(&f.fs, b"ws");
    let on_disk = f.staging_dir.join(&dir);
    for name in ["a", "b"] {
        std::fs::write(on_disk.join(name), name).unwrap();
    }
    // The listing is read at offset 0, before the first entry is added.
    let mut listed = Vec::new();
    f.fs.readdirplus(ws, 0, &mut |entry, found, _| {
        if found.is_some() {
            let name = String::from_utf8_lossy(&entry.name).into_owned();
            // Whichever comes first removes the other.
            let other = if name == "a" { "b" } else { "a" };
            let _ = std::fs::remove_file(on_disk.join(other));
            listed.push(name);
        }
        false
    })
    .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
}
