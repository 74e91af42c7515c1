//! One checkpoint's entry on disk: the layout the cache owns, written through the
//! indexer's [`ContentSink`], read back and re-checked after a restart.
//!
//! ```text
//! <entry>/index        the archive's Index (postcard), then its xxh3 (8 bytes, LE)
//! <entry>/pack         small files, concatenated
//! <entry>/files/<n>    large files, one each (passthrough backing files); each
//!                      also linked as a blob when it is finished ([`super::blobs`]),
//!                      or replaced by a link to the blob of the same content
//! <entry>/members      the gzip members its load inflated, and how to rebuild their
//!                      tar bytes from the files above ([`crate::members::records`]; optional)
//! ```
//!
//! Every file is 0600 in a 0700 directory. An entry is written in a private
//! `partial-*` directory ([`PendingEntry`]) that vanishes unless it is finished.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::blobs::{Blobs, ReadAt, holds_at};
use super::{CacheError, io_err, read_at};
use crate::archive::index::{ContentSink, FileLocation, Index, NodeKind};
use crate::checkpoint::CheckpointId;
use crate::members::recorder::Recorder;
use crate::members::records::{self, EntryFiles};

fn pack_path(dir: &Path) -> PathBuf {
    dir.join("pack")
}

fn files_dir(dir: &Path) -> PathBuf {
    dir.join("files")
}

fn own_file_path(dir: &Path, node: u32) -> PathBuf {
    files_dir(dir).join(node.to_string())
}

fn records_path(dir: &Path) -> PathBuf {
    dir.join("members")
}

fn index_path(dir: &Path) -> PathBuf {
    dir.join("index")
}

/// Where the entry in `dir` keeps its member records and what they point into.
pub fn files_of(dir: &Path) -> EntryFiles {
    EntryFiles {
        records: records_path(dir),
        pack: pack_path(dir),
        files: files_dir(dir),
    }
}

/// Creates a new file readable by its owner only: cached checkpoint contents are not
/// for other users of the machine, whatever their modes in the archive.
fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Bytes an entry takes on disk that no other entry shares: its pack, its index
/// (which grows with the archive's names, not with its contents), and the files of
/// its own that are not blobs (those count in the blob pool, once).
pub(super) fn size_on_disk(dir: &Path) -> u64 {
    let own: u64 = own_files(dir)
        .filter(|m| m.nlink() == 1)
        .map(|m| m.len())
        .sum();
    let pack = fs::metadata(pack_path(dir)).map_or(0, |m| m.len());
    let index = fs::metadata(index_path(dir)).map_or(0, |m| m.len());
    let members = fs::metadata(records_path(dir)).map_or(0, |m| m.len());
    own + pack + index + members
}

/// The entry's files of its own that are shared (blobs): inode, links, length.
pub(super) fn shared_files(dir: &Path) -> Vec<(u64, u64, u64)> {
    own_files(dir)
        .filter(|m| m.nlink() >= 2)
        .map(|m| (m.ino(), m.nlink(), m.len()))
        .collect()
}

fn own_files(dir: &Path) -> impl Iterator<Item = fs::Metadata> {
    let files = fs::read_dir(files_dir(dir)).into_iter().flatten().flatten();
    files.filter_map(|f| f.metadata().ok())
}

/// A checkpoint whose every byte was verified, ready to serve.
pub struct VerifiedCheckpoint {
    pub id: CheckpointId,
    pub index: Index,
    /// What the index takes in memory ([`Index::memory`]).
    pub memory: u64,
    pub provenance: Provenance,
    dir: PathBuf,
    pack: File,
}

/// Where a loaded checkpoint's verdict comes from, and when it was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Downloaded from the store and verified (length and sha256) at `verified_at`.
    Store { verified_at: SystemTime },
    /// Archived by this process at `sealed_at` and stored (the store checked the
    /// upload's sha256); served from the bytes that were archived.
    Sealed { sealed_at: SystemTime },
    /// A cache entry, made when the object was downloaded and verified at
    /// `verified_at`, whose contents were checked against the entry's index at
    /// `checked_at`. It shows that the object was good then and that the entry still
    /// holds what was verified; not that the store's copy is still intact now.
    Cache {
        verified_at: SystemTime,
        checked_at: SystemTime,
    },
}

impl VerifiedCheckpoint {
    /// Reads `len` bytes at `offset` of a packed file starting at `start` in the pack.
    pub fn read_packed(&self, start: u64, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        read_at(&self.pack, start + offset, len)
    }

    /// The pack itself, for copies made by the kernel (`copy_file_range`).
    pub fn pack(&self) -> &File {
        &self.pack
    }

    /// Opens the own file of `node` read-only.
    pub fn open_own(&self, node: u32) -> io::Result<File> {
        File::open(own_file_path(&self.dir, node))
    }
}

