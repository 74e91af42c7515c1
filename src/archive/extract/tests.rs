use super::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

enum Member<'a> {
    Dir(&'a str),
    File(&'a str, &'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
}
use Member::{Dir, File, HardLink, Symlink};

fn tar(members: &[Member<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for member in members {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_mtime(1_700_000_000);
        let (path, data, kind, link) = match *member {
            Dir(path) => (path, "", EntryType::Directory, None),
            File(path, data) => (path, data, EntryType::Regular, None),
            Symlink(path, target) => (path, "", EntryType::Symlink, Some(target)),
            HardLink(path, target) => (path, "", EntryType::Link, Some(target)),
        };
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        builder
            .append_data(&mut header, path, data.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap()
}

fn restore(members: &[Member<'_>], dest: &Path) -> Result<ExtractSummary, ArchiveError> {
    extract(&tar(members)[..], dest, Limits::DEFAULT)
}

/// `a/b/` is held by the cursors when `a` is replaced: the old `a/b` is no longer
/// reachable from DEST, and the next entry below it must fail as a walk from DEST
/// fails, not land in the old directory.
#[test]
fn a_replaced_parent_is_not_entered_through_a_kept_descriptor() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap();
    for (replacement, reason) in [
        (File("a", "file"), "a parent is not a directory"),
        (Symlink("a", target), "a parent is a symlink"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("dest");
        let members = [
            Dir("a/"),
            Dir("a/b/"),
            File("a/b/f", "old"),
            HardLink("h", "a/b/f"),
            replacement,
            File("a/b/x", "pwned"),
        ];
        let err = restore(&members, &dest).unwrap_err().to_string();
        assert!(err.contains("a/b/x") && err.contains(reason), "{err}");
        assert!(!dest.exists(), "DEST, made by the restore, is removed");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}

/// The hard-link cursor holds `a/b` when `a` is replaced by a file and then by a
/// new directory: the next link to `a/b/f` is to the new file, as from DEST.
#[test]
fn a_hard_link_reaches_its_target_in_the_directory_that_replaced_the_old_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let members = [
        File("a/b/f", "old"),
        HardLink("old", "a/b/f"),
        File("a", "file"),
        Dir("a/"),
        File("a/b/f", "new"),
        HardLink("new", "a/b/f"),
    ];
    restore(&members, &dest).unwrap();
    assert_eq!(fs::read_to_string(dest.join("old")).unwrap(), "old");
    assert_eq!(fs::read_to_string(dest.join("new")).unwrap(), "new");
    let ino = |p: &str| fs::metadata(dest.join(p)).unwrap().ino();
    assert_eq!(ino("new"), ino("a/b/f"));
}

/// Where the mount and a restore stop counting, for the same archive.
fn boundary(members: &[Member<'_>], expected: u64) {
    struct Discard;
    impl super::super::index::ContentSink for Discard {
        fn pack(&mut self, _data: &[u8]) -> io::Result<u64> {
            Ok(0)
        }
        fn own_file(&mut self, _node: u32) -> io::Result<Box<dyn Write + '_>> {
            Ok(Box::new(io::sink()))
        }
    }
    let bytes = tar(members);
    for max_entries in [expected, expected - 1] {
        let limits = Limits {
            max_entries,
            ..Limits::DEFAULT
        };
        let tmp = tempfile::tempdir().unwrap();
        let restored = extract(&bytes[..], &tmp.path().join("dest"), limits);
        let indexed = super::super::index::build(&bytes[..], &mut Discard, limits, 0);
        for (reader, result) in [
            ("restore", restored.map(drop)),
            ("index", indexed.map(drop)),
        ] {
            match result {
                Ok(()) if max_entries == expected => {}
                Err(ArchiveError::TooManyEntries(_)) if max_entries < expected => {}
                other => panic!("{reader} with --max-entries {max_entries}: {other:?}"),
            }
        }
    }
}

/// Directories entered again from afar count, the same in both readers; the
/// parents of a tree in tar's order pay nothing for them.
#[test]
fn the_mount_and_a_restore_count_reentered_directories_alike() {
    let deep = "d/".repeat(39);
    let (x, y) = (format!("x/{deep}f"), format!("y/{deep}g"));
    let (x2, y2) = (format!("x/{deep}f2"), format!("y/{deep}g2"));
    // Each file makes 40 directories (1 + 40 entries); then each entry re-enters
    // the 40 of the other tree: 8 beyond the 32 that are free.
    let alternating = [File(&x, "1"), File(&y, "2"), File(&x2, "3"), File(&y2, "4")];
    boundary(&alternating, 41 + 41 + 9 + 9);
    // Links: each target re-enters the 40 directories of the other tree; the
    // first starts from the root.
    let links = [
        File(&x, "1"),
        File(&y, "2"),
        HardLink("l1", &x),
        HardLink("l2", &y),
        HardLink("l3", &x),
    ];
    boundary(&links, 41 + 41 + 9 + 9 + 9);
    // A tree in tar's order, with its directories: one entry each, the parents
    // cost nothing more; the first link's target is 40 directories from the root,
    // 8 beyond the free ones, and the next link's shares them all.
    let mut dirs = vec![String::from("x/")];
    for depth in 1..=39 {
        dirs.push(format!("x/{}", "d/".repeat(depth)));
    }
    let mut ordered: Vec<Member<'_>> = dirs.iter().map(|d| Dir(d)).collect();
    ordered.extend([File(&x, "1"), File(&x2, "3")]);
    boundary(&ordered, 40 + 2);
    ordered.extend([HardLink("x/l", &x), HardLink("x/l2", &x2)]);
    boundary(&ordered, 40 + 2 + 9 + 1);
}

/// Directory attributes are set after everything below, wherever the archive put
/// the directories' entries, and only on the directories the entries made.
#[test]
fn directory_attributes_are_applied_below_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let members = [
        Dir("z/y/x/"),
        Dir("z/"),
        File("z/y/x/f", "f"),
        Dir("z/y-/"),
        Dir("z/y/"),
        Dir("q/"),
        File("q", "q"),
    ];
    restore(&members, &dest).unwrap();
    for dir in ["z", "z/y", "z/y/x", "z/y-"] {
        let meta = fs::metadata(dest.join(dir)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o755, "{dir}");
        assert_eq!(meta.mtime(), 1_700_000_000, "{dir}");
    }
    assert!(fs::metadata(dest.join("q")).unwrap().is_file());
}

/// A sparse file as `tar --sparse --format=pax` writes it (pax `GNU.sparse.*` records,
/// the data a sparse map then the file's pieces) is refused by a restore and by the
/// mount's indexer alike, naming the entry: the tar reader would give the raw map
/// and pieces where `tar -x` expands them. The restore leaves DEST absent.
#[test]
fn a_pax_sparse_file_is_refused_by_both_readers() {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_mtime(1_700_000_000);
    header.set_entry_type(EntryType::Regular);
    header.set_size(5);
    builder
        .append_data(&mut header, "before.txt", &b"fine\n"[..])
        .unwrap();
    builder
        .append_pax_extensions([
            ("GNU.sparse.major", &b"1"[..]),
            ("GNU.sparse.minor", &b"0"[..]),
            ("GNU.sparse.name", &b"s.bin"[..]),
            ("GNU.sparse.realsize", &b"1048576"[..]),
        ])
        .unwrap();
    let data = b"1\n0\n4\n\0"; // a map of one piece, then (padding elided) the piece
    let mut header = tar::Header::new_ustar();
    header.set_mode(0o644);
    header.set_mtime(1_700_000_000);
    header.set_entry_type(EntryType::Regular);
    header.set_size(data.len() as u64);
    builder
        .append_data(&mut header, "GNUSparseFile.1/s.bin", &data[..])
        .unwrap();
    let bytes = builder.into_inner().unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let restored = extract(&bytes[..], &dest, Limits::DEFAULT);
    let indexed = super::super::index::build(
        &bytes[..],
        &mut super::super::index::Discard,
        Limits::DEFAULT,
        0,
    );
    for (reader, result) in [
        ("restore", restored.map(drop)),
        ("index", indexed.map(drop)),
    ] {
        match result {
            Err(e @ ArchiveError::Hostile { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("GNUSparseFile.1/s.bin") && text.contains("sparse"),
                    "{reader}: {text}"
                );
            }
            other => panic!("{reader}: {other:?}"),
        }
    }
    assert!(!dest.exists() || fs::read_dir(&dest).unwrap().count() == 0);
}

/// A reader of `bytes` that first calls `meanwhile`, once: DEST's writer acting while
/// the restore runs (DEST was found empty before).
struct Meanwhile<F: FnMut()> {
    bytes: io::Cursor<Vec<u8>>,
    meanwhile: Option<F>,
}

impl<F: FnMut()> Read for Meanwhile<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(mut meanwhile) = self.meanwhile.take() {
            meanwhile();
        }
        self.bytes.read(buf)
    }
}

fn restore_meanwhile(
    members: &[Member<'_>],
    dest: &Path,
    meanwhile: impl FnMut(),
) -> Result<ExtractSummary, ArchiveError> {
    let reader = Meanwhile {
        bytes: io::Cursor::new(tar(members)),
        meanwhile: Some(meanwhile),
    };
    extract(reader, dest, Limits::DEFAULT)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A failed restore removes only what it made: a directory DEST's writer moved in
/// meanwhile stays, with what is in it (which the writer might not have been allowed
/// to remove: root restoring into another user's directory once emptied it whole).
#[test]
fn a_failed_restore_removes_only_what_it_made() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let theirs = tmp.path().join("theirs");
    fs::create_dir_all(theirs.join("sub")).unwrap();
    fs::write(theirs.join("sub/precious"), "kept").unwrap();
    let members = [
        Dir("a/"),
        File("a/f", "ours"),
        File("b", "ours"),
        HardLink("h", "missing"),
    ];
    restore_meanwhile(&members, &dest, || {
        fs::rename(&theirs, dest.join("theirs")).unwrap();
    })
    .unwrap_err();
    assert_eq!(names_in(&dest), ["theirs"]);
    assert_eq!(
        fs::read_to_string(dest.join("theirs/sub/precious")).unwrap(),
        "kept"
    );
}

/// The tree is made out of DEST's writer's reach and moved in whole; a name the
/// writer made meanwhile is neither replaced nor removed, and fails the restore,
/// whose names already moved in are taken back.
#[test]
fn a_restore_is_made_out_of_reach_and_keeps_a_name_made_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let members = [Dir("a/"), File("a/f", "ours"), File("b", "ours")];
    let summary = restore_meanwhile(&members, &dest, || {
        let names = names_in(&dest);
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with(".ckptfs-get-"), "{names:?}");
        let private = fs::metadata(dest.join(&names[0])).unwrap();
        assert_eq!(private.mode() & 0o7777, 0o700);
    })
    .unwrap();
    assert_eq!(summary.entries, 3);
    assert_eq!(names_in(&dest), ["a", "b"]);
    assert_eq!(fs::read_to_string(dest.join("a/f")).unwrap(), "ours");

    let dest = tmp.path().join("dest2");
    fs::create_dir(&dest).unwrap();
    let err = restore_meanwhile(&members, &dest, || {
        fs::write(dest.join("b"), "theirs").unwrap();
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("changed during the restore"),
        "{err}"
    );
    assert_eq!(names_in(&dest), ["b"]);
    assert_eq!(fs::read_to_string(dest.join("b")).unwrap(), "theirs");
}

type Hook = Box<dyn FnMut(&[u8])>;

thread_local! {
    /// Called by a restore after each name it moves into DEST, in this thread's tests.
    static AFTER_MOVE: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
}

pub(super) fn after_move(name: &[u8]) {
    AFTER_MOVE.with(|hook| {
        if let Some(hook) = hook.borrow_mut().as_mut() {
            hook(name);
        }
    });
}

/// While names move into DEST, a restored top-level directory is still the
/// restoring user's and 0700, whatever its archive mode: DEST's writer can put
/// nothing in it before a failed move takes it back and empties it (a directory
/// given its archive owner first could be filled with a tree of theirs the clean-up
/// then removed).
#[test]
fn a_directory_moved_into_dest_is_closed_until_every_name_is_in() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, mode) in [
        ("a/", EntryType::Directory, 0o777),
        ("a/f", EntryType::Regular, 0o644),
        ("b", EntryType::Regular, 0o644),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(1_700_000_000);
        header.set_size(0);
        builder.append_data(&mut header, path, &[][..]).unwrap();
    }
    let archive = builder.into_inner().unwrap();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let (in_hook, dest_in_hook) = (seen.clone(), dest.clone());
    AFTER_MOVE.with(|hook| {
        *hook.borrow_mut() = Some(Box::new(move |name: &[u8]| {
            if name == b"a" {
                let mode = fs::metadata(dest_in_hook.join("a")).unwrap().mode() & 0o7777;
                in_hook.borrow_mut().push(mode);
                fs::write(dest_in_hook.join("b"), "theirs").unwrap();
            }
        }))
    });
    let err = extract(&archive[..], &dest, Limits::DEFAULT).unwrap_err();
    AFTER_MOVE.with(|hook| hook.borrow_mut().take());
    assert!(
        err.to_string().contains("changed during the restore"),
        "{err}"
    );
    assert_eq!(*seen.borrow(), [0o700]);
    assert_eq!(names_in(&dest), ["b"]);
    assert_eq!(fs::read_to_string(dest.join("b")).unwrap(), "theirs");

    // Whole, it has its own mode.
    let dest = tmp.path().join("dest2");
    extract(&archive[..], &dest, Limits::DEFAULT).unwrap();
    assert_eq!(fs::metadata(dest.join("a")).unwrap().mode() & 0o7777, 0o777);
}

