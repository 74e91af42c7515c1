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
use std::time::SystemTime;

use super::inode::{self, Inode};
use super::loader::Load;
use super::{DirEntry, FileKind};
use crate::checkpoint::{self, CheckpointId, CheckpointInfo};
use crate::store::{ObjectStore, StoreError};

/// One checkpoint as the mount knows it.
pub struct Slot {
    /// Its position in the order the mount first saw checkpoints: its inode range.
    pub index: usize,
    pub info: CheckpointInfo,
    pub load: Mutex<Load>,
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

/// The `by-time/` name of a checkpoint: its time, then the first digits of its id,
/// so that name order is time order.
pub fn by_time_name(info: &CheckpointInfo) -> Vec<u8> {
    format!(
        "{}-{}",
        humantime::format_rfc3339_seconds(info.last_modified),
        info.id.short()
    )
    .into_bytes()
}

fn dir_entry(ino: u64, kind: FileKind, name: &[u8]) -> DirEntry {
    DirEntry {
        ino,
        kind,
        name: name.to_vec(),
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

    /// Lists the store and swaps in the new listing. On failure the previous
    /// checkpoints stay, and the error shows in `.status`.
    pub fn refresh(&self, store: &dyn ObjectStore) -> Result<(), StoreError> {
        let listed = checkpoint::list(store);
        let mut pinned = self.writer.lock().expect("listing writer");
        let previous = self.snapshot();
        let (infos, error, listed_at) = match &listed {
            Ok(infos) => {
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
        listed.map(drop)
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

    /// The slots of `infos`, oldest first (ties broken by digest).
    fn order(&self, infos: Vec<CheckpointInfo>) -> Vec<Arc<Slot>> {
        let mut seen = HashSet::new();
        let mut infos: Vec<_> = infos
            .into_iter()
            .filter(|info| seen.insert(info.id.clone()))
            .collect();
        infos.sort_by(|a, b| (a.last_modified, &a.id).cmp(&(b.last_modified, &b.id)));
        infos.iter().map(|info| self.slot_for(info)).collect()
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
    for slot in &order {
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
            &by_time_name(&slot.info),
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
