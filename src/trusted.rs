//! Configured directories (`--cache-dir`, `--staging-dir` and their defaults) are used
//! only where no one but root and the daemon's user could have put them, or could move
//! them later: otherwise a user who can write a parent of the configured path could
//! point the path at a directory of their choice (the cache into any root-owned
//! directory, which a root daemon would then make its own and write into, or another
//! directory served as `staging/`).
//!
//! [`trusted_dir`] resolves the path one component at a time from `/`, without ever
//! letting the kernel follow a link, and creates what is missing (0700). Every
//! directory on the way must belong to root or to the daemon's user and be writable by
//! no one else; the one exception is a directory writable by all but sticky, such as
//! `/tmp`, where the entry taken in it must itself be root's or ours (the sticky bit
//! keeps others from renaming or deleting it). A symlink on the way is followed only
//! if it belongs to root or to us, in such a directory. The directory at the end must
//! be ours, and is made 0700. The result is the path so resolved, with no link left in
//! it; callers use it from then on, so that what they open later is what was checked:
//! no one else can change any directory along it.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

/// Links followed at most while resolving one path (Linux's own limit).
const MAX_LINKS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error("{}: {reason}; refusing to use it (see the README's security model)", path.display())]
    Untrusted { path: PathBuf, reason: String },
}

/// Resolves and, where needed, creates directory `path` as the module says; returns
/// the resolved path.
pub fn trusted_dir(path: &Path) -> Result<PathBuf, TrustError> {
    let me = rustix::process::geteuid().as_raw();
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map_err(|cause| TrustError::Io {
                path: path.to_owned(),
                cause,
            })?
            .join(path)
    };
    let mut pending: VecDeque<OsString> = components(&absolute);
    let mut resolved = PathBuf::from("/");
    let mut dir = open_root()?;
    let mut dir_stat = stat_fd(&dir, &resolved)?;
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == "/" {
            (resolved, dir) = (PathBuf::from("/"), open_root()?);
            dir_stat = stat_fd(&dir, &resolved)?;
            continue;
        }
        if name == ".." {
            resolved.pop();
            dir = open_at(&dir, OsStr::new(".."), &resolved)?;
            dir_stat = stat_fd(&dir, &resolved)?;
            continue;
        }
        let here = resolved.join(&name);
        let stat = match rfs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT) => {
                may_create_in(&dir_stat, &resolved, me)?;
                match rfs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io_error(&here, e)),
                }
                rfs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_error(&here, e))?
            }
            Err(e) => return Err(io_error(&here, e)),
        };
        may_hold(&dir_stat, &resolved, stat.st_uid, &here, me)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io_error(&here, rustix::io::Errno::LOOP));
                }
                let target = rfs::readlinkat(&dir, name.as_os_str(), Vec::new())
                    .map_err(|e| io_error(&here, e))?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                for part in components(&target).into_iter().rev() {
                    pending.push_front(part);
                }
            }
            FileType::Directory => {
                let next = open_at(&dir, &name, &here)?;
                let next_stat = stat_fd(&next, &here)?;
                // What was checked is what was opened.
                if (next_stat.st_dev, next_stat.st_ino) != (stat.st_dev, stat.st_ino) {
                    return Err(untrusted(&here, "changed while it was being checked"));
                }
                (dir, dir_stat, resolved) = (next, next_stat, here);
            }
            _ => {
                return Err(TrustError::Io {
                    path: here,
                    cause: io::Error::new(
                        io::ErrorKind::NotADirectory,
                        "exists and is not a directory",
                    ),
                });
            }
        }
    }
    if dir_stat.st_uid != me {
        let reason = format!(
            "belongs to uid {}, not to this process's user",
            dir_stat.st_uid
        );
        return Err(untrusted(&resolved, &reason));
    }
    let opened = rfs::openat(
        &dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(&resolved, e))?;
    rfs::fchmod(&opened, Mode::from_raw_mode(0o700)).map_err(|e| io_error(&resolved, e))?;
    Ok(resolved)
}

/// The parts of `path`: `/` for the root, `..`, and names (`.` dropped).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir => Some(OsString::from("/")),
            Component::ParentDir => Some(OsString::from("..")),
            Component::Normal(name) => Some(name.to_owned()),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Whether directory `dir` (described by `stat`) may hold an entry owned by `owner`
