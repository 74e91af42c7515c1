//! Reviewing checkpoints from the host: what `log`, `diff`, `cat` and `find` are made
//! of, without the command line.
//!
//! - [`resolve`]: checkpoint names as the review commands take them: a digest, an
//!   unambiguous prefix of one, `latest`, or `latest~N` (the N-th before the newest).
//! - [`CachedCheckpoints`]: checkpoints through the [`Cache`], so that nothing is
//!   looked at before its object was downloaded, hashed and indexed in one pass (or
//!   found intact in the cache and checked again byte by byte).
//! - [`tree`]: an [`Index`](crate::archive::index::Index) as paths: every entry in
//!   path order, one path looked up, a file's contents read back and checked, the glob
//!   filter of `find`.
//! - [`diff`]: the entries added, removed and modified between two indexes, with the
//!   bytes they account for, and unified diffs of text files.
//!
//! Comparisons use the indexes (types, modes, owners, link targets, and each file's
//! size and xxh3 checksum), and the bytes of files whose size and checksum are equal
//! (the checksum is not a cryptographic one); contents are otherwise read only to show
//! them (`cat`, patches).
//! Nothing here holds a list of every path of a checkpoint: the walks keep the current
//! path and one directory's children per level, so that memory stays within what the
//! archive limits allow an index to take.

pub mod diff;
pub mod html;
pub mod report;
pub mod tree;

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::archive::Limits;
use crate::cache::{Cache, CacheError, VerifiedCheckpoint};
use crate::checkpoint::{self, CheckpointError, CheckpointId, CheckpointInfo};
use crate::store::ObjectStore;

/// Why a checkpoint name names nothing.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("{given}: the store has no checkpoints")]
    NoCheckpoints { given: String },
    #[error("{given}: the store has {count} checkpoints (latest~{} is the oldest)", count - 1)]
    TooFew { given: String, count: usize },
    #[error("{0:?} is not a checkpoint name: give a sha256, a prefix of one, latest or latest~N")]
    NotAName(String),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// How many turns before the newest `given` names (`latest` 0, `latest~` 1,
/// `latest~N` N), if it is such a name.
pub fn steps_back(given: &str) -> Option<usize> {
    latest_back(given.trim()).ok().flatten()
}

/// The part of a listing's order that resolving `names` relies on: the newest
/// turns, as far back as the furthest `latest~N` (a sha256 needs no order).
pub fn exact_for(names: &[&str]) -> checkpoint::Exact {
    let newest = names
        .iter()
        .filter_map(|name| steps_back(name))
        .map(|back| back.saturating_add(1))
        .max()
        .unwrap_or(1);
    checkpoint::Exact::Newest(newest)
}

/// `None` for a name that does not start with `latest`.
fn latest_back(trimmed: &str) -> Result<Option<usize>, NameError> {
    Ok(match trimmed.strip_prefix("latest") {
        Some("") => Some(0),
        Some(rest) => match rest.strip_prefix('~') {
            Some("") => Some(1),
            Some(n) if n.bytes().all(|b| b.is_ascii_digit()) => {
                // More digits than fit are more checkpoints than any store has.
                Some(n.parse::<usize>().unwrap_or(usize::MAX))
            }
            _ => return Err(NameError::NotAName(trimmed.to_owned())),
        },
        None => None,
    })
}

/// The checkpoint of `listing` (oldest first, as [`checkpoint::list`] gives it) that
/// `given` names: a sha256 or an unambiguous prefix of one, `latest` (the newest),
/// `latest~N` (the N-th before the newest; `latest~0` is `latest`, `latest~` is
/// `latest~1`).
pub fn resolve<'a>(
    listing: &'a [CheckpointInfo],
    given: &str,
) -> Result<&'a CheckpointInfo, NameError> {
    let trimmed = given.trim();
    let back = latest_back(trimmed)?;
    let Some(back) = back else {
        let stem = trimmed.strip_suffix(".tar.gz").unwrap_or(trimmed);
        if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NameError::NotAName(trimmed.to_owned()));
        }
        return Ok(checkpoint::resolve_listed(listing, trimmed)?);
    };
    if listing.is_empty() {
        return Err(NameError::NoCheckpoints {
            given: trimmed.to_owned(),
        });
    }
    listing
        .len()
        .checked_sub(1)
        .and_then(|newest| newest.checked_sub(back))
        .map(|i| &listing[i])
        .ok_or_else(|| NameError::TooFew {
            given: trimmed.to_owned(),
            count: listing.len(),
        })
}

