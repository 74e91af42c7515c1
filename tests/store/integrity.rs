//! What the store keeps is good, and nothing it holds can make ckptfs misbehave:
//! uploads carry a checksum the server checks (against s3s-fs, which checks; moto does
//! not); an object found under a checkpoint's name counts as already present only once
//! verified, and a damaged one is replaced; a local store's odd entries (symlinks and
//! FIFOs under object or sidecar names, stale temporaries) are refused or cleaned, never
//! followed or waited on; credentials in an endpoint URL never reach the output.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

use crate::util::proxy::CorruptingProxy;
use crate::util::tree::{make_random_tree, make_sample_tree, make_turn_tree};
use crate::util::{
    TEST_ACCESS_KEY, TEST_REGION, TEST_SECRET_KEY, TestStore, block_on, ckptfs, logged_count,
    parse_put_output, run, s3_endpoint, sha256_hex, temp_dir, unique_name,
};

/// The s3s-fs server `scripts/test.sh` starts: it refuses a body whose
/// `x-amz-checksum-sha256` does not match (moto stores it anyway).
fn s3s_endpoint() -> String {
    match std::env::var("CKPTFS_TEST_S3S_ENDPOINT") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "CKPTFS_TEST_S3S_ENDPOINT is not set: the checksum tests need s3s-fs; run scripts/test.sh"
        ),
    }
}

fn s3s_client() -> aws_sdk_s3::Client {
    let _guard = crate::util::runtime().enter();
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(TEST_REGION))
        .endpoint_url(s3s_endpoint())
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
}

fn s3s_keys(client: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let listed = block_on(client.list_objects_v2().bucket(bucket).send()).expect("list s3s-fs");
    listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect()
}

/// `ckptfs put` of `dir` to `s3://bucket/ckpt` through `endpoint`.
fn put_via(endpoint: &str, bucket: &str, dir: &Path, extra: &[&str]) -> crate::util::Output {
    run(ckptfs()
        .env("AWS_ENDPOINT_URL", endpoint)
        .arg("put")
        .arg(format!("s3://{bucket}/ckpt"))
        .arg(dir)
        .args(extra))
}

#[test]
fn s3s_a_body_damaged_in_transit_is_refused_and_nothing_is_stored() {
    let client = s3s_client();
    let bucket = unique_name("ckptfs-s3s");
    block_on(client.create_bucket().bucket(&bucket).send()).expect("create bucket on s3s-fs");
    let work = temp_dir();
    // One object of ~1.5 MiB (a single PUT), one of ~12 MiB (multipart, 5 MiB parts).
    for (name, size, extra) in [
        ("single", 3 << 19, &[][..]),
        ("multipart", 12 << 20, &["--part-size", "5MiB"][..]),
    ] {
        let src = work.path().join(name);
        make_random_tree(&src, size, 3);
        // Byte 1,000,000 of each connection is well inside a body (headers are ~1 KiB).
        let proxy = CorruptingProxy::start(&s3s_endpoint(), 1_000_000);
        let out = put_via(&proxy.endpoint(), &bucket, &src, extra).failure();
        let error = out.one_line_error();
        assert!(
            error.contains("BadDigest") || error.contains("checksum"),
            "{name}: the error must say the server refused the checksum: {out}"
        );
        assert!(proxy.bytes_flipped() >= 1, "{name}: nothing was damaged");
        assert!(
            s3s_keys(&client, &bucket).is_empty(),
            "{name}: a refused upload left an object"
        );
        // The same put, undamaged, is stored, and is what was captured.
        let out = put_via(&s3s_endpoint(), &bucket, &src, extra).success();
        let (sha, _) = parse_put_output(&out);
        let key = format!("ckpt/{sha}.tar.gz");
        assert_eq!(s3s_keys(&client, &bucket), vec![key.clone()], "{name}");
        let object = block_on(client.get_object().bucket(&bucket).key(&key).send())
            .expect("get the stored object");
        let bytes = block_on(object.body.collect())
            .expect("read it")
            .into_bytes();
        assert_eq!(
            sha256_hex(&bytes),
            sha,
            "{name}: the stored object is damaged"
        );
        block_on(client.delete_object().bucket(&bucket).key(&key).send()).expect("delete");
    }
}

