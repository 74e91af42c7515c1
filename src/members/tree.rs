//! What the last capture of a directory saw, so that the next `put` of it reads only
//! the files that changed (git's index, restic's parent snapshot): the stamps of its
//! files, and its members by fingerprint (see `crate::archive::gz`, "Members made of
//! files left unread").
//!
//! Layout: `<member cache>/<encoder>/trees/<name>`, `<name>` the first 32 hex digits of
//! the SHA-256 of the directory's canonical path, device and inode (a directory made
//! again at the same path is another tree); the records of forked workspaces of a
//! mount, named by a key of their own, in `forks/`. One file per tree: [`MAGIC`]; the number
//! of stamps (u64, little-endian) and the xxh3-128 of each; the number of members
//! and, for each, its fingerprint, the SHA-256 of its data (its name in the member
//! cache) and of its compressed bytes, the length of those, their checksum
//! ([`member_check`]), the length of the data, and the length and bytes of the member
//! itself when it is too small for the member cache to keep
//! ([`super::store::MIN_KEPT`]; else 0).
//!
//! Invariants:
//! - the archive does not depend on the records: a member is taken by fingerprint only
//!   when the member cache (or the record) holds bytes of the recorded length and
//!   checksum, which is what the member was when this cache made or checked it, so a
//!   missing, damaged, stale or planted records file or member costs reading the
//!   files again, never other bytes. The cache is trusted as the mount's own cache
//!   is: as far as its user, and checked against damage (README, "Security model");
//! - a stamp stands for contents only once the file has not changed for the put's
//!   `--settle` (the writer's `settled`); what a stamp cannot see even then (writes
//!   through a long-lived mapping on tmpfs, a filesystem without change times, a
//!   clock set back) is stated in the README, and `--member-cache-size 0` reads all;
//! - bounded: a records file larger than [`MAX_RECORDS`] is neither read nor written,
//!   a capture stops recording (and keeps nothing in memory) once its records would
//!   pass it, and the [`TREES_KEPT`] trees captured last are kept;
//! - written atomically once a capture stored its archive: a failed capture leaves the
//!   records of the one before.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fs::{self as rfs, AtFlags};
use sha2::{Digest, Sha256};

use super::store::{MIN_KEPT, MemberCache, is_key_name, member_check};
use crate::archive::gz::{Compressed, FileStamp, TreeRecords};

const MAGIC: &[u8] = b"ckptfs tree v1\n";
const STAMP: usize = 16;
const MEMBER: usize = 32 * 3 + 16 + 24;
/// Records of one tree larger than this are neither read nor written (about a million
/// files). They are not counted in the member cache's bound: [`TREES_KEPT`] of them at
/// most.
const MAX_RECORDS: u64 = 16 << 20;
/// Trees whose records are kept: those captured last (in each of [`TREES`] and
/// [`FORKS`]).
pub const TREES_KEPT: usize = 16;
/// Where the records of the directories `put` captured are kept.
const TREES: &str = "trees";
/// Where the records of forked workspaces are kept.
const FORKS: &str = "forks";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    key: [u8; 32],
    digest: [u8; 32],
    length: u64,
    /// Finds a damaged member or record quickly ([`member_check`]; the SHA-256 above
    /// names the member in layouts).
    check: u128,
    data_length: u64,
    /// The member, when the member cache does not keep members so small.
    inline: Option<Vec<u8>>,
}

#[derive(Default)]
struct Records {
    stamps: HashSet<u128>,
    members: HashMap<[u8; 32], Recorded>,
    /// What they would take in a records file; past [`MAX_RECORDS`] this capture
    /// records nothing more and keeps none (`overflow`), so that memory stays bounded
    /// whatever the tree.
    size: u64,
    overflow: bool,
}

/// One directory's records: those of the capture before, read at the start, and those
/// of this capture, written by [`TreeMembers::save`].
pub struct TreeMembers {
    cache: Arc<MemberCache>,
    /// [`TREES`] or [`FORKS`].
    dir: &'static str,
    name: String,
    before: Records,
    /// Files changed this long before the capture are read (see `put --settle`).
    settle: Duration,
    now: Mutex<Records>,
    /// File bytes the walk left unread, and those read after all.
    pub unread: AtomicU64,
    pub read_again: AtomicU64,
    /// Members taken by their records.
    pub taken: AtomicU64,
}

