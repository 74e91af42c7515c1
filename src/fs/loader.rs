//! The loader: brings checkpoints from the store into the cache, verified, with a
//! fixed pool of worker threads, and keeps the cache within its bound.
//!
//! [`Loader::when_loaded`] is the one entry point: an operation that needs a
//! checkpoint's contents hands its continuation to it, and the continuation runs once
//! the checkpoint is loaded or has failed (on a worker thread, never on a FUSE request
//! thread while a download runs). Concurrent first accesses share one load; first
//! accesses beyond the pool's size wait in a queue, in order. Threads are bounded by
//! the pool (each load also uses one download thread while it runs), not by the
//! number of checkpoints.
//!
//! A load that fails because the transfer broke (a cut connection, a server error)
//! is tried again after a short, bounded backoff; a checkpoint that does not verify
//! fails at once. A failure is remembered for [`FAILURE_REUSE`], so that one `ls`
//! does not download a bad object once per system call; a later access tries again.
//!
//! Whoever asked ([`Loader::on_loaded`]) hears of each checkpoint loaded, on the
//! worker, before the waiting operations run (the sealer primes the member cache).
//!
//! Eviction runs after each load, outside every lock of the filesystem: an entry is
//! evicted only if its slot lets go of it (no open file or reader holds it), and is
//! deleted from disk after every lock is released.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::error::FsError;
use super::listing::{Catalog, Load, Slot, Waiter};
use crate::archive::Limits;
use crate::cache::{Cache, CacheError, VerifiedCheckpoint};
use crate::checkpoint::{CheckpointId, VerifyFailure};
use crate::store::ObjectStore;

/// A failed verification is reported as is to accesses within this time.
pub const FAILURE_REUSE: Duration = Duration::from_secs(1);
/// Pauses before the second and third attempt of a load whose transfer broke.
const RETRY_BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_secs(2)];

/// The default number of loaders: each one keeps about two cores busy (download and
/// hashing, decompression and indexing), and at least two let a small checkpoint be
/// served while a large one loads.
pub fn default_loaders() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).clamp(2, 16)
}

pub struct LoaderConfig {
    pub workers: usize,
    pub max_archive_size: u64,
    /// `limits.max_index_bytes` is what one load may build; see [`Shared::make_room`].
    pub limits: Limits,
    /// The memory loaded indexes may take in all (`u64::MAX`: no bound).
    pub memory_budget: u64,
}

struct Shared {
    store: Arc<dyn ObjectStore>,
    cache: Arc<Cache>,
    catalog: Arc<Catalog>,
    max_archive_size: u64,
    limits: Limits,
    memory_budget: u64,
    /// The memory reserved by the loads running now ([`index_estimate`] each).
    building: AtomicU64,
    queue: Mutex<VecDeque<Arc<Slot>>>,
    queued: Condvar,
    stop: AtomicBool,
    loaded: OnceLock<LoadedHook>,
}

/// Told of each checkpoint loaded; must return at once.
pub type LoadedHook = Box<dyn Fn(&Slot, &Arc<VerifiedCheckpoint>) + Send + Sync>;

