//! The reader: turns a download's compressed stream into the tar stream the indexer
//! reads, member by member, rebuilding from the cache each member an entry recorded
//! and inflating the others ([`MemberReader`]), on a thread of its own a few chunks
//! ahead of the indexer, whose end of the stream ([`Indexing`]) tells the recorder how
//! far it has read.
//!
//! Work is bounded by the download: once the bytes hashed or rebuilt in vain pass
//! twice the bytes taken from the stream, the reader stops looking and only inflates.

use std::io::{self, BufRead, Read};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use super::recorder::{Recorder, Unfinished};
use super::records::{Known, KnownEntry, rebuild};
use super::{MAX_CANDIDATES, MAX_PEEK, MAX_RECORDED, PREFIX};

// --- reading -------------------------------------------------------------------------

/// The compressed stream, buffered so that the next member can be looked at before it
/// is taken; hashes what inflation takes of it, member by member.
pub(super) struct Input<R> {
    pub(super) inner: R,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) eof: bool,
    pub(super) hasher: Sha256,
    pub(super) taken: u64,
    pub(super) head: Vec<u8>,
    /// Bytes taken or skipped since the start of the stream.
    pub(super) total: u64,
}

pub(super) fn read_some(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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

pub(super) enum State<R: Read> {
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
    pub(super) input: Option<Input<R>>,
    pub(super) state: State<R>,
    pub(super) known: Known,
    pub(super) recorder: Arc<Mutex<Recorder>>,
    /// Tar bytes handed out so far.
    pub(super) served: u64,
    pub(super) started: bool,
    /// Bytes hashed or rebuilt for candidates that were not the member.
    pub(super) wasted: u64,
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
        for &(at, record) in candidates.iter().take(MAX_CANDIDATES) {
            if self.wasted > budget {
                tracing::debug!(
                    "recorded members stopped matching this download; inflating the rest"
                );
                break;
            }
            let KnownEntry {
                entry,
                records,
                pack,
            } = &mut entries[at as usize];
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
            let rebuilt = rebuild(entry, pack, record, &mut digests);
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
                    tracing::debug!(entry = %entry.records.display(), "a recorded member did not rebuild to its bytes; inflating it");
                }
                Err(e) => {
                    tracing::debug!(entry = %entry.records.display(), error = %e, "a recorded member could not be rebuilt; inflating it");
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
pub(super) const FINISH_EVERY: u64 = 256 * 1024;

/// The indexer's end of the tar stream: tells the recorder how far the indexer has
/// read, so that the members it has read past are recorded.
pub struct Indexing<R> {
    pub(super) tar: R,
    pub(super) recorder: Arc<Mutex<Recorder>>,
    pub(super) read: u64,
    pub(super) finished: u64,
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
