//! The mount's indexer on arbitrary tar streams: it must end with an index or an
//! error (never a panic, a hang, or memory beyond its limits), and everything it
//! writes stays inside its output directory.
#![no_main]

use ckptfs::archive::{Limits, index};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_entries: 10_000,
    max_unpacked_bytes: 16 << 20,
    max_metadata_bytes: 16 << 20,
};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("entry");
    std::fs::create_dir(&out).unwrap();
    if let Ok(index) = index::build(data, &out, LIMITS, 0) {
        // Every file node's contents are where the index says, within the limits.
        assert!(index.unpacked_bytes <= LIMITS.max_unpacked_bytes);
        assert!(index.nodes.len() as u64 <= LIMITS.max_entries + 1);
    }
    // Nothing but the entry directory was created next to it.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("entry")]);
});
