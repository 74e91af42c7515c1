//! The on-disk cache of verified checkpoints.
//!
//! Layout (in the cache directory, whose names [`CacheDir`] owns; mode 0700, every
//! file 0600):
//!
//! ```text
//! checkpoints/<sha256>/      one verified checkpoint (see [`entry`] for inside)
//! checkpoints/partial-*      a pass in progress; removed at start-up
//! checkpoints/trash-*        an evicted entry being deleted; removed at start-up
//! blobs/<sha256>             files of their own shared by entries (see [`blobs`])
//! lock                       flock: one daemon per cache directory
//! ```
//!
//! Invariants:
//! - a `checkpoints/<sha256>` directory exists only once its object was downloaded,
//!   hashed, length-checked and indexed in one pass; it appears by an atomic rename;
//! - nothing from it is served after a restart before every byte was checked again
//!   against the checksums in its index: a damaged entry is deleted and fetched again;
//! - one daemon at a time uses a cache directory (an exclusive `flock` on `lock`);
//! - the total size, shared files counted once, stays under the configured bound,
//!   evicting least recently used
//!   entries that the caller releases; an evicted entry is renamed away at once (a
//!   new load of it starts afresh) and deleted later, outside every lock.

pub mod blobs;
pub mod dir;
pub mod entry;

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use lru::LruCache;

use blobs::Blobs;
pub use dir::CacheDir;
pub use entry::{PendingEntry, Provenance, VerifiedCheckpoint};

use crate::archive::index::{self, Index};
use crate::archive::{ArchiveError, Limits};
use crate::checkpoint::{self, CheckpointError, CheckpointId, VerifyFailure, VerifyingReader};
use crate::members::reader::{Indexing, MemberReader};
use crate::members::recorder::Recorder;
use crate::members::records::Known;
use crate::members::store::MemberCache;
use crate::pipe::{PipeReader, pipe, pump};

/// Entries, used last, whose gzip members a load may rebuild instead of inflating.
const REUSE_SOURCES: usize = 4;
use crate::store::ObjectStore;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    Verify(VerifyFailure),
    #[error("{0}")]
    Checkpoint(CheckpointError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("cache {}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error("cache directory {0}")]
    Untrusted(#[from] crate::trusted::TrustError),
}

impl From<CheckpointError> for CacheError {
    fn from(e: CheckpointError) -> Self {
        match e {
            CheckpointError::Verify { failure, .. } => CacheError::Verify(failure),
            other => CacheError::Checkpoint(other),
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |cause| CacheError::Io {
        path: path.to_owned(),
        cause,
    }
}

/// Reads up to `len` bytes of `file` at `offset`: fewer only at the end of the file.
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        let n = file.read_at(&mut buf[filled..], offset + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(buf)
}

pub struct Cache {
    /// Held (flock) for the cache's lifetime: one daemon per cache directory.
    _lock: File,
    checkpoints: PathBuf,
    /// Files of their own shared between entries, counted once.
    blobs: Arc<Blobs>,
    max_bytes: u64,
    /// Entries on disk, least recently used last, with the bytes they alone use.
    entries: Mutex<LruCache<CheckpointId, u64>>,
    /// Checkpoints downloaded, and checkpoints served from disk after a check.
    downloads: AtomicU64,
    downloaded_bytes: AtomicU64,
    reuses: AtomicU64,
    evictions: AtomicU64,
    reused_members: AtomicU64,
    inflated_members: AtomicU64,
    /// Where the layouts of downloads are recorded, for captures to copy from.
    layouts: OnceLock<Arc<MemberCache>>,
}

/// What the cache has done so far, for `.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub used_bytes: u64,
    pub entries: usize,
    pub downloads: u64,
    /// Bytes of the objects downloaded and verified.
    pub downloaded_bytes: u64,
    pub reuses: u64,
    pub evictions: u64,
    /// Gzip members of downloads rebuilt from entries already here, not inflated.
    pub reused_members: u64,
    pub inflated_members: u64,
    /// Bytes of files too large to hold in memory that were found equal to a blob,
    /// byte for byte, as they came, and linked to it without being written.
    pub linked_unwritten_bytes: u64,
}

/// Creates `path` (and missing parents) as a directory only the daemon's user can
/// use, or makes an existing one so. A directory that belongs to another user is
/// refused: whoever owns it could change verified contents or plant links in it (a
/// shared `/tmp/ckptfs` made in advance by someone else, say).
pub fn private_dir(path: &Path) -> Result<(), CacheError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| {
            // EEXIST from a directory builder means a file is in the way.
            let e = if e.kind() == io::ErrorKind::AlreadyExists {
                io::Error::new(
                    io::ErrorKind::NotADirectory,
                    "exists and is not a directory",
                )
            } else {
                e
            };
            io_err(path)(e)
        })?;
    let dir = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io_err(path)(e.into()))?;
    let owner = rustix::fs::fstat(&dir)
        .map_err(|e| io_err(path)(e.into()))?
        .st_uid;
    if owner != rustix::process::geteuid().as_raw() {
        return Err(CacheError::Io {
            path: path.to_owned(),
            cause: io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("belongs to uid {owner}, not to this user; give a directory of your own"),
            ),
        });
    }
    rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(0o700))
        .map_err(|e| io_err(path)(e.into()))
}

