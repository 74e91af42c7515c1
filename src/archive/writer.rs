//! Writes a directory tree as a deterministic tar.gz, hashing it on the way out.
//!
//! Determinism is what makes checkpoints content-addressed: the same tree (names,
//! types, permission bits, mtimes in whole seconds, numeric owners, contents, symlink
//! targets, hard-link structure) always gives the same bytes, on any machine, whatever
//! the inode numbers or the order `readdir` returns. To get there:
//! - entries are written depth-first, each directory's children sorted by name bytes;
//!   the root itself is not an entry, paths are relative (`src/lib.rs`);
//! - GNU headers, user and group names left empty, long names as GNU `L`/`K` records;
//! - the first path of a hard-linked file (in that order) holds the data, later paths
//!   are link entries to it;
//! - compression is [`super::gz`] (fixed chunking, zero gzip mtime, no file name).
//!
//! Sockets, FIFOs and device files are skipped with a warning. Memory stays flat: file
//! contents are streamed, and only one directory listing at a time is held.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::ArchiveError;
use super::gz::ParallelGzWriter;

pub struct WriterOptions {
    /// The largest compressed archive allowed; writing stops with
    /// [`ArchiveError::TooLarge`] as soon as the output passes it.
    pub max_size: u64,
    /// Compression threads; the output does not depend on it.
    pub threads: usize,
}

/// The digest and length of the compressed archive that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenArchive {
    pub sha256: String,
    pub size: u64,
}

/// Archives the tree under `root` into `out`.
pub fn write_archive<W: Write>(
    root: &Path,
    out: W,
    options: &WriterOptions,
) -> Result<WrittenArchive, ArchiveError> {
    write_archive_with_copy(root, out, options, &mut io::sink())
}

/// Like [`write_archive`], and also writes the uncompressed tar stream to `tar_copy`
/// (best effort: if `tar_copy` fails, copying stops and the archive goes on). Sealing
/// indexes the copy, so that a new checkpoint is served from the very bytes that
/// were compressed and hashed, without decompressing them again.
pub fn write_archive_with_copy<W: Write>(
    root: &Path,
    out: W,
    options: &WriterOptions,
    tar_copy: &mut dyn Write,
) -> Result<WrittenArchive, ArchiveError> {
    let meta = fs::metadata(root).map_err(ArchiveError::io(format!("{}", root.display())))?;
    if !meta.is_dir() {
        return Err(ArchiveError::Source {
            path: root.to_owned(),
            reason: "not a directory".into(),
        });
    }
    let hashing = HashingWriter {
        inner: out,
        hasher: Sha256::new(),
        written: 0,
        limit: options.max_size,
    };
    let gz = ParallelGzWriter::new(hashing, options.threads);
    let mut builder = tar::Builder::new(Tee {
        gz,
        copy: Some(tar_copy),
    });
    let mut walk = Walk {
        hard_links: HashMap::new(),
    };
    let result = walk
        .append_dir(&mut builder, root, &[])
        .and_then(|()| {
            builder
                .finish()
                .map_err(ArchiveError::io("finish tar stream"))
        })
        .and_then(|()| {
            builder
                .into_inner()
                .and_then(|tee| tee.gz.finish())
                .map_err(ArchiveError::io("compress archive"))
        });
    let hashing = match result {
        Ok(hashing) => hashing,
        Err(e) => return Err(limit_error(e, options.max_size)),
    };
    let HashingWriter {
        mut inner,
        hasher,
        written,
        ..
    } = hashing;
    inner.flush().map_err(ArchiveError::io("flush archive"))?;
    Ok(WrittenArchive {
        sha256: hex::encode(hasher.finalize()),
        size: written,
    })
}

/// Turns the limit marker, wherever in the stack of writers it surfaced, into the
/// error the caller can act on.
fn limit_error(e: ArchiveError, limit: u64) -> ArchiveError {
    match &e {
        ArchiveError::Io { cause, .. }
            if cause
                .get_ref()
                .is_some_and(|inner| inner.is::<LimitExceeded>()) =>
        {
            ArchiveError::TooLarge { limit }
        }
        _ => e,
    }
}

struct Walk {
    /// (device, inode) of multiply-linked files already written, to their archive path.
    hard_links: HashMap<(u64, u64), Vec<u8>>,
}

type Builder<'a, W> = tar::Builder<Tee<'a, W>>;

/// The tar stream's destination: the compressor, and a best-effort copy.
struct Tee<'a, W: Write> {
    gz: ParallelGzWriter<HashingWriter<W>>,
    copy: Option<&'a mut dyn Write>,
}

impl<W: Write> Write for Tee<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.gz.write(data)?;
        if let Some(copy) = &mut self.copy
            && copy.write_all(&data[..n]).is_err()
        {
            self.copy = None;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.gz.flush()
    }
}

