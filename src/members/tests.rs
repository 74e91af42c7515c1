//! The load side's tests: records made by loads, members rebuilt from them, and every
//! way a record can be wrong.

use std::io::Write as _;
use std::os::fd::AsFd;

use flate2::{Compression, GzBuilder};

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_128;

use super::reader::*;
use super::recorder::*;
use super::records::*;
use super::*;
use crate::archive::Limits;
use crate::archive::gz::MemberSpan;
use crate::archive::index::{FileLocation, Index, NodeKind};
use crate::archive::writer::{WriterOptions, WrittenArchive, write_archive};
use crate::cache::entry::files_of;
use crate::cache::{Cache, VerifiedCheckpoint};
use crate::checkpoint::{self, CheckpointId};
use crate::store::local::LocalStore;

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// Stores `bytes` as a checkpoint; returns its id.
fn store_bytes(store: &LocalStore, bytes: &[u8]) -> CheckpointId {
    let sha256 = hex::encode(Sha256::digest(bytes));
    let file = tempfile::NamedTempFile::new().unwrap();
    fs::write(file.path(), bytes).unwrap();
    let written = WrittenArchive {
        sha256: sha256.clone(),
        size: bytes.len() as u64,
        members: Vec::new(),
    };
    checkpoint::store_archive(store, file.path(), &written, None, None, &|_, _| {}).unwrap();
    CheckpointId::parse(&sha256).unwrap()
}

/// A workspace: small text files, large noisy ones, directories; `turn` changes
/// one file and adds one.
fn workspace(dir: &Path, turn: u64) -> Vec<u8> {
    for i in 0..120u64 {
        let sub = dir.join(format!("d{}", i % 7));
        fs::create_dir_all(&sub).unwrap();
        let data = if i % 10 == 0 {
            noise(150_000 + i as usize * 997, i)
        } else {
            format!("line {i}\n")
                .repeat(200 + i as usize * 13)
                .into_bytes()
        };
        fs::write(sub.join(format!("f{i}")), data).unwrap();
    }
    if turn > 0 {
        fs::write(dir.join("d3/f45"), format!("edited in turn {turn}\n")).unwrap();
        fs::write(dir.join(format!("new{turn}")), noise(20_000, turn)).unwrap();
    }
    // Fixed times: turns written in different seconds must differ only where
    // they were changed.
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    for sub in fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        if sub.is_dir() {
            for file in fs::read_dir(&sub).unwrap().map(|e| e.unwrap().path()) {
                File::options()
                    .write(true)
                    .open(file)
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
            }
        }
        File::open(&sub).unwrap().set_modified(when).unwrap();
    }
    archive_of(dir)
}

/// The archive `put` makes of `dir`, without a member cache.
fn archive_of(dir: &Path) -> Vec<u8> {
    let root = File::open(dir).unwrap();
    let options = WriterOptions {
        max_size: u64::MAX,
        max_unpacked: u64::MAX,
        threads: 2,
        members: None,
        tree: None,
    };
    let mut out = Vec::new();
    write_archive(root.as_fd(), &mut out, &options).unwrap();
    out
}

/// `n` turns of [`workspace`], stored; their ids.
fn stored_turns(work: &Path, store: &LocalStore, n: u64) -> Vec<CheckpointId> {
    (0..n)
        .map(|turn| store_bytes(store, &workspace(&work.join(format!("tree{turn}")), turn)))
        .collect()
}

fn load(cache: &Cache, store: &LocalStore, id: &CheckpointId) -> Arc<VerifiedCheckpoint> {
    cache.load(store, id, u64::MAX, Limits::DEFAULT, 0).unwrap()
}

/// Every file's bytes, by node.
fn contents(checkpoint: &VerifiedCheckpoint) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for (node, entry) in checkpoint.index.nodes.iter().enumerate() {
        if let NodeKind::File { size, location, .. } = entry.kind {
            all.push(match location {
                FileLocation::Packed { offset } => {
                    checkpoint.read_packed(offset, 0, size as usize).unwrap()
                }
                FileLocation::Own => {
                    let mut data = Vec::new();
                    let mut file = checkpoint.open_own(node as u32).unwrap();
                    file.read_to_end(&mut data).unwrap();
                    data
                }
            });
        }
    }
    all
}

/// Loads `id` into a cache of its own, inflating everything: what a load must give.
fn fresh(store: &LocalStore, id: &CheckpointId) -> (Index, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&crate::cache::CacheDir::open(dir.path()).unwrap(), u64::MAX).unwrap();
    let checkpoint = load(&cache, store, id);
    assert_eq!(cache.stats().reused_members, 0);
    (checkpoint.index.clone(), contents(&checkpoint))
}

