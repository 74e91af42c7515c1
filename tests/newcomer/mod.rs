//! What a first-time user ran into, through the real binary: each case gets a short
//! error that says what is wrong and what to do, and nothing is lost or left behind.
//!
//! - S3 failures are one sentence with a hint (no credentials, cannot connect, wrong
//!   secret, no such bucket), with the SDK's detail at `-v` only;
//! - error text names its subject once; a malformed digest and an ambiguous prefix
//!   are said to be so; a closed pipe is not an error;
//! - `mount` refuses a mount point that is a file, missing, not empty or already
//!   mounted; a second signal after a busy unmount detaches the mount;
//! - `.status` says where each verdict comes from, logs each EIO reason once and
//!   counts them;
//! - `-v` gives debug logs for the short commands, and every configuration flag of
//!   `mount --help` names its environment variable.

mod nonroot;

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::mount::{Mount, mount_entry, repo_temp_dir};
use crate::util::tree::make_small_tree;
use crate::util::{Output, TestStore, ckptfs, run, temp_dir};

/// The s3s-fs server `scripts/test.sh` starts; unlike moto it checks signatures.
fn s3s_endpoint() -> String {
    std::env::var("CKPTFS_TEST_S3S_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .expect("CKPTFS_TEST_S3S_ENDPOINT is not set: run scripts/test.sh")
}

/// One line, short, without the SDK's Debug output, and said once.
#[track_caller]
fn assert_human(out: &Output) -> String {
    let line = out.one_line_error().to_owned();
    assert!(line.len() < 400, "{} characters: {out}", line.len());
    for noise in ["DispatchFailure", "ConnectorError", "Some(", "source:"] {
        assert!(!line.contains(noise), "{noise:?} in the error: {out}");
    }
    assert_eq!(line.matches("ckptfs: error:").count(), 1, "{out}");
    line
}

/// A 127.0.0.1 port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn s3_failures_are_one_sentence_with_what_to_do() {
    // A home without ~/.aws.
    let home = temp_dir();
    let without_credentials = || {
        let mut cmd = ckptfs();
        cmd.env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_CONFIG_FILE")
            .env_remove("AWS_SHARED_CREDENTIALS_FILE")
            .env("HOME", home.path());
        cmd
    };
    let out = run(without_credentials().args(["ls", "s3://any-bucket/p"])).failure();
    let line = assert_human(&out);
    for hint in [
        "no AWS credentials found",
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
    ] {
        assert!(line.contains(hint), "{hint:?} missing: {out}");
    }
    let out = run(without_credentials()
        .env("AWS_PROFILE", "no-such-profile")
        .args(["ls", "s3://any-bucket/p"]))
    .failure();
    assert!(
        assert_human(&out).contains("profile \"no-such-profile\""),
        "{out}"
    );

    let port = closed_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let out = run(ckptfs()
        .env("AWS_ENDPOINT_URL", &endpoint)
        .args(["ls", "s3://any-bucket/p"]))
    .failure();
    let line = assert_human(&out);
    assert!(
        line.contains(&format!("cannot connect to {endpoint}")) && line.contains("refused"),
        "{out}"
    );
    // The whole chain of causes is there for whoever asks.
    let out =
        run(ckptfs()
            .env("AWS_ENDPOINT_URL", &endpoint)
            .args(["-v", "ls", "s3://any-bucket/p"]))
        .failure();
    assert!(
        out.stderr.contains("DEBUG") && out.stderr.contains("dispatch failure"),
        "{out}"
    );

    let out = run(ckptfs()
        .env("AWS_ENDPOINT_URL", s3s_endpoint())
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .args(["ls", "s3://any-bucket/p"]))
    .failure();
    let line = assert_human(&out);
    assert!(
        line.contains("SignatureDoesNotMatch") && line.contains("AWS_SECRET_ACCESS_KEY"),
        "{out}"
    );

    let out = run(ckptfs().args(["ls", "s3://ckptfs-no-such-bucket-here/p"])).failure();
    assert!(assert_human(&out).contains("no such bucket"), "{out}");
}