fn put_replaces_a_damaged_object_of_its_name(store: &TestStore) {
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (sha, size) = store.put(&src, &[]);
    // Someone plants garbage (with matching metadata) under the predictable name.
    let garbage = vec![0x42u8; size as usize];
    store.write_object_bytes(&sha, &garbage, Some((&sha, size)));
    let out = store.cmd("put", [src.as_os_str()]).success();
    assert!(
        out.stderr.contains("replacing a damaged copy") && out.stderr.contains("checksum mismatch"),
        "put must say it replaced a damaged object: {out}"
    );
    assert_eq!(sha256_hex(&store.object_bytes(&sha).unwrap()), sha);
    let out = store.cmd("verify", [&sha]).success();
    assert_eq!(out.lines(), vec![format!("{sha} ok")], "{out}");
    // A good object is left alone, and said to be verified.
    let stamp = store.object_stamp(&sha);
    let out = store.cmd("put", [src.as_os_str()]).success();
    assert!(
        out.stderr.contains("already present") && out.stderr.contains("verified"),
        "{out}"
    );
    assert_eq!(
        store.object_stamp(&sha),
        stamp,
        "a good object was rewritten"
    );
}

#[test]
fn local_put_replaces_a_damaged_object_of_its_name() {
    put_replaces_a_damaged_object_of_its_name(&TestStore::local());
}

#[test]
fn s3_put_replaces_a_damaged_object_of_its_name() {
    put_replaces_a_damaged_object_of_its_name(&TestStore::s3());
}

#[test]
fn local_store_refuses_symlinks_and_fifos_under_object_names() {
    let store = TestStore::local();
    let dir = Path::new(&store.url()).to_owned();
    let work = temp_dir();
    let secret = work.path().join("secret");
    fs::write(&secret, b"not a checkpoint").unwrap();
    let link_sha = sha256_hex(b"symlinked");
    symlink(&secret, dir.join(format!("{link_sha}.tar.gz"))).unwrap();
    let fifo_sha = sha256_hex(b"fifo");
    let fifo = crate::util::sys::c_path(&dir.join(format!("{fifo_sha}.tar.gz")));
    // SAFETY: the path is NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    // A good checkpoint whose sidecar is a FIFO: the sidecar is ignored, not waited on.
    let src = work.path().join("src");
    make_sample_tree(&src);
    let (good, _) = store.put(&src, &[]);
    let sidecar = dir.join(format!("{good}.tar.gz.meta.json"));
    fs::remove_file(&sidecar).unwrap();
    let sidecar = crate::util::sys::c_path(&sidecar);
    // SAFETY: the path is NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(sidecar.as_ptr(), 0o644) }, 0);

    for sha in [&link_sha, &fifo_sha] {
        let out = store.cmd("verify", [sha]).failure();
        assert!(out.stdout.contains("FAILED"), "{out}");
        let dest = work.path().join(format!("dest-{}", &sha[..8]));
        let out = store
            .cmd("get", [sha.as_str(), dest.to_str().unwrap()])
            .failure();
        assert!(
            out.one_line_error().contains("not a regular file") || out.stderr.contains("symbolic"),
            "{out}"
        );
        assert!(!dest.exists() || fs::read_dir(&dest).unwrap().next().is_none());
    }
    // `ls` lists neither: they are not regular files.
    let out = store.cmd("ls", std::iter::empty::<&str>()).success();
    assert_eq!(out.lines().len(), 1, "{out}");
    let out = store.cmd("verify", [&good]).success();
    assert_eq!(out.lines(), vec![format!("{good} ok")], "{out}");
    assert_eq!(fs::read(&secret).unwrap(), b"not a checkpoint");
}

