//! A bounded in-process byte pipe between two threads, in chunks of 256 KiB.
//!
//! Used where the stages of a pass run on cores of their own: a load downloads and
//! hashes, inflates, and indexes on three threads, and a seal archives beside
//! indexing. At most `capacity` chunks are in flight, so memory stays bounded whatever
//! the size of the stream.

use std::io::{self, Read, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

const CHUNK: usize = 256 << 10;

type Chunk = io::Result<Vec<u8>>;

/// Creates a pipe holding at most `capacity` chunks.
pub fn pipe(capacity: usize) -> (PipeWriter, PipeReader) {
    let (tx, rx) = sync_channel(capacity);
    (
        PipeWriter {
            tx: Some(tx),
            buffer: Vec::with_capacity(CHUNK),
        },
        PipeReader {
            rx,
            current: Vec::new(),
            position: 0,
        },
    )
}

/// Copies `from` into `to` until `from` ends or the reader is gone (then `Ok`); a
/// read error is returned, for the caller to hand on ([`PipeWriter::fail`]).
pub fn pump(from: &mut impl Read, to: &mut PipeWriter) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The sending end. Dropping it (or [`PipeWriter::close`]) ends the stream; writes
/// fail with `BrokenPipe` once the reader is gone.
pub struct PipeWriter {
    tx: Option<SyncSender<Chunk>>,
    buffer: Vec<u8>,
}

impl PipeWriter {
    fn send(&mut self, chunk: Chunk) -> io::Result<()> {
        let tx = self.tx.as_ref().ok_or(io::ErrorKind::BrokenPipe)?;
        tx.send(chunk)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    /// Hands `error` to the reader in place of more bytes.
    pub fn fail(mut self, error: io::Error) {
        let _ = self.flush();
        let _ = self.send(Err(error));
    }

    /// Sends what is buffered and ends the stream.
    pub fn close(mut self) -> io::Result<()> {
        self.flush()
    }
}

impl Write for PipeWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buffer.len());
        self.buffer.extend_from_slice(&data[..n]);
        if self.buffer.len() == CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK));
        self.send(Ok(chunk))
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        // A writer dropped by a panic must not end the stream as if it were whole.
        if std::thread::panicking() {
            let _ = self.send(Err(io::Error::other("the writing thread panicked")));
        } else {
            let _ = self.flush();
        }
        self.tx = None;
    }
}

/// The receiving end: reads until the writer is dropped.
pub struct PipeReader {
    rx: Receiver<Chunk>,
    current: Vec<u8>,
    position: usize,
}

impl Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.position == self.current.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.current = chunk?;
                    self.position = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.position);
        buf[..n].copy_from_slice(&self.current[self.position..self.position + n]);
        self.position += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_that_panics_ends_the_stream_with_an_error() {
        let (mut writer, mut reader) = pipe(2);
        let sender = std::thread::spawn(move || {
            writer.write_all(&[7u8; 100]).unwrap();
            panic!("on purpose");
        });
        assert!(sender.join().is_err());
        let mut received = Vec::new();
        let error = reader.read_to_end(&mut received).unwrap_err();
        assert_eq!(error.to_string(), "the writing thread panicked");
        assert!(received.is_empty(), "what was buffered is not handed on");
    }

    #[test]
    fn carries_bytes_and_errors_across_threads() {
        let (mut writer, mut reader) = pipe(2);
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| i as u8).collect();
        let sent = data.clone();
        let sender = std::thread::spawn(move || {
            for piece in sent.chunks(100_000) {
                writer.write_all(piece).unwrap();
            }
            writer.fail(io::Error::other("boom"));
        });
        let mut received = vec![0u8; data.len()];
        reader.read_exact(&mut received).unwrap();
        assert_eq!(received, data);
        assert_eq!(reader.read(&mut [0u8; 1]).unwrap_err().to_string(), "boom");
        sender.join().unwrap();
    }
}
