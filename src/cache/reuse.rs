//! Loading turn N+1 knowing turn N: gzip members the cache already unpacked are not
//! inflated again.
//!
//! Capture cuts an archive into gzip members where the tree says, not where offsets
//! fall (see `crate::archive::gz`), so turn N+1 is mostly made of turn N's members,
//! byte for byte. While a checkpoint is downloaded and hashed (all of it, always,
//! before anything is shown: this module changes how the tar stream is obtained, never
//! what is checked), [`MemberReader`] turns the compressed stream into the tar stream
//! the indexer reads, member by member (on a thread of its own, a few chunks ahead of
//! the indexer, which tells the recorder how far it has read: [`Indexing`]). At each member boundary it looks for a member
//! that an entry of the cache recorded: when the next compressed bytes are exactly
//! that member (same length, same SHA-256), its tar bytes are put together again from
//! that entry's files instead of being inflated. Every other member is inflated.
//!
//! Each entry records its members in `<entry>/members` ([`MemberRecord`]: the
//! SHA-256 of the compressed bytes, the length and xxh3-128 of the tar bytes they
//! inflated to, and those tar bytes as segments: raw bytes for headers and padding,
//! ranges of the entry's pack and files for contents).
//!
//! Invariants:
//! - the tar stream handed to the indexer is byte for byte the one inflation gives: a
//!   member is reused only if its compressed bytes have the SHA-256 of one this cache
//!   inflated itself, and the bytes rebuilt from disk must have the length and
//!   xxh3-128 of what it inflated to, and the CRC-32 and length that the member's own
//!   gzip trailer gives, else the member is inflated after all. Nothing the archive
//!   says (no size field in a gzip header) places a boundary: boundaries are where
//!   inflation of the previous member ended;
//! - the indexer reads the stream as a whole, so tar's context (pax headers, hard
//!   links, later duplicates) means what it means in the new archive;
//! - records are hints: a missing, damaged or stale record, or an entry evicted
//!   meanwhile, costs an inflation, never a wrong byte;
//! - memory is bounded: at most [`MAX_PEEK`] compressed bytes are looked ahead, a
//!   member's tar bytes are kept for its record only up to [`MAX_RECORDED`], and an
//!   entry's records take at most [`MAX_RECORDS`] in memory, counted the same way
//!   when they are made and when they are read;
//! - work is bounded by the download: an archive made to match recorded members'
//!   first bytes but not the rest makes each boundary hash up to [`MAX_CANDIDATES`]
//!   times [`MAX_PEEK`] bytes, so once the bytes hashed or rebuilt in vain pass twice
//!   the bytes taken from the stream, the load stops looking and only inflates.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{self, BufRead, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use crate::archive::gz::MemberSpan;
use crate::archive::index::{FileLocation, Index, NodeKind};
use crate::beneath::open_regular;

/// Compressed bytes hashed to find candidates (members shorter are not recorded).
const PREFIX: usize = 256;
/// The longest member looked ahead for, and so recorded, compressed.
pub const MAX_PEEK: usize = 4 << 20;
/// The most tar bytes of one member kept until its record is made.
pub const MAX_RECORDED: usize = 4 << 20;
/// Zero runs at least this long are recorded by their length (a segment in memory
/// costs more than 32 bytes: shorter runs are kept as raw bytes).
const ZERO_RUN: usize = 64;
/// A `members` file larger than this is not read, and the records of one entry cost
/// no more than this in memory ([`cost`]; about the headers of 20,000 files: records
/// are metadata).
const MAX_RECORDS: u64 = 16 << 20;
/// Candidates checked at one boundary: each costs hashing up to [`MAX_PEEK`] bytes,
/// and an archive made to give many records the same first bytes must not make a
/// load quadratic.
const MAX_CANDIDATES: usize = 4;
/// The most members waiting for the indexer to read past them: a reader running
/// ahead ([`MemberReader::ahead`]) is at most a few MiB of tar ahead, which legitimate
/// members fill with far fewer; members beyond (an archive of tiny members) are not
/// recorded, so that what waits stays small whatever the archive.
const MAX_UNFINISHED: usize = 4096;
/// The most members of one download whose layout is kept (40 bytes each in memory):
/// capture makes about one per MiB of tar, so this covers archives of tens of GiB.
const MAX_LAYOUT_MEMBERS: usize = 1 << 16;
/// Layouts whose members average fewer compressed bytes are not kept (a MiB of
/// zeros compresses to about 1 KiB: a capture's members are larger).
const MIN_LAYOUT_AVERAGE: u64 = PREFIX as u64;

/// One gzip member that an entry's load inflated, and how to rebuild its tar bytes
/// from that entry's files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberRecord {
    /// xxh3 of the first [`PREFIX`] compressed bytes: how candidates are found.
    prefix: u64,
    compressed: [u8; 32],
    compressed_len: u64,
    tar_len: u64,
    tar_hash: u128,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
enum Segment {
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
fn cost(segments: usize, raw: usize) -> u64 {
    (size_of::<MemberRecord>() + segments * size_of::<Segment>() + raw) as u64
}

/// Counts of one load.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReuseCounts {
    /// Members rebuilt from an entry of the cache.
    pub reused: u64,
    /// Members inflated.
    pub inflated: u64,
    /// Members whose record matched but whose rebuilt bytes did not (then inflated).
    pub stale: u64,
    /// Candidates whose first bytes matched but whose whole member did not.
    pub mismatched: u64,
}

// --- recording -----------------------------------------------------------------------

/// A member inflated or rebuilt during this load, waiting for the indexer to have
/// said where the contents inside it went.
struct Unfinished {
    prefix: u64,
    compressed: [u8; 32],
    compressed_len: u64,
    start: u64,
    tar: Arc<Vec<u8>>,
}

enum Piece {
    Raw(Vec<u8>),
    Zeros(u64),
    Contents { node: u32, offset: u64, len: u64 },
}

struct Unresolved {
    prefix: u64,
    compressed: [u8; 32],
    compressed_len: u64,
    tar_len: u64,
    tar_hash: u128,
    pieces: Vec<Piece>,
}

/// Collects the records of the entry being loaded: the reader hands it members, the
/// indexer (through the entry's content sink) says where file contents start in the
/// tar stream and which node holds them.
#[derive(Default)]
pub struct Recorder {
    members: VecDeque<Unfinished>,
    /// Where the member being inflated starts: its contents are needed for its
    /// record once it ends, though it is not in `members` yet.
    inflating_from: Option<u64>,
    /// (tar offset, length, node) of file contents, in stream order.
    contents: VecDeque<(u64, u64, u32)>,
    done: Vec<Unresolved>,
    /// What `done` takes in memory ([`cost`]), bounded by [`MAX_RECORDS`].
    cost: u64,
    /// (tar offset, length, SHA-256) of whole files rebuilt, in stream order.
    digests: VecDeque<(u64, u64, [u8; 32])>,
    counts: ReuseCounts,
    /// Every member of the download so far, in order: the SHA-256 of its compressed
    /// bytes (zeros past [`MAX_PEEK`], where it is not computed; no member of a
    /// capture is that long) and their length.
    layout: Vec<MemberSpan>,
    /// More than [`MAX_LAYOUT_MEMBERS`] came: no layout.
    layout_dropped: bool,
}

impl Recorder {
    pub fn counts(&self) -> ReuseCounts {
        self.counts
    }

