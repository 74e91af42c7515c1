//! The recorder: collects the records of the entry being loaded. The reader hands it
//! each member as inflation or a rebuild ends it, the indexer says where file contents
//! start in the tar stream, and once the indexer has read past a member its record
//! can be made.
//!
//! Memory is bounded whatever the archive: at most [`MAX_UNFINISHED`] members wait,
//! records cost at most [`MAX_RECORDS`], a layout holds at most
//! [`MAX_LAYOUT_MEMBERS`] members.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_128;

use crate::archive::gz::MemberSpan;
use crate::archive::index::{FileLocation, Index, NodeKind};

use super::records::{MemberRecord, Segment, cost};
use super::{MAX_LAYOUT_MEMBERS, MAX_RECORDS, MAX_UNFINISHED, MIN_LAYOUT_AVERAGE, ZERO_RUN};

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
pub(super) struct Unfinished {
    pub(super) prefix: u64,
    pub(super) compressed: [u8; 32],
    pub(super) compressed_len: u64,
    pub(super) start: u64,
    pub(super) tar: Arc<Vec<u8>>,
}

pub(super) enum Piece {
    Raw(Vec<u8>),
    Zeros(u64),
    Contents { node: u32, offset: u64, len: u64 },
}

pub(super) struct Unresolved {
    pub(super) prefix: u64,
    pub(super) compressed: [u8; 32],
    pub(super) compressed_len: u64,
    pub(super) tar_len: u64,
    pub(super) tar_hash: u128,
    pub(super) pieces: Vec<Piece>,
}

/// Collects the records of the entry being loaded: the reader hands it members, the
/// indexer (through the entry's content sink) says where file contents start in the
/// tar stream and which node holds them.
#[derive(Default)]
pub struct Recorder {
    pub(super) members: VecDeque<Unfinished>,
    /// Where the member being inflated starts: its contents are needed for its
    /// record once it ends, though it is not in `members` yet.
    pub(super) inflating_from: Option<u64>,
    /// (tar offset, length, node) of file contents, in stream order.
    pub(super) contents: VecDeque<(u64, u64, u32)>,
    pub(super) done: Vec<Unresolved>,
    /// What `done` takes in memory ([`cost`]), bounded by [`MAX_RECORDS`].
    pub(super) cost: u64,
    /// (tar offset, length, SHA-256) of whole files rebuilt, in stream order.
    pub(super) digests: VecDeque<(u64, u64, [u8; 32])>,
    pub(super) counts: ReuseCounts,
    /// Every member of the download so far, in order: the SHA-256 of its compressed
    /// bytes (zeros past [`MAX_PEEK`], where it is not computed; no member of a
    /// capture is that long) and their length.
    pub(super) layout: Vec<MemberSpan>,
    /// More than [`MAX_LAYOUT_MEMBERS`] came: no layout.
    pub(super) layout_dropped: bool,
}

impl Recorder {
    pub fn counts(&self) -> ReuseCounts {
        self.counts
    }

    /// The download's members, in order from its first byte, if they were few enough
    /// to keep: where a capture may find its own members in this object, for the
    /// store to copy them (see `crate::members::store`). Members the indexer had no
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

    pub(super) fn layout_push(&mut self, digest: [u8; 32], length: u64) {
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

    pub(super) fn member(&mut self, member: Unfinished) {
        // An empty member has nothing to rebuild.
        if !member.tar.is_empty() && self.members.len() < MAX_UNFINISHED {
            self.members.push_back(member);
        }
    }

    /// Members of this load waiting for the indexer to read past them.
    #[cfg(test)]
    pub(super) fn unfinished(&self) -> usize {
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

    pub(super) fn finish_member(&mut self, member: Unfinished) {
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

/// How many zero bytes `bytes` starts with.
fn zeros_at(bytes: &[u8]) -> usize {
    let words = bytes
        .chunks_exact(8)
        .take_while(|word| word.iter().all(|&b| b == 0))
        .count();
    let tail = &bytes[words * 8..];
    words * 8 + tail.iter().take_while(|&&b| b == 0).count()
}

/// Splits raw tar bytes into runs of zeros (padding, empty header fields) and the rest.
/// A raw piece ends where a run of at least [`ZERO_RUN`] zeros starts, or a run of
/// zeros that ends the bytes. (Every header and its padding of a load passes here:
/// the zeros are counted eight bytes at a time, and the raw bytes skipped to the
/// next zero.)
pub(super) fn raw_pieces(mut bytes: &[u8], out: &mut Vec<Piece>) {
    while !bytes.is_empty() {
        let zeros = zeros_at(bytes);
        if zeros >= ZERO_RUN || zeros == bytes.len() {
            out.push(Piece::Zeros(zeros as u64));
            bytes = &bytes[zeros..];
            continue;
        }
        // Up to the next run of zeros long enough to be worth its own piece.
        let mut end = zeros;
        loop {
            let Some(next) = bytes[end..].iter().position(|&b| b == 0) else {
                end = bytes.len();
                break;
            };
            let at = end + next;
            let run = zeros_at(&bytes[at..]);
            if run >= ZERO_RUN || at + run == bytes.len() {
                end = at;
                break;
            }
            end = at + run;
        }
        match out.last_mut() {
            Some(Piece::Raw(raw)) => raw.extend_from_slice(&bytes[..end]),
            _ => out.push(Piece::Raw(bytes[..end].to_vec())),
        }
        bytes = &bytes[end..];
    }
}