/// The gzip members of `bytes`, as a reader splitting at member ends sees them,
/// and the tar bytes of each.
fn members_of(bytes: &[u8]) -> (Vec<MemberSpan>, Vec<Vec<u8>>) {
    let (mut spans, mut tars) = (Vec::new(), Vec::new());
    let mut rest = bytes;
    while !rest.is_empty() {
        let mut decoder = flate2::bufread::GzDecoder::new(rest);
        let mut tar = Vec::new();
        decoder.read_to_end(&mut tar).unwrap();
        let left = decoder.into_inner().len();
        let member = &rest[..rest.len() - left];
        spans.push(MemberSpan {
            digest: Sha256::digest(member).into(),
            length: member.len() as u64,
        });
        tars.push(tar);
        rest = &rest[rest.len() - left..];
    }
    (spans, tars)
}

/// A member cache in `work/cache/members` where `cache` records the layouts of
/// its downloads.
fn recording_layouts(cache: &Cache, work: &Path) -> Arc<crate::members::store::MemberCache> {
    let dir = work.join("cache/members");
    let members = Arc::new(crate::members::store::MemberCache::open(&dir, 1 << 30).unwrap());
    cache.record_layouts_in(Arc::clone(&members));
    members
}

/// What a load recorded rebuilds, in order, to the object's own members' tar
/// bytes (what priming the member cache compresses), whether the load inflated
/// them (turn 0) or rebuilt them (turn 1); only members too short to be worth a
/// record are missing.
#[test]
fn recorded_members_rebuild_to_the_members_of_the_object() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let turns = stored_turns(work.path(), &store, 2);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    for id in &turns {
        let checkpoint = load(&cache, &store, id);
        let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
        let (spans, tars) = members_of(&bytes);
        let mut given = Vec::new();
        let weak = Arc::downgrade(&checkpoint);
        let count = crate::cache::entry::member_tars(&weak, |tar| {
            given.push(tar.to_vec());
            true
        })
        .unwrap();
        assert_eq!(count as usize, given.len());
        let short = spans.iter().filter(|s| s.length < PREFIX as u64).count();
        assert_eq!(given.len() + short, tars.len(), "{id}");
        let mut rest = tars.iter();
        for tar in &given {
            assert!(
                rest.any(|t| t == tar),
                "{id}: a member out of order or wrong"
            );
        }
        let mut seen = 0;
        crate::cache::entry::member_tars(&weak, |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
        assert_eq!(seen, 3, "it stops when told");
        // Once the checkpoint is gone (evicted), nothing more is rebuilt.
        drop(checkpoint);
        let after = crate::cache::entry::member_tars(&weak, |_| true).unwrap();
        assert_eq!(after, 0);
    }
    assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
}

/// A load, which inflates on a thread of its own ahead of the indexer, records
/// exactly what one thread reading member by member records, in every run
/// whatever the timing: contents as ranges of the entry, never as copies made
/// because the indexer's position ran past a member not yet handed over.
#[test]
fn a_load_records_what_one_thread_records() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let id = &stored_turns(work.path(), &store, 1)[0];
    let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
    let reference = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("reference")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    let mut pending = reference.begin().unwrap();
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    pending.record_members(Arc::clone(&recorder));
    let members = MemberReader::new(&bytes[..], Known::default(), Arc::clone(&recorder));
    let mut reader = Indexing::new(members, recorder);
    let index =
        crate::archive::index::build(&mut reader, &mut pending, Limits::DEFAULT, 0).unwrap();
    let tail = crate::archive::gz::CHUNK_SIZE as u64 + 1;
    io::copy(&mut (&mut reader).take(tail), &mut io::sink()).unwrap();
    let verified_at = std::time::SystemTime::now();
    let provenance = crate::cache::Provenance::Store { verified_at };
    reference.finish(pending, id, index, provenance).unwrap();
    let want = fs::read(reference.entry_dir(id).join("members")).unwrap();
    let (records, _) = read_records(&reference.entry_dir(id).join("members")).unwrap();
    assert!(records.len() > 5, "{} records", records.len());
    for run in 0..16 {
        let cache = Cache::open(
            &crate::cache::CacheDir::open(&work.path().join(format!("cache-{run}"))).unwrap(),
            u64::MAX,
        )
        .unwrap();
        let _checkpoint = load(&cache, &store, id);
        let got = fs::read(cache.entry_dir(id).join("members")).unwrap();
        assert!(
            got == want,
            "run {run}: {} bytes of records against {}",
            got.len(),
            want.len()
        );
    }
}

