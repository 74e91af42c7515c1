//! Checkpoints on top of a store: naming, listing, verification, and (in `capture.rs`
//! and `restore.rs`) put and get.
//!
//! A checkpoint is the object `<sha256>.tar.gz`, and its name is the digest of its
//! bytes. Nothing downloaded is handed over before every byte has been hashed and
//! counted: [`VerifyingReader`] checks the digest and length as the stream ends, and
//! callers only act on the data (extract it, serve it) after [`VerifyingReader::finish`]
//! succeeded. Metadata is checked first, so a size or digest that disagrees with the
//! object's name or length fails before any download.
//!
//! This module decides what a checkpoint object's user metadata says: `sha256` (the
//! digest, 64 lowercase hex digits) and `size` (the length in bytes, decimal). Both
//! are written with every object and checked when present; an object without them
//! (put there by another tool) is still verified by its bytes. `captured` (the
//! writer's clock when it stored the object, RFC 3339 with nanoseconds) only orders
//! checkpoints that the store's clock puts in the same second: see [`list`].
//! `parent` (a sha256) is the checkpoint the writer says this one was made from
//! (`put --parent`). Neither is covered by the name's digest: both are claims, shown
//! as such.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::archive::ArchiveError;
use crate::store::{ObjectInfo, ObjectStore, StoreError};

mod capture;
mod restore;
mod spool;

pub use capture::{
    PUT_TEMP_PREFIX, PutOptions, PutReport, Source, StoreOutcome, put, store_archive,
    write_archive_file,
};
pub use restore::{GetOptions, get};

/// The SHA-256 of a checkpoint object, as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointId(String);

const OBJECT_SUFFIX: &str = ".tar.gz";

impl CheckpointId {
    pub fn parse(hex: &str) -> Option<Self> {
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| CheckpointId(hex.to_owned()))
    }

    /// The checkpoint an object name stands for, if it is one.
    pub fn from_object_name(name: &str) -> Option<Self> {
        Self::parse(name.strip_suffix(OBJECT_SUFFIX)?)
    }

    pub fn object_name(&self) -> String {
        format!("{}{OBJECT_SUFFIX}", self.0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, as used in `by-time/` names.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The user metadata keys of a checkpoint object.
const SHA256_KEY: &str = "sha256";
const SIZE_KEY: &str = "size";
const CAPTURED_KEY: &str = "captured";
const PARENT_KEY: &str = "parent";

/// The user metadata written with a checkpoint object of `size` bytes, stored now.
fn encode_metadata(
    id: &CheckpointId,
    size: u64,
    parent: Option<&CheckpointId>,
) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::from([
        (SHA256_KEY.to_owned(), id.as_str().to_owned()),
        (SIZE_KEY.to_owned(), size.to_string()),
        (
            CAPTURED_KEY.to_owned(),
            humantime::format_rfc3339_nanos(SystemTime::now()).to_string(),
        ),
    ]);
    if let Some(parent) = parent {
        metadata.insert(PARENT_KEY.to_owned(), parent.as_str().to_owned());
    }
    metadata
}

/// The parent a checkpoint's metadata claims (`put --parent`), if it claims a valid
/// digest other than its own. A claim: whoever wrote the object chose it.
pub fn claimed_parent(
    store: &dyn ObjectStore,
    id: &CheckpointId,
) -> Result<Option<CheckpointId>, StoreError> {
    // Deleted since it was listed: it claims nothing any more.
    let meta = match store.head(&id.object_name()) {
        Err(StoreError::NotFound { .. }) => return Ok(None),
        other => other?,
    };
    Ok(meta
        .metadata
        .get(PARENT_KEY)
        .and_then(|p| CheckpointId::parse(p))
        .filter(|p| p != id))
}

/// The capture time an object's metadata claims, if it is a valid one.
pub fn decode_captured(metadata: &BTreeMap<String, String>) -> Option<SystemTime> {
    humantime::parse_rfc3339(metadata.get(CAPTURED_KEY)?).ok()
}

/// What a checkpoint object's user metadata claims, as far as it says anything.
struct ClaimedMetadata<'a> {
    sha256: Option<&'a str>,
    /// The `size` value as the store has it: a value that is not a number is kept as
    /// text, for the error message.
    size: Option<&'a str>,
}

