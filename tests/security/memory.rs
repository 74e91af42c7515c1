//! The daemon's memory is bounded by `--memory-budget`, not by what archives imply.

use std::fs;
use std::io::Write;

use super::{vm_hwm_kib, vm_rss_kib};
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

/// Listings of `staging/` directories left half read: each was kept whole in the
/// daemon until read to its end, and nothing else dropped it (a review took a daemon
/// from 13 to 65 MB with 50,000 long names read in part, then deleted). The daemon now
/// keeps no listing between requests.
#[test]
fn listings_left_half_read_in_staging_hold_no_memory() {
    const DIRS: usize = 4;
    const NAMES: usize = 40_000;
    let store = TestStore::local();
    let mount = Mount::new(&store).staging().start();
    let workspace = mount.join("staging/w");
    fs::create_dir(&workspace).unwrap();
    // Made through the mount, filled from behind it (fast): the daemon lists what
    // the backing directories hold, about 40 MB of names and entries in all.
    let long = "n".repeat(200);
    for d in 0..DIRS {
        fs::create_dir(workspace.join(format!("d{d}"))).unwrap();
        let backing = mount.staging_dir().join(format!("w/d{d}"));
        for i in 0..NAMES {
            fs::File::create(backing.join(format!("{i:06}{long}"))).unwrap();
        }
    }
    let before = vm_rss_kib(mount.pid()).expect("the daemon's VmRSS");
    for d in 0..DIRS {
        let mut listing = fs::read_dir(workspace.join(format!("d{d}"))).unwrap();
        listing.next().unwrap().unwrap();
    }
    let after = vm_rss_kib(mount.pid()).expect("the daemon's VmRSS");
    assert!(
        after < before + 16 * 1024,
        "the daemon grew from {} to {} MiB",
        before / 1024,
        after / 1024
    );
}
