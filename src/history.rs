//! What a versioned bucket remembers that its listing no longer shows: checkpoints
//! hidden by a delete (a delete marker over them) and names whose bytes were
//! replaced (`ckptfs verify --history`, and `get` of a hidden checkpoint).
//!
//! Anyone who can write the bucket can delete or overwrite an object; with
//! versioning (and S3 Object Lock, so that versions cannot be deleted either) the
//! earlier versions stay. A checkpoint's name is the SHA-256 of its bytes, so a
//! version is that checkpoint exactly when its bytes hash to the name: every version
//! found here is downloaded and verified, never trusted for its size or ETag.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::checkpoint::{self, CheckpointError, CheckpointId, VerifyFailure};
use crate::store::{ObjectStore, ObjectVersion, StoreError};

/// What the versions of one checkpoint's name say, beyond its current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The newest version is a delete marker: the checkpoint was deleted at
    /// `deleted_at` (by `prune`, or by anyone who could). `restorable`: the newest
    /// earlier version that verifies, and when it was stored.
    Hidden {
        id: CheckpointId,
        deleted_at: SystemTime,
        restorable: Option<(String, SystemTime)>,
    },
    /// A version of the name holds bytes that are not this checkpoint: the name was
    /// overwritten (or first written) with other bytes at `stored_at`.
    Tampered {
        id: CheckpointId,
        version_id: String,
        stored_at: SystemTime,
        current: bool,
        reason: String,
    },
    /// A version could not be read (the store refused it, or it went away since the
    /// listing): nothing can be said of its bytes.
    Unreadable {
        id: CheckpointId,
        version_id: String,
        stored_at: SystemTime,
        reason: String,
    },
    /// The name has more versions than `examine` downloads: the `skipped` oldest were
    /// not checked.
    Unexamined { id: CheckpointId, skipped: usize },
}

/// The versions of each checkpoint name (of `id`'s only, if given), the current one
/// first, then newest first; `None` when the store keeps no versions.
pub fn versions_by_checkpoint(
    store: &dyn ObjectStore,
    id: Option<&CheckpointId>,
) -> Result<Option<BTreeMap<CheckpointId, Vec<ObjectVersion>>>, StoreError> {
    let name = id.map(CheckpointId::object_name);
    let Some(versions) = store.versions(name.as_deref())? else {
        return Ok(None);
    };
    let mut by_id: BTreeMap<CheckpointId, Vec<ObjectVersion>> = BTreeMap::new();
    for version in versions {
        if let Some(id) = CheckpointId::from_object_name(&version.name) {
            by_id.entry(id).or_default().push(version);
        }
    }
    for versions in by_id.values_mut() {
        // The current version first (the store's word: times are whole seconds),
        // then newest first.
        versions.sort_by(|a, b| {
            (b.is_latest, b.last_modified, b.delete_marker).cmp(&(
                a.is_latest,
                a.last_modified,
                a.delete_marker,
            ))
        });
    }
    Ok(Some(by_id))
}

/// Every hidden checkpoint and every version with other bytes than its name, each
/// version verified by its bytes; at most `max_versions` versions of one name (the
/// current one and the newest: whoever can write the bucket can pile versions on a
/// name, and each costs a download), the rest reported as not examined. A version
/// that cannot be read is reported and the others still examined; only a failure to
/// list the versions ends it. `None` when the store keeps no versions.
pub fn examine(
    store: &dyn ObjectStore,
    max_size: u64,
    max_versions: usize,
) -> Result<Option<Vec<Finding>>, CheckpointError> {
    let Some(by_id) = versions_by_checkpoint(store, None)? else {
        return Ok(None);
    };
    let mut findings = Vec::new();
    for (id, versions) in by_id {
        let hidden_at = versions
            .first()
            .filter(|v| v.delete_marker)
            .map(|v| v.last_modified);
        let mut restorable = None;
        let stored: Vec<(usize, &ObjectVersion)> = versions
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.delete_marker)
            .collect();
        if stored.len() > max_versions {
            findings.push(Finding::Unexamined {
                id: id.clone(),
                skipped: stored.len() - max_versions,
            });
        }
        for &(i, version) in stored.iter().take(max_versions) {
            match checkpoint::verify_object(store, &id, Some(&version.version_id), max_size) {
                Ok(()) => {
                    if restorable.is_none() {
                        restorable = Some((version.version_id.clone(), version.last_modified));
                    }
                }
                Err(CheckpointError::Verify { failure, .. }) => findings.push(Finding::Tampered {
                    id: id.clone(),
                    version_id: version.version_id.clone(),
                    stored_at: version.last_modified,
                    current: i == 0,
                    reason: failure.to_string(),
                }),
                Err(other) => findings.push(Finding::Unreadable {
                    id: id.clone(),
                    version_id: version.version_id.clone(),
                    stored_at: version.last_modified,
                    reason: other.to_string(),
                }),
            }
        }
        if let Some(deleted_at) = hidden_at {
            findings.push(Finding::Hidden {
                id,
                deleted_at,
                restorable,
            });
        }
    }
    Ok(Some(findings))
}

