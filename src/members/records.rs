//! An entry's member records: how to rebuild, from the entry's own files, the tar bytes
//! of each gzip member its load inflated (`<entry>/members`, with a checksum), and the
//! records of the entries a load may take members from ([`Known`]).
//!
//! Records are hints: each rebuilt member is checked against its record's length and
//! xxh3-128, and the reader checks more before it uses one (see the room's comment).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use crate::beneath::open_regular;

use super::{MAX_CANDIDATES, MAX_PEEK, MAX_RECORDED, MAX_RECORDS, PREFIX};

/// One gzip member that an entry's load inflated, and how to rebuild its tar bytes
/// from that entry's files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberRecord {
    /// xxh3 of the first [`PREFIX`] compressed bytes: how candidates are found.
    pub(super) prefix: u64,
    pub(super) compressed: [u8; 32],
    pub(super) compressed_len: u64,
    pub(super) tar_len: u64,
    pub(super) tar_hash: u128,
    pub(super) segments: Vec<Segment>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) enum Segment {
    Raw(Vec<u8>),
    Zeros(u64),
    /// A range of the entry's pack.
    Packed {
        offset: u64,
        len: u64,
    },
    /// A range of the entry's file of its own for `node`.
    Own {
        node: u32,
        offset: u64,
        len: u64,
    },
    /// All of the entry's file of its own for `node`, whose bytes have this SHA-256
    /// (the name of its blob): a load that rebuilds it need not hash it again.
    Whole {
        node: u32,
        len: u64,
        digest: [u8; 32],
    },
}

/// What records take in memory, as counted against [`MAX_RECORDS`] both when they
/// are made and when they are read: each record and each segment at its size, plus
/// the bytes of raw segments. On disk (postcard) they take less.
pub(super) fn cost(segments: usize, raw: usize) -> u64 {
    (size_of::<MemberRecord>() + segments * size_of::<Segment>() + raw) as u64
}

/// Writes an entry's records, with a checksum like its index.
pub fn write_records(path: &Path, mut records: &[MemberRecord]) -> io::Result<()> {
    let mut bytes = postcard::to_stdvec(records).map_err(io::Error::other)?;
    // Never more than a load will read back (the cost bound keeps well below it).
    while bytes.len() as u64 + 8 > MAX_RECORDS {
        records = &records[..records.len() * 3 / 4];
        bytes = postcard::to_stdvec(records).map_err(io::Error::other)?;
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(&bytes)?;
    file.write_all(&xxh3_64(&bytes).to_le_bytes())
}

/// An entry's records and what they cost in memory.
pub(super) fn read_records(path: &Path) -> io::Result<(Vec<MemberRecord>, u64)> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORDS + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_RECORDS {
        return Err(io::Error::other("too large"));
    }
    let damaged = || io::Error::new(io::ErrorKind::InvalidData, "damaged");
    if bytes.len() < 8 {
        return Err(damaged());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if xxh3_64(body).to_le_bytes() != sum {
        return Err(damaged());
    }
    let records: Vec<MemberRecord> = postcard::from_bytes(body).map_err(|_| damaged())?;
    // Each segment but the last few stands for at least 16 tar bytes (a raw one and
    // the zero run after it, ZERO_RUN + 1): more would make a rebuild open files for
    // nothing. In all, records cost what a load would have let them cost.
    let mut total = 0;
    for record in &records {
        if record.tar_len > MAX_RECORDED as u64
            || record.segments.len() as u64 > record.tar_len / 16 + 8
        {
            return Err(damaged());
        }
        let raw = record.segments.iter().map(|s| match s {
            Segment::Raw(bytes) => bytes.len(),
            _ => 0,
        });
        total += cost(record.segments.len(), raw.sum());
    }
    if total > MAX_RECORDS {
        return Err(damaged());
    }
    Ok((records, total))
}

// --- what the cache holds ------------------------------------------------------------

/// Where an entry of the cache keeps its records and what they point into (the cache
/// names them: `crate::cache::entry::files_of`).
#[derive(Debug, Clone)]
pub struct EntryFiles {
    /// The records, as [`write_records`] wrote them.
    pub records: PathBuf,
    /// The pack of small files' contents ([`Segment::Packed`]).
    pub pack: PathBuf,
    /// The directory of the files of their own, each named by its node
    /// ([`Segment::Own`], [`Segment::Whole`]).
    pub files: PathBuf,
}

impl EntryFiles {
    fn own(&self, node: u32) -> PathBuf {
        self.files.join(node.to_string())
    }
}

pub(super) struct KnownEntry {
    pub(super) entry: EntryFiles,
    pub(super) records: Vec<MemberRecord>,
    pub(super) pack: Option<File>,
}

/// The members recorded by some entries of the cache, found by their first bytes.
#[derive(Default)]
pub struct Known {
    pub(super) entries: Vec<KnownEntry>,
    pub(super) by_prefix: HashMap<u64, Vec<(u32, u32)>>,
}

impl Known {
    /// Reads the records of `entries`, most useful first; an entry without readable
    /// records is left out, and no more are read once they cost [`MAX_RECORDS`] (so
    /// less than twice that in all).
    pub fn read(entries: impl IntoIterator<Item = EntryFiles>) -> Known {
        let mut known = Known::default();
        let mut total = 0;
        for entry in entries {
            if total >= MAX_RECORDS {
                break;
            }
            let path = &entry.records;
            let records = match read_records(path) {
                Ok((records, cost)) => {
                    total += cost;
                    records
                }
                Err(e) => {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::debug!(path = %path.display(), error = %e, "member records not used");
                    }
                    continue;
                }
            };
            let at = known.entries.len() as u32;
            for (i, record) in records.iter().enumerate() {
                let len = record.compressed_len as usize;
                if (PREFIX..=MAX_PEEK).contains(&len) {
                    // The key is of the first bytes, so it is checked again in full.
                    let candidates = known.by_prefix.entry(record.prefix).or_default();
                    // No more are ever checked at a boundary; the cap also keeps this
                    // loop linear when many records share their first bytes.
                    if candidates.len() >= MAX_CANDIDATES {
                        continue;
                    }
                    // Two entries with the member are enough (one may be damaged).
                    let same = |&&(e, r): &&(u32, u32)| {
                        let other = match known.entries.get(e as usize) {
                            Some(entry) => &entry.records[r as usize],
                            None => &records[r as usize], // this entry's own
                        };
                        other.compressed == record.compressed
                    };
                    if candidates.iter().filter(same).count() < 2 {
                        candidates.push((at, i as u32));
                    }
                }
            }
            known.entries.push(KnownEntry {
                entry,
                records,
                pack: None,
            });
        }
        known
    }

    pub fn is_empty(&self) -> bool {
        self.by_prefix.is_empty()
    }
}

