//! Tests of the filesystem core without a kernel: a local store (behind a wrapper that
//! counts and injects failures), a cache and a staging directory in temporary folders,
//! and the core called as the FUSE adapter would call it. One module per subtree, and
//! a reference model of `staging/` driven by random operation sequences.

mod checkpoints;
mod loader;
mod reftest;
mod sealing;
mod staging;
mod views;

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::*;
use crate::archive::Limits;
use crate::cache::Cache;
use crate::checkpoint::{self, CheckpointId, PutOptions};
use crate::store::local::LocalStore;
use crate::store::{ObjectInfo, ObjectReader, ObjectStore, PutMode, PutOutcome, StoreError};

/// A local store whose failures the test controls, and which counts downloads.
#[derive(Default)]
pub struct Faults {
    pub gets: AtomicU64,
    /// The next N listings fail.
    pub failing_lists: AtomicU64,
    /// The next N downloads break after this many bytes (see `cut_after`).
    pub cut_gets: AtomicU64,
    pub cut_after: AtomicU64,
    /// Every upload fails.
    pub failing_puts: AtomicBool,
    /// Each download waits this long (milliseconds) before its first byte.
    pub get_delay_ms: AtomicU64,
}

pub struct FaultyStore {
    inner: LocalStore,
    pub faults: Arc<Faults>,
}

fn injected(what: &'static str) -> StoreError {
    StoreError::Remote {
        operation: what,
        name: "test".into(),
        message: "injected failure".into(),
    }
}

impl ObjectStore for FaultyStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn list(&self) -> Result<Vec<ObjectInfo>, StoreError> {
        if self.faults.failing_lists.load(Ordering::SeqCst) > 0 {
            self.faults.failing_lists.fetch_sub(1, Ordering::SeqCst);
            return Err(injected("ListObjectsV2"));
        }
        self.inner.list()
    }

    fn refresh(
        &self,
        name: &str,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        self.inner.refresh(name, metadata)
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.inner.delete(name)
    }

    fn head(&self, name: &str) -> Result<crate::store::ObjectMeta, StoreError> {
        self.inner.head(name)
    }

    fn get(&self, name: &str) -> Result<ObjectReader, StoreError> {
        self.faults.gets.fetch_add(1, Ordering::SeqCst);
        let delay = self.faults.get_delay_ms.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(delay));
        let mut object = self.inner.get(name)?;
        if self.faults.cut_gets.load(Ordering::SeqCst) > 0 {
            self.faults.cut_gets.fetch_sub(1, Ordering::SeqCst);
            let limit = self.faults.cut_after.load(Ordering::SeqCst);
            object.body = Box::new(Cut {
                inner: object.body,
                left: limit,
            });
        }
        Ok(object)
    }

    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.exists(name)
    }

    fn put(
        &self,
        name: &str,
        path: &Path,
        metadata: &std::collections::BTreeMap<String, String>,
        mode: PutMode,
        progress: crate::store::Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        if self.faults.failing_puts.load(Ordering::SeqCst) {
            return Err(injected("PutObject"));
        }
        self.inner.put(name, path, metadata, mode, progress)
    }
}

/// A download whose connection breaks after `left` bytes.
struct Cut {
    inner: Box<dyn Read + Send>,
    left: u64,
}

impl Read for Cut {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "injected cut",
            ));
        }
        let len = buf.len().min(self.left as usize);
        let n = self.inner.read(&mut buf[..len])?;
        self.left -= n as u64;
        Ok(n)
    }
}

pub struct Fixture {
    pub fs: Arc<CheckpointFs>,
    pub faults: Arc<Faults>,
    pub store_dir: tempfile::TempDir,
    pub cache: Arc<Cache>,
    /// Where the cache keeps its entries.
    pub cache_entries: std::path::PathBuf,
    pub staging_dir: std::path::PathBuf,
    _cache_dir: tempfile::TempDir,
}

pub struct Options {
    pub loaders: usize,
    pub cache_bytes: u64,
    pub memory_budget: u64,
    pub read_only: bool,
    pub passthrough: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            loaders: 2,
            cache_bytes: 1 << 30,
            memory_budget: u64::MAX,
            read_only: false,
            passthrough: false,
        }
    }
}

/// Puts each tree (relative path, contents) into a fresh store and mounts it.
pub fn fixture(trees: &[&[(&str, &[u8])]]) -> (Fixture, Vec<CheckpointId>) {
    fixture_with(trees, Options::default())
}

