//! Writes a directory tree as a deterministic tar.gz, hashing it on the way out.
//!
//! Determinism is what makes checkpoints content-addressed: the same tree (names,
//! types, permission bits, mtimes in whole seconds, numeric owners, contents, symlink
//! targets, hard-link structure) always gives the same bytes, on any machine, whatever
//! the inode numbers or the order `readdir` returns. To get there:
//! - entries are written depth-first, each directory's children sorted by name bytes;
//!   paths are relative (`src/lib.rs`); a root that keeps others out (a 0700
//!   workspace) comes last, as `./` (its mode and owner, mtime 0), any other root is
//!   not an entry;
//! - GNU headers, user and group names left empty, long names as GNU `L`/`K` records;
//! - the first path of a hard-linked file (in that order) holds the data, later paths
//!   are link entries to it;
//! - compression is [`super::gz`] (members cut at entries chosen by size and path,
//!   zero gzip mtime, no file name).
//!
//! The tree is read through descriptors (see [`crate::beneath`]): every entry is
//! reached from the root's descriptor by names from `readdir`, opened with
//! `O_NOFOLLOW`, and described by `fstat` of what was opened; symlinks are stored as
//! links and never followed. A concurrent writer swapping a file for a symlink can
//! make a capture fail ("changed type"), never read a byte from outside the tree.
//!
//! Sockets, FIFOs and device files are skipped with a warning. Memory stays flat: file
//! contents are streamed, and one listing per directory level is held. Paths longer
//! than [`MAX_PATH`] are refused, since no reader could restore them.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::gz::{FileStamp, MemberSource, ParallelGzWriter, TreeRecords, UnreadFile, UnreadSource};
use super::{ArchiveError, MAX_PATH, display_path};
use crate::beneath;

pub struct WriterOptions {
    /// The largest compressed archive allowed; writing stops with
    /// [`ArchiveError::TooLarge`] as soon as the output passes it.
    pub max_size: u64,
    /// The largest tar stream (what the archive unpacks to); writing stops with
    /// [`ArchiveError::UnpackedTooLarge`] past it, so that a sparse file of a
    /// terabyte of zeros is refused quickly, as every reader would refuse it.
    pub max_unpacked: u64,
    /// Compression threads; the output does not depend on it.
    pub threads: usize,
    /// Members compressed by earlier captures; the output does not depend on it.
    pub members: Option<Arc<dyn MemberSource>>,
    /// What the capture before of this tree recorded (with `members` only): files
    /// whose stamp it saw are not read unless their member has to be made again.
    /// A copy of the tar stream then has zeros in place of their contents (see
    /// [`write_archive_with_copy`]).
    pub tree: Option<Arc<dyn TreeRecords>>,
}

/// The digest and length of the compressed archive that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenArchive {
    pub sha256: String,
    pub size: u64,
    /// Its gzip members in order, when written with a member cache (else empty): what
    /// a later capture looks for to copy ranges in the store instead of sending them.
    pub members: Vec<super::gz::MemberSpan>,
}

/// Archives the tree under the directory `root` into `out`.
pub fn write_archive<W: Write>(
    root: BorrowedFd<'_>,
    out: W,
    options: &WriterOptions,
) -> Result<WrittenArchive, ArchiveError> {
    write_tree(root, out, options, None)
}

/// Like [`write_archive`], and also writes the uncompressed tar stream to `tar_copy`
/// (best effort: if `tar_copy` fails, copying stops and the archive goes on). Sealing
/// indexes the copy, so that a new checkpoint is served from the very bytes that
/// were compressed and hashed, without decompressing them again. With
/// `options.tree`, the contents of files left unread are zeros in the copy: it then
/// shows the stream's entries, names and sizes (what a reader's limits look at),
/// not its contents.
pub fn write_archive_with_copy<W: Write>(
    root: BorrowedFd<'_>,
    out: W,
    options: &WriterOptions,
    tar_copy: &mut dyn Write,
) -> Result<WrittenArchive, ArchiveError> {
    write_tree(root, out, options, Some(tar_copy))
}