impl Cache {
    /// Opens the cache in `dir`, creating what is missing, and forgets unfinished
    /// passes.
    pub fn open(dir: &CacheDir, max_bytes: u64) -> Result<Self, CacheError> {
        let lock_path = dir.lock();
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| CacheError::Io {
                path: dir.path().to_owned(),
                cause: io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "another ckptfs daemon uses this cache directory; give each its own --cache-dir",
                ),
            },
        )?;
        let checkpoints = dir.checkpoints();
        private_dir(&checkpoints)?;
        let mut found = Vec::new();
        for entry in fs::read_dir(&checkpoints).map_err(io_err(&checkpoints))? {
            let entry = entry.map_err(io_err(&checkpoints))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            match CheckpointId::parse(&name) {
                Some(id) => {
                    let used = entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push((used, id, entry::size_on_disk(&path)));
                }
                None => {
                    tracing::info!(path = %path.display(), "removing an unfinished or evicted cache entry");
                    let _ = fs::remove_dir_all(&path);
                }
            }
        }
        let blobs_dir = dir.blobs();
        private_dir(&blobs_dir)?;
        // After the unfinished entries are gone: what they alone used goes too.
        let blobs = Arc::new(Blobs::open(blobs_dir).map_err(io_err(dir.path()))?);
        found.sort();
        let mut entries = LruCache::unbounded();
        for (_, id, size) in found {
            entries.put(id, size);
        }
        Ok(Cache {
            _lock: lock,
            checkpoints,
            blobs,
            max_bytes,
            entries: Mutex::new(entries),
            downloads: AtomicU64::new(0),
            downloaded_bytes: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            reused_members: AtomicU64::new(0),
            inflated_members: AtomicU64::new(0),
            layouts: OnceLock::new(),
        })
    }

    pub(crate) fn entry_dir(&self, id: &CheckpointId) -> PathBuf {
        self.checkpoints.join(id.as_str())
    }

    /// The directories of the `n` entries used last.
    fn recent_entries(&self, n: usize) -> Vec<PathBuf> {
        let entries = self.entries.lock().expect("cache lock");
        entries
            .iter()
            .take(n)
            .map(|(id, _)| self.entry_dir(id))
            .collect()
    }

    pub fn stats(&self) -> CacheStats {
        let entries = self.entries.lock().expect("cache lock");
        CacheStats {
            used_bytes: entries.iter().map(|(_, s)| s).sum::<u64>() + self.blobs.bytes(),
            entries: entries.len(),
            downloads: self.downloads.load(Ordering::Relaxed),
            downloaded_bytes: self.downloaded_bytes.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            reused_members: self.reused_members.load(Ordering::Relaxed),
            inflated_members: self.inflated_members.load(Ordering::Relaxed),
            linked_unwritten_bytes: self.blobs.compared_bytes(),
        }
    }

    /// A verified checkpoint: from disk if an intact copy is there, otherwise
    /// downloaded, verified and indexed in one streaming pass.
    pub fn load(
        &self,
        store: &dyn ObjectStore,
        id: &CheckpointId,
        max_archive_size: u64,
        limits: Limits,
        default_mtime: i64,
    ) -> Result<Arc<VerifiedCheckpoint>, CacheError> {
        let dir = self.entry_dir(id);
        if dir.exists() {
            match entry::open_checked(id, &dir) {
                Ok(checkpoint) => {
                    self.touch(id, &dir, entry::size_on_disk(&dir));
                    self.reuses.fetch_add(1, Ordering::Relaxed);
                    return Ok(Arc::new(checkpoint));
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %id, error = %e, "cache entry is damaged; fetching the checkpoint again");
                    self.remove(id);
                }
            }
        }
        self.downloads.fetch_add(1, Ordering::Relaxed);
        let reader = checkpoint::open(store, id, max_archive_size)?;
        self.insert(id, reader, limits, default_mtime)
    }

    fn insert(
        &self,
        id: &CheckpointId,
        reader: VerifyingReader<Box<dyn Read + Send>>,
        limits: Limits,
        default_mtime: i64,
    ) -> Result<Arc<VerifiedCheckpoint>, CacheError> {
        let mut pending = self.begin()?;
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        pending.record_members(Arc::clone(&recorder));
        let known = Known::read(
            self.recent_entries(REUSE_SOURCES)
                .iter()
                .map(|dir| entry::files_of(dir)),
        );
        let (chunks, verdict) = read_ahead(reader);
        let members = MemberReader::new(chunks, known, Arc::clone(&recorder));
        let (mut tar, inflater) = inflate_ahead(members, Arc::clone(&recorder));
        let built = index::build(&mut tar, &mut pending, limits, default_mtime);
        if built.is_ok() {
            // The indexer stops at the tar's end, inside the last member: reading on
            // to that member's end records it too (layout and reuse). Bounded: no
            // member holds more tar than this, and anything may follow an archive.
            let tail = crate::archive::gz::CHUNK_SIZE as u64 + 1;
            let _ = io::copy(&mut (&mut tar).take(tail), &mut io::sink());
        }
        // Before the verdict is awaited: neither the inflating thread nor the download
        // thread may wait on a pipe nobody reads.
        drop(tar);
        // Its pipe ended in an error then, which the build saw; the load fails.
        let inflated = inflater
            .join()
            .map_err(|_| io::Error::other("the inflating thread panicked"));
        // (Poisoned only if the inflating thread panicked: the load fails below.)
        let counts = recorder.lock().unwrap_or_else(|e| e.into_inner()).counts();
        self.reused_members
            .fetch_add(counts.reused, Ordering::Relaxed);
        self.inflated_members
            .fetch_add(counts.inflated, Ordering::Relaxed);
        tracing::debug!(
            checkpoint = %id,
            reused = counts.reused,
            inflated = counts.inflated,
            stale = counts.stale,
            mismatched = counts.mismatched,
            "gzip members"
        );
        // The object's own verdict comes first: a corrupt or cut object also makes the
        // tar reader fail, and the user must hear "checksum mismatch", not "bad gzip".
        let bytes = verdict.join().expect("the download thread panicked")?;
        self.downloaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        let provenance = Provenance::Store {
            verified_at: SystemTime::now(),
        };
        inflated.map_err(io_err(&self.checkpoints))?;
        let checkpoint = self.finish(pending, id, built?, provenance)?;
        let layout = recorder.lock().expect("member recorder lock").take_layout();
        if let (Some(members), Some(layout)) = (self.layouts.get(), layout)
            && let Err(e) = members.record_layout(&id.object_name(), &layout)
        {
            tracing::debug!(checkpoint = %id, error = %e, "cannot record the layout");
        }
        Ok(checkpoint)
    }

    /// From now on, the gzip members of each verified download are recorded in
    /// `members` as that object's layout: a seal of the next turn (typically a copy of
    /// this checkpoint with a few changes) then has the store copy the members they
    /// share instead of sending them, also on a replica that never captured this one.
    pub fn record_layouts_in(&self, members: Arc<MemberCache>) {
        let _ = self.layouts.set(members);
    }

    /// Starts a new entry in a private directory of its own; it becomes visible only
    /// through [`Cache::finish`], and vanishes if dropped before.
    pub fn begin(&self) -> Result<PendingEntry, CacheError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = self.checkpoints.join(format!(
            "partial-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        private_dir(&dir)?;
        // A pass that cannot even start (no descriptor left, say) leaves nothing.
        PendingEntry::create(dir.clone(), Arc::clone(&self.blobs)).inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })
    }

    /// Completes an entry whose contents were indexed from bytes that hashed to `id`.
    pub fn finish(
        &self,
        pending: PendingEntry,
        id: &CheckpointId,
        index: Index,
        provenance: Provenance,
    ) -> Result<Arc<VerifiedCheckpoint>, CacheError> {
        let dir = self.entry_dir(id);
        if dir.exists() {
            // The same checkpoint is already here (a tree sealed twice): keep the entry
            // its readers may be using, unless it is damaged.
            match entry::open_checked(id, &dir) {
                Ok(existing) => {
                    drop(pending);
                    self.touch(id, &dir, entry::size_on_disk(&dir));
                    return Ok(Arc::new(existing));
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %id, error = %e, "replacing a damaged cache entry");
                    self.remove(id);
                }
            }
        }
        let checkpoint = pending.finish(id, index, &dir, provenance)?;
        self.touch(id, &dir, entry::size_on_disk(&dir));
        Ok(Arc::new(checkpoint))
    }

    fn touch(&self, id: &CheckpointId, dir: &Path, size: u64) {
        // The directory's mtime carries the LRU order across restarts.
        let _ = File::open(dir).and_then(|d| d.set_modified(SystemTime::now()));
        self.entries
            .lock()
            .expect("cache lock")
            .put(id.clone(), size);
    }

    /// The entries on disk, least recently used first.
    pub fn least_recent_first(&self) -> Vec<CheckpointId> {
        let entries = self.entries.lock().expect("cache lock");
        entries.iter().rev().map(|(id, _)| id.clone()).collect()
    }

    /// Marks `id` as just used, so that it is evicted last.
    pub fn promote(&self, id: &CheckpointId) {
        self.entries.lock().expect("cache lock").promote(id);
    }

    fn remove(&self, id: &CheckpointId) {
        self.entries.lock().expect("cache lock").pop(id);
        let dir = self.entry_dir(id);
        if let Err(e) = fs::remove_dir_all(&dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %dir.display(), error = %e, "could not remove cache entry");
        }
    }

    /// Evicts least recently used entries until the cache fits its bound. `release`
    /// is asked about each candidate, least recently used first, and answers true
    /// when nothing uses it any more and nothing can start to (it is called under the
    /// cache's lock). Evicted entries are renamed away at once; the returned [`Trash`]
    /// deletes them, and is meant to be emptied outside every lock.
    pub fn evict(&self, release: impl Fn(&CheckpointId) -> bool) -> Trash {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut trash = Trash(Vec::new(), Arc::clone(&self.blobs));
        let mut entries = self.entries.lock().expect("cache lock");
        let mut total: u64 = entries.iter().map(|(_, s)| s).sum::<u64>() + self.blobs.bytes();
        let candidates: Vec<CheckpointId> =
            entries.iter().rev().map(|(id, _)| id.clone()).collect();
        // Links of shared files not yet counted as going, by inode.
        let mut links_left: HashMap<u64, u64> = HashMap::new();
        for id in candidates {
            if total <= self.max_bytes {
                break;
            }
            if !release(&id) {
                continue;
            }
            entries.pop(&id);
            // What it alone uses, and the blobs whose last entry goes with it (the
            // entries evicted before it in this pass still hold their links).
            let dir = self.entry_dir(&id);
            let mut freed = entry::size_on_disk(&dir);
            for (inode, links, len) in entry::shared_files(&dir) {
                let left = links_left.entry(inode).or_insert(links);
                *left -= 1;
                if *left == 1 {
                    freed += len;
                }
            }
            total = total.saturating_sub(freed);
            let away = self.checkpoints.join(format!(
                "trash-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            match fs::rename(self.entry_dir(&id), &away) {
                Ok(()) => {
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(checkpoint = %id, "evicted from the cache");
                    trash.0.push(away);
                }
                Err(e) => tracing::warn!(checkpoint = %id, error = %e, "could not evict"),
            }
        }
        trash
    }
}