fn decode_metadata(metadata: &BTreeMap<String, String>) -> ClaimedMetadata<'_> {
    ClaimedMetadata {
        sha256: metadata.get(SHA256_KEY).map(String::as_str),
        size: metadata.get(SIZE_KEY).map(String::as_str),
    }
}

/// A checkpoint as listed: no request beyond the listing was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub id: CheckpointId,
    pub size: u64,
    pub last_modified: SystemTime,
}

/// Why a checkpoint did not verify. The first words of each message are the SPEC's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyFailure {
    #[error("Checkpoint object is missing")]
    Missing,
    #[error("Checkpoint size mismatch: {0}")]
    SizeMismatch(String),
    /// The transfer ended before the length the store announced: worth another try.
    #[error("Checkpoint size mismatch: the store announced {announced} bytes but sent {sent}")]
    Truncated { announced: u64, sent: u64 },
    #[error("Checkpoint checksum mismatch: {0}")]
    ChecksumMismatch(String),
    #[error("Checkpoint is too large: {size} bytes, the limit is {limit}")]
    TooLarge { size: u64, limit: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {id}: {failure}")]
    Verify {
        id: CheckpointId,
        failure: VerifyFailure,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("no checkpoint matches {0:?}")]
    UnknownPrefix(String),
    #[error("{0:?} is not a sha256 digest or a prefix of one (hex digits 0-9, a-f)")]
    NotADigest(String),
    #[error("{prefix:?} matches {} checkpoints ({}); give more digits", matches.len(), shown(matches))]
    AmbiguousPrefix {
        prefix: String,
        matches: Vec<CheckpointId>,
    },
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

/// Every checkpoint in the store, oldest first. Other objects under the prefix are
/// ignored. See [`list_ordered`] for the order.
pub fn list(store: &dyn ObjectStore) -> Result<Vec<CheckpointInfo>, StoreError> {
    list_ordered(store, &mut CaptureTimes::default(), Exact::All).map(|(listed, _)| listed)
}

/// The checkpoints in the store, ordered without asking any object for its capture
/// time (checkpoints of one second by digest): for callers to whom order does not
/// matter (`verify`, resolving a prefix).
pub fn list_unordered(store: &dyn ObjectStore) -> Result<Vec<CheckpointInfo>, StoreError> {
    list_ordered(store, &mut CaptureTimes::default(), Exact::Requests(0)).map(|(listed, _)| listed)
}

/// Which part of a listing's order [`list_ordered`] must get right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exact {
    All,
    /// The newest N checkpoints (enough for `latest~(N-1)`); the capture times of
    /// older checkpoints are used if known, not asked for.
    Newest(usize),
    /// As much as this many requests make exact, newest first.
    Requests(usize),
}

/// Capture times read from objects' metadata, kept so that a mount's refreshes ask
/// for each object's once. Keyed by the object's time too: an object stored again
/// under its name (a damaged one replaced) is asked again.
#[derive(Debug, Default)]
pub struct CaptureTimes(HashMap<(CheckpointId, SystemTime), Option<SystemTime>>);

/// Checkpoints asked for their capture times at once.
const HEADS_IN_FLIGHT: usize = 8;

