//! `commit/`: sealing a staged workspace into a checkpoint with one rename.
//!
//! `rename(staging/NAME, commit/NAME)` (what `mv staging/NAME commit/` does) freezes
//! NAME, writes it with the same archive writer as `ckptfs put`, stores it with the
//! same put path, indexes the very bytes that were hashed into the cache (so the new
//! checkpoint is browsable without a download), and only then answers. `commit/NAME`
//! becomes a symlink to `../<sha256>` and the staged copy is deleted.
//!
//! On any failure the rename fails (`EFBIG` over the archive limit, `EIO` on a store
//! error, `EBUSY` while files in NAME are open for writing), NAME is thawed exactly as
//! it was, and the store's put guarantees leave no partial object behind. The work
//! runs on a thread of its own; the FUSE request threads keep answering meanwhile.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::SystemTime;

use super::{CheckpointFs, FsError};
use crate::archive::ArchiveError;
use crate::archive::index;
use crate::checkpoint::{
    self, CheckpointError, CheckpointId, CheckpointInfo, PutOptions, StoreOutcome,
};
use crate::pipe::pipe;

/// How many finished seals `.status` remembers.
const OUTCOMES_KEPT: usize = 100;

#[derive(Default)]
pub(super) struct Seals {
    /// Workspaces sealed by this mount, in order; `commit/` lists them.
    pub sealed: Vec<(Vec<u8>, CheckpointId)>,
    pub in_progress: Vec<Vec<u8>>,
    /// Recent outcomes, for `.status`.
    pub outcomes: Vec<String>,
}

impl Seals {
    pub fn committed(&self, name: &[u8]) -> Option<usize> {
        self.sealed.iter().position(|(n, _)| n == name)
    }
}

pub type SealDone = Box<dyn FnOnce(Result<(), FsError>) + Send>;

fn seal_error(e: CheckpointError) -> FsError {
    match e {
        CheckpointError::Archive(ArchiveError::TooLarge { limit }) => FsError::TooLarge(format!(
            "the workspace's archive is larger than the limit of {limit} bytes"
        )),
        other => FsError::Store(other.to_string()),
    }
}

impl CheckpointFs {
    /// Seals `staging/name` as the checkpoint `commit/commit_name` links to; `done`
    /// gets the outcome.
    pub fn seal(self: &Arc<Self>, name: Vec<u8>, commit_name: Vec<u8>, done: SealDone) {
        {
            let mut seals = self.seals.lock().expect("seals lock");
            if seals.committed(&commit_name).is_some() || seals.in_progress.contains(&commit_name) {
                drop(seals);
                return done(Err(FsError::Exists));
            }
            seals.in_progress.push(commit_name.clone());
        }
        let fs = Arc::clone(self);
        std::thread::Builder::new()
            .name("ckptfs-seal".into())
            .spawn(move || {
                let shown = String::from_utf8_lossy(&commit_name).into_owned();
                let result = fs.seal_now(&name);
                let mut seals = fs.seals.lock().expect("seals lock");
                seals.in_progress.retain(|n| n != &commit_name);
                let outcome = match &result {
                    Ok((id, how)) => {
                        seals.sealed.push((commit_name.clone(), id.clone()));
                        tracing::info!(workspace = %shown, checkpoint = %id, %how, "sealed");
                        format!("{shown}: sealed as {id} ({how})")
                    }
                    Err(e) => {
                        tracing::error!(workspace = %shown, error = %e, "seal failed; the workspace is unchanged");
                        format!("{shown}: FAILED: {e}")
                    }
                };
                seals.outcomes.push(outcome);
                if seals.outcomes.len() > OUTCOMES_KEPT {
                    seals.outcomes.remove(0);
                }
                drop(seals);
                done(result.map(drop));
            })
            .expect("spawning a seal thread");
    }

    fn seal_now(&self, name: &[u8]) -> Result<(CheckpointId, StoreOutcome), FsError> {
        let frozen = self.staging.freeze(name)?;
        let result = self.seal_frozen(frozen.dir.as_fd());
        if result.is_ok() {
            if let Err(e) = self.staging.remove_sealed(frozen) {
                let shown = String::from_utf8_lossy(name);
                tracing::warn!(workspace = %shown, error = %e, "could not delete the sealed workspace's staged copy");
            }
        } else {
            self.staging.thaw(frozen);
        }
        result
    }

    fn seal_frozen(&self, dir: BorrowedFd<'_>) -> Result<(CheckpointId, StoreOutcome), FsError> {
        let options = PutOptions {
            max_archive_size: self.config.max_archive_size,
            temp_dir: &self.config.work_dir,
            threads: self.config.threads,
        };
        // The uncompressed tar stream is indexed into the cache on a second thread as
        // it is written: the new checkpoint is then served from the very bytes that
        // were compressed and hashed, with no download and no second decompression.
        let pending = self.cache.begin().ok();
        let (mut tar_copy, tar_stream) = pipe(8);
        let now = SystemTime::now();
        let indexer = pending.map(|pending| {
            let limits = self.config.limits;
            std::thread::spawn(move || {
                let built = index::build(tar_stream, pending.dir(), limits, super::epoch_secs(now));
                (pending, built)
            })
        });
        let written = checkpoint::write_archive_file(dir, &options, &mut tar_copy);
        drop(tar_copy);
        let indexed = indexer.map(|t| t.join().expect("the indexing thread panicked"));
        let (archive, written) = written.map_err(seal_error)?;
        let report =
            checkpoint::store_archive(self.store.as_ref(), archive.path(), &written, &|_, _| {})
                .map_err(seal_error)?;
        let info = CheckpointInfo {
            id: report.id.clone(),
            size: report.size,
            last_modified: now,
        };
        // The checkpoint is stored: from here on a failure only costs a download later.
        let verified = match indexed {
            Some((pending, Ok(index))) => self
                .cache
                .finish(pending, &report.id, index)
                .map_err(|e| e.to_string()),
            Some((_, Err(e))) => Err(e.to_string()),
            None => Err("no cache entry could be started".into()),
        };
        match verified {
            Ok(verified) => {
                self.add_checkpoint(info, Some(verified));
                self.evict(&report.id);
            }
            Err(e) => {
                tracing::warn!(checkpoint = %report.id, error = %e, "could not index the sealed archive; it will be downloaded on access");
                self.add_checkpoint(info, None);
            }
        }
        Ok((report.id, report.outcome))
    }
}
