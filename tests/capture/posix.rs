//! `staging/` behaves like a local POSIX directory: a randomized fsx-style run against
//! an in-memory model, the usual edge cases, and the tools that build workspaces.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use ckptfs::cache::read_at;

use super::{cp_a, sh};
use crate::util::mount::{Mount, MountedStore, repo_temp_dir};
use crate::util::sys::{assert_errno, c_path, libc_result};
use crate::util::tree::{assert_same_tree, make_sample_tree, make_small_tree, random_bytes};
use crate::util::{TestStore, run};

/// xorshift64*: a fixed seed gives the same run every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn mount() -> (TestStore, MountedStore) {
    let store = TestStore::s3();
    let mount = Mount::new(&store).staging().start();
    (store, mount)
}

/// Staging holds a descriptor per directory, not per file: a workspace with many more
/// files than the daemon may open still copies in and seals.
#[test]
fn a_workspace_larger_than_the_open_file_limit_fills_staging() {
    let store = TestStore::s3();
    let mount = Mount::new(&store).staging().open_file_limit(256).start();
    let work = repo_temp_dir("capture-many-");
    let src = work.path().join("src");
    for dir in 0..20 {
        let dir_path = src.join(format!("d{dir:02}"));
        fs::create_dir_all(&dir_path).unwrap();
        for file in 0..50 {
            fs::write(
                dir_path.join(format!("f{file:02}")),
                format!("{dir}/{file}"),
            )
            .unwrap();
        }
    }
    let staged = mount.staged("many");
    fs::create_dir(&staged).unwrap();
    cp_a(&src.join("."), &staged);
    assert_same_tree(&src, &staged);
    fs::rename(&staged, mount.committed("many"))
        .unwrap_or_else(|e| panic!("seal 1,000 files: {e}\n{}", mount.log_excerpt()));
    assert_same_tree(&src, &mount.join(mount.commit_target("many")));
}

#[test]
fn fsx_random_io_on_a_staged_file_matches_a_model() {
    const OPS: usize = 4000;
    const MAX_LEN: u64 = 256 * 1024;
    const MAX_IO: u64 = 16 * 1024;
    let (_store, mount) = mount();
    let dir = mount.staged("fsx");
    fs::create_dir(&dir).expect("mkdir staging/fsx");
    let path = dir.join("file");
    let open = |truncate: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(truncate)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    };

    let mut rng = Rng(0x5eed_f5c0_ffee_1234);
    let mut model: Vec<u8> = Vec::new();
    let mut file: Option<File> = None;
    // The last operations, shown when the model and the file disagree.
    let mut history: Vec<String> = Vec::new();
    let mut opens = 0;
    for step in 0..OPS {
        if history.len() > 30 {
            history.remove(0);
        }
        let f = file.get_or_insert_with(|| {
            opens += 1;
            open(false)
        });
        let context =
            |history: &[String]| format!("step {step}; last operations:\n{}", history.join("\n"));
        match rng.below(100) {
            0..=29 => {
                let len = 1 + rng.below(MAX_IO);
                let offset = rng.below((model.len() as u64 + MAX_IO).min(MAX_LEN - len));
                let data = random_bytes(len as usize, rng.next());
                history.push(format!("write {len} at {offset} (size {})", model.len()));
                f.write_all_at(&data, offset)
                    .unwrap_or_else(|e| panic!("write: {e}; {}", context(&history)));
                let end = (offset + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(&data);
            }
            30..=39 if (model.len() as u64) < MAX_LEN => {
                // One descriptor at a time: concurrent opens are checked on their own.
                file = None;
                let len = 1 + rng.below(MAX_IO.min(MAX_LEN - model.len() as u64));
                let data = random_bytes(len as usize, rng.next());
                history.push(format!("close; append {len} (size {})", model.len()));
                let mut appender = OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap_or_else(|e| panic!("open O_APPEND: {e}; {}", context(&history)));
                appender
                    .write_all(&data)
                    .unwrap_or_else(|e| panic!("append: {e}; {}", context(&history)));
                model.extend_from_slice(&data);
            }
            40..=49 => {
                let len = rng.below(MAX_LEN + 1);
                history.push(format!("truncate to {len} (size {})", model.len()));
                f.set_len(len)
                    .unwrap_or_else(|e| panic!("truncate: {e}; {}", context(&history)));
                model.resize(len as usize, 0);
            }
            50..=84 => {
                let len = 1 + rng.below(MAX_IO);
                let offset = rng.below(model.len() as u64 + MAX_IO);
                history.push(format!("read {len} at {offset} (size {})", model.len()));
                let got = read_at(f, offset, len as usize)
                    .unwrap_or_else(|e| panic!("read: {e}; {}", context(&history)));
                let start = (offset as usize).min(model.len());
                let end = (offset + len).min(model.len() as u64) as usize;
                let expected = &model[start..end];
                assert!(
                    got == expected,
                    "read {len} at {offset} returned {} bytes that differ from the model's {}; {}",
                    got.len(),
                    expected.len(),
                    context(&history)
                );
            }
            85..=92 => {
                history.push(format!("stat (size {})", model.len()));
                let by_fd = f.metadata().expect("fstat").len();
                let by_path = fs::metadata(&path).expect("stat").len();
                assert_eq!(
                    (by_fd, by_path),
                    (model.len() as u64, model.len() as u64),
                    "size by fd and by path; {}",
                    context(&history)
                );
            }
            93..=94 => {
                history.push("reopen with O_TRUNC".into());
                drop(file.take()); // one descriptor at a time
                file = Some(open(true));
                opens += 1;
                model.clear();
            }
            _ => {
                history.push("close".into());
                file = None;
            }
        }
    }
    drop(file);
    assert!(opens > 50, "the run should reopen the file often ({opens})");
    let contents = fs::read(&path).expect("read the file back");
    assert!(contents == model, "final contents differ from the model");
    let backing = fs::read(mount.staging_dir().join("fsx/file")).expect("read the backing file");
    assert!(backing == model, "the backing file differs from the model");
}

