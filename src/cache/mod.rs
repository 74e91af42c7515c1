//! The on-disk cache of verified checkpoints.
//!
//! Layout (`--cache-dir`, mode 0700; every file 0600):
//!
//! ```text
//! checkpoints/<sha256>/index        the archive's Index (postcard) + xxh3 of it
//! checkpoints/<sha256>/pack         small files, concatenated
//! checkpoints/<sha256>/files/<n>    large files, one each (passthrough backing files)
//! checkpoints/partial-*            a pass in progress; removed at start-up
//! ```
//!
//! Invariants:
//! - a `checkpoints/<sha256>` directory exists only once its object was downloaded,
//!   hashed, length-checked and indexed in one pass; it appears by an atomic rename;
//! - nothing from it is served after a restart before every byte was checked again
//!   against the checksums in its index: a damaged entry is deleted and fetched again;
//! - one daemon at a time uses a cache directory (an exclusive `flock` on `lock`);
//! - the total size stays under the configured bound, evicting least recently used
//!   entries that the caller says are not in use.

use std::fs::{self, DirBuilder, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use lru::LruCache;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::archive::index::{self, FileLocation, Index, NodeKind};
use crate::archive::{ArchiveError, Limits};
use crate::checkpoint::{self, CheckpointError, CheckpointId, VerifyFailure, VerifyingReader};
use crate::pipe::{PipeReader, pipe};
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
}