#[test]
fn errors_name_their_subject_once_and_digests_are_checked() {
    let store = TestStore::local();
    let work = temp_dir();
    let dest = work.path().join("dest");

    let out = store.cmd("get", [std::ffi::OsStr::new("zzzz"), dest.as_os_str()]);
    let line = assert_human(&out.failure());
    assert!(line.contains("\"zzzz\" is not a sha256"), "{line}");

    // Two objects whose names share "ab": the prefix is ambiguous, and both are named.
    let (a, b) = (
        format!("ab{}", "0".repeat(62)),
        format!("ab{}", "1".repeat(62)),
    );
    store.write_raw(&TestStore::object_name(&a), b"not checked here");
    store.write_raw(&TestStore::object_name(&b), b"not checked here");
    let out = store.cmd("verify", ["ab"]).failure();
    let line = assert_human(&out);
    assert!(
        line.contains(&a) && line.contains(&b) && line.contains("give more digits"),
        "{out}"
    );
    assert!(!dest.exists());

    let missing = work.path().join("nostore");
    let out = run(ckptfs().arg("ls").arg(&missing)).failure();
    let line = assert_human(&out);
    assert_eq!(line.matches("nostore").count(), 1, "{out}");
    assert!(line.contains("`ckptfs put` creates"), "{out}");

    // A cache directory that is a file: "not a directory", not "File exists".
    let file = work.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let mountpoint = work.path().join("mnt");
    fs::create_dir(&mountpoint).unwrap();
    let out = run(ckptfs()
        .arg("mount")
        .arg(store.url())
        .arg(&mountpoint)
        .arg("--cache-dir")
        .arg(&file))
    .failure();
    let line = assert_human(&out);
    assert!(line.contains("not a directory"), "{out}");
    assert!(!line.contains("File exists"), "{out}");
    assert_eq!(line.matches("a-file").count(), 1, "{out}");
    assert!(mount_entry(&mountpoint).is_none());
}

/// Runs `ckptfs ARGS` with stdout a pipe whose reader is gone.
fn into_closed_pipe(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    ckptfs()
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let store = TestStore::local();
    let work = temp_dir();
    make_small_tree(&work.path().join("ws"), "pipe");
    store.put(&work.path().join("ws"), &[]);
    let url = store.url();
    for args in [
        vec!["man"],
        vec!["completions", "bash"],
        vec!["ls", &url],
        vec!["ls", &url, "--json"],
    ] {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        let out = into_closed_pipe(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{args:?}: {} {stderr}",
            out.status
        );
    }
}

#[test]
fn mount_refuses_a_file_a_missing_or_non_empty_directory_and_a_mount_point() {
    let store = TestStore::local();
    let work = repo_temp_dir("newcomer-mountpoint-");
    make_small_tree(&work.path().join("ws"), "mp");
    let (sha, _) = store.put(&work.path().join("ws"), &[]);
    let file = work.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let full = work.path().join("full");
    fs::create_dir(&full).unwrap();
    fs::write(full.join("keep.txt"), b"mine").unwrap();
    let missing = work.path().join("missing");
    let cases = [
        (&file, "is not a directory"),
        (&full, "is not empty (1 entry)"),
        (&missing, "does not exist"),
    ];
    for (mountpoint, expected) in cases {
        for foreground in [false, true] {
            let mut cmd = ckptfs();
            cmd.arg("mount")
                .arg(store.url())
                .arg(mountpoint)
                .arg("--cache-dir")
                .arg(work.path().join("cache"));
            if foreground {
                cmd.arg("--foreground");
            }
            let out = run(&mut cmd).failure();
            assert!(assert_human(&out).contains(expected), "{out}");
            assert!(mount_entry(mountpoint).is_none(), "{out}");
        }
    }
    assert_eq!(fs::read(full.join("keep.txt")).unwrap(), b"mine");

    let mounted = Mount::new(&store).start();
    let out = run(ckptfs()
        .arg("mount")
        .arg(store.url())
        .arg(mounted.path())
        .arg("--cache-dir")
        .arg(work.path().join("cache-2")))
    .failure();
    let line = assert_human(&out);
    assert!(
        line.contains("is already a mount point") && line.contains("fusermount3 -u"),
        "{out}"
    );
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let shown = mounted.path().to_str().unwrap();
    let stacked = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(shown))
        .count();
    assert_eq!(stacked, 1, "a second mount was stacked:\n{mountinfo}");
    let names: Vec<_> = fs::read_dir(mounted.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.contains(&sha),
        "the first mount still serves: {names:?}"
    );
    mounted.unmount();
}

