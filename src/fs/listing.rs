//! The checkpoints the mount knows: one [`Slot`] per checkpoint ever seen (its place
//! in the inode space and its load state), and an immutable [`Listing`] snapshot of
//! the store's current contents with the views built from it (the root, `by-time/`).
//!
//! A refresh lists the store without holding any lock, builds a new snapshot, and
//! swaps it in; readers clone the current `Arc` and never wait for a refresh. Slots
//! are never removed or reused within a mount, so inode numbers stay valid: a
//! checkpoint deleted from the store keeps its slot (an open file of it still reads).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use super::inode::{self, Inode};
use super::subtree::{DirEntry, FileKind};
use crate::cache::{Provenance, VerifiedCheckpoint};
use crate::checkpoint::{self, CaptureTimes, CheckpointId, CheckpointInfo, Exact};
use crate::store::{ObjectStore, StoreError};

/// One checkpoint as the mount knows it.
pub struct Slot {
    /// Its position in the order the mount first saw checkpoints: its inode range.
    pub index: usize,
    pub info: CheckpointInfo,
    pub load: Mutex<Load>,
}

/// An operation waiting for a checkpoint's load to end.
pub type Waiter = Box<dyn FnOnce() + Send>;

/// Where a checkpoint stands in the mount (the loader moves it along).
pub enum Load {
    Unloaded,
    /// Queued or running, with the continuations waiting for it.
    Loading(Vec<Waiter>),
    Loaded(Arc<VerifiedCheckpoint>),
    Failed {
        reason: String,
        at: Instant,
    },
}

impl Load {
    /// What `.status` says of it.
    pub fn describe(&self) -> String {
        match self {
            Load::Unloaded => "listed".to_owned(),
            Load::Loading(_) => "verifying".to_owned(),
            Load::Loaded(checkpoint) => {
                let time = |t| humantime::format_rfc3339_seconds(t);
                match checkpoint.provenance {
                    Provenance::Store { verified_at } => {
                        format!("verified {} from the store", time(verified_at))
                    }
                    Provenance::Sealed { sealed_at } => {
                        format!("verified {} when sealed by this mount", time(sealed_at))
                    }
                    Provenance::Cache {
                        verified_at,
                        checked_at,
                    } => format!(
                        "verified {} from the store, served from the cache (re-checked {})",
                        time(verified_at),
                        time(checked_at)
                    ),
                }
            }
            Load::Failed { reason, .. } => format!("FAILED: {reason}"),
        }
    }
}

/// The store's contents at one listing, with the views derived from it.
pub struct Listing {
    /// Listed checkpoints, oldest first.
    pub order: Vec<Arc<Slot>>,
    pub root: Vec<DirEntry>,
    pub by_time: Vec<DirEntry>,
    /// Name to inode for `root` and `by_time`: lookups stay O(1) with thousands.
    root_names: HashMap<Vec<u8>, u64>,
    by_time_names: HashMap<Vec<u8>, u64>,
    pub listed_at: Option<SystemTime>,
    pub error: Option<String>,
    /// When the set of listed checkpoints last changed: the root's and `by-time/`'s
    /// mtime, by which the kernel knows to drop its cached listings of them.
    pub changed_at: SystemTime,
}

impl Listing {
    pub fn root_child(&self, name: &[u8]) -> Option<u64> {
        self.root_names.get(name).copied()
    }

    pub fn by_time_child(&self, name: &[u8]) -> Option<u64> {
        self.by_time_names.get(name).copied()
    }

    pub fn newest(&self) -> Option<&Arc<Slot>> {
        self.order.last()
    }
}

/// The `by-time/` names of checkpoints listed in order: the store's time to the
/// second, then the first digits of the id, so that name order is time order.
/// Checkpoints that share their second are numbered in their order after it
/// (`…:05Z-1-<id>`, `…:05Z-2-<id>`, zero-padded so that names sort as numbers): their
/// digits alone would sort them at random.
pub fn by_time_names<'a>(infos: impl IntoIterator<Item = &'a CheckpointInfo>) -> Vec<Vec<u8>> {
    let infos: Vec<&CheckpointInfo> = infos.into_iter().collect();
    let second =
        |info: &CheckpointInfo| humantime::format_rfc3339_seconds(info.last_modified).to_string();
    let mut names = Vec::with_capacity(infos.len());
    for group in infos.chunk_by(|a, b| second(a) == second(b)) {
        let width = group.len().to_string().len();
        for (rank, info) in group.iter().enumerate() {
            let name = if group.len() == 1 {
                format!("{}-{}", second(info), info.id.short())
            } else {
                format!("{}-{:0width$}-{}", second(info), rank + 1, info.id.short())
            };
            names.push(name.into_bytes());
        }
    }
    names
}