/// The race of `a_load_records_what_one_thread_records`, in order: the indexer
/// reads past the end of a member the reader has not handed over yet (it is
/// still at the member's trailer), then the member comes. Its contents are still
/// known.
#[test]
fn contents_of_the_member_being_inflated_are_kept() {
    let mut recorder = Recorder {
        inflating_from: Some(1000),
        ..Recorder::default()
    };
    recorder.contents_at(7, 1512, 2000);
    recorder.finish_through(4096);
    recorder.member(Unfinished {
        prefix: 0,
        compressed: [0; 32],
        compressed_len: 300,
        start: 1000,
        tar: Arc::new(vec![1; 3000]),
    });
    recorder.inflating_from = None;
    recorder.finish_through(u64::MAX);
    let [record] = &recorder.done[..] else {
        panic!("{} records", recorder.done.len());
    };
    assert!(
        record.pieces.iter().any(|p| matches!(
            p,
            Piece::Contents {
                node: 7,
                len: 2000,
                ..
            }
        )),
        "the file's contents were recorded as raw bytes"
    );
}

/// One gzip member of `payload` in a stored block, padded with empty stored
/// blocks to `PREFIX` compressed bytes and more, so that it would be recorded.
fn padded_member(payload: &[u8]) -> Vec<u8> {
    let mut member = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    for _ in 0..60 {
        member.extend_from_slice(&[0, 0, 0, 0xff, 0xff]);
    }
    let len = payload.len() as u16;
    member.push(1);
    member.extend_from_slice(&len.to_le_bytes());
    member.extend_from_slice(&(!len).to_le_bytes());
    member.extend_from_slice(payload);
    member.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    member.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    member
}

/// However many members a reader running ahead gives before the indexer reads
/// past them, those waiting stay bounded: members with no tar bytes do not wait
/// at all, and past [`MAX_UNFINISHED`] the rest are not recorded.
#[test]
fn members_waiting_for_the_indexer_stay_bounded() {
    for (payload, count, waiting) in [
        (&b""[..], 10_000, 0),
        (&b"x"[..], 2 * MAX_UNFINISHED, MAX_UNFINISHED),
    ] {
        let member = padded_member(payload);
        assert!(member.len() >= PREFIX);
        let stream = member.repeat(count);
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let mut reader = MemberReader::new(&stream[..], Known::default(), Arc::clone(&recorder));
        let mut tar = Vec::new();
        reader.read_to_end(&mut tar).unwrap();
        assert_eq!(tar.len(), payload.len() * count);
        assert_eq!(recorder.lock().unwrap().unfinished(), waiting);
    }
}

/// A verified download's layout is recorded, whether its members were inflated
/// (turn 0) or rebuilt from the turn before (turn 1): a capture of either tree
/// then finds every member of its archive in that object, at its own offset.
#[test]
fn downloads_record_their_layout_for_the_store_to_copy_from() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let turns = stored_turns(work.path(), &store, 2);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    let members = recording_layouts(&cache, work.path());
    for (turn, id) in turns.iter().enumerate() {
        load(&cache, &store, id);
        let bytes = fs::read(work.path().join("store").join(id.object_name())).unwrap();
        let (spans, _) = members_of(&bytes);
        assert!(spans.len() > 5, "{} members", spans.len());
        // Every byte is found, and found right, in this object or the one before.
        let runs = members.reuse(&spans);
        let found: u64 = runs.iter().map(|r| r.length).sum();
        assert_eq!(found, bytes.len() as u64, "turn {turn}: {runs:?}");
        for run in runs {
            let source = fs::read(work.path().join("store").join(&run.source)).unwrap();
            let (at, from, len) = (
                run.offset as usize,
                run.source_offset as usize,
                run.length as usize,
            );
            assert!(
                source[from..from + len] == bytes[at..at + len],
                "turn {turn}: {run:?}"
            );
        }
    }
    assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
}

