//! The one place where filesystem errors become errno values.

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
    /// Reading a verified checkpoint from the cache failed: never the caller's fault.
    #[error("reading the cache: {0}")]
    Io(std::io::Error),
    /// A staging operation failed on the backing directory; its errno is passed on.
    #[error("{0}")]
    Os(std::io::Error),
    #[error("the inode is no longer known")]
    Stale,
    #[error("it is being sealed")]
    Busy,
    #[error("already exists")]
    Exists,
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Store(String),
    #[error("{0}")]
    NotPermitted(&'static str),
    #[error("invalid argument")]
    InvalidArgument,
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    #[error("no such attribute")]
    NoAttribute,
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
            FsError::Unverified { .. } | FsError::Io(_) | FsError::Store(_) => libc::EIO,
            FsError::Os(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FsError::Stale => libc::ESTALE,
            FsError::Busy => libc::EBUSY,
            FsError::Exists => libc::EEXIST,
            FsError::TooLarge(_) => libc::EFBIG,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::InvalidArgument => libc::EINVAL,
            FsError::NotSupported(_) => libc::ENOTSUP,
            FsError::NoAttribute => libc::ENODATA,
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
                | FsError::Os(_)
                | FsError::Exists
                | FsError::Busy
                | FsError::NotSupported(_)
                | FsError::NoAttribute
        )
    }
}
