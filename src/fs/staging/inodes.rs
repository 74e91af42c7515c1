//! The inodes the kernel knows in `staging/`: how each is reached (a directory by its
//! kept descriptor or by name from its parent, a file by its names, a file whose last
//! name went while the kernel still knew it by its link in the graveyard), the
//! kernel's lookup counts, and the FUSE inode numbers and generations given for them.
//!
//! Invariant: what the daemon holds per inode is bounded by what the kernel holds; a
//! known inode is forgotten, its descriptor and graveyard link dropped, when the
//! kernel's count of it reaches zero.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use rustix::fs::{self as rfs, AtFlags};

use super::{DIR_FDS, StagingTree, os};
use crate::fs::error::FsError;
use crate::fs::inode;

/// An inode the kernel knows, with how to reach it: by name in its directory. A
/// directory is reached through an `O_PATH` descriptor, kept in [`StagingTree::dirs`]
/// while there is room and opened again by name from its parent's when not, so that
/// the daemon's descriptors are bounded whatever a writer makes in `staging/`.
pub(super) struct Known {
    pub(super) lookups: u64,
    pub(super) place: Place,
}

pub(super) enum Place {
    /// A directory's one name (directories have no other links); kept up to date by
    /// rename, which goes through this tree.
    Dir { parent: u64, name: Vec<u8> },
    /// The names (directory inode, name) the file is known by; kept up to date by
    /// rename, link and unlink, which all go through this tree.
    Links(Vec<(u64, Vec<u8>)>),
    /// A regular file whose last known name went away (an unlink, a rename over it,
    /// the seal of its workspace) while the kernel still knew it: a process may hold
    /// it open and go on reading and writing, as POSIX allows. It is kept by a link
    /// in the graveyard (see `files.rs`) until the kernel forgets the inode.
    Parked,
}

/// A directory pinned before its removal; unpinned when dropped unless kept (the
/// removal failed: the directory is still there, reachable by name).
#[must_use]
pub(super) struct Pin<'a> {
    pub(super) tree: &'a StagingTree,
    pub(super) pinned: Option<u64>,
}

impl Pin<'_> {
    pub(super) fn keep(mut self) {
        self.pinned = None;
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        if let Some(ino) = self.pinned {
            self.tree.pinned.lock().expect("pinned lock").remove(&ino);
        }
    }
}

/// How a system call reaches an inode.
pub(super) enum Loc {
    /// A directory's own descriptor.
    Dir(Arc<OwnedFd>),
    /// A name in a directory (the graveyard's, for a parked file).
    At(Arc<OwnedFd>, Vec<u8>),
}

/// The generation of the inode `fd` holds (`stat` describes it), for the kernel to
/// tell files apart that had the same inode number at different times. Staged inode
/// numbers are the backing filesystem's, which gives a deleted file's number to the
/// next file it makes, while the kernel may still know the deleted one (a process
/// holds it open across the seal that deleted its workspace, say). Given a known
/// number with another generation, the kernel retires its old inode (every use of it
/// fails with `EIO`) instead of taking the new file for it. The generation is a hash
/// of the file handle the backing filesystem gives the inode (ext4, XFS, Btrfs and
/// tmpfs put their own generation in it), or of its creation time where there is no
/// handle; it must fit the kernel's 32 bits, or every lookup would look stale.
pub(super) fn generation(fd: &OwnedFd, stat: &rfs::Stat) -> u32 {
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; 128],
    }
    let mut handle = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mount_id = 0;
    // SAFETY: `handle` is a file_handle header followed by the 128 bytes its `bytes`
    // field announces, and `mount_id` an int, both alive and writable for the call;
    // the path is an empty NUL-terminated string, used with AT_EMPTY_PATH on a
    // descriptor we own.
    let rc = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&mut handle as *mut Handle).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    if rc == 0 && handle.bytes as usize <= handle.data.len() {
        hasher.update(&handle.kind.to_le_bytes());
        hasher.update(&handle.data[..handle.bytes as usize]);
    } else {
        let birth = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::BTIME)
            .ok()
            .map(|x| (x.stx_btime.tv_sec, x.stx_btime.tv_nsec));
        hasher.update(&stat.st_ino.to_le_bytes());
        if let Some((secs, nanos)) = birth {
            hasher.update(&secs.to_le_bytes());
            hasher.update(&nanos.to_le_bytes());
        }
    }
    hasher.digest() as u32
}