fn dir_entry(ino: u64, kind: FileKind, name: &[u8]) -> DirEntry {
    DirEntry {
        ino,
        kind,
        name: name.to_vec(),
        found: None,
    }
}

#[derive(Default)]
struct Slots {
    all: Vec<Arc<Slot>>,
    by_id: HashMap<CheckpointId, usize>,
}

pub struct Catalog {
    /// A read-only mount shows no `staging/` and no `commit/`.
    read_only: bool,
    slots: RwLock<Slots>,
    current: RwLock<Arc<Listing>>,
    /// Serialises the writers of `current` (refresh, add); readers never take it.
    writer: Mutex<Pinned>,
    /// What refreshes learnt of checkpoints' capture times (see `checkpoint::list_ordered`).
    capture_times: Mutex<CaptureTimes>,
}

/// Checkpoints this mount stored, shown before a listing of the store includes them.
#[derive(Default)]
struct Pinned(HashSet<CheckpointId>);

impl Catalog {
    pub fn new(mounted_at: SystemTime, read_only: bool) -> Self {
        let empty = build(read_only, Vec::new(), None, None, mounted_at);
        Catalog {
            read_only,
            slots: RwLock::new(Slots::default()),
            current: RwLock::new(Arc::new(empty)),
            writer: Mutex::new(Pinned::default()),
            capture_times: Mutex::new(CaptureTimes::default()),
        }
    }

    /// The current listing.
    pub fn snapshot(&self) -> Arc<Listing> {
        Arc::clone(&self.current.read().expect("listing lock"))
    }

    pub fn slot(&self, index: usize) -> Option<Arc<Slot>> {
        self.slots
            .read()
            .expect("slots lock")
            .all
            .get(index)
            .cloned()
    }

    pub fn slot_of(&self, id: &CheckpointId) -> Option<Arc<Slot>> {
        let slots = self.slots.read().expect("slots lock");
        slots.by_id.get(id).map(|&i| Arc::clone(&slots.all[i]))
    }

    /// Every slot, for `.status` and eviction.
    pub fn all_slots(&self) -> Vec<Arc<Slot>> {
        self.slots.read().expect("slots lock").all.clone()
    }

    fn slot_for(&self, info: &CheckpointInfo) -> Arc<Slot> {
        if let Some(slot) = self.slot_of(&info.id) {
            return slot;
        }
        let mut slots = self.slots.write().expect("slots lock");
        if let Some(&i) = slots.by_id.get(&info.id) {
            return Arc::clone(&slots.all[i]);
        }
        let slot = Arc::new(Slot {
            index: slots.all.len(),
            info: info.clone(),
            load: Mutex::new(Load::Unloaded),
        });
        slots.by_id.insert(info.id.clone(), slot.index);
        slots.all.push(Arc::clone(&slot));
        slot
    }

    /// Lists the store and swaps in the new listing, its order exact as far as
    /// `exact` asks; returns whether the whole order is exact. On failure the previous
    /// checkpoints stay, and the error shows in `.status`.
    pub fn refresh(&self, store: &dyn ObjectStore, exact: Exact) -> Result<bool, StoreError> {
        let listed = {
            let mut known = self.capture_times.lock().expect("capture times lock");
            checkpoint::list_ordered(store, &mut known, exact)
        };
        let mut pinned = self.writer.lock().expect("listing writer");
        let previous = self.snapshot();
        let (infos, error, listed_at) = match &listed {
            Ok((infos, _)) => {
                // Once the store lists what this mount stored, it needs no pin.
                for info in infos {
                    pinned.0.remove(&info.id);
                }
                let mut infos = infos.clone();
                for slot in &previous.order {
                    if pinned.0.contains(&slot.info.id) {
                        infos.push(slot.info.clone());
                    }
                }
                (infos, None, Some(SystemTime::now()))
            }
            Err(e) => (
                previous.order.iter().map(|s| s.info.clone()).collect(),
                Some(e.to_string()),
                previous.listed_at,
            ),
        };
        let order = self.order(infos);
        let changed = order.len() != previous.order.len()
            || order
                .iter()
                .zip(&previous.order)
                .any(|(a, b)| a.index != b.index);
        let changed_at = if changed {
            SystemTime::now()
        } else {
            previous.changed_at
        };
        let listing = build(self.read_only, order, listed_at, error, changed_at);
        *self.current.write().expect("listing lock") = Arc::new(listing);
        listed.map(|(_, exact)| exact)
    }

