//! Checkpoint archives: deterministic tar.gz writing, safe extraction, and (for the
//! mount) streaming indexing.
//!
//! The archive format is the product's compatibility surface (SPEC section 1): readers
//! accept whatever GNU tar, bsdtar and Python's `tarfile` write; the writer produces
//! one canonical encoding of a tree so that the same tree always has the same digest.

pub mod extract;
pub mod gz;
pub mod index;
pub mod writer;

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("{}: {reason}", path.display())]
    Source { path: PathBuf, reason: String },
    #[error("refusing entry {entry:?}: {reason}")]
    Hostile { entry: String, reason: &'static str },
    #[error("destination {}: {reason}", path.display())]
    Destination { path: PathBuf, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl ArchiveError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
        let context = context.into();
        move |source| ArchiveError::Io { context, source }
    }
}

/// Renders a raw tar path for messages; non-UTF-8 bytes are shown escaped.
pub(crate) fn display_path(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
