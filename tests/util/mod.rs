//! Shared helpers for the integration tests.
//!
//! The tests drive the compiled `ckptfs` binary. S3 tests talk to the moto server that
//! `scripts/test.sh` starts and announces in `CKPTFS_TEST_S3_ENDPOINT`; without it they
//! panic (they never pass silently). Local-directory tests need nothing but a temp dir.
//!
//! - [`ckptfs`] / [`run`]: build and run a `ckptfs` command with a time limit.
//! - [`TestStore`]: one store under test (a temp dir or a fresh bucket) with direct
//!   access to its objects, so behavioural tests can run against both kinds.
//! - [`tree`]: build workspace trees with every kind of entry, compare two trees.
//! - [`archive`]: hand-made (hostile) tar.gz archives.
//! - [`proxy`]: TCP proxies in front of the S3 server; one that cuts connections after
//!   a byte budget.
//! - [`mount`]: a real FUSE mount of a store (`ckptfs mount --foreground`), unmounted on
//!   drop, and its `.status`.
//! - [`sys`]: C paths, libc results and errno assertions.

#![allow(dead_code)]

pub mod archive;
pub mod mount;
pub mod proxy;
pub mod sys;
pub mod tree;
pub mod users;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

/// Access key, secret and region used for every request to the test server.
pub const TEST_ACCESS_KEY: &str = "testing";
pub const TEST_SECRET_KEY: &str = "testing";
pub const TEST_REGION: &str = "us-east-1";

/// Longest a single `ckptfs` invocation may take before the test fails.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The moto endpoint started by `scripts/test.sh`. Panics when it is absent, so that S3
/// tests cannot silently pass without a server.
pub fn s3_endpoint() -> String {
    match std::env::var("CKPTFS_TEST_S3_ENDPOINT") {
        Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_string(),
        _ => panic!(
            "CKPTFS_TEST_S3_ENDPOINT is not set: the S3 tests need the local moto server; \
             run scripts/test.sh (it starts the server and sets the variable)"
        ),
    }
}

/// The Python interpreter of the test venv (with boto3), from `CKPTFS_TEST_PYTHON`.
pub fn python() -> Command {
    let python = std::env::var("CKPTFS_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("CKPTFS_TEST_PYTHON is not set: run scripts/test.sh (it creates .venv with boto3)")
    });
    let mut cmd = Command::new(python);
    set_aws_env(&mut cmd);
    cmd
}

/// Path of a helper script in `tests/py/`.
pub fn py_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("py")
        .join(name)
}

fn set_aws_env(cmd: &mut Command) {
    cmd.env("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
        .env("AWS_REGION", TEST_REGION)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_DEFAULT_PROFILE")
        .env_remove("AWS_ENDPOINT_URL_S3");
    match std::env::var("CKPTFS_TEST_S3_ENDPOINT") {
        Ok(url) if !url.is_empty() => cmd.env("AWS_ENDPOINT_URL", url),
        _ => cmd.env_remove("AWS_ENDPOINT_URL"),
    };
}

/// A `ckptfs` command with the test AWS environment (credentials, region and, when the
/// test server is up, `AWS_ENDPOINT_URL`) and no `RUST_LOG`, so stderr holds only what
/// the tool prints by default.
pub fn ckptfs() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ckptfs"));
    set_aws_env(&mut cmd);
    cmd.env_remove("RUST_LOG").stdin(Stdio::null());
    cmd
}

/// What a finished command printed.
pub struct Output {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` exited with {}\n--- stdout ---\n{}--- stderr ---\n{}--------------",
            self.what, self.status, self.stdout, self.stderr
        )
    }
}

impl Output {
    /// Panics (showing everything printed) unless the command exited 0.
    #[track_caller]
    pub fn success(self) -> Self {
        assert!(self.status.success(), "expected success: {self}");
        self
    }

    /// Panics unless the command exited non-zero (and was not killed by a signal).
    #[track_caller]
    pub fn failure(self) -> Self {
        assert!(
            !self.status.success() && self.status.code().is_some(),
            "expected a non-zero exit: {self}"
        );
        self
    }

    /// stdout as non-empty lines.
    pub fn lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Panics unless stderr holds exactly one non-empty line, and returns it.
    #[track_caller]
    pub fn one_line_error(&self) -> &str {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "expected a one-line error on stderr: {self}"
        );
        lines[0]
    }
}

/// Runs `cmd` to completion (killing it after [`COMMAND_TIMEOUT`]) and captures output.
#[track_caller]
pub fn run(cmd: &mut Command) -> Output {
    let what = describe(cmd);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    wait_output(child, what)
}

/// Waits for a child spawned with piped stdout and stderr, with the usual time limit.
#[track_caller]
pub fn wait_output(mut child: std::process::Child, what: String) -> Output {
    let mut out_pipe = child.stdout.take().expect("stdout is piped");
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "`{what}` did not finish within {COMMAND_TIMEOUT:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Output {
        what,
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// A shell-like rendering of a command, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![
        Path::new(cmd.get_program())
            .file_name()
            .unwrap_or(cmd.get_program())
            .to_string_lossy()
            .into_owned(),
    ];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// True when `s` is 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `N` in `KEY=N` of a log line.
pub fn logged_count(text: &str, key: &str) -> u64 {
    let at = text
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in: {text}"));
    text[at + key.len() + 2..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// A name unique within this test run: `PREFIX-<pid>-<counter>-<time>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{nanos:x}", std::process::id())
}

