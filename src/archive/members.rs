//! Compressed gzip members kept on disk between captures, so that a capture
//! compresses only what it has not compressed before (see [`super::gz`], whose member
//! cuts do not move when the tree changes elsewhere).
//!
//! Layout: `DIR/v1/<sha256 of the member's uncompressed bytes>`, each file one gzip
//! member exactly as [`super::gz`] writes it. `v1` names the encoder (flate2 with
//! zlib-rs, level 6, header mtime 0, OS Unix): another encoder would give other bytes,
//! and so other digests, for the same tree.
//!
//! Invariants:
//! - a member is used only after it was inflated and found equal, byte for byte, to
//!   the data it stands for: a damaged or planted file is deleted and the data
//!   compressed again, so the cache can change how fast a capture is, never what it
//!   holds;
//! - files appear by an atomic rename, so that captures running at once (a mount's
//!   seals, `put`) can share the directory;
//! - [`MemberCache::trim`] keeps the total under the configured size, removing the
//!   members used least recently first (each use sets the file's mtime).

use std::fs::{self, DirBuilder};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// Counts of one capture, or of a mount's life.
#[derive(Debug, Default)]
pub struct MemberStats {
    /// Members taken from the cache.
    pub reused: AtomicU64,
    /// Members compressed (not in the cache, or found damaged there).
    pub compressed: AtomicU64,
    /// Uncompressed bytes of the reused members.
    pub reused_bytes: AtomicU64,
    /// Cached members that did not inflate to their data, deleted.
    pub damaged: AtomicU64,
}

pub struct MemberCache {
    dir: PathBuf,
    limit: u64,
    pub stats: MemberStats,
}

impl MemberCache {
    /// Opens (creating it 0700) the member cache under `dir`, bounded by `limit` bytes.
    pub fn open(dir: &Path, limit: u64) -> io::Result<MemberCache> {
        let dir = dir.join("v1");
        DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(MemberCache {
            dir,
            limit,
            stats: MemberStats::default(),
        })
    }

    fn path(&self, data: &[u8]) -> PathBuf {
        self.dir.join(hex::encode(Sha256::digest(data)))
    }

    /// The compressed member for `data`, or compresses it with `compress` and keeps
    /// the result. An error of the cache itself is logged and treated as a miss.
    pub fn get_or_compress(
        &self,
        data: &[u8],
        compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
    ) -> io::Result<Vec<u8>> {
        let path = self.path(data);
        if let Some(member) = self.lookup(&path, data) {
            self.stats.reused.fetch_add(1, Ordering::Relaxed);
            self.stats
                .reused_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(member);
        }
        let member = compress(data)?;
        self.stats.compressed.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.keep(&path, &member) {
            tracing::debug!(path = %path.display(), error = %e, "cannot keep a compressed member");
        }
        Ok(member)
    }

    fn lookup(&self, path: &Path, data: &[u8]) -> Option<Vec<u8>> {
        let mut file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot read a cached member");
                return None;
            }
        };
        let mut member = Vec::new();
        // A member is at most its data plus deflate's worst case and the gzip framing.
        let most = data.len() as u64 + data.len() as u64 / 1000 + 1024;
        if (&mut file).take(most + 1).read_to_end(&mut member).is_err()
            || member.len() as u64 > most
            || !inflates_to(&member, data)
        {
            self.stats.damaged.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(path = %path.display(), "a cached gzip member is damaged; compressing again");
            let _ = fs::remove_file(path);
            return None;
        }
        // Least recently used goes first in `trim`.
        let _ = file.set_modified(SystemTime::now());
        Some(member)
    }

    fn keep(&self, path: &Path, member: &[u8]) -> io::Result<()> {
        let mut temp = tempfile::Builder::new()
            .prefix(".partial-")
            .tempfile_in(&self.dir)?;
        temp.write_all(member)?;
        temp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }

    /// Removes the least recently used members until the total is within the limit.
    pub fn trim(&self) -> io::Result<()> {
        let mut files = Vec::new();
        let mut total = 0u64;
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            total += meta.len();
            files.push((
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
                entry.path(),
            ));
        }
        if total <= self.limit {
            return Ok(());
        }
        files.sort();
        for (_, len, path) in files {
            if total <= self.limit {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
        Ok(())
    }
}

/// Whether `member` is one gzip member, with nothing after it, of exactly `data`.
fn inflates_to(member: &[u8], data: &[u8]) -> bool {
    let mut decoder = flate2::bufread::GzDecoder::new(member);
    let mut expected = data;
    let mut buf = [0u8; 64 << 10];
    loop {
        match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if expected.len() < n || expected[..n] != buf[..n] {
                    return false;
                }
                expected = &expected[n..];
            }
            Err(_) => return false,
        }
    }
    expected.is_empty() && decoder.into_inner().is_empty()
}