    /// The download's members, in order from its first byte, if they were few enough
    /// to keep: where a capture may find its own members in this object, for the
    /// store to copy them (see `crate::archive::members`). Members the indexer had no
    /// need to read (after the tar's end) are left out; the offsets of those listed
    /// stay right.
    pub fn take_layout(&mut self) -> Option<Vec<MemberSpan>> {
        let layout = std::mem::take(&mut self.layout);
        // Capture never makes members that small on average; a layout of them would
        // only cost the captures that read it.
        let bytes: u64 = layout.iter().map(|m| m.length).sum();
        let worth = !layout.is_empty() && bytes / layout.len() as u64 >= MIN_LAYOUT_AVERAGE;
        (!self.layout_dropped && worth).then_some(layout)
    }

    fn layout_push(&mut self, digest: [u8; 32], length: u64) {
        if self.layout_dropped {
            return;
        }
        if self.layout.len() >= MAX_LAYOUT_MEMBERS {
            self.layout_dropped = true;
            self.layout = Vec::new();
            return;
        }
        self.layout.push(MemberSpan { digest, length });
    }

    /// Node `node`'s contents are the `len` tar bytes at `offset`.
    pub fn contents_at(&mut self, node: u32, offset: u64, len: u64) {
        if len > 0 {
            self.contents.push_back((offset, len, node));
        }
    }

    fn member(&mut self, member: Unfinished) {
        // An empty member has nothing to rebuild.
        if !member.tar.is_empty() && self.members.len() < MAX_UNFINISHED {
            self.members.push_back(member);
        }
    }

    /// Members of this load waiting for the indexer to read past them.
    #[cfg(test)]
    fn unfinished(&self) -> usize {
        self.members.len()
    }

    /// Makes the records of the members that end at or before `offset`: the indexer
    /// has read past them, so it has said where every content inside them went.
    pub fn finish_through(&mut self, offset: u64) {
        while let Some(member) = self.members.front() {
            if member.start + member.tar.len() as u64 > offset {
                break;
            }
            let member = self.members.pop_front().expect("a front member");
            self.finish_member(member);
        }
        // Contents before every member still to be recorded are not needed (members
        // are contiguous, so none starts before the first one queued, or the one
        // being inflated).
        let needed_from = self
            .members
            .front()
            .map_or(offset, |m| m.start.min(offset))
            .min(self.inflating_from.unwrap_or(u64::MAX));
        while self
            .contents
            .front()
            .is_some_and(|&(o, l, _)| o + l <= needed_from)
        {
            self.contents.pop_front();
        }
    }

    fn finish_member(&mut self, member: Unfinished) {
        if member.tar.is_empty() {
            return; // nothing to rebuild, and a record would cost for nothing
        }
        let end = member.start + member.tar.len() as u64;
        let mut pieces = Vec::new();
        let mut at = member.start;
        for &(offset, len, node) in &self.contents {
            if offset >= end {
                break;
            }
            let (from, to) = (offset.max(at), (offset + len).min(end));
            if from >= to {
                continue;
            }
            raw_pieces(
                &member.tar[(at - member.start) as usize..(from - member.start) as usize],
                &mut pieces,
            );
            pieces.push(Piece::Contents {
                node,
                offset: from - offset,
                len: to - from,
            });
            at = to;
        }
        raw_pieces(&member.tar[(at - member.start) as usize..], &mut pieces);
        while self.contents.front().is_some_and(|&(o, l, _)| o + l <= end) {
            self.contents.pop_front();
        }
        let raw = pieces
            .iter()
            .map(|p| match p {
                Piece::Raw(bytes) => bytes.len(),
                _ => 0,
            })
            .sum();
        self.cost += cost(pieces.len(), raw);
        if self.cost > MAX_RECORDS {
            return; // the members after this one are not recorded
        }
        self.done.push(Unresolved {
            prefix: member.prefix,
            compressed: member.compressed,
            compressed_len: member.compressed_len,
            tar_len: member.tar.len() as u64,
            tar_hash: xxh3_128(&member.tar),
            pieces,
        });
    }

    /// The SHA-256 of the `len` tar bytes at `offset`, if they were rebuilt as a
    /// whole file whose digest was recorded.
    pub fn digest_of(&mut self, offset: u64, len: u64) -> Option<[u8; 32]> {
        while self.digests.front().is_some_and(|&(o, _, _)| o < offset) {
            self.digests.pop_front();
        }
        match self.digests.front() {
            Some(&(o, l, digest)) if o == offset && l == len => Some(digest),
            _ => None,
        }
    }

    /// The records, with contents located in the entry by its finished index, and
    /// whole files of their own named by their digests.
    pub fn finish(&mut self, index: &Index, digests: &HashMap<u32, [u8; 32]>) -> Vec<MemberRecord> {
        self.finish_through(u64::MAX);
        let locate = |piece: Piece| -> Option<Segment> {
            Some(match piece {
                Piece::Raw(bytes) => Segment::Raw(bytes),
                Piece::Zeros(len) => Segment::Zeros(len),
                Piece::Contents { node, offset, len } => match &index.node(node)?.kind {
                    NodeKind::File {
                        location: FileLocation::Packed { offset: start },
                        ..
                    } => Segment::Packed {
                        offset: start + offset,
                        len,
                    },
                    NodeKind::File {
                        location: FileLocation::Own,
                        size,
                        ..
                    } => match digests.get(&node) {
                        Some(&digest) if offset == 0 && len == *size => {
                            Segment::Whole { node, len, digest }
                        }
                        _ => Segment::Own { node, offset, len },
                    },
                    _ => return None,
                },
            })
        };
        std::mem::take(&mut self.done)
            .into_iter()
            .filter_map(|m| {
                Some(MemberRecord {
                    prefix: m.prefix,
                    compressed: m.compressed,
                    compressed_len: m.compressed_len,
                    tar_len: m.tar_len,
                    tar_hash: m.tar_hash,
                    segments: m.pieces.into_iter().map(locate).collect::<Option<_>>()?,
                })
            })
            .collect()
    }
}