/// Every checkpoint in the store in capture order: by the store's time
/// (`LastModified`, which the writer cannot set) to the whole second, then, among
/// checkpoints of the same second, by the capture time their metadata claims
/// (those without one first), then by digest. S3 gives times to the second, and an
/// agent can take several turns in one: only those need their metadata, one
/// `HeadObject` each, so a listing costs one `ListObjectsV2` per 1,000 checkpoints
/// plus one request per checkpoint that shares its second. A forged capture time can
/// reorder turns within their second, nothing more.
///
/// A store filled in bursts (an import, a benchmark: thousands of objects in the
/// same seconds) would cost a `HeadObject` per checkpoint; [`Exact::Newest`] bounds
/// that to the groups that decide the newest turns. Also returns whether the whole
/// order is exact (every checkpoint that shares its second has a known capture time,
/// or none to give).
pub fn list_ordered(
    store: &dyn ObjectStore,
    known: &mut CaptureTimes,
    exact: Exact,
) -> Result<(Vec<CheckpointInfo>, bool), StoreError> {
    let objects = store.list()?;
    let object_count = objects.len();
    let mut checkpoints: Vec<_> = objects
        .into_iter()
        .filter_map(
            |ObjectInfo {
                 name,
                 size,
                 last_modified,
             }| {
                Some(CheckpointInfo {
                    id: CheckpointId::from_object_name(&name)?,
                    size,
                    last_modified: plausible(last_modified),
                })
            },
        )
        .collect();
    checkpoints.sort_by(|a, b| {
        (whole_second(a.last_modified), &a.id).cmp(&(whole_second(b.last_modified), &b.id))
    });
    let second = |i: usize| checkpoints.get(i).map(|c| whole_second(c.last_modified));
    let tied: Vec<bool> = (0..checkpoints.len())
        .map(|i| (i > 0 && second(i - 1) == second(i)) || second(i + 1) == second(i))
        .collect();
    // The first checkpoint whose place must be exact: the start of the second that
    // holds the oldest of the newest N.
    let asked_from = match exact {
        Exact::Newest(n) if n < checkpoints.len() => {
            let oldest = checkpoints.len() - n.max(1);
            (0..=oldest)
                .rev()
                .take_while(|&i| second(i) == second(oldest))
                .last()
                .unwrap_or(oldest)
        }
        _ => 0,
    };
    let key = |c: &CheckpointInfo| (c.id.clone(), c.last_modified);
    let mut unknown: Vec<&CheckpointInfo> = checkpoints
        .iter()
        .zip(&tied)
        .skip(asked_from)
        .filter(|&(c, &tied)| tied && !known.0.contains_key(&key(c)))
        .map(|(c, _)| c)
        .collect();
    if let Exact::Requests(most) = exact {
        unknown.drain(..unknown.len().saturating_sub(most));
    }
    for (c, captured) in unknown.iter().zip(capture_times(store, &unknown)) {
        if let Some(captured) = captured {
            known.0.insert(key(c), captured);
        }
    }
    let asked = unknown.len();
    let all_known = checkpoints
        .iter()
        .zip(&tied)
        .all(|(c, &tied)| !tied || known.0.contains_key(&key(c)));
    let mut keyed: Vec<_> = checkpoints
        .into_iter()
        .zip(tied)
        .map(|(c, tied)| {
            let captured = if tied {
                known.0.get(&key(&c)).copied().flatten()
            } else {
                None
            };
            ((whole_second(c.last_modified), captured), c)
        })
        .collect();
    keyed.sort_by(|(a, ca), (b, cb)| (a, &ca.id).cmp(&(b, &cb.id)));
    tracing::debug!(
        store = %store.describe(),
        objects = object_count,
        checkpoints = keyed.len(),
        asked_for_capture_time = asked,
        order_exact = all_known,
        "listed the store (objects not named <sha256>.tar.gz are ignored)"
    );
    Ok((keyed.into_iter().map(|(_, c)| c).collect(), all_known))
}
/// A store time within what RFC 3339 can print (a local store's times are file
/// mtimes, which whoever writes the directory can set to anything).
fn plausible(time: SystemTime) -> SystemTime {
    const LAST: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    match time.duration_since(UNIX_EPOCH) {
        Err(_) => UNIX_EPOCH,
        Ok(d) if d.as_secs() > LAST => UNIX_EPOCH + std::time::Duration::from_secs(LAST),
        Ok(_) => time,
    }
}