fn write_tree<W: Write>(
    root: BorrowedFd<'_>,
    out: W,
    options: &WriterOptions,
    tar_copy: Option<&mut dyn Write>,
) -> Result<WrittenArchive, ArchiveError> {
    let tree = match &options.tree {
        Some(records) => {
            let root = root.try_clone_to_owned().map_err(io_error("open", b"."))?;
            let files: Arc<dyn UnreadSource> = Arc::new(TreeFiles { root });
            Some((Arc::clone(records), files))
        }
        None => None,
    };
    let hashing = HashingWriter {
        inner: out,
        hasher: Sha256::new(),
        written: 0,
        limit: options.max_size,
    };
    let gz = ParallelGzWriter::new(hashing, options.threads, options.members.clone(), tree);
    let mut builder = tar::Builder::new(Tee {
        gz,
        copy: tar_copy,
        written: 0,
        limit: options.max_unpacked,
    });
    let mut walk = Walk {
        hard_links: HashMap::new(),
        headers: tar::Builder::new(Vec::new()),
        start: SystemTime::now(),
    };
    let result = walk
        .append_tree(&mut builder, root)
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
    // Also after a failure: the members it kept count against the cache's bound.
    if let Some(members) = &options.members
        && let Err(e) = members.trim()
    {
        tracing::warn!(error = %e, "cannot trim the member cache");
    }
    let (hashing, members) = match result {
        Ok(done) => done,
        Err(e) => return Err(limit_error(e, options)),
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
        members,
    })
}

/// Turns the limit marker, wherever in the stack of writers it surfaced, into the
/// error the caller can act on.
fn limit_error(e: ArchiveError, options: &WriterOptions) -> ArchiveError {
    let ArchiveError::Io { cause, .. } = &e else {
        return e;
    };
    match cause
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LimitExceeded>())
    {
        Some(LimitExceeded::Compressed) => ArchiveError::TooLarge {
            limit: options.max_size,
        },
        Some(LimitExceeded::Unpacked) => ArchiveError::UnpackedTooLarge(options.max_unpacked),
        None => e,
    }
}

struct Walk {
    /// (device, inode) of multiply-linked files already written, to their archive path.
    hard_links: HashMap<(u64, u64), Vec<u8>>,
    /// Makes a file's header records exactly as `tar::Builder::append_data` would,
    /// for the file's contents to follow apart.
    headers: tar::Builder<Vec<u8>>,
    /// When the capture started: a file changed shortly before may change again
    /// without its stamp changing (see [`RACY`]).
    start: SystemTime,
}

/// A file whose change time or modification time is within this of the capture's
/// start is read, and its contents fingerprinted by themselves rather than by its
/// stamp: a later write in the same tick of the clock could leave its stamp unchanged
/// (git's "racy" files). The kernel stamps files from a clock that moves every few
/// milliseconds; a filesystem that keeps whole seconds (or two) shows times without
/// nanoseconds, and gets [`RACY_COARSE`].
const RACY: Duration = Duration::from_millis(100);
const RACY_COARSE: Duration = Duration::from_secs(3);

type Builder<'a, W> = tar::Builder<Tee<'a, W>>;

/// The tar stream's destination: the compressor, and a best-effort copy.
struct Tee<'a, W: Write> {
    gz: ParallelGzWriter<HashingWriter<W>>,
    copy: Option<&'a mut dyn Write>,
    written: u64,
    limit: u64,
}

impl<W: Write> Tee<'_, W> {
    /// A file's contents, not read (see [`ParallelGzWriter::write_unread`]).
    fn write_unread(&mut self, file: UnreadFile) -> io::Result<()> {
        let size = file.stamp.size;
        if self.written + size > self.limit {
            return Err(io::Error::other(LimitExceeded::Unpacked));
        }
        self.gz.write_unread(Arc::new(file))?;
        self.written += size;
        if let Some(copy) = &mut self.copy
            && io::copy(&mut io::repeat(0).take(size), copy).is_err()
        {
            self.copy = None;
        }
        Ok(())
    }
}

impl<W: Write> Write for Tee<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.written + data.len() as u64 > self.limit {
            return Err(io::Error::other(LimitExceeded::Unpacked));
        }
        let n = self.gz.write(data)?;
        self.written += n as u64;
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

/// One directory being archived: its path in the archive, and the names still to
/// write, in order.
struct Level {
    path: Vec<u8>,
    names: std::vec::IntoIter<Vec<u8>>,
}

fn io_error(what: &str, path: &[u8]) -> impl FnOnce(io::Error) -> ArchiveError {
    ArchiveError::io(format!("{what} {}", display_path(path)))
}