/// The name of a parked file in the graveyard: its FUSE inode number.
pub(super) fn parked_name(ino: u64) -> Vec<u8> {
    format!("{ino:x}").into_bytes()
}

impl StagingTree {
    pub(super) fn fuse_ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            inode::STAGING
        } else {
            inode::STAGED_BIT | backing_ino
        }
    }

    /// The descriptor of directory `ino`: the one kept, or opened again by name from
    /// the nearest directory whose descriptor is kept (`staging/` itself at worst),
    /// without following links or leaving that directory, and checked to be the
    /// directory it names (`Stale` if a name now holds another inode).
    pub(super) fn fd(&self, ino: u64) -> Result<Arc<OwnedFd>, FsError> {
        let mut way_down = Vec::new();
        let mut at = ino;
        let mut fd = loop {
            if at == inode::STAGING {
                break Arc::clone(&self.root_fd);
            }
            if let Some(fd) = self.dirs.lock().expect("dirs lock").get(&at) {
                break Arc::clone(fd);
            }
            if let Some(fd) = self.pinned.lock().expect("pinned lock").get(&at) {
                break Arc::clone(fd);
            }
            let known = self.known.lock().expect("staging lock");
            let (parent, name) = match known.get(&at) {
                Some(Known {
                    place: Place::Dir { parent, name },
                    ..
                }) => (*parent, name.clone()),
                Some(_) if at == ino => return Err(FsError::NotADirectory),
                _ => return Err(FsError::Stale),
            };
            // Records follow real renames, so they form a tree; this bounds the climb
            // all the same.
            if way_down.len() > known.len() {
                return Err(FsError::Stale);
            }
            drop(known);
            way_down.push((at, name));
            at = parent;
        };
        // A writer can make a workspace as deep as it likes, so the way down is taken
        // in few system calls (many names each, the kernel refusing links and `..`),
        // and only the directory asked for is kept: a deep climb does not push the
        // descriptors of other directories out.
        way_down.reverse();
        let mut rest = way_down.as_slice();
        while !rest.is_empty() {
            let names: Vec<&[u8]> = rest.iter().map(|(_, name)| name.as_slice()).collect();
            let (next, taken) =
                crate::beneath::open_dirs_beneath(&*fd, &names).map_err(|_| FsError::Stale)?;
            let expected = rest[taken - 1].0;
            if self.fuse_ino(rfs::fstat(&next).map_err(os)?.st_ino) != expected {
                return Err(FsError::Stale);
            }
            fd = Arc::new(next);
            rest = &rest[taken..];
        }
        if !way_down.is_empty() {
            (self.dirs.lock().expect("dirs lock")).put(ino, Arc::clone(&fd));
        }
        Ok(fd)
    }

    pub(super) fn loc(&self, ino: u64) -> Result<Loc, FsError> {
        if ino == inode::STAGING {
            return Ok(Loc::Dir(Arc::clone(&self.root_fd)));
        }
        // The names, or `None` for a directory or a parked file; the lock is not held
        // past this, since `fd` takes it again.
        let links = match self.known.lock().expect("staging lock").get(&ino) {
            Some(Known {
                place: Place::Links(links),
                ..
            }) => Some(links.clone()),
            Some(_) => None,
            None => return Err(FsError::Stale),
        };
        let Some(links) = links else {
            let name = parked_name(ino);
            return match self.fd(ino) {
                Ok(fd) => Ok(Loc::Dir(fd)),
                Err(FsError::NotADirectory)
                    if self.child_ino(&self.graveyard, &name) == Some(ino) =>
                {
                    Ok(Loc::At(Arc::clone(&self.graveyard), name))
                }
                Err(FsError::NotADirectory) => Err(FsError::Stale),
                Err(e) => Err(e),
            };
        };
        // A name is used only if it still names this very inode: names can go stale
        // behind this bookkeeping (a sealed workspace is deleted on disk, not through
        // unlink), and the backing filesystem reuses inode numbers.
        for (parent, name) in links {
            let Ok(dir) = self.fd(parent) else { continue };
            if self.child_ino(&dir, &name) == Some(ino) {
                return Ok(Loc::At(dir, name));
            }
        }
        Err(FsError::Stale)
    }

    /// Records one more kernel reference to `ino`, reached as `parent/name`; a
    /// directory comes with its descriptor.
    pub(super) fn remember(&self, ino: u64, parent: u64, name: &[u8], dir_fd: Option<OwnedFd>) {
        let mut known = self.known.lock().expect("staging lock");
        let entry = known.entry(ino).or_insert_with(|| Known {
            lookups: 0,
            place: Place::Links(Vec::new()),
        });
        entry.lookups += 1;
        match dir_fd {
            Some(fd) => {
                // The name it was just found by is its one name.
                entry.place = Place::Dir {
                    parent,
                    name: name.to_vec(),
                };
                drop(known);
                (self.dirs.lock().expect("dirs lock")).put(ino, Arc::new(fd));
            }
            None => {
                if !matches!(entry.place, Place::Links(_)) {
                    // The backing inode number now belongs to another file.
                    entry.place = Place::Links(Vec::new());
                    self.dirs.lock().expect("dirs lock").pop(&ino);
                }
                if let Place::Links(links) = &mut entry.place
                    && !links.iter().any(|(p, n)| *p == parent && n == name)
                {
                    links.push((parent, name.to_vec()));
                }
            }
        }
    }

    /// Before directory `ino` is removed: if the kernel knows it, keeps its descriptor
    /// open until the kernel forgets it (see [`StagingTree::pinned`]). Returns a guard
    /// that takes the pin back unless [`Pin::keep`] says the removal happened.
    pub(super) fn pin_if_known(&self, ino: u64) -> Pin<'_> {
        let known_dir = matches!(
            self.known.lock().expect("staging lock").get(&ino),
            Some(Known { place: Place::Dir { .. }, lookups }) if *lookups > 0
        );
        let mut pinned = None;
        if known_dir && let Ok(fd) = self.fd(ino) {
            let mut pins = self.pinned.lock().expect("pinned lock");
            // Bounded like the rest: past it (a seal of a workspace the kernel knows
            // thousands of directories of, until it drops them), a number may come
            // back, and the generation of the new directory retires the old inode.
            if pins.len() >= DIR_FDS {
                return Pin {
                    tree: self,
                    pinned: None,
                };
            }
            if let std::collections::hash_map::Entry::Vacant(pin) = pins.entry(ino) {
                pin.insert(fd);
                pinned = Some(ino);
            }
        }
        Pin { tree: self, pinned }
    }

    /// Keeps the names of known files right after `parent/name` changed. A file left
    /// with no known name is parked if [`Self::park`] linked it into the graveyard.
    pub(super) fn renamed(
        &self,
        ino: u64,
        from: (u64, &[u8]),
        to: Option<(u64, &[u8])>,
        parked: bool,
    ) {
        let mut known = self.known.lock().expect("staging lock");
        let Some(entry) = known.get_mut(&ino) else {
            return;
        };
        if let (Place::Dir { parent, name }, Some((to_parent, to_name))) = (&mut entry.place, to)
            && *parent == from.0
            && name.as_slice() == from.1
        {
            (*parent, *name) = (to_parent, to_name.to_vec());
        }
        if let Place::Links(links) = &mut entry.place {
            links.retain(|(p, n)| !(*p == from.0 && n == from.1));
            if let Some((parent, name)) = to {
                links.push((parent, name.to_vec()));
            }
            if links.is_empty() && parked {
                entry.place = Place::Parked;
            }
        }
    }

    /// The FUSE inode number of `parent/name`, if it exists.
    pub(super) fn child_ino(&self, parent: &OwnedFd, name: &[u8]) -> Option<u64> {
        rfs::statat(parent, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|stat| self.fuse_ino(stat.st_ino))
    }

    /// The kernel dropped `count` references to `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        let mut known = self.known.lock().expect("staging lock");
        if let Some(k) = known.get_mut(&ino) {
            k.lookups = k.lookups.saturating_sub(count);
            if k.lookups == 0 {
                if let Some(Known {
                    place: Place::Parked,
                    ..
                }) = known.remove(&ino)
                {
                    let name = parked_name(ino);
                    let _ =
                        rfs::unlinkat(&*self.graveyard, OsStr::from_bytes(&name), AtFlags::empty());
                }
                drop(known);
                self.dirs.lock().expect("dirs lock").pop(&ino);
                self.pinned.lock().expect("pinned lock").remove(&ino);
                self.files.forget(ino);
                self.copied_from.lock().expect("copied lock").remove(&ino);
            }
        }
    }

    pub(super) fn is_parked(&self, loc: &Loc) -> bool {
        matches!(loc, Loc::At(dir, _) if Arc::ptr_eq(dir, &self.graveyard))
    }
}
