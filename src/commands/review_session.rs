//! What the review commands (`log`, `diff`, `cat`, `find`) share: the store and its
//! listing, checkpoint names, and the cache their checkpoints are verified into.
//!
//! The cache is `--cache-dir` when given and free (a mount's cache, say, whose verified
//! checkpoints are then reused, and which is filled for the mount's next start), else
//! a private temporary directory deleted at exit, also on Ctrl-C or SIGTERM. A cache
//! directory admits one process at a time (an exclusive flock): when a running mount
//! holds it, the command says so on stderr and uses a temporary cache.

use crate::commands::say;
use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tempfile::TempDir;

use super::{open_store, temp_dir};
use crate::cache::{Cache, CacheDir, CacheError, VerifiedCheckpoint};
use crate::checkpoint::{self, CheckpointError, CheckpointId, CheckpointInfo};
use crate::cli::{Cli, ReviewArgs};
use crate::history;
use crate::review::{self, CachedCheckpoints, NameError};
use crate::store::{DEFAULT_PART_SIZE, ObjectStore};

pub(super) struct ReviewSession {
    store: Arc<dyn ObjectStore>,
    /// The store's checkpoints, oldest first.
    pub listing: Vec<CheckpointInfo>,
    cache: Cache,
    max_archive_size: u64,
    limits: crate::archive::Limits,
    /// The temporary cache, deleted when dropped.
    _temp: Option<TempDir>,
}

impl ReviewSession {
    /// Lists the store, its order exact as far as `exact` asks, then opens the cache.
    pub fn open(
        cli: &Cli,
        store_url: &str,
        args: &ReviewArgs,
        exact: checkpoint::Exact,
    ) -> Result<ReviewSession> {
        let store = open_store(cli, store_url, DEFAULT_PART_SIZE)?;
        let (listing, _) = checkpoint::list_ordered(store.as_ref(), &mut Default::default(), exact)
            .with_context(|| format!("cannot list {store_url}"))?;
        let (cache, temp) = open_cache(args)?;
        Ok(ReviewSession {
            store,
            listing,
            cache,
            max_archive_size: cli.max_archive_size,
            limits: args.limits.limits(),
            _temp: temp,
        })
    }

    /// The listed checkpoint that `given` names; a full sha256 that is not listed (a
    /// checkpoint hidden by a delete, which [`load`](Self::load) may still read from
    /// a versioned bucket) stands for itself.
    pub fn resolve(&self, given: &str) -> Result<CheckpointInfo> {
        match review::resolve(&self.listing, given) {
            Ok(info) => Ok(info.clone()),
            Err(NameError::Checkpoint(CheckpointError::UnknownPrefix(prefix)))
                if CheckpointId::parse(&prefix).is_some() =>
            {
                Ok(CheckpointInfo {
                    id: CheckpointId::parse(&prefix).expect("checked"),
                    size: 0,
                    last_modified: std::time::UNIX_EPOCH,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A verified checkpoint; nothing of it is available before it verified. One
    /// that fails (hidden by a delete, or its name overwritten) is read from the
    /// newest version of a versioned bucket that verifies, and stderr says so.
    pub fn load(&self, info: &CheckpointInfo) -> Result<Arc<VerifiedCheckpoint>> {
        let _shown = super::spinner(format!(
            "verifying checkpoint {} ({} bytes)",
            info.id.short(),
            info.size
        ));
        let failure = match self.checkpoints().load(info) {
            Err(CacheError::Verify(failure)) if history::worth_looking(&failure) => failure,
            other => return other.with_context(|| format!("checkpoint {}", info.id)),
        };
        let earlier =
            history::restorable_version(self.store.as_ref(), &info.id, self.max_archive_size)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "could not look for an earlier version");
                    None
                });
        let Some((version_id, stored_at)) = earlier else {
            return Err(CacheError::Verify(failure))
                .with_context(|| format!("checkpoint {}", info.id));
        };
        say::note!(
            "checkpoint {}: {failure}; reading the version of {} ({version_id}), which verifies",
            info.id,
            humantime::format_rfc3339_seconds(stored_at)
        );
        let at_version = history::AtVersion {
            inner: self.store.as_ref(),
            name: info.id.object_name(),
            version_id,
        };
        CachedCheckpoints::new(&at_version, &self.cache, self.max_archive_size, self.limits)
            .load(info)
            .with_context(|| format!("checkpoint {}", info.id))
    }

    /// Downloads `info`'s object and checks it against its name, keeping nothing.
    pub fn verify(&self, info: &CheckpointInfo) -> Result<(), CheckpointError> {
        checkpoint::verify_object(self.store.as_ref(), &info.id, None, self.max_archive_size)
    }

    /// Each listed checkpoint by its digest.
    pub fn by_id(&self) -> HashMap<&CheckpointId, &CheckpointInfo> {
        self.listing.iter().map(|info| (&info.id, info)).collect()
    }

    /// The parent each listed checkpoint's metadata claims (a request per checkpoint).
    pub fn claimed_parents(&self) -> Result<HashMap<&CheckpointId, Option<CheckpointId>>> {
        self.listing
            .iter()
            .map(|info| Ok((&info.id, self.claimed_parent(info)?)))
            .collect()
    }

    /// The parent `info`'s metadata claims (`put --parent`), if any.
    pub fn claimed_parent(&self, info: &CheckpointInfo) -> Result<Option<CheckpointId>> {
        checkpoint::claimed_parent(self.store.as_ref(), &info.id)
            .with_context(|| format!("checkpoint {}", info.id))
    }

    /// Lets the cache shrink to its bound (a temporary one: to nothing), keeping the
    /// checkpoints in `keep`.
    pub fn trim(&self, keep: &[&CheckpointId]) {
        self.checkpoints().trim(keep);
    }

    fn checkpoints(&self) -> CachedCheckpoints<'_> {
        CachedCheckpoints::new(
            self.store.as_ref(),
            &self.cache,
            self.max_archive_size,
            self.limits,
        )
    }
}

/// Why a checkpoint could not be read, when that is the checkpoint's fault (it does
/// not verify, or its archive is refused) and not a failure to reach the store or the
/// cache, which ends the command.
pub(super) fn unreadable(err: &anyhow::Error) -> Result<String> {
    let own = err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<CacheError>(),
            Some(CacheError::Verify(_) | CacheError::Archive(_))
        )
    });
    if own {
        let text = format!("{:#}", err.root_cause());
        Ok(crate::printable::message(&text).into_owned())
    } else {
        Err(anyhow::anyhow!("{err:#}"))
    }
}