/// A fresh temporary directory.
pub fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("ckptfs-test-")
        .tempdir()
        .expect("create temp dir")
}

// ---------------------------------------------------------------------------------------
// Direct S3 access (for setting up and inspecting objects behind ckptfs's back).

/// A shared multi-threaded runtime for the S3 client; tests call [`block_on`].
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build tokio runtime")
    })
}

/// Runs a future to completion on [`runtime`] from synchronous test code.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// An S3 client for the test server: static test credentials, path-style addressing.
pub fn s3() -> &'static aws_sdk_s3::Client {
    static CLIENT: OnceLock<aws_sdk_s3::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let endpoint = s3_endpoint();
        let _guard = runtime().enter();
        let config = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(TEST_REGION))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new(
                TEST_ACCESS_KEY,
                TEST_SECRET_KEY,
                None,
                None,
                "ckptfs-tests",
            ))
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    })
}

/// Creates a bucket with a unique name on the test server and returns its name.
pub fn new_bucket() -> String {
    let name = unique_name("ckptfs-test");
    block_on(s3().create_bucket().bucket(&name).send())
        .unwrap_or_else(|e| panic!("create bucket {name}: {e:?}"));
    name
}

fn is_not_found<E: aws_sdk_s3::error::ProvideErrorMetadata>(
    err: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> bool {
    if let Some(resp) = err.raw_response()
        && resp.status().as_u16() == 404
    {
        return true;
    }
    matches!(
        err.as_service_error().and_then(|e| e.code()),
        Some("NoSuchKey" | "NotFound")
    )
}

// ---------------------------------------------------------------------------------------
// The store under test.

/// One checkpoint store under test, with direct access to its objects.
pub enum TestStore {
    /// A local directory store.
    Local(TempDir),
    /// `s3://bucket/prefix` on the test server (`prefix` may be empty).
    S3 { bucket: String, prefix: String },
}

/// User metadata of a checkpoint object: `sha256` and `size` when present.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectMeta {
    pub sha256: Option<String>,
    pub size: Option<String>,
    pub captured: Option<String>,
    pub parent: Option<String>,
}

/// The object carries a capture time, and it is of the last minute.
#[track_caller]
pub fn assert_recent_capture_time(meta: &ObjectMeta) {
    let captured = meta
        .captured
        .as_deref()
        .expect("a capture time in the metadata");
    let at = humantime::parse_rfc3339(captured).expect("an RFC 3339 capture time");
    let age = std::time::SystemTime::now()
        .duration_since(at)
        .expect("a capture time in the past");
    assert!(
        age < std::time::Duration::from_secs(60),
        "captured {captured}"
    );
}

impl TestStore {
    /// A fresh, empty local directory store.
    pub fn local() -> Self {
        TestStore::Local(temp_dir())
    }

    /// A fresh bucket on the test server, with a two-level prefix.
    pub fn s3() -> Self {
        Self::s3_with_prefix("team/ckpts")
    }

