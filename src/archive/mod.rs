//! Checkpoint archives: deterministic tar.gz writing, safe extraction, and (for the
//! mount) streaming indexing.
//!
//! The archive format is the product's compatibility surface (SPEC section 1): readers
//! accept whatever GNU tar, bsdtar and Python's `tarfile` write; the writer produces
//! one canonical encoding of a tree so that the same tree always has the same digest.
//!
//! Every archive read here is treated as hostile. [`for_each_entry`] is the one way
//! entries are read, and it bounds what an archive can make us hold or do:
//! - the metadata of one entry (its header, GNU long-name and long-link records, pax
//!   records, sparse maps) may take at most [`MAX_METADATA`] bytes of the stream; the
//!   tar crate reads those records whole into memory, so the cap is enforced below
//!   it, on the stream itself, before anything is buffered;
//! - paths and link targets are at most [`MAX_PATH`] bytes;
//! - entries, including the parent directories that only appear implicitly, count
//!   toward `max_entries`, every byte of entry data, read or skipped, counts toward
//!   `max_unpacked_bytes`, and the bytes of every path and link target count toward
//!   `max_metadata_bytes` (what readers keep in memory grows with them, not with the
//!   archive's size: 200,000 links with 4 KiB targets fit in a 2 MB archive);
//! - a directory also counts toward `max_entries` each time a path enters it again
//!   from afar: when an entry's parent enters more than [`FREE_REENTRIES`] existing
//!   directories that the previous entry's parent did not go through, each one beyond
//!   those counts, and likewise for a hard link's target against the previous link's
//!   target (the first link's against the root). A restore opens every directory a
//!   path enters anew (one system call each, see [`crate::beneath::DirCursor`]), so
//!   without this an archive whose entries jump between two trees 2,000 levels deep
//!   would cost 2,000 calls per entry, in an archive of a few hundred KB. The parents
//!   of an archive in tree order, as tar writes it, re-enter at most one directory
//!   per entry and never pay; the mount counts the same, so that both read the same
//!   archives.

pub mod extract;
pub mod gz;
pub mod index;
pub mod writer;

use std::cell::{Cell, RefCell};
use std::io::{self, Read};
use std::path::PathBuf;
use std::rc::Rc;

/// Existing directories a path (an entry's parent, a hard link's target) may enter,
/// beyond those it shares with the previous path of its kind, before each further one
/// counts as an entry.
pub const FREE_REENTRIES: usize = 32;

/// Most bytes of tar metadata one entry may take before its data begins.
pub const MAX_METADATA: u64 = 256 * 1024;
/// Longest path or link target accepted in an archive (Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the archive has more than {0} entries (--max-entries)")]
    TooManyEntries(u64),
    #[error("the archive unpacks to more than {0} bytes (--max-unpacked-size)")]
    UnpackedTooLarge(u64),
    #[error("the archive's paths and link targets take more than {0} bytes (--max-metadata-size)")]
    MetadataTooLarge(u64),
    #[error(
        "the archive's index would take more than {0} bytes of memory (half of --memory-budget)"
    )]
    IndexTooLarge(u64),
    #[error("the archive is not a valid tar.gz: {0}")]
    Corrupt(io::Error),
    #[error("{}: {reason}", path.display())]
    Source { path: PathBuf, reason: String },
    #[error("the path {} is longer than {MAX_PATH} bytes (Linux's PATH_MAX)", path.display())]
    PathTooLong { path: PathBuf },
    #[error("refusing entry {entry:?}: {reason}")]
    Hostile { entry: String, reason: &'static str },
    #[error("destination {}: {reason}", path.display())]
    Destination { path: PathBuf, reason: String },
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

impl ArchiveError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
        let context = context.into();
        move |cause| ArchiveError::Io { context, cause }
    }
}

/// Bounds on what one archive may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: u64,
    pub max_unpacked_bytes: u64,
    pub max_metadata_bytes: u64,
    /// The memory an index may take ([`index::Index::memory`]), counted as it is built.
    pub max_index_bytes: u64,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_entries: 2_000_000,
        max_unpacked_bytes: 16 << 30,
        max_metadata_bytes: 256 << 20,
        max_index_bytes: u64::MAX,
    };
}

/// How often, in bytes of index memory, a build tells [`with_index_growth`]'s hook.
pub const GROWTH_STEP: u64 = 16 << 20;