pub struct Loader {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Loader {
    pub fn start(
        store: Arc<dyn ObjectStore>,
        cache: Arc<Cache>,
        catalog: Arc<Catalog>,
        config: LoaderConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            store,
            cache,
            catalog,
            max_archive_size: config.max_archive_size,
            limits: config.limits,
            memory_budget: config.memory_budget,
            building: AtomicU64::new(0),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            stop: AtomicBool::new(false),
            loaded: OnceLock::new(),
        });
        let workers = (0..config.workers.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("ckptfs-loader-{i}"))
                    .spawn(move || shared.work())
                    .expect("spawning a loader thread")
            })
            .collect();
        Loader { shared, workers }
    }

    /// Calls `hook` with each checkpoint loaded from now on (once: later calls are
    /// ignored).
    pub fn on_loaded(&self, hook: LoadedHook) {
        let _ = self.shared.loaded.set(hook);
    }

    /// Whether an operation on `slot`'s contents must wait for a load.
    pub fn must_wait(&self, slot: &Slot) -> bool {
        match &*slot.load.lock().expect("slot lock") {
            Load::Loaded(_) => false,
            Load::Failed { at, .. } => at.elapsed() >= FAILURE_REUSE,
            Load::Unloaded | Load::Loading(_) => true,
        }
    }

    /// Runs `waiter` once `slot` is loaded or has failed to load: at once if it is,
    /// else after the load it joins or queues.
    pub fn when_loaded(&self, slot: &Arc<Slot>, waiter: Waiter) {
        let mut load = slot.load.lock().expect("slot lock");
        match &mut *load {
            Load::Loaded(_) => {
                drop(load);
                waiter();
            }
            Load::Failed { at, .. } if at.elapsed() < FAILURE_REUSE => {
                drop(load);
                waiter();
            }
            Load::Loading(waiters) => waiters.push(waiter),
            Load::Unloaded | Load::Failed { .. } => {
                *load = Load::Loading(vec![waiter]);
                drop(load);
                self.shared
                    .queue
                    .lock()
                    .expect("loader queue")
                    .push_back(Arc::clone(slot));
                self.shared.queued.notify_one();
            }
        }
    }

    /// The verified contents of `slot`, or why they cannot be served.
    pub fn checkpoint(&self, slot: &Slot) -> Result<Arc<VerifiedCheckpoint>, FsError> {
        let found = match &*slot.load.lock().expect("slot lock") {
            Load::Loaded(c) => Ok(Arc::clone(c)),
            Load::Failed { reason, .. } => Err(reason.clone()),
            Load::Unloaded | Load::Loading(_) => {
                Err("not verified yet (evicted while in use); try again".to_owned())
            }
        };
        match found {
            Ok(checkpoint) => {
                self.shared.cache.promote(&checkpoint.id);
                Ok(checkpoint)
            }
            Err(reason) => Err(FsError::Unverified {
                id: slot.info.id.to_string(),
                reason,
            }),
        }
    }

    /// Makes `verified` (indexed by a seal from the bytes it stored) what `slot`
    /// serves, unless a load of it is running.
    pub fn adopt(&self, slot: &Slot, verified: Arc<VerifiedCheckpoint>) {
        let mut load = slot.load.lock().expect("slot lock");
        if !matches!(*load, Load::Loading(_)) {
            *load = Load::Loaded(verified);
        }
        drop(load);
        self.shared.evict(&slot.info.id);
        self.shared
            .make_room(&slot.info.id, self.shared.memory_budget);
    }

    /// How many loads are waiting for a worker.
    pub fn queued(&self) -> usize {
        self.shared.queue.lock().expect("loader queue").len()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        {
            // Under the queue's lock: a worker that has looked at `stop` holds it
            // until its wait has begun, so it cannot miss the wake-up below.
            let _queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        self.shared.queued.notify_all();
        // The last reference may go on a worker (a hook that held one): it cannot
        // join itself, and ends on its own once it sees `stop`.
        let me = std::thread::current().id();
        for worker in self.workers.drain(..) {
            if worker.thread().id() != me {
                let _ = worker.join();
            }
        }
    }
}

/// The memory a load reserves for the index it builds, from the archive's compressed
/// size: 8 bytes of index for each byte of archive, and 16 MiB more, at most what one
/// index may take (`max_index_bytes`, half the budget). Reserving that maximum for
/// every load made two small loads at once unload every idle checkpoint. A hostile
/// archive whose few bytes imply millions of directories builds past its estimate,
/// up to `max_index_bytes`, reserving more as it grows (see `load`).
fn index_estimate(compressed: u64, max_index_bytes: u64) -> u64 {
    compressed
        .saturating_mul(8)
        .saturating_add(16 << 20)
        .min(max_index_bytes)
}

impl Shared {
    fn work(self: &Arc<Self>) {
        loop {
            let slot = {
                let mut queue = self.queue.lock().expect("loader queue");
                loop {
                    if self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(slot) = queue.pop_front() {
                        break slot;
                    }
                    queue = self.queued.wait(queue).expect("loader queue");
                }
            };
            self.load(&slot);
        }
    }

