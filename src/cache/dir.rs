//! The cache directory (`--cache-dir`) and every name in it: this type alone decides
//! them, and everything that uses one is given a [`CacheDir`].
//!
//! ```text
//! DIR/lock           flock: one daemon (or command) per cache directory
//! DIR/checkpoints/   verified checkpoints, one entry each (see `super::entry`)
//! DIR/blobs/         files of their own shared by entries (see `super::blobs`)
//! DIR/members/       gzip members of captures and the layouts of recent objects
//!                    (see `crate::members::store`; shared by a mount and `put`)
//! DIR/staging/       a mount's `staging/`, unless `--staging-dir` names another
//! DIR/tmp/           a mount's archives being sealed, and its upload journal
//! DIR/ckptfs.log     the log of a daemon started without `--foreground`
//! ```
//!
//! Invariant: a `CacheDir` is resolved once, out of other users' reach
//! ([`crate::trusted`]), and every name below goes by that resolved path, so that no
//! later symlink swap in the configured path can redirect a part of the cache.

use std::path::{Path, PathBuf};

use crate::trusted::{TrustError, trusted_dir};

#[derive(Debug, Clone)]
pub struct CacheDir {
    root: PathBuf,
}

impl CacheDir {
    /// Where the cache directory is without `--cache-dir`: `$XDG_CACHE_HOME/ckptfs`,
    /// `$HOME/.cache/ckptfs`, and for root without either `/var/cache/ckptfs`. Never
    /// a shared temporary directory, where another user could have made it first.
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| Path::new(&h).join(".cache"))
            });
        match base {
            Some(base) => Some(base.join("ckptfs")),
            None if rustix::process::geteuid().is_root() => {
                Some(PathBuf::from("/var/cache/ckptfs"))
            }
            None => None,
        }
    }

    /// Resolves `path` and makes it if needed (see [`crate::trusted`]).
    pub fn open(path: &Path) -> Result<CacheDir, TrustError> {
        Ok(CacheDir {
            root: trusted_dir(path)?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    pub fn members(&self) -> PathBuf {
        self.root.join("members")
    }

    pub fn staging(&self) -> PathBuf {
        self.root.join("staging")
    }

    pub fn work(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("ckptfs.log")
    }
}
