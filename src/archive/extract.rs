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

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
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
    dest: OwnedFd,
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
    as_root: bool,
    summary: ExtractSummary,
}

/// Extracts the tar stream `tar` (already decompressed and verified) into `dest`.
pub fn extract(
    tar: impl Read,
    dest: &Path,
    limits: Limits,
) -> Result<ExtractSummary, ArchiveError> {
    let (dest_fd, created) = open_destination(dest)?;
    let cursor = || {
        DirCursor::new(dest_fd.as_fd()).map_err(ArchiveError::io(format!(
            "open destination {}",
            dest.display()
        )))
    };
    let (parents, link_targets) = (cursor()?, cursor()?);
    let mut extractor = Extractor {
        dest: dest_fd,
        parents,
        link_targets,
        previous_parent: PreviousPath::default(),
        previous_target: PreviousPath::default(),
        dirs: Vec::new(),
        dir_index: HashMap::new(),
        as_root: rustix::process::geteuid().is_root(),
        summary: ExtractSummary::default(),
    };
    let result = super::for_each_entry(tar, limits, |entry, tally| extractor.entry(entry, tally))
        .and_then(|_| extractor.finish_directories());
    match result {
        Ok(()) => Ok(extractor.summary),
        Err(e) => {
            // Leave DEST as it was found: whatever this restore made goes.
            if let Err(cleanup) = empty_directory(&extractor.dest) {
                tracing::warn!(dest = %dest.display(), error = %cleanup, "could not clean up after a failed restore");
            } else if created {
                let _ = fs::remove_dir(dest);
            }
            Err(e)
        }
    }
}

/// Opens DEST, an empty directory, making it if it does not exist; returns it and
/// whether it was made. DEST is opened without following a link and checked for
/// emptiness through that descriptor, which every later step uses: a name swapped
/// between a check by path and an open by path once let a restore (and the clean-up
/// of a failed one) act on another directory.
fn open_destination(dest: &Path) -> Result<(OwnedFd, bool), ArchiveError> {
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
    let (fd, created) = match open() {
        Ok(fd) => (fd, false),
        Err(rustix::io::Errno::NOENT) => {
            // Only DEST itself is made, as mkdir(1) would: a mistyped parent is an
            // error, not a new tree somewhere on the host.
            match fs::create_dir(dest) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(refused(
                        "cannot be made: its parent directory does not exist (create it first)",
                    ));
                }
                Err(e) => return Err(io_error("create")(e)),
            }
            let fd = open().map_err(|e| match e {
                rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                    refused("was replaced by something else while it was made")
                }
                e => io_error("open")(e.into()),
            })?;
            (fd, true)
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
    Ok((fd, created))
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
        self.summary.entries += 1;
        let Some((name, parents)) = parts.split_last() else {
            // The archive's root (`./`): DEST itself, which keeps its own attributes.
            return Ok(());
        };
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
            let parts: Vec<&[u8]> = dir.path.split(|&b| b == 0).collect();
            let Ok(fd) = self.parents.open(&parts) else {
                continue; // replaced by a later entry that is not a directory
            };
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
                continue;
            }
            if self.as_root {
                let (uid, gid) = ids(dir.meta);
                rfs::fchown(fd, uid, gid).map_err(|e| io_err("chown")(e.into()))?;
            }
            rfs::fchmod(fd, Mode::from_raw_mode(dir.mode))
                .map_err(|e| io_err("chmod")(e.into()))?;
            rfs::futimens(fd, &timestamps(dir.meta.mtime))
                .map_err(|e| io_err("set mtime of")(e.into()))?;
        }
        Ok(())
    }
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