fn whole_second(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The capture time each checkpoint's metadata claims (`Some(None)`: it claims
/// none), asked [`HEADS_IN_FLIGHT`] at a time. One that cannot be asked (deleted
/// since the listing, a failed request) gives `None`: it sorts first in its second
/// this time and is asked again next time. The order is never a reason to fail a
/// listing.
fn capture_times(
    store: &dyn ObjectStore,
    infos: &[&CheckpointInfo],
) -> Vec<Option<Option<SystemTime>>> {
    let ask = |info: &CheckpointInfo| match store.head(&info.id.object_name()) {
        Ok(meta) => Some(decode_captured(&meta.metadata)),
        Err(e) => {
            tracing::warn!(checkpoint = %info.id, error = %e, "could not read the capture time");
            None
        }
    };
    let per_thread = infos.len().div_ceil(HEADS_IN_FLIGHT).max(1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = infos
            .chunks(per_thread)
            .map(|chunk| {
                scope.spawn(move || chunk.iter().map(|info| ask(info)).collect::<Vec<_>>())
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("capture time thread"))
            .collect()
    })
}

/// Resolves a full digest or an unambiguous prefix of one. A full digest is taken
/// as it is, without a listing.
pub fn resolve(store: &dyn ObjectStore, given: &str) -> Result<CheckpointId, CheckpointError> {
    let name = normalize_name(given);
    if let Some(id) = CheckpointId::parse(&name) {
        return Ok(id);
    }
    if !is_prefix(&name) {
        return Err(CheckpointError::NotADigest(name));
    }
    resolve_listed(&list_unordered(store)?, &name).map(|c| c.id.clone())
}

/// The checkpoint of `checkpoints` (a listing) that a full digest or an unambiguous
/// prefix of one names.
pub fn resolve_listed<'a>(
    checkpoints: &'a [CheckpointInfo],
    given: &str,
) -> Result<&'a CheckpointInfo, CheckpointError> {
    let given = normalize_name(given);
    if !is_prefix(&given) {
        return Err(CheckpointError::NotADigest(given));
    }
    let matches: Vec<_> = checkpoints
        .iter()
        .filter(|c| c.id.as_str().starts_with(&given))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(CheckpointError::UnknownPrefix(given)),
        many => Err(CheckpointError::AmbiguousPrefix {
            prefix: given,
            matches: many.iter().map(|c| c.id.clone()).collect(),
        }),
    }
}

