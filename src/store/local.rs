//! A local directory as a checkpoint store: `DIR/<name>` plus `DIR/<name>.meta.json`.
//!
//! Writes are atomic and never replace an object: the bytes go to a temporary file in
//! `DIR`, are fsynced, and are then hard-linked to their final name (`link` fails if
//! the name exists, which is how two concurrent writers of one checkpoint agree). The
//! sidecar is written the same way *before* the object appears, so a reader that sees
//! the object also sees its metadata. Temporary files start with `.tmp-` and are
//! ignored by listings.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{
    CheckpointMetadata, MetadataDocument, ObjectInfo, ObjectMeta, ObjectReader, ObjectStore,
    Progress, PutOutcome, StoreError,
};

pub struct LocalStore {
    dir: PathBuf,
}

const SIDECAR_SUFFIX: &str = ".meta.json";

impl LocalStore {
    /// Opens (creating if needed) the store directory.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(|e| StoreError::io("create store directory", dir, e))?;
        Ok(LocalStore {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn sidecar(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{SIDECAR_SUFFIX}"))
    }

    fn read_sidecar(&self, name: &str) -> (Option<String>, Option<String>) {
        let path = self.sidecar(name);
        let Ok(text) = fs::read_to_string(&path) else {
            return (None, None);
        };
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
            .prefix(".tmp-")
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
            if name.starts_with(".tmp-") || name.ends_with(SIDECAR_SUFFIX) {
                continue;
            }
            // A file deleted between readdir and stat is simply not listed.
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
        let file = match File::open(&path) {
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
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        if self.exists(name)? {
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
        let outcome = match fs::hard_link(&object_tmp, &final_path) {
            Ok(()) => PutOutcome::Stored,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => PutOutcome::AlreadyPresent,
            Err(e) => return Err(StoreError::io("link", &final_path, e)),
        };
        drop(object_tmp); // removes the temporary name; the object keeps the inode
        self.sync_dir()?;
        Ok(outcome)
    }
}
