use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::store::local::LocalStore;
use crate::store::{ObjectStore, Progress, PutMode, PutOutcome};

/// A listing and its metadata, counting `head`s: only the order of `list` is
/// tested with it.
struct Listed {
    objects: Vec<(ObjectInfo, BTreeMap<String, String>)>,
    heads: std::sync::atomic::AtomicUsize,
}

impl ObjectStore for Listed {
    fn describe(&self) -> String {
        "listed".into()
    }
    fn list(&self) -> Result<Vec<ObjectInfo>, StoreError> {
        Ok(self.objects.iter().map(|(info, _)| info.clone()).collect())
    }
    fn get(&self, _: &str) -> Result<crate::store::ObjectReader, StoreError> {
        unreachable!("listing reads no object")
    }
    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.objects.iter().any(|(info, _)| info.name == name))
    }
    fn delete(&self, _: &str) -> Result<(), StoreError> {
        unreachable!("listing deletes nothing")
    }
    fn refresh(&self, _: &str, _: &BTreeMap<String, String>) -> Result<(), StoreError> {
        unreachable!("listing changes nothing")
    }
    fn head(&self, name: &str) -> Result<crate::store::ObjectMeta, StoreError> {
        self.heads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (info, metadata) = self
            .objects
            .iter()
            .find(|(info, _)| info.name == name)
            .ok_or_else(|| StoreError::NotFound { name: name.into() })?;
        Ok(crate::store::ObjectMeta {
            length: info.size,
            metadata: metadata.clone(),
        })
    }
    fn put(
        &self,
        _: &str,
        _: &Path,
        _: &BTreeMap<String, String>,
        _: PutMode,
        _: Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        unreachable!("listing stores nothing")
    }
}

#[test]
fn checkpoints_of_one_second_are_ordered_by_capture_time_and_only_they_are_asked() {
    let at = |secs: u64, millis: u64| {
        UNIX_EPOCH + std::time::Duration::from_millis(secs * 1000 + millis)
    };
    let id = |n: u8| CheckpointId(format!("{n:02x}").repeat(32));
    // (id, store time, captured): ids in reverse of capture order within the
    // tied second, so that digest order is the wrong answer.
    let objects: Vec<(u8, SystemTime, Option<&str>)> = vec![
        (9, at(100, 0), Some("1970-01-01T00:01:39.5Z")),
        (8, at(200, 0), Some("1970-01-01T00:03:20.100Z")),
        (7, at(200, 0), Some("1970-01-01T00:03:20.050Z")),
        (6, at(200, 0), None),
        (5, at(200, 0), Some("not a time")),
        (4, at(200, 0), Some("1970-01-01T00:03:19.999Z")),
        (3, at(300, 0), Some("1970-01-01T00:00:00Z")),
    ];
    let store = Listed {
        objects: objects
            .iter()
            .map(|&(n, last_modified, captured)| {
                let metadata = captured
                    .map(|c| BTreeMap::from([(CAPTURED_KEY.to_owned(), c.to_owned())]))
                    .unwrap_or_default();
                let info = ObjectInfo {
                    name: id(n).object_name(),
                    size: 1,
                    last_modified,
                };
                (info, metadata)
            })
            .collect(),
        heads: Default::default(),
    };
    let mut known = CaptureTimes::default();
    let mut list = |exact| {
        let (listed, all_exact) = list_ordered(&store, &mut known, exact).unwrap();
        let order: Vec<CheckpointId> = listed.into_iter().map(|c| c.id).collect();
        let heads = store.heads.load(std::sync::atomic::Ordering::SeqCst);
        (order, all_exact, heads)
    };
    // Only the newest is asked for: alone in its second, it needs no request,
    // and the second before stays in digest order.
    let by_digest = vec![id(9), id(4), id(5), id(6), id(7), id(8), id(3)];
    assert_eq!(list(Exact::Newest(1)), (by_digest, false, 0));
    // The newest two: their second is asked for, all of it. Without a capture
    // time (none, or unreadable) first, by digest; then by the claimed time, even
    // one before the second; alone in its second, a checkpoint keeps its place
    // whatever it claims.
    let want = vec![id(9), id(5), id(6), id(4), id(7), id(8), id(3)];
    // Two requests: the two newest of that second are asked for.
    let partly = vec![id(9), id(4), id(5), id(6), id(7), id(8), id(3)];
    assert_eq!(list(Exact::Requests(2)), (partly, false, 2));
    assert_eq!(list(Exact::Newest(2)), (want.clone(), true, 5));
    assert_eq!(
        list(Exact::All),
        (want, true, 5),
        "capture times are asked once"
    );
}

/// Stores `bytes` under `id` with `metadata`, as another writer could have.
fn planted(metadata: &[(&str, &str)]) -> (tempfile::TempDir, LocalStore, CheckpointId) {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let bytes = b"some bytes";
    let id = CheckpointId::parse(&hex::encode(Sha256::digest(bytes))).unwrap();
    let file = dir.path().join("source");
    std::fs::write(&file, bytes).unwrap();
    let metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    store
        .put(
            &id.object_name(),
            &file,
            &metadata,
            PutMode::IfAbsent,
            &|_, _| {},
        )
        .unwrap();
    (dir, store, id)
}

fn failure(store: &LocalStore, id: &CheckpointId) -> Option<VerifyFailure> {
    match verify(store, id) {
        Ok(()) => None,
        Err(CheckpointError::Verify { failure, .. }) => Some(failure),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn metadata_round_trips() {
    let (_dir, store, id) = planted(&[]);
    let metadata = encode_metadata(&id, 10, None);
    assert_eq!(metadata["sha256"], id.as_str());
    assert_eq!(metadata["size"], "10");
    let claimed = decode_metadata(&metadata);
    assert_eq!(claimed.sha256, Some(id.as_str()));
    assert_eq!(claimed.size, Some("10"));
    assert_eq!(failure(&store, &id), None, "no metadata: checked by bytes");
}

#[test]
fn metadata_that_disagrees_fails_before_the_download() {
    let (_dir, store, id) = planted(&[("size", "10")]);
    assert_eq!(failure(&store, &id), None);
    let (_dir, store, id) = planted(&[("size", "ten")]);
    assert_eq!(
        failure(&store, &id),
        Some(VerifyFailure::SizeMismatch(
            "the size metadata says ten bytes, the object has 10".into()
        ))
    );
    let (_dir, store, id) = planted(&[("sha256", &"0".repeat(64))]);
    assert!(matches!(
        failure(&store, &id),
        Some(VerifyFailure::ChecksumMismatch(_))
    ));
}