#[test]
fn staging_behaves_like_a_local_directory() {
    let (_store, mount) = mount();
    let base = mount.staged("posix");
    fs::create_dir(&base).expect("mkdir staging/posix");
    let p = |rel: &str| base.join(rel);

    // rename: a file over a file.
    fs::write(p("a"), b"from a").unwrap();
    fs::write(p("b"), b"from b").unwrap();
    let b_before = fs::File::open(p("b")).unwrap();
    fs::rename(p("a"), p("b")).expect("rename a file over a file");
    assert_eq!(fs::read(p("b")).unwrap(), b"from a");
    assert!(!p("a").exists());
    let mut old = String::new();
    (&b_before).read_to_string(&mut old).unwrap();
    assert_eq!(old, "from b", "an open file keeps the replaced contents");

    // rename: a directory into another directory, and over an empty directory.
    fs::create_dir_all(p("d1/sub")).unwrap();
    fs::write(p("d1/sub/file"), b"moved").unwrap();
    fs::create_dir(p("d2")).unwrap();
    fs::rename(p("d1/sub"), p("d2/sub")).expect("rename a dir into a dir");
    assert_eq!(fs::read(p("d2/sub/file")).unwrap(), b"moved");
    assert_eq!(fs::read_dir(p("d1")).unwrap().count(), 0);
    fs::rename(p("d2/sub"), p("d1")).expect("rename a dir over an empty dir");
    assert_eq!(fs::read(p("d1/file")).unwrap(), b"moved");
    fs::create_dir(p("d3")).unwrap();
    assert_errno(
        "rename a dir over a non-empty dir",
        fs::rename(p("d3"), p("d1")),
        libc::ENOTEMPTY,
    );
    assert!(p("d3").is_dir() && p("d1/file").is_file());

    // rmdir of a non-empty directory.
    assert_errno(
        "rmdir a non-empty dir",
        fs::remove_dir(p("d1")),
        libc::ENOTEMPTY,
    );
    fs::remove_dir(p("d3")).expect("rmdir an empty dir");

    // Hard links: one inode, link counts follow.
    fs::write(p("f"), b"linked").unwrap();
    assert_eq!(fs::metadata(p("f")).unwrap().nlink(), 1);
    fs::hard_link(p("f"), p("g")).expect("link");
    let (f, g) = (fs::metadata(p("f")).unwrap(), fs::metadata(p("g")).unwrap());
    assert_eq!((f.nlink(), g.nlink()), (2, 2));
    assert_eq!(f.ino(), g.ino(), "hard links share an inode");
    fs::write(p("g"), b"changed through g").unwrap();
    assert_eq!(fs::read(p("f")).unwrap(), b"changed through g");
    fs::create_dir(p("other")).unwrap();
    fs::hard_link(p("f"), p("other/h")).expect("link into another dir");
    assert_eq!(fs::metadata(p("f")).unwrap().nlink(), 3);
    fs::remove_file(p("g")).unwrap();
    fs::remove_file(p("other/h")).unwrap();
    assert_eq!(fs::metadata(p("f")).unwrap().nlink(), 1);

    // chmod and utimens show in stat.
    fs::set_permissions(p("f"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(p("f")).unwrap().mode() & 0o7777, 0o640);
    fs::set_permissions(p("other"), fs::Permissions::from_mode(0o710)).unwrap();
    assert_eq!(fs::metadata(p("other")).unwrap().mode() & 0o7777, 0o710);
    let times = [
        libc::timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 250_000_000,
        },
    ];
    // SAFETY: the path is NUL-terminated and `times` holds two timespecs.
    libc_result(unsafe {
        libc::utimensat(libc::AT_FDCWD, c_path(&p("f")).as_ptr(), times.as_ptr(), 0)
    })
    .expect("utimensat");
    let md = fs::metadata(p("f")).unwrap();
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        (1_500_000_000, 250_000_000),
        "mtime"
    );
    // Checked before anything reads `f`: like the local disk behind staging (relatime),
    // a later read may move an atime this old to now.
    assert_eq!(
        md.atime(),
        1_600_000_000,
        "utimensat's atime does not show in stat"
    );

    // Symlinks.
    std::os::unix::fs::symlink("f", p("to-f")).unwrap();
    std::os::unix::fs::symlink("no/such/target", p("dangling")).unwrap();
    assert_eq!(fs::read_link(p("to-f")).unwrap(), Path::new("f"));
    assert_eq!(
        fs::read_link(p("dangling")).unwrap(),
        Path::new("no/such/target")
    );
    assert!(
        fs::symlink_metadata(p("dangling"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(fs::read(p("to-f")).unwrap(), b"changed through g");

    // An unlinked file stays readable (and writable) through an open descriptor.
    fs::write(p("doomed"), b"still here").unwrap();
    let mut open = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("doomed"))
        .unwrap();
    fs::remove_file(p("doomed")).unwrap();
    assert!(fs::symlink_metadata(p("doomed")).is_err());
    let mut text = String::new();
    open.read_to_string(&mut text).unwrap();
    assert_eq!(text, "still here");
    open.write_all(b", and more").unwrap();
    open.seek(SeekFrom::Start(0)).unwrap();
    text.clear();
    open.read_to_string(&mut text).unwrap();
    assert_eq!(text, "still here, and more");
    assert_eq!(open.metadata().unwrap().nlink(), 0);
    drop(open);

    // O_EXCL.
    assert_errno(
        "O_CREAT|O_EXCL of an existing file",
        OpenOptions::new().write(true).create_new(true).open(p("f")),
        libc::EEXIST,
    );
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p("fresh"))
        .expect("O_CREAT|O_EXCL of a new name");

    // mkdir -p, deep.
    let deep: Vec<String> = (0..40).map(|i| format!("level{i}")).collect();
    let deep = deep.join("/");
    let out = sh(r#"cd "$1" && mkdir -p "$2""#, &[&base, Path::new(&deep)]);
    assert!(out.status.success(), "{out}");
    fs::write(base.join(&deep).join("bottom.txt"), b"deep").unwrap();
    assert_eq!(
        fs::read(base.join(&deep).join("bottom.txt")).unwrap(),
        b"deep"
    );

    // Write a temporary file, then rename it over the target (how git and editors save).
    fs::write(p("config"), b"version 0").unwrap();
    for i in 1..=20 {
        let mut tmp = File::create(p("config.lock")).unwrap();
        tmp.write_all(format!("version {i}").as_bytes()).unwrap();
        tmp.sync_all().unwrap();
        drop(tmp);
        fs::rename(p("config.lock"), p("config")).unwrap();
        assert_eq!(
            fs::read_to_string(p("config")).unwrap(),
            format!("version {i}")
        );
    }
    assert!(!p("config.lock").exists());

    // FIFOs and sockets can be made (tools make them in workspaces; seals skip them);
    // device files are refused; extended attributes are "not supported".
    // SAFETY: the path is NUL-terminated.
    let fifo = libc_result(unsafe { libc::mkfifo(c_path(&p("fifo")).as_ptr(), 0o644) });
    fifo.expect("mkfifo in staging");
    assert!(
        fs::symlink_metadata(p("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    let socket = std::os::unix::net::UnixListener::bind(p("socket")).expect("bind a socket");
    assert!(
        fs::symlink_metadata(p("socket"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    drop(socket);
    // SAFETY: the path is NUL-terminated; makedev has no preconditions.
    let device = libc_result(unsafe {
        libc::mknod(
            c_path(&p("null")).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    });
    assert_errno("mknod of a device", device, libc::EPERM);
    fs::remove_file(p("fifo")).unwrap();
    fs::remove_file(p("socket")).unwrap();
    let (name, value) = (c"user.test", b"v");
    // SAFETY: the path and name are NUL-terminated; value points to value.len() bytes.
    let set = libc_result(unsafe {
        libc::setxattr(
            c_path(&p("f")).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    });
    assert_errno("setxattr", set, libc::ENOTSUP);
}

#[test]
fn a_file_can_be_open_several_times_at_once() {
    let (_store, mount) = mount();
    fs::create_dir(mount.staged("shared")).expect("mkdir staging/shared");
    let path = &mount.staged("shared/file");
    // Two readers, a writer and an appender at once, as editors, build tools and git do.
    fs::write(path, b"0123456789").unwrap();
    let first = File::open(path).expect("open a staged file");
    let second = File::open(path).expect("open a staged file a second time for reading");
    let writer = OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open a staged file for writing while it is open for reading");
    let mut appender = OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open a staged file for appending while it is open");
    writer.write_all_at(b"ab", 0).unwrap();
    appender.write_all(b"xyz").unwrap();
    for reader in [&first, &second] {
        assert_eq!(read_at(reader, 0, 64).unwrap(), b"ab23456789xyz");
    }
    drop((first, second, writer, appender));
    assert_eq!(fs::read(path).unwrap(), b"ab23456789xyz");

    // The same in the sealed checkpoint, for a file large enough to be kept on its own
    // in the cache.
    let big = random_bytes(256 * 1024, 71);
    fs::write(mount.staged("shared/big.bin"), &big).unwrap();
    fs::rename(mount.staged("shared"), mount.committed("shared"))
        .unwrap_or_else(|e| panic!("seal: {e}\n{}", mount.log_excerpt()));
    let sealed = mount.join(mount.commit_target("shared")).join("big.bin");
    let first = File::open(&sealed).expect("open a checkpoint's file");
    let second = File::open(&sealed).expect("open a checkpoint's file a second time");
    for reader in [&first, &second] {
        assert!(read_at(reader, 0, big.len()).unwrap() == big);
    }
}

#[test]
fn tar_and_rsync_fill_staging() {
    let (_store, mount) = mount();
    let work = repo_temp_dir("capture-tools-");
    let src = work.path().join("src");
    make_sample_tree(&src);

    // tar -x into staging, then seal what it made.
    let archive = work.path().join("src.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."))
    .success();
    let untarred = mount.staged("untarred");
    fs::create_dir(&untarred).unwrap();
    run(Command::new("tar")
        .arg("-xpf")
        .arg(&archive)
        .arg("-C")
        .arg(&untarred))
    .success();
    assert_same_tree(&src, &untarred);
    fs::rename(&untarred, mount.committed("untarred"))
        .unwrap_or_else(|e| panic!("seal the untarred tree: {e}\n{}", mount.log_excerpt()));
    let sha = mount.commit_target("untarred");
    assert_same_tree(&src, &mount.join(&sha));

    // rsync -a, when installed (not installed on purpose by the tests).
    if Command::new("rsync").arg("--version").output().is_ok() {
        let synced = mount.staged("synced");
        run(Command::new("rsync")
            .arg("-aH")
            .arg(format!("{}/", src.display()))
            .arg(&synced))
        .success();
        assert_same_tree(&src, &synced);
    } else {
        println!("note: rsync is not installed; skipping the rsync -a sub-case");
    }
}

#[test]
fn git_works_in_staging() {
    if Command::new("git").arg("--version").output().is_err() {
        println!("note: git is not installed; skipping git_works_in_staging");
        return;
    }
    // Lock files renamed over their targets, object files written once, fsync, packs.
    let (_store, mount) = mount();
    let repo = mount.staged("repo");
    fs::create_dir(&repo).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        run(Command::new("git")
            .arg("-C")
            .arg(dir)
            .args([
                "-c",
                "user.name=ckptfs",
                "-c",
                "user.email=ckptfs@example.com",
            ])
            .args(["-c", "init.defaultBranch=main", "-c", "core.fsync=all"])
            .args(args))
    };
    git(&repo, &["init", "-q"]).success();
    fs::write(repo.join("hello.py"), b"print('hello')\n").unwrap();
    fs::create_dir(repo.join("src")).unwrap();
    fs::write(repo.join("src/lib.rs"), b"pub fn f() {}\n").unwrap();
    git(&repo, &["add", "-A"]).success();
    git(&repo, &["commit", "-q", "-m", "first"]).success();
    fs::write(repo.join("hello.py"), b"print('hello again')\n").unwrap();
    git(&repo, &["commit", "-q", "-a", "-m", "second"]).success();
    git(&repo, &["gc", "-q"]).success();
    let status = git(&repo, &["status", "--porcelain"]).success();
    assert_eq!(status.stdout, "", "{status}");
    git(&repo, &["fsck", "--strict"]).success();

    // Sealed, the repository reads the same from the checkpoint.
    fs::rename(&repo, mount.committed("repo"))
        .unwrap_or_else(|e| panic!("seal the repository: {e}\n{}", mount.log_excerpt()));
    let sealed = mount.join(mount.commit_target("repo"));
    let log = git(&sealed, &["--no-optional-locks", "log", "--format=%s"]).success();
    assert_eq!(log.lines(), ["second", "first"], "{log}");
    git(&sealed, &["--no-optional-locks", "fsck", "--strict"]).success();
}

/// Files and directories made in staging get the mode the caller's umask leaves, as on
/// a local disk (not the daemon's umask on top), so that a workspace made by ordinary
/// tools is captured as those tools would have left it on disk: the seal of the staged
/// tree and `ckptfs put` of the same tree made on local disk give the same sha256.
#[test]
fn modes_follow_the_callers_umask_like_a_local_disk() {
    let store = TestStore::local();
    let mount = Mount::new(&store).staging().start();
    let work = repo_temp_dir("capture-umask-");
    // What a build or an agent does: mkdir, create, write, mkdir -m, a FIFO.
    let script = r#"umask "$2" && cd "$1" &&
        mkdir d d/sub && : > d/file && echo data > d/sub/data &&
        touch new && mkdir -m 0777 open && mkdir -p deep/a/b &&
        mkfifo pipe && cp /etc/passwd copied"#;
    for umask in ["0000", "0002", "0077", "0022"] {
        let staged = mount.staged(&format!("u{umask}"));
        let local = work.path().join(format!("u{umask}"));
        fs::create_dir(&staged).unwrap();
        fs::create_dir(&local).unwrap();
        for dir in [&staged, &local] {
            run(Command::new("sh")
                .arg("-c")
                .arg(script)
                .arg("sh")
                .arg(dir)
                .arg(umask))
            .success();
        }
        let modes = |root: &Path| -> Vec<(String, u32)> {
            let mut out = Vec::new();
            let mut stack = vec![root.to_owned()];
            while let Some(dir) = stack.pop() {
                for entry in fs::read_dir(&dir).unwrap() {
                    let path = entry.unwrap().path();
                    let md = fs::symlink_metadata(&path).unwrap();
                    if md.is_dir() {
                        stack.push(path.clone());
                    }
                    let rel = path.strip_prefix(root).unwrap().display().to_string();
                    out.push((rel, md.mode()));
                }
            }
            out.sort();
            out
        };
        let expected = modes(&local);
        assert_eq!(modes(&staged), expected, "umask {umask}");
        // The FIFO is skipped by both captures; the rest must archive identically.
        crate::util::tree::fix_mtimes(&staged);
        crate::util::tree::fix_mtimes(&local);
        let (put_sha, _) = TestStore::local().put(&local, &[]);
        let name = format!("u{umask}");
        fs::rename(&staged, mount.committed(&name)).expect("seal");
        let link = fs::read_link(mount.committed(&name)).unwrap();
        assert_eq!(
            link.to_str().unwrap(),
            format!("../{put_sha}"),
            "umask {umask}: the seal and put of the same tree differ"
        );
    }
}

/// The `# latency NAME: N requests` count of `.status`, 0 when absent.
fn requests(status: &str, operation: &str) -> u64 {
    let prefix = format!("# latency {operation}: ");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(' ').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A path through `staging/NAME/` costs the daemon one request a walk: the kernel
/// asks for `NAME` again each time (a seal turns `commit/NAME` into a symlink under
/// its feet, so that name is never cached), but keeps its attributes as it keeps
/// those of every staged file, instead of asking for them too.
#[test]
fn a_path_walk_through_a_staged_workspace_asks_for_its_name_only() {
    let (_store, mount) = mount();
    let staged = mount.staged("walked");
    fs::create_dir_all(staged.join("src/deep")).unwrap();
    let file = staged.join("src/deep/file.rs");
    fs::write(&file, b"fn main() {}\n").unwrap();
    let walks = 200;
    let status = mount.status_text();
    let (lookups, getattrs) = (requests(&status, "lookup"), requests(&status, "getattr"));
    for _ in 0..walks {
        assert_eq!(fs::metadata(&file).unwrap().len(), 13);
    }
    let status = mount.status_text();
    // Reading .status itself costs a lookup and a getattr at most.
    let lookups = requests(&status, "lookup") - lookups;
    let getattrs = requests(&status, "getattr") - getattrs;
    // One walk in one run was seen without a lookup; the bound leaves room for it.
    assert!(
        lookups + 1 >= walks,
        "{lookups} lookups for {walks} walks:\n{status}"
    );
    assert!(
        getattrs <= walks / 10,
        "{getattrs} getattrs for {walks} walks:\n{status}"
    );
}

/// Starting a turn from the last one: `cp -a MNT/latest/. MNT/staging/NAME/` copies
/// file contents with `copy_file_range`, which the daemon hands to the kernel as a
/// copy between the cache's file and the staged one, never past the copied file's
/// bytes (small files are ranges of one pack). The copy is the same tree, and
/// sealing it gives the checkpoint it was copied from.
#[test]
fn a_turn_starts_from_a_checkpoint_by_copy_and_seals_only_what_changed() {
    let (store, mount) = mount();
    let work = repo_temp_dir("capture-copy-");
    let src = work.path().join("src");
    make_sample_tree(&src);
    let out = run(crate::util::ckptfs().arg("put").arg(store.url()).arg(&src)).success();
    let sha = out.stdout.split_whitespace().next().unwrap().to_owned();
    let checkpoint = listed(&mount, &sha);

    let before = requests(&mount.status_text(), "copy_file_range");
    let staged = mount.staged("turn-2");
    fs::create_dir(&staged).unwrap();
    cp_a(&checkpoint.join("."), &staged);
    assert_same_tree(&src, &staged);
    let status = mount.status_text();
    let copies = requests(&status, "copy_file_range") - before;
    let files = walk_files(&src);
    assert!(
        copies >= files,
        "{copies} copy_file_range requests for {files} non-empty files:\n{status}"
    );

    // A packed file: asking for far more than it holds copies exactly its bytes, and
    // nothing from past its end.
    let small = checkpoint.join("hello.py");
    let want = fs::read(&small).unwrap();
    let source = File::open(&small).unwrap();
    let target = File::create(staged.join("copied-by-hand")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 0i64);
    let copied = unsafe {
        libc::copy_file_range(
            std::os::fd::AsRawFd::as_raw_fd(&source),
            &mut off_in,
            std::os::fd::AsRawFd::as_raw_fd(&target),
            &mut off_out,
            1 << 20,
            0,
        )
    };
    assert_eq!(
        copied,
        want.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
    drop(target);
    assert_eq!(fs::read(staged.join("copied-by-hand")).unwrap(), want);
    fs::remove_file(staged.join("copied-by-hand")).unwrap();

    fs::rename(&staged, mount.committed("turn-2"))
        .unwrap_or_else(|e| panic!("seal the copy: {e}\n{}", mount.log_excerpt()));
    assert_eq!(
        mount.commit_target("turn-2"),
        sha,
        "the copy sealed as another tree"
    );

    // The next turn: copied, one file changed, sealed. Its unchanged gzip members
    // come from the member cache the first seal filled.
    let reused = seal_a_changed_copy(&mount, "turn-3", &checkpoint);
    assert!(reused >= 1, "turn 3 reused no member");
}

/// A writable mount that loaded the newest turn primes the member cache from it: a
/// workspace copied in from outside the mount (no copy names the checkpoint, as when
/// a sandbox restores its workspace by itself) seals reusing that turn's unchanged
/// members.
#[test]
fn a_workspace_copied_from_outside_reuses_the_newest_turns_members() {
    let (store, mount) = mount();
    let work = repo_temp_dir("capture-outside-");
    let src = work.path().join("src");
    make_sample_tree(&src);
    // The put keeps no members: only the mount can fill its member cache.
    let mut put = crate::util::ckptfs();
    put.arg("put")
        .arg("--member-cache-size")
        .arg("0")
        .arg(store.url())
        .arg(&src);
    let sha = run(&mut put)
        .success()
        .stdout
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let checkpoint = listed(&mount, &sha);
    // Browsing it loads it.
    assert!(
        sh("ls -lR \"$1\" >/dev/null", &[&checkpoint])
            .status
            .success()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !mount
        .log_text()
        .lines()
        .any(|l| l.contains("member cache primed") && l.contains(&sha))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never primed:\n{}",
            mount.log_excerpt()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let reused = seal_a_changed_copy(&mount, "turn-2", &src);
    assert!(reused >= 1, "the seal reused no member");
}

/// The checkpoint `sha` in the mount, once the listing picked it up (within the
/// refresh interval).
fn listed(mount: &MountedStore, sha: &str) -> std::path::PathBuf {
    let checkpoint = mount.join(sha);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !checkpoint.exists() {
        assert!(std::time::Instant::now() < deadline, "{sha} never listed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    checkpoint
}

/// Copies `from` into a new workspace `name`, changes its `hello.py` and seals it;
/// returns the members the mount has reused so far, from the seal's log line.
fn seal_a_changed_copy(mount: &MountedStore, name: &str, from: &Path) -> u64 {
    let staged = mount.staged(name);
    fs::create_dir(&staged).unwrap();
    cp_a(&from.join("."), &staged);
    fs::write(staged.join("hello.py"), format!("print('{name}')\n")).unwrap();
    fs::rename(&staged, mount.committed(name))
        .unwrap_or_else(|e| panic!("seal {name}: {e}\n{}", mount.log_excerpt()));
    let log = mount.log_text();
    let sealed = log
        .lines()
        .rfind(|l| l.contains("sealed"))
        .unwrap_or_default();
    crate::util::logged_count(sealed, "members_reused")
}

/// Non-empty regular files under `root`, hard links counted once.
fn walk_files(root: &Path) -> u64 {
    fn walk(dir: &Path, seen: &mut std::collections::HashSet<u64>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                walk(&path, seen);
            } else if meta.is_file() && meta.len() > 0 {
                seen.insert(meta.ino());
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    walk(root, &mut seen);
    seen.len() as u64
}

/// A writer making 40,000 directories in `staging/` cannot use up the daemon's
/// descriptors: it keeps a bounded number open (the most recently used directories
/// and files) and opens others again by name, so a checkpoint still loads, another
/// workspace can still be made, and a directory made first is still reached.
#[test]
fn many_directories_cannot_use_up_the_daemons_descriptors() {
    let store = TestStore::local();
    let work = repo_temp_dir("capture-dirs-");
    let tree = work.path().join("tree");
    make_small_tree(&tree, "loaded");
    let (sha, _) = store.put(&tree, &[]);
    let mount = Mount::new(&store).staging().start();
    let storm = mount.staged("storm");
    fs::create_dir(&storm).unwrap();
    for i in 0..40_000 {
        let dir = storm.join(format!("d{i:05}"));
        fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}\n{}", dir.display(), mount.log_excerpt()));
    }
    let held = fs::read_dir(format!("/proc/{}/fd", mount.pid()))
        .unwrap()
        .count();
    assert!(held < 2_000, "the daemon holds {held} descriptors");

    assert_same_tree(&tree, &mount.join(&sha));
    fs::create_dir(mount.staged("other")).unwrap();
    fs::write(storm.join("d00000/f"), b"first").unwrap();
    assert_eq!(fs::read(storm.join("d00000/f")).unwrap(), b"first");
}
