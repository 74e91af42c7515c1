//! `ckptfs report`: the pages it writes, read as files and as a browser shows them
//! (headless Chromium's DOM), with hostile names and contents, a damaged checkpoint,
//! and a second run that computes only the new turn.

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{CLOCK_TICK, HELLO_2, three_turns};
use crate::util::tree::write_file;
use crate::util::{Output, TestStore, run, temp_dir};

both_stores!(
    report_shows_every_turn_in_order_and_hostile_input_as_text,
    report_shows_a_damaged_checkpoint_as_failed,
    a_change_that_keeps_the_checksum_is_shown,
    a_parent_that_cannot_be_read_fails_its_child_not_the_report,
    a_body_is_reused_only_for_the_pair_it_was_made_for,
);

/// A name that is markup, and contents that try to end the diff's `<pre>`, run a
/// script and load things from a server the test watches.
const HOSTILE_NAME: &str = "<img src=x onerror=alert(1)>";

fn hostile_contents(port: u16) -> String {
    format!(
        "</span></pre><script>fetch('http://127.0.0.1:{port}/script')</script>\n\
         <img src=\"http://127.0.0.1:{port}/img\">\n\
         <link rel=stylesheet href=\"http://127.0.0.1:{port}/css\">\n\
         <style>@import url(http://127.0.0.1:{port}/import);</style>\n\
         <iframe src=\"http://127.0.0.1:{port}/frame\"></iframe>\n"
    )
}

/// Counts the connections made to a port on 127.0.0.1 while it lives.
struct Watched {
    port: u16,
    connections: Arc<AtomicUsize>,
}

fn watched_port() -> Watched {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port to watch");
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connections);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            count.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    Watched { port, connections }
}

/// The DOM of `page` after headless Chromium loaded it.
fn dom(page: &Path) -> String {
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect(
            "these tests need Chromium (Debian: apt-get install chromium); scripts/test.sh \
             installs it",
        );
    let profile = temp_dir();
    let out = run(Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display())))
    .success();
    out.stdout
}

fn report(store: &TestStore, outdir: &Path) -> Output {
    store.cmd("report", [outdir])
}

fn page_of(outdir: &Path, sha: &str) -> PathBuf {
    outdir.join("turns").join(format!("{sha}.html"))
}

/// What the note at the end says was computed and reused: `(computed, reused)`.
fn counts(out: &Output) -> (u32, u32) {
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains(" computed, "))
        .unwrap_or_else(|| panic!("no summary line: {out}"));
    let number_before = |word: &str| -> u32 {
        let at = line.find(word).unwrap();
        line[..at]
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches('(')
            .parse()
            .unwrap()
    };
    (number_before(" computed"), number_before(" taken"))
}

