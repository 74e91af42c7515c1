//! Restores a verified archive into a destination directory, never writing outside it.
//!
//! The archive is treated as hostile. Every entry path is checked before anything is
//! created: absolute paths and `..` components are refused, and so is any path whose
//! parent is not a directory this extraction created (which rules out writing through
//! a symlink the archive planted). Hard-link targets obey the same rules. Files are
//! created with `O_NOFOLLOW | O_EXCL` after removing whatever an earlier duplicate
//! entry left, so the last duplicate wins, as with tar. Device files and FIFOs are
//! skipped; setuid and setgid bits are dropped. Owners are restored only when running
//! as root, as `tar` does. Directory modes and mtimes are applied last, deepest first,
//! so that creating their contents does not disturb them.
//!
//! The destination must be absent or an empty directory: a restore never mixes with
//! or overwrites existing files.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::{ArchiveError, EntryMeta, display_path, entry_meta};

/// What a restore did, for the command's summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExtractSummary {
    pub entries: u64,
    pub bytes: u64,
    pub skipped: u64,
}

/// A tar path split into its normal components, or the reason it is refused.
pub(crate) fn clean_path(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.first() == Some(&b'/') {
        return Err("absolute paths are not allowed");
    }
    let mut parts = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("`..` would leave the destination"),
            _ => parts.push(part),
        }
    }
    Ok(parts)
}

struct Extractor<'a> {
    dest: &'a Path,
    /// Directories this extraction created or checked; entries may be created in them.
    dirs: HashSet<PathBuf>,
    /// Directory attributes to apply at the end.
    dir_attrs: Vec<(PathBuf, u32, i64, u64, u64)>,
    as_root: bool,
}