    /// A fresh bucket on the test server with the given prefix (may be empty).
    pub fn s3_with_prefix(prefix: &str) -> Self {
        TestStore::S3 {
            bucket: new_bucket(),
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    pub fn is_s3(&self) -> bool {
        matches!(self, TestStore::S3 { .. })
    }

    /// The STORE argument for `ckptfs`.
    pub fn url(&self) -> String {
        match self {
            TestStore::Local(dir) => dir.path().to_str().expect("UTF-8 temp path").to_string(),
            TestStore::S3 { bucket, prefix } if prefix.is_empty() => format!("s3://{bucket}"),
            TestStore::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
        }
    }

    /// Object name relative to the store root: `<sha>.tar.gz`.
    pub fn object_name(sha: &str) -> String {
        format!("{sha}.tar.gz")
    }

    /// Full S3 key (or local path, as a string) of a name relative to the store root.
    pub fn key(&self, name: &str) -> String {
        match self {
            TestStore::Local(dir) => dir.path().join(name).display().to_string(),
            TestStore::S3 { prefix, .. } if prefix.is_empty() => name.to_string(),
            TestStore::S3 { prefix, .. } => format!("{prefix}/{name}"),
        }
    }

    fn bucket(&self) -> &str {
        match self {
            TestStore::S3 { bucket, .. } => bucket,
            TestStore::Local(_) => unreachable!("not an S3 store"),
        }
    }

    fn local_path(&self, name: &str) -> PathBuf {
        match self {
            TestStore::Local(dir) => dir.path().join(name),
            TestStore::S3 { .. } => unreachable!("not a local store"),
        }
    }

    /// The bytes of checkpoint `sha`, or `None` when the object does not exist.
    pub fn object_bytes(&self, sha: &str) -> Option<Vec<u8>> {
        self.raw_bytes(&Self::object_name(sha))
    }

    /// The bytes stored under `name` (relative to the store root), if any.
    pub fn raw_bytes(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            TestStore::Local(_) => match fs::read(self.local_path(name)) {
                Ok(bytes) => Some(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => panic!("read {name}: {e}"),
            },
            TestStore::S3 { .. } => {
                let key = self.key(name);
                block_on(async {
                    match s3()
                        .get_object()
                        .bucket(self.bucket())
                        .key(&key)
                        .send()
                        .await
                    {
                        Ok(out) => Some(
                            out.body
                                .collect()
                                .await
                                .expect("read object body")
                                .into_bytes()
                                .to_vec(),
                        ),
                        Err(e) if is_not_found(&e) => None,
                        Err(e) => panic!("get {key}: {e:?}"),
                    }
                })
            }
        }
    }

    /// The `sha256`/`size` metadata of checkpoint `sha` (S3 user metadata, or the local
    /// sidecar), or `None` when the object (or, locally, the sidecar) does not exist.
    pub fn object_meta(&self, sha: &str) -> Option<ObjectMeta> {
        let name = Self::object_name(sha);
        match self {
            TestStore::Local(_) => {
                let text = match fs::read_to_string(self.local_path(&format!("{name}.meta.json"))) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                    Err(e) => panic!("read sidecar of {name}: {e}"),
                };
                let json: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("sidecar of {name} is not JSON ({e}): {text}"));
                let field = |k: &str| {
                    json.get(k).map(|v| match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                };
                Some(ObjectMeta {
                    sha256: field("sha256"),
                    size: field("size"),
                    captured: field("captured"),
                    parent: field("parent"),
                })
            }
            TestStore::S3 { .. } => {
                let key = self.key(&name);
                block_on(async {
                    match s3()
                        .head_object()
                        .bucket(self.bucket())
                        .key(&key)
                        .send()
                        .await
                    {
                        Ok(out) => {
                            let meta = out.metadata().cloned().unwrap_or_default();
                            Some(ObjectMeta {
                                sha256: meta.get("sha256").cloned(),
                                size: meta.get("size").cloned(),
                                captured: meta.get("captured").cloned(),
                                parent: meta.get("parent").cloned(),
                            })
                        }
                        Err(e) if is_not_found(&e) => None,
                        Err(e) => panic!("head {key}: {e:?}"),
                    }
                })
            }
        }
    }

    /// Stores `bytes` as checkpoint `sha`, behind ckptfs's back. `meta` is the
    /// `(sha256, size)` metadata to attach; `None` stores the object without any
    /// (locally: removes the sidecar).
    pub fn write_object_bytes(&self, sha: &str, bytes: &[u8], meta: Option<(&str, u64)>) {
        let name = Self::object_name(sha);
        match self {
            TestStore::Local(_) => {
                fs::write(self.local_path(&name), bytes).expect("write object file");
                let sidecar = self.local_path(&format!("{name}.meta.json"));
                match meta {
                    Some((digest, size)) => fs::write(
                        &sidecar,
                        serde_json::json!({"sha256": digest, "size": size}).to_string(),
                    )
                    .expect("write sidecar"),
                    None => match fs::remove_file(&sidecar) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => panic!("remove sidecar: {e}"),
                    },
                }
            }
            TestStore::S3 { .. } => {
                let key = self.key(&name);
                let mut req = s3()
                    .put_object()
                    .bucket(self.bucket())
                    .key(&key)
                    .body(ByteStream::from(bytes.to_vec()));
                if let Some((digest, size)) = meta {
                    req = req
                        .metadata("sha256", digest)
                        .metadata("size", size.to_string());
                }
                block_on(req.send()).unwrap_or_else(|e| panic!("put {key}: {e:?}"));
            }
        }
    }