/// The tar bytes of the gzip members `checkpoint`'s load recorded, in order (see
/// [`records::rebuild_each`]), while it stays loaded: the entry is not held meanwhile,
/// and once it is evicted the rest is skipped. `each` says whether to go on.
pub fn member_tars(
    checkpoint: &Weak<VerifiedCheckpoint>,
    mut each: impl FnMut(&[u8]) -> bool,
) -> io::Result<u64> {
    let Some(dir) = checkpoint.upgrade().map(|c| c.dir.clone()) else {
        return Ok(0);
    };
    records::rebuild_each(&files_of(&dir), |tar| {
        checkpoint.strong_count() > 0 && each(tar)
    })
}

/// A cache entry being written; removed unless finished. The indexer writes file
/// contents into it as a [`ContentSink`].
pub struct PendingEntry {
    dir: Option<PathBuf>,
    pack: BufWriter<File>,
    pack_len: u64,
    blobs: Arc<Blobs>,
    /// The files of its own written so far, with the SHA-256 of their bytes and
    /// whether they are already linked to their blob.
    own: Vec<(u32, [u8; 32], bool)>,
    /// Records the members of the archive being indexed, when it comes from one.
    members: Option<Arc<Mutex<Recorder>>>,
    /// The SHA-256 of the next file of its own, when its bytes are known to be a
    /// whole file of an entry whose digest was recorded (see [`records`]).
    known_digest: Option<(u32, [u8; 32])>,
    /// The size the next file's tar header gives, a hint of which blob may hold it.
    next_size: Option<(u32, u64)>,
}

impl PendingEntry {
    pub(super) fn create(dir: PathBuf, blobs: Arc<Blobs>) -> Result<Self, CacheError> {
        DirBuilder::new()
            .mode(0o700)
            .create(files_dir(&dir))
            .map_err(io_err(&dir))?;
        let pack = create_private(&pack_path(&dir)).map_err(io_err(&dir))?;
        Ok(PendingEntry {
            dir: Some(dir),
            pack: BufWriter::with_capacity(1 << 20, pack),
            pack_len: 0,
            blobs,
            own: Vec::new(),
            members: None,
            known_digest: None,
            next_size: None,
        })
    }

    /// Records the archive's members as it is indexed, written with the entry.
    pub(crate) fn record_members(&mut self, recorder: Arc<Mutex<Recorder>>) {
        self.members = Some(recorder);
    }

    fn dir(&self) -> &Path {
        self.dir
            .as_deref()
            .expect("a pending entry has its directory until finished")
    }

    /// Writes the index and makes the entry `final_dir`, atomically.
    pub(super) fn finish(
        mut self,
        id: &CheckpointId,
        index: Index,
        final_dir: &Path,
        provenance: Provenance,
    ) -> Result<VerifiedCheckpoint, CacheError> {
        let dir = self.dir().to_owned();
        self.pack.flush().map_err(io_err(&dir))?;
        let own = std::mem::take(&mut self.own);
        for &(node, digest, linked) in &own {
            if !linked {
                self.blobs.share(&own_file_path(&dir, node), &digest);
            }
        }
        if let Some(recorder) = self.members.take() {
            let digests = own
                .iter()
                .map(|&(node, digest, _)| (node, digest))
                .collect();
            let records = recorder
                .lock()
                .expect("member recorder lock")
                .finish(&index, &digests);
            let path = records_path(&dir);
            // Only a hint for later loads: without it, they inflate everything.
            if let Err(e) = records::write_records(&path, &records) {
                tracing::warn!(path = %path.display(), error = %e, "could not record members");
                let _ = fs::remove_file(&path);
            }
        }
        write_index(&dir, &index)?;
        fs::rename(&dir, final_dir).map_err(io_err(final_dir))?;
        self.dir = None;
        // Served from the index in hand: reading it back would hold two copies.
        let mut checkpoint = entry_with_index(id, final_dir, index)?;
        checkpoint.provenance = provenance;
        Ok(checkpoint)
    }
}

impl ContentSink for PendingEntry {
    fn pack(&mut self, data: &[u8]) -> io::Result<u64> {
        let offset = self.pack_len;
        self.pack.write_all(data)?;
        self.pack_len += data.len() as u64;
        Ok(offset)
    }

    fn contents_at(&mut self, node: u32, offset: u64, len: u64) {
        self.next_size = Some((node, len));
        if let Some(recorder) = &self.members {
            let mut recorder = recorder.lock().expect("member recorder lock");
            recorder.contents_at(node, offset, len);
            self.known_digest = recorder.digest_of(offset, len).map(|d| (node, d));
        }
    }