/// The chain of parents `tip` claims, oldest first, as far as the store has them
/// (a claimed cycle ends where it would repeat).
pub(super) fn lineage<'a>(
    tip: &'a CheckpointInfo,
    parents: &HashMap<&CheckpointId, Option<CheckpointId>>,
    listed: &HashMap<&CheckpointId, &'a CheckpointInfo>,
) -> Vec<&'a CheckpointInfo> {
    let mut chain = vec![tip];
    let mut seen = HashSet::from([&tip.id]);
    while let Some(parent) = parents[&chain[chain.len() - 1].id]
        .as_ref()
        .and_then(|p| listed.get(p).copied())
    {
        if !seen.insert(&parent.id) {
            break;
        }
        chain.push(parent);
    }
    chain.reverse();
    chain
}

/// `--cache-dir` if it is free, else a temporary cache (bounded to nothing: entries
/// are deleted as soon as the command is done with them).
fn open_cache(args: &ReviewArgs) -> Result<(Cache, Option<TempDir>)> {
    if let Some(dir) = &args.cache_dir {
        match CacheDir::open(dir)
            .map_err(CacheError::from)
            .and_then(|dir| Cache::open(&dir, args.cache_size))
        {
            Ok(cache) => return Ok((cache, None)),
            Err(CacheError::Io { cause, .. }) if cause.kind() == ErrorKind::WouldBlock => {
                say::note!(
                    "note: the cache directory {} is in use (by a running mount?); \
                     using a temporary cache instead",
                    dir.display()
                );
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open cache {}", dir.display()));
            }
        }
    }
    let base = temp_dir(&args.temp_dir);
    let temp = tempfile::Builder::new()
        .prefix(".ckptfs-review-")
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a temporary cache in {}", base.display()))?;
    remove_on_signal(temp.path());
    let cache = CacheDir::open(temp.path())
        .map_err(CacheError::from)
        .and_then(|dir| Cache::open(&dir, 0))
        .with_context(|| format!("cannot open cache {}", temp.path().display()))?;
    Ok((cache, Some(temp)))
}

/// Deletes the temporary cache if the command is interrupted (Ctrl-C, SIGTERM,
/// SIGHUP), then exits as a shell would report the signal.
fn remove_on_signal(dir: &Path) {
    let dir = dir.to_owned();
    let installed = ctrlc::set_handler(move || {
        let _ = std::fs::remove_dir_all(&dir);
        std::process::exit(130);
    });
    if let Err(e) = installed {
        tracing::warn!(error = %e, "cannot install a signal handler; an interrupted command leaves its temporary cache behind");
    }
}