#[test]
fn local_put_removes_stale_temporaries_and_keeps_fresh_ones() {
    let store = TestStore::local();
    let dir = Path::new(&store.url()).to_owned();
    let stale = dir.join(".tmp-crashed");
    let fresh = dir.join(".tmp-in-progress");
    fs::write(&stale, b"half an upload").unwrap();
    fs::write(&fresh, b"another writer's upload").unwrap();
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let work = temp_dir();
    let src = work.path().join("src");
    make_sample_tree(&src);
    store.put(&src, &[]);
    assert!(
        !stale.exists(),
        "a temporary file older than an hour must be removed"
    );
    assert!(
        fresh.exists(),
        "a recent temporary file may belong to a put in progress"
    );
}

#[test]
fn reading_commands_refuse_a_store_directory_that_does_not_exist() {
    let work = temp_dir();
    let missing = work.path().join("nostore");
    for args in [vec!["ls"], vec!["verify"], vec!["get", "0a9686a9", "dest"]] {
        let out = run(ckptfs().args(&args[..1]).arg(&missing).args(&args[1..])).failure();
        assert!(out.one_line_error().contains("nostore"), "{out}");
        assert!(
            !missing.exists(),
            "`{}` created the store directory",
            args[0]
        );
    }
    let src = work.path().join("src");
    make_sample_tree(&src);
    let out = run(ckptfs().arg("put").arg(&missing).arg(&src)).success();
    assert!(out.stderr.contains("created the store directory"), "{out}");
}

#[test]
fn credentials_in_an_endpoint_url_never_reach_the_output() {
    let store = TestStore::s3();
    let with_password = s3_endpoint().replacen("://", "://user:Sup3rS3cretPassw0rd@", 1);
    let out = run(ckptfs()
        .env("AWS_ENDPOINT_URL", &with_password)
        .env("RUST_LOG", "debug")
        .arg("ls")
        .arg(store.url()))
    .success();
    assert!(
        !out.stderr.contains("Sup3rS3cret") && !out.stdout.contains("Sup3rS3cret"),
        "{out}"
    );
    // An endpoint that cannot be reached: the error names it without the password.
    let out = run(ckptfs()
        .env(
            "AWS_ENDPOINT_URL",
            "http://user:Sup3rS3cretPassw0rd@127.0.0.1:9",
        )
        .env("RUST_LOG", "debug")
        .arg("ls")
        .arg(store.url()))
    .failure();
    assert!(!out.stderr.contains("Sup3rS3cret"), "{out}");
}

/// Server-side copy against a server that checks credentials and checksums: the
/// second turn copies what did not change, and the object is exactly what was
/// captured.
#[test]
fn s3s_a_turn_copies_unchanged_ranges_and_the_object_is_right() {
    let client = s3s_client();
    let bucket = unique_name("ckptfs-s3s");
    block_on(client.create_bucket().bucket(&bucket).send()).expect("create bucket on s3s-fs");
    let work = temp_dir();
    let cache = work.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    let extra = ["-v", "--part-size", "5MiB", "--cache-dir", cache_arg];
    let first = work.path().join("first");
    make_turn_tree(&first, 40, None);
    put_via(&s3s_endpoint(), &bucket, &first, &extra).success();
    let second = work.path().join("second");
    make_turn_tree(&second, 40, Some(5));
    let out = put_via(&s3s_endpoint(), &bucket, &second, &extra).success();
    let (sha, size) = parse_put_output(&out);
    assert!(logged_count(&out.stderr, "copied") >= 5 << 20, "{out}");
    assert_eq!(
        logged_count(&out.stderr, "sent") + logged_count(&out.stderr, "copied"),
        size
    );
    let key = format!("ckpt/{sha}.tar.gz");
    let object = block_on(client.get_object().bucket(&bucket).key(&key).send())
        .expect("get the stored object");
    let bytes = block_on(object.body.collect())
        .expect("read it")
        .into_bytes();
    assert_eq!(sha256_hex(&bytes), sha);
}
