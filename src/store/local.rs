//! A local directory as a checkpoint store: `DIR/<name>` plus `DIR/<name>.meta.json`.
//!
//! Writes are atomic: the bytes go to a temporary file in `DIR`, are fsynced, and are
//! then hard-linked to their final name (`link` fails if the name exists, which is how
//! two concurrent writers of one checkpoint agree), or renamed over it when a damaged
//! object is replaced. The sidecar is written the same way *before* the object
//! appears, so a reader that sees the object also sees its metadata; a sidecar left
//! without its object by a failed link is removed. Temporary files start with `.tmp-`,
//! are ignored by listings, and those a crashed writer left behind for more than an
//! hour are removed by the next put.
//!
//! The directory may be shared with other users or tools: objects and sidecars are
//! opened with `O_NOFOLLOW | O_NONBLOCK` and must be regular files (a symlink or a FIFO
//! planted under an object's name is refused, never followed or waited on), and a
//! sidecar is read only up to [`MAX_SIDECAR`] bytes.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{
    CheckpointMetadata, MetadataDocument, ObjectInfo, ObjectMeta, ObjectReader, ObjectStore,
    Progress, PutMode, PutOutcome, StoreError,
};

pub struct LocalStore {
    dir: PathBuf,
}

const SIDECAR_SUFFIX: &str = ".meta.json";
const TEMP_PREFIX: &str = ".tmp-";
/// Sidecars are a few dozen bytes; anything larger is not one of ours.
pub const MAX_SIDECAR: u64 = 64 * 1024;
/// A temporary file older than this belongs to a put that died.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Opens `path` for reading if it is a regular file, without following a symlink or
/// blocking on a FIFO.
fn open_regular(path: &Path) -> io::Result<File> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

impl LocalStore {
    /// Opens an existing store directory.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        match fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => Ok(LocalStore {
                dir: dir.to_owned(),
            }),
            Ok(_) => Err(StoreError::io(
                "open store",
                dir,
                io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
            )),
            Err(e) => Err(StoreError::io("open store", dir, e)),
        }
    }

    /// Opens the store directory, creating it if it does not exist.
    pub fn create(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(|e| StoreError::io("create store directory", dir, e))?;
        Self::open(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn sidecar(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{SIDECAR_SUFFIX}"))
    }

    fn read_sidecar(&self, name: &str) -> (Option<String>, Option<String>) {
        let path = self.sidecar(name);
        let mut text = String::new();
        let read =
            open_regular(&path).and_then(|f| f.take(MAX_SIDECAR + 1).read_to_string(&mut text));
        match read {
            Ok(n) if n as u64 > MAX_SIDECAR => {
                tracing::warn!(path = %path.display(), "ignoring a sidecar larger than {MAX_SIDECAR} bytes");
                return (None, None);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (None, None),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable sidecar");
                return (None, None);
            }
        }
        match serde_json::from_str::<MetadataDocument>(&text) {
            Ok(doc) => {
                let size = doc.size.map(|v| match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                });
                (doc.sha256, size)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable sidecar");
                (None, None)
            }
        }
    }

    /// Writes `write` into a fresh temporary file in the store directory and fsyncs it.
    fn temp_file(
        &self,
        write: impl FnOnce(&mut File) -> io::Result<()>,
    ) -> Result<tempfile::TempPath, StoreError> {
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.dir)
            .map_err(|e| StoreError::io("create temporary file in", &self.dir, e))?;
        write(tmp.as_file_mut())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| StoreError::io("write temporary file", tmp.path(), e))?;
        Ok(tmp.into_temp_path())
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io("fsync", &self.dir, e))
    }

    /// Removes temporary files that a put which died left behind.
    fn remove_stale_temporaries(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let is_temp = entry
                .file_name()
                .as_encoded_bytes()
                .starts_with(TEMP_PREFIX.as_bytes());
            let stale = entry
                .metadata()
                .ok()
                .filter(|m| m.is_file())
                .and_then(|m| m.modified().ok())
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > STALE_TEMP);
            if is_temp && stale {
                tracing::info!(path = %entry.path().display(), "removing a temporary file left by an interrupted put");
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl ObjectStore for LocalStore {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn list(&self) -> Result<Vec<ObjectInfo>, StoreError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| StoreError::io("list", &self.dir, e))?;
        let mut objects = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &self.dir, e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with(TEMP_PREFIX) || name.ends_with(SIDECAR_SUFFIX) {
                continue;
            }
            // A file deleted between readdir and stat is simply not listed; `metadata`
            // does not follow symlinks, so a planted symlink is not listed either.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            objects.push(ObjectInfo {
                name,
                size: meta.len(),
                last_modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
            });
        }
        Ok(objects)
    }

    fn get(&self, name: &str) -> Result<ObjectReader, StoreError> {
        let path = self.path(name);
        let file = match open_regular(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound { name: name.into() });
            }
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let length = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?
            .len();
        let (sha256, size) = self.read_sidecar(name);
        Ok(ObjectReader {
            meta: ObjectMeta {
                length,
                sha256,
                size,
            },
            body: Box::new(file),
        })
    }

    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        let path = self.path(name);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io("stat", &path, e)),
        }
    }

    fn put(
        &self,
        name: &str,
        path: &Path,
        metadata: &CheckpointMetadata,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        self.remove_stale_temporaries();
        if mode == PutMode::IfAbsent && self.exists(name)? {
            return Ok(PutOutcome::AlreadyPresent);
        }
        let doc = serde_json::json!({"sha256": metadata.sha256, "size": metadata.size});
        let sidecar_tmp = self.temp_file(|f| f.write_all(doc.to_string().as_bytes()))?;
        let object_tmp = self.temp_file(|f| {
            let mut src = File::open(path)?;
            let copied = io::copy(&mut src, f)?;
            progress(copied, copied);
            Ok(())
        })?;
        let sidecar = self.sidecar(name);
        sidecar_tmp
            .persist(&sidecar)
            .map_err(|e| StoreError::io("rename into", &sidecar, e.error))?;
        let final_path = self.path(name);
        let linked = match mode {
            PutMode::IfAbsent => fs::hard_link(&object_tmp, &final_path),
            PutMode::Overwrite => fs::rename(&object_tmp, &final_path),
        };
        let outcome = match linked {
            Ok(()) => PutOutcome::Stored,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => PutOutcome::AlreadyPresent,
            Err(e) => {
                // Do not leave a sidecar that describes no object.
                if !self.exists(name).unwrap_or(true) {
                    let _ = fs::remove_file(&sidecar);
                }
                return Err(StoreError::io("link", &final_path, e));
            }
        };
        drop(object_tmp); // removes the temporary name; the object keeps the inode
        self.sync_dir()?;
        Ok(outcome)
    }
}