impl Walk {
    fn append_dir<W: Write>(
        &mut self,
        builder: &mut Builder<'_, W>,
        dir: &Path,
        prefix: &[u8],
    ) -> Result<(), ArchiveError> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .map_err(ArchiveError::io(format!(
                "read directory {}",
                dir.display()
            )))?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(ArchiveError::io(format!(
                "read directory {}",
                dir.display()
            )))?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let path = dir.join(&name);
            let mut archive_path = prefix.to_vec();
            if !archive_path.is_empty() {
                archive_path.push(b'/');
            }
            archive_path.extend_from_slice(name.as_bytes());
            self.append_entry(builder, &path, archive_path)?;
        }
        Ok(())
    }

    fn append_entry<W: Write>(
        &mut self,
        builder: &mut Builder<'_, W>,
        path: &Path,
        archive_path: Vec<u8>,
    ) -> Result<(), ArchiveError> {
        let io_err = |what: &str| ArchiveError::io(format!("{what} {}", path.display()));
        let meta = fs::symlink_metadata(path).map_err(io_err("stat"))?;
        let file_type = meta.file_type();
        let name = Path::new(OsStr::from_bytes(&archive_path));
        if file_type.is_dir() {
            let mut header = header_for(&meta, EntryType::Directory);
            builder
                .append_data(&mut header, name, io::empty())
                .map_err(io_err("archive"))?;
            self.append_dir(builder, path, &archive_path)
        } else if file_type.is_symlink() {
            let target = fs::read_link(path).map_err(io_err("read link"))?;
            let mut header = header_for(&meta, EntryType::Symlink);
            builder
                .append_link(&mut header, name, &target)
                .map_err(io_err("archive"))
        } else if file_type.is_file() {
            if meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = self.hard_links.get(&key) {
                    let mut header = header_for(&meta, EntryType::Link);
                    return builder
                        .append_link(&mut header, name, Path::new(OsStr::from_bytes(first)))
                        .map_err(io_err("archive"));
                }
                self.hard_links.insert(key, archive_path.clone());
            }
            let mut header = header_for(&meta, EntryType::Regular);
            header.set_size(meta.len());
            let file = File::open(path).map_err(io_err("open"))?;
            let contents = ExactReader {
                inner: file.take(meta.len()),
                remaining: meta.len(),
            };
            builder
                .append_data(&mut header, name, contents)
                .map_err(io_err("archive"))
        } else {
            let kind = if file_type.is_fifo() {
                "FIFO"
            } else if file_type.is_socket() {
                "socket"
            } else {
                "device file"
            };
            tracing::warn!(path = %path.display(), "skipping {kind}: checkpoints hold only files, directories and links");
            Ok(())
        }
    }
}

fn header_for(meta: &Metadata, kind: EntryType) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(meta.uid().into());
    header.set_gid(meta.gid().into());
    header.set_mtime(meta.mtime().max(0) as u64);
    header.set_size(0);
    header
}

/// Reads exactly `remaining` bytes, failing if the file shrank while being archived
/// (the header already promised its length, so a short copy would corrupt the tar).
struct ExactReader<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.remaining > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was being archived",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
struct LimitExceeded;

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("archive size limit exceeded")
    }
}

impl std::error::Error for LimitExceeded {}

/// Hashes and counts what goes through, and refuses to go past `limit`.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    limit: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.limit {
            return Err(io::Error::other(LimitExceeded));
        }
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn options() -> WriterOptions {
        WriterOptions {
            max_size: u64::MAX,
            threads: 2,
        }
    }

    fn sample_tree(root: &Path, create_order_reversed: bool) {
        let mut names = vec!["b.txt", "a.txt", "c"];
        if create_order_reversed {
            names.reverse();
        }
        for name in names {
            if name == "c" {
                fs::create_dir(root.join(name)).unwrap();
                fs::write(root.join("c/inner"), b"inner").unwrap();
            } else {
                fs::write(root.join(name), name.as_bytes()).unwrap();
            }
        }
        symlink("a.txt", root.join("link")).unwrap();
        fs::set_permissions(root.join("a.txt"), fs::Permissions::from_mode(0o755)).unwrap();
        for p in ["a.txt", "b.txt", "c/inner", "c", ""] {
            let f = File::open(root.join(p)).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000))
                .unwrap();
        }
    }

    #[test]
    fn same_tree_gives_same_bytes_whatever_the_creation_order() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        sample_tree(a.path(), false);
        sample_tree(b.path(), true);
        let mut out_a = Vec::new();
        let mut out_b = Vec::new();
        let wa = write_archive(a.path(), &mut out_a, &options()).unwrap();
        let wb = write_archive(b.path(), &mut out_b, &options()).unwrap();
        assert_eq!(wa, wb);
        assert_eq!(out_a, out_b);
        assert_eq!(wa.size, out_a.len() as u64);
        assert_eq!(wa.sha256, hex::encode(Sha256::digest(&out_a)));
    }

    #[test]
    fn entries_are_sorted_and_relative() {
        let dir = tempfile::tempdir().unwrap();
        sample_tree(dir.path(), true);
        let mut out = Vec::new();
        write_archive(dir.path(), &mut out, &options()).unwrap();
        let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&out[..]));
        let paths: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(paths, ["a.txt", "b.txt", "c", "c/inner", "link"]);
    }

    #[test]
    fn stops_at_the_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..200_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        fs::write(dir.path().join("noise"), noise).unwrap();
        let err = write_archive(
            dir.path(),
            Vec::new(),
            &WriterOptions {
                max_size: 10_000,
                threads: 1,
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, ArchiveError::TooLarge { limit: 10_000 }),
            "{err}"
        );
    }
}