    fn load(self: &Arc<Self>, slot: &Slot) {
        let started = Instant::now();
        let id = &slot.info.id;
        // Room for the index this load may build, beside those the others may.
        let estimate = index_estimate(slot.info.size, self.limits.max_index_bytes);
        self.reserve(id, estimate);
        // A build past its estimate reserves more as it grows, making room again.
        let mine = std::rc::Rc::new(std::cell::Cell::new(estimate));
        let grow = {
            let (shared, id, mine) = (Arc::clone(self), id.clone(), std::rc::Rc::clone(&mine));
            move |memory: u64| {
                let wanted = memory.saturating_add(crate::archive::GROWTH_STEP);
                if wanted > mine.get() {
                    shared.reserve(&id, wanted - mine.get());
                    mine.set(wanted);
                }
            }
        };
        let mtime = slot
            .info
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let result = crate::archive::with_index_growth(grow, || {
            let mut attempt = 0;
            loop {
                let result = self.cache.load(
                    self.store.as_ref(),
                    id,
                    self.max_archive_size,
                    self.limits,
                    mtime,
                );
                match result {
                    Err(e) if is_transient(&e) && attempt < RETRY_BACKOFF.len() => {
                        let error = crate::printable::Message(&e);
                        tracing::warn!(checkpoint = %id, %error, "loading failed; trying again");
                        std::thread::sleep(RETRY_BACKOFF[attempt]);
                        attempt += 1;
                    }
                    other => break other,
                }
            }
        });
        let new = match result {
            Ok(checkpoint) => {
                tracing::info!(checkpoint = %id, elapsed = ?started.elapsed(), "checkpoint verified");
                if let Some(hook) = self.loaded.get() {
                    hook(slot, &checkpoint);
                }
                Load::Loaded(checkpoint)
            }
            Err(e) => {
                // The reason may quote the archive's own names (the tar crate's errors
                // do): one line of printable text, for `.status` and the log.
                let reason = crate::printable::message(&e.to_string()).into_owned();
                tracing::warn!(checkpoint = %id, error = %reason, "checkpoint failed verification");
                Load::Failed {
                    reason,
                    at: Instant::now(),
                }
            }
        };
        let waiters = match std::mem::replace(&mut *slot.load.lock().expect("slot lock"), new) {
            Load::Loading(waiters) => waiters,
            _ => Vec::new(),
        };
        self.building.fetch_sub(mine.get(), Ordering::SeqCst);
        self.evict(id);
        // A build leaves its working maps freed but held by this thread's arena.
        self.make_room(id, self.memory_budget);
        give_back_memory();
        for waiter in waiters {
            waiter();
        }
    }

    /// Adds `extra` to the memory reserved for builds, and unloads idle checkpoints
    /// until the budget has room for everything reserved.
    fn reserve(&self, id: &CheckpointId, extra: u64) {
        let reserved = self.building.fetch_add(extra, Ordering::SeqCst) + extra;
        if self.make_room(id, self.memory_budget.saturating_sub(reserved)) {
            give_back_memory();
        }
    }

    /// Keeps the memory of loaded indexes within `target`: unloads checkpoints nobody
    /// uses (no open file, no reader), least recently used first; they stay in the
    /// cache on disk and load again from there. `keep` (the checkpoint being loaded)
    /// stays, and so does any checkpoint in use: memory is bounded by the budget plus
    /// what readers hold.
    /// Returns whether it unloaded any.
    fn make_room(&self, keep: &CheckpointId, target: u64) -> bool {
        if self.memory_budget == u64::MAX {
            return false;
        }
        let memory_of = |slot: &Slot| match &*slot.load.lock().expect("slot lock") {
            Load::Loaded(checkpoint) => checkpoint.memory,
            _ => 0,
        };
        let mut held: u64 = self.catalog.all_slots().iter().map(|s| memory_of(s)).sum();
        let mut unloaded = false;
        if held <= target {
            return unloaded;
        }
        for id in self.cache.least_recent_first() {
            if held <= target {
                break;
            }
            let Some(slot) = self.catalog.slot_of(&id).filter(|_| &id != keep) else {
                continue;
            };
            let mut load = slot.load.lock().expect("slot lock");
            if let Load::Loaded(checkpoint) = &*load
                && Arc::strong_count(checkpoint) == 1
            {
                held = held.saturating_sub(checkpoint.memory);
                tracing::debug!(checkpoint = %id, "unloaded to stay within --memory-budget");
                *load = Load::Unloaded;
                unloaded = true;
            }
        }
        unloaded
    }

    /// Keeps the cache within its bound. `keep` (the checkpoint just loaded) stays: a
    /// checkpoint larger than the whole cache is still served, and evicted when the
    /// next one comes.
    fn evict(&self, keep: &CheckpointId) {
        let trash = self.cache.evict(|id| {
            if id == keep {
                return false;
            }
            let Some(slot) = self.catalog.slot_of(id) else {
                return true;
            };
            let mut load = slot.load.lock().expect("slot lock");
            match &*load {
                // Held by the slot alone: no open file, no reader.
                Load::Loaded(c) if Arc::strong_count(c) == 1 => {
                    *load = Load::Unloaded;
                    true
                }
                Load::Loaded(_) | Load::Loading(_) => false,
                Load::Unloaded | Load::Failed { .. } => true,
            }
        });
        trash.empty();
    }
}

/// Gives memory freed by an index (dropped, or abandoned half built) back to the
/// system: glibc keeps freed memory in the arena of the thread that used it, so that
/// each loader thread would otherwise hold on to the largest index it ever built.
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether a load failed on the way (worth another try) rather than on what the
/// store holds: a transfer cut short, a connection or server error.
fn is_transient(error: &CacheError) -> bool {
    match error {
        CacheError::Verify(VerifyFailure::Truncated { .. }) => true,
        CacheError::Verify(_) | CacheError::Archive(_) => false,
        CacheError::Checkpoint(_) => true,
        CacheError::Io { .. } | CacheError::Untrusted(_) => false,
    }
}
