//! The filesystem logic, free of FUSE types, so that it can be tested by calling it.
//!
//! [`CheckpointFs`] (`router.rs`) decodes an inode (or a file handle) once into the
//! subtree that owns it ([`inode::Owner`]) and hands the call to that subtree through
//! one small trait, [`Subtree`] (`subtree.rs`, with the vocabulary they share):
//! - [`views::Views`]: the root, `by-time/`, `latest`, `.status` and `commit/`, built
//!   from the listing snapshot ([`listing::Catalog`]) and the seals;
//! - [`checkpoints::Checkpoints`]: each checkpoint's contents, from verified cache
//!   entries that the [`loader::Loader`] brings in with a bounded pool of workers;
//! - [`staging::StagingTree`]: the writable `staging/`, sealed into checkpoints by the
//!   [`sealer::Sealer`] when a workspace is renamed into `commit/`.
//!
//! Subtrees answer with values that carry policy (how long the kernel may cache an
//! entry, whether an open may be served by passthrough), so that the FUSE adapter only
//! translates. Invariants:
//! - listing the root, or `stat` of a checkpoint's directory, never downloads;
//! - nothing inside a checkpoint is answered before the loader verified it: every
//!   operation that reads a checkpoint's tree goes through [`CheckpointFs::prepare`],
//!   which defers it until the load ends, off the FUSE request threads; a failed load
//!   answers EIO with its reason in `.status`, and a later access tries again;
//! - readers never wait for a refresh, a load, an eviction or a `.status` render.

mod checkpoints;
mod error;
mod forker;
mod fuse;
mod inode;
mod listing;
pub mod loader;
mod metrics;
pub mod mount;
mod passthrough;
mod primer;
mod readahead;
mod router;
mod sealer;
pub mod staging;
pub mod status;
mod subtree;
mod views;

pub use error::FsError;
pub use router::{CheckpointFs, FsConfig, Reading};
pub use staging::{Caller, SetAttr, SetTime, StagingTree};
pub use subtree::{
    Attr, CopySource, DirEntry, Entry, FileKind, KernelCache, NO_HANDLE, Opened, Subtree,
};

#[cfg(test)]
mod tests;