/// An object of tiny members (no capture makes them) leaves no layout: every
/// capture that looks for its members in layouts would pay for its thousands.
#[test]
fn a_download_of_tiny_members_records_no_layout() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let archive = workspace(&work.path().join("tree"), 0);
    let mut tar = Vec::new();
    flate2::read::MultiGzDecoder::new(&archive[..])
        .read_to_end(&mut tar)
        .unwrap();
    let tiny: Vec<u8> = tar.chunks(100).flat_map(gzip).collect();
    let id = store_bytes(&store, &tiny);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    let members = recording_layouts(&cache, work.path());
    load(&cache, &store, &id);
    let (spans, _) = members_of(&tiny);
    assert!(spans.len() > 1000, "{} members", spans.len());
    assert!(members.reuse(&spans).is_empty());
    // The archive as capture wrote it: its layout is kept.
    let id = store_bytes(&store, &archive);
    load(&cache, &store, &id);
    let (spans, _) = members_of(&archive);
    assert!(!members.reuse(&spans).is_empty());
}

#[test]
fn a_turn_is_rebuilt_from_the_members_of_the_turn_before() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let turns = stored_turns(work.path(), &store, 3);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    load(&cache, &store, &turns[0]);
    let first = cache.stats();
    assert_eq!(first.reused_members, 0);
    assert!(first.inflated_members > 5, "{first:?}");

    let second = load(&cache, &store, &turns[1]);
    let stats = cache.stats();
    let (reused, inflated) = (
        stats.reused_members,
        stats.inflated_members - first.inflated_members,
    );
    assert!(reused >= first.inflated_members - 4, "{stats:?}");
    assert!(inflated <= 4, "{stats:?}");
    assert_eq!(
        (second.index.clone(), contents(&second)),
        fresh(&store, &turns[1])
    );
    // Files rebuilt whole were linked by the digests their records gave: right ones.
    let blobs = fs::read_dir(work.path().join("cache/blobs")).unwrap();
    let mut shared = 0;
    for blob in blobs.map(|b| b.unwrap()) {
        let name = blob.file_name().into_string().unwrap();
        let bytes = fs::read(blob.path()).unwrap();
        assert_eq!(hex::encode(Sha256::digest(bytes)), name);
        use std::os::unix::fs::MetadataExt;
        shared += u64::from(blob.metadata().unwrap().nlink() == 3);
    }
    assert!(shared >= 10, "{shared} blobs shared by both turns");

    // Every file of both entries damaged on disk (in place, as a bad disk would):
    // no member is rebuilt, and turn 2 still comes out as inflating it all gives.
    for turn in &turns[..2] {
        let entry = work.path().join("cache/checkpoints").join(turn.as_str());
        let files = fs::read_dir(entry.join("files")).unwrap();
        for path in files.map(|f| f.unwrap().path()).chain([entry.join("pack")]) {
            let mut bytes = fs::read(&path).unwrap();
            for b in bytes.iter_mut().step_by(97) {
                *b ^= 0x55;
            }
            fs::write(&path, bytes).unwrap();
        }
    }
    let before = cache.stats();
    let third = load(&cache, &store, &turns[2]);
    assert_eq!(
        (third.index.clone(), contents(&third)),
        fresh(&store, &turns[2])
    );
    let after = cache.stats();
    assert_eq!(after.reused_members, before.reused_members, "{after:?}");
}

/// A record whose whole-file digests are wrong (each names another file's blob)
/// makes no file of the new entry take another's bytes, and no blob get a name
/// that is not its digest: a recorded digest only says which blob to compare.
#[test]
fn a_wrong_recorded_digest_links_nothing_wrong() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let turns = stored_turns(work.path(), &store, 2);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    load(&cache, &store, &turns[0]);
    let path = work
        .path()
        .join("cache/checkpoints")
        .join(turns[0].as_str())
        .join("members");
    let mut records = read_records(&path).unwrap().0;
    let mut digests: Vec<[u8; 32]> = Vec::new();
    for record in &records {
        for segment in &record.segments {
            if let Segment::Whole { digest, .. } = segment {
                digests.push(*digest);
            }
        }
    }
    assert!(
        digests.len() >= 10,
        "{} whole files recorded",
        digests.len()
    );
    digests.rotate_left(1);
    let mut next = digests.into_iter();
    for record in &mut records {
        for segment in &mut record.segments {
            if let Segment::Whole { digest, .. } = segment {
                *digest = next.next().unwrap();
            }
        }
    }
    fs::remove_file(&path).unwrap();
    write_records(&path, &records).unwrap();

    let second = load(&cache, &store, &turns[1]);
    assert!(cache.stats().reused_members > 5, "{:?}", cache.stats());
    assert_eq!(
        (second.index.clone(), contents(&second)),
        fresh(&store, &turns[1])
    );
    for blob in fs::read_dir(work.path().join("cache/blobs")).unwrap() {
        let blob = blob.unwrap();
        let bytes = fs::read(blob.path()).unwrap();
        let name = blob.file_name().into_string().unwrap();
        assert_eq!(hex::encode(Sha256::digest(bytes)), name);
    }
}

