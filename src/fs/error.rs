//! The one place where filesystem errors become errno values, and where failed
//! requests are logged.
//!
//! Every failure answered `EIO` is logged at warn level with its reason once: the
//! same reason again within [`REPEAT_AFTER`] goes to the debug log only, so that an
//! `ls -R` of a damaged checkpoint gives one line, not one per entry. Refusals in
//! `commit/` (anything but a seal) are logged the same way, so that a user who wonders
//! why `touch commit/x` failed finds it. `EIO` answers and refusals in `commit/` are
//! counted for `.status`. Other unexpected failures (`ESTALE`, `EINVAL`, `EFBIG`...)
//! are logged the same way, once per operation and reason. All of this is per
//! process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A reason logged at warn level is logged so again after this long.
pub const REPEAT_AFTER: Duration = Duration::from_secs(600);
/// Reasons remembered at most; beyond this the oldest are forgotten.
const REMEMBERED: usize = 1024;

static IO_ERRORS: AtomicU64 = AtomicU64::new(0);
static COMMIT_REFUSALS: AtomicU64 = AtomicU64::new(0);
static LOGGED: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);
/// Warn lines a minute at most, whatever the reasons: a writer in `staging/` can make
/// failing requests with ever new reasons (names) as fast as it likes, and the log
/// file is never rotated by the daemon.
const LINES_A_MINUTE: u32 = 600;
static MINUTE: Mutex<Option<(Instant, u32)>> = Mutex::new(None);

/// Failed requests counted since the process started.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Answered `EIO`.
    pub io_errors: u64,
    /// Refused in `commit/`: anything but `mv staging/NAME commit/`.
    pub commit_refusals: u64,
}

pub fn counts() -> Counts {
    Counts {
        io_errors: IO_ERRORS.load(Ordering::Relaxed),
        commit_refusals: COMMIT_REFUSALS.load(Ordering::Relaxed),
    }
}

/// Whether `reason` should be logged at warn level now: not within [`REPEAT_AFTER`]
/// of the last time, and not past [`LINES_A_MINUTE`]. For seals too.
pub fn first_time(reason: &str) -> bool {
    let now = Instant::now();
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    let logged = logged.get_or_insert_with(HashMap::new);
    if logged
        .get(reason)
        .is_some_and(|at| now.duration_since(*at) < REPEAT_AFTER)
    {
        return false;
    }
    let mut minute = MINUTE.lock().unwrap_or_else(|e| e.into_inner());
    let (start, lines) = minute.get_or_insert((now, 0));
    if now.duration_since(*start) >= Duration::from_secs(60) {
        (*start, *lines) = (now, 0);
    }
    if *lines >= LINES_A_MINUTE {
        return false;
    }
    *lines += 1;
    if logged.len() >= REMEMBERED {
        logged.retain(|_, at| now.duration_since(*at) < REPEAT_AFTER);
        if logged.len() >= REMEMBERED {
            logged.clear();
        }
    }
    logged.insert(reason.to_owned(), now);
    true
}

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
    CacheRead(std::io::Error),
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
    /// A path in a workspace is too long to be stored.
    #[error("{0}")]
    NameTooLong(String),
    #[error("{0}")]
    NotPermitted(&'static str),
    /// Something other than a seal asked of `commit/`.
    #[error("{0}")]
    CommitOnly(&'static str),
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
            FsError::Unverified { .. } | FsError::CacheRead(_) | FsError::Store(_) => libc::EIO,
            FsError::Os(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FsError::Stale => libc::ESTALE,
            FsError::Busy => libc::EBUSY,
            FsError::Exists => libc::EEXIST,
            FsError::TooLarge(_) => libc::EFBIG,
            FsError::NameTooLong(_) => libc::ENAMETOOLONG,
            FsError::NotPermitted(_) | FsError::CommitOnly(_) => libc::EPERM,
            FsError::InvalidArgument => libc::EINVAL,
            FsError::NotSupported(_) => libc::ENOTSUP,
            FsError::NoAttribute => libc::ENODATA,
        }
    }

    /// Logs a request that failed with this error (see the module's comment) and
    /// returns the errno to answer.
    pub fn report(&self, operation: &str, ino: u64) -> i32 {
        let errno = self.errno();
        if errno == libc::EIO {
            IO_ERRORS.fetch_add(1, Ordering::Relaxed);
            let reason = crate::printable::message(&self.to_string()).into_owned();
            if first_time(&reason) {
                tracing::warn!(operation, ino, error = %reason, "answered EIO");
            } else {
                tracing::debug!(operation, ino, error = %reason, "answered EIO (logged before)");
            }
        } else if let FsError::CommitOnly(reason) = self {
            COMMIT_REFUSALS.fetch_add(1, Ordering::Relaxed);
            if first_time(&format!("{operation}: {reason}")) {
                // Info, not warn: the daemon did what it should.
                tracing::info!(operation, ino, error = reason, "refused in commit/");
            } else {
                tracing::debug!(
                    operation,
                    ino,
                    error = reason,
                    "refused in commit/ (logged before)"
                );
            }
        } else if self.is_notable() {
            // Rate-limited like EIO: a writer in staging/ can repeat a failing request
            // (readlink of a symlink it removed: ESTALE) as fast as it likes.
            let error = crate::printable::message(&self.to_string()).into_owned();
            if first_time(&format!("{operation}: {error}")) {
                tracing::warn!(operation, ino, %error, errno, "request failed");
            } else {
                tracing::debug!(operation, ino, %error, errno, "request failed (logged before)");
            }
        } else {
            let error = crate::printable::Message(self);
            tracing::debug!(operation, ino, %error, errno, "request refused");
        }
        errno
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
                | FsError::NotPermitted(_)
                | FsError::NoAttribute
        )
    }
}