/// The first few of `ids`, for a message.
fn shown(ids: &[CheckpointId]) -> String {
    const SHOWN: usize = 8;
    let mut text = ids
        .iter()
        .take(SHOWN)
        .map(CheckpointId::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > SHOWN {
        text.push_str(&format!(" and {} more", ids.len() - SHOWN));
    }
    text
}

fn is_prefix(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A digest as typed: trimmed, lowercase, without the object suffix.
fn normalize_name(given: &str) -> String {
    let given = given.trim().to_ascii_lowercase();
    match given.strip_suffix(OBJECT_SUFFIX) {
        Some(stem) => stem.to_owned(),
        None => given,
    }
}

/// Wraps an object's byte stream: hashes and counts every byte, and at the end tells
/// whether the object is the checkpoint its name promises.
pub struct VerifyingReader<R> {
    id: CheckpointId,
    inner: R,
    hasher: Sha256,
    read: u64,
    announced: u64,
}

impl<R: Read> VerifyingReader<R> {
    /// Reads the rest of the stream (consumers such as gzip may stop early), then
    /// compares length and digest.
    pub fn finish(mut self) -> Result<u64, CheckpointError> {
        io::copy(&mut self, &mut io::sink()).map_err(|cause| CheckpointError::Io {
            context: format!("download checkpoint {}", self.id),
            cause,
        })?;
        let failure = if self.read != self.announced {
            VerifyFailure::Truncated {
                announced: self.announced,
                sent: self.read,
            }
        } else {
            let digest = hex::encode(self.hasher.finalize_reset());
            if digest == self.id.as_str() {
                return Ok(self.read);
            }
            VerifyFailure::ChecksumMismatch(format!("the object's bytes hash to {digest}"))
        };
        Err(CheckpointError::Verify {
            id: self.id,
            failure,
        })
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        if self.read > self.announced {
            // A store sending more than it announced is not one we trust further.
            return Err(io::Error::other(format!(
                "Checkpoint size mismatch: the store sent more than the {} bytes it announced",
                self.announced
            )));
        }
        Ok(n)
    }
}

/// Starts downloading a checkpoint after checking what its metadata says. The
/// returned reader must be drained with [`VerifyingReader::finish`] before its bytes
/// are trusted.
pub fn open(
    store: &dyn ObjectStore,
    id: &CheckpointId,
    max_size: u64,
) -> Result<VerifyingReader<Box<dyn Read + Send>>, CheckpointError> {
    open_object(store, id, None, max_size)
}

/// Like [`open`], for one version of the object in a versioned bucket (a checkpoint
/// hidden by a delete, say): checked the same way, its bytes against the name.
pub fn open_object(
    store: &dyn ObjectStore,
    id: &CheckpointId,
    version: Option<&str>,
    max_size: u64,
) -> Result<VerifyingReader<Box<dyn Read + Send>>, CheckpointError> {
    let fail = |failure| CheckpointError::Verify {
        id: id.clone(),
        failure,
    };
    let name = id.object_name();
    let got = match version {
        None => store.get(&name),
        Some(version) => store.get_version(&name, version),
    };
    let object = match got {
        Ok(object) => object,
        Err(StoreError::NotFound { .. }) => return Err(fail(VerifyFailure::Missing)),
        Err(e) => return Err(e.into()),
    };
    let meta = object.meta;
    let claimed = decode_metadata(&meta.metadata);
    if let Some(size) = claimed.size
        && size.trim().parse::<u64>().ok() != Some(meta.length)
    {
        return Err(fail(VerifyFailure::SizeMismatch(format!(
            "the size metadata says {size} bytes, the object has {}",
            meta.length
        ))));
    }
    if let Some(sha) = claimed.sha256
        && !sha.trim().eq_ignore_ascii_case(id.as_str())
    {
        return Err(fail(VerifyFailure::ChecksumMismatch(format!(
            "the sha256 metadata says {sha}"
        ))));
    }
    if meta.length > max_size {
        return Err(fail(VerifyFailure::TooLarge {
            size: meta.length,
            limit: max_size,
        }));
    }
    Ok(VerifyingReader {
        id: id.clone(),
        inner: object.body,
        hasher: Sha256::new(),
        read: 0,
        announced: meta.length,
    })
}

/// Downloads and checks one checkpoint, keeping nothing.
pub fn verify(store: &dyn ObjectStore, id: &CheckpointId) -> Result<(), CheckpointError> {
    verify_object(store, id, None, u64::MAX)
}

/// [`verify`] of one version of the object (see [`open_object`]), refused over
/// `max_size`.
pub fn verify_object(
    store: &dyn ObjectStore,
    id: &CheckpointId,
    version: Option<&str>,
    max_size: u64,
) -> Result<(), CheckpointError> {
    let reader = open_object(store, id, version, max_size)?;
    tracing::debug!(checkpoint = %id, bytes = reader.announced, "downloading to verify");
    let read = reader.finish()?;
    tracing::debug!(checkpoint = %id, bytes = read, "length and sha256 match the name");
    Ok(())
}

#[cfg(test)]
mod tests;
