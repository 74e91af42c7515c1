//! The review commands against hostile trees: what they cost is bounded by what they
//! read, not by what a small archive makes them compute.

use std::time::Duration;

use super::{MAX_RSS_KIB, run_measured};
use crate::util::tree::write_file;
use crate::util::{TestStore, ckptfs, temp_dir};

/// Files just under `diff --patch`'s size limit, compressible to almost nothing, whose
/// every line differs between the turns: the worst case of Myers' search (its cost is
/// the product of the line counts). Each file used to get a 5 s search, so eight took
/// over 40 s; the search now has a budget for the whole command.
#[test]
fn a_patch_of_files_that_differ_everywhere_is_bounded() {
    const FILES: usize = 8;
    const LINES: usize = 3_900_000 / 16;
    let store = TestStore::local();
    let work = temp_dir();
    let tree = work.path().join("w");
    let turn = |tag: &str| {
        for f in 0..FILES {
            let text: String = (0..LINES)
                .map(|i| format!("{i:09} {tag}{f:04}\n"))
                .collect();
            write_file(&tree.join(format!("f{f}.txt")), text.as_bytes(), 0o644);
        }
        store.put(&tree, &[]).0
    };
    let (old, new) = (turn("a"), turn("b"));

    let mut diff = ckptfs();
    diff.args(["diff", "--patch"])
        .arg(store.url())
        .args([&old, &new]);
    let measured =
        run_measured(&mut diff, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    let out = measured.out.success();
    assert_eq!(
        out.stdout.matches("\n+++ b/f").count(),
        FILES,
        "a patch per file"
    );
    assert!(
        measured.max_rss_kib <= MAX_RSS_KIB,
        "diff --patch used {} KiB",
        measured.max_rss_kib
    );
}
