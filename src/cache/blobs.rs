//! Files of their own shared by content between cache entries.
//!
//! `blobs/<sha256>` is one more hard link to a file of its own of some entry, named by
//! the SHA-256 of its bytes, hashed as the entry was written from a verified stream.
//! A new entry whose file has the same digest links that blob in its place instead of
//! keeping its own copy, so that turns that share most of their files hold them on
//! disk once. The kernel counts the references: a blob whose link count fell to 1 is
//! used by no entry, and [`Blobs::collect`] deletes it. A file too large to be held in
//! memory finds its candidate blob by size ([`Blobs::of_size`]) and is compared with it
//! as it is written ([`Blobs::link_compared`]), so that the next turn's unchanged large
//! files are not written again.
//!
//! Invariants:
//! - a blob is linked into an entry only if this process wrote it or found it equal,
//!   byte for byte, to the new file (whose bytes hashed to the blob's name), so a blob damaged on disk is replaced, never spread to a new entry
//!   (entries found after a restart are checked file by file anyway). Within the
//!   daemon's life, what it wrote into its private cache is trusted, as its entries
//!   are; the digests it trusts are kept in memory, 32 bytes per blob;
//! - bytes are counted once: [`Blobs::bytes`] is the pool, and an entry's own size
//!   counts only the files nothing shares (link count 1);
//! - sharing and collecting hold one lock, so a blob is never deleted between the check
//!   of its link count and a new link to it.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::archive::fill;

pub struct Blobs {
    dir: PathBuf,
    /// The blobs whose bytes this process wrote or compared; held while linking to a
    /// blob and while deleting unused ones.
    trusted: Mutex<HashSet<[u8; 32]>>,
    bytes: AtomicU64,
    /// Bytes of files linked by [`Blobs::link_compared`]: never written.
    compared: AtomicU64,
    /// The blobs' digests by their size, where a file too large to be held in memory
    /// looks for one that may hold its bytes ([`Blobs::of_size`]). Only a hint: what
    /// is linked is compared first.
    by_size: Mutex<HashMap<u64, Vec<[u8; 32]>>>,
}

impl Blobs {
    /// Opens the pool in `dir` (a private directory), deleting blobs no entry uses.
    pub fn open(dir: PathBuf) -> io::Result<Blobs> {
        let blobs = Blobs {
            dir,
            trusted: Mutex::new(HashSet::new()),
            bytes: AtomicU64::new(0),
            compared: AtomicU64::new(0),
            by_size: Mutex::new(HashMap::new()),
        };
        blobs.collect();
        Ok(blobs)
    }

    /// Bytes of the blobs, each counted once however many entries use it.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Up to four blobs of `size` bytes, the newest first.
    pub fn of_size(&self, size: u64) -> Vec<[u8; 32]> {
        let by_size = self.by_size.lock().expect("blobs by size lock");
        by_size
            .get(&size)
            .map(|digests| digests.iter().rev().take(4).copied().collect())
            .unwrap_or_default()
    }

    fn add_size(&self, size: u64, digest: &[u8; 32]) {
        let mut by_size = self.by_size.lock().expect("blobs by size lock");
        let digests = by_size.entry(size).or_default();
        if !digests.contains(digest) {
            digests.push(*digest);
        }
    }

    /// Bytes of the files linked to a blob they were compared with, unwritten.
    pub fn compared_bytes(&self) -> u64 {
        self.compared.load(Ordering::Relaxed)
    }

    /// Shares `file` (just written, whose bytes hash to `digest`): it becomes the
    /// blob of its content, or is replaced by a link to the blob already there. On
    /// any error the file stays as it is, unshared.
    pub fn share(&self, file: &Path, digest: &[u8; 32]) {
        if let Err(e) = self.try_share(file, digest) {
            tracing::debug!(path = %file.display(), error = %e, "keeping a cached file unshared");
        }
    }

    /// Links the blob of `data` as `dest`, if the pool has it intact; false if not
    /// (then nothing was done). `digest` is the SHA-256 of `data` if `hashed`; else
    /// only a name to look for, and the blob is compared with `data` even if trusted.
    pub fn link_existing(
        &self,
        digest: &[u8; 32],
        data: &[u8],
        hashed: bool,
        dest: &Path,
    ) -> io::Result<bool> {
        let blob = self.dir.join(hex::encode(digest));
        // Held until linked, so that `collect` cannot delete the blob in between.
        let mut trusted = self.trusted.lock().expect("blobs lock");
        let meta = match fs::symlink_metadata(&blob) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if !meta.file_type().is_file() || meta.len() != data.len() as u64 {
            return Ok(false);
        }
        if !(hashed && trusted.contains(digest)) {
            if !holds(&blob, data)? {
                return Ok(false); // damaged: `share` replaces it when the file is written
            }
            if hashed {
                trusted.insert(*digest);
            }
        }
        fs::hard_link(&blob, dest)?;
        Ok(true)
    }

