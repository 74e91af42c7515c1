//! Restores a verified archive into a destination directory, never acting outside it.
//!
//! The archive is treated as hostile, and the restore works through descriptors, not
//! path strings (see [`crate::beneath`]):
//! - DEST is opened once; every entry's parent is reached from that descriptor one
//!   component at a time with `O_NOFOLLOW`, so a symlink the archive planted, or a
//!   path a later entry replaced, can never lead outside: the walk fails instead, and
//!   the whole archive is refused;
//! - the walk is a [`DirCursor`]: the directories an entry's parent shares with the
//!   previous entry's are not opened again, so the cost of a restore is about one
//!   `openat` per entry plus one per directory it enters anew, however deep the tree
//!   (reopening every level for every entry made 20,000 files 2,000 levels deep take
//!   minutes). A kept descriptor goes stale only if a directory on its path is
//!   removed, and only an entry replacing a directory does that, at its own path,
//!   below the parent it was restored in: then every cursor forgets that path and
//!   what is below it, so no descriptor of a directory the archive replaced is ever
//!   used again (the next entry below that path fails to enter what replaced it, as
//!   it would walking from DEST);
//! - absolute paths and `..` components are refused before any call;
//! - files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` after whatever an earlier
//!   duplicate left was removed (the last duplicate wins, as with tar), and their mode,
//!   owner and mtime are set on that descriptor;
//! - a hard link's target is resolved beneath DEST the same way (with a cursor of its
//!   own) and linked with `linkat` without following it;
//! - directory modes and mtimes are applied last, each directory after everything
//!   below it (so that creating their contents does not disturb them, and a mode
//!   without search permission does not stop the walk), on a descriptor opened after
//!   the last entry and checked to be the very directory this restore made; nothing
//!   remembered about one entry is trusted for a later one without looking again.
//!
//! Device files and FIFOs are skipped; set-user/group-ID bits are dropped; owners are
//! restored only when running as root, as `tar` does. The limits of [`Limits`] apply,
//! and bound the restore's time too, whatever the order of the entries: directories a
//! path enters anew count toward `max_entries` beyond a few an entry (see
//! [`super::FREE_REENTRIES`]), so the calls a cursor makes stay within a constant
//! times the entries counted.
//! DEST must be absent or an empty directory, and a restore that fails leaves it as
//! it found it (absent, or empty).
//!
//! Whoever may write DEST (its owner, when root restores into another user's
//! directory) may change it while a restore runs, and must not be able to make the
//! restore act on anything of theirs, nor the clean-up of a failed one remove it. So
//! the tree is made in a private directory in DEST (`.ckptfs-get-<random>`, 0700,
//! checked after it is opened to be the restoring user's own, new and empty), which
//! no one else can enter, and its top-level names are moved into DEST once it is
//! whole (`RENAME_NOREPLACE`). Only the private directory is ever emptied; a name moved
//! into DEST is taken back only after it is moved back into the private directory
//! and found to be the very entry the restore moved out (anything else goes back).
//! Top-level directories get their attributes (owner, mode) only once every name is
//! in DEST: until then they are the restoring user's and 0700, so nothing of anyone
//! else's can be inside one that is taken back and emptied; a failure after that
//! leaves the tree in DEST and says so.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, RenameFlags, Timespec, Timestamps};
use tar::EntryType;

use super::{
    ArchiveError, Entry, EntryMeta, Limits, PreviousPath, Tally, clean_path, display_path,
    entry_meta,
};
use crate::beneath::{self, DirCursor, WalkError};

/// What a restore did, for the command's summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExtractSummary {
    pub entries: u64,
    pub bytes: u64,
    pub skipped: u64,
}

/// Attributes of a directory entry, applied when the restore ends.
struct DirAttrs {
    /// The path below DEST, components joined by NUL, which no name holds, so that the
    /// byte order of paths is the order of their component sequences (one allocation
    /// per entry).
    path: Vec<u8>,
    /// The directory this restore made or found for the entry.
    dev_ino: (u64, u64),
    mode: u32,
    meta: EntryMeta,
}

