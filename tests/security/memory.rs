//! The daemon's memory is bounded by `--memory-budget`, not by what archives imply.

use std::fs;
use std::io::Write;

use super::vm_hwm_kib;
use crate::util::mount::Mount;
use crate::util::{TestStore, sha256_hex};

/// A 27 KB archive of 975 files whose paths (4,095 bytes, PAX headers) imply about 2
/// million directories, just under `--max-entries`: indexing one took a daemon to
/// 876 MiB, and six of them, loaded one after another, to 2.7 GB (an index lived on
/// until evicted, and eviction counted disk bytes only).
fn implied_directories(tag: usize) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for i in 0..975 {
        let top = format!("k{tag}d{i:03}/");
        let depth = (4095 - top.len() - 1) / 2;
        let path = format!("{top}{}f", "a/".repeat(depth));
        let mut header = tar::Header::new_ustar();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        // Long paths go into a PAX extended header of their own.
        tar.append_pax_extensions([("path", path.as_bytes())])
            .unwrap();
        header.set_path("placeholder").unwrap();
        header.set_cksum();
        tar.append(&header, &b"x"[..]).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

/// Six such archives, loaded one after another under the default budget (512 MiB):
/// each is refused with the limit named, and the daemon's peak memory stays under
/// the budget.
#[test]
fn archives_implying_millions_of_directories_stay_within_the_memory_budget() {
    let store = TestStore::local();
    let mut shas = Vec::new();
    for tag in 0..6 {
        let gz = implied_directories(tag);
        let sha = sha256_hex(&gz);
        store.write_object_bytes(&sha, &gz, Some((&sha, gz.len() as u64)));
        shas.push(sha);
    }
    let mount = Mount::new(&store).start();
    for sha in &shas {
        let listed = fs::read_dir(mount.join(sha)).map(drop);
        assert!(listed.is_err(), "{sha} was loaded");
    }
    let status = mount.status_text();
    for sha in &shas {
        let line = status
            .lines()
            .find(|l| l.starts_with(sha.as_str()))
            .unwrap();
        assert!(line.contains("half of --memory-budget"), "{line}");
    }
    let peak_kib = vm_hwm_kib(mount.pid()).expect("the daemon's VmHWM");
    assert!(
        peak_kib < 512 * 1024,
        "the daemon peaked at {} MiB",
        peak_kib / 1024
    );
}