/// What [`with_index_growth`] is given.
type GrowthHook = Box<dyn FnMut(u64)>;

thread_local! {
    static GROWTH: RefCell<Option<GrowthHook>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` told, every [`GROWTH_STEP`] bytes, what the index being built
/// on this thread takes so far: the mount's loader reserves memory for a build as it
/// grows, and unloads idle checkpoints to make room, so that an archive whose few
/// bytes imply millions of directories cannot take the daemon past its budget.
pub fn with_index_growth<T>(hook: impl FnMut(u64) + 'static, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            GROWTH.with(|g| g.borrow_mut().take());
        }
    }
    GROWTH.with(|g| *g.borrow_mut() = Some(Box::new(hook)));
    let _reset = Reset;
    f()
}

/// Counts entries and unpacked bytes against [`Limits`] while an archive is read.
pub struct Tally {
    limits: Limits,
    entries: u64,
    bytes: u64,
    metadata: u64,
    /// What the index takes in memory so far, by [`index::BUILD_NODE_MEMORY`] a node and
    /// every byte of paths (more than the index keeps of them: an upper bound).
    memory: u64,
    /// `memory` when the growth hook was last told.
    told: u64,
}

impl Tally {
    fn new(limits: Limits) -> Tally {
        Tally {
            limits,
            entries: 0,
            bytes: 0,
            metadata: 0,
            memory: 0,
            told: 0,
        }
    }

    /// One more entry, explicit or implied (a parent directory made on the way).
    pub fn entry(&mut self) -> Result<(), ArchiveError> {
        self.count_entries(1)?;
        self.memory(index::BUILD_NODE_MEMORY)
    }

    /// `n` existing directories that one path entered anew (see [`PreviousPath`]):
    /// those beyond [`FREE_REENTRIES`] count as entries.
    pub fn reentered(&mut self, n: usize) -> Result<(), ArchiveError> {
        self.count_entries(n.saturating_sub(FREE_REENTRIES) as u64)
    }

    fn count_entries(&mut self, n: u64) -> Result<(), ArchiveError> {
        self.entries = self.entries.saturating_add(n);
        if self.entries > self.limits.max_entries {
            return Err(ArchiveError::TooManyEntries(self.limits.max_entries));
        }
        Ok(())
    }

    fn memory(&mut self, n: u64) -> Result<(), ArchiveError> {
        self.memory = self.memory.saturating_add(n);
        if self.memory >= self.told + GROWTH_STEP {
            self.told = self.memory;
            let memory = self.memory;
            GROWTH.with(|g| {
                if let Some(hook) = g.borrow_mut().as_mut() {
                    hook(memory);
                }
            });
        }
        if self.memory > self.limits.max_index_bytes {
            return Err(ArchiveError::IndexTooLarge(self.limits.max_index_bytes));
        }
        Ok(())
    }

    /// `n` more bytes of entry data.
    pub fn bytes(&mut self, n: u64) -> Result<(), ArchiveError> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.max_unpacked_bytes {
            return Err(ArchiveError::UnpackedTooLarge(
                self.limits.max_unpacked_bytes,
            ));
        }
        Ok(())
    }

    /// `n` more bytes of paths and link targets.
    fn metadata(&mut self, n: usize) -> Result<(), ArchiveError> {
        self.metadata = self.metadata.saturating_add(n as u64);
        if self.metadata > self.limits.max_metadata_bytes {
            return Err(ArchiveError::MetadataTooLarge(
                self.limits.max_metadata_bytes,
            ));
        }
        self.memory(n as u64)
    }

    pub fn unpacked_bytes(&self) -> u64 {
        self.bytes
    }
}

/// The previous path of one kind (the parent of the previous entry, or the target
/// directory of the previous hard link), to tell which directories of the next one it
/// enters anew. Readers count those that exist already with [`Tally::reentered`].
#[derive(Default)]
pub(crate) struct PreviousPath {
    parts: Vec<Vec<u8>>,
}

impl PreviousPath {
    /// Takes `parts` as the previous path from now on; returns how many leading
    /// components they share with the one before. (Only the components that differ
    /// are copied, so following every entry costs what the directories entered do.)
    pub(crate) fn follow(&mut self, parts: &[&[u8]]) -> usize {
        let shared = crate::beneath::shared_prefix(&self.parts, parts);
        self.parts.truncate(shared);
        self.parts
            .extend(parts[shared..].iter().map(|part| part.to_vec()));
        shared
    }
}

/// The decompressed stream as the tar crate reads it, with a budget: while an entry's
/// metadata is read the budget is [`MAX_METADATA`], and a read past it fails, so no
/// record is ever buffered whole beyond the cap, whatever the archive claims.
pub struct Budgeted<R> {
    inner: R,
    budget: Rc<Cell<u64>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let budget = self.budget.get();
        if budget == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "an entry's metadata (long name, long link, pax or sparse records) is larger than {MAX_METADATA} bytes"
                ),
            ));
        }
        let len = buf.len().min(usize::try_from(budget).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..len])?;
        if budget != u64::MAX {
            self.budget.set(budget - n as u64);
        }
        Ok(n)
    }
}

pub type Entry<'a, R> = tar::Entry<'a, Budgeted<R>>;

/// Reads every entry of the tar stream `tar`, calling `each` with it and the tally.
/// Paths and link targets are checked against [`MAX_PATH`] first. Whatever data
/// `each` leaves unread is read here and counted, so the next entry's metadata is
/// read under its own budget.
pub fn for_each_entry<R: Read>(
    tar: R,
    limits: Limits,
    mut each: impl FnMut(&mut Entry<'_, R>, &mut Tally) -> Result<(), ArchiveError>,
) -> Result<Tally, ArchiveError> {
    let budget = Rc::new(Cell::new(MAX_METADATA));
    let mut archive = tar::Archive::new(Budgeted {
        inner: tar,
        budget: Rc::clone(&budget),
    });
    let mut tally = Tally::new(limits);
    // One buffer for every entry's unread rest: zeroing 64 KiB per entry cost a
    // quarter of the indexing of 100,000 tiny files.
    let mut rest = vec![0u8; 64 * 1024];
    let mut entries = archive.entries().map_err(ArchiveError::Corrupt)?;
    loop {
        budget.set(MAX_METADATA);
        let Some(entry) = entries.next() else { break };
        let mut entry = entry.map_err(ArchiveError::Corrupt)?;
        budget.set(u64::MAX);
        tally.entry()?;
        let kind = entry.header().entry_type();
        // A pax global header is metadata for the whole archive, which no reader here
        // uses; the tar crate would read it whole into memory on the first question
        // asked about it, so it is only drained, counted like any data.
        if !(kind.is_pax_global_extensions() || kind.is_pax_local_extensions()) {
            check_names(&entry)?;
            let link = entry.link_name_bytes().map_or(0, |l| l.len());
            tally.metadata(entry.path_bytes().len() + link)?;
            each(&mut entry, &mut tally)?;
        }
        drain(&mut entry, &mut rest, &mut tally)?;
    }
    Ok(tally)
}

/// Refuses paths and link targets that are too long or hold a NUL byte: no system
/// call could name them, and a listing that shows what cannot be opened would lie.
fn check_names<R: Read>(entry: &Entry<'_, R>) -> Result<(), ArchiveError> {
    let path = entry.path_bytes();
    let refuse = |reason| ArchiveError::Hostile {
        entry: display_path(&path[..path.len().min(100)]),
        reason,
    };
    if path.len() > MAX_PATH {
        return Err(refuse("its path is longer than 4096 bytes"));
    }
    if path.contains(&0) {
        return Err(refuse("its path contains a NUL byte"));
    }
    if let Some(link) = entry.link_name_bytes() {
        if link.len() > MAX_PATH {
            return Err(refuse("its link target is longer than 4096 bytes"));
        }
        if link.contains(&0) {
            return Err(refuse("its link target contains a NUL byte"));
        }
    }
    Ok(())
}

/// Reads the rest of an entry's data, counting it.
fn drain(entry: &mut impl Read, buf: &mut [u8], tally: &mut Tally) -> Result<(), ArchiveError> {
    loop {
        match fill(entry, buf).map_err(ArchiveError::Corrupt)? {
            0 => return Ok(()),
            n => tally.bytes(n as u64)?,
        }
    }
}

/// Reads into `buf` until it is full or `reader` ends; returns the bytes read (the
/// archive reader's entries, and the cache's comparison of two files).
/// (`read_exact` fails at the end, and `read_to_end` zeroes the room it reads into
/// at each call.)
pub(crate) fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A tar path split into its normal components, or the reason it is refused.
/// Whether a tree's own directory with permission bits `mode` lets its group and
/// every other user list and search it. Only a root that does not is written as the
/// archive's `./` (see `writer`), and only one that does is shown as open to all by a
/// shared mount (`crate::fs::checkpoints::is_open`): a 0700, 0711 or 0705 workspace
/// keeps its tree, its names or its group out, as on a disk.
pub fn root_is_open(mode: u32) -> bool {
    mode & 0o055 == 0o055
}

pub(crate) fn clean_path(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.first() == Some(&b'/') {
        return Err("absolute paths are not allowed");
    }
    let mut parts = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("`..` would leave the destination"),
            _ => parts.push(part),
        }
    }
    Ok(parts)
}

/// An entry's owner and mtime as `tar -x` sees them: pax records (`mtime`, `uid`,
/// `gid`) win over the header, since they hold what the header cannot (fractions of a
/// second, times before 1970, large ids). Fractional mtimes are floored, like `tar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    pub mtime: i64,
    pub uid: u64,
    pub gid: u64,
}

