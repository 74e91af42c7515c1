//! Deterministic parallel gzip: the tar stream is cut into members, each compressed on
//! a worker thread into its own gzip member (header mtime 0, no name, OS Unix), and the
//! members are written out in order.
//!
//! Where members are cut depends on the tree, not on offsets in the stream, so that one
//! edit changes only the members around it (what incremental capture builds on). The
//! tar writer calls [`ParallelGzWriter::entry_boundary`] before each entry, and a
//! member ends there when
//! - the entry is large (at least [`LARGE_ENTRY`] of data), or the one before it was:
//!   a large file starts a member of its own, cut every [`CHUNK_SIZE`] from its header;
//! - or at least [`MIN_MEMBER`] is buffered and the hash of the entry's path picks it
//!   (one path in [`GROUP`]): small entries go in groups that start at the same paths
//!   whatever comes before them.
//!
//! A member never holds more than [`CHUNK_SIZE`] of tar. The output depends only on
//! the input bytes and the entry paths, never on the number of threads, so every
//! machine produces the same archive, and thus the same digest, for the same tree.
//! Multi-member gzip is standard: `gzip -d`, `tar -xz`, Python's `tarfile` and
//! flate2's `MultiGzDecoder` read it as one stream.
//!
//! # Members made of files left unread
//!
//! With [`TreeRecords`] (a put with a member cache), the writer is also told which
//! bytes are the contents of which file, by the file's [`FileStamp`], and may be
//! handed a file's length instead of its contents ([`ParallelGzWriter::write_unread`])
//! when the capture before saw the file with the same stamp. Each member then has a
//! *fingerprint*: the SHA-256 of its bytes, except that a file's contents count by
//! their stamp, offset and length. A member whose fingerprint the capture before
//! recorded is the compressed member recorded with it (checked against the SHA-256 of
//! its compressed bytes); any other member is made as always, from its bytes, reading
//! what was left unread. The output is byte for byte the same either way: a stamp
//! stands for the contents it was recorded with, as it does in git's index.
//!
//! Memory is bounded: at most `2 × threads` chunks (input plus output) are in flight.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

/// The most uncompressed bytes in one gzip member. Changing any of these constants,
/// or the path hash, changes the digests of new captures.
pub const CHUNK_SIZE: usize = 1 << 20;
/// Entries with this much data or more start a member of their own.
pub const LARGE_ENTRY: u64 = 256 << 10;
/// No path-picked cut before this much is buffered (members too small compress badly).
pub const MIN_MEMBER: usize = 64 << 10;
/// One path in `GROUP` starts a new group of small entries. 4 rather than 16: a turn
/// of scattered edits compresses and reads about half as much (members of a few
/// hundred KiB of small files), for archives 0.3-0.6% larger (BENCHMARKS.md section 6).
pub const GROUP: u64 = 4;

/// One gzip member of an archive: the SHA-256 of its compressed bytes, and how many
/// there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpan {
    pub digest: [u8; 32],
    pub length: u64,
}

/// A compressed member, as a [`MemberSource`] gives it.
pub struct Compressed {
    pub bytes: Vec<u8>,
    /// The SHA-256 of `bytes`.
    pub digest: [u8; 32],
    /// The SHA-256 of the data it holds (its name in the member cache).
    pub key: [u8; 32],
}

/// Members compressed before, taken instead of compressing the same data again (the
/// member cache of [`crate::members::store`]); it must give exactly what
/// [`compress_member`] would.
pub trait MemberSource: Send + Sync {
    /// The member for `data`.
    fn member(&self, data: &[u8]) -> io::Result<Compressed>;

    /// Called once an archive is written, also after a failure: a cache that keeps
    /// what it was given returns within its bound here.
    fn trim(&self) -> io::Result<()> {
        Ok(())
    }
}