fn report_shows_every_turn_in_order_and_hostile_input_as_text(store: &TestStore) {
    let watched = watched_port();
    let turns = three_turns(store);
    let w = turns.work.path().join("w");
    // Turn 4: a hostile name with hostile contents, and a rename.
    std::thread::sleep(CLOCK_TICK);
    write_file(
        &w.join(HOSTILE_NAME),
        hostile_contents(watched.port).as_bytes(),
        0o644,
    );
    fs::rename(w.join("new.txt"), w.join("renamed.txt")).unwrap();
    crate::util::tree::chmod(&w.join("renamed.txt"), 0o755);
    let fourth = store.put(&w, &[]).0;
    let shas: Vec<&str> = (0..3)
        .map(|i| turns.sha(i))
        .chain([fourth.as_str()])
        .collect();

    let out_root = temp_dir();
    let outdir = out_root.path().join("review");
    let out = report(store, &outdir).success();
    assert_eq!(counts(&out), (4, 0), "{out}");

    // The index, as the browser builds it: every turn, in capture order, linked.
    let index = dom(&outdir.join("index.html"));
    let mut at = 0;
    for sha in &shas {
        let found = index[at..]
            .find(&format!("href=\"turns/{sha}.html\""))
            .unwrap_or_else(|| panic!("turn {sha} missing or out of order in:\n{index}"));
        at += found + 1;
    }
    assert!(index.contains("none failed"), "{index}");
    assert!(index.contains("<svg"), "the chart: {index}");

    // Turn 2 shows the line it added, in a diff with +/- kept beside the colours.
    let second = dom(&page_of(&outdir, shas[1]));
    let added = HELLO_2.lines().last().unwrap();
    assert!(
        second.contains(&format!("<span class=\"add\">+{added}</span>")),
        "{second}"
    );
    assert!(second.contains("<h3>D gone.txt</h3>"), "{second}");
    assert!(second.contains("Binary file."), "{second}");
    assert!(second.contains("target <code>hello.py</code>"), "{second}");

    // Turn 4: the hostile name and contents are text; the DOM holds no element they
    // could have made, and nothing was fetched.
    let fourth_page = dom(&page_of(&outdir, &fourth));
    assert!(
        fourth_page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{fourth_page}"
    );
    assert!(
        fourth_page.contains("&lt;/span&gt;&lt;/pre&gt;&lt;script&gt;"),
        "{fourth_page}"
    );
    for element in ["<img", "<script", "<iframe", "<link"] {
        assert!(
            !fourth_page.contains(element) && !index.contains(element),
            "{element} in the DOM:\n{fourth_page}"
        );
    }
    assert!(
        fourth_page.contains("renamed from <code>new.txt</code>"),
        "{fourth_page}"
    );
    // A rename does not hide what else changed with the name.
    assert!(fourth_page.contains("mode 0644 → 0755"), "{fourth_page}");
    // Chromium has exited: any fetch it made has connected by now.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        watched.connections.load(Ordering::SeqCst),
        0,
        "a page made a request"
    );
    // No page links anywhere but to the report's own files.
    for page in fs::read_dir(outdir.join("turns"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .chain([outdir.join("index.html")])
    {
        let html = fs::read_to_string(&page).unwrap();
        for href in html.split("href=\"").skip(1) {
            let target = &href[..href.find('"').unwrap()];
            assert!(
                target.ends_with(".html") && !target.contains(':') && !target.starts_with('/'),
                "{} links to {target}",
                page.display()
            );
        }
    }

    // A second run computes nothing; after one more turn, only that one.
    let out = report(store, &outdir).success();
    assert_eq!(counts(&out), (0, 4), "{out}");
    std::thread::sleep(CLOCK_TICK);
    write_file(&w.join("fifth.txt"), b"five\n", 0o644);
    let fifth = store.put(&w, &[]).0;
    let out = report(store, &outdir).success();
    assert_eq!(counts(&out), (1, 4), "{out}");
    let fifth_page = fs::read_to_string(page_of(&outdir, &fifth)).unwrap();
    assert!(
        fifth_page.contains("<span class=\"add\">+five</span>"),
        "{fifth_page}"
    );
    // The fourth page now links to the fifth.
    let fourth_page = fs::read_to_string(page_of(&outdir, &fourth)).unwrap();
    assert!(
        fourth_page.contains(&format!("href=\"{fifth}.html\"")),
        "{fourth_page}"
    );

    // A directory that holds something else is not written into.
    let other = out_root.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes.txt"), b"mine").unwrap();
    let out = report(store, &other);
    assert_eq!(out.status.code(), Some(1), "{out}");
    assert!(out.stderr.contains("holds no ckptfs report"), "{out}");
    let mut kept = String::new();
    fs::File::open(other.join("notes.txt"))
        .unwrap()
        .read_to_string(&mut kept)
        .unwrap();
    assert_eq!(kept, "mine");
    assert_eq!(fs::read_dir(&other).unwrap().count(), 1);
}

fn report_shows_a_damaged_checkpoint_as_failed(store: &TestStore) {
    let turns = three_turns(store);
    let second = turns.sha(1);
    let size = turns.turns[1].1;
    let mut bytes = store.object_bytes(second).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    store.write_object_bytes(second, &bytes, Some((second, size)));

    let out_root = temp_dir();
    let outdir = out_root.path().join("review");
    let out = report(store, &outdir);
    assert_eq!(out.status.code(), Some(1), "{out}");
    assert!(out.stderr.contains("1 FAILED"), "{out}");
    let index = fs::read_to_string(outdir.join("index.html")).unwrap();
    assert!(index.contains("1 FAILED"), "{index}");
    let page = fs::read_to_string(page_of(&outdir, second)).unwrap();
    assert!(
        page.contains("FAILED: Checkpoint checksum mismatch"),
        "{page}"
    );
    assert!(!page.contains("<h2>Changes</h2>"), "{page}");
    // The third turn is compared with the first, the last one that verified.
    let third = fs::read_to_string(page_of(&outdir, turns.sha(2))).unwrap();
    assert!(
        third.contains(&format!(
            "the turn before, <a class=\"mono\" href=\"{}.html\"",
            turns.sha(0)
        )),
        "{third}"
    );
    // A failed turn is never taken from an earlier report: once repaired, it is
    // computed.
    let good = {
        let mut b = bytes.clone();
        for x in &mut b[mid..mid + 16] {
            *x ^= 0x5a;
        }
        b
    };
    store.write_object_bytes(second, &good, Some((second, size)));
    let out = report(store, &outdir).success();
    assert!(out.stderr.contains("0 FAILED"), "{out}");
    let page = fs::read_to_string(page_of(&outdir, second)).unwrap();
    assert!(page.contains("<h2>Changes</h2>"), "{page}");
}

/// Two files of the same size whose xxh3 checksums collide (a collision made on
/// purpose, as an attacker review did): the first says `good`, the second `evil`.
fn colliding_files() -> (Vec<u8>, Vec<u8>) {
    // XXH3's default secret, bytes 16..32: a lane whose input's low word equals the
    // secret's adds its high word times zero, so swapping the high words of two lanes
    // keeps the sum.
    const SECRET: [u8; 16] = [
        0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67,
        0x1f,
    ];
    let make = |a: &[u8; 4], b: &[u8; 4]| {
        let mut f = vec![b'#'; 2000];
        f[..10].copy_from_slice(b"#!/bin/sh\n");
        f[69..72].copy_from_slice(b"\nA=");
        f[72..76].copy_from_slice(&SECRET[..4]);
        f[76..80].copy_from_slice(a);
        f[80] = b'\n';
        f[133..136].copy_from_slice(b"\nB=");
        f[136..140].copy_from_slice(&SECRET[8..12]);
        f[140..144].copy_from_slice(b);
        f[144] = b'\n';
        let tail = b"\necho \"deploying to ${A#????}.example.com\"\n";
        f[2000 - tail.len()..].copy_from_slice(tail);
        f
    };
    let (one, two) = (make(b"good", b"evil"), make(b"evil", b"good"));
    assert_ne!(one, two);
    assert_eq!(
        xxhash_rust::xxh3::xxh3_64(&one),
        xxhash_rust::xxh3::xxh3_64(&two),
        "the test's files must collide"
    );
    (one, two)
}

/// A file changed so that its size and xxh3 checksum stay the same is modified in
/// `diff`, `log` and the report, not "nothing changed" (attacker review).
fn a_change_that_keeps_the_checksum_is_shown(store: &TestStore) {
    let (good, evil) = colliding_files();
    let work = temp_dir();
    let w = work.path().join("w");
    write_file(&w.join("deploy.sh"), &good, 0o755);
    let first = store.put(&w, &[]).0;
    std::thread::sleep(CLOCK_TICK);
    write_file(&w.join("deploy.sh"), &evil, 0o755);
    let second = store.put(&w, &[]).0;
    assert_ne!(first, second);
    let diff = store
        .cmd("diff", [first.as_str(), second.as_str()])
        .success();
    assert_eq!(diff.stdout, "M deploy.sh\n", "{diff}");
    let log = store.cmd("log", [] as [&str; 0]).success();
    assert!(log.lines()[1].contains("+0 ~1 -0"), "{log}");
    let out_root = temp_dir();
    let outdir = out_root.path().join("review");
    report(store, &outdir).success();
    let page = fs::read_to_string(page_of(&outdir, &second)).unwrap();
    assert!(page.contains("<h3>M deploy.sh</h3>"), "{page}");
    assert!(page.contains("0 added, 1 modified"), "{page}");
}

/// A parent that verifies by its digest but is no archive, listed after its child:
/// the child is compared with the turn before it, the parent is shown as FAILED, and
/// the report is written (an attacker review stopped it here).
fn a_parent_that_cannot_be_read_fails_its_child_not_the_report(store: &TestStore) {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&[b'x'; 700]).unwrap();
    let not_a_tar = gz.finish().unwrap();
    let sha = crate::util::sha256_hex(&not_a_tar);
    let size = not_a_tar.len() as u64;
    store.write_object_bytes(&sha, &not_a_tar, Some((&sha, size)));
    let work = temp_dir();
    let w = work.path().join("w");
    write_file(&w.join("a.txt"), b"one\n", 0o644);
    std::thread::sleep(CLOCK_TICK);
    let first = store.put(&w, &[]).0;
    std::thread::sleep(CLOCK_TICK);
    write_file(&w.join("a.txt"), b"two\n", 0o644);
    let child = store.put(&w, &["--parent", &sha]).0;
    // Written again: now the newest, after its child.
    std::thread::sleep(CLOCK_TICK);
    store.write_object_bytes(&sha, &not_a_tar, Some((&sha, size)));

    let out_root = temp_dir();
    let outdir = out_root.path().join("review");
    let out = report(store, &outdir);
    assert_eq!(out.status.code(), Some(1), "{out}");
    assert!(out.stderr.contains("1 FAILED"), "{out}");
    let page = fs::read_to_string(page_of(&outdir, &child)).unwrap();
    assert!(
        page.contains(&format!(
            "the turn before, <a class=\"mono\" href=\"{first}.html\""
        )),
        "{page}"
    );
    assert!(page.contains("<span class=\"add\">+two</span>"), "{page}");
    let parent = fs::read_to_string(page_of(&outdir, &sha)).unwrap();
    assert!(parent.contains("FAILED"), "{parent}");
}