/// Splits raw tar bytes into runs of zeros (padding, empty header fields) and the rest.
fn raw_pieces(mut bytes: &[u8], out: &mut Vec<Piece>) {
    while !bytes.is_empty() {
        let zeros = bytes.iter().take_while(|&&b| b == 0).count();
        if zeros >= ZERO_RUN || zeros == bytes.len() {
            out.push(Piece::Zeros(zeros as u64));
            bytes = &bytes[zeros..];
            continue;
        }
        // Up to the next run of zeros long enough to be worth its own piece.
        let mut end = zeros;
        while end < bytes.len() {
            let run = bytes[end..].iter().take_while(|&&b| b == 0).count();
            if run >= ZERO_RUN || end + run == bytes.len() && run > 0 {
                break;
            }
            end += run.max(1);
        }
        match out.last_mut() {
            Some(Piece::Raw(raw)) => raw.extend_from_slice(&bytes[..end]),
            _ => out.push(Piece::Raw(bytes[..end].to_vec())),
        }
        bytes = &bytes[end..];
    }
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
fn read_records(path: &Path) -> io::Result<(Vec<MemberRecord>, u64)> {
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

struct KnownEntry {
    dir: PathBuf,
    records: Vec<MemberRecord>,
    pack: Option<File>,
}

/// The members recorded by some entries of the cache, found by their first bytes.
#[derive(Default)]
pub struct Known {
    entries: Vec<KnownEntry>,
    by_prefix: HashMap<u64, Vec<(u32, u32)>>,
}

impl Known {
    /// Reads the records of the entries in `dirs`, most useful first; an entry without
    /// readable records is left out, and no more are read once they cost
    /// [`MAX_RECORDS`] (so less than twice that in all).
    pub fn read(dirs: impl IntoIterator<Item = PathBuf>) -> Known {
        let mut known = Known::default();
        let mut total = 0;
        for dir in dirs {
            if total >= MAX_RECORDS {
                break;
            }
            let path = dir.join("members");
            let records = match read_records(&path) {
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
                dir,
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

/// Rebuilds a member's tar bytes from the entry in `dir` that recorded it; also
/// gives where whole files with known digests sit in them.
fn rebuild(
    dir: &Path,
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
                    *pack = Some(open_regular(&dir.join("pack"))?);
                }
                let file = pack.as_ref().expect("opened above");
                append_range(file, *offset, *len, &mut tar)?;
            }
            Segment::Own { node, offset, len } => {
                let file = open_regular(&dir.join("files").join(node.to_string()))?;
                append_range(&file, *offset, *len, &mut tar)?;
            }
            Segment::Whole { node, len, digest } => {
                let file = open_regular(&dir.join("files").join(node.to_string()))?;
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

/// The tar bytes of each member the entry in `dir` recorded, in archive order, rebuilt
/// from its files and checked against the record (length and xxh3-128): `each` gets
/// those that rebuild right, and says whether to go on. Returns how many it got.
pub fn rebuild_each(dir: &Path, mut each: impl FnMut(&[u8]) -> bool) -> io::Result<u64> {
    let (records, _) = read_records(&dir.join("members"))?;
    let (mut pack, mut digests, mut given) = (None, Vec::new(), 0);
    for record in &records {
        digests.clear();
        match rebuild(dir, &mut pack, record, &mut digests) {
            Ok(tar) if tar.len() as u64 == record.tar_len && xxh3_128(&tar) == record.tar_hash => {
                given += 1;
                if !each(&tar) {
                    break;
                }
            }
            _ => {
                tracing::debug!(entry = %dir.display(), "a recorded member did not rebuild to its bytes; skipped")
            }
        }
    }
    Ok(given)
}

/// Appends `len` bytes of `file` at `offset` to `out` (without zeroing them first).
fn append_range(mut file: &File, offset: u64, len: u64, out: &mut Vec<u8>) -> io::Result<()> {
    file.seek(io::SeekFrom::Start(offset))?;
    file.take(len).read_to_end(out)?;
    Ok(())
}

// --- reading -------------------------------------------------------------------------

/// The compressed stream, buffered so that the next member can be looked at before it
/// is taken; hashes what inflation takes of it, member by member.
struct Input<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    hasher: Sha256,
    taken: u64,
    head: Vec<u8>,
    /// Bytes taken or skipped since the start of the stream.
    total: u64,
}

fn read_some(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

impl<R: Read> Input<R> {
    fn new(inner: R) -> Self {
        Input {
            inner,
            buf: vec![0; 256 << 10],
            start: 0,
            end: 0,
            eof: false,
            hasher: Sha256::new(),
            taken: 0,
            head: Vec::with_capacity(PREFIX),
            total: 0,
        }
    }

    /// The next `n` bytes, fewer only at the end of the stream (`n` ≤ [`MAX_PEEK`]).
    fn peek(&mut self, n: usize) -> io::Result<&[u8]> {
        while self.end - self.start < n && !self.eof {
            if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.buf.len() < n {
                    self.buf.resize(n, 0);
                }
            }
            let got = read_some(&mut self.inner, &mut self.buf[self.end..])?;
            if got == 0 {
                self.eof = true;
            }
            self.end += got;
        }
        let n = n.min(self.end - self.start);
        Ok(&self.buf[self.start..self.start + n])
    }

    /// Steps over `n` bytes [`Input::peek`] returned.
    fn skip(&mut self, n: usize) {
        self.start += n;
        self.total += n as u64;
    }

    /// The SHA-256, length and prefix key of what was taken since the last call.
    fn member_taken(&mut self) -> ([u8; 32], u64, u64) {
        let digest = std::mem::take(&mut self.hasher).finalize().into();
        let prefix = xxh3_64(&self.head);
        self.head.clear();
        (digest, std::mem::take(&mut self.taken), prefix)
    }
}

impl<R: Read> BufRead for Input<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.start == self.end && !self.eof {
            (self.start, self.end) = (0, 0);
            let got = read_some(&mut self.inner, &mut self.buf)?;
            if got == 0 {
                self.eof = true;
            }
            self.end = got;
        }
        Ok(&self.buf[self.start..self.end])
    }

    fn consume(&mut self, n: usize) {
        let taken = &self.buf[self.start..self.start + n];
        // A member longer than MAX_PEEK is never recorded, so its digest is not needed
        // (the download as a whole is hashed elsewhere).
        if self.taken <= MAX_PEEK as u64 {
            self.hasher.update(taken);
        }
        let want = (PREFIX - self.head.len()).min(n);
        self.head.extend_from_slice(&taken[..want]);
        self.taken += n as u64;
        self.total += n as u64;
        self.start += n;
    }
}

impl<R: Read> Read for Input<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

enum State<R: Read> {
    /// Between members, or before the first.
    Boundary,
    Rebuilt {
        /// Shared with the member's record in the making.
        tar: Arc<Vec<u8>>,
        at: usize,
    },
    Inflating {
        decoder: Box<flate2::bufread::GzDecoder<Input<R>>>,
        start: u64,
        /// The tar bytes so far, for the member's record (`None` past [`MAX_RECORDED`]).
        tar: Option<Vec<u8>>,
    },
    Done,
}

/// The tar stream of a gzip stream of one or more members, as flate2's
/// `MultiGzDecoder` gives it, with members the cache knows rebuilt instead of
/// inflated (see the module comment). It hands the members it gives to the
/// recorder; they are recorded once the indexer has read past them ([`Indexing`]),
/// which may be on another thread, behind this reader.
pub struct MemberReader<R: Read> {
    /// `None` while a member is inflated (the decoder owns it).
    input: Option<Input<R>>,
    state: State<R>,
    known: Known,
    recorder: Arc<Mutex<Recorder>>,
    /// Tar bytes handed out so far.
    served: u64,
    started: bool,
    /// Bytes hashed or rebuilt for candidates that were not the member.
    wasted: u64,
}

impl<R: Read> MemberReader<R> {
    pub fn new(compressed: R, known: Known, recorder: Arc<Mutex<Recorder>>) -> Self {
        MemberReader {
            input: Some(Input::new(compressed)),
            state: State::Boundary,
            known,
            recorder,
            served: 0,
            started: false,
            wasted: 0,
        }
    }

    fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().expect("member recorder lock")
    }

    /// The tar bytes of the next member if the cache has them: its compressed bytes
    /// are taken from the input only then.
    fn rebuild_next(&mut self) -> io::Result<Option<Arc<Vec<u8>>>> {
        let input = self.input.as_mut().expect("the input, between members");
        let Known { entries, by_prefix } = &mut self.known;
        // Looking costs at most MAX_CANDIDATES × MAX_PEEK per boundary; what was spent
        // in vain stays within twice what the stream gave (see the module comment).
        let budget = 2 * input.total + 2 * MAX_PEEK as u64;
        if by_prefix.is_empty() || self.wasted > budget {
            return Ok(None);
        }
        let head = input.peek(PREFIX)?;
        if head.len() < PREFIX {
            return Ok(None);
        }
        let Some(candidates) = by_prefix.get(&xxh3_64(head)) else {
            return Ok(None);
        };
        let mut recorder = self.recorder.lock().expect("member recorder lock");
        for &(entry, record) in candidates.iter().take(MAX_CANDIDATES) {
            if self.wasted > budget {
                tracing::debug!(
                    "recorded members stopped matching this download; inflating the rest"
                );
                break;
            }
            let KnownEntry { dir, records, pack } = &mut entries[entry as usize];
            let record = &records[record as usize];
            let len = record.compressed_len as usize;
            let bytes = input.peek(len)?;
            if bytes.len() < len || Sha256::digest(&bytes[..len])[..] != record.compressed {
                self.wasted += bytes.len() as u64;
                recorder.counts.mismatched += 1;
                continue;
            }
            // The member's own trailer: the CRC-32 and length (mod 2^32) of its tar.
            // (crc32fast, not flate2's Crc: with the zlib-rs backend that one runs a
            // table-driven loop that cost a fifth of a warm load's time.)
            let trailer = &bytes[len - 8..len];
            let crc = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes"));
            let length = u32::from_le_bytes(trailer[4..].try_into().expect("4 bytes"));
            let mut digests = Vec::new();
            let rebuilt = rebuild(dir, pack, record, &mut digests);
            match rebuilt {
                Ok(tar)
                    if tar.len() as u64 == record.tar_len
                        && xxh3_128(&tar) == record.tar_hash
                        && tar.len() as u32 == length
                        && crc32fast::hash(&tar) == crc =>
                {
                    input.skip(len);
                    let tar = Arc::new(tar);
                    recorder.counts.reused += 1;
                    recorder.layout_push(record.compressed, record.compressed_len);
                    let start = self.served;
                    let found = digests.into_iter().map(|(at, l, d)| (start + at, l, d));
                    recorder.digests.extend(found);
                    recorder.member(Unfinished {
                        prefix: record.prefix,
                        compressed: record.compressed,
                        compressed_len: record.compressed_len,
                        start,
                        tar: Arc::clone(&tar),
                    });
                    return Ok(Some(tar));
                }
                Ok(_) => {
                    tracing::debug!(entry = %dir.display(), "a recorded member did not rebuild to its bytes; inflating it");
                }
                Err(e) => {
                    tracing::debug!(entry = %dir.display(), error = %e, "a recorded member could not be rebuilt; inflating it");
                }
            }
            self.wasted += (len as u64).saturating_add(record.tar_len);
            recorder.counts.stale += 1;
        }
        Ok(None)
    }
}

impl<R: Read> Read for MemberReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            match &mut self.state {
                State::Done => return Ok(0),
                State::Rebuilt { tar, at } => {
                    if *at < tar.len() {
                        let n = (tar.len() - *at).min(out.len());
                        out[..n].copy_from_slice(&tar[*at..*at + n]);
                        *at += n;
                        self.served += n as u64;
                        return Ok(n);
                    }
                    self.state = State::Boundary;
                }
                State::Inflating { decoder, tar, .. } => {
                    let n = match decoder.read(out) {
                        Ok(n) => n,
                        Err(e) => {
                            // A broken member ends the stream: nothing after it is read.
                            self.state = State::Done;
                            return Err(e);
                        }
                    };
                    if n > 0 {
                        if let Some(kept) = tar {
                            if kept.len() + n <= MAX_RECORDED {
                                kept.extend_from_slice(&out[..n]);
                            } else {
                                *tar = None;
                            }
                        }
                        self.served += n as u64;
                        return Ok(n);
                    }
                    let State::Inflating {
                        decoder,
                        start,
                        tar,
                    } = std::mem::replace(&mut self.state, State::Boundary)
                    else {
                        unreachable!("matched above");
                    };
                    let mut input = decoder.into_inner();
                    let (compressed, compressed_len, prefix) = input.member_taken();
                    self.input = Some(input);
                    let mut recorder = self.recorder();
                    recorder.inflating_from = None;
                    recorder.counts.inflated += 1;
                    // Hashed whole only up to MAX_PEEK (see `Input::consume`).
                    let digest = if compressed_len <= MAX_PEEK as u64 {
                        compressed
                    } else {
                        [0; 32]
                    };
                    recorder.layout_push(digest, compressed_len);
                    let recordable = (PREFIX as u64..=MAX_PEEK as u64).contains(&compressed_len);
                    if let Some(tar) = tar.filter(|_| recordable) {
                        recorder.member(Unfinished {
                            prefix,
                            compressed,
                            compressed_len,
                            start,
                            tar: Arc::new(tar),
                        });
                    }
                }
                State::Boundary => {
                    let input = self.input.as_mut().expect("the input, between members");
                    // As MultiGzDecoder: the stream ends where a member ends and
                    // nothing follows; the first member is inflated whatever it is.
                    if self.started && input.fill_buf()?.is_empty() {
                        self.state = State::Done;
                        return Ok(0);
                    }
                    self.started = true;
                    self.state = match self.rebuild_next()? {
                        Some(tar) => State::Rebuilt { tar, at: 0 },
                        None => {
                            self.recorder().inflating_from = Some(self.served);
                            State::Inflating {
                                decoder: Box::new(flate2::bufread::GzDecoder::new(
                                    self.input.take().expect("the input, between members"),
                                )),
                                start: self.served,
                                tar: Some(Vec::new()),
                            }
                        }
                    };
                }
            }
        }
    }
}