/// Waits until `what` holds, for up to 10 s.
#[track_caller]
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_signal_detaches_a_busy_mount_and_the_daemon_exits_once_it_is_left() {
    let store = TestStore::local();
    let work = temp_dir();
    make_small_tree(&work.path().join("ws"), "busy");
    store.put(&work.path().join("ws"), &[]);
    let mut mount = Mount::new(&store).start();
    let mut user = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && exec sleep 60")
        .arg(mount.path())
        .spawn()
        .unwrap();
    let cwd = format!("/proc/{}/cwd", user.id());
    wait_for("the process to enter the mount", || {
        fs::read_link(&cwd).is_ok_and(|p| p == mount.path())
    });

    mount.signal(libc::SIGTERM);
    wait_for("the busy unmount to be logged", || {
        mount.log_text().contains("cannot unmount")
    });
    let log = mount.log_text();
    assert!(
        log.contains("fuser -vm") && log.contains("Send the signal again"),
        "the message says what to do:\n{log}"
    );
    assert!(mount.wait_exit(Duration::from_millis(300)).is_none());
    assert!(mount.is_mounted(), "still serving its user");
    assert!(fs::read_dir(mount.path()).is_ok());

    mount.signal(libc::SIGTERM);
    wait_for("the mount to leave the tree", || !mount.is_mounted());
    assert!(
        mount.wait_exit(Duration::from_millis(300)).is_none(),
        "the daemon serves the process still inside the detached mount"
    );
    user.kill().unwrap();
    user.wait().unwrap();
    let status = mount
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the daemon did not exit:\n{}", mount.log_text()));
    assert!(status.success(), "{status}\n{}", mount.log_text());
}

