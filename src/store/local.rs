//! A local directory as a store: `DIR/<name>` plus `DIR/<name>.meta.json`.
//!
//! The sidecar holds the object's user metadata as one JSON object, keys in order,
//! such as `{"sha256":"0a96...","size":1234}`: a value that is a decimal number
//! (digits without a leading zero, fitting in 64 bits) is written as a JSON number,
//! any other as a JSON string, so sidecars of checkpoints stay what earlier versions
//! wrote. Reading takes strings as they are and numbers as their decimal text (other
//! JSON values as their JSON text, `null` as absent); a sidecar that is missing, not
//! a JSON object or too large counts as no metadata.
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

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::beneath::open_regular;

use super::{
    ObjectInfo, ObjectMeta, ObjectReader, ObjectStore, Progress, PutMode, PutOutcome, StoreError,
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::io(
                "open store",
                dir,
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "no such directory (`ckptfs put` creates a store)",
                ),
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

    /// Object `name` opened (a regular file only, see [`open_regular`]), with its path.
    fn open_object(&self, name: &str) -> Result<(PathBuf, File), StoreError> {
        let path = self.path(name);
        match open_regular(&path) {
            Ok(file) => Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::NotFound { name: name.into() })
            }
            Err(e) => Err(StoreError::io("open", &path, e)),
        }
    }

    fn sidecar(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{SIDECAR_SUFFIX}"))
    }

    fn read_sidecar(&self, name: &str) -> BTreeMap<String, String> {
        let path = self.sidecar(name);
        let mut text = String::new();
        let read =
            open_regular(&path).and_then(|f| f.take(MAX_SIDECAR + 1).read_to_string(&mut text));
        match read {
            Ok(n) if n as u64 > MAX_SIDECAR => {
                tracing::warn!(path = %crate::printable::Message(path.display()), "ignoring a sidecar larger than {MAX_SIDECAR} bytes");
                return BTreeMap::new();
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return BTreeMap::new(),
            Err(e) => {
                tracing::warn!(path = %crate::printable::Message(path.display()), error = %e, "ignoring unreadable sidecar");
                return BTreeMap::new();
            }
        }
        match decode_sidecar(&text) {
            Ok(metadata) => metadata,
            Err(e) => {
                tracing::warn!(path = %crate::printable::Message(path.display()), error = %e, "ignoring unreadable sidecar");
                BTreeMap::new()
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

    /// A temporary name in the store directory for `source` itself, hard-linked and
    /// fsynced, when it is on the store's filesystem (a put's archive written in a
    /// temporary directory of the same disk): the object is then written once, not
    /// copied. The link is made from the open descriptor (`/proc/self/fd`), never by
    /// the archive's path, and checked to be that inode: a name swapped meanwhile in a
    /// shared temporary directory cannot put another file in the store. `None` where
    /// a link cannot be made (another filesystem, no `/proc`).
    fn linked_temp(&self, source: &File) -> Option<tempfile::TempPath> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = self.dir.join(format!(
            "{TEMP_PREFIX}link-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        if !crate::beneath::link_opened(source, &name).ok()? {
            return None;
        }
        let Ok(linked) = tempfile::TempPath::try_from_path(&name) else {
            let _ = fs::remove_file(&name);
            return None;
        };
        source.sync_all().ok()?;
        Some(linked)
    }

    /// Opens the archive to store: a regular file of this user, not through a
    /// symlink. Everything after reads it through this descriptor.
    fn open_archive(path: &Path) -> Result<File, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let file = open_regular(path).map_err(|e| StoreError::io("open", path, e))?;
        let owner = file
            .metadata()
            .map_err(|e| StoreError::io("stat", path, e))?
            .uid();
        if owner != rustix::process::geteuid().as_raw() {
            return Err(StoreError::io(
                "open",
                path,
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("the archive belongs to uid {owner}, not to this user: replaced"),
                ),
            ));
        }
        Ok(file)
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
                tracing::info!(path = %crate::printable::Message(entry.path().display()), "removing a temporary file left by an interrupted put");
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
        let (path, file) = self.open_object(name)?;
        let length = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?
            .len();
        Ok(ObjectReader {
            meta: ObjectMeta {
                length,
                metadata: self.read_sidecar(name),
            },
            body: Box::new(file),
        })
    }

    fn refresh(&self, name: &str, metadata: &BTreeMap<String, String>) -> Result<(), StoreError> {
        let (path, object) = self.open_object(name)?;
        let doc = encode_sidecar(metadata);
        let sidecar_tmp = self.temp_file(|f| f.write_all(doc.as_bytes()))?;
        let sidecar = self.sidecar(name);
        sidecar_tmp
            .persist(&sidecar)
            .map_err(|e| StoreError::io("rename into", &sidecar, e.error))?;
        // The listing's time is the file's mtime; a read-only descriptor can set it
        // (the file is ours), and the bytes are not touched.
        let now = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        rustix::fs::futimens(
            &object,
            &rustix::fs::Timestamps {
                last_access: now,
                last_modification: now,
            },
        )
        .map_err(|e| StoreError::io("set the time of", &path, e.into()))
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        // The object first: a sidecar without its object is never listed.
        for path in [self.path(name), self.sidecar(name)] {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("delete", &path, e)),
            }
        }
        Ok(())
    }

    fn head(&self, name: &str) -> Result<ObjectMeta, StoreError> {
        let path = self.path(name);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(ObjectMeta {
                length: meta.len(),
                metadata: self.read_sidecar(name),
            }),
            Ok(_) => Err(StoreError::NotFound { name: name.into() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::NotFound { name: name.into() })
            }
            Err(e) => Err(StoreError::io("stat", &path, e)),
        }
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
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        self.remove_stale_temporaries();
        if mode == PutMode::IfAbsent && self.exists(name)? {
            return Ok(PutOutcome::AlreadyPresent);
        }
        let doc = encode_sidecar(metadata);
        let sidecar_tmp = self.temp_file(|f| f.write_all(doc.as_bytes()))?;
        let source = Self::open_archive(path)?;
        let object_tmp = match self.linked_temp(&source) {
            Some(linked) => {
                let size = source.metadata().map_or(0, |m| m.len());
                progress(size, size);
                linked
            }
            None => self.temp_file(|f| {
                let copied = io::copy(&mut &source, f)?;
                progress(copied, copied);
                Ok(())
            })?,
        };
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

