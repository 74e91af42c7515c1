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
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

impl ArchiveError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
        let context = context.into();
        move |cause| ArchiveError::Io { context, cause }
    }
}

/// An entry's owner and mtime as `tar -x` sees them: pax records (`mtime`, `uid`,
/// `gid`) win over the header, since they hold what the header cannot (fractions of a
/// second, times before 1970, large ids). Fractional mtimes are floored, like `tar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    pub mtime: i64,
    pub uid: u64,
    pub gid: u64,
}

pub(crate) fn entry_meta<R: std::io::Read>(entry: &mut tar::Entry<'_, R>) -> EntryMeta {
    let header = entry.header();
    let mut meta = EntryMeta {
        mtime: header.mtime().map_or(0, |t| t as i64),
        uid: header.uid().unwrap_or(0),
        gid: header.gid().unwrap_or(0),
    };
    if let Ok(Some(extensions)) = entry.pax_extensions() {
        for extension in extensions.flatten() {
            let (Ok(key), Ok(value)) = (extension.key(), extension.value()) else {
                continue;
            };
            match key {
                "mtime" => {
                    if let Ok(t) = value.trim().parse::<f64>() {
                        meta.mtime = t.floor() as i64;
                    }
                }
                "uid" => meta.uid = value.trim().parse().unwrap_or(meta.uid),
                "gid" => meta.gid = value.trim().parse().unwrap_or(meta.gid),
                _ => {}
            }
        }
    }
    meta
}

/// Renders a raw tar path for messages; non-UTF-8 bytes are shown escaped.
pub(crate) fn display_path(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