fn stamp_hash(stamp: &FileStamp) -> u128 {
    xxhash_rust::xxh3::xxh3_128(&stamp.to_bytes())
}

impl TreeMembers {
    /// The records of the directory at `path` (opened as `root`); none if there are
    /// none or they cannot be read.
    pub fn open(
        cache: Arc<MemberCache>,
        path: &Path,
        root: impl AsFd,
        settle: Duration,
    ) -> io::Result<TreeMembers> {
        let stat = rfs::fstat(root)?;
        let canonical = std::fs::canonicalize(path)?;
        let mut id = Sha256::new();
        id.update(canonical.as_os_str().as_bytes());
        id.update([0]);
        id.update(stat.st_dev.to_le_bytes());
        id.update(stat.st_ino.to_le_bytes());
        Ok(TreeMembers::kept_in(
            cache,
            TREES,
            &id.finalize().into(),
            settle,
        ))
    }

    /// The records of a forked workspace of `staging/`, which has no lasting path (it
    /// may be renamed): `key` names it instead. Kept apart from the trees of `put`
    /// (in `forks/`, the [`TREES_KEPT`] newest), so that forks cannot push them out.
    /// No settling time: stamps are exact there, since every write to a staged file
    /// is the daemon's own and none is pending once a workspace is frozen (a mapped
    /// file is open, and the kernel writes a mapping's pages back when it is
    /// unmapped); only the clock's tick is left, which the writer's racy bound covers.
    pub fn of_fork(cache: Arc<MemberCache>, key: &[u8; 32]) -> TreeMembers {
        TreeMembers::kept_in(cache, FORKS, key, Duration::ZERO)
    }

    fn kept_in(
        cache: Arc<MemberCache>,
        dir: &'static str,
        key: &[u8; 32],
        settle: Duration,
    ) -> TreeMembers {
        let name = hex::encode(&key[..16]);
        let before = cache
            .read_tree(dir, &name, MAX_RECORDS)
            .and_then(|bytes| parse(&bytes))
            .unwrap_or_default();
        TreeMembers {
            cache,
            dir,
            name,
            before,
            settle,
            now: Mutex::new(Records::default()),
            unread: AtomicU64::new(0),
            read_again: AtomicU64::new(0),
            taken: AtomicU64::new(0),
        }
    }

    /// Whether the capture before recorded any file of this tree.
    pub fn has_records(&self) -> bool {
        !self.before.stamps.is_empty()
    }

    /// Replaces the tree's records with this capture's (call once its archive is
    /// stored), and forgets the trees captured longest ago.
    pub fn save(&self) -> io::Result<()> {
        let now = self.now.lock().expect("records lock");
        let bytes = encode(&now);
        if now.overflow || bytes.len() as u64 > MAX_RECORDS {
            // Too large to keep: the next put reads every file, rather than use the
            // records of an older tree.
            return self.cache.remove_tree(self.dir, &self.name);
        }
        self.cache
            .write_tree(self.dir, &self.name, &bytes, TREES_KEPT)
    }
}

fn encode(records: &Records) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(records.stamps.len() as u64).to_le_bytes());
    for stamp in &records.stamps {
        bytes.extend_from_slice(&stamp.to_le_bytes());
    }
    bytes.extend_from_slice(&(records.members.len() as u64).to_le_bytes());
    for (fingerprint, r) in &records.members {
        bytes.extend_from_slice(fingerprint);
        bytes.extend_from_slice(&r.key);
        bytes.extend_from_slice(&r.digest);
        bytes.extend_from_slice(&r.length.to_le_bytes());
        bytes.extend_from_slice(&r.check.to_le_bytes());
        bytes.extend_from_slice(&r.data_length.to_le_bytes());
        let inline = r.inline.as_deref().unwrap_or_default();
        bytes.extend_from_slice(&(inline.len() as u64).to_le_bytes());
        bytes.extend_from_slice(inline);
    }
    bytes
}