    fn own_file(&mut self, node: u32) -> io::Result<Box<dyn Write + '_>> {
        let known = self.known_digest.take().filter(|&(n, _)| n == node);
        let size = self.next_size.take().filter(|&(n, _)| n == node);
        Ok(Box::new(OwnFile {
            path: own_file_path(self.dir(), node),
            sink: OwnSink::Memory(Vec::new()),
            hasher: Sha256::new(),
            known: known.map(|(_, digest)| digest),
            size: size.map(|(_, size)| size),
            node,
            blobs: &self.blobs,
            done: &mut self.own,
        }))
    }
}

/// Files up to this size are held in memory until they are complete: one whose blob
/// is already in the pool is then linked to it, without a new file being written.
const LINK_IN_MEMORY: usize = 1 << 20;

enum OwnSink {
    Memory(Vec<u8>),
    /// Larger than is held in memory, and a blob (`name`) began with the same bytes:
    /// compared with that blob (and hashed) as the bytes come, `at` of them so far,
    /// and nothing written while they match. Writing a file into new page-cache pages
    /// can cost more than the rest of a load that rebuilds it (BENCHMARKS.md section
    /// 6), and the next turn mostly holds the same large files.
    Comparing {
        blob: File,
        at: u64,
        name: [u8; 32],
    },
    File(BufWriter<File>),
    /// Linked to the blob of its content.
    Linked,
}

/// A file of its own being written, hashed on the way for [`Blobs`]. Once flushed,
/// it is either a link to the blob of the same content or a file listed for sharing
/// (when dropped); a file whose writing failed is never shared, since the whole entry
/// is then discarded.
struct OwnFile<'a> {
    path: PathBuf,
    sink: OwnSink,
    hasher: Sha256,
    /// The digest of the bytes to come, known from the record of the entry they were
    /// rebuilt from: then they are not hashed again.
    known: Option<[u8; 32]>,
    /// The size its tar header gives (a hint: see [`OwnFile::blob_to_compare`]).
    size: Option<u64>,
    node: u32,
    blobs: &'a Blobs,
    done: &'a mut Vec<(u32, [u8; 32], bool)>,
}

impl OwnFile<'_> {
    /// Stops relying on the recorded digest: hashes what was held instead.
    fn distrust(&mut self, held: &[u8]) {
        if self.known.take().is_some() {
            self.hasher = Sha256::new();
            self.hasher.update(held);
        }
    }

    fn digest(&self) -> [u8; 32] {
        self.known
            .unwrap_or_else(|| self.hasher.clone().finalize().into())
    }
}

impl OwnFile<'_> {
    fn spill(&mut self, data: &[u8]) -> io::Result<()> {
        let mut file = BufWriter::with_capacity(256 * 1024, create_private(&self.path)?);
        file.write_all(data)?;
        self.sink = OwnSink::File(file);
        Ok(())
    }

    /// A blob that begins with `held`, and its name: the blob of the recorded
    /// digest, else one of the size the tar header gives. Either is only a candidate:
    /// the file is linked to it only if every byte matches and they hash to its name.
    fn blob_to_compare(&self, held: &[u8]) -> io::Result<Option<(File, [u8; 32])>> {
        let by_size = self
            .size
            .map(|size| self.blobs.of_size(size))
            .unwrap_or_default();
        for name in self.known.into_iter().chain(by_size) {
            let Some(blob) = self.blobs.open_blob(&name)? else {
                continue;
            };
            if holds_at(&blob, 0, held)? {
                return Ok(Some((blob, name)));
            }
        }
        Ok(None)
    }

    /// The bytes so far matched the blob, but the file is not the blob: writes them
    /// into the file of its own, from the blob, and goes on writing there. The
    /// hasher has hashed them all as they came.
    fn stop_comparing(&mut self) -> io::Result<()> {
        let OwnSink::Comparing { blob, at, .. } =
            std::mem::replace(&mut self.sink, OwnSink::Linked)
        else {
            unreachable!("only a file being compared stops comparing");
        };
        let mut file = BufWriter::with_capacity(256 * 1024, create_private(&self.path)?);
        let copied = io::copy(&mut ReadAt { file: &blob, at: 0 }.take(at), &mut file)?;
        if copied != at {
            return Err(io::Error::other("a blob shrank while it was compared"));
        }
        self.known = None;
        self.sink = OwnSink::File(file);
        Ok(())
    }
}