struct Extractor {
    /// The private directory the tree is made in (see the module comment).
    root: OwnedFd,
    /// The mode and owner of the archive's own directory (`./`), if it has one.
    root_mode: Option<(u32, EntryMeta)>,
    /// DEST, for messages.
    dest: std::path::PathBuf,
    /// At the parent of the last entry.
    parents: DirCursor,
    /// At the directory of the last hard link's target.
    link_targets: DirCursor,
    /// The same two paths as the archive gives them, for [`Tally::reentered`] (the
    /// cursors may have given up part of theirs).
    previous_parent: PreviousPath,
    previous_target: PreviousPath,
    /// Directory attributes to apply at the end, the last entry for a directory
    /// winning; indexed by the directory's identity.
    dirs: Vec<DirAttrs>,
    dir_index: HashMap<(u64, u64), usize>,
    /// Top-level directories, whose attributes wait until every name is moved into
    /// DEST: until then each is the restoring user's, 0700, so no one else can have
    /// put anything in it when a failed move takes it back and empties it (and a
    /// directory its owner cannot write cannot move to another parent, for a user
    /// other than root).
    top_dirs: Vec<DirAttrs>,
    as_root: bool,
    summary: ExtractSummary,
}

/// Extracts the tar stream `tar` (already decompressed and verified) into `dest`.
pub fn extract(
    tar: impl Read,
    dest: &Path,
    limits: Limits,
) -> Result<ExtractSummary, ArchiveError> {
    let (dest_fd, made) = open_destination(dest)?;
    let created = made.is_some();
    let io_err = |what: &str| ArchiveError::io(format!("{what} destination {}", dest.display()));
    // Through the parent it was made in: the path may lead elsewhere by now.
    let remove_dest = || {
        if let Some((parent, name)) = &made {
            let _ = rfs::unlinkat(parent, name.as_os_str(), AtFlags::REMOVEDIR);
        }
    };
    let (root, private) = match make_private_dir(&dest_fd) {
        Ok(made) => made,
        Err(e) => {
            remove_dest();
            return Err(io_err("make a private directory in")(e));
        }
    };
    let mut foreign = false;
    let result = restore_in(&root, tar, limits, dest).and_then(|mut extractor| {
        extractor.move_into(&dest_fd, &mut foreign)?;
        if created {
            // Made 0700, it gets the mode of the archive's own directory, which kept
            // a private tree private (a 0700 workspace), and for root its owner, as
            // the entries in it get theirs; or else the mode mkdir(1) would give.
            let mode = match extractor.root_mode {
                Some((mode, meta)) => {
                    if extractor.as_root {
                        let (uid, gid) = ids(meta);
                        rfs::fchown(&dest_fd, uid, gid).map_err(|e| io_err("chown")(e.into()))?;
                    }
                    mode
                }
                None => 0o777 & !umask(),
            };
            rfs::fchmod(&dest_fd, Mode::from_raw_mode(mode))
                .map_err(|e| io_err("chmod")(e.into()))?;
        }
        Ok(extractor.summary)
    });
    if foreign {
        tracing::warn!(
            dest = %dest.display(),
            name = %private.to_string_lossy(),
            "the restore's private directory holds something it did not make, and is left as it is"
        );
        return result;
    }
    // Whatever this restore made and did not move into DEST is in the private
    // directory (all of it, after a failure), which only this descriptor reaches.
    if let Err(cleanup) = empty_directory(&root) {
        tracing::warn!(dest = %dest.display(), error = %cleanup, "could not clean up after a restore");
        return result;
    }
    // By name: DEST's writer may have renamed it (it then stays, empty) or put an
    // empty directory of theirs in its place (which goes; they could remove it).
    if let Err(e) = rfs::unlinkat(&dest_fd, &private, AtFlags::REMOVEDIR) {
        tracing::warn!(dest = %dest.display(), error = %e, "could not remove the restore's private directory");
    }
    if result.is_err() {
        remove_dest();
    }
    result
}