    /// Stores an arbitrary (non-checkpoint) object under `name`, relative to the root.
    pub fn write_raw(&self, name: &str, bytes: &[u8]) {
        match self {
            TestStore::Local(_) => {
                let path = self.local_path(name);
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent).expect("create parent dirs");
                }
                fs::write(path, bytes).expect("write raw file");
            }
            TestStore::S3 { .. } => {
                let key = self.key(name);
                block_on(
                    s3().put_object()
                        .bucket(self.bucket())
                        .key(&key)
                        .body(ByteStream::from(bytes.to_vec()))
                        .send(),
                )
                .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
            }
        }
    }

    /// Deletes checkpoint `sha` (locally: the object and its sidecar).
    pub fn delete_object(&self, sha: &str) {
        let name = Self::object_name(sha);
        match self {
            TestStore::Local(_) => {
                for path in [
                    self.local_path(&name),
                    self.local_path(&format!("{name}.meta.json")),
                ] {
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => panic!("remove {}: {e}", path.display()),
                    }
                }
            }
            TestStore::S3 { .. } => {
                let key = self.key(&name);
                block_on(s3().delete_object().bucket(self.bucket()).key(&key).send())
                    .unwrap_or_else(|e| panic!("delete {key}: {e:?}"));
            }
        }
    }

    /// Every name in the store, relative to its root, sorted. Locally this walks the
    /// directory (sub-directories too, as `dir/name`); on S3 it lists the prefix.
    pub fn list_keys(&self) -> Vec<String> {
        match self {
            TestStore::Local(dir) => {
                let mut names = Vec::new();
                list_local(dir.path(), dir.path(), &mut names);
                names.sort();
                names
            }
            TestStore::S3 { prefix, .. } => {
                let list_prefix = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}/")
                };
                let mut names = Vec::new();
                block_on(async {
                    let mut pages = s3()
                        .list_objects_v2()
                        .bucket(self.bucket())
                        .prefix(&list_prefix)
                        .into_paginator()
                        .send();
                    while let Some(page) = pages.next().await {
                        let page = page.expect("list objects");
                        for obj in page.contents() {
                            let key = obj.key().unwrap_or_default();
                            names.push(key[list_prefix.len()..].to_string());
                        }
                    }
                });
                names.sort();
                names
            }
        }
    }

    /// What changes when checkpoint `sha`'s object is stored anew, but not when a
    /// capture of the same content refreshes its time and metadata in place (see
    /// `store_archive`): the local file's inode (a put links or renames a new file
    /// in), the S3 ETag (a copy onto itself keeps the MD5 of the same bytes; a
    /// re-upload of the same bytes would too, so S3 callers also check what `put`
    /// says it did).
    pub fn object_stamp(&self, sha: &str) -> String {
        let name = Self::object_name(sha);
        match self {
            TestStore::Local(_) => {
                use std::os::unix::fs::MetadataExt;
                let md = fs::metadata(self.local_path(&name)).expect("stat object");
                format!("ino={}", md.ino())
            }
            TestStore::S3 { .. } => format!("etag={:?}", self.head(&name).e_tag()),
        }
    }

    /// S3 ETag of checkpoint `sha`, without quotes.
    pub fn etag(&self, sha: &str) -> String {
        let out = self.head(&Self::object_name(sha));
        out.e_tag()
            .unwrap_or_default()
            .trim_matches('"')
            .to_string()
    }

    fn head(&self, name: &str) -> aws_sdk_s3::operation::head_object::HeadObjectOutput {
        let key = self.key(name);
        block_on(s3().head_object().bucket(self.bucket()).key(&key).send())
            .unwrap_or_else(|e| panic!("head {key}: {e:?}"))
    }

    /// Multipart uploads in progress in the bucket (`key upload-id`); empty locally.
    pub fn multipart_uploads(&self) -> Vec<String> {
        match self {
            TestStore::Local(_) => Vec::new(),
            TestStore::S3 { bucket, .. } => {
                let out = block_on(s3().list_multipart_uploads().bucket(bucket).send())
                    .expect("list multipart uploads");
                out.uploads()
                    .iter()
                    .map(|u| {
                        format!(
                            "{} {}",
                            u.key().unwrap_or_default(),
                            u.upload_id().unwrap_or_default()
                        )
                    })
                    .collect()
            }
        }
    }

    /// `ckptfs put STORE DIR [extra...]`, expected to succeed; returns `(sha, size)` as
    /// printed (checking the one-line `<sha256> <size>` format).
    #[track_caller]
    pub fn put(&self, dir: &Path, extra: &[&str]) -> (String, u64) {
        let out = run(ckptfs().arg("put").arg(self.url()).arg(dir).args(extra)).success();
        parse_put_output(&out)
    }

    /// `ckptfs get STORE ID DEST`, expected to succeed.
    #[track_caller]
    pub fn get(&self, id: &str, dest: &Path) -> Output {
        run(ckptfs().arg("get").arg(self.url()).arg(id).arg(dest)).success()
    }

    /// `ckptfs <sub> STORE args...`, whatever its exit status.
    pub fn cmd<I, S>(&self, sub: &str, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(ckptfs().arg(sub).arg(self.url()).args(args))
    }
}

