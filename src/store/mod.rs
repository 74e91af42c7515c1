//! The object store: a flat namespace of immutable objects under one prefix, each
//! with a few string pairs of user metadata.
//!
//! This module owns the [`ObjectStore`] trait, its error type, and [`StoreConfig`]
//! (which store a `STORE` argument names, parsed once; [`open`] turns it into a
//! store). Two implementations exist: [`s3::S3Store`] (the only file that touches
//! aws-sdk-s3) and [`local::LocalStore`] (a directory with `.meta.json` sidecars).
//! Callers speak in object *names*; the store adds its prefix. The store knows
//! nothing of checkpoints: what the names and the metadata mean is
//! [`crate::checkpoint`]'s business.
//!
//! Invariants every implementation keeps:
//! - `list` never downloads or HEADs individual objects;
//! - `put` is atomic: readers see either no object or the whole object, and a put
//!   that fails leaves nothing behind (no temporary file, no multipart upload);
//! - `put` with [`PutMode::IfAbsent`] never replaces an existing object: it answers
//!   [`PutOutcome::AlreadyPresent`]. Whether that object is good is the caller's to
//!   check (names are digests, but an object can be damaged or planted);
//!   [`PutMode::Overwrite`] replaces one that was found bad, atomically;
//! - uploads carry the SHA-256 of what is sent, for the server to check;
//! - the metadata given to `put` comes back from `get` as it was given;
//! - [`Reuse`] hints given to `put_reusing` change how many bytes are sent, never what
//!   is stored: a store that copies bytes it already holds checks each copied range
//!   against the file, and sends the file instead when a check or a copy fails.

pub mod local;
pub mod parts;
pub mod s3;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// One object as seen in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The name below the prefix, such as `<sha256>.tar.gz`.
    pub name: String,
    pub size: u64,
    pub last_modified: SystemTime,
}

/// One version of an object in a versioned bucket: stored bytes, or a delete marker
/// (what a delete leaves, hiding the versions before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub name: String,
    pub version_id: String,
    pub size: u64,
    pub last_modified: SystemTime,
    pub delete_marker: bool,
    /// The current version of its name (the store says so: times are whole seconds).
    pub is_latest: bool,
}

/// What the store says about one object before its bytes are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The length the store announces for the object.
    pub length: u64,
    /// The user metadata as the store has it (whoever wrote the object set it; it is
    /// not checked against anything here).
    pub metadata: BTreeMap<String, String>,
}

/// An object being downloaded: its metadata and a stream of its bytes.
pub struct ObjectReader {
    pub meta: ObjectMeta,
    pub body: Box<dyn Read + Send>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Store unless the name exists.
    IfAbsent,
    /// Store whether or not the name exists, replacing it atomically.
    Overwrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Stored,
    AlreadyPresent,
}

/// A hint for [`ObjectStore::put_reusing`]: `length` bytes at `offset` of the file
/// being stored are the same as `length` bytes at `source_offset` of the object
/// `source`, which the store already holds (as far as the caller knows: the store
/// checks before it relies on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reuse {
    pub offset: u64,
    pub length: u64,
    pub source: String,
    pub source_offset: u64,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub outcome: PutOutcome,
    /// Bytes the store copied from objects it held, instead of receiving them.
    pub copied: u64,
    /// Of those, the bytes only an MD5 (the part's ETag) vouches for: the server gave
    /// no SHA-256 of the copy. MD5 collisions can be made, and both the source object
    /// and (through stored deflate blocks) the archive's bytes may be an attacker's,
    /// so the caller must read such an object back before trusting it.
    pub copied_unchecked: u64,
}