fn errno(what: &str, path: &[u8]) -> impl FnOnce(rustix::io::Errno) -> ArchiveError {
    let to_archive = io_error(what, path);
    move |e| to_archive(e.into())
}

/// The names in directory `dir`, sorted by their bytes.
fn sorted_names(dir: BorrowedFd<'_>, path: &[u8]) -> Result<Vec<Vec<u8>>, ArchiveError> {
    let mut names: Vec<Vec<u8>> = beneath::list(dir)
        .map_err(io_error("read directory", path))?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    names.sort_unstable();
    Ok(names)
}

impl Walk {
    /// Writes every entry below `root`, depth first, without recursion (a tree of
    /// any depth cannot exhaust the stack) and with one directory open at a time
    /// (see [`beneath::Descent`]).
    fn append_tree<W: Write>(
        &mut self,
        builder: &mut Builder<'_, W>,
        root: BorrowedFd<'_>,
    ) -> Result<(), ArchiveError> {
        let root = beneath::open_dir_path(root, &[]).map_err(io_error("open", b"."))?;
        // A root that keeps others out (see `super::root_is_open`) is written as `./`
        // (as `tar -C DIR .` names it), last: its mode is what kept the tree or its
        // names private, and the mount shows it (see
        // `crate::fs::checkpoints::shown_perm`). Last, so that archives keep the
        // beginning they had without it (and the members a turn reuses). Not its
        // time: a workspace made anew for each turn would otherwise never give the
        // digest of the same tree twice. Any other root is not written, as before: a
        // tree open to all has the digest it always had, and `tar -x` of it leaves
        // the directory it extracts into as it was.
        let root_stat = rfs::fstat(&root).map_err(errno("stat", b"."))?;
        let root_header = (!super::root_is_open(root_stat.st_mode)).then(|| {
            let mut header = header_for(&root_stat, EntryType::Directory);
            header.set_mtime(0);
            header.as_old_mut().name[..2].copy_from_slice(b"./");
            header.set_cksum();
            header
        });
        let names = sorted_names(root.as_fd(), b".")?;
        let mut walk = beneath::Descent::new(root);
        let mut stack = vec![Level {
            path: Vec::new(),
            names: names.into_iter(),
        }];
        while let Some(level) = stack.last_mut() {
            let Some(name) = level.names.next() else {
                let done = stack.pop().expect("a level is on the stack");
                if !stack.is_empty() {
                    walk.leave().map_err(io_error("leave", &done.path))?;
                }
                continue;
            };
            let mut path = level.path.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(&name);
            if path.len() > MAX_PATH {
                return Err(ArchiveError::PathTooLong {
                    path: PathBuf::from(OsStr::from_bytes(&path)),
                });
            }
            if self.append_entry(builder, &mut walk, &name, &path)? {
                let names = sorted_names(walk.dir(), &path)?;
                stack.push(Level {
                    path,
                    names: names.into_iter(),
                });
            }
        }
        let Some(root_header) = root_header else {
            return Ok(());
        };
        entry_boundary(builder, b"./", 0)?;
        builder
            .append(&root_header, io::empty())
            .map_err(io_error("archive", b"."))
    }