/// Versions of one name [`restorable_version`] downloads at most: a writer can pile
/// versions on a name, and each costs a download.
pub const MAX_VERSIONS_TRIED: usize = 8;

/// Whether a checkpoint that failed so may have an earlier version to read: it is
/// gone, or its name holds other bytes. Not when it is too large, or its transfer
/// broke (an earlier version would not help).
pub fn worth_looking(failure: &VerifyFailure) -> bool {
    matches!(
        failure,
        VerifyFailure::Missing
            | VerifyFailure::ChecksumMismatch(_)
            | VerifyFailure::SizeMismatch(_)
    )
}

/// The newest version of a hidden (or overwritten) checkpoint whose bytes verify, to
/// read it from; `None` if the store keeps no versions or none verifies. Versions
/// larger than `max_size` are skipped, and at most [`MAX_VERSIONS_TRIED`] are
/// downloaded.
pub fn restorable_version(
    store: &dyn ObjectStore,
    id: &CheckpointId,
    max_size: u64,
) -> Result<Option<(String, SystemTime)>, CheckpointError> {
    let Some(mut by_id) = versions_by_checkpoint(store, Some(id))? else {
        return Ok(None);
    };
    let candidates = by_id
        .remove(id)
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !v.delete_marker && v.size <= max_size)
        .take(MAX_VERSIONS_TRIED);
    for version in candidates {
        match checkpoint::verify_object(store, id, Some(&version.version_id), max_size) {
            Ok(()) => return Ok(Some((version.version_id, version.last_modified))),
            Err(CheckpointError::Verify { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Ok(None)
}

/// A store in which one object reads from one of its versions, everything else as
/// in `inner`: how the review commands read a hidden checkpoint through the cache,
/// verified as any other.
pub struct AtVersion<'a> {
    pub inner: &'a dyn ObjectStore,
    pub name: String,
    pub version_id: String,
}

impl ObjectStore for AtVersion<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn list(&self) -> Result<Vec<crate::store::ObjectInfo>, StoreError> {
        self.inner.list()
    }
    fn get(&self, name: &str) -> Result<crate::store::ObjectReader, StoreError> {
        match name == self.name {
            true => self.inner.get_version(name, &self.version_id),
            false => self.inner.get(name),
        }
    }
    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(name == self.name || self.inner.exists(name)?)
    }
    fn head(&self, name: &str) -> Result<crate::store::ObjectMeta, StoreError> {
        match name == self.name {
            true => Ok(self.inner.get_version(name, &self.version_id)?.meta),
            false => self.inner.head(name),
        }
    }
    fn put(
        &self,
        name: &str,
        path: &std::path::Path,
        metadata: &BTreeMap<String, String>,
        mode: crate::store::PutMode,
        progress: crate::store::Progress<'_>,
    ) -> Result<crate::store::PutOutcome, StoreError> {
        self.inner.put(name, path, metadata, mode, progress)
    }
    fn refresh(&self, name: &str, metadata: &BTreeMap<String, String>) -> Result<(), StoreError> {
        self.inner.refresh(name, metadata)
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.inner.delete(name)
    }
    fn versions(&self, name: Option<&str>) -> Result<Option<Vec<ObjectVersion>>, StoreError> {
        self.inner.versions(name)
    }
    fn get_version(
        &self,
        name: &str,
        version_id: &str,
    ) -> Result<crate::store::ObjectReader, StoreError> {
        self.inner.get_version(name, version_id)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io;
    use std::path::Path;
    use std::time::{Duration, UNIX_EPOCH};

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::store::{ObjectInfo, ObjectMeta, ObjectReader, Progress, PutMode, PutOutcome};

    /// A versioned bucket in memory holding one name; a version without bytes cannot
    /// be read (the store refuses it).
    struct Versions {
        name: String,
        /// Current first, then newest first.
        versions: Vec<(&'static str, Option<&'static [u8]>)>,
    }

    impl ObjectStore for Versions {
        fn describe(&self) -> String {
            "versions in memory".into()
        }
        fn list(&self) -> Result<Vec<ObjectInfo>, StoreError> {
            Ok(Vec::new())
        }
        fn get(&self, name: &str) -> Result<ObjectReader, StoreError> {
            Err(StoreError::NotFound { name: name.into() })
        }
        fn exists(&self, _: &str) -> Result<bool, StoreError> {
            Ok(false)
        }
        fn head(&self, name: &str) -> Result<ObjectMeta, StoreError> {
            Err(StoreError::NotFound { name: name.into() })
        }
        fn put(
            &self,
            _: &str,
            _: &Path,
            _: &BTreeMap<String, String>,
            _: PutMode,
            _: Progress<'_>,
        ) -> Result<PutOutcome, StoreError> {
            unreachable!("examine only reads")
        }
        fn refresh(&self, _: &str, _: &BTreeMap<String, String>) -> Result<(), StoreError> {
            Ok(())
        }
        fn delete(&self, _: &str) -> Result<(), StoreError> {
            Ok(())
        }
        fn versions(&self, _: Option<&str>) -> Result<Option<Vec<ObjectVersion>>, StoreError> {
            let stored = |i: usize, (id, bytes): &(&str, Option<&[u8]>)| ObjectVersion {
                name: self.name.clone(),
                version_id: (*id).into(),
                size: bytes.map_or(0, |b| b.len() as u64),
                last_modified: UNIX_EPOCH + Duration::from_secs(100 - i as u64),
                delete_marker: false,
                is_latest: i == 0,
            };
            Ok(Some(
                self.versions
                    .iter()
                    .enumerate()
                    .map(|(i, v)| stored(i, v))
                    .collect(),
            ))
        }
        fn get_version(&self, name: &str, version_id: &str) -> Result<ObjectReader, StoreError> {
            let (_, bytes) = self
                .versions
                .iter()
                .find(|(id, _)| *id == version_id)
                .expect("a listed version");
            match bytes {
                Some(bytes) => Ok(ObjectReader {
                    meta: ObjectMeta {
                        length: bytes.len() as u64,
                        metadata: BTreeMap::new(),
                    },
                    body: Box::new(io::Cursor::new(bytes.to_vec())),
                }),
                None => Err(StoreError::Remote {
                    operation: "GetObject",
                    name: name.into(),
                    message: "AccessDenied".into(),
                }),
            }
        }
    }

    const GOOD: &[u8] = b"the checkpoint's bytes";

    fn store() -> (Versions, CheckpointId) {
        let id = CheckpointId::parse(&hex::encode(Sha256::digest(GOOD))).unwrap();
        let versions = vec![
            ("v4", Some(GOOD)),
            ("v3", None),
            ("v2", Some(&b"other bytes"[..])),
            ("v1", Some(GOOD)),
        ];
        let name = id.object_name();
        (Versions { name, versions }, id)
    }

    #[test]
    fn a_version_that_cannot_be_read_is_reported_and_the_others_examined() {
        let (store, id) = store();
        let findings = examine(&store, 1 << 20, 32).unwrap().unwrap();
        assert!(
            matches!(
                &findings[..],
                [
                    Finding::Unreadable { id: a, version_id: v3, reason, .. },
                    Finding::Tampered { id: b, version_id: v2, current: false, .. },
                ] if a == &id && b == &id && v3 == "v3" && v2 == "v2" && reason.contains("AccessDenied")
            ),
            "{findings:?}"
        );
    }

    #[test]
    fn versions_past_the_bound_are_not_downloaded_and_are_reported() {
        let (store, id) = store();
        let findings = examine(&store, 1 << 20, 2).unwrap().unwrap();
        assert!(
            matches!(
                &findings[..],
                [
                    Finding::Unexamined { id: a, skipped: 2 },
                    Finding::Unreadable { version_id: v3, .. },
                ] if a == &id && v3 == "v3"
            ),
            "{findings:?}"
        );
    }
}