/// tar bytes of `entries` (path, data), or a pax header giving the next entry
/// the path `pax` when `data` is None.
fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, data) in entries {
        let mut header = tar::Header::new_ustar();
        match data {
            Some(data) => {
                header.set_path(path).unwrap();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                out.extend_from_slice(header.as_bytes());
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(512), 0);
            }
            None => {
                let record = format!("path={path}\n");
                let mut len = record.len() + 2;
                len += (format!("{len} {record}").len() - len).min(1);
                let record = format!("{len} {record}");
                assert_eq!(record.len(), len);
                header.set_path("PaxHeader").unwrap();
                header.set_entry_type(tar::EntryType::XHeader);
                header.set_size(record.len() as u64);
                header.set_cksum();
                out.extend_from_slice(header.as_bytes());
                out.extend_from_slice(record.as_bytes());
                out.resize(out.len().next_multiple_of(512), 0);
            }
        }
    }
    out
}

/// A member known from one archive follows, in another, a member whose pax header
/// renames its first entry: the rebuilt bytes mean what they mean there.
#[test]
fn a_rebuilt_member_means_what_it_means_in_the_new_archive() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let secret = noise(3000, 9);
    let shared = gzip(&tar_of(&[("b", Some(&secret))]));
    assert!(shared.len() > PREFIX);
    let end = gzip(&[0; 1024]);
    let first = [
        gzip(&tar_of(&[("a", Some(b"a\n"))])),
        shared.clone(),
        end.clone(),
    ]
    .concat();
    let second = [
        gzip(&tar_of(&[("x/renamed", None)])),
        shared,
        gzip(&tar_of(&[("c", Some(b"c\n"))])),
        end,
    ]
    .concat();
    let (first, second) = (store_bytes(&store, &first), store_bytes(&store, &second));
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    load(&cache, &store, &first);
    let loaded = load(&cache, &store, &second);
    assert_eq!(cache.stats().reused_members, 1, "{:?}", cache.stats());
    assert_eq!(
        (loaded.index.clone(), contents(&loaded)),
        fresh(&store, &second)
    );
    let index = &loaded.index;
    let x = index.lookup(crate::archive::index::ROOT, b"x").unwrap();
    assert!(index.lookup(x, b"renamed").is_some());
    assert!(index.lookup(crate::archive::index::ROOT, b"b").is_none());
}

/// A gzip member whose first [`PREFIX`] bytes are its header (a long comment), so
/// that members with other data share them.
fn gzip_commented(data: &[u8]) -> Vec<u8> {
    let mut gz = GzBuilder::new()
        .mtime(0)
        .comment(vec![b'c'; PREFIX + 44])
        .write(Vec::new(), Compression::default());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// Loads `first` then `second` into one cache; gives the cache's directory and
/// `first`'s entry.
fn records_of(work: &Path, store: &LocalStore, first: &[u8]) -> (Cache, PathBuf) {
    let first = store_bytes(store, first);
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    load(&cache, store, &first);
    let entry = work.join("cache/checkpoints").join(first.as_str());
    (cache, entry)
}

/// A record that rebuilds, consistently with its own xxh3, to bytes other than its
/// member holds is caught by the member's gzip trailer (CRC-32): inflated.
#[test]
fn a_record_that_lies_consistently_is_caught_by_the_trailer() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let member = gzip(&tar_of(&[("a", Some(&noise(3000, 4)))]));
    let end = gzip(&[0; 1024]);
    let (cache, entry) = records_of(work.path(), &store, &[member.clone(), end.clone()].concat());
    let path = entry.join("members");
    let mut records = read_records(&path).unwrap().0;
    let record = records
        .iter_mut()
        .find(|r| r.compressed_len == member.len() as u64)
        .unwrap();
    let raw = record.segments.iter_mut().find_map(|s| match s {
        Segment::Raw(bytes) => Some(bytes),
        _ => None,
    });
    raw.unwrap()[0] ^= 1;
    let mut pack = None;
    let lie = rebuild(&files_of(&entry), &mut pack, record, &mut Vec::new()).unwrap();
    record.tar_hash = xxh3_128(&lie);
    fs::remove_file(&path).unwrap();
    write_records(&path, &records).unwrap();

    let more = gzip(&tar_of(&[("c", Some(b"c\n"))]));
    let second = store_bytes(&store, &[member, more, end].concat());
    let loaded = load(&cache, &store, &second);
    assert_eq!(cache.stats().reused_members, 0, "{:?}", cache.stats());
    assert_eq!(
        (loaded.index.clone(), contents(&loaded)),
        fresh(&store, &second)
    );
}

