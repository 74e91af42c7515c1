//! Compressed gzip members kept on disk between captures, so that a capture
//! compresses only what it has not compressed before (see [`crate::archive::gz`], whose member
//! cuts do not move when the tree changes elsewhere).
//!
//! Layout: `DIR/<encoder>/<sha256 of the member's uncompressed bytes>`, each file one
//! gzip member exactly as [`crate::archive::gz`] writes it. `<encoder>` names the compressor by
//! what it produces (`v1-` and a hash of the member it makes of a fixed probe): a
//! flate2 or zlib-rs update that compresses differently starts a directory of its
//! own instead of mixing two encodings, which would give one tree two digests.
//!
//! Invariants:
//! - a member is used only after it was inflated and found equal, byte for byte, to
//!   the data it stands for, with exactly the gzip header [`crate::archive::gz`] writes, or
//!   when its bytes have the SHA-256 of a member this process itself compressed or so
//!   checked for that data (kept in memory, never taken from disk): a damaged or
//!   planted file is deleted and the data compressed again, so the cache changes how
//!   fast a capture is, never what it writes;
//! - everything is done through descriptors of directories checked once to be real
//!   directories of the daemon's user, not writable by others: no symlink or rename
//!   in the path can point a lookup, a write or a removal anywhere else, and only
//!   regular files of that user are read (a FIFO planted there cannot block);
//! - files appear by an atomic rename, so that captures running at once (a mount's
//!   seals, `put`) can share the directory;
//! - the bytes on disk stay near the configured size: members smaller than
//!   [`MIN_KEPT`] are not kept (compressing them again is cheap, and their count would
//!   cost inodes), disk blocks are what is counted, and [`MemberCache::trim`] runs
//!   whenever a capture has kept half the limit since the last trim, and at the end of
//!   every capture, also one that failed.
//!
//! `DIR/<encoder>/layouts/<object>` records which members (by the SHA-256 of their
//! compressed bytes) an object is made of, for the last [`LAYOUTS_KEPT`] objects that
//! a capture here stored or a mount here downloaded and verified (so that a replica
//! that only opened turn N still has the store copy from it when it seals turn N+1):
//! where a new archive's members sit in an object the store already holds, the store
//! can copy them instead of receiving them ([`MemberCache::reuse`]). A layout is only
//! a hint: the store checks every copied range against the new archive's own bytes,
//! so a stale or planted layout costs a fallback to a full upload, never a wrong
//! object.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use lru::LruCache;
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::archive::gz::{Compressed, MemberSource, MemberSpan, compress_member};

/// Compressed members smaller than this are not kept.
pub const MIN_KEPT: usize = 4 << 10;
/// Layouts kept: those of the objects stored last, whose ranges a new capture may
/// copy in the store.
pub const LAYOUTS_KEPT: usize = 8;
/// The first line of a layout file; then one record per member: the SHA-256 of its
/// compressed bytes and their length (little-endian u64).
const LAYOUT_MAGIC: &[u8] = b"ckptfs layout v1\n";
const LAYOUT_RECORD: usize = 40;
/// A layout larger than this is not read (an archive of a GiB has some thousands of
/// members).
const MAX_LAYOUT: u64 = 16 << 20;
/// Members whose compressed digest this process remembers (64 bytes each, plus the
/// map's own): those of several archives of a GiB.
const KNOWN_MEMBERS: usize = 16_384;

/// What [`MemberCache::prime`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primed {
    /// The member was there.
    Present,
    Compressed,
    /// Half the limit was kept since the last trim: priming should stop.
    Full,
}

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
    /// Cached members inflated to check them, also by priming (the others had the
    /// digest of a member this process had compressed or checked already).
    pub inflated: AtomicU64,
}

impl MemberStats {
    /// (reused, compressed, reused_bytes), for logs.
    pub fn counts(&self) -> (u64, u64, u64) {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        (
            load(&self.reused),
            load(&self.compressed),
            load(&self.reused_bytes),
        )
    }
}

pub struct MemberCache {
    /// The encoder's directory.
    dir: OwnedFd,
    /// The gzip header every member of this encoder starts with.
    header: [u8; 10],
    limit: u64,
    /// Bytes kept since the last trim.
    kept: AtomicU64,
    /// One trim at a time.
    trimming: Mutex<()>,
    /// By the SHA-256 of a member's data, the SHA-256 of the compressed bytes this
    /// process made of it or found to inflate to it: a file with those bytes needs no
    /// inflating. Filled only from this process's own work, so nothing planted on disk
    /// can vouch for itself.
    known: Mutex<LruCache<[u8; 32], [u8; 32]>>,
    pub stats: MemberStats,
}