/// What a capture saw of a regular file (from `fstat` of what it opened): the same
/// stamp at the next capture means the same contents, as in git's index. Times are to
/// the nanosecond; the writer does not take a stamp whose times are recent enough for
/// a change within the clock's granularity to leave them equal (git's "racy" files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileStamp {
    pub const BYTES: usize = 56;

    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        let fields = [
            self.dev,
            self.ino,
            self.size,
            self.mtime.0 as u64,
            self.mtime.1 as u64,
            self.ctime.0 as u64,
            self.ctime.1 as u64,
        ];
        for (slot, field) in out.chunks_exact_mut(8).zip(fields) {
            slot.copy_from_slice(&field.to_le_bytes());
        }
        out
    }
}

/// A file whose contents the tar writer did not read, by its path below the tree's
/// root; read only if its member has to be made after all.
#[derive(Debug)]
pub struct UnreadFile {
    pub stamp: FileStamp,
    pub path: Vec<u8>,
    /// The owner, group and mode its header gives: a file read again later must have
    /// the same (see `TreeFiles` in the writer).
    pub ids_and_mode: (u32, u32, u32),
}

/// What the capture before of the same tree recorded (see the module comment), and
/// what this one records for the next (the member room's `members::tree`).
pub trait TreeRecords: Send + Sync {
    /// Whether the capture before saw a file with this stamp: its contents are then
    /// left unread (a hint: a wrong answer costs reading it later, or now).
    fn seen(&self, stamp: &FileStamp) -> bool;
    /// How long before the capture a change makes a file read whatever its stamp (at
    /// least the writer's own bound for racy files).
    fn settle(&self) -> std::time::Duration;
    /// The compressed member recorded for `fingerprint`, checked against damage (see
    /// `crate::members::tree`), and its digest and key.
    fn recorded(&self, fingerprint: &[u8; 32]) -> Option<Compressed>;
    /// Records for the next capture that the member of `fingerprint`, holding
    /// `length` bytes of data whose files had `stamps`, is `member`.
    fn record(&self, fingerprint: [u8; 32], member: &Compressed, length: u64, stamps: &[FileStamp]);
    /// Counts file bytes left unread and then read after all.
    fn read_again(&self, _bytes: u64) {}
}

/// Reads what the tar writer left unread, when a member is made after all.
pub trait UnreadSource: Send + Sync {
    /// Appends `len` bytes at `offset` of `file` to `out`. `Ok(false)`: the file is
    /// not the one stamped any more (its bytes were read all the same, as a capture
    /// reads a file that changes under it; the member is then not recorded).
    fn read_at(
        &self,
        file: &UnreadFile,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<bool>;
}

/// A run of a member's bytes, in order: those the fingerprint counts as themselves,
/// and a file's contents, counted by stamp, read or not.
#[derive(Debug)]
enum Segment {
    /// In the member's buffer.
    Bytes(usize),
    /// In the buffer.
    Read {
        stamp: FileStamp,
        offset: u64,
        len: usize,
    },
    /// Not in the buffer.
    Unread {
        file: Arc<UnreadFile>,
        offset: u64,
        len: usize,
    },
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Bytes(len) | Segment::Read { len, .. } | Segment::Unread { len, .. } => *len,
        }
    }
}

/// One member's input, as the workers get it.
struct Chunk {
    /// Every byte read; with no unread segment, the member's whole data.
    data: Vec<u8>,
    /// Empty unless the tree's files are tracked.
    segments: Vec<Segment>,
}

/// The tree's records, and how to read what they let the writer leave unread.
#[derive(Clone)]
struct Tree {
    records: Arc<dyn TreeRecords>,
    files: Arc<dyn UnreadSource>,
}

/// A compressed member, with the SHA-256 of its bytes when capture records layouts.
type Output = (Vec<u8>, Option<[u8; 32]>);
type Job = (Chunk, SyncSender<io::Result<Output>>);

pub struct ParallelGzWriter<W: Write> {
    /// `None` only after `finish` handed it back.
    out: Option<W>,
    buffer: Vec<u8>,
    /// The bytes of the member being filled, unread ones too.
    filled: usize,
    /// With a tree: the member's segments, and the file whose contents come now.
    segments: Vec<Segment>,
    file: Option<(FileStamp, u64)>,
    tree: Option<Tree>,
    jobs: Option<SyncSender<Job>>,
    pending: VecDeque<Receiver<io::Result<Output>>>,
    /// The members written so far, recorded with a member cache only.
    spans: Vec<MemberSpan>,
    record_spans: bool,
    workers: Vec<JoinHandle<()>>,
    max_pending: usize,
    /// The entry written last was large: the next one starts a member.
    after_large: bool,
}