/// The sidecar text for `metadata` (see the module header).
fn encode_sidecar(metadata: &BTreeMap<String, String>) -> String {
    let document: serde_json::Map<String, serde_json::Value> = metadata
        .iter()
        .map(|(key, value)| {
            let number = value
                .parse::<u64>()
                .ok()
                .filter(|n| n.to_string() == *value);
            let value = match number {
                Some(n) => serde_json::Value::from(n),
                None => serde_json::Value::from(value.as_str()),
            };
            (key.clone(), value)
        })
        .collect();
    serde_json::Value::Object(document).to_string()
}

/// The metadata a sidecar's text holds (see the module header).
fn decode_sidecar(text: &str) -> Result<BTreeMap<String, String>, serde_json::Error> {
    let document: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    Ok(document
        .into_iter()
        .filter_map(|(key, value)| match value {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some((key, s)),
            other => Some((key, other.to_string())),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecars_keep_their_format() {
        let sha = "0a9686a94759".repeat(5) + "abcd";
        let metadata = BTreeMap::from([
            ("sha256".to_owned(), sha.clone()),
            ("size".to_owned(), "1234".to_owned()),
        ]);
        let text = encode_sidecar(&metadata);
        assert_eq!(text, format!(r#"{{"sha256":"{sha}","size":1234}}"#));
        assert_eq!(decode_sidecar(&text).unwrap(), metadata);
    }

    #[test]
    fn only_plain_decimal_numbers_become_json_numbers() {
        let metadata = BTreeMap::from([
            ("a".to_owned(), "007".to_owned()),
            ("b".to_owned(), "99999999999999999999".to_owned()),
            ("c".to_owned(), "-1".to_owned()),
            ("d".to_owned(), "0".to_owned()),
            ("e".to_owned(), String::new()),
        ]);
        let text = encode_sidecar(&metadata);
        assert_eq!(
            text,
            r#"{"a":"007","b":"99999999999999999999","c":"-1","d":0,"e":""}"#
        );
        assert_eq!(decode_sidecar(&text).unwrap(), metadata);
    }

    #[test]
    fn sidecar_values_of_other_kinds_are_read_as_text() {
        let read = decode_sidecar(r#"{"sha256":null,"size":true,"n":1.5,"s":"x"}"#).unwrap();
        assert_eq!(
            read,
            BTreeMap::from([
                ("n".to_owned(), "1.5".to_owned()),
                ("s".to_owned(), "x".to_owned()),
                ("size".to_owned(), "true".to_owned()),
            ])
        );
        assert!(decode_sidecar("[1, 2]").is_err());
        assert!(decode_sidecar("not json").is_err());
    }

    /// An archive on the store's filesystem is linked into the store, not copied; one
    /// elsewhere is copied; a symlink, or a file of another user (a name swapped in a
    /// shared temporary directory), is refused.
    #[test]
    fn a_put_links_a_file_of_the_same_filesystem_and_copies_anything_else() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("store")).unwrap();
        let store = LocalStore::open(&dir.path().join("store")).unwrap();
        let archive = dir.path().join("archive");
        fs::write(&archive, b"archive bytes").unwrap();
        let put = |name: &str, path: &Path| {
            store.put(name, path, &BTreeMap::new(), PutMode::IfAbsent, &|_, _| {})
        };
        let object = |name: &str| dir.path().join("store").join(name);
        let linked = format!("{}.tar.gz", "a".repeat(64));
        assert_eq!(put(&linked, &archive).unwrap(), PutOutcome::Stored);
        assert_eq!(fs::read(object(&linked)).unwrap(), b"archive bytes");
        assert_eq!(
            fs::metadata(object(&linked)).unwrap().ino(),
            fs::metadata(&archive).unwrap().ino()
        );
        if let Ok(elsewhere) = tempfile::tempdir_in("/dev/shm") {
            let other = elsewhere.path().join("archive");
            fs::write(&other, b"other bytes").unwrap();
            let copied = format!("{}.tar.gz", "b".repeat(64));
            assert_eq!(put(&copied, &other).unwrap(), PutOutcome::Stored);
            assert_eq!(fs::read(object(&copied)).unwrap(), b"other bytes");
            assert_eq!(fs::metadata(object(&copied)).unwrap().nlink(), 1);
        }
        let symlink = dir.path().join("link");
        std::os::unix::fs::symlink(&archive, &symlink).unwrap();
        let refused = format!("{}.tar.gz", "c".repeat(64));
        assert!(put(&refused, &symlink).is_err());
        if rustix::process::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            fs::write(&theirs, b"their bytes").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let err = put(&refused, &theirs).unwrap_err();
            assert!(err.to_string().contains("uid 65534"), "{err}");
        }
        assert!(!object(&refused).exists());
        // No temporary name is left.
        let left: Vec<_> = fs::read_dir(dir.path().join("store"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.as_encoded_bytes().starts_with(TEMP_PREFIX.as_bytes()))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
