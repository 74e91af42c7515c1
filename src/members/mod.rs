//! Gzip members: what makes turn N+1 cost what changed.
//!
//! Capture cuts an archive into gzip members where the tree says, not where offsets
//! fall (see `crate::archive::gz`), so that consecutive turns share most of their
//! members byte for byte. This room keeps what lets one turn use the last one's work,
//! on each side of the store:
//! - capturing ([`store`]): members compressed before are kept on disk by the SHA-256
//!   of their data and taken instead of being compressed again, and the layouts of
//!   recent objects let the store copy the ranges it already holds (where a copy is
//!   worth what checking it costs: [`costs`]); a put also keeps
//!   what it saw of each file of the directory ([`tree`]), so that the next put of it
//!   takes the members of unchanged files without reading them;
//! - loading ([`records`], [`recorder`], [`reader`]): a cache entry records how to
//!   rebuild, from its own files, the tar bytes of each member it inflated, and the
//!   next load rebuilds a member whose compressed bytes match instead of inflating it.
//!
//! Neither side changes what is written or what is checked: a member is reused only
//! when its bytes are proven to be the ones it stands for (for [`tree`], by the
//! files' stamps, as git's index does: the README says what a stamp cannot see), and
//! a missing, damaged or planted file here costs time, never a wrong byte.
//!
//! # Loading turn N+1 knowing turn N
//!
//! While a checkpoint is downloaded and hashed (all of it, always, before anything is
//! shown: this room changes how the tar stream is obtained, never what is checked),
//! [`reader::MemberReader`] turns the compressed stream into the tar stream the
//! indexer reads, member by member (on a thread of its own, a few chunks ahead of the
//! indexer, which tells the recorder how far it has read: [`reader::Indexing`]). At
//! each member boundary it looks for a member that an entry of the cache recorded:
//! when the next compressed bytes are exactly that member (same length, same
//! SHA-256), its tar bytes are put together again from that entry's files instead of
//! being inflated. Every other member is inflated.
//!
//! Each entry records its members in `<entry>/members` ([`records::MemberRecord`]: the
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

pub mod costs;
pub mod reader;
pub mod recorder;
pub mod records;
pub mod store;
pub mod tree;

#[cfg(test)]
mod tests;

/// Compressed bytes hashed to find candidates (members shorter are not recorded).
const PREFIX: usize = 256;
/// The longest member looked ahead for, and so recorded, compressed.
const MAX_PEEK: usize = 4 << 20;
/// The most tar bytes of one member kept until its record is made.
const MAX_RECORDED: usize = 4 << 20;
/// Zero runs at least this long are recorded by their length (a segment in memory
/// costs more than 32 bytes: shorter runs are kept as raw bytes).
const ZERO_RUN: usize = 64;
/// A `members` file larger than this is not read, and the records of one entry cost
/// no more than this in memory ([`records::cost`]; about the headers of 20,000
/// files: records are metadata).
const MAX_RECORDS: u64 = 16 << 20;
/// Candidates checked at one boundary: each costs hashing up to [`MAX_PEEK`] bytes,
/// and an archive made to give many records the same first bytes must not make a
/// load quadratic.
const MAX_CANDIDATES: usize = 4;
/// The most members waiting for the indexer to read past them: a reader running
/// ahead ([`reader::MemberReader::ahead`]) is at most a few MiB of tar ahead, which
/// legitimate members fill with far fewer; members beyond (an archive of tiny members) are not
/// recorded, so that what waits stays small whatever the archive.
const MAX_UNFINISHED: usize = 4096;
/// The most members of one download whose layout is kept (40 bytes each in memory):
/// capture makes about one per MiB of tar, so this covers archives of tens of GiB.
const MAX_LAYOUT_MEMBERS: usize = 1 << 16;
/// Layouts whose members average fewer compressed bytes are not kept (a MiB of
/// zeros compresses to about 1 KiB: a capture's members are larger).
const MIN_LAYOUT_AVERAGE: u64 = PREFIX as u64;
