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

/// Root makes a report into a directory another user owns (nobody's): that user may
/// swap the report's folders between runs, for a link to a directory of root's or a
/// folder of their own, but not steer the report's writes, replacements and deletions
/// there, nor its reads (a 9-byte file of root's was replaced by a turn's page,
/// another deleted, and a file only root may read copied into a page, before the
/// report worked through descriptors of its own folders).
#[test]
fn a_report_directory_another_user_writes_cannot_steer_the_report() {
    use crate::util::users::{as_nobody, nobodys_dir, shared_temp_dir};
    let store = TestStore::local();
    let work = temp_dir();
    let tree = work.path().join("w");
    write_file(&tree.join("a.txt"), b"a\n", 0o644);
    let sha = store.put(&tree, &[]).0;

    let shared = shared_temp_dir("ckptfs-report-");
    let out = shared.path().join("out");
    nobodys_dir(&out);
    store.cmd("report", [&out]).success();

    // A directory of root's holding files with the names a report writes and removes.
    let victim = work.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let page = victim.join(format!("{sha}.html"));
    let other = victim.join(format!("{}.html", "0".repeat(64)));
    std::fs::write(&page, b"precious\n").unwrap();
    std::fs::write(&other, b"keep\n").unwrap();
    let untouched = |what: &str| {
        assert_eq!(std::fs::read(&page).unwrap(), b"precious\n", "{what}");
        assert_eq!(std::fs::read(&other).unwrap(), b"keep\n", "{what}");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 2, "{what}");
    };

    // turns/ swapped for a link to root's directory.
    let swap = format!(
        "mv {out}/turns {out}/old && ln -s {victim} {out}/turns",
        out = out.display(),
        victim = victim.display()
    );
    crate::util::run(as_nobody().args(["sh", "-c", &swap])).success();
    let refused = store.cmd("report", [&out]);
    assert_eq!(refused.status.code(), Some(1), "{refused}");
    assert!(refused.stderr.contains("a symlink is refused"), "{refused}");
    untouched("through a link");

    // turns/ swapped for a folder of nobody's own, whose files nobody could link
    // anywhere later.
    let swap = format!("rm {out}/turns && mkdir {out}/turns", out = out.display());
    crate::util::run(as_nobody().args(["sh", "-c", &swap])).success();
    let refused = store.cmd("report", [&out]);
    assert_eq!(refused.status.code(), Some(1), "{refused}");
    assert!(refused.stderr.contains("belongs to uid 65534"), "{refused}");
    untouched("through nobody's folder");

    // .ckptfs-report/ swapped for nobody's copy whose page body is a link to a file
    // only root may read: an earlier report put its contents into a 0644 page.
    let out = shared.path().join("out2");
    nobodys_dir(&out);
    store.cmd("report", [&out]).success();
    let secret = work.path().join("secret");
    std::fs::write(&secret, b"ROOT-ONLY-SECRET\n").unwrap();
    let swap = format!(
        "cd {out} && mv .ckptfs-report old && mkdir .ckptfs-report && \
         cp old/manifest.json .ckptfs-report/ && \
         for f in old/*.html; do ln -s {secret} .ckptfs-report/$(basename $f); done",
        out = out.display(),
        secret = secret.display()
    );
    crate::util::run(as_nobody().args(["sh", "-c", &swap])).success();
    // A manifest of nobody's is no report of root's.
    let refused = store.cmd("report", [&out]);
    assert_eq!(refused.status.code(), Some(1), "{refused}");
    assert!(
        refused.stderr.contains("holds no ckptfs report"),
        "{refused}"
    );
    let page = std::fs::read(out.join("turns").join(format!("{sha}.html"))).unwrap();
    assert!(!String::from_utf8_lossy(&page).contains("ROOT-ONLY-SECRET"));
}

/// A report reuses a page body and its counts only if this user's key signed them:
/// files of root's with anyone's contents are easy to come by (root's `get` of an
/// archive gives its files their archived owner, root included), so a `.ckptfs-report/`
/// moved into OUTDIR by whoever can write it could put words in root's report (a
/// forged body and counts were shown as the turn's, before the signatures).
#[test]
fn a_report_reuses_only_what_it_signed() {
    let store = TestStore::local();
    let work = temp_dir();
    let tree = work.path().join("w");
    write_file(&tree.join("a.txt"), b"one\n", 0o644);
    store.put(&tree, &[]);
    std::thread::sleep(Duration::from_millis(1100));
    write_file(&tree.join("a.txt"), b"two\n", 0o644);
    let second = store.put(&tree, &[]).0;
    let out = work.path().join("out");
    store.cmd("report", [&out]).success();

    // Forged as a `get` into a directory of the forger's would leave them, root's.
    let state = out.join(".ckptfs-report");
    let manifest_path = state.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let turn = &mut manifest["turns"][&second];
    turn["stats"]["files"] = serde_json::json!(999_999);
    let base = turn["base"].as_str().unwrap_or("first").to_owned();
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    std::fs::write(
        state.join(format!("{second}.{base}.html")),
        "<h1>FORGED: nothing changed</h1>",
    )
    .unwrap();

    let again = store.cmd("report", [&out]).success();
    assert!(
        again.stderr.contains("(2 turns: 1 computed, 1 taken"),
        "{again}"
    );
    let page = std::fs::read_to_string(out.join("turns").join(format!("{second}.html"))).unwrap();
    assert!(!page.contains("FORGED"), "{page}");
    let index = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        !index.contains("999,999") && !index.contains("999999"),
        "{index}"
    );
}

/// `ckptfs man --out-dir DIR` replaces what it finds under a page's name, a symlink
/// included, rather than writing through it (root's run truncated and overwrote a
/// 0600 file of root's that another user had linked there as `ckptfs-put.1`).
#[test]
fn man_pages_are_never_written_through_a_link() {
    let work = temp_dir();
    let victim = work.path().join("victim.conf");
    std::fs::write(&victim, b"root's own\n").unwrap();
    let pages = work.path().join("man");
    std::fs::create_dir(&pages).unwrap();
    std::os::unix::fs::symlink(&victim, pages.join("ckptfs-put.1")).unwrap();
    crate::util::run(ckptfs().args(["man", "--out-dir"]).arg(&pages)).success();
    assert!(
        std::fs::read(&victim).unwrap() == b"root's own\n",
        "the linked file was written through"
    );
    let page = std::fs::symlink_metadata(pages.join("ckptfs-put.1")).unwrap();
    assert!(page.is_file());
    let text = std::fs::read_to_string(pages.join("ckptfs-put.1")).unwrap();
    assert!(text.contains(".TH ckptfs-put 1"), "{text}");
    assert!(pages.join("ckptfs.1").is_file());
}