pub(crate) fn compress_member(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = GzBuilder::new().mtime(0).operating_system(3).write(
        Vec::with_capacity(data.len() / 2 + 64),
        Compression::default(),
    );
    encoder.write_all(data)?;
    encoder.finish()
}

impl<W: Write> ParallelGzWriter<W> {
    /// With `members`, a member already compressed by an earlier capture is taken
    /// from there instead of being compressed again; with `tree` too (records, and a
    /// reader of the tree), a member recorded by the capture before of the same tree
    /// is taken without reading its files.
    pub fn new(
        out: W,
        threads: usize,
        members: Option<Arc<dyn MemberSource>>,
        tree: Option<(Arc<dyn TreeRecords>, Arc<dyn UnreadSource>)>,
    ) -> Self {
        let threads = threads.max(1);
        let tree = members
            .as_ref()
            .and(tree)
            .map(|(records, files)| Tree { records, files });
        let (job_tx, job_rx) = mpsc::sync_channel::<Job>(threads);
        let job_rx = Arc::new(Mutex::new(job_rx));
        let workers = (0..threads)
            .map(|i| {
                let job_rx = Arc::clone(&job_rx);
                let members = members.clone();
                let tree = tree.clone();
                std::thread::Builder::new()
                    .name(format!("ckptfs-gzip-{i}"))
                    .spawn(move || {
                        loop {
                            // The lock is held only while waiting for the next job.
                            let job = job_rx.lock().map(|rx| rx.recv());
                            let Ok(Ok((chunk, reply))) = job else { return };
                            let _ =
                                reply.send(make_member(chunk, members.as_deref(), tree.as_ref()));
                        }
                    })
                    .expect("spawning a gzip worker thread")
            })
            .collect();
        ParallelGzWriter {
            out: Some(out),
            buffer: Vec::with_capacity(CHUNK_SIZE),
            filled: 0,
            segments: Vec::new(),
            file: None,
            tree,
            jobs: Some(job_tx),
            pending: VecDeque::new(),
            spans: Vec::new(),
            record_spans: members.is_some(),
            workers,
            max_pending: threads * 2,
            after_large: false,
        }
    }

    /// Whether the writer takes stamps ([`Self::begin_file`], [`Self::write_unread`]).
    pub fn records(&self) -> Option<&dyn TreeRecords> {
        self.tree.as_ref().map(|tree| tree.records.as_ref())
    }

    /// Called before the tar entry `path` with `size` bytes of data is written: ends
    /// the current member here if the rules of the module comment say so.
    pub fn entry_boundary(&mut self, path: &[u8], size: u64) -> io::Result<()> {
        let large = size >= LARGE_ENTRY;
        let picked =
            self.filled >= MIN_MEMBER && xxhash_rust::xxh3::xxh3_64(path).is_multiple_of(GROUP);
        if large || self.after_large || picked {
            self.submit_buffer()?;
        }
        self.after_large = large;
        Ok(())
    }

    /// The bytes written from now until [`Self::end_file`] are the contents of the
    /// file stamped `stamp` (only with a tree; else ignored).
    pub fn begin_file(&mut self, stamp: FileStamp) {
        if self.tree.is_some() {
            self.file = Some((stamp, 0));
        }
    }

    pub fn end_file(&mut self) {
        self.file = None;
    }

    /// Writes the contents of `file`, `file.stamp.size` bytes, without reading them
    /// (they are read later if a member must be made of them after all). Only with a
    /// tree.
    pub fn write_unread(&mut self, file: Arc<UnreadFile>) -> io::Result<()> {
        debug_assert!(self.tree.is_some(), "unread contents need a tree");
        let size = file.stamp.size;
        let mut offset = 0;
        while offset < size {
            let len =
                (CHUNK_SIZE - self.filled).min((size - offset).min(usize::MAX as u64) as usize);
            self.segments.push(Segment::Unread {
                file: Arc::clone(&file),
                offset,
                len,
            });
            self.filled += len;
            offset += len as u64;
            if self.filled == CHUNK_SIZE {
                self.submit_buffer()?;
            }
        }
        Ok(())
    }

