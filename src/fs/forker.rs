//! The fork request: `setxattr` of [`FORK_ATTRIBUTE`] to a checkpoint's id on an
//! empty workspace `staging/NAME` (what `ckptfs fork MNT REF NAME` does after its
//! `mkdir`) has the daemon fill it from that checkpoint (see `staging/fork.rs`): one
//! request in all.
//!
//! An extended attribute, because it is a request that carries bytes to a directory
//! and waits for the answer, reaches the daemon through any mount namespace the mount
//! is seen in (a container's included), and needs no socket of its own. Set on the
//! workspace, which its maker owns: the kernel lets anyone who made a workspace set it
//! (not so on `staging/`, a sticky directory), and holds only that workspace's lock
//! while the request waits, so nothing else in `staging/` waits for a fork, and
//! nothing is made in the workspace meanwhile.
//!
//! Refusals and failures are logged through [`crate::fs::error::first_time`], as failed
//! requests are: any user who can make a workspace can ask for forks as fast as they
//! like, and the log is never rotated by the daemon.
//!
//! Invariants: a fork runs on a thread of its own, never on a FUSE request thread (it
//! may wait for a load and copies a whole tree); at most [`FORKS_AT_ONCE`] run or wait
//! at once, more are refused with `EBUSY`. The names the fork made are dropped from
//! the kernel's cache only after the answer, since dropping them takes the lock the
//! request holds. After the answer, the same thread captures the new workspace for
//! the records that let its seal leave unchanged files unread
//! ([`Sealer::record_fork`]), at the lowest CPU priority; the fork does not wait for
//! it.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::error::FsError;
use super::listing::{Catalog, Slot};
use super::loader::Loader;
use super::primer::Primer;
use super::sealer::Sealer;
use super::staging::{Caller, Forked, StagingTree};
use super::subtree::KernelCache;
use crate::cache::VerifiedCheckpoint;

/// Logs a fork's refusal or failure: at info level the first time `reason` is seen in
/// a while (see the module comment), at debug level after. `reason` is one of a few
/// fixed texts; `detail` (a checkpoint, an entry) is already escaped.
pub(crate) fn log_refusal(reason: &str, detail: &str) {
    if crate::fs::error::first_time(reason) {
        tracing::info!(detail, "{reason}");
    } else {
        tracing::debug!(detail, "{reason}");
    }
}

/// The extended attribute that forks a workspace.
pub const FORK_ATTRIBUTE: &str = "user.ckptfs.fork";

/// Forks running or waiting for their checkpoint at once.
const FORKS_AT_ONCE: usize = 4;

/// The shortest prefix of a checkpoint id a fork takes.
const SHORTEST_PREFIX: usize = 8;

/// How long after a fork its workspace is captured for records (see
/// [`Forker::record`]).
const RECORD_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Called with a fork's outcome, from the fork's thread.
pub type ForkDone = Box<dyn FnOnce(Result<(), FsError>) + Send>;

/// What a fork made: the names made in the workspace, and the checkpoint they are
/// from.
struct Made {
    names: Vec<Vec<u8>>,
    forked: Forked,
    checkpoint: Arc<VerifiedCheckpoint>,
}

pub struct Forker {
    pub(super) catalog: Arc<Catalog>,
    pub(super) loader: Arc<Loader>,
    pub(super) staging: Arc<StagingTree>,
    pub(super) primer: Option<Arc<Primer>>,
    pub(super) sealer: Arc<Sealer>,
    pub(super) kernel: Arc<OnceLock<Arc<dyn KernelCache>>>,
    /// The owner every checkpoint entry is shown with, if one is.
    pub(super) shown_owner: Option<(u32, u32)>,
    /// Other users may use the mount (`--allow-other`).
    pub(super) shared: bool,
    pub(super) running: AtomicUsize,
}