///
/// An entry with pax `GNU.sparse.*` records (a sparse file as `tar --sparse
/// --format=pax` writes it) is refused: its data is a sparse map and the file's pieces,
/// which the tar reader would show as they are where `tar -x` expands them.
pub(crate) fn entry_meta<R: std::io::Read>(
    entry: &mut tar::Entry<'_, R>,
) -> Result<EntryMeta, ArchiveError> {
    let header = entry.header();
    let mut meta = EntryMeta {
        mtime: header.mtime().map_or(0, |t| t as i64),
        uid: header.uid().unwrap_or(0),
        gid: header.gid().unwrap_or(0),
    };
    if let Ok(Some(extensions)) = entry.pax_extensions() {
        for extension in extensions.flatten() {
            let (Ok(key), Ok(value)) = (extension.key(), extension.value()) else {
                continue;
            };
            match key {
                key if key.starts_with("GNU.sparse.") => {
                    return Err(ArchiveError::Hostile {
                        entry: display_path(&entry.path_bytes()),
                        reason: "a pax sparse file (GNU.sparse.* records), which ckptfs \
                                 cannot expand as tar -x does",
                    });
                }
                "mtime" => {
                    if let Ok(t) = value.trim().parse::<f64>()
                        && t.is_finite()
                    {
                        meta.mtime = t.floor() as i64;
                    }
                }
                "uid" => meta.uid = value.trim().parse().unwrap_or(meta.uid),
                "gid" => meta.gid = value.trim().parse().unwrap_or(meta.gid),
                _ => {}
            }
        }
    }
    Ok(meta)
}