/// Loads listed checkpoints through a cache, and lets the cache shrink to its bound
/// as the caller moves on.
pub struct CachedCheckpoints<'a> {
    store: &'a dyn ObjectStore,
    cache: &'a Cache,
    max_archive_size: u64,
    limits: Limits,
}

impl<'a> CachedCheckpoints<'a> {
    pub fn new(
        store: &'a dyn ObjectStore,
        cache: &'a Cache,
        max_archive_size: u64,
        limits: Limits,
    ) -> Self {
        CachedCheckpoints {
            store,
            cache,
            max_archive_size,
            limits,
        }
    }

    /// A verified checkpoint: an intact cached copy, or the object downloaded, hashed,
    /// length-checked and indexed in one pass, within the archive limits. Directories
    /// that only appear implicitly are dated by the object's time, as the mount does,
    /// so that an entry made here is the one a mount of the same cache would have made.
    pub fn load(&self, info: &CheckpointInfo) -> Result<Arc<VerifiedCheckpoint>, CacheError> {
        let mtime = info
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.cache.load(
            self.store,
            &info.id,
            self.max_archive_size,
            self.limits,
            mtime,
        )
    }

    /// Evicts least recently used entries beyond the cache's bound, except those in
    /// `keep` (still in use), and deletes them.
    pub fn trim(&self, keep: &[&CheckpointId]) {
        self.cache.evict(|id| !keep.contains(&id)).empty();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn listing(digits: &[char]) -> Vec<CheckpointInfo> {
        digits
            .iter()
            .enumerate()
            .map(|(i, d)| CheckpointInfo {
                id: CheckpointId::parse(&d.to_string().repeat(64)).unwrap(),
                size: 100 + i as u64,
                last_modified: SystemTime::UNIX_EPOCH + Duration::from_secs(i as u64),
            })
            .collect()
    }

    fn name(listing: &[CheckpointInfo], given: &str) -> Result<char, String> {
        resolve(listing, given)
            .map(|c| c.id.as_str().chars().next().unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn latest_counts_back_from_the_newest() {
        let three = listing(&['c', 'a', 'b']);
        assert_eq!(name(&three, "latest"), Ok('b'));
        assert_eq!(name(&three, " latest~0 "), Ok('b'));
        assert_eq!(name(&three, "latest~1"), Ok('a'));
        assert_eq!(name(&three, "latest~"), Ok('a'));
        assert_eq!(name(&three, "latest~2"), Ok('c'));
        assert_eq!(
            name(&three, "latest~3"),
            Err("latest~3: the store has 3 checkpoints (latest~2 is the oldest)".into())
        );
        assert!(name(&three, "latest~99999999999999999999999").is_err());
        assert_eq!(
            name(&[], "latest"),
            Err("latest: the store has no checkpoints".into())
        );
    }

    #[test]
    fn digests_and_prefixes_resolve_in_the_listing() {
        let three = listing(&['c', 'a', 'b']);
        assert_eq!(name(&three, "aaaa"), Ok('a'));
        assert_eq!(name(&three, "CCC"), Ok('c'));
        assert_eq!(name(&three, &format!("{}.tar.gz", "b".repeat(64))), Ok('b'));
        assert_eq!(name(&three, "d"), Err("no checkpoint matches \"d\"".into()));
        let two_a = listing(&['a', 'a']);
        assert_eq!(
            name(&two_a, "a"),
            Err(format!(
                "\"a\" matches 2 checkpoints ({0}, {0}); give more digits",
                "a".repeat(64)
            ))
        );
    }

    #[test]
    fn other_words_are_not_names() {
        let three = listing(&['c', 'a', 'b']);
        for given in [
            "",
            "HEAD",
            "latest~x",
            "latest^",
            "latest~-1",
            "lates",
            "a/b",
        ] {
            assert!(
                matches!(resolve(&three, given), Err(NameError::NotAName(_))),
                "{given:?}"
            );
        }
    }
}
