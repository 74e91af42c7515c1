//! The primer: fills the member cache with a checkpoint's gzip members, as capture
//! compresses them, so that the seal of the next turn compresses only what changed,
//! on a replica that never captured the turn it started from as on one that did.
//!
//! A workspace started from a checkpoint (the kernel's copies into `staging/` name
//! it), and the newest checkpoint once a writable mount loads it (the next turn is
//! likely made from it, perhaps by a copy from outside the mount, which names none),
//! are primed. Invariants:
//! - members come from the cache entry's records (rebuilt from its files and
//!   checked), never from the downloaded bytes: an object compressed some other way
//!   must not change what a capture writes;
//! - one thread at the lowest CPU priority does it, a checkpoint at a time, once per
//!   checkpoint and mount (even if that fails), with at most one more waiting: a
//!   request beyond that is dropped, and the next copy from that checkpoint asks
//!   again;
//! - the entry is not held: an eviction ends its priming, and before it starts lets a
//!   later request ask again. A seal running meanwhile compresses what is not there
//!   yet.

use std::collections::HashSet;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::cache::{VerifiedCheckpoint, entry};
use crate::checkpoint::CheckpointId;
use crate::members::store::{MemberCache, Primed};

type Request = (CheckpointId, Weak<VerifiedCheckpoint>);

pub struct Primer {
    members: Arc<MemberCache>,
    /// Checkpoints whose members were put in the member cache, or will be.
    primed: Arc<Mutex<HashSet<CheckpointId>>>,
    /// The thread's requests, once it runs; it ends when the primer is dropped.
    queue: Mutex<Option<SyncSender<Request>>>,
}

impl Primer {
    pub fn new(members: Arc<MemberCache>) -> Self {
        Primer {
            members,
            primed: Arc::new(Mutex::new(HashSet::new())),
            queue: Mutex::new(None),
        }
    }

    /// Has the members of `checkpoint` put in the member cache, in the background
    /// (see the module comment).
    pub fn prime(&self, checkpoint: &Arc<VerifiedCheckpoint>) {
        let mut primed = self.primed.lock().expect("primed lock");
        if primed.contains(&checkpoint.id) {
            return;
        }
        let mut queue = self.queue.lock().expect("primer lock");
        if queue.is_none() {
            *queue = start(Arc::clone(&self.members), Arc::clone(&self.primed));
        }
        let Some(sender) = queue.as_ref() else {
            return;
        };
        let request = (checkpoint.id.clone(), Arc::downgrade(checkpoint));
        match sender.try_send(request) {
            Ok(()) => {
                primed.insert(checkpoint.id.clone());
            }
            Err(TrySendError::Full(_)) => {}
            // The thread is gone (it never should): started again next time.
            Err(TrySendError::Disconnected(_)) => *queue = None,
        }
    }
}

/// Starts the thread that primes the member cache.
fn start(
    members: Arc<MemberCache>,
    primed: Arc<Mutex<HashSet<CheckpointId>>>,
) -> Option<SyncSender<Request>> {
    let (queue, requests) = sync_channel::<Request>(1);
    let spawned = std::thread::Builder::new()
        .name("ckptfs-prime".into())
        .spawn(move || {
            // Idle work: copies, seals and reads come first.
            // SAFETY: setpriority has no memory preconditions; on Linux a thread id
            // names that thread alone.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, 19) };
            for (id, checkpoint) in requests {
                if checkpoint.strong_count() == 0 {
                    tracing::debug!(checkpoint = %id, "evicted before it was primed");
                    primed.lock().expect("primed lock").remove(&id);
                    continue;
                }
                prime_one(&members, &id, &checkpoint);
            }
        });
    match spawned {
        Ok(_) => Some(queue),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start priming the member cache");
            None
        }
    }
}

fn prime_one(members: &MemberCache, id: &CheckpointId, checkpoint: &Weak<VerifiedCheckpoint>) {
    let started = Instant::now();
    let (mut compressed, mut full, mut failed) = (0u64, false, None);
    let rebuilt = entry::member_tars(checkpoint, |tar| {
        match members.prime(tar, crate::archive::gz::compress_member) {
            Ok(Primed::Present) => true,
            Ok(Primed::Compressed) => {
                compressed += 1;
                true
            }
            Ok(Primed::Full) => {
                full = true;
                false
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    let evicted = checkpoint.strong_count() == 0;
    match (rebuilt, failed) {
        (Ok(members), None) => {
            tracing::info!(checkpoint = %id, members, compressed, full, evicted, elapsed = ?started.elapsed(), "member cache primed")
        }
        // Sealed by this mount: its members are those the seal kept.
        (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(checkpoint = %id, "no member records to prime from")
        }
        (Err(e), _) | (_, Some(e)) => {
            tracing::warn!(checkpoint = %id, error = %e, "could not prime the member cache; the next seal compresses more")
        }
    }
}
