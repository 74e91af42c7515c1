//! The one place where filesystem errors become errno values.

use crate::cache::CacheError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such entry")]
    NotFound,
    #[error("checkpoints are read-only")]
    ReadOnly,
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("not a symlink")]
    NotASymlink,
    #[error("unknown file handle")]
    BadHandle,
    #[error("checkpoint {id} is unavailable: {reason}")]
    Unverified { id: String, reason: String },
    #[error("checkpoint {id}: {source}")]
    Cache {
        id: String,
        #[source]
        source: CacheError,
    },
    #[error("reading the cache: {0}")]
    Io(#[from] std::io::Error),
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotADirectory => libc::ENOTDIR,
            FsError::IsADirectory => libc::EISDIR,
            FsError::NotASymlink => libc::EINVAL,
            FsError::BadHandle => libc::EBADF,
            FsError::Unverified { .. } | FsError::Cache { .. } | FsError::Io(_) => libc::EIO,
        }
    }

    /// Expected outcomes (a missing name, a refused write) are not worth a log line.
    pub fn is_notable(&self) -> bool {
        !matches!(
            self,
            FsError::NotFound
                | FsError::ReadOnly
                | FsError::NotADirectory
                | FsError::IsADirectory
                | FsError::NotASymlink
        )
    }
}
