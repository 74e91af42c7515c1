//! Restores a verified archive into a destination directory, never acting outside it.
//!
//! The archive is treated as hostile, and the restore works through descriptors, not
//! path strings (see [`crate::beneath`]):
//! - DEST is opened once; every entry's parent is reached from that descriptor one
//!   component at a time with `O_NOFOLLOW`, so a symlink the archive planted, or a
//!   path a later entry replaced, can never lead outside: the walk fails instead, and
//!   the whole archive is refused;
//! - absolute paths and `..` components are refused before any call;
//! - files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` after whatever an earlier
//!   duplicate left was removed (the last duplicate wins, as with tar), and their mode,
//!   owner and mtime are set on that descriptor;
//! - a hard link's target is resolved beneath DEST the same way and linked with
//!   `linkat` without following it;
//! - directory modes and mtimes are applied last, deepest first (so that creating
//!   their contents does not disturb them), on a descriptor opened anew and checked
//!   to be the very directory this restore made; nothing remembered about one entry
//!   is trusted for a later one without looking again.
//!
//! Device files and FIFOs are skipped; set-user/group-ID bits are dropped; owners are
//! restored only when running as root, as `tar` does. The limits of [`Limits`] apply.
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

use super::{ArchiveError, Entry, EntryMeta, Limits, Tally, clean_path, display_path, entry_meta};
use crate::beneath::{self, WalkError};

/// What a restore did, for the command's summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExtractSummary {
    pub entries: u64,
    pub bytes: u64,
    pub skipped: u64,
}

/// Attributes of a directory entry, applied when the restore ends.
struct DirAttrs {
    /// The path below DEST, components joined by `/` (one allocation per entry).
    path: Vec<u8>,
    /// The directory this restore made or found for the entry.
    dev_ino: (u64, u64),
    mode: u32,
    meta: EntryMeta,
}