/// A member with no tar bytes (here a long header and nothing else) gets no
/// record: there is nothing to rebuild, and records are paid for.
#[test]
fn members_without_tar_bytes_are_not_recorded() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let empty = gzip_commented(b"");
    assert!(empty.len() > PREFIX);
    let full = gzip(&tar_of(&[("a", Some(&noise(3000, 5)))]));
    let archive = [full.clone(), empty, gzip(&[0; 1024])].concat();
    let (_cache, entry) = records_of(work.path(), &store, &archive);
    let records = read_records(&entry.join("members")).unwrap().0;
    let lens: Vec<u64> = records.iter().map(|r| r.compressed_len).collect();
    assert_eq!(lens, [full.len() as u64], "{lens:?}");
}

/// A record found by `prefix`, of `tar_len` bytes made of `segments`, with no
/// entry files behind it: for what reading records does, not rebuilding.
fn bare_record(prefix: u64, id: u8, tar_len: u64, segments: Vec<Segment>) -> MemberRecord {
    MemberRecord {
        prefix,
        compressed: [id; 32],
        compressed_len: 1000,
        tar_len,
        tar_hash: 0,
        segments,
    }
}

/// `n` entry directories in `work`, each with `records` as its members file.
fn entries_with(work: &Path, n: usize, records: &[MemberRecord]) -> Vec<PathBuf> {
    (0..n)
        .map(|d| {
            let dir = work.join(d.to_string());
            fs::create_dir(&dir).unwrap();
            write_records(&dir.join("members"), records).unwrap();
            dir
        })
        .collect()
}

/// Many records with the same first bytes fill one bucket only up to what a
/// boundary checks.
#[test]
fn a_prefix_bucket_holds_no_more_than_a_boundary_checks() {
    let work = tempfile::tempdir().unwrap();
    let records: Vec<MemberRecord> = (0..200)
        .map(|i| bare_record(7, i, 512, vec![Segment::Zeros(512)]))
        .collect();
    let known = Known::read(
        entries_with(work.path(), 3, &records)
            .iter()
            .map(|d| files_of(d)),
    );
    assert_eq!(known.by_prefix.len(), 1);
    assert_eq!(known.by_prefix[&7].len(), MAX_CANDIDATES);
}

