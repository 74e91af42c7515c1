//! FUSE passthrough: the kernel reads a file straight from a backing file of ours.
//!
//! The kernel takes one backing file per inode: a second open of an inode must reuse
//! the first one's id (a different one makes the open fail with EIO), so ids are
//! shared and counted per inode, and released with the last handle.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{BackingId, FopenFlags};

use super::subtree::Opened;

/// Passthrough backing files in use. The kernel takes one backing file per inode:
/// a second open of an inode must reuse the first one's id (a different one makes
/// the open fail with EIO), so ids are shared and counted per inode.
#[derive(Default)]
pub struct BackingTable {
    by_inode: HashMap<u64, (BackingId, usize)>,
    /// Which inode each passthrough handle belongs to.
    by_handle: HashMap<u64, u64>,
}

impl BackingTable {
    /// Makes `ino` have a backing id for handle `fh`, reusing the inode's or
    /// registering one; false if the kernel refused it.
    pub fn acquire(
        &mut self,
        ino: u64,
        fh: u64,
        register: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> bool {
        if let Some((_, count)) = self.by_inode.get_mut(&ino) {
            *count += 1;
        } else {
            match register() {
                Ok(id) => {
                    self.by_inode.insert(ino, (id, 1));
                }
                Err(e) => {
                    tracing::debug!(ino, error = %e, "passthrough refused; serving this file in user space");
                    return false;
                }
            }
        }
        self.by_handle.insert(fh, ino);
        true
    }

    pub fn id(&self, ino: u64) -> &BackingId {
        &self.by_inode[&ino].0
    }

    pub fn release(&mut self, fh: u64) {
        if let Some(ino) = self.by_handle.remove(&fh)
            && let Some((_, count)) = self.by_inode.get_mut(&ino)
        {
            *count -= 1;
            if *count == 0 {
                self.by_inode.remove(&ino);
            }
        }
    }
}

pub type Backing = Arc<Mutex<BackingTable>>;

/// How an open is answered: through the inode's passthrough backing file, or
/// served in user space with these flags.
pub enum OpenAs<'a> {
    Passthrough(MutexGuard<'a, BackingTable>),
    Served(FopenFlags),
}

/// The passthrough handshake, the same for `open` and `create`: the kernel takes a
/// backing file for the inode when it can (one id per inode, see [`BackingTable`]).
pub fn open_as<'a>(
    passthrough: bool,
    backing: &'a Backing,
    ino: u64,
    opened: &Opened,
    register: impl FnOnce(&File) -> std::io::Result<BackingId>,
) -> OpenAs<'a> {
    let mut flags = FopenFlags::empty();
    if opened.keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if opened.direct_io {
        flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    let Some(file) = opened.backing.as_ref().filter(|_| passthrough) else {
        return OpenAs::Served(flags);
    };
    let mut table = backing.lock().expect("backing lock");
    if table.acquire(ino, opened.fh, || register(file)) {
        return OpenAs::Passthrough(table);
    }
    // Direct I/O may coexist with passthrough opens of the same inode; cached I/O
    // may not.
    OpenAs::Served(flags | FopenFlags::FOPEN_DIRECT_IO)
}
