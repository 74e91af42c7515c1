//! What a store's server-side copies cost, as the captures here measured them: whether
//! the store vouches for a copied part with its SHA-256, and how fast it received
//! and sent bytes. A copy only an MD5 vouches for must be read back whole before the
//! object counts as stored (see `crate::store::Stored::copied_unchecked`), so on such
//! a store copying is worth it only when reading the object back costs less than
//! sending the bytes the copy would save ([`choose`]).
//!
//! Layout: `DIR/<encoder>/stores/<name>`, `<name>` the first 32 hex digits of the
//! SHA-256 of the store's description (`s3://bucket/prefix`); the [`STORES_KEPT`]
//! stores written last are kept. The file is three lines of text (`vouched=`,
//! `upload=`, `download=`, rates in bytes per second).
//!
//! Invariants: the costs only choose between copying and sending, both of which
//! store the same bytes and check them; a missing, damaged or planted file costs
//! time, never a wrong object. What is unknown is learned: a store not known to
//! leave copies unvouched is copied to.

use std::ffi::OsStr;
use std::io;

use sha2::{Digest, Sha256};

use super::store::{MemberCache, is_key_name, write_keeping_newest};
use crate::beneath::read_own_file_at;

/// Stores whose costs are kept: those written last.
const STORES_KEPT: usize = 16;
/// A costs file larger than this is not read.
const MOST: u64 = 4096;
/// How much a new measure counts against the ones before it.
const WEIGHT: f64 = 0.5;

/// What the captures here learned of one store.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CopyCosts {
    /// Whether the store gave a SHA-256 of each copied part; `None` until a capture
    /// copied to it.
    pub vouched: Option<bool>,
    /// Bytes per second the store received, in a put that copied nothing.
    pub upload: Option<f64>,
    /// Bytes per second read back from the store.
    pub download: Option<f64>,
}

/// Whether to have the store copy what it holds, or to send those bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Choice {
    Copy,
    /// Sending is cheaper: the estimates, in seconds, of reading the object back and
    /// of sending the bytes a copy would save.
    Send {
        read_back: f64,
        send: f64,
    },
}

/// Copying `copied` bytes of an object of `size` bytes, or sending them, on a store
/// with `costs`. Where the store vouches for copies, or is not known not to, the
/// store copies; where only an MD5 vouches, the object is read back whole after a
/// copy, and sending wins if it takes less time by the rates measured (a store whose
/// upload rate is unknown is taken to receive as fast as it sends).
pub fn choose(costs: &CopyCosts, size: u64, copied: u64) -> Choice {
    let (Some(false), Some(download)) = (costs.vouched, costs.download) else {
        return Choice::Copy;
    };
    let upload = costs.upload.unwrap_or(download);
    if download.is_nan() || upload.is_nan() || download <= 0.0 || upload <= 0.0 {
        return Choice::Copy;
    }
    let (read_back, send) = (size as f64 / download, copied as f64 / upload);
    if send < read_back {
        Choice::Send { read_back, send }
    } else {
        Choice::Copy
    }
}

impl CopyCosts {
    /// Takes in a new measure of a rate.
    pub fn measured(rate: Option<f64>, bytes: u64, seconds: f64) -> Option<f64> {
        if bytes == 0 || seconds.is_nan() || seconds <= 0.0 {
            return rate;
        }
        let now = bytes as f64 / seconds;
        Some(rate.map_or(now, |before| before * (1.0 - WEIGHT) + now * WEIGHT))
    }

    fn encode(&self) -> String {
        let rate = |r: Option<f64>| r.map_or(String::new(), |r| format!("{r:.0}"));
        let vouched = self.vouched.map_or("", |v| if v { "yes" } else { "no" });
        format!(
            "vouched={vouched}\nupload={}\ndownload={}\n",
            rate(self.upload),
            rate(self.download)
        )
    }

    /// The costs in `text`; what cannot be read is unknown.
    fn parse(text: &str) -> CopyCosts {
        let mut costs = CopyCosts::default();
        let rate = |v: &str| v.parse::<f64>().ok().filter(|r| r.is_finite() && *r > 0.0);
        for line in text.lines() {
            match line.split_once('=') {
                Some(("vouched", "yes")) => costs.vouched = Some(true),
                Some(("vouched", "no")) => costs.vouched = Some(false),
                Some(("upload", v)) => costs.upload = rate(v),
                Some(("download", v)) => costs.download = rate(v),
                _ => {}
            }
        }
        costs
    }
}

fn file_name(store: &str) -> String {
    hex::encode(&Sha256::digest(store.as_bytes())[..16])
}

impl MemberCache {
    /// What the captures here learned of the store `store` describes.
    pub fn copy_costs(&self, store: &str) -> CopyCosts {
        self.subdir("stores")
            .ok()
            .and_then(|dir| read_own_file_at(&dir, OsStr::new(&file_name(store)), MOST))
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(|text| CopyCosts::parse(&text))
            .unwrap_or_default()
    }

    /// Keeps `costs` for the store `store` describes.
    pub fn record_copy_costs(&self, store: &str, costs: &CopyCosts) -> io::Result<()> {
        write_keeping_newest(
            &self.subdir("stores")?,
            &file_name(store),
            costs.encode().as_bytes(),
            STORES_KEPT,
            is_key_name,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_made_unless_a_read_back_costs_more_than_sending() {
        let unvouched = |upload, download| CopyCosts {
            vouched: Some(false),
            upload,
            download,
        };
        // Unknown, or vouched for: copy (and learn).
        assert_eq!(choose(&CopyCosts::default(), 100, 90), Choice::Copy);
        let vouched = CopyCosts {
            vouched: Some(true),
            ..unvouched(Some(1.0), Some(1.0))
        };
        assert_eq!(choose(&vouched, 100, 90), Choice::Copy);
        // As fast both ways: reading 100 bytes back costs more than sending 90.
        assert_eq!(
            choose(&unvouched(Some(10.0), Some(10.0)), 100, 90),
            Choice::Send {
                read_back: 10.0,
                send: 9.0
            }
        );
        assert!(matches!(
            choose(&unvouched(None, Some(10.0)), 100, 90),
            Choice::Send { .. }
        ));
        // Sending ten times slower than reading (a home line): copying wins.
        assert_eq!(
            choose(&unvouched(Some(1.0), Some(10.0)), 100, 90),
            Choice::Copy
        );
        // No download measured yet: copy, and measure it.
        assert_eq!(choose(&unvouched(Some(1.0), None), 100, 90), Choice::Copy);
    }

    #[test]
    fn costs_are_kept_per_store_and_damage_reads_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let members = MemberCache::open(&dir.path().join("members"), 1 << 20).unwrap();
        let costs = CopyCosts {
            vouched: Some(false),
            upload: Some(1e6),
            download: Some(5e6),
        };
        members.record_copy_costs("s3://a/p", &costs).unwrap();
        assert_eq!(members.copy_costs("s3://a/p"), costs);
        assert_eq!(members.copy_costs("s3://b/p"), CopyCosts::default());
        assert_eq!(
            CopyCosts::parse("vouched=maybe\nupload=-3\ndownload=NaN\nnonsense"),
            CopyCosts::default()
        );
        assert_eq!(CopyCosts::measured(Some(10.0), 40, 2.0), Some(15.0));
        assert_eq!(CopyCosts::measured(None, 40, 2.0), Some(20.0));
        assert_eq!(CopyCosts::measured(Some(10.0), 0, 2.0), Some(10.0));
    }
}