fn os(e: rustix::io::Errno) -> io::Error {
    e.into()
}

/// What a tree's records keep to find damage to a member or to its record: the
/// xxh3-128 of the member's bytes, its key and the SHA-256 of its bytes (so that a
/// damaged key or digest in the record is found too), far cheaper than hashing the
/// member again with SHA-256.
pub(super) fn member_check(member: &[u8], key: &[u8; 32], digest: &[u8; 32]) -> u128 {
    let mut all = [0u8; 80];
    all[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(member).to_le_bytes());
    all[16..48].copy_from_slice(key);
    all[48..].copy_from_slice(digest);
    xxhash_rust::xxh3::xxh3_128(&all)
}

/// Opens (making it, 0700) the directory `name` of `parent` without following a
/// symlink, and checks that it belongs to this user and nobody else can write in it.
fn private_dir_at(parent: impl AsFd, name: &str) -> io::Result<OwnedFd> {
    match rfs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(os(e)),
    }
    let dir = crate::beneath::open_dir(&parent, OsStr::new(name))?;
    check_private(&dir, name)?;
    Ok(dir)
}

fn check_private(fd: impl AsFd, what: &str) -> io::Result<()> {
    let stat = rfs::fstat(fd).map_err(os)?;
    if stat.st_uid != rustix::process::geteuid().as_raw() || stat.st_mode & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{what} belongs to another user or others may write in it"),
        ));
    }
    Ok(())
}