/// Evicted entries waiting to be deleted (and then the blobs only they used).
#[must_use = "empty the trash once every lock is released"]
pub struct Trash(Vec<PathBuf>, Arc<Blobs>);

impl Trash {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Deletes the evicted entries (slow for large ones: call it holding no lock).
    pub fn empty(self) {
        if self.0.is_empty() {
            return;
        }
        for dir in self.0 {
            if let Err(e) = fs::remove_dir_all(&dir) {
                tracing::warn!(path = %dir.display(), error = %e, "could not delete an evicted entry");
            }
        }
        self.1.collect();
    }
}

/// Inflates `members` on a thread of its own, ahead of the indexer by at most three
/// chunks, so that a load uses two cores for its two heavy halves: inflating (and
/// hashing members) there, parsing tar and writing the entry's files here. Memory is
/// bounded by the pipe. The thread stops at the stream's end, at its first error
/// (handed to the reader), or once the reader is dropped.
fn inflate_ahead<R: Read + Send + 'static>(
    mut members: MemberReader<R>,
    recorder: Arc<Mutex<Recorder>>,
) -> (Indexing<PipeReader>, std::thread::JoinHandle<()>) {
    // One chunk in the pipe, one being filled, one being read: deeper pipes made
    // loads no faster and the daemon's peak memory larger (BENCHMARKS.md, section 7).
    let (mut writer, tar) = pipe(1);
    let thread = std::thread::Builder::new()
        .name("ckptfs-inflate".into())
        .spawn(move || {
            if let Err(e) = pump(&mut members, &mut writer) {
                writer.fail(e);
            }
        })
        .expect("spawning an inflating thread");
    (Indexing::new(tar, recorder), thread)
}

/// Reads a checkpoint stream to its end on a thread of its own, so that downloading
/// and hashing overlap with decompressing and indexing. The thread's result is the
/// stream's verdict; it reads to the end even when the consumer stops early, since
/// every byte must be hashed.
fn read_ahead(
    mut reader: VerifyingReader<Box<dyn Read + Send>>,
) -> (
    PipeReader,
    std::thread::JoinHandle<Result<u64, CheckpointError>>,
) {
    // Two chunks: the inflating thread behind keeps up (BENCHMARKS.md, section 7).
    let (mut writer, chunks) = pipe(2);
    let thread = std::thread::Builder::new()
        .name("ckptfs-download".into())
        .spawn(move || {
            // The consumer may be done before the end: finish() reads the rest.
            match pump(&mut reader, &mut writer) {
                Ok(()) => drop(writer),
                Err(e) => writer.fail(io::Error::new(e.kind(), e.to_string())),
            }
            reader.finish()
        })
        .expect("spawning a download thread");
    (chunks, thread)
}