/// Reports `(bytes transferred so far, bytes in all)`; called from the thread doing
/// the transfer.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {name} does not exist")]
    NotFound { name: String },
    #[error("invalid store {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("{operation} {name}: {message}")]
    Remote {
        operation: &'static str,
        name: String,
        message: String,
    },
    #[error("{operation} {}: {cause}", path.display())]
    Io {
        operation: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl StoreError {
    pub(crate) fn io(operation: &'static str, path: &Path, cause: std::io::Error) -> Self {
        StoreError::Io {
            operation,
            path: path.to_owned(),
            cause,
        }
    }
}

/// A flat set of immutable objects. Blocking: S3 calls run on the store's own runtime,
/// so callers can be plain threads (the CLI, FUSE request threads, download workers).
pub trait ObjectStore: Send + Sync {
    /// A human-readable name for logs and errors, such as `s3://bucket/prefix`.
    fn describe(&self) -> String;

    /// Every object directly under the prefix, in no particular order.
    fn list(&self) -> Result<Vec<ObjectInfo>, StoreError>;

    /// Starts a download. Fails with [`StoreError::NotFound`] when there is no such object.
    fn get(&self, name: &str) -> Result<ObjectReader, StoreError>;

    /// Whether the object exists, without reading it.
    fn exists(&self, name: &str) -> Result<bool, StoreError>;

    /// Every version of every object directly under the prefix (of the object
    /// `name` only, if given), delete markers included, in no particular order;
    /// `None` when the store keeps no versions (a local directory, a bucket without
    /// versioning).
    fn versions(&self, name: Option<&str>) -> Result<Option<Vec<ObjectVersion>>, StoreError> {
        let _ = name;
        Ok(None)
    }

    /// Starts a download of one version of an object (see [`versions`](Self::versions)).
    fn get_version(&self, name: &str, version_id: &str) -> Result<ObjectReader, StoreError> {
        let _ = version_id;
        Err(StoreError::Remote {
            operation: "GetObject",
            name: name.into(),
            message: format!("{} keeps no versions", self.describe()),
        })
    }

    /// Replaces the object's user metadata with `metadata` and makes its time now,
    /// without sending its bytes (S3: `CopyObject` onto itself); the bytes stay as
    /// they are. Fails with [`StoreError::NotFound`] when there is no such object.
    fn refresh(&self, name: &str, metadata: &BTreeMap<String, String>) -> Result<(), StoreError>;

    /// Deletes the object (on a versioned bucket: hides it behind a delete marker).
    /// Deleting an object that is not there is not an error.
    fn delete(&self, name: &str) -> Result<(), StoreError>;

    /// The object's length and user metadata, without reading it (`HeadObject`).
    /// Fails with [`StoreError::NotFound`] when there is no such object.
    fn head(&self, name: &str) -> Result<ObjectMeta, StoreError>;

    /// Stores the file at `path` as `name` with the user metadata `metadata`; with
    /// [`PutMode::IfAbsent`], only if `name` does not exist. The file must not change
    /// while it is stored.
    fn put(
        &self,
        name: &str,
        path: &Path,
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError>;

    /// Like [`put`](Self::put), but the store may copy the ranges `reuse` names from
    /// objects it holds instead of receiving them. Stores that cannot copy ignore the
    /// hints.
    fn put_reusing(
        &self,
        name: &str,
        path: &Path,
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        _reuse: &[Reuse],
        progress: Progress<'_>,
    ) -> Result<Stored, StoreError> {
        let outcome = self.put(name, path, metadata, mode, progress)?;
        Ok(Stored {
            outcome,
            copied: 0,
            copied_unchecked: 0,
        })
    }

    /// Abandons every unfinished upload of `name` (a multipart upload whose writer
    /// was killed before it could abort it); returns how many there were. Stores
    /// whose puts leave nothing behind when interrupted have none.
    fn abort_uploads(&self, _name: &str) -> Result<usize, StoreError> {
        Ok(0)
    }
}

/// How long a download may receive nothing before it fails.
pub const DEFAULT_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The part size of multipart uploads when the caller has no say (reading commands).
pub const DEFAULT_PART_SIZE: u64 = 64 * 1024 * 1024;

/// Which store a `STORE` argument names, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    S3 {
        bucket: String,
        /// As given after the bucket (the store trims its slashes).
        prefix: String,
        /// Overrides the endpoint (MinIO, R2, a local test server); implies path-style
        /// addressing. `None` falls back to `AWS_ENDPOINT_URL`, then to AWS.
        endpoint_url: Option<String>,
        /// Objects larger than this go up in parts of this size.
        part_size: u64,
        /// A download that receives nothing for this long fails (and can be tried
        /// again) rather than hanging.
        stall_timeout: std::time::Duration,
    },
    Local {
        dir: PathBuf,
    },
}

