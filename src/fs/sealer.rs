//! Sealing a staged workspace into a checkpoint with one rename, and `commit/`.
//!
//! `rename(staging/NAME, commit/NAME)` (what `mv staging/NAME commit/` does) freezes
//! NAME, writes it with the same archive writer as `ckptfs put`, stores it with the
//! same put path (a stored object of that name counts only once verified), indexes
//! the very bytes that were hashed into the cache (so the new checkpoint is browsable
//! without a download), and only then answers. A forked workspace whose capture after
//! the fork left records ([`Sealer::record_fork`]) is sealed reading only the files
//! changed since; its tar stream then lacks the others' bytes, so it is only checked
//! against the mount's limits, and the new checkpoint is loaded from the store in
//! the background. `commit/NAME` becomes a symlink to
//! `../<sha256>` and the staged copy is deleted: only once the store holds a good
//! object, so no seal loses a workspace.
//!
//! On any failure the rename fails (`EFBIG` over the archive limit, `EIO` on a store
//! error, `EBUSY` while files in NAME are open for writing), NAME is thawed exactly as
//! it was, and the store's put guarantees leave no partial object behind. The work
//! runs on a thread of its own, one per seal in progress (the kernel's rename lock
//! lets one seal run per mount at a time); FUSE request threads keep answering.
//!
//! A daemon killed in the middle of an upload cannot abort it. So every upload is
//! first recorded in a journal (`<work dir>/.upload-<object name>`), and removed when
//! it ends either way; a sealer starting on the same cache directory (one daemon per
//! cache directory) abandons the uploads a killed predecessor left, and deletes its
//! unfinished archives.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use super::error::FsError;
use super::inode;
use super::listing::Catalog;
use super::loader::Loader;
use super::staging::StagingTree;
use super::subtree::KernelCache;
use crate::archive::index;
use crate::archive::{ArchiveError, Limits};
use crate::cache::{Cache, Provenance};
use crate::checkpoint::{
    self, CheckpointError, CheckpointId, CheckpointInfo, PutOptions, PutReport, StoreOutcome,
};
use crate::members::store::MemberCache;
use crate::members::tree::TreeMembers;
use crate::pipe::pipe;
use crate::store::ObjectStore;

/// Journal entries of uploads in progress, in the work directory.
const JOURNAL_PREFIX: &str = ".upload-";

/// How many finished seals `.status` remembers.
const OUTCOMES_KEPT: usize = 100;

pub type SealDone = Box<dyn FnOnce(Result<(), FsError>) + Send>;

pub struct SealerConfig {
    pub max_archive_size: u64,
    pub limits: Limits,
    /// Where sealed workspaces are archived before upload.
    pub work_dir: PathBuf,
    /// Compression threads.
    pub threads: usize,
    /// Gzip members of earlier captures.
    pub members: Option<Arc<MemberCache>>,
}

/// The seals of each user that `commit/` lists at most: their newest. Any user of a
/// shared mount may seal empty workspaces under new names as fast as they like (each
/// seal of a tree already stored costs the store nothing); counted by user, so that
/// no one pushes another's names out (whose names anyone could then take).
const COMMIT_NAMES: usize = if cfg!(test) { 3 } else { 10_000 };

/// A workspace sealed by this mount: `commit/NAME`.
struct Committed {
    name: Vec<u8>,
    id: CheckpointId,
}

#[derive(Default)]
struct Seals {
    /// The workspaces sealed by this mount, by `commit/` entry number (its inode, in
    /// seal order; numbers are never reused), at most [`COMMIT_NAMES`] per user.
    sealed: BTreeMap<usize, Committed>,
    next_entry: usize,
    /// Each user's entries in `sealed`, oldest first.
    by_owner: HashMap<u32, VecDeque<usize>>,
    in_progress: Vec<Vec<u8>>,
    /// Recent outcomes, for `.status`.
    outcomes: Vec<String>,
    /// Seals that ended, since the mount started: sealed, and failed.
    succeeded: u64,
    failed: u64,
}

impl Seals {
    fn named(&self, name: &[u8]) -> Option<usize> {
        (self.sealed.iter()).find_map(|(&entry, c)| (c.name == name).then_some(entry))
    }

