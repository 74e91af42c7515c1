//! The object store: the flat namespace of checkpoint objects under one prefix.
//!
//! This module owns the [`ObjectStore`] trait and its error type. Two implementations
//! exist: [`s3::S3Store`] (the only file that touches aws-sdk-s3) and
//! [`local::LocalStore`] (a directory with `.meta.json` sidecars). Callers speak in
//! object *names* (`<sha256>.tar.gz`); the store adds its prefix.
//!
//! Invariants every implementation keeps:
//! - `list` never downloads or HEADs individual objects;
//! - `put` is atomic: readers see either no object or the whole object, and a put
//!   that fails leaves nothing behind (no temporary file, no multipart upload);
//! - `put` with [`PutMode::IfAbsent`] never replaces an existing object: it answers
//!   [`PutOutcome::AlreadyPresent`]. Whether that object is good is the caller's to
//!   check (names are digests, but an object can be damaged or planted);
//!   [`PutMode::Overwrite`] replaces one that was found bad, atomically;
//! - uploads carry the SHA-256 of what is sent, for the server to check.

pub mod local;
pub mod s3;

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

/// What the store says about one object before its bytes are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The length the store announces for the object.
    pub length: u64,
    /// The `sha256` user metadata, if the writer set it.
    pub sha256: Option<String>,
    /// The `size` user metadata, verbatim, if the writer set it.
    pub size: Option<String>,
}

/// An object being downloaded: its metadata and a stream of its bytes.
pub struct ObjectReader {
    pub meta: ObjectMeta,
    pub body: Box<dyn Read + Send>,
}

/// The user metadata written with every checkpoint object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointMetadata {
    pub sha256: String,
    pub size: u64,
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

    /// Stores the file at `path` as `name` with `metadata`; with
    /// [`PutMode::IfAbsent`], only if `name` does not exist.
    fn put(
        &self,
        name: &str,
        path: &Path,
        metadata: &CheckpointMetadata,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError>;
}

/// Options for stores that talk to S3.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Overrides the endpoint (MinIO, R2, a local test server); implies path-style addressing.
    pub endpoint_url: Option<String>,
    /// Objects larger than this go up in parts of this size.
    pub part_size: u64,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint_url: None,
            part_size: 64 * 1024 * 1024,
        }
    }
}

/// Opens `s3://BUCKET/PREFIX` or a local directory path.
pub fn open(url: &str, options: &S3Options) -> Result<Arc<dyn ObjectStore>, StoreError> {
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: url.to_owned(),
                reason: "the bucket name is empty".into(),
            });
        }
        Ok(Arc::new(s3::S3Store::new(bucket, prefix, options)?))
    } else if url.contains("://") {
        Err(StoreError::InvalidUrl {
            url: url.to_owned(),
            reason: "only s3:// URLs and local directory paths are supported".into(),
        })
    } else {
        Ok(Arc::new(local::LocalStore::open(Path::new(url))?))
    }
}

/// The `{"sha256": ..., "size": ...}` document of the local store's sidecar.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct MetadataDocument {
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub size: Option<serde_json::Value>,
}
