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
/// One path in `GROUP` starts a new group of small entries.
pub const GROUP: u64 = 16;

/// One gzip member of an archive: the SHA-256 of its compressed bytes, and how many
/// there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpan {
    pub digest: [u8; 32],
    pub length: u64,
}

/// Members compressed before, taken instead of compressing the same data again (the
/// member cache of [`crate::members::store`]); it must give exactly what
/// [`compress_member`] would.
pub trait MemberSource: Send + Sync {
    /// The member for `data`, and the SHA-256 of its compressed bytes.
    fn member(&self, data: &[u8]) -> io::Result<(Vec<u8>, [u8; 32])>;

    /// Called once an archive is written, also after a failure: a cache that keeps
    /// what it was given returns within its bound here.
    fn trim(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A compressed member, with the SHA-256 of its bytes when capture records layouts.
type Compressed = (Vec<u8>, Option<[u8; 32]>);
type Job = (Vec<u8>, SyncSender<io::Result<Compressed>>);

pub struct ParallelGzWriter<W: Write> {
    /// `None` only after `finish` handed it back.
    out: Option<W>,
    buffer: Vec<u8>,
    jobs: Option<SyncSender<Job>>,
    pending: VecDeque<Receiver<io::Result<Compressed>>>,
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
    /// from there instead of being compressed again.
    pub fn new(out: W, threads: usize, members: Option<Arc<dyn MemberSource>>) -> Self {
        let threads = threads.max(1);
        let (job_tx, job_rx) = mpsc::sync_channel::<Job>(threads);
        let job_rx = Arc::new(Mutex::new(job_rx));
        let workers = (0..threads)
            .map(|i| {
                let job_rx = Arc::clone(&job_rx);
                let members = members.clone();
                std::thread::Builder::new()
                    .name(format!("ckptfs-gzip-{i}"))
                    .spawn(move || {
                        loop {
                            // The lock is held only while waiting for the next job.
                            let job = job_rx.lock().map(|rx| rx.recv());
                            let Ok(Ok((data, reply))) = job else { return };
                            // The digest names the member in layouts (server-side copy);
                            // hashed here, on the worker, rather than in order.
                            let member = match &members {
                                Some(source) => {
                                    source.member(&data).map(|(m, digest)| (m, Some(digest)))
                                }
                                None => compress_member(&data).map(|m| (m, None)),
                            };
                            let _ = reply.send(member);
                        }
                    })
                    .expect("spawning a gzip worker thread")
            })
            .collect();
        ParallelGzWriter {
            out: Some(out),
            buffer: Vec::with_capacity(CHUNK_SIZE),
            jobs: Some(job_tx),
            pending: VecDeque::new(),
            spans: Vec::new(),
            record_spans: members.is_some(),
            workers,
            max_pending: threads * 2,
            after_large: false,
        }
    }

    /// Called before the tar entry `path` with `size` bytes of data is written: ends
    /// the current member here if the rules of the module comment say so.
    pub fn entry_boundary(&mut self, path: &[u8], size: u64) -> io::Result<()> {
        let large = size >= LARGE_ENTRY;
        let picked = self.buffer.len() >= MIN_MEMBER
            && xxhash_rust::xxh3::xxh3_64(path).is_multiple_of(GROUP);
        if large || self.after_large || picked {
            self.submit_buffer()?;
        }
        self.after_large = large;
        Ok(())
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
        if self.buffer.is_empty() {
            return Ok(());
        }
        while self.pending.len() >= self.max_pending {
            self.write_oldest()?;
        }
        let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_SIZE));
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.jobs
            .as_ref()
            .expect("jobs channel open until finish")
            .send((data, reply_tx))
            .map_err(|_| io::Error::other("the gzip worker threads are gone"))?;
        self.pending.push_back(reply_rx);
        Ok(())
    }

    /// Compresses what is buffered, writes every member, and returns the output and,
    /// with a member cache, the members in order (else none).
    pub fn finish(mut self) -> io::Result<(W, Vec<MemberSpan>)> {
        if self.buffer.is_empty() && self.pending.is_empty() {
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

impl<W: Write> Write for ParallelGzWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK_SIZE - self.buffer.len();
        let n = data.len().min(room);
        self.buffer.extend_from_slice(&data[..n]);
        if self.buffer.len() == CHUNK_SIZE {
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
        let mut w = ParallelGzWriter::new(Vec::new(), threads, None);
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