impl Forker {
    /// Fills workspace `ino` from the checkpoint `value` names, for `caller`; `done`
    /// gets the outcome.
    pub fn fork(self: &Arc<Self>, ino: u64, value: &[u8], caller: Caller, done: ForkDone) {
        let slot = match self.parse(value) {
            Ok(slot) => slot,
            Err(e) => return done(Err(e)),
        };
        if self.running.fetch_add(1, Ordering::SeqCst) >= FORKS_AT_ONCE {
            self.running.fetch_sub(1, Ordering::SeqCst);
            log_refusal(
                "fork refused: as many forks as may run at once are running",
                "",
            );
            return done(Err(FsError::Busy));
        }
        let forker = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ckptfs-fork".into())
            .spawn(move || {
                let result = forker.fork_now(ino, &slot, caller);
                forker.running.fetch_sub(1, Ordering::SeqCst);
                match result {
                    Ok(made) => {
                        done(Ok(()));
                        forker.forget_absent(ino, &made.names);
                        forker.record(made.forked, &made.checkpoint);
                    }
                    Err(e) => done(Err(e)),
                }
            });
        if let Err(e) = spawned {
            // The reply went with the closure: the kernel gets EIO for it.
            self.running.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(error = %e, "cannot start a fork's thread");
        }
    }

    /// The checkpoint `value` names: a whole id, or a prefix of one of at least
    /// [`SHORTEST_PREFIX`] characters that names one checkpoint.
    fn parse(&self, value: &[u8]) -> Result<Arc<Slot>, FsError> {
        let reference = std::str::from_utf8(value)
            .ok()
            .map(str::trim)
            .filter(|r| r.len() >= SHORTEST_PREFIX && r.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                log_refusal(
                    "fork refused: a checkpoint is named by its id or 8 characters of it",
                    "",
                );
                FsError::InvalidArgument
            })?
            .to_ascii_lowercase();
        let mut found = self
            .catalog
            .all_slots()
            .into_iter()
            .filter(|slot| slot.info.id.as_str().starts_with(&reference));
        match (found.next(), found.next()) {
            (Some(slot), None) => Ok(slot),
            (None, _) => {
                log_refusal("fork refused: no such checkpoint", &reference);
                Err(FsError::NotFound)
            }
            (Some(_), Some(_)) => {
                log_refusal(
                    "fork refused: the prefix names several checkpoints",
                    &reference,
                );
                Err(FsError::InvalidArgument)
            }
        }
    }

    /// Fills workspace `ino`.
    fn fork_now(&self, ino: u64, slot: &Arc<Slot>, caller: Caller) -> Result<Made, FsError> {
        if self.loader.must_wait(slot) {
            let (loaded, wait) = std::sync::mpsc::sync_channel(1);
            self.loader.when_loaded(
                slot,
                Box::new(move || {
                    let _ = loaded.send(());
                }),
            );
            let _ = wait.recv();
        }
        let checkpoint = self.loader.checkpoint(slot)?;
        let started = Instant::now();
        let (forked, names) = self
            .staging
            .fork(ino, &checkpoint, caller, (self.shown_owner, self.shared))
            .inspect_err(|e| {
                let error = crate::printable::message(&e.to_string()).into_owned();
                log_refusal("fork failed", &format!("{} {error}", checkpoint.id));
            })?;
        // The kernel holds the workspace's attributes and its (empty) listing.
        if let Some(kernel) = self.kernel.get() {
            kernel.forget_attributes(ino);
        }
        tracing::info!(
            checkpoint = %checkpoint.id,
            workspace = ino,
            entries = forked.entries,
            bytes = forked.bytes,
            seconds = started.elapsed().as_secs_f64(),
            "forked"
        );
        Ok(Made {
            names,
            forked,
            checkpoint,
        })
    }

    /// Has the new workspace captured as its seal would capture it, keeping what that
    /// saw of each file and the members it made (see [`Sealer::record_fork`]), so that
    /// the seal of the new turn reads and compresses only what changed; failing that,
    /// has the checkpoint's members primed, so that it compresses only that.
    fn record(&self, forked: Forked, checkpoint: &Arc<VerifiedCheckpoint>) {
        // Files changed within the writer's racy bound of a capture's start are read
        // but not recorded: let the last ones the fork made age past it.
        std::thread::sleep(RECORD_AFTER);
        if !self
            .sealer
            .record_fork(forked.workspace, forked.records, forked.bytes)
            && let Some(primer) = &self.primer
        {
            primer.prime(checkpoint);
        }
    }

    /// Drops what the kernel may remember as absent from the workspace: the names the
    /// fork made in it. After the answer (see the module comment).
    fn forget_absent(&self, ino: u64, names: &[Vec<u8>]) {
        if let Some(kernel) = self.kernel.get() {
            for name in names {
                kernel.forget_entry(ino, name);
            }
        }
    }
}
