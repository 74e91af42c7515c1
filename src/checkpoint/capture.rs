//! `put`: a tree archived (deterministically, see `crate::archive::writer`) into a
//! temporary file, hashed on the way, and stored under its digest, unless the store
//! already holds a good object of that name; the ranges of objects the store holds
//! are copied there instead of sent where the member cache knows them.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{CheckpointError, CheckpointId, encode_metadata, verify};
use crate::archive::ArchiveError;
use crate::archive::gz::TreeRecords;
use crate::archive::writer::{self, WriterOptions};
use crate::members::costs::{self, Choice, CopyCosts};
use crate::members::store::MemberCache;
use crate::members::tree::TreeMembers;
use crate::store::{ObjectStore, Progress, PutMode, PutOutcome, StoreError};

/// The outcome of [`put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutReport {
    pub id: CheckpointId,
    pub size: u64,
    pub outcome: StoreOutcome,
    /// Bytes the store copied from checkpoints it held instead of receiving them.
    pub copied: u64,
}

/// How a checkpoint came to be in the store, good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOutcome {
    Stored,
    /// The object was there already, and verified.
    AlreadyPresent,
    /// The object was there but damaged (`reason`), and was replaced.
    Replaced {
        reason: String,
    },
}

impl fmt::Display for StoreOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreOutcome::Stored => f.write_str("stored"),
            StoreOutcome::AlreadyPresent => f.write_str("already present, verified"),
            StoreOutcome::Replaced { reason } => {
                write!(f, "stored over a damaged copy ({reason})")
            }
        }
    }
}

pub struct PutOptions<'a> {
    pub max_archive_size: u64,
    /// The largest tar stream: what every reader would refuse to unpack.
    pub max_unpacked: u64,
    /// Where the archive is written before upload.
    pub temp_dir: &'a Path,
    pub threads: usize,
    /// Gzip members of earlier captures (see [`crate::members::store`]).
    pub members: Option<std::sync::Arc<crate::members::store::MemberCache>>,
    /// The checkpoint this one was made from, recorded in its metadata.
    pub parent: Option<CheckpointId>,
    /// Files changed this long before a put are read whatever the last capture of
    /// the directory saw of them (`put --settle`; a seal reads every file).
    pub settle: std::time::Duration,
}

/// Archives `dir` and stores it, unless the same checkpoint is already there.
pub fn put(
    store: &dyn ObjectStore,
    dir: &Path,
    options: &PutOptions<'_>,
    progress: Progress<'_>,
) -> Result<PutReport, CheckpointError> {
    let root = open_tree(dir)?;
    let tree = options.members.as_ref().and_then(|members| {
        TreeMembers::open(Arc::clone(members), dir, &root, options.settle)
            .inspect_err(
                |e| tracing::debug!(error = %e, "no records of this tree: every file is read"),
            )
            .ok()
            .map(Arc::new)
    });
    let (archive, written) = write_archive_file(
        root.as_fd(),
        options,
        Source::Tree(tree.clone().map(|t| t as Arc<dyn TreeRecords>)),
    )?;
    tracing::debug!(
        dir = %dir.display(),
        sha256 = %written.sha256,
        bytes = written.size,
        "archived; storing"
    );
    let report = store_archive(
        store,
        archive.path(),
        &written,
        options.members.as_deref(),
        options.parent.as_ref(),
        progress,
    )?;
    tracing::debug!(checkpoint = %report.id, outcome = %report.outcome, "stored");
    if let Some(tree) = tree {
        tracing::info!(
            unread = tree.unread.load(Ordering::Relaxed),
            read_again = tree.read_again.load(Ordering::Relaxed),
            members_taken = tree.taken.load(Ordering::Relaxed),
            "file bytes left unread as the last capture of this directory saw them, and read after all"
        );
        if let Err(e) = tree.save() {
            tracing::warn!(error = %e, "cannot record what this capture saw: the next reads every file");
        }
    }
    Ok(report)
}