pub fn put_tree(store_dir: &Path, files: &[(&str, &[u8])]) -> CheckpointId {
    let store = LocalStore::open(store_dir).unwrap();
    let tree = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        let path = tree.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    let scratch = tempfile::tempdir().unwrap();
    let options = PutOptions {
        max_archive_size: u64::MAX,
        max_unpacked: u64::MAX,
        temp_dir: scratch.path(),
        threads: 1,
        members: None,
        parent: None,
        settle: std::time::Duration::ZERO,
    };
    checkpoint::put(&store, tree.path(), &options, &|_, _| {})
        .unwrap()
        .id
}

pub fn fixture_with(trees: &[&[(&str, &[u8])]], options: Options) -> (Fixture, Vec<CheckpointId>) {
    let store_dir = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    for (i, files) in trees.iter().enumerate() {
        let id = put_tree(store_dir.path(), files);
        // Distinct listing times, an hour apart, in the order of the trees.
        let time = std::time::UNIX_EPOCH + Duration::from_secs(1_780_000_000 + 3600 * i as u64);
        std::fs::File::options()
            .write(true)
            .open(store_dir.path().join(id.object_name()))
            .unwrap()
            .set_modified(time)
            .unwrap();
        ids.push(id);
    }
    let faults = Arc::new(Faults::default());
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore {
        inner: LocalStore::open(store_dir.path()).unwrap(),
        faults: Arc::clone(&faults),
    });
    let cache = Arc::new(
        Cache::open(
            &crate::cache::CacheDir::open(&cache_dir.path().join("cache")).unwrap(),
            options.cache_bytes,
        )
        .unwrap(),
    );
    let staging_dir = cache_dir.path().join("staging");
    let staging = StagingTree::at(&staging_dir).unwrap();
    let fs = CheckpointFs::new(
        store,
        Arc::clone(&cache),
        staging,
        FsConfig {
            max_archive_size: 1 << 30,
            limits: Limits {
                max_entries: 10_000,
                max_unpacked_bytes: 1 << 30,
                max_metadata_bytes: 1 << 30,
                max_index_bytes: options.memory_budget / 2,
            },
            memory_budget: options.memory_budget,
            owner_override: None,
            shared: false,
            uid: 0,
            gid: 0,
            work_dir: cache_dir.path().to_owned(),
            threads: 1,
            members: None,
            loaders: options.loaders,
            read_only: options.read_only,
            passthrough: options.passthrough,
        },
    );
    fs.refresh().unwrap();
    let fixture = Fixture {
        fs,
        faults,
        store_dir,
        cache,
        cache_entries: cache_dir.path().join("cache/checkpoints"),
        staging_dir,
        _cache_dir: cache_dir,
    };
    (fixture, ids)
}

/// The names in directory `ino`.
pub fn names(fs: &CheckpointFs, ino: u64) -> Vec<String> {
    fs.opendir(ino).unwrap();
    let mut names = Vec::new();
    fs.readdir(ino, 0, &mut |e, _| {
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        false
    })
    .unwrap();
    names
}

/// Runs `then` through [`CheckpointFs::prepare`] and waits for it, as the adapter
/// would answer a request.
pub fn prepared<T: Send + 'static>(
    fs: &Arc<CheckpointFs>,
    ino: u64,
    reading: Reading,
    then: impl FnOnce(&CheckpointFs) -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    fs.prepare(ino, reading, move |fs| tx.send(then(fs)).unwrap());
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the prepared operation never ran")
}

/// Loads the checkpoint `ino` belongs to, the way the adapter does.
pub fn wait_loaded(fs: &Arc<CheckpointFs>, ino: u64) {
    prepared(fs, ino, Reading::Opendir, |_| ());
}

/// The inode of checkpoint `id`'s own directory.
pub fn checkpoint_dir(fs: &CheckpointFs, id: &CheckpointId) -> u64 {
    fs.lookup(inode::ROOT, id.as_str().as_bytes())
        .unwrap()
        .attr
        .ino
}

/// Reads a whole file of a checkpoint or of staging.
pub fn read_all(fs: &CheckpointFs, ino: u64) -> Vec<u8> {
    let opened = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut data = Vec::new();
    loop {
        let chunk = fs.read(ino, opened.fh, data.len() as u64, 65536).unwrap();
        if chunk.is_empty() {
            break;
        }
        data.extend_from_slice(&chunk);
    }
    fs.release(opened.fh);
    data
}

pub fn status(fs: &CheckpointFs) -> String {
    String::from_utf8(fs.status_text()).unwrap()
}
