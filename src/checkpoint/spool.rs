//! Writes a spool file (an archive on its way to the store) around the page cache.
//!
//! A put or a seal writes the whole compressed archive to a temporary file that is
//! then read once at most (uploaded), or only linked (a local directory store on the
//! same disk). Its pages are of no use in the page cache, and filling new page-cache
//! pages can cost more than the rest of a put that reuses its members: on the machine
//! of BENCHMARKS.md (a VM that hands freed memory back to its host at once), `dd` of
//! 170 MiB into a new file takes 0.9 s through the page cache and 0.07 s with
//! `O_DIRECT`. So the spool is written with `O_DIRECT` where the filesystem takes it.
//!
//! Invariants:
//! - the file holds exactly the bytes written, in order, whichever way they went;
//! - direct writes are whole aligned blocks from an aligned buffer at aligned offsets;
//!   where the filesystem refuses direct I/O (the flag, or a write), or a direct
//!   write comes back short of a block, the writer goes on through the page cache
//!   from there, for good;
//! - `flush` (also on drop) writes everything, the last partial block through the
//!   page cache, and leaves the descriptor without `O_DIRECT` (nothing after it goes
//!   direct).

use std::fs::File;
use std::io::{self, Write};

use rustix::fs::OFlags;
use rustix::io::Errno;

/// The alignment of direct writes: the largest logical block size in common use.
const BLOCK: usize = 4096;
/// Bytes buffered between writes.
const CAPACITY: usize = 1 << 20;

pub struct SpoolWriter<'a> {
    file: &'a File,
    /// `CAPACITY + BLOCK` bytes, of which `start..start + CAPACITY` is aligned.
    storage: Vec<u8>,
    start: usize,
    len: usize,
    direct: bool,
}

impl<'a> SpoolWriter<'a> {
    /// A writer appending to `file` at its offset, which must be 0 (a new file).
    pub fn new(file: &'a File) -> Self {
        let direct = set_direct(file, true).is_ok();
        let storage = vec![0u8; CAPACITY + BLOCK];
        let start = storage.as_ptr().align_offset(BLOCK);
        assert!(start < BLOCK, "a byte buffer can always be aligned");
        SpoolWriter {
            file,
            storage,
            start,
            len: 0,
            direct,
        }
    }

    /// Whether the next whole blocks go around the page cache.
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        self.direct
    }

    /// Writes the first `n` buffered bytes (whole blocks while direct) and keeps the
    /// rest at the front of the buffer.
    fn write_out(&mut self, n: usize) -> io::Result<()> {
        let mut done = 0;
        while done < n {
            let chunk = &self.storage[self.start + done..self.start + n];
            match rustix::io::write(self.file, chunk) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => {
                    done += k;
                    if self.direct && k % BLOCK != 0 {
                        self.go_buffered()?;
                    }
                }
                Err(Errno::INTR) => {}
                // The filesystem took the flag but not the write: go on without it.
                Err(Errno::INVAL) if self.direct => self.go_buffered()?,
                Err(e) => return Err(e.into()),
            }
        }
        self.storage
            .copy_within(self.start + n..self.start + self.len, self.start);
        self.len -= n;
        Ok(())
    }

    fn go_buffered(&mut self) -> io::Result<()> {
        if self.direct {
            set_direct(self.file, false)?;
            self.direct = false;
        }
        Ok(())
    }
}

impl Write for SpoolWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.len == CAPACITY {
            self.write_out(CAPACITY)?;
        }
        let n = data.len().min(CAPACITY - self.len);
        let at = self.start + self.len;
        self.storage[at..at + n].copy_from_slice(&data[..n]);
        self.len += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let whole = self.len - self.len % BLOCK;
        if self.direct && whole > 0 {
            self.write_out(whole)?;
        }
        self.go_buffered()?;
        if self.len > 0 {
            self.write_out(self.len)?;
        }
        Ok(())
    }
}

impl Drop for SpoolWriter<'_> {
    /// As `BufWriter` does: a writer dropped without `flush` still leaves every byte
    /// in the file (errors are ignored here; a caller that needs them flushes).
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// Sets or clears `O_DIRECT` on `file`'s open file description.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(file, flags)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    /// Writes `data` in pieces of `piece` bytes and returns what the file holds.
    fn spooled(data: &[u8], piece: usize) -> (Vec<u8>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create_new(dir.path().join("spool")).unwrap();
        let mut writer = SpoolWriter::new(&file);
        let direct = writer.is_direct();
        for part in data.chunks(piece) {
            writer.write_all(part).unwrap();
        }
        writer.flush().unwrap();
        drop(writer);
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        assert!(!flags.contains(OFlags::DIRECT), "flush leaves O_DIRECT off");
        let mut back = Vec::new();
        File::open(dir.path().join("spool"))
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        (back, direct)
    }

    #[test]
    fn the_file_holds_exactly_what_was_written_whatever_the_sizes() {
        for (size, piece) in [
            (0, 1),
            (1, 1),
            (BLOCK - 1, 100),
            (BLOCK, BLOCK),
            (CAPACITY, 65536),
            (CAPACITY + 1, 1 << 16),
            (3 * CAPACITY + 12345, 777_777),
            (2 * CAPACITY, 3 * CAPACITY),
        ] {
            let data = pattern(size);
            let (back, _) = spooled(&data, piece);
            assert_eq!(back.len(), data.len(), "size {size}, pieces of {piece}");
            assert!(back == data, "size {size}, pieces of {piece}: bytes differ");
        }
    }

    #[test]
    fn going_on_through_the_page_cache_midway_keeps_every_byte() {
        let data = pattern(3 * CAPACITY + 999);
        let dir = tempfile::tempdir().unwrap();
        let file = File::create_new(dir.path().join("spool")).unwrap();
        let mut writer = SpoolWriter::new(&file);
        writer.write_all(&data[..CAPACITY + 5000]).unwrap();
        // As after a refused or short direct write: an unaligned offset from here on.
        writer.go_buffered().unwrap();
        writer.write_all(&data[CAPACITY + 5000..]).unwrap();
        writer.flush().unwrap();
        assert!(std::fs::read(dir.path().join("spool")).unwrap() == data);
    }

    #[test]
    fn a_writer_dropped_without_flush_still_writes_everything() {
        let data = pattern(CAPACITY + BLOCK + 17);
        let dir = tempfile::tempdir().unwrap();
        let file = File::create_new(dir.path().join("spool")).unwrap();
        let mut writer = SpoolWriter::new(&file);
        writer.write_all(&data).unwrap();
        drop(writer);
        assert!(std::fs::read(dir.path().join("spool")).unwrap() == data);
    }

    #[test]
    fn spooling_goes_direct_wherever_the_filesystem_takes_o_direct() {
        // The test directory (the temporary directory) may or may not take O_DIRECT; a
        // filesystem that refuses it is covered by the fallback, and the bytes are
        // checked either way above.
        let (_, direct) = spooled(&pattern(CAPACITY * 2), CAPACITY);
        let dir = tempfile::tempdir().unwrap();
        let probe = File::create_new(dir.path().join("probe")).unwrap();
        assert_eq!(direct, set_direct(&probe, true).is_ok());
    }
}