    /// Lists `commit/NAME`, dropping `owner`'s oldest entry past their bound.
    fn commit(&mut self, name: Vec<u8>, id: CheckpointId, owner: u32) {
        let entry = self.next_entry;
        self.next_entry += 1;
        self.sealed.insert(entry, Committed { name, id });
        let theirs = self.by_owner.entry(owner).or_default();
        theirs.push_back(entry);
        if theirs.len() > COMMIT_NAMES
            && let Some(oldest) = theirs.pop_front()
        {
            self.sealed.remove(&oldest);
        }
    }
}

/// What `.status` shows of the seals.
pub struct SealsReport {
    pub in_progress: Vec<Vec<u8>>,
    pub outcomes: Vec<String>,
    pub succeeded: u64,
    pub failed: u64,
}

pub struct Sealer {
    staging: Arc<StagingTree>,
    store: Arc<dyn ObjectStore>,
    cache: Arc<Cache>,
    catalog: Arc<Catalog>,
    loader: Arc<Loader>,
    config: SealerConfig,
    seals: Mutex<Seals>,
    /// Captures of forked workspaces running or waiting ([`Sealer::record_fork`]),
    /// and the lock that lets one run.
    recording: AtomicUsize,
    record_lock: Mutex<()>,
}

/// What reads the copy of a seal's tar stream.
enum Indexer {
    /// Indexes it into a new cache entry.
    Entry(
        std::thread::JoinHandle<(
            crate::cache::PendingEntry,
            Result<index::Index, ArchiveError>,
        )>,
    ),
    /// Only checks that the mount could read it back.
    Check(std::thread::JoinHandle<Result<(), ArchiveError>>),
    /// No cache entry could be started: the archive is checked afterwards.
    None,
}

/// A name as the first field of a `.status` seal line: escaped, and its colons too
/// (`\x3a`), so that the first `: ` ends it. A name is the writer's: one holding
/// `: sealed as <sha> (` once made a failed seal read as a success.
fn status_field(shown: &str) -> String {
    shown.replace(':', "\\x3a")
}

fn seal_error(e: CheckpointError) -> FsError {
    match e {
        CheckpointError::Archive(ArchiveError::TooLarge { limit }) => FsError::TooLarge(format!(
            "the workspace's archive is larger than the limit of {limit} bytes"
        )),
        CheckpointError::Archive(ArchiveError::UnpackedTooLarge(limit)) => FsError::TooLarge(
            format!("the workspace unpacks to more than the limit of {limit} bytes"),
        ),
        CheckpointError::Archive(e @ ArchiveError::PathTooLong { .. }) => {
            FsError::NameTooLong(e.to_string())
        }
        other => FsError::Store(other.to_string()),
    }
}

/// Why the mount could not read back an archive its indexer refused, if the refusal is
/// the archive's (a limit, a hostile entry) and not the cache's (a full disk).
fn unreadable(e: &ArchiveError) -> Option<FsError> {
    match e {
        ArchiveError::TooLarge { .. }
        | ArchiveError::TooManyEntries(_)
        | ArchiveError::UnpackedTooLarge(_)
        | ArchiveError::MetadataTooLarge(_)
        | ArchiveError::IndexTooLarge(_)
        | ArchiveError::Hostile { .. } => Some(FsError::TooLarge(format!(
            "the mount could not read the workspace back: {e}"
        ))),
        _ => None,
    }
}

impl Sealer {
    pub fn new(
        staging: Arc<StagingTree>,
        store: Arc<dyn ObjectStore>,
        cache: Arc<Cache>,
        catalog: Arc<Catalog>,
        loader: Arc<Loader>,
        config: SealerConfig,
    ) -> Self {
        let sealer = Sealer {
            staging,
            store,
            cache,
            catalog,
            loader,
            config,
            seals: Mutex::new(Seals::default()),
            recording: AtomicUsize::new(0),
            record_lock: Mutex::new(()),
        };
        sealer.recover();
        sealer
    }

    /// The journal entry of an upload of `object`.
    fn journal(&self, object: &str) -> PathBuf {
        self.config
            .work_dir
            .join(format!("{JOURNAL_PREFIX}{object}"))
    }

