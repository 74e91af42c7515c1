//! Read-ahead across files: a reader that goes through a checkpoint's files in order
//! (`tar -c`, `grep -r`, `diff -r`, `cp -r`) finds the next files already in the
//! kernel's page cache, instead of waiting for one round trip to the daemon per file.
//!
//! The kernel reads ahead within a file, never across files. Here each first read of
//! a checkpoint file (a read at offset 0) is also a hint: the files that follow it in
//! the index (archive order, which is the order of the directory listings and so of
//! a recursive walk) are likely read next. Like the kernel's own read-ahead, a stream
//! starts small and grows while the reader keeps landing where it was expected, so a
//! reader that jumps around costs a few files per read, not a window each.
//!
//! The files are pushed by one thread of its own ([`KernelCache::store`]): never on a
//! FUSE request thread, since a store waits for pages that a read in flight holds,
//! and that read needs a request thread to be answered. Jobs that find the thread
//! busy beyond a short queue are dropped; a dropped job costs only speed.
//!
//! Invariants: only verified bytes are pushed (those of a loaded checkpoint, read as
//! a read request would read them); a job holds its checkpoint only while it runs;
//! memory is bounded by the queue and by [`JOB_BYTES`] per job; the page cache that
//! receives the files is the kernel's, which reclaims it as it does any other.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use super::inode::Inode;
use super::subtree::KernelCache;
use crate::archive::index::{FileLocation, NodeKind};
use crate::cache::VerifiedCheckpoint;

/// Readers followed at once (a `diff -r` of two trees is two).
const STREAMS: usize = 8;
/// Files pushed after a first read that continues no stream.
const FIRST_WINDOW: u32 = 4;
/// The most files a stream runs ahead of its reader.
const MAX_WINDOW: u32 = 256;
/// The most bytes one job pushes.
const JOB_BYTES: u64 = 8 << 20;
/// Larger files are left to the kernel's read-ahead within the file.
const LARGEST_FILE: u64 = 1 << 20;
/// Jobs waiting for the thread; more are dropped.
const QUEUE: usize = 8;

/// A reader going through one checkpoint's nodes in order.
#[derive(Debug, Clone, Copy)]
struct Stream {
    slot: usize,
    /// The first node of the files pushed last.
    start: u32,
    /// The node after the last one pushed.
    next: u32,
    window: u32,
    /// When it was last used, to replace the least recently used one.
    used: u64,
}

struct Job {
    slot: usize,
    checkpoint: Arc<VerifiedCheckpoint>,
    /// Nodes of the files to push, in order.
    nodes: Vec<u32>,
}

pub struct ReadAhead {
    streams: Mutex<(Vec<Stream>, u64)>,
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts the pushing thread, which pushes through `kernel` once the mount sets it.
    pub fn start(kernel: Arc<OnceLock<Arc<dyn KernelCache>>>) -> ReadAhead {
        let (jobs, queue) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("ckptfs-readahead".into())
            .spawn(move || push_all(&queue, &kernel))
            .ok();
        ReadAhead {
            streams: Mutex::new((Vec::new(), 0)),
            jobs: thread.is_some().then_some(jobs),
            thread,
        }
    }

    /// Node `node` of `checkpoint` (in slot `slot`) was read from its start: queue the
    /// files that should follow.
    pub fn first_read(&self, slot: usize, node: u32, checkpoint: &Arc<VerifiedCheckpoint>) {
        let Some(jobs) = &self.jobs else { return };
        let (from, window) = self.follow(slot, node);
        let nodes = files_after(checkpoint, from, node, window);
        let Some(&last) = nodes.last() else { return };
        self.advance(slot, last + 1);
        let job = Job {
            slot,
            checkpoint: Arc::clone(checkpoint),
            nodes,
        };
        if let Err(TrySendError::Full(_)) = jobs.try_send(job) {
            tracing::trace!(slot, node, "read-ahead queue full; job dropped");
        }
    }

    /// The node to push from, and how many files ahead of `node` the reader should be
    /// kept: the stream `node` continues grows, else a new one starts.
    fn follow(&self, slot: usize, node: u32) -> (u32, u32) {
        let mut guard = self.streams.lock().expect("streams lock");
        let (streams, clock) = &mut *guard;
        *clock += 1;
        let now = *clock;
        let found = streams
            .iter_mut()
            .find(|s| s.slot == slot && s.start <= node && node <= s.next);
        if let Some(stream) = found {
            stream.window = (stream.window * 2).min(MAX_WINDOW);
            stream.start = node;
            stream.used = now;
            return (stream.next.max(node + 1), stream.window);
        }
        let stream = Stream {
            slot,
            start: node,
            next: node + 1,
            window: FIRST_WINDOW,
            used: now,
        };
        if streams.len() < STREAMS {
            streams.push(stream);
        } else if let Some(oldest) = streams.iter_mut().min_by_key(|s| s.used) {
            *oldest = stream;
        }
        (node + 1, FIRST_WINDOW)
    }

    fn advance(&self, slot: usize, next: u32) {
        let mut guard = self.streams.lock().expect("streams lock");
        let newest = guard
            .0
            .iter_mut()
            .filter(|s| s.slot == slot)
            .max_by_key(|s| s.used);
        if let Some(stream) = newest {
            stream.next = stream.next.max(next);
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.jobs = None; // ends the thread's loop
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The nodes of the files to push: from node `from` on, those that keep the reader of
/// node `node` `window` files ahead, within [`JOB_BYTES`].
fn files_after(checkpoint: &VerifiedCheckpoint, from: u32, node: u32, window: u32) -> Vec<u32> {
    let nodes = &checkpoint.index.nodes;
    let (mut files, mut bytes) = (Vec::new(), 0u64);
    // Files between `node` and `from` were pushed already; they count in the window.
    let mut ahead = 0;
    let mut i = node as usize + 1;
    while i < nodes.len() && ahead < window && bytes < JOB_BYTES {
        if let NodeKind::File { size, .. } = nodes[i].kind
            && size <= LARGEST_FILE
        {
            ahead += 1;
            if i as u32 >= from && size > 0 {
                files.push(i as u32);
                bytes += size;
            }
        }
        i += 1;
    }
    files
}

fn push_all(queue: &Receiver<Job>, kernel: &OnceLock<Arc<dyn KernelCache>>) {
    while let Ok(job) = queue.recv() {
        let Some(kernel) = kernel.get() else { continue };
        push(&job, kernel.as_ref());
    }
}

/// Pushes a job's files; stops at the first file the kernel or the cache refuses.
fn push(job: &Job, kernel: &dyn KernelCache) {
    let checkpoint = &job.checkpoint;
    for &node in &job.nodes {
        let Some(NodeKind::File { size, location, .. }) =
            checkpoint.index.node(node).map(|n| &n.kind)
        else {
            continue;
        };
        let data = match location {
            FileLocation::Packed { offset } => checkpoint.read_packed(*offset, 0, *size as usize),
            FileLocation::Own => checkpoint
                .open_own(node)
                .and_then(|file| crate::cache::read_at(&file, 0, *size as usize)),
        };
        let Ok(data) = data else { return };
        if data.len() as u64 != *size {
            return;
        }
        let ino = Inode::Node {
            slot: job.slot,
            node,
        }
        .encode();
        match kernel.store(ino, &data) {
            Ok(()) => {}
            // The kernel has not looked this file up: nothing to fill.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                tracing::debug!(ino, error = %e, "read-ahead stopped");
                return;
            }
        }
    }
}