    /// Shows a checkpoint this mount just stored, at once; returns its slot.
    pub fn add(&self, info: CheckpointInfo) -> Arc<Slot> {
        let mut pinned = self.writer.lock().expect("listing writer");
        let slot = self.slot_for(&info);
        let previous = self.snapshot();
        if !previous.order.iter().any(|s| s.index == slot.index) {
            pinned.0.insert(info.id.clone());
            let mut infos: Vec<_> = previous.order.iter().map(|s| s.info.clone()).collect();
            infos.push(info);
            let order = self.order(infos);
            let listing = build(
                self.read_only,
                order,
                previous.listed_at,
                previous.error.clone(),
                SystemTime::now(),
            );
            *self.current.write().expect("listing lock") = Arc::new(listing);
        }
        slot
    }

    /// The slots of `infos`, in the order given (the store's, then what this mount
    /// stored since: see `checkpoint::list_ordered`), each once.
    fn order(&self, infos: Vec<CheckpointInfo>) -> Vec<Arc<Slot>> {
        let mut seen = HashSet::new();
        infos
            .iter()
            .filter(|info| seen.insert(info.id.clone()))
            .map(|info| self.slot_for(info))
            .collect()
    }
}

fn build(
    read_only: bool,
    order: Vec<Arc<Slot>>,
    listed_at: Option<SystemTime>,
    error: Option<String>,
    changed_at: SystemTime,
) -> Listing {
    let mut root = vec![
        dir_entry(inode::ROOT, FileKind::Directory, b"."),
        dir_entry(inode::ROOT, FileKind::Directory, b".."),
        dir_entry(inode::BY_TIME, FileKind::Directory, b"by-time"),
        dir_entry(inode::STATUS, FileKind::File, b".status"),
    ];
    if !read_only {
        root.push(dir_entry(inode::STAGING, FileKind::Directory, b"staging"));
        root.push(dir_entry(inode::COMMIT, FileKind::Directory, b"commit"));
    }
    if !order.is_empty() {
        root.push(dir_entry(inode::LATEST, FileKind::Symlink, b"latest"));
    }
    let mut by_time = vec![
        dir_entry(inode::BY_TIME, FileKind::Directory, b"."),
        dir_entry(inode::ROOT, FileKind::Directory, b".."),
    ];
    let names = by_time_names(order.iter().map(|slot| &slot.info));
    for (slot, name) in order.iter().zip(names) {
        root.push(dir_entry(
            Inode::Node {
                slot: slot.index,
                node: 0,
            }
            .encode(),
            FileKind::Directory,
            slot.info.id.as_str().as_bytes(),
        ));
        by_time.push(dir_entry(
            Inode::ByTimeLink { slot: slot.index }.encode(),
            FileKind::Symlink,
            &name,
        ));
    }
    let names = |entries: &[DirEntry]| -> HashMap<Vec<u8>, u64> {
        entries
            .iter()
            .skip(2)
            .map(|e| (e.name.clone(), e.ino))
            .collect()
    };
    Listing {
        root_names: names(&root),
        by_time_names: names(&by_time),
        order,
        root,
        by_time,
        listed_at,
        error,
        changed_at,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn checkpoints_sharing_a_second_are_numbered_so_that_names_sort_in_their_order() {
        let info = |n: u8, secs: u64| CheckpointInfo {
            id: CheckpointId::parse(&format!("{:02x}", 255 - n).repeat(32)).unwrap(),
            size: 1,
            last_modified: UNIX_EPOCH + Duration::from_millis(secs * 1000 + n as u64),
        };
        let mut infos = vec![info(0, 5)];
        infos.extend((1..=11).map(|n| info(n, 7)));
        infos.push(info(12, 9));
        let names: Vec<String> = by_time_names(&infos)
            .into_iter()
            .map(|n| String::from_utf8(n).unwrap())
            .collect();
        assert_eq!(
            names[0],
            format!("1970-01-01T00:00:05Z-{}", infos[0].id.short())
        );
        assert_eq!(
            names[1],
            format!("1970-01-01T00:00:07Z-01-{}", infos[1].id.short())
        );
        assert_eq!(
            names[11],
            format!("1970-01-01T00:00:07Z-11-{}", infos[11].id.short())
        );
        assert_eq!(
            names[12],
            format!("1970-01-01T00:00:09Z-{}", infos[12].id.short())
        );
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "name order is the listing's order");
    }
}
