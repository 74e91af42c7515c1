//! FUSE passthrough: the kernel reads a file straight from a backing file of ours.
//!
//! The kernel takes one backing file per inode: a second open of an inode must reuse
//! the first one's id (a different one makes the open fail with EIO), so ids are
//! shared and counted per inode, and released with the last handle. An `open` and a
//! `create` are answered alike ([`answer`]).

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{BackingId, FileAttr, FileHandle, FopenFlags, Generation, ReplyCreate, ReplyOpen};

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

/// The replies that open a file (`open` and `create`), which are answered alike.
pub trait OpenReply {
    /// Gives the kernel `file` as a backing file.
    fn register(&self, file: &File) -> std::io::Result<BackingId>;
    /// Opened, the kernel reading and writing the backing file `id` itself.
    fn passthrough(self, id: &BackingId);
    /// Opened, the daemon serving reads and writes.
    fn served(self, flags: FopenFlags);
}

/// Answers an open through `reply`, the same for `open` and `create`: through the
/// inode's passthrough backing file when the kernel takes one (one id per inode, see
/// [`BackingTable`]), else served by the daemon with the open's cache flags.
pub fn answer(
    passthrough: bool,
    backing: &Backing,
    ino: u64,
    opened: &Opened,
    reply: impl OpenReply,
) {
    let mut flags = FopenFlags::empty();
    if opened.keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if opened.direct_io {
        flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if !passthrough {
        return reply.served(flags);
    }
    let mut table = backing.lock().expect("backing lock");
    // An inode the kernel already reads through a backing file must be opened through
    // it again, even by a handle without a file of its own (one opened past the bound
    // on held descriptors): the kernel refuses any other open of it (EIO).
    let file = match (&opened.backing, table.by_inode.contains_key(&ino)) {
        (Some(file), _) => Some(file),
        (None, true) => None,
        (None, false) => return reply.served(flags),
    };
    let register = || match file {
        Some(file) => reply.register(file),
        None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
    };
    if table.acquire(ino, opened.fh, register) {
        // The kernel refuses cache flags with passthrough (EIO): the page cache is
        // the backing file's own anyway.
        return reply.passthrough(table.id(ino));
    }
    drop(table);
    // Direct I/O may coexist with passthrough opens of the same inode; cached I/O
    // may not.
    reply.served(flags | FopenFlags::FOPEN_DIRECT_IO)
}

impl OpenReply for (ReplyOpen, FileHandle) {
    fn register(&self, file: &File) -> std::io::Result<BackingId> {
        self.0.open_backing(file)
    }

    fn passthrough(self, id: &BackingId) {
        self.0.opened_passthrough(self.1, FopenFlags::empty(), id)
    }

    fn served(self, flags: FopenFlags) {
        self.0.opened(self.1, flags)
    }
}

/// A `create` to answer: the new entry's attributes and how long they hold, and its
/// handle.
pub struct Created {
    pub reply: ReplyCreate,
    pub ttl: Duration,
    pub attr: FileAttr,
    pub generation: Generation,
    pub fh: FileHandle,
}

impl OpenReply for Created {
    fn register(&self, file: &File) -> std::io::Result<BackingId> {
        self.reply.open_backing(file)
    }

    fn passthrough(self, id: &BackingId) {
        let empty = FopenFlags::empty();
        (self.reply).created_passthrough(&self.ttl, &self.attr, self.generation, self.fh, empty, id)
    }

    fn served(self, flags: FopenFlags) {
        (self.reply).created(&self.ttl, &self.attr, self.generation, self.fh, flags)
    }
}