/// Extracts the tar stream `tar` (already decompressed) into `dest`.
pub fn extract(tar: impl Read, dest: &Path) -> Result<ExtractSummary, ArchiveError> {
    prepare_destination(dest)?;
    let mut extractor = Extractor {
        dest,
        dirs: HashSet::from([dest.to_owned()]),
        dir_attrs: Vec::new(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        as_root: unsafe { libc::geteuid() } == 0,
    };
    let mut archive = tar::Archive::new(tar);
    let mut summary = ExtractSummary::default();
    let entries = archive
        .entries()
        .map_err(ArchiveError::io("read archive"))?;
    for entry in entries {
        let mut entry = entry.map_err(ArchiveError::io("read archive"))?;
        summary.entries += 1;
        if extractor.entry(&mut entry)? {
            summary.bytes += entry.size();
        } else {
            summary.skipped += 1;
        }
    }
    extractor.finish_directories()?;
    Ok(summary)
}

fn prepare_destination(dest: &Path) -> Result<(), ArchiveError> {
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
            Ok(())
        }
        Ok(_) => Err(ArchiveError::Destination {
            path: dest.to_owned(),
            reason: "exists and is not a directory".into(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(dest).map_err(
            ArchiveError::io(format!("create destination {}", dest.display())),
        ),
        Err(e) => Err(ArchiveError::io(format!("destination {}", dest.display()))(
            e,
        )),
    }
}

impl Extractor<'_> {
    /// Extracts one entry; returns false when it was skipped on purpose.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<bool, ArchiveError> {
        let raw = entry.path_bytes().into_owned();
        let shown = display_path(&raw);
        let hostile = |reason| ArchiveError::Hostile {
            entry: shown.clone(),
            reason,
        };
        let parts = clean_path(&raw).map_err(hostile)?;
        let kind = entry.header().entry_type();
        let Some((name, parents)) = parts.split_last() else {
            // The archive's root (`./`): DEST itself, which keeps its own attributes.
            return Ok(true);
        };
        let parent = self.ensure_parent(parents, &shown)?;
        let path = parent.join(OsStr::from_bytes(name));
        let EntryMeta { mtime, uid, gid } = entry_meta(entry);
        let mode = entry
            .header()
            .mode()
            .map_err(ArchiveError::io(format!("entry {shown}")))?;
        let io_err = |what: &str| ArchiveError::io(format!("{what} {}", path.display()));

        match kind {
            EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        fs::remove_file(&path).map_err(io_err("replace"))?;
                        fs::create_dir(&path).map_err(io_err("create directory"))?;
                    }
                    Err(_) => fs::create_dir(&path).map_err(io_err("create directory"))?,
                }
                self.dirs.insert(path.clone());
                self.dir_attrs.push((path, mode, mtime, uid, gid));
                return Ok(true);
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.remove_existing(&path)?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(io_err("create"))?;
                io::copy(entry, &mut file).map_err(io_err("write"))?;
                drop(file);
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile("symlink without a target"))?
                    .into_owned();
                self.remove_existing(&path)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                    .map_err(io_err("create symlink"))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile("hard link without a target"))?
                    .into_owned();
                let target_parts = clean_path(&target).map_err(|reason| ArchiveError::Hostile {
                    entry: format!("{shown} -> {}", display_path(&target)),
                    reason,
                })?;
                let target_path =
                    self.existing_inside(&target_parts)
                        .ok_or_else(|| ArchiveError::Hostile {
                            entry: format!("{shown} -> {}", display_path(&target)),
                            reason: "hard link to a file that is not in the archive",
                        })?;
                self.remove_existing(&path)?;
                fs::hard_link(&target_path, &path).map_err(io_err("create hard link"))?;
                return Ok(true); // the link shares the target's attributes
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                tracing::warn!(entry = %shown, "skipping device file or FIFO");
                return Ok(false);
            }
            other => {
                tracing::warn!(entry = %shown, kind = ?other, "skipping entry of unsupported type");
                return Ok(false);
            }
        }
        let is_symlink = kind == EntryType::Symlink;
        if !is_symlink {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o1777))
                .map_err(io_err("chmod"))?;
        }
        self.set_owner_and_mtime(&path, uid, gid, mtime)?;
        Ok(true)
    }

    /// Makes sure every parent directory of an entry exists inside DEST and is a real
    /// directory this extraction knows, creating missing ones like tar does.
    fn ensure_parent(&mut self, parents: &[&[u8]], shown: &str) -> Result<PathBuf, ArchiveError> {
        let mut dir = self.dest.to_owned();
        for part in parents {
            dir.push(OsStr::from_bytes(part));
            if self.dirs.contains(&dir) {
                continue;
            }
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(ArchiveError::Hostile {
                        entry: shown.to_owned(),
                        reason: "its parent is a symlink; writing through it could leave the destination",
                    });
                }
                Ok(_) => {
                    return Err(ArchiveError::Hostile {
                        entry: shown.to_owned(),
                        reason: "its parent is not a directory",
                    });
                }
                Err(_) => {
                    fs::create_dir(&dir).map_err(ArchiveError::io(format!(
                        "create directory {}",
                        dir.display()
                    )))?;
                }
            }
            self.dirs.insert(dir.clone());
        }
        Ok(dir)
    }

    /// The path of an already extracted, non-directory entry, reached only through
    /// directories this extraction made.
    fn existing_inside(&self, parts: &[&[u8]]) -> Option<PathBuf> {
        let (name, parents) = parts.split_last()?;
        let mut dir = self.dest.to_owned();
        for part in parents {
            dir.push(OsStr::from_bytes(part));
            if !self.dirs.contains(&dir) {
                return None;
            }
        }
        let path = dir.join(OsStr::from_bytes(name));
        let meta = fs::symlink_metadata(&path).ok()?;
        (!meta.is_dir()).then_some(path)
    }

    fn remove_existing(&mut self, path: &Path) -> Result<(), ArchiveError> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => {
                self.dirs.remove(path);
                fs::remove_dir_all(path)
            }
            Ok(_) => fs::remove_file(path),
            Err(_) => Ok(()),
        }
        .map_err(ArchiveError::io(format!("replace {}", path.display())))
    }

    fn set_owner_and_mtime(
        &self,
        path: &Path,
        uid: u64,
        gid: u64,
        mtime: i64,
    ) -> Result<(), ArchiveError> {
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            ArchiveError::io(path.display().to_string())(io::Error::other("NUL in path"))
        })?;
        if self.as_root {
            // SAFETY: c_path is a valid NUL-terminated string for the call's duration.
            if unsafe { libc::lchown(c_path.as_ptr(), uid as u32, gid as u32) } != 0 {
                tracing::warn!(path = %path.display(), error = %io::Error::last_os_error(), "could not restore owner");
            }
        }
        let time = libc::timespec {
            tv_sec: mtime as libc::time_t,
            tv_nsec: 0,
        };
        let times = [time, time];
        // SAFETY: c_path and times are valid for the call's duration.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c_path.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(
                ArchiveError::io(format!("set mtime of {}", path.display()))(
                    io::Error::last_os_error(),
                ),
            );
        }
        Ok(())
    }

    fn finish_directories(&mut self) -> Result<(), ArchiveError> {
        let mut attrs = std::mem::take(&mut self.dir_attrs);
        // Deepest first, so setting a child's mtime does not touch a finished parent.
        attrs.sort_by_key(|(path, ..)| std::cmp::Reverse(path.components().count()));
        for (path, mode, mtime, uid, gid) in attrs {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o1777))
                .map_err(ArchiveError::io(format!("chmod {}", path.display())))?;
            self.set_owner_and_mtime(&path, uid, gid, mtime)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_path_refuses_escapes() {
        assert_eq!(clean_path(b"./a/b").unwrap(), vec![&b"a"[..], b"b"]);
        assert_eq!(clean_path(b"a//b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(clean_path(b"/etc/passwd").is_err());
        assert!(clean_path(b"a/../../b").is_err());
        assert!(clean_path(b"..").is_err());
        assert!(clean_path(b".").unwrap().is_empty());
    }
}