/// Opens the directory to capture. The path is the caller's own and may go through
/// symlinks; nothing below it is ever followed.
fn open_tree(dir: &Path) -> Result<std::os::fd::OwnedFd, CheckpointError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOTDIR => CheckpointError::Archive(ArchiveError::Source {
            path: dir.to_owned(),
            reason: "not a directory".into(),
        }),
        e => CheckpointError::Io {
            context: format!("open {}", dir.display()),
            cause: e.into(),
        },
    })
}

/// How the names of [`write_archive_file`]'s temporary files start: a mount deletes
/// those a killed predecessor left in its work directory.
pub const PUT_TEMP_PREFIX: &str = ".ckptfs-put-";

/// What [`write_archive_file`] does besides writing the archive.
pub enum Source<'a> {
    /// Takes members recorded by the last capture of the same tree without reading
    /// their files, and records this one's (a put).
    Tree(Option<Arc<dyn TreeRecords>>),
    /// Copies the uncompressed tar stream (a seal, which indexes it).
    Copy(&'a mut dyn io::Write),
    /// Both: files the records saw are left unread, and the copy has zeros for their
    /// contents (a seal that checks the stream's shape and indexes nothing).
    TreeAndCopy(Arc<dyn TreeRecords>, &'a mut dyn io::Write),
}

/// Archives `dir` into a temporary file (deleted when dropped), hashing it on the way.
pub fn write_archive_file(
    dir: BorrowedFd<'_>,
    options: &PutOptions<'_>,
    source: Source<'_>,
) -> Result<(tempfile::NamedTempFile, writer::WrittenArchive), CheckpointError> {
    let temp = tempfile::Builder::new()
        .prefix(PUT_TEMP_PREFIX)
        .tempfile_in(options.temp_dir)
        .map_err(|cause| CheckpointError::Io {
            context: format!("create a temporary file in {}", options.temp_dir.display()),
            cause,
        })?;
    let out = super::spool::SpoolWriter::new(temp.as_file());
    let mut writer_options = WriterOptions {
        max_size: options.max_archive_size,
        max_unpacked: options.max_unpacked,
        threads: options.threads,
        members: options
            .members
            .clone()
            .map(|m| m as Arc<dyn crate::archive::gz::MemberSource>),
        tree: None,
    };
    let written = match source {
        Source::Tree(tree) => {
            writer_options.tree = tree;
            writer::write_archive(dir, out, &writer_options)?
        }
        Source::Copy(tar_copy) => {
            writer::write_archive_with_copy(dir, out, &writer_options, tar_copy)?
        }
        Source::TreeAndCopy(tree, tar_copy) => {
            writer_options.tree = Some(tree);
            writer::write_archive_with_copy(dir, out, &writer_options, tar_copy)?
        }
    };
    Ok((temp, written))
}

/// Stores an archive already written (and hashed) at `path`. When the store already
/// has an object of that name, the object is downloaded and verified first: only a
/// good copy counts as "already present" (callers may then discard the only other
/// copy of the tree, a staged workspace). A damaged or planted one is replaced.
///
/// With `members`, the ranges of the archive that objects stored before hold too (by
/// their recorded layouts) are offered to the store to copy, and the new object's
/// layout is recorded once the store holds it, good.
pub fn store_archive(
    store: &dyn ObjectStore,
    path: &Path,
    written: &writer::WrittenArchive,
    members: Option<&MemberCache>,
    parent: Option<&CheckpointId>,
    progress: Progress<'_>,
) -> Result<PutReport, CheckpointError> {
    let id = CheckpointId::parse(&written.sha256).expect("sha256 hex is a valid id");
    let name = id.object_name();
    let metadata = encode_metadata(&id, written.size, parent);
    let mut copied = 0;
    let mut copied_unchecked = 0;
    let described = store.describe();
    let known = members
        .map(|m| m.copy_costs(&described))
        .unwrap_or_default();
    let mut costs = known;
    let stored = !store.exists(&name)?
        && {
            let mut reuse = members.map_or_else(Vec::new, |m| reusable(store, m, written));
            let planned: u64 = reuse.iter().map(|r| r.length).sum();
            if let Choice::Send { read_back, send } = costs::choose(&costs, written.size, planned) {
                tracing::info!(
                    bytes = planned,
                    read_back_secs = format!("{read_back:.2}"),
                    send_secs = format!("{send:.2}"),
                    "sending instead of copying: the store gives no SHA-256 of a copied part, and reading the object back would take longer"
                );
                reuse.clear();
            }
            let started = Instant::now();
            let stored =
                store.put_reusing(&name, path, &metadata, PutMode::IfAbsent, &reuse, progress)?;
            copied = stored.copied;
            copied_unchecked = stored.copied_unchecked;
            if copied == 0 && written.size >= RATE_SAMPLE {
                let secs = started.elapsed().as_secs_f64();
                costs.upload = CopyCosts::measured(costs.upload, written.size, secs);
            }
            if copied > 0 {
                costs.vouched = Some(copied_unchecked == 0);
            }
            stored.outcome == PutOutcome::Stored
        };
    // A copy only an MD5 vouched for is read back (see `Stored::copied_unchecked`);
    // otherwise the object was there, or a concurrent writer just stored it: only a
    // good copy counts.
    let outcome = if stored && copied_unchecked == 0 {
        StoreOutcome::Stored
    } else {
        if copied_unchecked > 0 {
            tracing::debug!(checkpoint = %id, bytes = copied_unchecked, "reading back an object the store assembled with copies checked by MD5 only");
        }
        let started = Instant::now();
        let verified = verify(store, &id);
        if copied_unchecked > 0 && verified.is_ok() {
            let secs = started.elapsed().as_secs_f64();
            costs.download = CopyCosts::measured(costs.download, written.size, secs);
        }
        match verified {
            Ok(()) if stored => StoreOutcome::Stored,
            // This capture is a new turn with an old turn's content: the object takes
            // this capture's time, capture time and parent, so that it is listed as
            // the newest turn and a prune's grace period covers it. If it was deleted
            // since it verified (a prune), it is stored again.
            Ok(()) => match store.refresh(&name, &metadata) {
                Ok(()) => StoreOutcome::AlreadyPresent,
                Err(StoreError::NotFound { .. }) => {
                    store.put(&name, path, &metadata, PutMode::IfAbsent, progress)?;
                    copied = 0;
                    StoreOutcome::Stored
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %id, error = %e, "could not make the present object's time now: it keeps its earlier place in the turn order");
                    StoreOutcome::AlreadyPresent
                }
            },
            Err(CheckpointError::Verify { failure, .. }) => {
                tracing::warn!(checkpoint = %id, reason = %failure, "the stored object is damaged; replacing it");
                store.put(&name, path, &metadata, PutMode::Overwrite, progress)?;
                copied = 0;
                StoreOutcome::Replaced {
                    reason: failure.to_string(),
                }
            }
            Err(e) => return Err(e),
        }
    };
    if let Some(members) = members {
        if let Err(e) = members.record_layout(&name, &written.members) {
            tracing::debug!(checkpoint = %id, error = %e, "cannot record the layout");
        }
        if costs != known
            && let Err(e) = members.record_copy_costs(&described, &costs)
        {
            tracing::debug!(error = %e, "cannot record what the store's copies cost");
        }
    }
    Ok(PutReport {
        id,
        size: written.size,
        outcome,
        copied,
    })
}

/// The smallest object whose upload measures the store's upload rate (smaller ones
/// measure the requests more than the bytes).
const RATE_SAMPLE: u64 = 4 << 20;

/// The ranges of `written` that objects the store still has hold too, by the layouts
/// `members` recorded (the store checks each range it copies).
fn reusable(
    store: &dyn ObjectStore,
    members: &MemberCache,
    written: &writer::WrittenArchive,
) -> Vec<crate::store::Reuse> {
    let mut reuse = members.reuse(&written.members);
    let mut present: HashMap<String, bool> = HashMap::new();
    reuse.retain(|r| {
        *present
            .entry(r.source.clone())
            .or_insert_with(|| store.exists(&r.source).unwrap_or(false))
    });
    reuse
}