impl MemberCache {
    /// Opens (creating it) the member cache under `dir`, bounded by `limit` bytes of
    /// disk. `dir` itself is the caller's (`CACHE_DIR/members`, whose parent was made
    /// private); it is opened once, and everything below it by descriptor.
    pub fn open(dir: &Path, limit: u64) -> io::Result<MemberCache> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        let name = dir
            .file_name()
            .and_then(OsStr::to_str)
            .ok_or_else(|| io::Error::other("the member cache needs a directory name"))?;
        let parent = rfs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)?;
        check_private(&parent, "the cache directory")?;
        let members = private_dir_at(&parent, name)?;
        let probe = compress_member(PROBE)?;
        let encoder = format!("v1-{}", &hex::encode(Sha256::digest(&probe))[..16]);
        let dir = private_dir_at(&members, &encoder)?;
        let mut header = [0u8; 10];
        header.copy_from_slice(&probe[..10]);
        Ok(MemberCache {
            dir,
            header,
            limit,
            kept: AtomicU64::new(0),
            trimming: Mutex::new(()),
            known: Mutex::new(LruCache::new(
                NonZeroUsize::new(KNOWN_MEMBERS).expect("a non-zero bound"),
            )),
            stats: MemberStats::default(),
        })
    }

    /// The compressed member for `data` and the SHA-256 of its bytes, or compresses
    /// it with `compress` and keeps the result. An error of the cache itself is logged
    /// and treated as a miss.
    pub fn get_or_compress(
        &self,
        data: &[u8],
        compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
    ) -> io::Result<(Vec<u8>, [u8; 32])> {
        self.get_or_compress_keyed(data, compress)
            .map(|m| (m.bytes, m.digest))
    }

    /// [`MemberCache::get_or_compress`], also giving the SHA-256 of `data`.
    pub fn get_or_compress_keyed(
        &self,
        data: &[u8],
        compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
    ) -> io::Result<Compressed> {
        let key: [u8; 32] = Sha256::digest(data).into();
        let name = hex::encode(key);
        if let Some((bytes, digest)) = self.lookup(&name, &key, data) {
            self.stats.reused.fetch_add(1, Ordering::Relaxed);
            self.stats
                .reused_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(Compressed { bytes, digest, key });
        }
        let member = compress(data)?;
        let digest: [u8; 32] = Sha256::digest(&member).into();
        self.stats.compressed.fetch_add(1, Ordering::Relaxed);
        if member.len() >= MIN_KEPT {
            match self.keep(&name, &member) {
                Ok(()) => self.remember(key, digest),
                Err(e) => {
                    tracing::debug!(member = %name, error = %e, "cannot keep a compressed member")
                }
            }
        }
        Ok(Compressed {
            bytes: member,
            digest,
            key,
        })
    }

    /// The member kept for the data whose SHA-256 is `key`, if its bytes are `length`
    /// long and give `check` with `key` and `digest` ([`member_check`]: what a tree's
    /// records say it was when it was made or checked, see `super::tree`): the records
    /// vouch for it, so it is not inflated. A file that does not match is deleted.
    pub fn recorded(
        &self,
        key: &[u8; 32],
        digest: &[u8; 32],
        length: u64,
        check: u128,
    ) -> Option<Vec<u8>> {
        let name = hex::encode(key);
        let mut file = self.open_member(&name)?;
        let mut member = Vec::with_capacity(length as usize);
        if (&mut file)
            .take(length + 1)
            .read_to_end(&mut member)
            .is_err()
            || member.len() as u64 != length
            || member_check(&member, key, digest) != check
        {
            return self.damaged(&name, "does not have its recorded length and checksum");
        }
        let _ = file.set_modified(SystemTime::now());
        Some(member)
    }

    /// Opens the member file `name`, if it is a regular file of this user.
    fn open_member(&self, name: &str) -> Option<File> {
        // NONBLOCK: a FIFO planted under the name must not block the open.
        let fd = match rfs::openat(
            &self.dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return None,
            Err(e) => return self.damaged(name, &format!("cannot open: {e}")),
        };
        let stat = match rfs::fstat(&fd) {
            Ok(stat) => stat,
            Err(e) => return self.damaged(name, &format!("cannot stat: {e}")),
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || stat.st_uid != rustix::process::geteuid().as_raw()
        {
            return self.damaged(name, "not a regular file of this user");
        }
        Some(File::from(fd))
    }

    /// The cached member `name` (the hex of `key`, the SHA-256 of `data`) and the
    /// SHA-256 of its bytes, if it is there and holds exactly `data`.
    fn lookup(&self, name: &str, key: &[u8; 32], data: &[u8]) -> Option<(Vec<u8>, [u8; 32])> {
        let mut file = self.open_member(name)?;
        let mut member = Vec::new();
        // A member is at most its data plus deflate's worst case and the gzip framing.
        let most = data.len() as u64 + data.len() as u64 / 1000 + 1024;
        if (&mut file).take(most + 1).read_to_end(&mut member).is_err()
            || member.len() as u64 > most
            || !member.starts_with(&self.header)
        {
            return self.damaged(name, "does not inflate to its data");
        }
        // The bytes just read are the ones checked and used: no file can change them
        // in between.
        let digest: [u8; 32] = Sha256::digest(&member).into();
        let known = self.known.lock().expect("known lock").get(key) == Some(&digest);
        if !known {
            self.stats.inflated.fetch_add(1, Ordering::Relaxed);
            if !inflates_to(&member, data) {
                return self.damaged(name, "does not inflate to its data");
            }
            self.remember(*key, digest);
        }
        // Least recently used goes first in `trim`.
        let _ = file.set_modified(SystemTime::now());
        Some((member, digest))
    }

    /// Remembers `digest` as that of a member this process kept or checked for the
    /// data whose SHA-256 is `key`. Only members on disk are remembered: those too
    /// small to keep would only push out the ones that are.
    fn remember(&self, key: [u8; 32], digest: [u8; 32]) {
        self.known.lock().expect("known lock").put(key, digest);
    }

    /// Counts and removes a cached member that cannot be used.
    fn damaged<T>(&self, name: &str, why: &str) -> Option<T> {
        self.stats.damaged.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(member = %name, why, "a cached gzip member is damaged; compressing again");
        let _ = rfs::unlinkat(&self.dir, name, AtFlags::empty());
        None
    }

    /// Puts the member for `data` here, compressed with `compress`, unless a file
    /// already holds it (then checked now, in the background, so that the capture
    /// that uses it need not inflate it; its use time is renewed, so that what priming
    /// adds does not push it out). For priming: not counted in [`MemberCache::stats`]
    /// but for the members it inflated or found damaged, and it never trims, so it
    /// never waits for a trim nor makes a capture wait behind it: once half the limit
    /// was kept since the last trim it stops ([`Primed::Full`]), and the next capture
    /// trims.
    pub fn prime(
        &self,
        data: &[u8],
        compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
    ) -> io::Result<Primed> {
        let key: [u8; 32] = Sha256::digest(data).into();
        let name = hex::encode(key);
        if self.lookup(&name, &key, data).is_some() {
            return Ok(Primed::Present);
        }
        if self.kept.load(Ordering::Relaxed) > self.limit / 2 {
            return Ok(Primed::Full);
        }
        let member = compress(data)?;
        if member.len() >= MIN_KEPT {
            self.write(&name, &member)?;
            self.remember(key, Sha256::digest(&member).into());
        }
        Ok(Primed::Compressed)
    }

    fn keep(&self, name: &str, member: &[u8]) -> io::Result<()> {
        if self.write(name, member)? > self.limit / 2 {
            self.trim()?;
        }
        Ok(())
    }

    /// Writes a member under `name`; returns the bytes kept since the last trim.
    fn write(&self, name: &str, member: &[u8]) -> io::Result<u64> {
        crate::beneath::replace_file_at(&self.dir, name, member, 0o600)?;
        let len = member.len() as u64;
        Ok(self.kept.fetch_add(len, Ordering::Relaxed) + len)
    }

    /// Removes the least recently used members until their disk blocks are within
    /// the limit. Only names this cache makes are touched; anything else is left.
    pub fn trim(&self) -> io::Result<()> {
        let _one = self.trimming.lock().expect("trim lock");
        self.kept.store(0, Ordering::Relaxed);
        let mut files = Vec::new();
        let mut total = 0u64;
        for (name, is_dir) in crate::beneath::list(&self.dir)? {
            if is_dir || !is_member_name(&name) {
                continue;
            }
            let Ok(stat) = rfs::statat(
                &self.dir,
                OsStr::from_bytes(&name),
                AtFlags::SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            let bytes = stat.st_blocks as u64 * 512;
            total += bytes;
            files.push((stat.st_mtime, bytes, name));
        }
        if total <= self.limit {
            return Ok(());
        }
        files.sort();
        for (_, bytes, name) in files {
            if total <= self.limit {
                break;
            }
            if rfs::unlinkat(&self.dir, OsStr::from_bytes(&name), AtFlags::empty()).is_ok() {
                total -= bytes;
            }
        }
        Ok(())
    }
}

impl MemberCache {
    /// The directory `name` of the encoder's directory, made private if new.
    pub(super) fn subdir(&self, name: &str) -> io::Result<OwnedFd> {
        private_dir_at(&self.dir, name)
    }

    /// Records that the store holds `object` (`<sha256>.tar.gz`), made of `members`,
    /// and forgets the oldest layouts beyond [`LAYOUTS_KEPT`].
    pub fn record_layout(&self, object: &str, members: &[MemberSpan]) -> io::Result<()> {
        if !is_object_name(object.as_bytes()) || members.is_empty() {
            return Ok(());
        }
        let dir = self.subdir("layouts")?;
        let mut bytes = Vec::with_capacity(LAYOUT_MAGIC.len() + members.len() * LAYOUT_RECORD);
        bytes.extend_from_slice(LAYOUT_MAGIC);
        for member in members {
            bytes.extend_from_slice(&member.digest);
            bytes.extend_from_slice(&member.length.to_le_bytes());
        }
        write_keeping_newest(&dir, object, &bytes, LAYOUTS_KEPT, is_object_name)
    }

    /// The ranges of an archive made of `members` that objects recorded here hold
    /// too, byte for byte if their layouts are right: runs of consecutive members,
    /// each found at consecutive offsets of one object (the newest that has it).
    /// Unreadable or malformed layouts are skipped.
    pub fn reuse(&self, members: &[MemberSpan]) -> Vec<crate::store::Reuse> {
        let Ok(dir) = private_dir_at(&self.dir, "layouts") else {
            return Vec::new();
        };
        let mut sources = Vec::new();
        // Only this archive's members are looked for: what is kept stays within the
        // capture's own size, however many members the layouts list (a download's
        // layout is the store's object's, whatever made it).
        let mut found: HashMap<[u8; 32], Vec<(usize, u64)>> =
            members.iter().map(|m| (m.digest, Vec::new())).collect();
        for name in layout_files(&dir).unwrap_or_default() {
            let Some(layout) = read_layout(&dir, &name) else {
                tracing::debug!(layout = %String::from_utf8_lossy(&name), "skipping an unreadable layout");
                continue;
            };
            let source = sources.len();
            sources.push(String::from_utf8_lossy(&name).into_owned());
            let mut offset = 0u64;
            for member in layout {
                if let Some(places) = found.get_mut(&member.digest)
                    && places.last().is_none_or(|&(s, _)| s != source)
                {
                    places.push((source, offset));
                }
                offset = offset.saturating_add(member.length);
            }
        }
        let mut runs: Vec<crate::store::Reuse> = Vec::new();
        let mut offset = 0u64;
        // The source and offset where the member after the last one found would be.
        let mut next: Option<(usize, u64)> = None;
        for member in members {
            let places = found.get(&member.digest).map(Vec::as_slice).unwrap_or(&[]);
            let place = places
                .iter()
                .find(|&&place| Some(place) == next)
                .or(places.first())
                .copied();
            match place {
                Some((source, source_offset)) => {
                    match runs.last_mut() {
                        Some(run) if next == Some((source, source_offset)) => {
                            run.length += member.length
                        }
                        _ => runs.push(crate::store::Reuse {
                            offset,
                            length: member.length,
                            source: sources[source].clone(),
                            source_offset,
                        }),
                    }
                    next = Some((source, source_offset + member.length));
                }
                None => next = None,
            }
            offset += member.length;
        }
        runs
    }
}

/// Writes `name` in `dir` (atomically), then removes all but the `kept` newest of the
/// files whose names `wanted` takes.
pub(super) fn write_keeping_newest(
    dir: &OwnedFd,
    name: &str,
    bytes: &[u8],
    kept: usize,
    wanted: impl Fn(&[u8]) -> bool,
) -> io::Result<()> {
    crate::beneath::replace_file_at(dir, name, bytes, 0o600)?;
    for old in newest_files(dir, wanted)?.into_iter().skip(kept) {
        let _ = rfs::unlinkat(dir, OsStr::from_bytes(&old), AtFlags::empty());
    }
    Ok(())
}

/// Whether `name` is one this cache gives the files it keeps by a key (tree records,
/// store costs): 32 hexadecimal digits.
pub(super) fn is_key_name(name: &[u8]) -> bool {
    name.len() == 32 && name.iter().all(u8::is_ascii_hexdigit)
}

/// The layout files of `dir`, newest first (with partial ones left by a kill, which
/// sort last and are removed as the oldest).
fn layout_files(dir: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    newest_files(dir, is_object_name)
}

/// The files of `dir` whose names `wanted` takes, newest first (with partial ones left
/// by a kill, which sort last and are removed as the oldest).
fn newest_files(dir: &OwnedFd, wanted: impl Fn(&[u8]) -> bool) -> io::Result<Vec<Vec<u8>>> {
    let mut files = Vec::new();
    for (name, is_dir) in crate::beneath::list(dir)? {
        if is_dir || !(wanted(&name) || name.starts_with(b".partial-")) {
            continue;
        }
        let mtime = match rfs::statat(dir, OsStr::from_bytes(&name), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if !name.starts_with(b".partial-") => (stat.st_mtime, stat.st_mtime_nsec),
            Ok(_) => (i64::MIN, 0),
            Err(_) => continue,
        };
        files.push((mtime, name));
    }
    files.sort_by(|a, b| b.cmp(a));
    Ok(files.into_iter().map(|(_, name)| name).collect())
}

/// A layout, if `name` is a regular file of this user that holds a well-formed one.
fn read_layout(dir: &OwnedFd, name: &[u8]) -> Option<Vec<MemberSpan>> {
    if !is_object_name(name) {
        return None;
    }
    let bytes = crate::beneath::read_own_file_at(dir, OsStr::from_bytes(name), MAX_LAYOUT)?;
    let records = bytes.strip_prefix(LAYOUT_MAGIC)?;
    if bytes.len() as u64 > MAX_LAYOUT || records.len() % LAYOUT_RECORD != 0 {
        return None;
    }
    Some(
        records
            .chunks_exact(LAYOUT_RECORD)
            .map(|r| MemberSpan {
                digest: r[..32].try_into().expect("32 bytes"),
                length: u64::from_le_bytes(r[32..].try_into().expect("8 bytes")),
            })
            .collect(),
    )
}

/// `<64 hex digits>.tar.gz`, the names of checkpoint objects.
fn is_object_name(name: &[u8]) -> bool {
    name.strip_suffix(b".tar.gz")
        .is_some_and(|hex| hex.len() == 64 && hex.iter().all(u8::is_ascii_hexdigit))
}

/// A member's name (64 hex digits), or a partial one left by a killed capture.
fn is_member_name(name: &[u8]) -> bool {
    (name.len() == 64 && name.iter().all(u8::is_ascii_hexdigit)) || name.starts_with(b".partial-")
}

/// What the encoder is identified by: a member made of it.
const PROBE: &[u8] = b"ckptfs member cache probe: the quick brown fox jumps over the lazy dog \
    0123456789 0123456789 the quick brown fox jumps over the lazy dog";

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

impl MemberSource for MemberCache {
    fn member(&self, data: &[u8]) -> io::Result<Compressed> {
        self.get_or_compress_keyed(data, compress_member)
    }

    fn trim(&self) -> io::Result<()> {
        MemberCache::trim(self)
    }
}

#[cfg(test)]
mod tests;