/// Restores the archive in the private directory `root`.
fn restore_in(
    root: &OwnedFd,
    tar: impl Read,
    limits: Limits,
    dest: &Path,
) -> Result<Extractor, ArchiveError> {
    let open_err = || ArchiveError::io(format!("open destination {}", dest.display()));
    let cursor = || DirCursor::new(root.as_fd()).map_err(open_err());
    let mut extractor = Extractor {
        parents: cursor()?,
        link_targets: cursor()?,
        root: root.try_clone().map_err(open_err())?,
        root_mode: None,
        dest: dest.to_owned(),
        previous_parent: PreviousPath::default(),
        previous_target: PreviousPath::default(),
        dirs: Vec::new(),
        dir_index: HashMap::new(),
        top_dirs: Vec::new(),
        as_root: rustix::process::geteuid().is_root(),
        summary: ExtractSummary::default(),
    };
    super::for_each_entry(tar, limits, |entry, tally| extractor.entry(entry, tally))?;
    extractor.finish_directories()?;
    Ok(extractor)
}

/// Makes the private directory of a restore in DEST (see the module comment); returns
/// it, open, and its name.
fn make_private_dir(dest: &OwnedFd) -> io::Result<(OwnedFd, std::ffi::OsString)> {
    use std::hash::{BuildHasher, Hasher};
    let mut tries = 0;
    loop {
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u32(std::process::id());
        let name = std::ffi::OsString::from(format!(".ckptfs-get-{:016x}", random.finish()));
        match rfs::mkdirat(dest, &name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) if tries < 8 => {
                tries += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        // Between the mkdir and the open, DEST's writer may have put something else
        // under the name: only an empty directory of the restoring user's is taken,
        // and made 0700 whatever the umask gave it.
        let fd = beneath::open_dir(dest, &name)?;
        let ours = rfs::fstat(&fd)?.st_uid == rustix::process::geteuid().as_raw()
            && beneath::list(&fd)?.is_empty();
        if !ours {
            return Err(io::Error::other(
                "a private directory was replaced while it was made",
            ));
        }
        rfs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        return Ok((fd, name));
    }
}

/// DEST's parent directory and DEST's name in it, when the restore made DEST.
type Made = Option<(OwnedFd, std::ffi::OsString)>;

/// Opens DEST, an empty directory, making it if it does not exist; returns it and,
/// if it was made, its parent and name. DEST is opened without following a link and
/// checked for emptiness through that descriptor, which every later step uses: a name
/// swapped between a check by path and an open by path once let a restore (and the
/// clean-up of a failed one) act on another directory. A DEST it makes is made and
/// opened through one descriptor of its parent, so that the directory given DEST's
/// mode and owner at the end (see `extract`) is the one it made, whatever a writer of
/// a directory above does to the path meanwhile.
fn open_destination(dest: &Path) -> Result<(OwnedFd, Made), ArchiveError> {
    let open = || {
        rfs::open(
            dest,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let refused = |reason: &str| ArchiveError::Destination {
        path: dest.to_owned(),
        reason: reason.into(),
    };
    let io_error = |what: &str| ArchiveError::io(format!("{what} destination {}", dest.display()));
    let (fd, made) = match open() {
        Ok(fd) => (fd, None),
        Err(rustix::io::Errno::NOENT) => {
            // Only DEST itself is made, as mkdir(1) would: a mistyped parent is an
            // error, not a new tree somewhere on the host.
            let no_parent =
                || refused("cannot be made: its parent directory does not exist (create it first)");
            let name = dest.file_name().ok_or_else(no_parent)?.to_owned();
            let parent = match dest.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            let parent = rfs::open(
                parent,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                rustix::io::Errno::NOENT => no_parent(),
                e => io_error("open the parent of")(e.into()),
            })?;
            // 0700 until the tree is whole (see `extract`).
            rfs::mkdirat(&parent, name.as_os_str(), Mode::from_raw_mode(0o700))
                .map_err(|e| io_error("create")(e.into()))?;
            let fd = rfs::openat(
                &parent,
                name.as_os_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                    refused("was replaced by something else while it was made")
                }
                e => io_error("open")(e.into()),
            })?;
            (fd, Some((parent, name)))
        }
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return Err(refused("exists and is not a directory (or is a symlink)"));
        }
        Err(e) => return Err(io_error("open")(e.into())),
    };
    let mut listing = rfs::Dir::read_from(&fd).map_err(|e| io_error("read")(e.into()))?;
    while let Some(entry) = listing.read() {
        let entry = entry.map_err(|e| io_error("read")(e.into()))?;
        if !matches!(entry.file_name().to_bytes(), b"." | b"..") {
            return Err(refused(
                "is not empty (restore into a new or empty directory)",
            ));
        }
    }
    Ok((fd, made))
}