/// How often, in tar bytes read by the indexer, the members it has read past are
/// recorded (a lock of the recorder each time).
const FINISH_EVERY: u64 = 256 * 1024;

/// The indexer's end of the tar stream: tells the recorder how far the indexer has
/// read, so that the members it has read past are recorded.
pub struct Indexing<R> {
    tar: R,
    recorder: Arc<Mutex<Recorder>>,
    read: u64,
    finished: u64,
}

impl<R: Read> Indexing<R> {
    pub fn new(tar: R, recorder: Arc<Mutex<Recorder>>) -> Self {
        Indexing {
            tar,
            recorder,
            read: 0,
            finished: 0,
        }
    }
}

impl<R: Read> Read for Indexing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Asked for the bytes at `read`, the indexer has said where every file whose
        // contents start before went: the members that end there can be recorded.
        if self.read >= self.finished + FINISH_EVERY {
            let mut recorder = self.recorder.lock().expect("member recorder lock");
            recorder.finish_through(self.read);
            self.finished = self.read;
        }
        let n = self.tar.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::fd::AsFd;

    use flate2::{Compression, GzBuilder};

    use super::*;
    use crate::archive::Limits;
    use crate::archive::writer::{WriterOptions, WrittenArchive, write_archive};
    use crate::cache::{Cache, VerifiedCheckpoint};
    use crate::checkpoint::{self, CheckpointId};
    use crate::store::local::LocalStore;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = GzBuilder::new()
            .mtime(0)
            .write(Vec::new(), Compression::default());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    /// Stores `bytes` as a checkpoint; returns its id.
    fn store_bytes(store: &LocalStore, bytes: &[u8]) -> CheckpointId {
        let sha256 = hex::encode(Sha256::digest(bytes));
        let file = tempfile::NamedTempFile::new().unwrap();
        fs::write(file.path(), bytes).unwrap();
        let written = WrittenArchive {
            sha256: sha256.clone(),
            size: bytes.len() as u64,
            members: Vec::new(),
        };
        checkpoint::store_archive(store, file.path(), &written, None, None, &|_, _| {}).unwrap();
        CheckpointId::parse(&sha256).unwrap()
    }

    /// A workspace: small text files, large noisy ones, directories; `turn` changes
    /// one file and adds one.
    fn workspace(dir: &Path, turn: u64) -> Vec<u8> {
        for i in 0..120u64 {
            let sub = dir.join(format!("d{}", i % 7));
            fs::create_dir_all(&sub).unwrap();
            let data = if i % 10 == 0 {
                noise(150_000 + i as usize * 997, i)
            } else {
                format!("line {i}\n")
                    .repeat(200 + i as usize * 13)
                    .into_bytes()
            };
            fs::write(sub.join(format!("f{i}")), data).unwrap();
        }
        if turn > 0 {
            fs::write(dir.join("d3/f45"), format!("edited in turn {turn}\n")).unwrap();
            fs::write(dir.join(format!("new{turn}")), noise(20_000, turn)).unwrap();
        }
        // Fixed times: turns written in different seconds must differ only where
        // they were changed.
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        for sub in fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
            if sub.is_dir() {
                for file in fs::read_dir(&sub).unwrap().map(|e| e.unwrap().path()) {
                    File::options()
                        .write(true)
                        .open(file)
                        .unwrap()
                        .set_modified(when)
                        .unwrap();
                }
            }
            File::open(&sub).unwrap().set_modified(when).unwrap();
        }
        let root = File::open(dir).unwrap();
        let options = WriterOptions {
            max_size: u64::MAX,
            max_unpacked: u64::MAX,
            threads: 2,
            members: None,
        };
        let mut out = Vec::new();
        write_archive(root.as_fd(), &mut out, &options).unwrap();
        out
    }

    /// `n` turns of [`workspace`], stored; their ids.
    fn stored_turns(work: &Path, store: &LocalStore, n: u64) -> Vec<CheckpointId> {
        (0..n)
            .map(|turn| store_bytes(store, &workspace(&work.join(format!("tree{turn}")), turn)))
            .collect()
    }

    fn load(cache: &Cache, store: &LocalStore, id: &CheckpointId) -> Arc<VerifiedCheckpoint> {
        cache.load(store, id, u64::MAX, Limits::DEFAULT, 0).unwrap()
    }

    /// Every file's bytes, by node.
    fn contents(checkpoint: &VerifiedCheckpoint) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        for (node, entry) in checkpoint.index.nodes.iter().enumerate() {
            if let NodeKind::File { size, location, .. } = entry.kind {
                all.push(match location {
                    FileLocation::Packed { offset } => {
                        checkpoint.read_packed(offset, 0, size as usize).unwrap()
                    }
                    FileLocation::Own => {
                        let mut data = Vec::new();
                        let mut file = checkpoint.open_own(node as u32).unwrap();
                        file.read_to_end(&mut data).unwrap();
                        data
                    }
                });
            }
        }
        all
    }

    /// Loads `id` into a cache of its own, inflating everything: what a load must give.
    fn fresh(store: &LocalStore, id: &CheckpointId) -> (Index, Vec<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), u64::MAX).unwrap();
        let checkpoint = load(&cache, store, id);
        assert_eq!(cache.stats().reused_members, 0);
        (checkpoint.index.clone(), contents(&checkpoint))
    }

    /// The gzip members of `bytes`, as a reader splitting at member ends sees them,
    /// and the tar bytes of each.
    fn members_of(bytes: &[u8]) -> (Vec<MemberSpan>, Vec<Vec<u8>>) {
        let (mut spans, mut tars) = (Vec::new(), Vec::new());
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut decoder = flate2::bufread::GzDecoder::new(rest);
            let mut tar = Vec::new();
            decoder.read_to_end(&mut tar).unwrap();
            let left = decoder.into_inner().len();
            let member = &rest[..rest.len() - left];
            spans.push(MemberSpan {
                digest: Sha256::digest(member).into(),
                length: member.len() as u64,
            });
            tars.push(tar);
            rest = &rest[rest.len() - left..];
        }
        (spans, tars)
    }

    /// A member cache in `work/cache/members` where `cache` records the layouts of
    /// its downloads.
    fn recording_layouts(cache: &Cache, work: &Path) -> Arc<crate::archive::members::MemberCache> {
        let dir = work.join("cache/members");
        let members = Arc::new(crate::archive::members::MemberCache::open(&dir, 1 << 30).unwrap());
        cache.record_layouts_in(Arc::clone(&members));
        members
    }

    /// What a load recorded rebuilds, in order, to the object's own members' tar
    /// bytes (what priming the member cache compresses), whether the load inflated
    /// them (turn 0) or rebuilt them (turn 1); only members too short to be worth a
    /// record are missing.
    #[test]
    fn recorded_members_rebuild_to_the_members_of_the_object() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let turns = stored_turns(work.path(), &store, 2);
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        for id in &turns {
            let checkpoint = load(&cache, &store, id);
            let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
            let (spans, tars) = members_of(&bytes);
            let mut given = Vec::new();
            let weak = Arc::downgrade(&checkpoint);
            let count = crate::cache::entry::member_tars(&weak, |tar| {
                given.push(tar.to_vec());
                true
            })
            .unwrap();
            assert_eq!(count as usize, given.len());
            let short = spans.iter().filter(|s| s.length < PREFIX as u64).count();
            assert_eq!(given.len() + short, tars.len(), "{id}");
            let mut rest = tars.iter();
            for tar in &given {
                assert!(
                    rest.any(|t| t == tar),
                    "{id}: a member out of order or wrong"
                );
            }
            let mut seen = 0;
            crate::cache::entry::member_tars(&weak, |_| {
                seen += 1;
                seen < 3
            })
            .unwrap();
            assert_eq!(seen, 3, "it stops when told");
            // Once the checkpoint is gone (evicted), nothing more is rebuilt.
            drop(checkpoint);
            let after = crate::cache::entry::member_tars(&weak, |_| true).unwrap();
            assert_eq!(after, 0);
        }
        assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
    }

    /// A load, which inflates on a thread of its own ahead of the indexer, records
    /// exactly what one thread reading member by member records, in every run
    /// whatever the timing: contents as ranges of the entry, never as copies made
    /// because the indexer's position ran past a member not yet handed over.
    #[test]
    fn a_load_records_what_one_thread_records() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let id = &stored_turns(work.path(), &store, 1)[0];
        let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
        let reference = Cache::open(&work.path().join("reference"), u64::MAX).unwrap();
        let mut pending = reference.begin().unwrap();
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        pending.record_members(Arc::clone(&recorder));
        let members = MemberReader::new(&bytes[..], Known::default(), Arc::clone(&recorder));
        let mut reader = Indexing::new(members, recorder);
        let index =
            crate::archive::index::build(&mut reader, &mut pending, Limits::DEFAULT, 0).unwrap();
        let tail = crate::archive::gz::CHUNK_SIZE as u64 + 1;
        io::copy(&mut (&mut reader).take(tail), &mut io::sink()).unwrap();
        let verified_at = std::time::SystemTime::now();
        let provenance = crate::cache::Provenance::Store { verified_at };
        reference.finish(pending, id, index, provenance).unwrap();
        let want = fs::read(reference.entry_dir(id).join("members")).unwrap();
        let (records, _) = read_records(&reference.entry_dir(id).join("members")).unwrap();
        assert!(records.len() > 5, "{} records", records.len());
        for run in 0..16 {
            let cache = Cache::open(&work.path().join(format!("cache-{run}")), u64::MAX).unwrap();
            let _checkpoint = load(&cache, &store, id);
            let got = fs::read(cache.entry_dir(id).join("members")).unwrap();
            assert!(
                got == want,
                "run {run}: {} bytes of records against {}",
                got.len(),
                want.len()
            );
        }
    }

    /// The race of `a_load_records_what_one_thread_records`, in order: the indexer
    /// reads past the end of a member the reader has not handed over yet (it is
    /// still at the member's trailer), then the member comes. Its contents are still
    /// known.
    #[test]
    fn contents_of_the_member_being_inflated_are_kept() {
        let mut recorder = Recorder {
            inflating_from: Some(1000),
            ..Recorder::default()
        };
        recorder.contents_at(7, 1512, 2000);
        recorder.finish_through(4096);
        recorder.member(Unfinished {
            prefix: 0,
            compressed: [0; 32],
            compressed_len: 300,
            start: 1000,
            tar: Arc::new(vec![1; 3000]),
        });
        recorder.inflating_from = None;
        recorder.finish_through(u64::MAX);
        let [record] = &recorder.done[..] else {
            panic!("{} records", recorder.done.len());
        };
        assert!(
            record.pieces.iter().any(|p| matches!(
                p,
                Piece::Contents {
                    node: 7,
                    len: 2000,
                    ..
                }
            )),
            "the file's contents were recorded as raw bytes"
        );
    }

    /// One gzip member of `payload` in a stored block, padded with empty stored
    /// blocks to `PREFIX` compressed bytes and more, so that it would be recorded.
    fn padded_member(payload: &[u8]) -> Vec<u8> {
        let mut member = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        for _ in 0..60 {
            member.extend_from_slice(&[0, 0, 0, 0xff, 0xff]);
        }
        let len = payload.len() as u16;
        member.push(1);
        member.extend_from_slice(&len.to_le_bytes());
        member.extend_from_slice(&(!len).to_le_bytes());
        member.extend_from_slice(payload);
        member.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        member.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        member
    }

    /// However many members a reader running ahead gives before the indexer reads
    /// past them, those waiting stay bounded: members with no tar bytes do not wait
    /// at all, and past [`MAX_UNFINISHED`] the rest are not recorded.
    #[test]
    fn members_waiting_for_the_indexer_stay_bounded() {
        for (payload, count, waiting) in [
            (&b""[..], 10_000, 0),
            (&b"x"[..], 2 * MAX_UNFINISHED, MAX_UNFINISHED),
        ] {
            let member = padded_member(payload);
            assert!(member.len() >= PREFIX);
            let stream = member.repeat(count);
            let recorder = Arc::new(Mutex::new(Recorder::default()));
            let mut reader =
                MemberReader::new(&stream[..], Known::default(), Arc::clone(&recorder));
            let mut tar = Vec::new();
            reader.read_to_end(&mut tar).unwrap();
            assert_eq!(tar.len(), payload.len() * count);
            assert_eq!(recorder.lock().unwrap().unfinished(), waiting);
        }
    }

    /// A verified download's layout is recorded, whether its members were inflated
    /// (turn 0) or rebuilt from the turn before (turn 1): a capture of either tree
    /// then finds every member of its archive in that object, at its own offset.
    #[test]
    fn downloads_record_their_layout_for_the_store_to_copy_from() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let turns = stored_turns(work.path(), &store, 2);
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        let members = recording_layouts(&cache, work.path());
        for (turn, id) in turns.iter().enumerate() {
            load(&cache, &store, id);
            let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
            let (spans, _) = members_of(&bytes);
            assert!(spans.len() > 5, "{} members", spans.len());
            // Every byte is found, and found right, in this object or the one before.
            let runs = members.reuse(&spans);
            let found: u64 = runs.iter().map(|r| r.length).sum();
            assert_eq!(found, bytes.len() as u64, "turn {turn}: {runs:?}");
            for run in runs {
                let source = fs::read(work.path().join("store").join(&run.source)).unwrap();
                let (at, from, len) = (
                    run.offset as usize,
                    run.source_offset as usize,
                    run.length as usize,
                );
                assert!(
                    source[from..from + len] == bytes[at..at + len],
                    "turn {turn}: {run:?}"
                );
            }
        }
        assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
    }

    /// An object of tiny members (no capture makes them) leaves no layout: every
    /// capture that looks for its members in layouts would pay for its thousands.
    #[test]
    fn a_download_of_tiny_members_records_no_layout() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let archive = workspace(&work.path().join("tree"), 0);
        let mut tar = Vec::new();
        flate2::read::MultiGzDecoder::new(&archive[..])
            .read_to_end(&mut tar)
            .unwrap();
        let tiny: Vec<u8> = tar.chunks(100).flat_map(gzip).collect();
        let id = store_bytes(&store, &tiny);
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        let members = recording_layouts(&cache, work.path());
        load(&cache, &store, &id);
        let (spans, _) = members_of(&tiny);
        assert!(spans.len() > 1000, "{} members", spans.len());
        assert!(members.reuse(&spans).is_empty());
        // The archive as capture wrote it: its layout is kept.
        let id = store_bytes(&store, &archive);
        load(&cache, &store, &id);
        let (spans, _) = members_of(&archive);
        assert!(!members.reuse(&spans).is_empty());
    }

    #[test]
    fn a_turn_is_rebuilt_from_the_members_of_the_turn_before() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let turns = stored_turns(work.path(), &store, 3);
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        load(&cache, &store, &turns[0]);
        let first = cache.stats();
        assert_eq!(first.reused_members, 0);
        assert!(first.inflated_members > 5, "{first:?}");

        let second = load(&cache, &store, &turns[1]);
        let stats = cache.stats();
        let (reused, inflated) = (
            stats.reused_members,
            stats.inflated_members - first.inflated_members,
        );
        assert!(reused >= first.inflated_members - 4, "{stats:?}");
        assert!(inflated <= 4, "{stats:?}");
        assert_eq!(
            (second.index.clone(), contents(&second)),
            fresh(&store, &turns[1])
        );
        // Files rebuilt whole were linked by the digests their records gave: right ones.
        let blobs = fs::read_dir(work.path().join("cache/blobs")).unwrap();
        let mut shared = 0;
        for blob in blobs.map(|b| b.unwrap()) {
            let name = blob.file_name().into_string().unwrap();
            let bytes = fs::read(blob.path()).unwrap();
            assert_eq!(hex::encode(Sha256::digest(bytes)), name);
            use std::os::unix::fs::MetadataExt;
            shared += u64::from(blob.metadata().unwrap().nlink() == 3);
        }
        assert!(shared >= 10, "{shared} blobs shared by both turns");

        // Every file of both entries damaged on disk (in place, as a bad disk would):
        // no member is rebuilt, and turn 2 still comes out as inflating it all gives.
        for turn in &turns[..2] {
            let entry = work.path().join("cache/checkpoints").join(turn.as_str());
            let files = fs::read_dir(entry.join("files")).unwrap();
            for path in files.map(|f| f.unwrap().path()).chain([entry.join("pack")]) {
                let mut bytes = fs::read(&path).unwrap();
                for b in bytes.iter_mut().step_by(97) {
                    *b ^= 0x55;
                }
                fs::write(&path, bytes).unwrap();
            }
        }
        let before = cache.stats();
        let third = load(&cache, &store, &turns[2]);
        assert_eq!(
            (third.index.clone(), contents(&third)),
            fresh(&store, &turns[2])
        );
        let after = cache.stats();
        assert_eq!(after.reused_members, before.reused_members, "{after:?}");
    }

    /// A record whose whole-file digests are wrong (each names another file's blob)
    /// makes no file of the new entry take another's bytes, and no blob get a name
    /// that is not its digest: a recorded digest only says which blob to compare.
    #[test]
    fn a_wrong_recorded_digest_links_nothing_wrong() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let turns = stored_turns(work.path(), &store, 2);
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        load(&cache, &store, &turns[0]);
        let path = work
            .path()
            .join("cache/checkpoints")
            .join(turns[0].as_str())
            .join("members");
        let mut records = read_records(&path).unwrap().0;
        let mut digests: Vec<[u8; 32]> = Vec::new();
        for record in &records {
            for segment in &record.segments {
                if let Segment::Whole { digest, .. } = segment {
                    digests.push(*digest);
                }
            }
        }
        assert!(
            digests.len() >= 10,
            "{} whole files recorded",
            digests.len()
        );
        digests.rotate_left(1);
        let mut next = digests.into_iter();
        for record in &mut records {
            for segment in &mut record.segments {
                if let Segment::Whole { digest, .. } = segment {
                    *digest = next.next().unwrap();
                }
            }
        }
        fs::remove_file(&path).unwrap();
        write_records(&path, &records).unwrap();

        let second = load(&cache, &store, &turns[1]);
        assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
        assert_eq!(
            (second.index.clone(), contents(&second)),
            fresh(&store, &turns[1])
        );
        for blob in fs::read_dir(work.path().join("cache/blobs")).unwrap() {
            let blob = blob.unwrap();
            let bytes = fs::read(blob.path()).unwrap();
            let name = blob.file_name().into_string().unwrap();
            assert_eq!(hex::encode(Sha256::digest(bytes)), name);
        }
    }

    /// tar bytes of `entries` (path, data), or a pax header giving the next entry
    /// the path `pax` when `data` is None.
    fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, data) in entries {
            let mut header = tar::Header::new_ustar();
            match data {
                Some(data) => {
                    header.set_path(path).unwrap();
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    header.set_mode(0o644);
                    header.set_cksum();
                    out.extend_from_slice(header.as_bytes());
                    out.extend_from_slice(data);
                    out.resize(out.len().next_multiple_of(512), 0);
                }
                None => {
                    let record = format!("path={path}\n");
                    let mut len = record.len() + 2;
                    len += (format!("{len} {record}").len() - len).min(1);
                    let record = format!("{len} {record}");
                    assert_eq!(record.len(), len);
                    header.set_path("PaxHeader").unwrap();
                    header.set_entry_type(tar::EntryType::XHeader);
                    header.set_size(record.len() as u64);
                    header.set_cksum();
                    out.extend_from_slice(header.as_bytes());
                    out.extend_from_slice(record.as_bytes());
                    out.resize(out.len().next_multiple_of(512), 0);
                }
            }
        }
        out
    }

    /// A member known from one archive follows, in another, a member whose pax header
    /// renames its first entry: the rebuilt bytes mean what they mean there.
    #[test]
    fn a_rebuilt_member_means_what_it_means_in_the_new_archive() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let secret = noise(3000, 9);
        let shared = gzip(&tar_of(&[("b", Some(&secret))]));
        assert!(shared.len() > PREFIX);
        let end = gzip(&[0; 1024]);
        let first = [
            gzip(&tar_of(&[("a", Some(b"a\n"))])),
            shared.clone(),
            end.clone(),
        ]
        .concat();
        let second = [
            gzip(&tar_of(&[("x/renamed", None)])),
            shared,
            gzip(&tar_of(&[("c", Some(b"c\n"))])),
            end,
        ]
        .concat();
        let (first, second) = (store_bytes(&store, &first), store_bytes(&store, &second));
        let cache = Cache::open(&work.path().join("cache"), u64::MAX).unwrap();
        load(&cache, &store, &first);
        let loaded = load(&cache, &store, &second);
        assert_eq!(cache.stats().reused_members, 1, "{:?}", cache.stats());
        assert_eq!(
            (loaded.index.clone(), contents(&loaded)),
            fresh(&store, &second)
        );
        let index = &loaded.index;
        let x = index.lookup(crate::archive::index::ROOT, b"x").unwrap();
        assert!(index.lookup(x, b"renamed").is_some());
        assert!(index.lookup(crate::archive::index::ROOT, b"b").is_none());
    }

    /// A gzip member whose first [`PREFIX`] bytes are its header (a long comment), so
    /// that members with other data share them.
    fn gzip_commented(data: &[u8]) -> Vec<u8> {
        let mut gz = GzBuilder::new()
            .mtime(0)
            .comment(vec![b'c'; PREFIX + 44])
            .write(Vec::new(), Compression::default());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    /// Loads `first` then `second` into one cache; gives the cache's directory and
    /// `first`'s entry.
    fn records_of(work: &Path, store: &LocalStore, first: &[u8]) -> (Cache, PathBuf) {
        let first = store_bytes(store, first);
        let cache = Cache::open(&work.join("cache"), u64::MAX).unwrap();
        load(&cache, store, &first);
        let entry = work.join("cache/checkpoints").join(first.as_str());
        (cache, entry)
    }

    /// A record that rebuilds, consistently with its own xxh3, to bytes other than its
    /// member holds is caught by the member's gzip trailer (CRC-32): inflated.
    #[test]
    fn a_record_that_lies_consistently_is_caught_by_the_trailer() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let member = gzip(&tar_of(&[("a", Some(&noise(3000, 4)))]));
        let end = gzip(&[0; 1024]);
        let (cache, entry) =
            records_of(work.path(), &store, &[member.clone(), end.clone()].concat());
        let path = entry.join("members");
        let mut records = read_records(&path).unwrap().0;
        let record = records
            .iter_mut()
            .find(|r| r.compressed_len == member.len() as u64)
            .unwrap();
        let raw = record.segments.iter_mut().find_map(|s| match s {
            Segment::Raw(bytes) => Some(bytes),
            _ => None,
        });
        raw.unwrap()[0] ^= 1;
        let mut pack = None;
        let lie = rebuild(&entry, &mut pack, record, &mut Vec::new()).unwrap();
        record.tar_hash = xxh3_128(&lie);
        fs::remove_file(&path).unwrap();
        write_records(&path, &records).unwrap();

        let more = gzip(&tar_of(&[("c", Some(b"c\n"))]));
        let second = store_bytes(&store, &[member, more, end].concat());
        let loaded = load(&cache, &store, &second);
        assert_eq!(cache.stats().reused_members, 0, "{:?}", cache.stats());
        assert_eq!(
            (loaded.index.clone(), contents(&loaded)),
            fresh(&store, &second)
        );
    }

    /// A member with no tar bytes (here a long header and nothing else) gets no
    /// record: there is nothing to rebuild, and records are paid for.
    #[test]
    fn members_without_tar_bytes_are_not_recorded() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let empty = gzip_commented(b"");
        assert!(empty.len() > PREFIX);
        let full = gzip(&tar_of(&[("a", Some(&noise(3000, 5)))]));
        let archive = [full.clone(), empty, gzip(&[0; 1024])].concat();
        let (_cache, entry) = records_of(work.path(), &store, &archive);
        let records = read_records(&entry.join("members")).unwrap().0;
        let lens: Vec<u64> = records.iter().map(|r| r.compressed_len).collect();
        assert_eq!(lens, [full.len() as u64], "{lens:?}");
    }

    /// A record found by `prefix`, of `tar_len` bytes made of `segments`, with no
    /// entry files behind it: for what reading records does, not rebuilding.
    fn bare_record(prefix: u64, id: u8, tar_len: u64, segments: Vec<Segment>) -> MemberRecord {
        MemberRecord {
            prefix,
            compressed: [id; 32],
            compressed_len: 1000,
            tar_len,
            tar_hash: 0,
            segments,
        }
    }

    /// `n` entry directories in `work`, each with `records` as its members file.
    fn entries_with(work: &Path, n: usize, records: &[MemberRecord]) -> Vec<PathBuf> {
        (0..n)
            .map(|d| {
                let dir = work.join(d.to_string());
                fs::create_dir(&dir).unwrap();
                write_records(&dir.join("members"), records).unwrap();
                dir
            })
            .collect()
    }

    /// Many records with the same first bytes fill one bucket only up to what a
    /// boundary checks.
    #[test]
    fn a_prefix_bucket_holds_no_more_than_a_boundary_checks() {
        let work = tempfile::tempdir().unwrap();
        let records: Vec<MemberRecord> = (0..200)
            .map(|i| bare_record(7, i, 512, vec![Segment::Zeros(512)]))
            .collect();
        let known = Known::read(entries_with(work.path(), 3, &records));
        assert_eq!(known.by_prefix.len(), 1);
        assert_eq!(known.by_prefix[&7].len(), MAX_CANDIDATES);
    }

    /// Records that do not hold what their decoder would take are not used: too many
    /// segments for their length, a members file that is a symlink or a FIFO.
    #[test]
    fn records_out_of_bounds_or_not_regular_files_are_not_read() {
        let work = tempfile::tempdir().unwrap();
        let many = bare_record(1, 1, 512, vec![Segment::Zeros(1); 512]);
        let path = work.path().join("many");
        write_records(&path, std::slice::from_ref(&many)).unwrap();
        assert_eq!(
            read_records(&path).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let fine = MemberRecord {
            segments: vec![Segment::Zeros(512)],
            ..many
        };
        let path = work.path().join("fine");
        write_records(&path, std::slice::from_ref(&fine)).unwrap();
        assert_eq!(read_records(&path).unwrap().0, [fine]);

        let link = work.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_records(&link).is_err());
        let fifo = work.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        // Would block forever without O_NONBLOCK (no writer).
        assert_eq!(
            read_records(&fifo).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    /// An archive whose members all start as a recorded long member does, but are not
    /// it, costs a bounded number of full comparisons, not one per member.
    #[test]
    fn members_that_only_start_like_a_record_stop_being_compared() {
        let work = tempfile::tempdir().unwrap();
        let store = LocalStore::create(&work.path().join("store")).unwrap();
        let long = gzip_commented(&tar_of(&[("big", Some(&noise(1 << 20, 6)))]));
        let end = gzip(&[0; 1024]);
        let (_cache, entry) =
            records_of(work.path(), &store, &[long.clone(), end.clone()].concat());
        let known = Known::read([entry]);
        assert!(!known.is_empty());

        let decoy = gzip_commented(b"");
        assert_eq!(decoy[..PREFIX], long[..PREFIX]);
        let mut attack = decoy.repeat(300);
        attack.extend(gzip(&noise(2 << 20, 7)));
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let reader = MemberReader::new(&attack[..], known, Arc::clone(&recorder));
        let ours = inflate_all(reader).unwrap();
        assert_eq!(
            ours,
            inflate_all(flate2::read::MultiGzDecoder::new(&attack[..])).unwrap()
        );
        let counts = recorder.lock().unwrap().counts();
        assert_eq!(counts.inflated, 301);
        // 1 MiB each: about (2 × stream + 2 × MAX_PEEK) / 1 MiB comparisons at most.
        assert!((2..=16).contains(&counts.mismatched), "{counts:?}");
    }

    /// Records small on disk but large in memory are refused as a whole: what a
    /// load reads back costs what a load that made them could have spent.
    #[test]
    fn records_costing_more_than_the_budget_in_memory_are_not_read() {
        let work = tempfile::tempdir().unwrap();
        let many = vec![bare_record(1, 1, 4096, vec![Segment::Zeros(16); 200]); 2000];
        assert!(cost(200, 0) * 2000 > MAX_RECORDS);
        let path = work.path().join("members");
        write_records(&path, &many).unwrap();
        assert!(fs::metadata(&path).unwrap().len() < MAX_RECORDS / 4);
        assert_eq!(
            read_records(&path).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let path = work.path().join("fewer");
        write_records(&path, &many[..100]).unwrap();
        assert_eq!(read_records(&path).unwrap().0.len(), 100);
    }

    /// The records of several entries are read until they cost the budget of one:
    /// memory for records stays under twice it, whatever the entries hold.
    #[test]
    fn entries_are_read_until_their_records_cost_the_budget() {
        let work = tempfile::tempdir().unwrap();
        let records: Vec<MemberRecord> = (0..900u64)
            .map(|i| bare_record(i, 1, 4096, vec![Segment::Zeros(16); 200]))
            .collect();
        let one = cost(200, 0) * 900;
        assert!(one < MAX_RECORDS && 2 * one > MAX_RECORDS);
        let dirs = entries_with(work.path(), 3, &records);
        assert_eq!(Known::read(dirs).entries.len(), 2);
    }

    /// Where file contents went is kept only while a member that may hold them is
    /// still to be recorded: an archive of no recordable member keeps none of it.
    #[test]
    fn contents_are_forgotten_once_no_member_needs_them() {
        let mut recorder = Recorder::default();
        for i in 0..1000u64 {
            recorder.contents_at(i as u32, i * 1024 + 512, 100);
        }
        recorder.finish_through(500 * 1024);
        assert_eq!(recorder.contents.len(), 500);
        recorder.member(Unfinished {
            prefix: 0,
            compressed: [0; 32],
            compressed_len: 300,
            start: 600 * 1024,
            tar: Arc::new(vec![0; 1024]),
        });
        recorder.finish_through(900 * 1024);
        // The member (600 KiB to 601 KiB) was recorded, and everything before 900 KiB
        // went with it.
        assert_eq!(recorder.contents.len(), 100);
        assert_eq!(recorder.done.len(), 1);
    }

    fn inflate_all(mut reader: impl Read) -> Result<Vec<u8>, ()> {
        let mut out = Vec::new();
        let mut buf = [0u8; 777];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => return Err(()),
            }
        }
    }

    /// Without records, the reader is flate2's MultiGzDecoder, also on bad input.
    #[test]
    fn the_reader_inflates_as_multigzdecoder_does() {
        let a = gzip(&noise(5000, 1));
        let b = gzip(b"second member\n");
        let cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            a.clone(),
            [a.clone(), b.clone()].concat(),
            [a.clone(), b.clone(), b"garbage".to_vec()].concat(),
            [a.clone(), vec![0; 20]].concat(),
            a[..a.len() - 3].to_vec(),
            [a.clone(), b[..5].to_vec()].concat(),
            b"not gzip at all".to_vec(),
            [a.clone(), gzip(b"")].concat(),
        ];
        for (i, case) in cases.iter().enumerate() {
            let recorder = Arc::new(Mutex::new(Recorder::default()));
            let mut reader = MemberReader::new(&case[..], Known::default(), recorder);
            let ours = inflate_all(&mut reader);
            let theirs = inflate_all(flate2::read::MultiGzDecoder::new(&case[..]));
            assert_eq!(ours, theirs, "case {i}");
            if ours.is_err() {
                // After an error the stream has ended.
                assert_eq!(reader.read(&mut [0; 16]).unwrap(), 0, "case {i}");
            }
        }
    }
}