impl From<CheckpointError> for CacheError {
    fn from(e: CheckpointError) -> Self {
        match e {
            CheckpointError::Verify { failure, .. } => CacheError::Verify(failure),
            other => CacheError::Checkpoint(other),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |cause| CacheError::Io {
        path: path.to_owned(),
        cause,
    }
}

/// A checkpoint whose every byte was verified, ready to serve.
pub struct VerifiedCheckpoint {
    pub id: CheckpointId,
    pub index: Index,
    dir: PathBuf,
    pack: File,
}

impl VerifiedCheckpoint {
    /// Reads `len` bytes at `offset` of a packed file starting at `start` in the pack.
    pub fn read_packed(&self, start: u64, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        read_at(&self.pack, start + offset, len)
    }

    /// Opens the own file of `node` read-only.
    pub fn open_own(&self, node: u32) -> io::Result<File> {
        File::open(index::own_file_path(&self.dir, node))
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
    max_bytes: u64,
    /// Entries on disk, least recently used last, with their sizes in bytes.
    entries: Mutex<LruCache<CheckpointId, u64>>,
    /// Checkpoints downloaded, and checkpoints served from disk after a check.
    downloads: AtomicU64,
    reuses: AtomicU64,
}

/// What the cache has done so far, for `.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub used_bytes: u64,
    pub entries: usize,
    pub downloads: u64,
    pub reuses: u64,
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
        .map_err(io_err(path))?;
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

fn dir_size(dir: &Path) -> u64 {
    let files = fs::read_dir(dir.join("files"))
        .into_iter()
        .flatten()
        .flatten();
    let own: u64 = files
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum();
    let pack = fs::metadata(index::pack_path(dir)).map_or(0, |m| m.len());
    own + pack
}

impl Cache {
    /// Opens the cache directory, creating it, and forgets unfinished passes.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, CacheError> {
        private_dir(dir)?;
        let lock_path = dir.join("lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| CacheError::Io {
                path: dir.to_owned(),
                cause: io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "another ckptfs daemon uses this cache directory; give each its own --cache-dir",
                ),
            },
        )?;
        let checkpoints = dir.join("checkpoints");
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
                    found.push((used, id, dir_size(&path)));
                }
                None => {
                    tracing::info!(path = %path.display(), "removing unfinished cache entry");
                    let _ = fs::remove_dir_all(&path);
                }
            }
        }
        found.sort();
        let mut entries = LruCache::unbounded();
        for (_, id, size) in found {
            entries.put(id, size);
        }
        Ok(Cache {
            _lock: lock,
            checkpoints,
            max_bytes,
            entries: Mutex::new(entries),
            downloads: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
        })
    }

    fn entry_dir(&self, id: &CheckpointId) -> PathBuf {
        self.checkpoints.join(id.as_str())
    }

    pub fn stats(&self) -> CacheStats {
        let entries = self.entries.lock().expect("cache lock");
        CacheStats {
            used_bytes: entries.iter().map(|(_, s)| s).sum(),
            entries: entries.len(),
            downloads: self.downloads.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
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
            match open_entry(id, &dir) {
                Ok(checkpoint) => {
                    self.touch(id, &dir, checkpoint.index.unpacked_bytes);
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
        let pending = self.begin()?;
        let (chunks, verdict) = read_ahead(reader);
        let built = index::build(
            flate2::read::MultiGzDecoder::new(chunks),
            pending.dir(),
            limits,
            default_mtime,
        );
        // The object's own verdict comes first: a corrupt or cut object also makes the
        // tar reader fail, and the user must hear "checksum mismatch", not "bad gzip".
        verdict.join().expect("the download thread panicked")?;
        self.finish(pending, id, built?)
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
        Ok(PendingEntry { dir: Some(dir) })
    }

    /// Completes an entry whose contents were indexed from bytes that hashed to `id`.
    pub fn finish(
        &self,
        mut pending: PendingEntry,
        id: &CheckpointId,
        index: Index,
    ) -> Result<Arc<VerifiedCheckpoint>, CacheError> {
        let dir = self.entry_dir(id);
        if dir.exists() {
            // The same checkpoint is already here (a tree sealed twice): keep the entry
            // its readers may be using, unless it is damaged.
            match open_entry(id, &dir) {
                Ok(existing) => {
                    drop(pending);
                    self.touch(id, &dir, existing.index.unpacked_bytes);
                    return Ok(Arc::new(existing));
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %id, error = %e, "replacing a damaged cache entry");
                    self.remove(id);
                }
            }
        }
        let partial = pending.dir.take().expect("a pending entry finishes once");
        let result = write_index(&partial, &index).and_then(|()| {
            fs::rename(&partial, &dir).map_err(io_err(&dir))?;
            // Served from the index in hand: reading it back would hold two copies.
            let checkpoint = entry_with_index(id, &dir, index)?;
            self.touch(id, &dir, checkpoint.index.unpacked_bytes);
            Ok(Arc::new(checkpoint))
        });
        if result.is_err() {
            let _ = fs::remove_dir_all(&partial);
        }
        result
    }

    fn touch(&self, id: &CheckpointId, dir: &Path, size: u64) {
        // The directory's mtime carries the LRU order across restarts.
        let _ = File::open(dir).and_then(|d| d.set_modified(SystemTime::now()));
        self.entries
            .lock()
            .expect("cache lock")
            .put(id.clone(), size);
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

    /// Evicts least recently used entries until the cache fits its bound, skipping
    /// those `in_use` names. Returns the evicted checkpoints.
    pub fn evict(&self, in_use: impl Fn(&CheckpointId) -> bool) -> Vec<CheckpointId> {
        let mut evicted = Vec::new();
        let mut entries = self.entries.lock().expect("cache lock");
        let mut total: u64 = entries.iter().map(|(_, s)| s).sum();
        let candidates: Vec<(CheckpointId, u64)> = entries
            .iter()
            .rev()
            .map(|(id, size)| (id.clone(), *size))
            .collect();
        for (id, size) in candidates {
            if total <= self.max_bytes {
                break;
            }
            if in_use(&id) {
                continue;
            }
            entries.pop(&id);
            total -= size;
            evicted.push(id);
        }
        drop(entries);
        for id in &evicted {
            tracing::info!(checkpoint = %id, "evicting from cache");
            let _ = fs::remove_dir_all(self.entry_dir(id));
        }
        evicted
    }
}

fn write_index(dir: &Path, index: &Index) -> Result<(), CacheError> {
    let bytes = postcard::to_stdvec(index).map_err(|e| CacheError::Io {
        path: dir.join("index"),
        cause: io::Error::other(e),
    })?;
    let tmp = dir.join("index.tmp");
    let mut file = index::create_private(&tmp).map_err(io_err(&tmp))?;
    file.write_all(&bytes)
        .and_then(|()| file.write_all(&xxh3_64(&bytes).to_le_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(io_err(&tmp))?;
    fs::rename(&tmp, dir.join("index")).map_err(io_err(dir))
}

/// A cache entry being written; removed unless finished.
pub struct PendingEntry {
    dir: Option<PathBuf>,
}

impl PendingEntry {
    pub fn dir(&self) -> &Path {
        self.dir
            .as_deref()
            .expect("a pending entry has its directory until finished")
    }
}

impl Drop for PendingEntry {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

fn read_index(dir: &Path) -> Result<Index, CacheError> {
    let path = dir.join("index");
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    let damaged = |why: &str| CacheError::Io {
        path: path.clone(),
        cause: io::Error::new(io::ErrorKind::InvalidData, why.to_owned()),
    };
    if bytes.len() < 8 {
        return Err(damaged("index too short"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if xxh3_64(body).to_le_bytes() != sum {
        return Err(damaged("index checksum mismatch"));
    }
    postcard::from_bytes(body).map_err(|_| damaged("index undecodable"))
}

/// Opens an entry whose index was read back and checked.
fn open_entry_trusted(id: &CheckpointId, dir: &Path) -> Result<VerifiedCheckpoint, CacheError> {
    entry_with_index(id, dir, read_index(dir)?)
}

fn entry_with_index(
    id: &CheckpointId,
    dir: &Path,
    index: Index,
) -> Result<VerifiedCheckpoint, CacheError> {
    let pack_path = index::pack_path(dir);
    let pack = File::open(&pack_path).map_err(io_err(&pack_path))?;
    Ok(VerifiedCheckpoint {
        id: id.clone(),
        index,
        dir: dir.to_owned(),
        pack,
    })
}

/// Opens an entry found on disk, checking every byte against the index first.
fn open_entry(id: &CheckpointId, dir: &Path) -> Result<VerifiedCheckpoint, CacheError> {
    let checkpoint = open_entry_trusted(id, dir)?;
    let damaged = |path: &Path, why: String| CacheError::Io {
        path: path.to_owned(),
        cause: io::Error::new(io::ErrorKind::InvalidData, why),
    };
    let mut packed = Vec::new();
    for (node, entry) in checkpoint.index.nodes.iter().enumerate() {
        if let NodeKind::File {
            size,
            location,
            checksum,
        } = entry.kind
        {
            match location {
                FileLocation::Packed { offset } => packed.push((offset, size, checksum)),
                FileLocation::Own => {
                    let path = index::own_file_path(dir, node as u32);
                    let file = File::open(&path).map_err(io_err(&path))?;
                    let (len, sum) = hash_stream(file).map_err(io_err(&path))?;
                    if len != size || sum != checksum {
                        return Err(damaged(
                            &path,
                            format!("content differs from the index ({len} bytes)"),
                        ));
                    }
                }
            }
        }
    }
    packed.sort_unstable();
    let pack_path = index::pack_path(dir);
    let mut pack =
        BufReader::with_capacity(1 << 20, File::open(&pack_path).map_err(io_err(&pack_path))?);
    for (offset, size, checksum) in packed {
        pack.seek(SeekFrom::Start(offset))
            .map_err(io_err(&pack_path))?;
        let (len, sum) = hash_stream((&mut pack).take(size)).map_err(io_err(&pack_path))?;
        if len != size || sum != checksum {
            return Err(damaged(
                &pack_path,
                format!("packed file at offset {offset} differs from the index"),
            ));
        }
    }
    Ok(checkpoint)
}

fn hash_stream(mut reader: impl Read) -> io::Result<(u64, u64)> {
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok((len, hasher.digest())),
            Ok(n) => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
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
    let (mut writer, chunks) = pipe(8);
    let thread = std::thread::Builder::new()
        .name("ckptfs-download".into())
        .spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if writer.write_all(&buf[..n]).is_err() {
                            break; // the consumer is done; finish() reads the rest
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        writer.fail(io::Error::new(e.kind(), e.to_string()));
                        return reader.finish();
                    }
                }
            }
            drop(writer);
            reader.finish()
        })
        .expect("spawning a download thread");
    (chunks, thread)
}