#[test]
fn status_says_where_each_verdict_comes_from() {
    let store = TestStore::local();
    let work = repo_temp_dir("newcomer-provenance-");
    let cache = work.path().join("cache");
    make_small_tree(&work.path().join("ws"), "verdict");
    let (sha, _) = store.put(&work.path().join("ws"), &[]);
    let file = format!("{sha}/note.txt");

    let mount = Mount::new(&store).cache_dir(&cache).start();
    let content = fs::read(mount.join(&file)).unwrap();
    let status = mount.status();
    let verdict = status.verdict(&sha).expect("verified").to_owned();
    assert!(verdict.ends_with(" from the store"), "{}", status.text);
    let verified_at = verdict.split(' ').next().unwrap().to_owned();
    mount.unmount();

    // Damaged in the store after it was cached: the store says so, the cache entry
    // is still served, and .status says it is the cache's verdict, and from when.
    store.write_object_bytes(&sha, b"damaged after the fact", None);
    let verify = store.cmd("verify", [&sha]);
    assert!(verify.stdout.contains("FAILED"), "{verify}");
    let mount = Mount::new(&store).cache_dir(&cache).staging().start();
    assert_eq!(fs::read(mount.join(&file)).unwrap(), content);
    let status = mount.status();
    let verdict = status.verdict(&sha).expect("verified");
    assert!(
        verdict.starts_with(&format!(
            "{verified_at} from the store, served from the cache (re-checked "
        )),
        "{}",
        status.text
    );
    let json = run(ckptfs().arg("status").arg(mount.path()).arg("--json")).success();
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let line = report["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["sha256"] == sha.as_str())
        .unwrap()
        .clone();
    assert_eq!(line["state"], "verified", "{json}");
    assert_eq!(line["from"], "cache", "{json}");
    assert_eq!(line["verified_at"], verified_at.as_str(), "{json}");
    assert!(line["rechecked_at"].is_string(), "{json}");

    // A workspace sealed here is verified by its seal.
    make_small_tree(&mount.staged("turn"), "sealed");
    fs::rename(mount.staged("turn"), mount.committed("turn")).unwrap();
    let sealed = mount.commit_target("turn");
    let status = mount.status();
    assert!(
        status
            .verdict(&sealed)
            .is_some_and(|v| v.ends_with(" when sealed by this mount")),
        "{}",
        status.text
    );
    mount.unmount();
}

#[test]
fn each_eio_reason_is_logged_once_and_counted() {
    let store = TestStore::local();
    let work = temp_dir();
    make_small_tree(&work.path().join("ws"), "eio");
    let (sha, _) = store.put(&work.path().join("ws"), &[]);
    store.write_object_bytes(&sha, b"not the checkpoint", None);
    let mount = Mount::new(&store).start();
    let attempts = 6;
    for i in 0..attempts {
        let err = fs::read_dir(mount.join(&sha)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        if i == attempts / 2 {
            // Past the loader's memory of the failure: a new load fails the same way.
            std::thread::sleep(Duration::from_millis(1200));
        }
    }
    let log = mount.log_text();
    let warned: Vec<_> = log.lines().filter(|l| l.contains("answered EIO")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("checksum mismatch"),
        "{log}"
    );
    let json = run(ckptfs().arg("status").arg(mount.path()).arg("--json")).success();
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert!(
        report["counters"]["io_errors"].as_u64().unwrap() >= attempts,
        "{json}"
    );
    mount.unmount();
}

#[test]
fn short_commands_log_at_debug_level_when_asked() {
    let store = TestStore::local();
    let work = temp_dir();
    make_small_tree(&work.path().join("ws"), "debug");
    let url = store.url();
    let ws = work.path().join("ws");
    let put = run(ckptfs().arg("-v").arg("put").arg(&url).arg(&ws)).success();
    assert!(put.stderr.contains("archived; storing"), "{put}");
    let ls = run(ckptfs().args(["ls", &url]).env("RUST_LOG", "debug")).success();
    assert!(ls.stderr.contains("listed the store"), "{ls}");
    let verify = run(ckptfs().args(["-v", "verify", &url])).success();
    assert!(
        verify.stderr.contains("length and sha256 match"),
        "{verify}"
    );
    let quiet = run(ckptfs().args(["ls", &url])).success();
    assert!(quiet.stderr.is_empty(), "{quiet}");
}

#[test]
fn every_mount_setting_has_an_environment_variable() {
    let help = run(ckptfs().args(["mount", "--help"])).success().stdout;
    let per_invocation = ["--help", "--verbose", "--quiet"];
    let mut options = 0;
    for line in help.lines().map(str::trim_start) {
        let flag = line.trim_start_matches(|c: char| c == '-' || c.is_ascii_alphabetic());
        let is_option =
            line.starts_with("--") || (line.starts_with('-') && flag.starts_with(", --"));
        if !is_option || per_invocation.iter().any(|p| line.contains(p)) {
            continue;
        }
        options += 1;
        assert!(line.contains("[env: "), "no environment variable: {line}");
    }
    assert!(options >= 15, "{options} options found in:\n{help}");
    assert!(
        help.contains("/var/cache/ckptfs"),
        "the default cache dir:\n{help}"
    );
    assert!(
        help.contains("staging/turn-8") && help.contains("commit/"),
        "{help}"
    );
    let mut text = String::new();
    ckptfs()
        .args(["man"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert!(text.contains(".TH ckptfs 1"), "{text}");
}

/// Issue 27, items 1 and 2: `put` asks with HEAD first, whose 403 has no body to say
/// why; and a host whose metadata service refuses is a host without credentials.
#[test]
fn put_and_a_refusing_metadata_service_say_which_credential_is_wrong() {
    let tree = temp_dir();
    fs::write(tree.path().join("a"), "a").unwrap();
    for (variable, value, says) in [
        (
            "AWS_SECRET_ACCESS_KEY",
            "not-the-secret",
            "AWS_SECRET_ACCESS_KEY",
        ),
        ("AWS_ACCESS_KEY_ID", "nobody-knows-me", "AWS_ACCESS_KEY_ID"),
    ] {
        let out = run(ckptfs()
            .env("AWS_ENDPOINT_URL", s3s_endpoint())
            .env(variable, value)
            .arg("put")
            .arg("s3://any-bucket/p")
            .arg(tree.path()))
        .failure();
        let line = assert_human(&out);
        assert!(
            line.contains(says) && !line.contains("HTTP 403 from"),
            "{out}"
        );
    }

    // A metadata service that answers 403 to everything, as on hosts that are not
    // EC2 instances but block the address.
    let imds = TcpListener::bind("127.0.0.1:0").unwrap();
    let imds_endpoint = format!("http://{}", imds.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in imds.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = std::io::Write::write_all(
                &mut stream,
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let home = temp_dir();
    let out = run(ckptfs()
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_EC2_METADATA_DISABLED")
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds_endpoint)
        .env("HOME", home.path())
        .args(["ls", "s3://any-bucket/p"]))
    .failure();
    let line = assert_human(&out);
    assert!(
        line.contains("no AWS credentials found") && line.contains("AWS_ACCESS_KEY_ID"),
        "{out}"
    );
}

/// Each stderr line of `out` is one JSON object; returns their messages.
#[track_caller]
fn json_messages(out: &Output) -> Vec<String> {
    out.stderr
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?} in {out}"));
            value["fields"]["message"].as_str().unwrap_or("").to_owned()
        })
        .collect()
}

/// Issue 27, items 3, 7, 8 and 13: stderr follows `--log-format json`, `-q` and
/// `NO_COLOR`, and a clean unmount logs no warning.
#[test]
fn stderr_follows_the_log_settings_and_a_clean_unmount_is_quiet() {
    let store = TestStore::local();
    let tree = temp_dir();
    make_small_tree(tree.path(), "json");
    let put = |flags: &[&str]| {
        run(ckptfs()
            .args(flags)
            .arg("put")
            .arg(store.url())
            .arg(tree.path()))
        .success()
    };
    let out = put(&["--log-format", "json"]);
    let messages = json_messages(&out);
    assert!(
        messages.iter().any(|m| m.starts_with("stored checkpoint")),
        "{out}"
    );
    let out = put(&["-q"]);
    assert_eq!(out.stderr, "", "{out}");
    let dest = temp_dir();
    let out = run(ckptfs()
        .arg("-q")
        .arg("get")
        .arg(store.url())
        .arg("latest")
        .arg(dest.path().join("x")))
    .success();
    assert_eq!(out.stderr, "", "{out}");

    let out = run(ckptfs()
        .args(["--log-format", "json", "mount"])
        .arg(store.url())
        .arg(dest.path().join("no-such-mount-point")))
    .failure();
    let messages = json_messages(&out);
    assert!(messages.last().unwrap().contains("does not exist"), "{out}");

    let mounted = Mount::new(&store)
        .args(["--log-format", "json"])
        .default_log_level()
        .start();
    fs::read_dir(mounted.path()).unwrap().for_each(drop);
    let log = mounted.log_text();
    mounted.unmount();
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(!line.contains("Some("), "{line}");
        assert_ne!(value["level"], "WARN", "{line}");
    }

    // On a terminal (script(1) gives one), log lines are coloured unless NO_COLOR.
    let on_terminal = |no_color: bool| {
        let command = format!("{} -v ls {}", env!("CARGO_BIN_EXE_ckptfs"), store.url());
        let mut script = Command::new("script");
        script.args(["-qec", &command, "/dev/null"]);
        if no_color {
            script.env("NO_COLOR", "1");
        } else {
            script.env_remove("NO_COLOR");
        }
        run(&mut script).success().stdout
    };
    assert!(on_terminal(false).contains("\x1b["), "no colour at all");
    let plain = on_terminal(true);
    assert!(
        plain.contains("DEBUG") && !plain.contains("\x1b["),
        "{plain:?}"
    );
}

/// Issue 27, items 4, 9 and 10: what a typo or a misread flag used to let through.
#[test]
fn arguments_that_would_be_misread_are_refused() {
    let cwd = temp_dir();
    let tree = temp_dir();
    fs::write(tree.path().join("a"), "a").unwrap();
    let out = run(ckptfs()
        .current_dir(cwd.path())
        .arg("put")
        .arg("s3:/ckpts/proj")
        .arg(tree.path()))
    .failure();
    assert!(assert_human(&out).contains("s3://BUCKET/PREFIX"), "{out}");
    assert_eq!(
        fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "made a directory"
    );

    let store = TestStore::local();
    let random: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(tree.path().join("random"), random).unwrap();
    run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let out = run(ckptfs()
        .args(["verify", "--max-archive-size", "1K"])
        .arg(store.url()))
    .failure();
    assert!(
        out.stdout.contains("FAILED") && out.stdout.contains("1024"),
        "{out}"
    );
    run(ckptfs().arg("verify").arg(store.url())).success();

    let mountpoint = temp_dir();
    let out = run(ckptfs()
        .arg(store.url())
        .arg(mountpoint.path())
        .args(["-o", "ro,bogus_opt=1"]))
    .failure();
    assert!(
        out.stderr.contains("unknown mount option bogus_opt") && out.stderr.contains("cache_dir"),
        "{out}"
    );
}

/// Issue 27, item 14: `--help` prints no environment values (a password may be in
/// `AWS_ENDPOINT_URL`), and a usage error does not show a flag its variable set.
#[test]
fn help_shows_no_environment_values() {
    let endpoint = "http://user:hunter2-secret@127.0.0.1:9";
    let out = run(ckptfs()
        .env("AWS_ENDPOINT_URL", endpoint)
        .args(["put", "--help"]))
    .success();
    assert!(
        out.stdout.contains("[env: AWS_ENDPOINT_URL]") && !out.stdout.contains("hunter2"),
        "{out}"
    );
    let out = run(ckptfs().env("AWS_ENDPOINT_URL", endpoint).arg("put")).failure();
    assert!(
        out.stderr
            .contains("Usage: ckptfs put [OPTIONS] <STORE> <DIR>")
            && !out.stderr.contains("--endpoint-url")
            && !out.stderr.contains("hunter2"),
        "{out}"
    );
}

/// Issue 27, item 15: `get` makes DEST, not its missing parents; `status` of a path
/// that does not exist says so.
#[test]
fn get_makes_only_dest_and_status_says_what_is_missing() {
    let store = TestStore::local();
    let tree = temp_dir();
    make_small_tree(tree.path(), "parents");
    run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let work = temp_dir();
    let dest = work.path().join("no-such-parent/x/y");
    let out = run(ckptfs()
        .arg("get")
        .arg(store.url())
        .arg("latest")
        .arg(&dest))
    .failure();
    assert!(
        assert_human(&out).contains("its parent directory does not exist"),
        "{out}"
    );
    assert!(!work.path().join("no-such-parent").exists(), "made parents");
    run(ckptfs()
        .arg("get")
        .arg(store.url())
        .arg("latest")
        .arg(work.path().join("made")))
    .success();

    let out = run(ckptfs().arg("status").arg(work.path().join("nothing"))).failure();
    assert!(assert_human(&out).contains("does not exist"), "{out}");
}

/// Issue 27, item 5: `log`, `diff` and the other review commands say which checkpoint
/// they are verifying while they download it, on a terminal only, and not with `-q`.
#[test]
fn review_commands_show_what_they_verify_on_a_terminal() {
    let store = TestStore::local();
    let tree = temp_dir();
    make_small_tree(tree.path(), "progress");
    run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let on_terminal = |flags: &str| {
        let command = format!(
            "{} {flags} log {}",
            env!("CARGO_BIN_EXE_ckptfs"),
            store.url()
        );
        run(Command::new("script").args(["-qec", &command, "/dev/null"]))
            .success()
            .stdout
    };
    assert!(
        on_terminal("").contains("verifying checkpoint"),
        "no progress shown"
    );
    assert!(
        !on_terminal("-q").contains("verifying"),
        "progress despite -q"
    );
    let out = run(ckptfs().arg("log").arg(store.url())).success();
    assert_eq!(out.stderr, "", "{out}");
}

/// Issue 27, item 19: the README's first session works pasted as it is, with the
/// binary installed (here: on `PATH`); its `/tmp` and `/mnt` are moved under a
/// temporary directory, and the install line is skipped.
#[test]
fn the_readmes_first_session_runs_as_written() {
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = &readme[readme.find("A first session").expect("the first session")..];
    let block = after
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    let work = repo_temp_dir("readme-");
    let root = work.path().display().to_string();
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("bash scripts/install.sh"))
        .map(|l| {
            l.replace("/tmp/", &format!("{root}/tmp/"))
                .replace("/mnt/", &format!("{root}/mnt/"))
        })
        .map(|l| l + "\n")
        .collect();
    assert!(script.contains("umount"), "{script}");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ckptfs")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let out = run(Command::new("bash")
        .args(["-c", &format!("set -x\n{script}")])
        .env("PATH", path)
        .env("HOME", work.path()))
    .success();
    assert!(
        !out.stderr.contains("error") && !out.stderr.contains("No such"),
        "{out}"
    );
    assert!(out.stdout.contains("+print(\"world\")"), "{out}");
    let turns = out
        .stdout
        .lines()
        .filter(|l| l.contains(" bytes ") && l.contains(" files "))
        .count();
    assert_eq!(turns, 2, "{out}");
    let index = fs::read_to_string(work.path().join("tmp/review/index.html")).unwrap();
    assert!(index.contains("2 verified, none failed"), "{index}");
    assert!(
        mount_entry(&work.path().join("mnt/ckpt")).is_none(),
        "left mounted"
    );
}