/// A DEST the restore makes is 0700 while the tree is made, then gets the mode of
/// the archive's own directory (`./`, which ckptfs writes for a private root) or, for
/// an archive without one, what mkdir(1) gives; a DEST that existed keeps its own.
#[test]
fn a_dest_made_by_the_restore_takes_the_archives_private_root_mode() {
    let private = {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, mode) in [
            ("secret", EntryType::Regular, 0o644),
            ("./", EntryType::Directory, 0o700),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_mode(mode);
            header.set_uid(1000);
            header.set_gid(1000);
            header.set_entry_type(kind);
            header.set_size(0);
            builder.append_data(&mut header, path, &b""[..]).unwrap();
        }
        builder.into_inner().unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o7777;
    let made = tmp.path().join("made");
    extract(&private[..], &made, Limits::DEFAULT).unwrap();
    assert_eq!(mode(&made), 0o700);
    assert!(made.join("secret").exists());
    if rustix::process::geteuid().is_root() {
        // Root restores the owner too, so that the owner reaches their tree.
        assert_eq!(std::fs::metadata(&made).unwrap().uid(), 1000);
    }
    let existing = tmp.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o751)).unwrap();
    extract(&private[..], &existing, Limits::DEFAULT).unwrap();
    assert_eq!(mode(&existing), 0o751);
    let open = tmp.path().join("open");
    restore(&[File("f", "x")], &open).unwrap();
    assert_eq!(mode(&open), 0o777 & !umask());
    // A root open for writing to all is not made so.
    let hostile = tar(&[Dir("./"), File("f", "x")]);
    let mut hostile = hostile;
    // `tar` above writes every mode as 0755: make the root's 0773.
    let mut header = tar::Header::from_byte_slice(&hostile[..512]).clone();
    assert_eq!(header.path_bytes().as_ref(), b"./");
    header.set_mode(0o773);
    header.set_cksum();
    hostile[..512].copy_from_slice(header.as_bytes());
    let writable = tmp.path().join("writable");
    extract(&hostile[..], &writable, Limits::DEFAULT).unwrap();
    assert_eq!(mode(&writable), 0o751);
}