/// that this process will use: see the module comment.
fn may_hold(
    stat: &rfs::Stat,
    dir: &Path,
    owner: u32,
    entry: &Path,
    me: u32,
) -> Result<(), TrustError> {
    if stat.st_uid != 0 && stat.st_uid != me {
        let reason = format!(
            "is in {}, which belongs to uid {}",
            dir.display(),
            stat.st_uid
        );
        return Err(untrusted(entry, &reason));
    }
    if stat.st_mode & 0o022 != 0 {
        let sticky = stat.st_mode & libc::S_ISVTX != 0;
        if !sticky {
            let reason = format!("is in {}, which others may write", dir.display());
            return Err(untrusted(entry, &reason));
        }
        if owner != 0 && owner != me {
            let reason = format!(
                "belongs to uid {owner} and is in {}, which others may write",
                dir.display()
            );
            return Err(untrusted(entry, &reason));
        }
    }
    Ok(())
}

/// Whether a missing directory may be made in `dir`: only where what is made stays
/// ours (a sticky directory keeps others from taking it away).
fn may_create_in(stat: &rfs::Stat, dir: &Path, me: u32) -> Result<(), TrustError> {
    may_hold(stat, dir, me, dir, me)
}

fn open_root() -> Result<OwnedFd, TrustError> {
    rfs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(Path::new("/"), e))
}

fn open_at(dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<OwnedFd, TrustError> {
    rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(path, e))
}

fn stat_fd(fd: &OwnedFd, path: &Path) -> Result<rfs::Stat, TrustError> {
    rfs::fstat(fd).map_err(|e| io_error(path, e))
}

fn io_error(path: &Path, e: rustix::io::Errno) -> TrustError {
    TrustError::Io {
        path: path.to_owned(),
        cause: e.into(),
    }
}

fn untrusted(path: &Path, reason: &str) -> TrustError {
    TrustError::Untrusted {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn temp() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    #[test]
    fn a_missing_directory_is_made_private_and_resolved() {
        let base = temp();
        let wanted = base.path().join("a/./b/../c");
        let got = trusted_dir(&wanted).unwrap();
        let real = std::fs::canonicalize(base.path()).unwrap().join("a/c");
        assert_eq!(got, real);
        let mode = std::fs::metadata(&got).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn our_own_link_is_followed_and_resolved_away() {
        let base = temp();
        std::fs::create_dir(base.path().join("real")).unwrap();
        symlink("real", base.path().join("link")).unwrap();
        let got = trusted_dir(&base.path().join("link")).unwrap();
        assert_eq!(
            got,
            std::fs::canonicalize(base.path()).unwrap().join("real")
        );
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let base = temp();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = trusted_dir(&open.join("cache")).unwrap_err();
        assert!(err.to_string().contains("which others may write"), "{err}");
        // Sticky, like /tmp: an entry of ours in it is fine.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        trusted_dir(&open.join("cache")).unwrap();
    }

    #[test]
    fn what_another_user_placed_is_refused() {
        if !rustix::process::geteuid().is_root() {
            return; // making files of another user needs root (CI runs as root)
        }
        let base = temp();
        let sticky = base.path().join("tmp");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let target = base.path().join("root-owned");
        std::fs::create_dir(&target).unwrap();
        // Planted by uid 4242 in a directory anyone may write: never followed.
        symlink(&target, sticky.join("cache")).unwrap();
        std::os::unix::fs::lchown(sticky.join("cache"), Some(4242), Some(4242)).unwrap();
        let err = trusted_dir(&sticky.join("cache")).unwrap_err();
        assert!(err.to_string().contains("belongs to uid 4242"), "{err}");
        // Another user's directory, as the directory itself or on the way.
        let theirs = base.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        let err = trusted_dir(&theirs).unwrap_err();
        assert!(err.to_string().contains("belongs to uid 4242"), "{err}");
        let err = trusted_dir(&theirs.join("below")).unwrap_err();
        assert!(
            err.to_string().contains("which belongs to uid 4242"),
            "{err}"
        );
        assert!(
            !theirs.join("below").exists(),
            "nothing is made in their directory"
        );
    }

    #[test]
    fn links_that_loop_end() {
        let base = temp();
        symlink("b", base.path().join("a")).unwrap();
        symlink("a", base.path().join("b")).unwrap();
        let err = trusted_dir(&base.path().join("a")).unwrap_err();
        assert!(matches!(err, TrustError::Io { .. }), "{err}");
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let base = temp();
        std::fs::write(base.path().join("f"), b"").unwrap();
        assert!(trusted_dir(&base.path().join("f/x")).is_err());
    }
}
