//! DEST swapped for a link while `get` runs: a writer of DEST's parent (anyone, in a
//! sticky directory such as /tmp, for a DEST they made) exchanges DEST with a symlink
//! to another directory in a tight loop. `get` once checked DEST by path and opened it
//! by path again, so a restore landed in, and the clean-up of a failed one emptied,
//! the other directory (an attacker review won in 155 tries). It opens DEST once,
//! without following links, and works from that descriptor.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tar::EntryType;

use crate::util::archive::TarGz;
use crate::util::sys::rename_exchange;
use crate::util::{TestStore, ckptfs, run, sha256_hex, temp_dir};

#[test]
fn dest_swapped_for_a_link_is_never_followed() {
    let work = temp_dir();
    let victim = work.path().join("victim");
    fs::create_dir_all(victim.join("sub")).unwrap();
    fs::write(victim.join("sub/data"), b"precious").unwrap();
    let (dest, swap) = (work.path().join("dest"), work.path().join("swap"));
    fs::create_dir(&dest).unwrap();
    std::os::unix::fs::symlink(&victim, &swap).unwrap();

    // A checkpoint that verifies and fails half-way through its restore (a path over
    // PATH_MAX after a first file), so that the clean-up runs; and one that restores.
    let store = TestStore::local();
    let plant = |bytes: Vec<u8>| {
        let sha = sha256_hex(&bytes);
        store.write_object_bytes(&sha, &bytes, Some((&sha, bytes.len() as u64)));
        sha
    };
    let failing = plant(
        TarGz::new()
            .file(b"planted", b"x")
            .pax(EntryType::XHeader, &[("path", &[b'p'; 5050])])
            .file(b"ignored", b"y")
            .end()
            .finish(),
    );
    let good = plant(TarGz::new().file(b"planted", b"x").end().finish());

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let (a, b) = (dest.clone(), swap.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = rename_exchange(&a, &b);
            }
        })
    };
    for attempt in 0..300 {
        let sha = if attempt % 2 == 0 { &failing } else { &good };
        let _ = run(ckptfs()
            .arg("-q")
            .arg("get")
            .arg(store.url())
            .arg(sha)
            .arg(&dest));
        // Whatever a good restore put in DEST (when it was DEST) goes again.
        for place in [&dest, &swap] {
            if fs::symlink_metadata(place).is_ok_and(|m| m.is_dir()) {
                let _ = fs::remove_file(place.join("planted"));
            }
        }
        let names: Vec<_> = fs::read_dir(&victim)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        assert!(
            names == [b"sub".to_vec()] && fs::read(victim.join("sub/data")).is_ok(),
            "attempt {attempt}: the directory behind the link was changed: {:?}",
            names
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect::<Vec<_>>()
        );
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
}