    /// Writes the entry `name` of the walk's directory as `path`; for a directory,
    /// the walk goes down into it and this returns true. Everything written comes
    /// from what was opened: a file's header and contents from the same `O_NOFOLLOW`
    /// descriptor, so that no rename or symlink swapped in between can make us read
    /// anything else.
    fn append_entry<W: Write>(
        &mut self,
        builder: &mut Builder<'_, W>,
        walk: &mut beneath::Descent,
        name: &[u8],
        path: &[u8],
    ) -> Result<bool, ArchiveError> {
        let dir = walk.dir();
        let os_name = OsStr::from_bytes(name);
        let archive_name = Path::new(OsStr::from_bytes(path));
        let stat =
            rfs::statat(dir, os_name, AtFlags::SYMLINK_NOFOLLOW).map_err(errno("stat", path))?;
        let changed = || changed(path);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                walk.enter(os_name).map_err(|e| match e.raw_os_error() {
                    Some(libc::ELOOP | libc::ENOTDIR) => changed(),
                    _ => io_error("open", path)(e),
                })?;
                let stat = rfs::fstat(walk.dir()).map_err(errno("stat", path))?;
                let mut header = header_for(&stat, EntryType::Directory);
                entry_boundary(builder, path, 0)?;
                builder
                    .append_data(&mut header, archive_name, io::empty())
                    .map_err(io_error("archive", path))?;
                Ok(true)
            }
            FileType::Symlink => {
                let target = rfs::readlinkat(dir, os_name, Vec::new()).map_err(|e| match e {
                    rustix::io::Errno::INVAL => changed(),
                    e => errno("read link", path)(e),
                })?;
                let mut header = header_for(&stat, EntryType::Symlink);
                entry_boundary(builder, path, 0)?;
                builder
                    .append_link(
                        &mut header,
                        archive_name,
                        OsStr::from_bytes(target.as_bytes()),
                    )
                    .map_err(io_error("archive", path))?;
                Ok(false)
            }
            FileType::RegularFile => {
                self.append_file(builder, dir, os_name, path)?;
                Ok(false)
            }
            other => {
                let kind = match other {
                    FileType::Fifo => "FIFO",
                    FileType::Socket => "socket",
                    _ => "device file",
                };
                tracing::warn!(path = %display_path(path), "skipping {kind}: checkpoints hold only files, directories and links");
                Ok(false)
            }
        }
    }

    /// Appends the regular file `name` of `dir` (`path` in the archive), or a hard
    /// link to the path it was first archived as.
    fn append_file<W: Write>(
        &mut self,
        builder: &mut Builder<'_, W>,
        dir: BorrowedFd<'_>,
        os_name: &OsStr,
        path: &[u8],
    ) -> Result<(), ArchiveError> {
        let archive_name = Path::new(OsStr::from_bytes(path));
        let fd = rfs::openat(
            dir,
            os_name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => changed(path),
            e => errno("open", path)(e),
        })?;
        let stat = rfs::fstat(&fd).map_err(errno("stat", path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(changed(path));
        }
        if stat.st_nlink > 1 {
            let key = (stat.st_dev, stat.st_ino);
            if let Some(first) = self.hard_links.get(&key) {
                let mut header = header_for(&stat, EntryType::Link);
                entry_boundary(builder, path, 0)?;
                builder
                    .append_link(
                        &mut header,
                        archive_name,
                        Path::new(OsStr::from_bytes(first)),
                    )
                    .map_err(io_error("archive", path))?;
                return Ok(());
            }
            self.hard_links.insert(key, path.to_vec());
        }
        let size = stat.st_size as u64;
        let mut header = header_for(&stat, EntryType::Regular);
        header.set_size(size);
        // The header records as `append_data` makes them; the contents follow apart,
        // so that the compressor can be told whose they are, or not be given them.
        self.headers.get_mut().clear();
        self.headers
            .append_data(&mut header, archive_name, io::empty())
            .map_err(io_error("archive", path))?;
        entry_boundary(builder, path, size)?;
        let tee = builder.get_mut();
        tee.write_all(self.headers.get_ref())
            .map_err(io_error("archive", path))?;
        let records = tee.gz.records();
        let stamp = stamp(&stat)
            .filter(|_| size > 0 && records.is_some_and(|r| self.settled(&stat, r.settle())));
        match stamp {
            Some(stamp) if records.is_some_and(|r| r.seen(&stamp)) => {
                drop(fd);
                tee.write_unread(UnreadFile {
                    stamp,
                    path: path.to_vec(),
                    ids_and_mode: ids_and_mode(&stat),
                })
            }
            _ => {
                if let Some(stamp) = stamp {
                    tee.gz.begin_file(stamp);
                }
                let mut contents = ExactReader {
                    inner: File::from(fd).take(size),
                    remaining: size,
                };
                let copied = io::copy(&mut contents, tee);
                tee.gz.end_file();
                copied.map(drop)
            }
        }
        .and_then(|()| {
            let padding = (512 - size % 512) % 512;
            tee.write_all(&[0; 512][..padding as usize])
        })
        .map_err(io_error("archive", path))
    }

    /// Whether a file's times are old enough for its stamp to stand for its contents.
    /// `settle` is how long before the capture a change still makes a file read (at
    /// least [`RACY`], or [`RACY_COARSE`] for times without nanoseconds).
    fn settled(&self, stat: &rfs::Stat, settle: Duration) -> bool {
        let coarse = stat.st_mtime_nsec == 0 && stat.st_ctime_nsec == 0;
        let recent = self.start - settle.max(if coarse { RACY_COARSE } else { RACY });
        let time = |secs: i64, nanos: i64| {
            SystemTime::UNIX_EPOCH.checked_add(Duration::new(
                secs.max(0) as u64,
                nanos.clamp(0, 999_999_999) as u32,
            ))
        };
        [
            time(stat.st_mtime, stat.st_mtime_nsec as i64),
            time(stat.st_ctime, stat.st_ctime_nsec as i64),
        ]
        .into_iter()
        .all(|t| t.is_some_and(|t| t < recent))
            && stat.st_mtime >= 0
            && stat.st_ctime >= 0
    }
}