fn list_local(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).expect("read store dir") {
        let entry = entry.expect("read store dir entry");
        let path = entry.path();
        if entry.file_type().expect("file type").is_dir() {
            list_local(root, &path, out);
        } else {
            out.push(
                path.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
}

/// Parses `put` output: exactly one line `<sha256> <size>`.
#[track_caller]
pub fn parse_put_output(out: &Output) -> (String, u64) {
    let lines = out.lines();
    assert_eq!(
        lines.len(),
        1,
        "put must print exactly one line `<sha256> <size>`: {out}"
    );
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert!(
        fields.len() == 2 && is_sha256_hex(fields[0]),
        "put must print `<sha256> <size>`: {out}"
    );
    let size = fields[1]
        .parse()
        .unwrap_or_else(|_| panic!("put printed a bad size: {out}"));
    (fields[0].to_string(), size)
}

/// Parses `verify` output into `sha -> verdict` (`ok` or the text after `FAILED: `).
#[track_caller]
pub fn parse_verify_output(out: &Output) -> BTreeMap<String, String> {
    let mut verdicts = BTreeMap::new();
    for line in out.lines() {
        let (sha, rest) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("bad verify line {line:?}: {out}"));
        assert!(is_sha256_hex(sha), "bad verify line {line:?}: {out}");
        let verdict = if rest == "ok" {
            "ok".to_string()
        } else if let Some(msg) = rest.strip_prefix("FAILED: ") {
            msg.to_string()
        } else {
            panic!("verify line is neither `<sha> ok` nor `<sha> FAILED: ...`: {line:?}\n{out}")
        };
        let previous = verdicts.insert(sha.to_string(), verdict);
        assert!(previous.is_none(), "verify reported {sha} twice: {out}");
    }
    verdicts
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time (`YYYY-MM-DDTHH:MM:SS[.frac]Z`),
/// or `None` when `s` is not in that form.
pub fn parse_rfc3339_utc(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || *b.last()? != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let frac = &s[19..s.len() - 1];
    if !(frac.is_empty()
        || (frac.len() > 1
            && frac.starts_with('.')
            && frac[1..].bytes().all(|c| c.is_ascii_digit())))
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + min * 60 + sec)
}

/// Now, in seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn rfc3339_parser_knows_the_epoch() {
    assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
        parse_rfc3339_utc("2026-11-29T07:08:00Z"),
        Some(1_795_936_080)
    );
    assert_eq!(
        parse_rfc3339_utc("2026-11-29T07:08:00.250Z"),
        Some(1_795_936_080)
    );
    assert_eq!(parse_rfc3339_utc("2026-11-29 07:08:00Z"), None);
    assert_eq!(parse_rfc3339_utc("2026-11-29T07:08:00+00:00"), None);
}

/// A tmpfs mounted at a new directory `dir` with the mount `options` (`size=1m,...`),
/// unmounted when dropped: a small disk for tests of a full one.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    #[track_caller]
    pub fn mount(dir: &Path, options: &str) -> SmallDisk {
        std::fs::create_dir(dir).expect("create the small disk's mount point");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "ckptfs-test"])
            .arg(dir))
        .success();
        SmallDisk(dir.to_owned())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