/// A page body is taken from an earlier report only for the pair of checkpoints it
/// was made from (an attacker review had a stopped run leave a body made against
/// another turn under the name a later run reused).
fn a_body_is_reused_only_for_the_pair_it_was_made_for(store: &TestStore) {
    let turns = three_turns(store);
    let out_root = temp_dir();
    let outdir = out_root.path().join("review");
    assert_eq!(counts(&report(store, &outdir).success()), (3, 0));
    // The third turn reported alone is compared with nothing: computed again.
    let alone = report_of(store, &outdir, &[turns.sha(2)]);
    assert_eq!(counts(&alone), (1, 0), "{alone}");
    // All again: the third is compared with the second once more, which the manifest
    // no longer names (it names the lone run's): computed again, the others reused.
    let out = report(store, &outdir).success();
    assert_eq!(counts(&out), (1, 2), "{out}");
    let page = fs::read_to_string(page_of(&outdir, turns.sha(2))).unwrap();
    assert!(page.contains("<h3>A docs/guide.md</h3>"), "{page}");
    assert!(
        !page.contains("<h3>A hello.py</h3>"),
        "not against nothing: {page}"
    );
    // What a run stopped after writing a body and before the manifest leaves: a body
    // of the third turn against nothing. It is not taken for the pair the manifest
    // names, and it is removed.
    let state = outdir.join(".ckptfs-report");
    let stray = state.join(format!("{}.first.html", turns.sha(2)));
    fs::write(&stray, "<p>STRAY BODY</p>").unwrap();
    let out = report(store, &outdir).success();
    assert_eq!(counts(&out), (0, 3), "{out}");
    let page = fs::read_to_string(page_of(&outdir, turns.sha(2))).unwrap();
    assert!(!page.contains("STRAY BODY"), "{page}");
    assert!(!stray.exists());
}

fn report_of(store: &TestStore, outdir: &Path, checkpoints: &[&str]) -> Output {
    let mut args = vec![outdir.as_os_str().to_owned()];
    args.extend(checkpoints.iter().map(std::ffi::OsString::from));
    store.cmd("report", args).success()
}