fn stamp(stat: &rfs::Stat) -> Option<FileStamp> {
    Some(FileStamp {
        dev: stat.st_dev,
        ino: stat.st_ino,
        size: stat.st_size.try_into().ok()?,
        mtime: (stat.st_mtime, stat.st_mtime_nsec as i64),
        ctime: (stat.st_ctime, stat.st_ctime_nsec as i64),
    })
}

/// What a header says of a file's owner, group and mode.
fn ids_and_mode(stat: &rfs::Stat) -> (u32, u32, u32) {
    (stat.st_uid, stat.st_gid, stat.st_mode & 0o7777)
}

/// The tree's files, opened again by path when contents left unread are needed after
/// all: each directory beneath the root without following links, the file with
/// `O_NOFOLLOW`, so that nothing outside the tree is read. A file that is no longer
/// the stamped one is read all the same (the member is then not recorded), if its
/// header still describes it: same owner, group and mode.
struct TreeFiles {
    root: std::os::fd::OwnedFd,
}

impl UnreadSource for TreeFiles {
    fn read_at(
        &self,
        file: &UnreadFile,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<bool> {
        let shown = display_path(&file.path);
        let err =
            |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what} {shown}: {e}"));
        let mut names: Vec<&[u8]> = file.path.split(|&b| b == b'/').collect();
        let name = names.pop().unwrap_or_default();
        let dir = beneath::open_dir_path(self.root.as_fd(), &names)
            .map_err(|e| err("open the directory of", e))?;
        let fd = rfs::openat(
            &dir,
            OsStr::from_bytes(name),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err("open again", e.into()))?;
        let stat = rfs::fstat(&fd).map_err(|e| err("stat", e.into()))?;
        // Another file under the name (an editor saves by renaming a new file over
        // the old) is read as a capture reads a file that changes under it: its bytes
        // now, and the member is not recorded. Something else than a file is an error,
        // as a file that changes type is.
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "{shown} changed type while it was being archived"
            )));
        }
        // Its header is written already: the bytes of a file of another owner, group
        // or mode would go out under it (a writer of the tree could exchange their file
        // for one only root may read, and have root's put store that under theirs).
        if ids_and_mode(&stat) != file.ids_and_mode {
            return Err(io::Error::other(format!(
                "{shown} was replaced by a file of another owner, group or mode while it \
                 was being archived; put the tree again"
            )));
        }
        let start = out.len();
        out.resize(start + len, 0);
        std::os::unix::fs::FileExt::read_exact_at(&File::from(fd), &mut out[start..], offset)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{shown} shrank while it was being archived"),
                ),
                _ => err("read", e),
            })?;
        Ok(stamp(&stat) == Some(file.stamp))
    }
}

/// A file that became something else between its `stat` and its `open`.
fn changed(path: &[u8]) -> ArchiveError {
    ArchiveError::Source {
        path: PathBuf::from(OsStr::from_bytes(path)),
        reason: "changed type while it was being archived".into(),
    }
}

/// Lets the compressor end a member before the entry `path` (see [`super::gz`]).
fn entry_boundary<W: Write>(
    builder: &mut Builder<'_, W>,
    path: &[u8],
    size: u64,
) -> Result<(), ArchiveError> {
    builder
        .get_mut()
        .gz
        .entry_boundary(path, size)
        .map_err(io_error("compress", path))
}

fn header_for(stat: &rfs::Stat, kind: EntryType) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(stat.st_mode & 0o7777);
    header.set_uid(stat.st_uid.into());
    header.set_gid(stat.st_gid.into());
    header.set_mtime(stat.st_mtime.max(0) as u64);
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
enum LimitExceeded {
    Compressed,
    Unpacked,
}

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
            return Err(io::Error::other(LimitExceeded::Compressed));
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
mod tests;