/// The records in `bytes`, or `None` if they are malformed.
fn parse(bytes: &[u8]) -> Option<Records> {
    let mut rest = bytes.strip_prefix(MAGIC)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let mut records = Records::default();
    let stamps = u64_at(take(8)?);
    for _ in 0..stamps.min(bytes.len() as u64 / STAMP as u64 + 1) {
        records
            .stamps
            .insert(u128::from_le_bytes(take(STAMP)?.try_into().ok()?));
    }
    let members = u64_at(take(8)?);
    for _ in 0..members.min(bytes.len() as u64 / MEMBER as u64 + 1) {
        let m = take(MEMBER)?;
        let array = |at: usize| -> [u8; 32] { m[at..at + 32].try_into().expect("32 bytes") };
        let inline = usize::try_from(u64_at(&m[128..136])).ok()?;
        let inline = (inline > 0)
            .then(|| take(inline).map(<[u8]>::to_vec))
            .map_or(Some(None), |bytes| bytes.map(Some))?;
        records.members.insert(
            array(0),
            Recorded {
                key: array(32),
                digest: array(64),
                length: u64_at(&m[96..104]),
                check: u128::from_le_bytes(m[104..120].try_into().expect("16 bytes")),
                data_length: u64_at(&m[120..128]),
                inline,
            },
        );
    }
    take(1).is_none().then_some(records)
}

impl TreeRecords for TreeMembers {
    fn seen(&self, stamp: &FileStamp) -> bool {
        let seen = self.before.stamps.contains(&stamp_hash(stamp));
        if seen {
            self.unread.fetch_add(stamp.size, Ordering::Relaxed);
        }
        seen
    }

    fn settle(&self) -> Duration {
        self.settle
    }

    fn recorded(&self, fingerprint: &[u8; 32]) -> Option<Compressed> {
        let r = self.before.members.get(fingerprint)?;
        let bytes = match &r.inline {
            Some(bytes) => (bytes.len() as u64 == r.length
                && member_check(bytes, &r.key, &r.digest) == r.check)
                .then(|| bytes.clone())?,
            None => self.cache.recorded(&r.key, &r.digest, r.length, r.check)?,
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        let stats = &self.cache.stats;
        stats.reused.fetch_add(1, Ordering::Relaxed);
        stats
            .reused_bytes
            .fetch_add(r.data_length, Ordering::Relaxed);
        Some(Compressed {
            bytes,
            digest: r.digest,
            key: r.key,
        })
    }

    fn record(
        &self,
        fingerprint: [u8; 32],
        member: &Compressed,
        length: u64,
        stamps: &[FileStamp],
    ) {
        let mut now = self.now.lock().expect("records lock");
        if now.overflow {
            return;
        }
        for stamp in stamps {
            if now.stamps.insert(stamp_hash(stamp)) {
                now.size += STAMP as u64;
            }
        }
        let inline = (member.bytes.len() < MIN_KEPT).then(|| member.bytes.clone());
        let added = MEMBER as u64 + inline.as_ref().map_or(0, |m| m.len() as u64);
        let recorded = Recorded {
            key: member.key,
            digest: member.digest,
            length: member.bytes.len() as u64,
            check: member_check(&member.bytes, &member.key, &member.digest),
            data_length: length,
            inline,
        };
        if now.members.insert(fingerprint, recorded).is_none() {
            now.size += added;
        }
        if now.size > MAX_RECORDS {
            *now = Records {
                overflow: true,
                ..Records::default()
            };
        }
    }

    fn read_again(&self, bytes: u64) {
        self.read_again.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl MemberCache {
    /// The records file of tree `name` in `dir`, if it is a regular file of this user
    /// no larger than `most`.
    fn read_tree(&self, dir: &str, name: &str, most: u64) -> Option<Vec<u8>> {
        crate::beneath::read_own_file_at(&self.subdir(dir).ok()?, OsStr::new(name), most)
    }

    /// Forgets the records of tree `name` in `dir`.
    fn remove_tree(&self, dir: &str, name: &str) -> io::Result<()> {
        let dir = self.subdir(dir)?;
        match rfs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the records of tree `name` in `dir`, keeping the `kept` newest there.
    fn write_tree(&self, dir: &str, name: &str, bytes: &[u8], kept: usize) -> io::Result<()> {
        super::store::write_keeping_newest(&self.subdir(dir)?, name, bytes, kept, is_key_name)
    }
}

#[cfg(test)]
mod tests;