impl Write for OwnFile<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.sink {
            OwnSink::Memory(held) if held.len() + data.len() <= LINK_IN_MEMORY => {
                held.extend_from_slice(data);
            }
            OwnSink::Memory(held) => {
                let held = std::mem::take(held);
                if let Some((blob, name)) = self.blob_to_compare(&held)? {
                    self.hasher = Sha256::new();
                    self.hasher.update(&held);
                    let at = held.len() as u64;
                    self.sink = OwnSink::Comparing { blob, at, name };
                    return self.write(data);
                }
                self.distrust(&held);
                self.spill(&held)?;
                return self.write(data);
            }
            OwnSink::Comparing { blob, at, .. } => {
                if holds_at(blob, *at, data)? {
                    *at += data.len() as u64;
                    self.hasher.update(data);
                    return Ok(data.len());
                }
                self.stop_comparing()?;
                return self.write(data);
            }
            OwnSink::File(file) => {
                let n = file.write(data)?;
                self.hasher.update(&data[..n]);
                return Ok(n);
            }
            OwnSink::Linked => return Err(io::Error::other("written after it was complete")),
        }
        if self.known.is_none() {
            self.hasher.update(data);
        }
        Ok(data.len())
    }

    /// Completes the file: called once, after its last byte.
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            OwnSink::File(file) => file.flush(),
            OwnSink::Comparing { blob, at, name } => {
                // Linked only if the blob ends here too and the bytes hashed to its
                // name.
                let digest: [u8; 32] = self.hasher.clone().finalize().into();
                if blob.metadata()?.len() == *at
                    && digest == *name
                    && self.blobs.link_compared(blob, &digest, &self.path)?
                {
                    self.known = Some(digest);
                    self.sink = OwnSink::Linked;
                    return Ok(());
                }
                self.stop_comparing()?;
                self.flush()
            }
            OwnSink::Memory(held) => {
                let held = std::mem::take(held);
                let (digest, hashed) = (self.digest(), self.known.is_none());
                if self
                    .blobs
                    .link_existing(&digest, &held, hashed, &self.path)?
                {
                    self.sink = OwnSink::Linked;
                    return Ok(());
                }
                // Not linked: the file is kept, and its blob made of it, under the
                // digest of its bytes, hashed (a recorded one is only trusted to find
                // a blob that holds exactly these bytes).
                if self.known.is_some() {
                    self.distrust(&held);
                    let digest = self.digest();
                    if self.blobs.link_existing(&digest, &held, true, &self.path)? {
                        self.sink = OwnSink::Linked;
                        return Ok(());
                    }
                }
                self.spill(&held)?;
                self.flush()
            }
            OwnSink::Linked => Ok(()),
        }
    }
}

impl Drop for OwnFile<'_> {
    fn drop(&mut self) {
        let linked = match self.sink {
            OwnSink::File(_) => false,
            OwnSink::Linked => true,
            // Never completed: the entry is discarded.
            OwnSink::Memory(_) | OwnSink::Comparing { .. } => return,
        };
        let digest = self.digest();
        self.done.push((self.node, digest, linked));
    }
}

impl Drop for PendingEntry {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

fn write_index(dir: &Path, index: &Index) -> Result<(), CacheError> {
    let bytes = postcard::to_stdvec(index).map_err(|e| CacheError::Io {
        path: index_path(dir),
        cause: io::Error::other(e),
    })?;
    let tmp = dir.join("index.tmp");
    let mut file = create_private(&tmp).map_err(io_err(&tmp))?;
    file.write_all(&bytes)
        .and_then(|()| file.write_all(&xxh3_64(&bytes).to_le_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(io_err(&tmp))?;
    fs::rename(&tmp, index_path(dir)).map_err(io_err(dir))
}

fn read_index(dir: &Path) -> Result<Index, CacheError> {
    let path = index_path(dir);
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

fn entry_with_index(
    id: &CheckpointId,
    dir: &Path,
    index: Index,
) -> Result<VerifiedCheckpoint, CacheError> {
    let pack_path = pack_path(dir);
    let pack = File::open(&pack_path).map_err(io_err(&pack_path))?;
    Ok(VerifiedCheckpoint {
        id: id.clone(),
        memory: index.memory(),
        index,
        provenance: Provenance::Store {
            verified_at: SystemTime::now(),
        },
        dir: dir.to_owned(),
        pack,
    })
}

/// Opens an entry found on disk, checking every byte against the index first.
pub(super) fn open_checked(
    id: &CheckpointId,
    dir: &Path,
) -> Result<VerifiedCheckpoint, CacheError> {
    let mut checkpoint = entry_with_index(id, dir, read_index(dir)?)?;
    // The index is written once, right after the object verified: its time is the
    // verdict's.
    let index_path = index_path(dir);
    let verified_at = fs::metadata(&index_path)
        .and_then(|m| m.modified())
        .map_err(io_err(&index_path))?;
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
                    let path = own_file_path(dir, node as u32);
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
    let pack_path = pack_path(dir);
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
    checkpoint.provenance = Provenance::Cache {
        verified_at,
        checked_at: SystemTime::now(),
    };
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