/// Rebuilds a member's tar bytes from the entry that recorded it; also gives where
/// whole files with known digests sit in them.
pub(super) fn rebuild(
    entry: &EntryFiles,
    pack: &mut Option<File>,
    record: &MemberRecord,
    digests: &mut Vec<(u64, u64, [u8; 32])>,
) -> io::Result<Vec<u8>> {
    let too_long = || io::Error::new(io::ErrorKind::InvalidData, "record longer than its member");
    if record.tar_len > MAX_RECORDED as u64 {
        return Err(too_long());
    }
    let mut tar = Vec::with_capacity(record.tar_len as usize);
    for segment in &record.segments {
        let len = match segment {
            Segment::Raw(bytes) => bytes.len() as u64,
            Segment::Zeros(len)
            | Segment::Packed { len, .. }
            | Segment::Own { len, .. }
            | Segment::Whole { len, .. } => *len,
        };
        // tar.len() ≤ tar_len holds here, and len comes from disk: no overflow.
        if len > record.tar_len - tar.len() as u64 {
            return Err(too_long());
        }
        let at = tar.len();
        match segment {
            Segment::Raw(bytes) => tar.extend_from_slice(bytes),
            Segment::Zeros(len) => tar.resize(at + *len as usize, 0),
            Segment::Packed { offset, len } => {
                if pack.is_none() {
                    *pack = Some(open_regular(&entry.pack)?);
                }
                let file = pack.as_ref().expect("opened above");
                append_range(file, *offset, *len, &mut tar)?;
            }
            Segment::Own { node, offset, len } => {
                let file = open_regular(&entry.own(*node))?;
                append_range(&file, *offset, *len, &mut tar)?;
            }
            Segment::Whole { node, len, digest } => {
                let file = open_regular(&entry.own(*node))?;
                append_range(&file, 0, *len, &mut tar)?;
                digests.push((at as u64, *len, *digest));
            }
        }
        if tar.len() != at + len as usize {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than recorded",
            ));
        }
    }
    Ok(tar)
}

/// The tar bytes of each member `entry` recorded, in archive order, rebuilt from its
/// files and checked against the record (length and xxh3-128): `each` gets those that
/// rebuild right, and says whether to go on. Returns how many it got.
pub fn rebuild_each(entry: &EntryFiles, mut each: impl FnMut(&[u8]) -> bool) -> io::Result<u64> {
    let (records, _) = read_records(&entry.records)?;
    let (mut pack, mut digests, mut given) = (None, Vec::new(), 0);
    for record in &records {
        digests.clear();
        match rebuild(entry, &mut pack, record, &mut digests) {
            Ok(tar) if tar.len() as u64 == record.tar_len && xxh3_128(&tar) == record.tar_hash => {
                given += 1;
                if !each(&tar) {
                    break;
                }
            }
            _ => {
                tracing::debug!(entry = %entry.records.display(), "a recorded member did not rebuild to its bytes; skipped")
            }
        }
    }
    Ok(given)
}

/// Appends `len` bytes of `file` at `offset` to `out` (without zeroing them first).
pub(super) fn append_range(
    mut file: &File,
    offset: u64,
    len: u64,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    file.seek(io::SeekFrom::Start(offset))?;
    file.take(len).read_to_end(out)?;
    Ok(())
}
