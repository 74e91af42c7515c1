//! The fork request: `setxattr` of [`FORK_ATTRIBUTE`] on `staging/` to `REF/NAME`
//! (what `ckptfs fork MNT REF NAME` sends) makes workspace `staging/NAME` from
//! checkpoint `REF` in the daemon (see `staging/fork.rs`), one request in all.
//!
//! An extended attribute, because it is the one request that carries bytes to a
//! directory and waits for the answer, reaches the daemon through any mount namespace
//! the mount is seen in (a container's included), needs no socket of its own, and is
//! checked by the kernel like a `mkdir` there: who may write in `staging/` may fork.
//! Set on `staging/` rather than on an empty `staging/NAME`, because the kernel holds
//! the target's lock while it waits for the answer and may remember names inside it as
//! absent: a new name in `staging/` has neither problem.
//!
//! Invariants: a fork runs on a thread of its own, never on a FUSE request thread (it
//! may wait for a load and copies a whole tree); at most [`FORKS_AT_ONCE`] run or wait
//! at once, more are refused with `EBUSY`.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::error::FsError;
use super::inode;
use super::listing::{Catalog, Slot};
use super::loader::Loader;
use super::primer::Primer;
use super::staging::{Caller, StagingTree};
use super::subtree::KernelCache;

/// The extended attribute that forks a workspace.
pub const FORK_ATTRIBUTE: &str = "user.ckptfs.fork";

/// Forks running or waiting for their checkpoint at once.
const FORKS_AT_ONCE: usize = 4;

/// The shortest prefix of a checkpoint id a fork takes.
const SHORTEST_PREFIX: usize = 8;

/// Called with a fork's outcome, from the fork's thread.
pub type ForkDone = Box<dyn FnOnce(Result<(), FsError>) + Send>;

pub struct Forker {
    pub(super) catalog: Arc<Catalog>,
    pub(super) loader: Arc<Loader>,
    pub(super) staging: Arc<StagingTree>,
    pub(super) primer: Option<Arc<Primer>>,
    pub(super) kernel: Arc<OnceLock<Arc<dyn KernelCache>>>,
    /// The owner every checkpoint entry is shown with, if one is.
    pub(super) shown_owner: Option<(u32, u32)>,
    pub(super) running: AtomicUsize,
}

impl Forker {
    /// Forks `value` (`REF/NAME`) for `caller`; `done` gets the outcome.
    pub fn fork(self: &Arc<Self>, value: &[u8], caller: Caller, done: ForkDone) {
        let (slot, name) = match self.parse(value) {
            Ok(parsed) => parsed,
            Err(e) => return done(Err(e)),
        };
        if self.running.fetch_add(1, Ordering::SeqCst) >= FORKS_AT_ONCE {
            self.running.fetch_sub(1, Ordering::SeqCst);
            tracing::info!("fork refused: {FORKS_AT_ONCE} forks are running");
            return done(Err(FsError::Busy));
        }
        let forker = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ckptfs-fork".into())
            .spawn(move || {
                let result = forker.fork_now(&slot, &name, caller);
                forker.running.fetch_sub(1, Ordering::SeqCst);
                done(result)
            });
        if let Err(e) = spawned {
            // The reply went with the closure: the kernel gets EIO for it.
            self.running.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(error = %e, "cannot start a fork's thread");
        }
    }

    /// `REF/NAME`: the checkpoint (a whole id, or a prefix of one of at least
    /// [`SHORTEST_PREFIX`] characters that names one checkpoint) and the new name.
    fn parse(&self, value: &[u8]) -> Result<(Arc<Slot>, Vec<u8>), FsError> {
        let Some(slash) = value.iter().position(|&b| b == b'/') else {
            tracing::info!("fork refused: the value is not REF/NAME");
            return Err(FsError::InvalidArgument);
        };
        let (reference, name) = (&value[..slash], &value[slash + 1..]);
        let reference = std::str::from_utf8(reference)
            .ok()
            .filter(|r| r.len() >= SHORTEST_PREFIX && r.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                tracing::info!(
                    "fork refused: a checkpoint is named by its id or 8 characters of it"
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
            (Some(slot), None) => Ok((slot, name.to_vec())),
            (None, _) => {
                tracing::info!(reference, "fork refused: no such checkpoint");
                Err(FsError::NotFound)
            }
            (Some(_), Some(_)) => {
                tracing::info!(
                    reference,
                    "fork refused: the prefix names several checkpoints"
                );
                Err(FsError::InvalidArgument)
            }
        }
    }

    fn fork_now(&self, slot: &Arc<Slot>, name: &[u8], caller: Caller) -> Result<(), FsError> {
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
        let forked = self
            .staging
            .fork(name, &checkpoint, caller, self.shown_owner)
            .inspect_err(|e| {
                tracing::info!(
                    name = %crate::printable::escape(name),
                    error = %e,
                    "fork failed"
                )
            })?;
        // The seal of the new turn then compresses only what changed.
        if let Some(primer) = &self.primer {
            primer.prime(&checkpoint);
        }
        // The kernel may hold a listing of `staging/` without the new name.
        if let Some(kernel) = self.kernel.get() {
            kernel.forget_attributes(inode::STAGING);
        }
        tracing::info!(
            checkpoint = %checkpoint.id,
            name = %crate::printable::escape(name),
            entries = forked.entries,
            bytes = forked.bytes,
            seconds = started.elapsed().as_secs_f64(),
            "forked"
        );
        Ok(())
    }
}