/// The process's umask (from `/proc`, which reads it without changing it).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            u32::from_str_radix(line.trim(), 8).ok()
        })
        .unwrap_or(0o022)
}

fn empty_directory(dir: &OwnedFd) -> io::Result<()> {
    let mut names = Vec::new();
    let mut listing = rfs::Dir::read_from(dir).map_err(io::Error::from)?;
    while let Some(entry) = listing.read() {
        let name = entry
            .map_err(io::Error::from)?
            .file_name()
            .to_bytes()
            .to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    for name in names {
        beneath::remove_at(dir, OsStr::from_bytes(&name))?;
    }
    Ok(())
}

fn timestamps(mtime: i64) -> Timestamps {
    let time = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: time,
        last_modification: time,
    }
}

impl Extractor {
    /// Extracts one entry.
    fn entry<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        tally: &mut Tally,
    ) -> Result<(), ArchiveError> {
        let raw = entry.path_bytes().into_owned();
        let shown = display_path(&raw);
        let parts = clean_path(&raw).map_err(|reason| ArchiveError::Hostile {
            entry: shown.clone(),
            reason,
        })?;
        let Some((name, parents)) = parts.split_last() else {
            // The archive's root (`./`): DEST itself, which keeps its own attributes,
            // but for its mode when the restore made it (see `extract`).
            if entry.header().entry_type().is_dir()
                && let Ok(mode) = entry.header().mode()
            {
                // Never writable by others through a DEST of ckptfs's making.
                self.root_mode = Some((mode & 0o755, entry_meta(entry)?));
            }
            return Ok(());
        };
        self.summary.entries += 1;
        let replaced_dir = self.restore(entry, tally, parents, OsStr::from_bytes(name), &shown)?;
        if replaced_dir {
            // The directory at this path, and every one below it, is gone: no cursor
            // may use a descriptor of one again. (The parents cursor is above it.)
            self.parents.forget(&parts);
            self.link_targets.forget(&parts);
        }
        Ok(())
    }

    /// Restores `entry` as `name` in the directory at `parents`; says whether a
    /// directory that was at that path was removed (replaced by something else).
    fn restore<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        tally: &mut Tally,
        parents: &[&[u8]],
        name: &OsStr,
        shown: &str,
    ) -> Result<bool, ArchiveError> {
        let kind = entry.header().entry_type();
        let shared = self.previous_parent.follow(parents);
        let (parent, made) = make_parent(&mut self.parents, parents, shown, tally)?;
        tally.reentered((parents.len() - shared).saturating_sub(made))?;
        let mode = entry
            .header()
            .mode()
            .map_err(ArchiveError::io(format!("entry {shown}")))?
            & 0o1777;
        let at = At {
            parent,
            name,
            shown,
            mode,
            meta: entry_meta(entry)?,
        };
        match kind {
            EntryType::Directory => {
                let attrs = restore_dir(&at, parents)?;
                self.remember_dir(attrs);
                Ok(false) // a directory there is kept, anything else was not one
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let replaced_dir = restore_file(&at, entry, tally, self.as_root)?;
                self.summary.bytes += entry.size();
                Ok(replaced_dir)
            }
            EntryType::Symlink => restore_symlink(&at, entry, self.as_root),
            EntryType::Link => {
                let targets = (&mut self.link_targets, &mut self.previous_target);
                restore_link(&at, entry, tally, targets)
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                tracing::warn!(entry = %shown, "skipping device file or FIFO");
                self.summary.skipped += 1;
                Ok(false)
            }
            other => {
                tracing::warn!(entry = %shown, kind = ?other, "skipping entry of unsupported type");
                self.summary.skipped += 1;
                Ok(false)
            }
        }
    }

    fn remember_dir(&mut self, attrs: DirAttrs) {
        match self.dir_index.get(&attrs.dev_ino) {
            Some(&i) => self.dirs[i] = attrs,
            None => {
                self.dir_index.insert(attrs.dev_ino, self.dirs.len());
                self.dirs.push(attrs);
            }
        }
    }

    /// Applies directory attributes, each directory after every one below it, on a
    /// descriptor of the directory found at its path now, and only if it is still the
    /// one this restore made for the entry (a later entry may have replaced it).
    fn finish_directories(&mut self) -> Result<(), ArchiveError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        // Paths in reverse byte order (see `DirAttrs::path`): everything below a
        // directory comes before it, and neighbours share most of their paths, so the
        // cursor opens about one directory per path, however deep. Nothing goes
        // through a directory once its mode is set, which could forbid it.
        dirs.sort_unstable_by(|a, b| b.path.cmp(&a.path));
        self.link_targets.clear();
        self.parents.clear(); // everything is opened again, now that no entry is left
        for dir in dirs {
            if !dir.path.contains(&0) {
                self.top_dirs.push(dir);
                continue;
            }
            let parts: Vec<&[u8]> = dir.path.split(|&b| b == 0).collect();
            let Ok(fd) = self.parents.open(&parts) else {
                continue; // replaced by a later entry that is not a directory
            };
            apply_dir_attrs(&dir, fd, self.as_root)?;
        }
        Ok(())
    }

    /// Moves the tree's top-level names from the private directory into DEST
    /// (`RENAME_NOREPLACE`), then applies the attributes kept for after the move. If
    /// a move fails (DEST's writer made the name meanwhile), takes back what it
    /// moved: each name is moved back into the private directory and kept there only
    /// if it is the entry this restore moved out; anything else is moved back to DEST,
    /// and if that fails too, `foreign` is set and the private directory must not be
    /// emptied.
    fn move_into(&mut self, dest: &OwnedFd, foreign: &mut bool) -> Result<(), ArchiveError> {
        let io_err =
            |what: &str| ArchiveError::io(format!("{what} destination {}", self.dest.display()));
        let mut names = beneath::list(&self.root).map_err(io_err("list the restored tree for"))?;
        names.sort_unstable();
        let mut moved: Vec<(Vec<u8>, (u64, u64))> = Vec::new();
        for (name, _) in names {
            let n = OsStr::from_bytes(&name);
            let moved_out =
                rfs::statat(&self.root, n, AtFlags::SYMLINK_NOFOLLOW).and_then(|stat| {
                    rfs::renameat_with(&self.root, n, dest, n, RenameFlags::NOREPLACE)?;
                    Ok((stat.st_dev, stat.st_ino))
                });
            match moved_out {
                Ok(id) => {
                    #[cfg(test)]
                    tests::after_move(&name);
                    moved.push((name, id));
                }
                Err(e) => {
                    *foreign = !self.take_back(dest, &moved);
                    return Err(match e {
                        rustix::io::Errno::EXIST => ArchiveError::Destination {
                            path: self.dest.clone(),
                            reason: format!(
                                "changed during the restore: {} appeared in it",
                                display_path(&name)
                            ),
                        },
                        e => io_err("move the restored tree into")(e.into()),
                    });
                }
            }
        }
        for dir in std::mem::take(&mut self.top_dirs) {
            // Opened by name in DEST, whose writer may have swapped it: applied only if
            // it is the directory this restore made (not there, or not a directory:
            // a later entry of the archive replaced it).
            let name = OsStr::from_bytes(&dir.path);
            let Ok(fd) = beneath::open_dir(dest, name) else {
                continue;
            };
            if let Err(e) = apply_dir_attrs(&dir, fd.as_fd(), self.as_root) {
                // The tree is in DEST, its writer may have been let into it: it is
                // left there, and the error says so.
                return Err(ArchiveError::Destination {
                    path: self.dest.clone(),
                    reason: format!(
                        "restored, but the attributes of its directories could not all be applied: {e}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Takes back the names `moved` into DEST (see [`Self::move_into`]); says whether
    /// the private directory holds only what this restore made.
    fn take_back(&self, dest: &OwnedFd, moved: &[(Vec<u8>, (u64, u64))]) -> bool {
        let mut clean = true;
        for (name, id) in moved {
            let n = OsStr::from_bytes(name);
            if rfs::renameat_with(dest, n, &self.root, n, RenameFlags::NOREPLACE).is_err() {
                continue; // gone from DEST: nothing of ours to take back there
            }
            let ours = rfs::statat(&self.root, n, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| (stat.st_dev, stat.st_ino) == *id);
            if !ours && rfs::renameat_with(&self.root, n, dest, n, RenameFlags::NOREPLACE).is_err()
            {
                clean = false;
            }
        }
        clean
    }
}

/// Applies `dir`'s attributes to `fd`, if it is still the directory this restore
/// made for it (a later entry may have replaced it).
fn apply_dir_attrs(dir: &DirAttrs, fd: BorrowedFd<'_>, as_root: bool) -> Result<(), ArchiveError> {
    let io_err = |what: &str| {
        let slashed: Vec<u8> = dir
            .path
            .iter()
            .map(|&b| if b == 0 { b'/' } else { b })
            .collect();
        ArchiveError::io(format!("{what} {}", display_path(&slashed)))
    };
    let stat = rfs::fstat(fd).map_err(|e| io_err("stat")(e.into()))?;
    if (stat.st_dev, stat.st_ino) != dir.dev_ino {
        return Ok(());
    }
    if as_root {
        let (uid, gid) = ids(dir.meta);
        rfs::fchown(fd, uid, gid).map_err(|e| io_err("chown")(e.into()))?;
    }
    rfs::fchmod(fd, Mode::from_raw_mode(dir.mode)).map_err(|e| io_err("chmod")(e.into()))?;
    rfs::futimens(fd, &timestamps(dir.meta.mtime)).map_err(|e| io_err("set mtime of")(e.into()))
}

/// Where an entry is restored (`name` in `parent`), and what its header says.
struct At<'a> {
    parent: BorrowedFd<'a>,
    name: &'a OsStr,
    /// The entry's path as messages show it.
    shown: &'a str,
    mode: u32,
    meta: EntryMeta,
}

impl At<'_> {
    fn io_err(&self, what: &str) -> impl FnOnce(io::Error) -> ArchiveError {
        ArchiveError::io(format!("{what} {}", self.shown))
    }

    fn hostile(&self, reason: &'static str) -> ArchiveError {
        ArchiveError::Hostile {
            entry: self.shown.to_owned(),
            reason,
        }
    }

    /// Removes what is at the path; says whether it was a directory.
    fn replace(&self) -> Result<bool, ArchiveError> {
        beneath::remove_kind_at(self.parent, self.name)
            .map(|kind| kind == Some(FileType::Directory))
            .map_err(self.io_err("replace"))
    }
}

/// Makes (or keeps) the directory; its attributes are applied when the restore ends.
fn restore_dir(at: &At<'_>, parents: &[&[u8]]) -> Result<DirAttrs, ArchiveError> {
    let (parent, name) = (at.parent, at.name);
    let made = match beneath::kind_at(parent, name).map_err(at.io_err("stat"))? {
        Some(FileType::Directory) => false,
        Some(_) => {
            beneath::remove_at(parent, name).map_err(at.io_err("replace"))?;
            true
        }
        None => true,
    };
    if made {
        rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
            .map_err(|e| at.io_err("create directory")(e.into()))?;
    }
    let dir = beneath::open_dir(parent, name).map_err(at.io_err("open directory"))?;
    let stat = rfs::fstat(&dir).map_err(|e| at.io_err("stat")(e.into()))?;
    let mut path = parents.join(&0);
    if !path.is_empty() {
        path.push(0);
    }
    path.extend_from_slice(name.as_bytes());
    Ok(DirAttrs {
        path,
        dev_ino: (stat.st_dev, stat.st_ino),
        mode: at.mode,
        meta: at.meta,
    })
}

/// Writes a regular file, counting its bytes against the limits; says whether a
/// directory was replaced.
fn restore_file<R: Read>(
    at: &At<'_>,
    entry: &mut Entry<'_, R>,
    tally: &mut Tally,
    as_root: bool,
) -> Result<bool, ArchiveError> {
    let replaced_dir = at.replace()?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rfs::openat(at.parent, at.name, flags, Mode::from_raw_mode(0o600))
        .map_err(|e| at.io_err("create")(e.into()))?;
    let mut file = File::from(fd);
    copy_counted(entry, &mut file, tally).map_err(|e| match e {
        CopyError::Read(e) => ArchiveError::Corrupt(e),
        CopyError::Write(e) => at.io_err("write")(e),
        CopyError::Limit(e) => e,
    })?;
    if as_root {
        let (uid, gid) = ids(at.meta);
        rfs::fchown(&file, uid, gid).map_err(|e| at.io_err("chown")(e.into()))?;
    }
    rfs::fchmod(&file, Mode::from_raw_mode(at.mode)).map_err(|e| at.io_err("chmod")(e.into()))?;
    rfs::futimens(&file, &timestamps(at.meta.mtime))
        .map_err(|e| at.io_err("set mtime of")(e.into()))?;
    Ok(replaced_dir)
}

/// Makes a symlink (never followed); says whether a directory was replaced.
fn restore_symlink<R: Read>(
    at: &At<'_>,
    entry: &mut Entry<'_, R>,
    as_root: bool,
) -> Result<bool, ArchiveError> {
    let target = entry
        .link_name_bytes()
        .ok_or_else(|| at.hostile("symlink without a target"))?
        .into_owned();
    let replaced_dir = at.replace()?;
    rfs::symlinkat(OsStr::from_bytes(&target), at.parent, at.name)
        .map_err(|e| at.io_err("create symlink")(e.into()))?;
    set_owner_and_mtime_at(as_root, at.parent, at.name, at.meta)
        .map_err(at.io_err("set attributes of"))?;
    Ok(replaced_dir)
}

/// Makes a hard link to a file the archive restored before (the target's directory
/// reached with its own cursor, and its path tallied); says whether a directory was
/// replaced.
fn restore_link<R: Read>(
    at: &At<'_>,
    entry: &mut Entry<'_, R>,
    tally: &mut Tally,
    (targets, previous_target): (&mut DirCursor, &mut PreviousPath),
) -> Result<bool, ArchiveError> {
    let target = entry
        .link_name_bytes()
        .ok_or_else(|| at.hostile("hard link without a target"))?
        .into_owned();
    let link_hostile = |reason| ArchiveError::Hostile {
        entry: format!("{} -> {}", at.shown, display_path(&target)),
        reason,
    };
    let target_parts = clean_path(&target).map_err(link_hostile)?;
    let (target_name, target_parents) = target_parts
        .split_last()
        .ok_or_else(|| link_hostile("hard link to the archive's root"))?;
    let shared = previous_target.follow(target_parents);
    let target_dir = targets
        .open(target_parents)
        .map_err(|_| link_hostile("hard link to a file that is not in the archive"))?;
    tally.reentered(target_parents.len() - shared)?;
    let target_name = OsStr::from_bytes(target_name);
    match beneath::kind_at(target_dir, target_name) {
        Ok(Some(FileType::Directory)) => return Err(link_hostile("hard link to a directory")),
        Ok(Some(_)) => {}
        _ => {
            return Err(link_hostile(
                "hard link to a file that is not in the archive",
            ));
        }
    }
    if same_entry(target_dir, target_name, at.parent, at.name) {
        return Ok(false); // a link to itself: already in place
    }
    let replaced_dir = at.replace()?;
    rfs::linkat(
        target_dir,
        target_name,
        at.parent,
        at.name,
        AtFlags::empty(),
    )
    .map_err(|e| at.io_err("create hard link")(e.into()))?;
    Ok(replaced_dir)
}

/// Opens (creating missing ones, like tar) the parent directories of an entry, below
/// DEST and through directories only, with `cursor`; says how many it made.
fn make_parent<'c>(
    cursor: &'c mut DirCursor,
    parents: &[&[u8]],
    shown: &str,
    tally: &mut Tally,
) -> Result<(BorrowedFd<'c>, usize), ArchiveError> {
    let (mut limit, mut made) = (None, 0);
    let result = cursor.make(parents, 0o777, &mut || {
        made += 1;
        tally.entry().map_err(|e| {
            limit = Some(e);
            io::Error::other("limit")
        })
    });
    result.map(|dir| (dir, made)).map_err(|e| match e {
        _ if limit.is_some() => limit.take().expect("checked"),
        WalkError::Symlink => ArchiveError::Hostile {
            entry: shown.to_owned(),
            reason: "a parent is a symlink; writing through it could leave the destination",
        },
        WalkError::NotADirectory => ArchiveError::Hostile {
            entry: shown.to_owned(),
            reason: "a parent is not a directory",
        },
        WalkError::Io(e) => ArchiveError::io(format!("create the parents of {shown}"))(e),
    })
}

/// Sets the owner (as root) and mtime of `name` in `dir` itself, never of what it
/// points to.
fn set_owner_and_mtime_at(
    as_root: bool,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    meta: EntryMeta,
) -> io::Result<()> {
    if as_root {
        let (uid, gid) = ids(meta);
        rfs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
    }
    rfs::utimensat(
        dir,
        name,
        &timestamps(meta.mtime),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

fn ids(meta: EntryMeta) -> (Option<rustix::process::Uid>, Option<rustix::process::Gid>) {
    let uid = u32::try_from(meta.uid)
        .ok()
        .map(rustix::process::Uid::from_raw);
    let gid = u32::try_from(meta.gid)
        .ok()
        .map(rustix::process::Gid::from_raw);
    (uid, gid)
}

/// Whether `a_dir/a` and `b_dir/b` are the same inode.
fn same_entry(a_dir: BorrowedFd<'_>, a: &OsStr, b_dir: BorrowedFd<'_>, b: &OsStr) -> bool {
    let stat = |dir, name| rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
    match (stat(a_dir, a), stat(b_dir, b)) {
        (Some(x), Some(y)) => (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino),
        _ => false,
    }
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
    Limit(ArchiveError),
}

/// Copies an entry's data, counting every byte against the limits before writing it.
fn copy_counted(from: &mut impl Read, to: &mut File, tally: &mut Tally) -> Result<(), CopyError> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        tally.bytes(n as u64).map_err(CopyError::Limit)?;
        to.write_all(&buf[..n]).map_err(CopyError::Write)?;
    }
}

#[cfg(test)]
mod tests;
