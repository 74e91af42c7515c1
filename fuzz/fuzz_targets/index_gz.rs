//! The indexer behind the gzip decoder, as the mount runs it on a downloaded object.
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
    let _ = index::build(flate2::read::MultiGzDecoder::new(data), dir.path(), LIMITS, 0);
});