    /// The blob named `digest`, opened for reading if it is a regular file: a file
    /// larger than can be held in memory is compared with it as its bytes come
    /// ([`Self::link_compared`]).
    pub fn open_blob(&self, digest: &[u8; 32]) -> io::Result<Option<File>> {
        use std::os::unix::fs::OpenOptionsExt;
        let blob = self.dir.join(hex::encode(digest));
        let file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&blob)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(file.metadata()?.file_type().is_file().then_some(file))
    }

    /// Links `blob` (from [`Self::open_blob`]), whose bytes were found equal to a new
    /// file's, every one, and hashed to `digest`, as `dest`: by its descriptor, so
    /// that the very file compared is linked. False if it cannot be (deleted since by
    /// [`Self::collect`], no `/proc`): the caller then writes the file.
    pub fn link_compared(&self, blob: &File, digest: &[u8; 32], dest: &Path) -> io::Result<bool> {
        let mut trusted = self.trusted.lock().expect("blobs lock");
        if !crate::beneath::link_opened(blob, dest)? {
            return Ok(false);
        }
        trusted.insert(*digest);
        self.compared
            .fetch_add(blob.metadata()?.len(), Ordering::Relaxed);
        Ok(true)
    }

    fn try_share(&self, file: &Path, digest: &[u8; 32]) -> io::Result<()> {
        let blob = self.dir.join(hex::encode(digest));
        let len = fs::symlink_metadata(file)?.len();
        let mut trusted = self.trusted.lock().expect("blobs lock");
        match fs::hard_link(file, &blob) {
            Ok(()) => {
                self.bytes.fetch_add(len, Ordering::Relaxed);
                trusted.insert(*digest);
                self.add_size(len, digest);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = fs::symlink_metadata(&blob)?;
        let good = meta.file_type().is_file()
            && meta.len() == len
            && (trusted.contains(digest) || same_bytes(&blob, file)?);
        if !good {
            tracing::warn!(blob = %blob.display(), "a shared cache file is damaged; replacing it");
            fs::remove_file(&blob)?;
            self.bytes
                .fetch_sub(meta.len().min(self.bytes()), Ordering::Relaxed);
            fs::hard_link(file, &blob)?;
            self.bytes.fetch_add(len, Ordering::Relaxed);
            trusted.insert(*digest);
            self.add_size(len, digest);
            return Ok(());
        }
        trusted.insert(*digest);
        let temp = file.with_extension("shared");
        fs::hard_link(&blob, &temp)?;
        fs::rename(&temp, file).inspect_err(|_| {
            let _ = fs::remove_file(&temp);
        })
    }

    /// Deletes the blobs no entry links any more, and recounts the pool.
    pub fn collect(&self) {
        let mut trusted = self.trusted.lock().expect("blobs lock");
        let mut total = 0;
        let Ok(listing) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut by_size: HashMap<u64, Vec<[u8; 32]>> = HashMap::new();
        for item in listing.flatten() {
            let Ok(meta) = item.metadata() else { continue };
            if !meta.file_type().is_file() {
                continue;
            }
            if meta.nlink() > 1 {
                total += meta.len();
                if let Some(digest) = digest_of_name(&item.file_name()) {
                    by_size.entry(meta.len()).or_default().push(digest);
                }
                continue;
            }
            if let Some(digest) = digest_of_name(&item.file_name()) {
                trusted.remove(&digest);
            }
            if let Err(e) = fs::remove_file(item.path()) {
                tracing::warn!(path = %item.path().display(), error = %e, "cannot delete an unused shared file");
            }
        }
        self.bytes.store(total, Ordering::Relaxed);
        *self.by_size.lock().expect("blobs by size lock") = by_size;
    }
}

fn digest_of_name(name: &std::ffi::OsStr) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(name.to_str()?, &mut digest).ok()?;
    Some(digest)
}

/// Whether the two files hold the same bytes. The new file's bytes hashed to the
/// blob's name as they were written, so this proves the blob still holds them,
/// without hashing it again.
fn same_bytes(a: &Path, b: &Path) -> io::Result<bool> {
    same_contents(File::open(a)?, File::open(b)?)
}

/// Whether two readers give the same bytes, read to the end of the shorter.
pub(crate) fn same_contents(mut a: impl Read, mut b: impl Read) -> io::Result<bool> {
    // On the stack: zeroed fresh heap buffers cost more than the comparison.
    let (mut x, mut y) = ([0u8; 64 << 10], [0u8; 64 << 10]);
    loop {
        let n = fill(&mut a, &mut x)?;
        if n != fill(&mut b, &mut y)? || x[..n] != y[..n] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Whether the file at `path` holds exactly `data`.
fn holds(path: &Path, data: &[u8]) -> io::Result<bool> {
    let file = File::open(path)?;
    Ok(file.metadata()?.len() == data.len() as u64 && holds_at(&file, 0, data)?)
}

/// Whether `file` holds `data` at offset `at`.
pub(super) fn holds_at(file: &File, at: u64, data: &[u8]) -> io::Result<bool> {
    let mut buf = [0u8; 64 << 10];
    let mut reader = ReadAt { file, at };
    for expected in data.chunks(buf.len()) {
        let got = &mut buf[..expected.len()];
        match reader.read_exact(got) {
            Ok(()) if got == expected => {}
            Ok(()) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads a file from offset `at` on with `pread`, whatever its descriptor's offset.
pub(super) struct ReadAt<'a> {
    pub file: &'a File,
    pub at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