/// Records that do not hold what their decoder would take are not used: too many
/// segments for their length, a members file that is a symlink or a FIFO.
#[test]
fn records_out_of_bounds_or_not_regular_files_are_not_read() {
    let work = tempfile::tempdir().unwrap();
    let many = bare_record(1, 1, 512, vec![Segment::Zeros(1); 512]);
    let path = work.path().join("many");
    write_records(&path, std::slice::from_ref(&many)).unwrap();
    assert_eq!(
        read_records(&path).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    let fine = MemberRecord {
        segments: vec![Segment::Zeros(512)],
        ..many
    };
    let path = work.path().join("fine");
    write_records(&path, std::slice::from_ref(&fine)).unwrap();
    assert_eq!(read_records(&path).unwrap().0, [fine]);

    let link = work.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(read_records(&link).is_err());
    let fifo = work.path().join("fifo");
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    // Would block forever without O_NONBLOCK (no writer).
    assert_eq!(
        read_records(&fifo).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

/// An archive whose members all start as a recorded long member does, but are not
/// it, costs a bounded number of full comparisons, not one per member.
#[test]
fn members_that_only_start_like_a_record_stop_being_compared() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let long = gzip_commented(&tar_of(&[("big", Some(&noise(1 << 20, 6)))]));
    let end = gzip(&[0; 1024]);
    let (_cache, entry) = records_of(work.path(), &store, &[long.clone(), end.clone()].concat());
    let known = Known::read([files_of(&entry)]);
    assert!(!known.is_empty());

    let decoy = gzip_commented(b"");
    assert_eq!(decoy[..PREFIX], long[..PREFIX]);
    let mut attack = decoy.repeat(300);
    attack.extend(gzip(&noise(2 << 20, 7)));
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    let reader = MemberReader::new(&attack[..], known, Arc::clone(&recorder));
    let ours = inflate_all(reader).unwrap();
    assert_eq!(
        ours,
        inflate_all(flate2::read::MultiGzDecoder::new(&attack[..])).unwrap()
    );
    let counts = recorder.lock().unwrap().counts();
    assert_eq!(counts.inflated, 301);
    // 1 MiB each: about (2 × stream + 2 × MAX_PEEK) / 1 MiB comparisons at most.
    assert!((2..=16).contains(&counts.mismatched), "{counts:?}");
}

/// Records small on disk but large in memory are refused as a whole: what a
/// load reads back costs what a load that made them could have spent.
#[test]
fn records_costing_more_than_the_budget_in_memory_are_not_read() {
    let work = tempfile::tempdir().unwrap();
    let many = vec![bare_record(1, 1, 4096, vec![Segment::Zeros(16); 200]); 2000];
    assert!(cost(200, 0) * 2000 > MAX_RECORDS);
    let path = work.path().join("members");
    write_records(&path, &many).unwrap();
    assert!(fs::metadata(&path).unwrap().len() < MAX_RECORDS / 4);
    assert_eq!(
        read_records(&path).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    let path = work.path().join("fewer");
    write_records(&path, &many[..100]).unwrap();
    assert_eq!(read_records(&path).unwrap().0.len(), 100);
}

/// The records of several entries are read until they cost the budget of one:
/// memory for records stays under twice it, whatever the entries hold.
#[test]
fn entries_are_read_until_their_records_cost_the_budget() {
    let work = tempfile::tempdir().unwrap();
    let records: Vec<MemberRecord> = (0..900u64)
        .map(|i| bare_record(i, 1, 4096, vec![Segment::Zeros(16); 200]))
        .collect();
    let one = cost(200, 0) * 900;
    assert!(one < MAX_RECORDS && 2 * one > MAX_RECORDS);
    let dirs = entries_with(work.path(), 3, &records);
    assert_eq!(
        Known::read(dirs.iter().map(|d| files_of(d))).entries.len(),
        2
    );
}

/// Where file contents went is kept only while a member that may hold them is
/// still to be recorded: an archive of no recordable member keeps none of it.
#[test]
fn contents_are_forgotten_once_no_member_needs_them() {
    let mut recorder = Recorder::default();
    for i in 0..1000u64 {
        recorder.contents_at(i as u32, i * 1024 + 512, 100);
    }
    recorder.finish_through(500 * 1024);
    assert_eq!(recorder.contents.len(), 500);
    recorder.member(Unfinished {
        prefix: 0,
        compressed: [0; 32],
        compressed_len: 300,
        start: 600 * 1024,
        tar: Arc::new(vec![0; 1024]),
    });
    recorder.finish_through(900 * 1024);
    // The member (600 KiB to 601 KiB) was recorded, and everything before 900 KiB
    // went with it.
    assert_eq!(recorder.contents.len(), 100);
    assert_eq!(recorder.done.len(), 1);
}

fn inflate_all(mut reader: impl Read) -> Result<Vec<u8>, ()> {
    let mut out = Vec::new();
    let mut buf = [0u8; 777];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return Err(()),
        }
    }
}

/// Without records, the reader is flate2's MultiGzDecoder, also on bad input.
#[test]
fn the_reader_inflates_as_multigzdecoder_does() {
    let a = gzip(&noise(5000, 1));
    let b = gzip(b"second member\n");
    let cases: Vec<Vec<u8>> = vec![
        Vec::new(),
        a.clone(),
        [a.clone(), b.clone()].concat(),
        [a.clone(), b.clone(), b"garbage".to_vec()].concat(),
        [a.clone(), vec![0; 20]].concat(),
        a[..a.len() - 3].to_vec(),
        [a.clone(), b[..5].to_vec()].concat(),
        b"not gzip at all".to_vec(),
        [a.clone(), gzip(b"")].concat(),
    ];
    for (i, case) in cases.iter().enumerate() {
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let mut reader = MemberReader::new(&case[..], Known::default(), recorder);
        let ours = inflate_all(&mut reader);
        let theirs = inflate_all(flate2::read::MultiGzDecoder::new(&case[..]));
        assert_eq!(ours, theirs, "case {i}");
        if ours.is_err() {
            // After an error the stream has ended.
            assert_eq!(reader.read(&mut [0; 16]).unwrap(), 0, "case {i}");
        }
    }
}

/// The archive of a tree holding `files` (paths and bytes) and a small file, with
/// fixed times.
fn tree_of_files(dir: &Path, files: &[(&str, &[u8])]) -> Vec<u8> {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    for (name, data) in files.iter().chain([&("small.txt", &b"small\n"[..])]) {
        let path = dir.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, data).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    archive_of(dir)
}

/// Files too large to be held in memory whose bytes a blob of the same size holds
/// are compared with it as they come and linked to it, never written; one that
/// differs from such a blob anywhere (from its middle, in its last byte) is written
/// whole and right.
#[test]
fn large_files_the_cache_holds_are_linked_unwritten() {
    let work = tempfile::tempdir().unwrap();
    let store = LocalStore::create(&work.path().join("store")).unwrap();
    let a = noise(3 << 20, 1);
    let b = noise((2 << 20) + 12_345, 2);
    let first = store_bytes(
        &store,
        &tree_of_files(&work.path().join("t0"), &[("a.bin", &a), ("b.bin", &b)]),
    );
    let mut half = a[..2 << 20].to_vec();
    half.extend(noise(a.len() - half.len(), 3));
    let mut last = a.clone();
    *last.last_mut().unwrap() ^= 1;
    let second = store_bytes(
        &store,
        &tree_of_files(
            &work.path().join("t1"),
            &[
                ("moved/a.bin", &a),
                ("b.bin", &b),
                ("half.bin", &half),
                ("last.bin", &last),
            ],
        ),
    );
    let cache = Cache::open(
        &crate::cache::CacheDir::open(&work.path().join("cache")).unwrap(),
        u64::MAX,
    )
    .unwrap();
    load(&cache, &store, &first);
    assert_eq!(cache.stats().linked_unwritten_bytes, 0);
    let loaded = load(&cache, &store, &second);
    assert_eq!(
        cache.stats().linked_unwritten_bytes,
        (a.len() + b.len()) as u64
    );
    assert_eq!(
        (loaded.index.clone(), contents(&loaded)),
        fresh(&store, &second)
    );
    use std::os::unix::fs::MetadataExt;
    let mut shared = 0;
    for blob in fs::read_dir(work.path().join("cache/blobs")).unwrap() {
        let blob = blob.unwrap();
        let bytes = fs::read(blob.path()).unwrap();
        let name = blob.file_name().into_string().unwrap();
        assert_eq!(hex::encode(Sha256::digest(&bytes)), name);
        shared += u64::from(blob.metadata().unwrap().nlink() == 3);
    }
    assert_eq!(shared, 2, "a and b held once by both entries");
}

/// The split of raw tar bytes the recorder made before it counted zeros a word at a
/// time: the reference its faster scan must match exactly.
fn raw_pieces_bytewise(mut bytes: &[u8]) -> Vec<(bool, Vec<u8>)> {
    let mut out: Vec<(bool, Vec<u8>)> = Vec::new();
    while !bytes.is_empty() {
        let zeros = bytes.iter().take_while(|&&b| b == 0).count();
        if zeros >= ZERO_RUN || zeros == bytes.len() {
            out.push((true, vec![0; zeros]));
            bytes = &bytes[zeros..];
            continue;
        }
        let mut end = zeros;
        while end < bytes.len() {
            let run = bytes[end..].iter().take_while(|&&b| b == 0).count();
            if run >= ZERO_RUN || end + run == bytes.len() && run > 0 {
                break;
            }
            end += run.max(1);
        }
        match out.last_mut() {
            Some((false, raw)) => raw.extend_from_slice(&bytes[..end]),
            _ => out.push((false, bytes[..end].to_vec())),
        }
        bytes = &bytes[end..];
    }
    out
}

proptest::proptest! {
    #[test]
    fn raw_pieces_split_as_the_bytewise_scan_did(
        runs in proptest::collection::vec((0usize..140, 0usize..20, proptest::bool::ANY), 0..12),
    ) {
        // Runs of zeros of every length around ZERO_RUN, between raw bytes.
        let mut bytes = Vec::new();
        for (zeros, raw, zeros_first) in runs {
            let raw = (1..=raw).map(|i| (i % 251 + 1) as u8);
            if zeros_first {
                bytes.extend(std::iter::repeat_n(0u8, zeros));
                bytes.extend(raw);
            } else {
                bytes.extend(raw);
                bytes.extend(std::iter::repeat_n(0u8, zeros));
            }
        }
        let mut pieces = Vec::new();
        raw_pieces(&bytes, &mut pieces);
        let got: Vec<(bool, Vec<u8>)> = pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Zeros(n) => (true, vec![0; n as usize]),
                Piece::Raw(raw) => (false, raw),
                Piece::Contents { .. } => unreachable!("raw bytes hold no contents"),
            })
            .collect();
        proptest::prop_assert_eq!(got, raw_pieces_bytewise(&bytes));
    }
}