struct Extractor {
    dest: OwnedFd,
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
    let created = prepare_destination(dest)?;
    let dest_fd = rfs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ArchiveError::io(format!("open destination {}", dest.display()))(e.into()))?;
    let mut extractor = Extractor {
        dest: dest_fd,
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

/// Makes sure DEST is an empty directory; returns whether it was created.
fn prepare_destination(dest: &Path) -> Result<bool, ArchiveError> {
    match fs::symlink_metadata(dest) {
        Ok(meta) if meta.is_dir() => {
            let mut listing = fs::read_dir(dest).map_err(ArchiveError::io(format!(
                "read destination {}",
                dest.display()
            )))?;
            if listing.next().is_some() {
                return Err(ArchiveError::Destination {
                    path: dest.to_owned(),
                    reason: "is not empty (restore into a new or empty directory)".into(),
                });
            }
            Ok(false)
        }
        Ok(_) => Err(ArchiveError::Destination {
            path: dest.to_owned(),
            reason: "exists and is not a directory".into(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(dest)
            .map(|()| true)
            .map_err(ArchiveError::io(format!(
                "create destination {}",
                dest.display()
            ))),
        Err(e) => Err(ArchiveError::io(format!("destination {}", dest.display()))(
            e,
        )),
    }
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
        let hostile = |reason| ArchiveError::Hostile {
            entry: shown.clone(),
            reason,
        };
        let parts = clean_path(&raw).map_err(hostile)?;
        self.summary.entries += 1;
        let kind = entry.header().entry_type();
        let Some((name, parents)) = parts.split_last() else {
            // The archive's root (`./`): DEST itself, which keeps its own attributes.
            return Ok(());
        };
        let parent = self.make_parent(parents, &shown, tally)?;
        let name = OsStr::from_bytes(name);
        let meta = entry_meta(entry);
        let mode = entry
            .header()
            .mode()
            .map_err(ArchiveError::io(format!("entry {shown}")))?
            & 0o1777;
        let io_err = |what: &str| ArchiveError::io(format!("{what} {shown}"));

        match kind {
            EntryType::Directory => {
                let made = match beneath::kind_at(&parent, name).map_err(io_err("stat"))? {
                    Some(FileType::Directory) => false,
                    Some(_) => {
                        beneath::remove_at(&parent, name).map_err(io_err("replace"))?;
                        true
                    }
                    None => true,
                };
                if made {
                    rfs::mkdirat(&parent, name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err("create directory")(e.into()))?;
                }
                let dir = beneath::open_dir(&parent, name).map_err(io_err("open directory"))?;
                let stat = rfs::fstat(&dir).map_err(|e| io_err("stat")(e.into()))?;
                let mut path = parents.join(&b'/');
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name.as_bytes());
                self.remember_dir(DirAttrs {
                    path,
                    dev_ino: (stat.st_dev, stat.st_ino),
                    mode,
                    meta,
                });
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                beneath::remove_at(&parent, name).map_err(io_err("replace"))?;
                let fd = rfs::openat(
                    &parent,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_err("create")(e.into()))?;
                let mut file = File::from(fd);
                copy_counted(entry, &mut file, tally).map_err(|e| match e {
                    CopyError::Read(e) => ArchiveError::Corrupt(e),
                    CopyError::Write(e) => io_err("write")(e),
                    CopyError::Limit(e) => e,
                })?;
                self.summary.bytes += entry.size();
                if self.as_root {
                    let (uid, gid) = ids(meta);
                    rfs::fchown(&file, uid, gid).map_err(|e| io_err("chown")(e.into()))?;
                }
                rfs::fchmod(&file, Mode::from_raw_mode(mode))
                    .map_err(|e| io_err("chmod")(e.into()))?;
                rfs::futimens(&file, &timestamps(meta.mtime))
                    .map_err(|e| io_err("set mtime of")(e.into()))?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile("symlink without a target"))?
                    .into_owned();
                beneath::remove_at(&parent, name).map_err(io_err("replace"))?;
                rfs::symlinkat(OsStr::from_bytes(&target), &parent, name)
                    .map_err(|e| io_err("create symlink")(e.into()))?;
                self.set_owner_and_mtime_at(parent.as_fd(), name, meta)
                    .map_err(io_err("set attributes of"))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile("hard link without a target"))?
                    .into_owned();
                let link_hostile = |reason| ArchiveError::Hostile {
                    entry: format!("{shown} -> {}", display_path(&target)),
                    reason,
                };
                let target_parts = clean_path(&target).map_err(link_hostile)?;
                let (target_name, target_parents) = target_parts
                    .split_last()
                    .ok_or_else(|| link_hostile("hard link to the archive's root"))?;
                let target_dir = beneath::open_dir_path(self.dest.as_fd(), target_parents)
                    .map_err(|_| link_hostile("hard link to a file that is not in the archive"))?;
                let target_name = OsStr::from_bytes(target_name);
                match beneath::kind_at(&target_dir, target_name) {
                    Ok(Some(FileType::Directory)) => {
                        return Err(link_hostile("hard link to a directory"));
                    }
                    Ok(Some(_)) => {}
                    _ => {
                        return Err(link_hostile(
                            "hard link to a file that is not in the archive",
                        ));
                    }
                }
                if same_entry(&target_dir, target_name, &parent, name) {
                    return Ok(()); // a link to itself: already in place
                }
                beneath::remove_at(&parent, name).map_err(io_err("replace"))?;
                rfs::linkat(&target_dir, target_name, &parent, name, AtFlags::empty())
                    .map_err(|e| io_err("create hard link")(e.into()))?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                tracing::warn!(entry = %shown, "skipping device file or FIFO");
                self.summary.skipped += 1;
            }
            other => {
                tracing::warn!(entry = %shown, kind = ?other, "skipping entry of unsupported type");
                self.summary.skipped += 1;
            }
        }
        Ok(())
    }

    /// Opens (creating missing ones, like tar) the parent directories of an entry,
    /// below DEST and through directories only.
    fn make_parent(
        &mut self,
        parents: &[&[u8]],
        shown: &str,
        tally: &mut Tally,
    ) -> Result<OwnedFd, ArchiveError> {
        let mut limit = None;
        let result = beneath::make_dirs(self.dest.as_fd(), parents, 0o777, &mut || {
            tally.entry().map_err(|e| {
                limit = Some(e);
                io::Error::other("limit")
            })
        });
        result.map_err(|e| match e {
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

    fn remember_dir(&mut self, attrs: DirAttrs) {
        match self.dir_index.get(&attrs.dev_ino) {
            Some(&i) => self.dirs[i] = attrs,
            None => {
                self.dir_index.insert(attrs.dev_ino, self.dirs.len());
                self.dirs.push(attrs);
            }
        }
    }

    fn set_owner_and_mtime_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        meta: EntryMeta,
    ) -> io::Result<()> {
        if self.as_root {
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

    /// Applies directory attributes, deepest first, each on a descriptor of the
    /// directory found at its path now, and only if it is still the one this restore
    /// made for the entry (a later entry may have replaced it).
    fn finish_directories(&mut self) -> Result<(), ArchiveError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        let depth = |d: &DirAttrs| d.path.iter().filter(|&&b| b == b'/').count();
        dirs.sort_by_key(|d| std::cmp::Reverse(depth(d)));
        for dir in dirs {
            let parts: Vec<&[u8]> = dir.path.split(|&b| b == b'/').collect();
            let Ok(fd) = beneath::open_dir_path(self.dest.as_fd(), &parts) else {
                continue; // replaced by a later entry that is not a directory
            };
            let shown = display_path(&dir.path);
            let io_err = |what: &str| ArchiveError::io(format!("{what} {shown}"));
            let stat = rfs::fstat(&fd).map_err(|e| io_err("stat")(e.into()))?;
            if (stat.st_dev, stat.st_ino) != dir.dev_ino {
                continue;
            }
            if self.as_root {
                let (uid, gid) = ids(dir.meta);
                rfs::fchown(&fd, uid, gid).map_err(|e| io_err("chown")(e.into()))?;
            }
            rfs::fchmod(&fd, Mode::from_raw_mode(dir.mode))
                .map_err(|e| io_err("chmod")(e.into()))?;
            rfs::futimens(&fd, &timestamps(dir.meta.mtime))
                .map_err(|e| io_err("set mtime of")(e.into()))?;
        }
        Ok(())
    }
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
fn same_entry(a_dir: &OwnedFd, a: &OsStr, b_dir: &OwnedFd, b: &OsStr) -> bool {
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