impl StoreConfig {
    /// Parses `s3://BUCKET/PREFIX` or a local directory path. `endpoint_url` and
    /// `part_size` apply to S3 only.
    pub fn parse(
        url: &str,
        endpoint_url: Option<String>,
        part_size: u64,
    ) -> Result<StoreConfig, StoreError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::InvalidUrl {
                    url: url.to_owned(),
                    reason: "the bucket name is empty".into(),
                });
            }
            Ok(StoreConfig::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.to_owned(),
                endpoint_url,
                part_size,
                stall_timeout: DEFAULT_STALL_TIMEOUT,
            })
        } else if url.get(..3).is_some_and(|s| s.eq_ignore_ascii_case("s3:")) {
            // `s3:/bucket`, `s3:bucket` or `S3://bucket` mean S3: taken for a local
            // path they would make a directory named `s3:` and succeed.
            Err(StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: "an S3 store is written s3://BUCKET/PREFIX (two slashes, lower \
                         case); for a local directory of this name, write ./ before it"
                    .into(),
            })
        } else if url.contains("://") {
            Err(StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: "only s3:// URLs and local directory paths are supported".into(),
            })
        } else {
            Ok(StoreConfig::Local {
                dir: PathBuf::from(url),
            })
        }
    }
}

/// Opens the store `config` names. A local store directory must exist.
pub fn open(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>, StoreError> {
    match config {
        StoreConfig::S3 {
            bucket,
            prefix,
            endpoint_url,
            part_size,
            stall_timeout,
        } => Ok(Arc::new(s3::S3Store::new(
            bucket,
            prefix,
            endpoint_url.as_deref(),
            *stall_timeout,
            *part_size,
        )?)),
        StoreConfig::Local { dir } => Ok(Arc::new(local::LocalStore::open(dir)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreConfig::parse("s3://bucket/a/b/", Some("http://h".into()), 5 << 20).unwrap(),
            StoreConfig::S3 {
                bucket: "bucket".into(),
                prefix: "a/b/".into(),
                endpoint_url: Some("http://h".into()),
                part_size: 5 << 20,
                stall_timeout: DEFAULT_STALL_TIMEOUT,
            }
        );
        assert_eq!(
            StoreConfig::parse("s3://bucket", None, DEFAULT_PART_SIZE).unwrap(),
            StoreConfig::S3 {
                bucket: "bucket".into(),
                prefix: String::new(),
                endpoint_url: None,
                part_size: DEFAULT_PART_SIZE,
                stall_timeout: DEFAULT_STALL_TIMEOUT,
            }
        );
        assert_eq!(
            StoreConfig::parse("./store", None, DEFAULT_PART_SIZE).unwrap(),
            StoreConfig::Local {
                dir: PathBuf::from("./store")
            }
        );
        assert_eq!(
            StoreConfig::parse("./s3:/x", None, DEFAULT_PART_SIZE).unwrap(),
            StoreConfig::Local {
                dir: PathBuf::from("./s3:/x")
            }
        );
        // Issue 27, item 4: S3 with one slash, none, or in capitals is not a path.
        for bad in [
            "s3://",
            "s3:///prefix",
            "http://host/x",
            "gs://b/p",
            "s3:/ckpts/proj",
            "s3:ckpts",
            "S3://ckpts/proj",
        ] {
            assert!(
                matches!(
                    StoreConfig::parse(bad, None, DEFAULT_PART_SIZE),
                    Err(StoreError::InvalidUrl { .. })
                ),
                "{bad}"
            );
        }
    }
}