    /// Cleans up after a daemon that was killed while sealing: its uploads still in
    /// the journal are abandoned in the store, its unfinished archives deleted.
    fn recover(&self) {
        let Ok(entries) = std::fs::read_dir(&self.config.work_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if file_name.starts_with(checkpoint::PUT_TEMP_PREFIX) {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Some(name) = file_name.strip_prefix(JOURNAL_PREFIX) else {
                continue;
            };
            match self.store.abort_uploads(name) {
                Ok(n) => {
                    tracing::info!(object = %name, aborted = n, "cleaned up an upload a killed daemon left");
                    let _ = std::fs::remove_file(entry.path());
                }
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "could not clean up an interrupted upload; will try again at the next start")
                }
            }
        }
    }

    /// `commit/NAME`'s entry number, if NAME was sealed by this mount (and is among
    /// its sealer's last [`COMMIT_NAMES`]).
    pub fn committed(&self, name: &[u8]) -> Option<usize> {
        let seals = self.seals.lock().expect("seals lock");
        seals.named(name)
    }

    /// The checkpoint `commit/` entry `index` links to.
    pub fn sealed(&self, index: usize) -> Option<CheckpointId> {
        let seals = self.seals.lock().expect("seals lock");
        seals.sealed.get(&index).map(|c| c.id.clone())
    }

    /// The entries of `commit/`, in order: each one's number and name.
    pub fn names(&self) -> Vec<(usize, Vec<u8>)> {
        let seals = self.seals.lock().expect("seals lock");
        (seals.sealed.iter())
            .map(|(&entry, c)| (entry, c.name.clone()))
            .collect()
    }

    pub fn report(&self) -> SealsReport {
        let seals = self.seals.lock().expect("seals lock");
        SealsReport {
            in_progress: seals.in_progress.clone(),
            outcomes: seals.outcomes.clone(),
            succeeded: seals.succeeded,
            failed: seals.failed,
        }
    }

    /// `rename(staging/NAME, commit/COMMIT_NAME)`, the commit rule: only a top-level
    /// workspace of `staging/` may be moved into `commit/`, and not by an exchange. It
    /// is sealed ([`Sealer::seal`]); once it is, the kernel's entry for
    /// `commit/COMMIT_NAME` (the directory it moved there) is dropped, since that is
    /// a symlink now.
    pub fn commit(
        self: &Arc<Self>,
        (parent, name): (u64, &[u8]),
        commit_name: &[u8],
        flags: u32,
        kernel: Arc<OnceLock<Arc<dyn KernelCache>>>,
        done: SealDone,
    ) {
        if parent != inode::STAGING {
            return done(Err(FsError::CommitOnly(
                "only top-level entries of staging/ can be moved into commit/",
            )));
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            return done(Err(FsError::InvalidArgument));
        }
        let owner = match self.staging.check_sealable(name) {
            Ok(owner) => owner,
            Err(e) => return done(Err(e)),
        };
        let committed = commit_name.to_vec();
        let done: SealDone = Box::new(move |result| {
            let sealed = result.is_ok();
            done(result);
            if let (true, Some(kernel)) = (sealed, kernel.get()) {
                // (Uncached entries make this a courtesy.)
                kernel.forget_entry(inode::COMMIT, &committed);
            }
        });
        self.seal(name.to_vec(), commit_name.to_vec(), owner, done);
    }

    /// Seals `staging/name`, a workspace of user `owner`, as the checkpoint
    /// `commit/commit_name` links to; `done` gets the outcome.
    pub fn seal(self: &Arc<Self>, name: Vec<u8>, commit_name: Vec<u8>, owner: u32, done: SealDone) {
        {
            let mut seals = self.seals.lock().expect("seals lock");
            let taken =
                seals.named(&commit_name).is_some() || seals.in_progress.contains(&commit_name);
            if taken {
                drop(seals);
                return done(Err(FsError::Exists));
            }
            seals.in_progress.push(commit_name.clone());
        }
        let sealer = Arc::clone(self);
        std::thread::Builder::new()
            .name("ckptfs-seal".into())
            .spawn(move || {
                let result = sealer.seal_now(&name);
                sealer.finished(&commit_name, owner, &result);
                done(result.map(drop));
            })
            .expect("spawning a seal thread");
    }

    fn finished(&self, commit_name: &[u8], owner: u32, result: &Result<PutReport, FsError>) {
        // The name is the writer's: shown escaped, so that it cannot forge a line of
        // `.status` or of the log.
        let shown = crate::printable::escape(commit_name);
        let mut seals = self.seals.lock().expect("seals lock");
        seals.in_progress.retain(|n| n != commit_name);
        let outcome = match result {
            Ok(PutReport {
                id,
                outcome: how,
                size,
                copied,
            }) => {
                seals.succeeded += 1;
                seals.commit(commit_name.to_vec(), id.clone(), owner);
                // Over the mount's life: how much the member cache saved.
                let (reused, compressed, _) =
                    (self.config.members.as_ref()).map_or((0, 0, 0), |m| m.stats.counts());
                let inflated = (self.config.members.as_ref())
                    .map_or(0, |m| m.stats.inflated.load(Ordering::Relaxed));
                // Each seal that stores an object is logged; one of a tree already
                // stored (which costs the store nothing, so anyone may repeat it at
                // will) is logged once a while per checkpoint, as refusals are.
                let logged = *how == StoreOutcome::Stored
                    || crate::fs::error::first_time(&format!("sealed again as {id}"));
                if logged {
                    tracing::info!(
                        workspace = %shown,
                        checkpoint = %id,
                        %how,
                        members_reused = reused,
                        members_compressed = compressed,
                        members_inflated = inflated,
                        sent = if *how == StoreOutcome::Stored { size - copied } else { 0 },
                        copied,
                        "sealed"
                    );
                } else {
                    tracing::debug!(workspace = %shown, checkpoint = %id, %how, "sealed");
                }
                format!("{}: sealed as {id} ({how})", status_field(&shown))
            }
            Err(e) => {
                seals.failed += 1;
                let error = crate::printable::escape(e.to_string().as_bytes()).into_owned();
                if crate::fs::error::first_time(&format!("seal {shown}: {error}")) {
                    tracing::warn!(workspace = %shown, %error, "seal failed; the workspace is unchanged");
                } else {
                    tracing::debug!(workspace = %shown, %error, "seal failed (logged before)");
                }
                format!("{}: FAILED: {error}", status_field(&shown))
            }
        };
        seals.outcomes.push(outcome);
        if seals.outcomes.len() > OUTCOMES_KEPT {
            seals.outcomes.remove(0);
        }
    }

    fn seal_now(&self, name: &[u8]) -> Result<PutReport, FsError> {
        let frozen = self.staging.freeze(name, self.config.limits.max_entries)?;
        // A workspace started from one checkpoint (`cp -a MNT/<sha>/. staging/NAME/`)
        // records it as its parent; from several, or none that the mount saw, none.
        let parent = match frozen.copied_from.len() {
            1 => frozen.copied_from.iter().next().cloned(),
            _ => None,
        };
        let records = frozen.forked.and_then(|key| self.fork_records(&key));
        let result = self.seal_frozen(frozen.dir.as_fd(), parent, records);
        if result.is_ok() {
            if let Err(e) = self.staging.remove_sealed(frozen) {
                let shown = crate::printable::escape(name);
                tracing::warn!(workspace = %shown, error = %e, "could not delete the sealed workspace's staged copy");
            }
        } else {
            self.staging.thaw(frozen);
        }
        result
    }

    /// Whether the mount could read back the archive at `path`: an error naming the
    /// limit if not.
    fn check_readable(&self, path: &std::path::Path, mtime: i64) -> Result<(), FsError> {
        let file = std::fs::File::open(path).map_err(|e| {
            FsError::Store(format!(
                "cannot read the archive back ({}): {e}",
                path.display()
            ))
        })?;
        let tar = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file));
        match index::build(tar, &mut index::Discard, self.config.limits, mtime) {
            Err(e) => match unreadable(&e) {
                Some(refusal) => Err(refusal),
                None => Err(FsError::Store(format!("cannot read the archive back: {e}"))),
            },
            Ok(_) => Ok(()),
        }
    }

    /// The records of the capture that followed the fork of a workspace
    /// ([`Sealer::record_fork`]), if there are any.
    fn fork_records(&self, key: &[u8; 32]) -> Option<Arc<TreeMembers>> {
        let members = self.config.members.clone()?;
        let records = TreeMembers::of_fork(members, key);
        records.has_records().then(|| Arc::new(records))
    }

    /// Captures a forked workspace as a seal of it would, writing nothing, to record
    /// what it saw of each file (under `key`): the seal then reads only the files
    /// changed since (see `crate::members::tree`). On the calling thread, which it
    /// gives the lowest CPU priority; at most one at a time, and one waiting. It stops
    /// once it has read twice what the fork made (`forked_bytes`), and 64 MiB more:
    /// what is written into the workspace after the fork is the seal's to read, and
    /// a file made huge and sparse there must not cost the daemon more than that.
    /// Whether it recorded the workspace.
    pub fn record_fork(
        &self,
        workspace: std::os::fd::OwnedFd,
        key: [u8; 32],
        forked_bytes: u64,
    ) -> bool {
        let Some(members) = self.config.members.clone() else {
            return false;
        };
        if self.recording.fetch_add(1, Ordering::SeqCst) >= 2 {
            self.recording.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!("a fork's capture is skipped: two are running or waiting");
            return false;
        }
        let _one = self.record_lock.lock().expect("record lock");
        // SAFETY: setpriority has no memory preconditions; on Linux a thread id
        // names that thread alone (the compression threads it starts inherit it).
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, 19) };
        let started = std::time::Instant::now();
        let records = Arc::new(TreeMembers::of_fork(Arc::clone(&members), &key));
        let options = crate::archive::writer::WriterOptions {
            max_size: self.config.max_archive_size,
            max_unpacked: forked_bytes
                .saturating_mul(2)
                .saturating_add(64 << 20)
                .min(self.config.limits.max_unpacked_bytes),
            threads: self.config.threads,
            members: Some(members as Arc<dyn crate::archive::gz::MemberSource>),
            tree: Some(Arc::clone(&records) as Arc<dyn crate::archive::gz::TreeRecords>),
        };
        let written =
            crate::archive::writer::write_archive(workspace.as_fd(), std::io::sink(), &options);
        let recorded = match written.map(|_| records.save()) {
            Ok(Ok(())) => {
                tracing::info!(
                    elapsed = ?started.elapsed(),
                    "recorded what the forked workspace holds: its seal reads only what changes"
                );
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot keep a fork's records");
                false
            }
            // Changed meanwhile (or sealed, or removed), or grown past its bound: its
            // seal reads every file.
            Err(e) => {
                let error = crate::printable::escape(e.to_string().as_bytes()).into_owned();
                tracing::info!(%error, "a fork's capture stopped: its seal reads every file");
                false
            }
        };
        self.recording.fetch_sub(1, Ordering::SeqCst);
        recorded
    }

    fn seal_frozen(
        &self,
        dir: BorrowedFd<'_>,
        parent: Option<CheckpointId>,
        records: Option<Arc<TreeMembers>>,
    ) -> Result<PutReport, FsError> {
        let options = PutOptions {
            max_archive_size: self.config.max_archive_size,
            max_unpacked: self.config.limits.max_unpacked_bytes,
            temp_dir: &self.config.work_dir,
            threads: self.config.threads,
            members: self.config.members.clone(),
            parent: parent.clone(),
            settle: std::time::Duration::ZERO,
        };
        let (mut tar_copy, tar_stream) = pipe(8);
        let now = SystemTime::now();
        let mtime = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let limits = self.config.limits;
        // The uncompressed tar stream is indexed on a second thread as it is written:
        // into the cache, so that the new checkpoint is served from the very bytes
        // that were compressed and hashed, with no download and no second
        // decompression; or, when the fork's records leave files unread (their
        // contents are zeros in the copy), only to check it, and the checkpoint is
        // loaded from the store like any other.
        let indexer = match &records {
            Some(_) => Indexer::Check(std::thread::spawn(move || {
                index::build(tar_stream, &mut index::Discard, limits, mtime).map(drop)
            })),
            None => match self.cache.begin() {
                Ok(mut pending) => Indexer::Entry(std::thread::spawn(move || {
                    let built = index::build(tar_stream, &mut pending, limits, mtime);
                    (pending, built)
                })),
                Err(_) => Indexer::None,
            },
        };
        let source = match &records {
            Some(records) => checkpoint::Source::TreeAndCopy(
                Arc::clone(records) as Arc<dyn crate::archive::gz::TreeRecords>,
                &mut tar_copy,
            ),
            None => checkpoint::Source::Copy(&mut tar_copy),
        };
        let written = checkpoint::write_archive_file(dir, &options, source);
        drop(tar_copy);
        // The indexer reads the archive as the mount would read it back: what it
        // refuses (more entries than --max-entries, metadata past its limit, a path
        // too long) must not be stored, nor the workspace deleted for it. `refused`:
        // `None` if it read it all, `Some(None)` if it could not say.
        let (indexed, refused) = match indexer {
            Indexer::Entry(t) => {
                let (pending, built) = t.join().expect("the indexing thread panicked");
                let refused = built.as_ref().err().map(unreadable);
                (Some((pending, built)), refused)
            }
            Indexer::Check(t) => {
                let checked = t.join().expect("the checking thread panicked");
                (None, checked.as_ref().err().map(unreadable))
            }
            Indexer::None => (None, Some(None)),
        };
        let (archive, written) = written.map_err(seal_error)?;
        if let Some(records) = &records {
            tracing::info!(
                unread = records.unread.load(Ordering::Relaxed),
                read_again = records.read_again.load(Ordering::Relaxed),
                members_taken = records.taken.load(Ordering::Relaxed),
                "file bytes left unread as the fork's capture saw them, and read after all"
            );
        }
        match refused {
            None => {}
            Some(Some(refusal)) => return Err(refusal),
            // The cache failed (a full disk, no descriptor left), so the indexer could
            // not say: read the archive once more, keeping nothing, to see.
            Some(None) => self.check_readable(archive.path(), mtime)?,
        }
        tracing::debug!(bytes = written.size, "archived and indexed; storing");
        let object = CheckpointId::parse(&written.sha256)
            .expect("a sha256 is an id")
            .object_name();
        let journal = self.journal(&object);
        std::fs::write(&journal, b"").map_err(|e| {
            FsError::Store(format!(
                "cannot record the upload in {}: {e}",
                journal.display()
            ))
        })?;
        let stored = checkpoint::store_archive(
            self.store.as_ref(),
            archive.path(),
            &written,
            self.config.members.as_deref(),
            parent.as_ref(),
            &|_, _| {},
        );
        let _ = std::fs::remove_file(&journal);
        let report = stored.map_err(seal_error)?;
        tracing::debug!(checkpoint = %report.id, outcome = %report.outcome, "stored; adding to the cache");
        let info = CheckpointInfo {
            id: report.id.clone(),
            size: report.size,
            last_modified: now,
        };
        // The checkpoint is stored: from here on a failure only costs a download later.
        let slot = self.catalog.add(info);
        if records.is_some() {
            // Files were left unread, so the copy held zeros for them: the checkpoint
            // is loaded (downloaded and verified) now, in the background, as a
            // replica would load it.
            self.loader.when_loaded(&slot, Box::new(|| {}));
            return Ok(report);
        }
        let verified = match indexed {
            Some((pending, Ok(index))) => self
                .cache
                .finish(
                    pending,
                    &report.id,
                    index,
                    Provenance::Sealed { sealed_at: now },
                )
                .map_err(|e| e.to_string()),
            Some((_, Err(e))) => Err(e.to_string()),
            None => Err("no cache entry could be started".into()),
        };
        match verified {
            Ok(verified) => self.loader.adopt(&slot, verified),
            Err(e) => {
                tracing::warn!(checkpoint = %report.id, error = %e, "could not index the sealed archive; it will be downloaded on access");
            }
        }
        Ok(report)
    }
}