    /// Notes `n` bytes just added to the buffer in the segments.
    fn track(&mut self, n: usize) {
        if self.tree.is_none() || n == 0 {
            return;
        }
        match (&mut self.file, self.segments.last_mut()) {
            (
                Some((stamp, at)),
                Some(Segment::Read {
                    stamp: last,
                    offset,
                    len,
                }),
            ) if last == stamp && *offset + *len as u64 == *at => {
                *len += n;
                *at += n as u64;
            }
            (Some((stamp, at)), _) => {
                self.segments.push(Segment::Read {
                    stamp: *stamp,
                    offset: *at,
                    len: n,
                });
                *at += n as u64;
            }
            (None, Some(Segment::Bytes(len))) => *len += n,
            (None, _) => self.segments.push(Segment::Bytes(n)),
        }
    }

    fn write_oldest(&mut self) -> io::Result<()> {
        if let Some(result) = self.pending.pop_front() {
            let (member, digest) = result
                .recv()
                .map_err(|_| io::Error::other("a gzip worker thread died"))??;
            self.out_mut().write_all(&member)?;
            if let Some(digest) = digest {
                self.spans.push(MemberSpan {
                    digest,
                    length: member.len() as u64,
                });
            }
        }
        Ok(())
    }

    fn submit_buffer(&mut self) -> io::Result<()> {
        if self.filled == 0 {
            return Ok(());
        }
        while self.pending.len() >= self.max_pending {
            self.write_oldest()?;
        }
        let chunk = Chunk {
            data: std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_SIZE)),
            segments: std::mem::take(&mut self.segments),
        };
        self.filled = 0;
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.jobs
            .as_ref()
            .expect("jobs channel open until finish")
            .send((chunk, reply_tx))
            .map_err(|_| io::Error::other("the gzip worker threads are gone"))?;
        self.pending.push_back(reply_rx);
        Ok(())
    }

    /// Compresses what is buffered, writes every member, and returns the output and,
    /// with a member cache, the members in order (else none).
    pub fn finish(mut self) -> io::Result<(W, Vec<MemberSpan>)> {
        if self.filled == 0 && self.pending.is_empty() {
            // An empty input still has to be a valid gzip file.
            let member = compress_member(&[])?;
            self.out_mut().write_all(&member)?;
            if self.record_spans {
                self.spans.push(MemberSpan {
                    digest: Sha256::digest(&member).into(),
                    length: member.len() as u64,
                });
            }
        }
        self.submit_buffer()?;
        while !self.pending.is_empty() {
            self.write_oldest()?;
        }
        self.shutdown();
        let out = self.out.take().expect("output present until finish");
        Ok((out, std::mem::take(&mut self.spans)))
    }

    fn out_mut(&mut self) -> &mut W {
        self.out.as_mut().expect("output present until finish")
    }

    fn shutdown(&mut self) {
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A worker's job: the member of `chunk`, taken from the tree's records when they have
/// it, else from the member source or compressed, with the SHA-256 of its bytes when
/// there is a source (it names the member in layouts, for server-side copies; hashed
/// here rather than in order).
fn make_member(
    chunk: Chunk,
    members: Option<&dyn MemberSource>,
    tree: Option<&Tree>,
) -> io::Result<Output> {
    let Some(members) = members else {
        return compress_member(&chunk.data).map(|m| (m, None));
    };
    let files = chunk
        .segments
        .iter()
        .any(|s| !matches!(s, Segment::Bytes(_)));
    let (Some(tree), true) = (tree, files) else {
        return members
            .member(&chunk.data)
            .map(|m| (m.bytes, Some(m.digest)));
    };
    let fingerprint = fingerprint(&chunk);
    let length = chunk.segments.iter().map(Segment::len).sum::<usize>() as u64;
    let stamps: Vec<FileStamp> = chunk
        .segments
        .iter()
        .filter_map(|s| match s {
            Segment::Read { stamp, .. } => Some(*stamp),
            Segment::Unread { file, .. } => Some(file.stamp),
            Segment::Bytes(_) => None,
        })
        .collect();
    let unread = chunk
        .segments
        .iter()
        .any(|s| matches!(s, Segment::Unread { .. }));
    if unread && let Some(member) = tree.records.recorded(&fingerprint) {
        tree.records.record(fingerprint, &member, length, &stamps);
        return Ok((member.bytes, Some(member.digest)));
    }
    let (data, same_files) = if unread {
        fill(chunk, tree)?
    } else {
        (chunk.data, true)
    };
    let member = members.member(&data)?;
    if same_files {
        tree.records.record(fingerprint, &member, length, &stamps);
    }
    Ok((member.bytes, Some(member.digest)))
}

/// The member's fingerprint (see the module comment): the same for a file's contents
/// read or left unread.
fn fingerprint(chunk: &Chunk) -> [u8; 32] {
    let mut hash = Sha256::new();
    let mut at = 0;
    for segment in &chunk.segments {
        let file = |hash: &mut Sha256, stamp: &FileStamp, offset: u64, len: usize| {
            hash.update([1u8]);
            hash.update(stamp.to_bytes());
            hash.update(offset.to_le_bytes());
            hash.update((len as u64).to_le_bytes());
        };
        match segment {
            Segment::Bytes(len) => {
                hash.update([0u8]);
                hash.update((*len as u64).to_le_bytes());
                hash.update(&chunk.data[at..at + len]);
                at += len;
            }
            Segment::Read { stamp, offset, len } => {
                file(&mut hash, stamp, *offset, *len);
                at += len;
            }
            Segment::Unread {
                file: f,
                offset,
                len,
            } => file(&mut hash, &f.stamp, *offset, *len),
        }
    }
    hash.finalize().into()
}

/// The member's whole data, the unread contents read now; and whether every file read
/// was still the one stamped.
fn fill(chunk: Chunk, tree: &Tree) -> io::Result<(Vec<u8>, bool)> {
    let (files, records) = (tree.files.as_ref(), tree.records.as_ref());
    let length = chunk.segments.iter().map(Segment::len).sum();
    let mut data = Vec::with_capacity(length);
    let mut same = true;
    let mut at = 0;
    for segment in &chunk.segments {
        match segment {
            Segment::Bytes(len) | Segment::Read { len, .. } => {
                data.extend_from_slice(&chunk.data[at..at + len]);
                at += len;
            }
            Segment::Unread { file, offset, len } => {
                same &= files.read_at(file, *offset, *len, &mut data)?;
                records.read_again(*len as u64);
            }
        }
    }
    Ok((data, same))
}

impl<W: Write> Write for ParallelGzWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK_SIZE - self.filled;
        let n = data.len().min(room);
        self.buffer.extend_from_slice(&data[..n]);
        self.filled += n;
        self.track(n);
        if self.filled == CHUNK_SIZE {
            self.submit_buffer()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for ParallelGzWriter<W> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn compress(data: &[u8], threads: usize) -> Vec<u8> {
        let mut w = ParallelGzWriter::new(Vec::new(), threads, None, None);
        for piece in data.chunks(7777) {
            w.write_all(piece).unwrap();
        }
        w.finish().unwrap().0
    }

    #[test]
    fn output_does_not_depend_on_threads_and_round_trips() {
        let data: Vec<u8> = (0..3 * CHUNK_SIZE + 12345)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let one = compress(&data, 1);
        let four = compress(&data, 4);
        assert_eq!(one, four);
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&one[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn empty_input_is_valid_gzip() {
        let out = compress(&[], 2);
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&out[..])
            .read_to_end(&mut back)
            .unwrap();
        assert!(back.is_empty());
        assert_eq!(&out[..2], &[0x1f, 0x8b]);
    }
}