/// Renders a raw path for messages and listings, escaped as [`crate::printable`] says.
pub(crate) fn display_path(bytes: &[u8]) -> String {
    crate::printable::escape(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build tells the hook of its thread every GROWTH_STEP bytes, and only while
    /// the hook is set.
    #[test]
    fn index_growth_is_told_every_step() {
        let told = std::rc::Rc::new(RefCell::new(Vec::new()));
        let seen = std::rc::Rc::clone(&told);
        let steps = 3 * GROWTH_STEP / index::BUILD_NODE_MEMORY + 1;
        with_index_growth(
            move |memory| seen.borrow_mut().push(memory / GROWTH_STEP),
            || {
                let mut t = Tally::new(Limits::DEFAULT);
                for _ in 0..steps {
                    t.entry().unwrap();
                }
            },
        );
        assert_eq!(*told.borrow(), [1, 2, 3]);
        let mut t = Tally::new(Limits::DEFAULT);
        for _ in 0..steps {
            t.entry().unwrap();
        }
        assert_eq!(told.borrow().len(), 3, "told after the hook was reset");
    }

    #[test]
    fn clean_path_refuses_escapes() {
        assert_eq!(clean_path(b"./a/b").unwrap(), vec![&b"a"[..], b"b"]);
        assert_eq!(clean_path(b"a//b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(clean_path(b"/etc/passwd").is_err());
        assert!(clean_path(b"a/../../b").is_err());
        assert!(clean_path(b"..").is_err());
        assert!(clean_path(b".").unwrap().is_empty());
    }
}