/// `diff --patch` on a terminal shows a file's control characters escaped: a hostile
/// turn's file could erase the lines above it and print a fake one (attacker review).
/// Piped, the patch is left as it is, for `git apply`.
#[test]
fn a_patch_on_a_terminal_cannot_drive_it() {
    let store = TestStore::local();
    let tree = temp_dir();
    fs::write(tree.path().join("f"), "a\n").unwrap();
    run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    fs::write(
        tree.path().join("f"),
        "b\r\x1b[2K\x1b[1AM src/harmless.rs\n",
    )
    .unwrap();
    run(ckptfs().arg("put").arg(store.url()).arg(tree.path())).success();
    let command = format!(
        "{} diff {} latest~1 latest --patch",
        env!("CARGO_BIN_EXE_ckptfs"),
        store.url()
    );
    let shown = run(Command::new("script").args(["-qec", &command, "/dev/null"]))
        .success()
        .stdout;
    assert!(
        // (The spinner on stderr uses escapes of its own; the cursor-up is the file's.)
        shown.contains("\\x1b[2K\\x1b[1AM src/harmless.rs") && !shown.contains("\x1b[1A"),
        "{shown:?}"
    );
    let piped = run(ckptfs()
        .arg("diff")
        .arg(store.url())
        .args(["latest~1", "latest", "--patch"]))
    .success();
    assert!(
        piped.stdout.contains("\x1b[2K\x1b[1AM src/harmless.rs"),
        "{piped}"
    );
}
