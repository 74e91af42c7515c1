//! ckptfs as the system sees it: `mount -t fuse.ckptfs`, an `/etc/fstab` line,
//! `umount`, the files `scripts/install.sh` installs and the systemd unit.
//!
//! mount(8) finds its helpers in fixed directories, so these tests run it in a mount
//! namespace of their own (`unshare -m`), where the test binary is put in those
//! directories by bind mounts: the host's `/usr/local` and `/sbin` are never touched,
//! and the FUSE mounts made there vanish with the namespace.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::mount::repo_temp_dir;
use crate::util::{Output, ckptfs, run, sha256_hex};

/// The test binary.
fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_ckptfs")
}

/// Runs `script` with bash in a private mount namespace, `bin` (a directory holding
/// `ckptfs` and `mount.fuse.ckptfs` links to the test binary) bound over
/// `/usr/local/sbin`, which is on mount.fuse3's fixed PATH. The script's own EXIT trap
/// detaches whatever it mounted; `timeout` bounds it.
fn in_namespace(dir: &Path, script: &str) -> Output {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for name in ["ckptfs", "mount.fuse.ckptfs"] {
        let link = bin.join(name);
        if !link.exists() {
            symlink(binary(), &link).unwrap();
        }
    }
    let prelude = format!(
        "set -euo pipefail\n\
         mount --bind {bin} /usr/local/sbin\n\
         cleanup() {{ for m in $(awk '$3 ~ /^fuse/ && index($2, \"{dir}/\") == 1 {{print $2}}' \
         /proc/self/mounts); do umount -l \"$m\" || true; done; }}\n\
         trap cleanup EXIT\n",
        bin = bin.display(),
        dir = dir.display(),
    );
    let mut cmd = Command::new("timeout");
    cmd.args([
        "120",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "bash",
        "-c",
    ])
    .arg(format!("{prelude}{script}"))
    .current_dir(dir)
    .env_remove("RUST_LOG");
    run(&mut cmd)
}

/// A local store (`DIR/store`) with one checkpoint holding `hello.txt`; its path and
/// the checkpoint's digest.
fn store_with_one_checkpoint(dir: &Path) -> (PathBuf, String) {
    let store = dir.join("store");
    let ws = dir.join("ws");
    fs::create_dir_all(ws.join("src")).unwrap();
    fs::write(ws.join("hello.txt"), "hello from a checkpoint\n").unwrap();
    fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    let out = run(ckptfs().arg("put").arg(&store).arg(&ws)).success();
    let digest = out.stdout.split_whitespace().next().unwrap().to_owned();
    (store, digest)
}

/// The `daemon pid N` that `ckptfs mount` reports.
fn daemon_pids(out: &Output) -> Vec<u32> {
    let text = format!("{}{}", out.stdout, out.stderr);
    text.match_indices("daemon pid ")
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        })
        .collect()
}

/// Waits for `pid` to exit (gone, or a zombie waiting for init).
fn wait_exited(pid: u32) -> bool {
    for _ in 0..200 {
        match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z') =>
            {
                return true;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    false
}

#[test]
fn mount_t_fstab_and_umount_through_mount8() {
    let tmp = repo_temp_dir("eco-mount-");
    let dir = tmp.path();
    let (store, digest) = store_with_one_checkpoint(dir);
    for d in ["mnt", "mnt2", "mnt3"] {
        fs::create_dir(dir.join(d)).unwrap();
    }
    let d = dir.display();
    let store_dir = store.display();
    // Each mount: the type and options the kernel shows, a verified file through cat,
    // then umount(8). mount.fuse3 hands the options over as `-o`; mount(8) itself asks
    // for suid and dev, which ckptfs refuses.
    let fstab = format!(
        "{store_dir} {d}/mnt3 fuse.ckptfs noauto,_netdev,nofail,x-systemd.automount,\
         cache_dir={d}/cache3,refresh=30 0 0\n"
    );
    fs::write(dir.join("fstab"), fstab).unwrap();
    let script = format!(
        r#"
show() {{ grep " $1 " /proc/self/mounts; cat "$1/latest/hello.txt"; ls "$1"; }}
echo "== mount.fuse3"
mount -t fuse.ckptfs -o suid,dev,cache_dir={d}/cache1 {store_dir} {d}/mnt
show {d}/mnt
umount {d}/mnt
echo "== fstab"
mount -T {d}/fstab {d}/mnt3
show {d}/mnt3
umount {d}/mnt3
echo "== mount.fuse.ckptfs"
# Without mount.fuse3: an empty /usr/sbin but for the link, so mount(8) can only
# run /sbin/mount.fuse.ckptfs, and with no -o at all.
mount -t tmpfs none /usr/sbin
ln -s {d}/bin/mount.fuse.ckptfs /usr/sbin/mount.fuse.ckptfs
CKPTFS_CACHE_DIR={d}/cache2 mount -t fuse.ckptfs {store_dir} {d}/mnt2
show {d}/mnt2
umount {d}/mnt2
echo "== done"
"#
    );
    let out = in_namespace(dir, &script).success();
    assert!(out.stdout.contains("== done"), "{out}");
    let mounts: Vec<&str> = out
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("ckptfs:"))
        .collect();
    assert_eq!(mounts.len(), 3, "{out}");
    for line in mounts {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[2], "fuse.ckptfs", "{line}");
        let options: Vec<&str> = fields[3].split(',').collect();
        assert!(
            options.contains(&"nosuid") && options.contains(&"nodev"),
            "asked for suid,dev yet got {line}"
        );
    }
    assert_eq!(
        out.stdout.matches("hello from a checkpoint").count(),
        3,
        "{out}"
    );
    assert_eq!(out.stdout.matches(&digest).count(), 3, "{out}");
    // umount(8) ends each daemon, as the README says.
    let pids = daemon_pids(&out);
    assert_eq!(pids.len(), 3, "{out}");
    for pid in pids {
        assert!(
            wait_exited(pid),
            "daemon {pid} still runs after umount: {out}"
        );
    }
}

/// What `install.sh` put under `root`: each path with its file's bytes or link target.
fn tree_of(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", fs::read_link(&path).unwrap().display()),
                );
            } else if meta.is_dir() {
                stack.push(path);
            } else {
                let bytes = fs::read(&path).unwrap();
                out.insert(rel, format!("{} bytes {}", bytes.len(), sha256_hex(&bytes)));
            }
        }
    }
    out
}

#[test]
fn install_sh_installs_everything_twice_the_same() {
    let tmp = repo_temp_dir("eco-install-");
    let dest = tmp.path().join("pkg");
    let install = || {
        run(Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh"))
            .env("CKPTFS_BIN", binary())
            .env("DESTDIR", &dest)
            .env("PREFIX", "/usr"))
        .success()
    };
    install();
    let first = tree_of(&dest);
    install();
    assert_eq!(first, tree_of(&dest), "a second install changed the tree");

    let usr = dest.join("usr");
    let helper = usr.join("sbin/mount.fuse.ckptfs");
    assert_eq!(fs::read_link(&helper).unwrap(), Path::new("../bin/ckptfs"));
    let installed = usr.join("bin/ckptfs");
    assert_eq!(fs::read(&helper).unwrap(), fs::read(&installed).unwrap());
    // Stripped (issue 27, item 16), and it still runs.
    let (size, built) = (
        fs::metadata(&installed).unwrap().len(),
        fs::metadata(binary()).unwrap().len(),
    );
    assert!(
        size < built / 2,
        "not stripped: {size} bytes, built {built}"
    );
    run(Command::new(&installed).arg("--version")).success();

    // Any other PREFIX: the helper goes where mount(8) looks, /sbin, and points at
    // the binary by its full path.
    let other = tmp.path().join("other");
    run(Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh"))
        .env("CKPTFS_BIN", binary())
        .env("DESTDIR", &other)
        .env("PREFIX", "/opt/ckptfs"))
    .success();
    assert_eq!(
        fs::read_link(other.join("sbin/mount.fuse.ckptfs")).unwrap(),
        Path::new("/opt/ckptfs/bin/ckptfs")
    );
    assert!(other.join("opt/ckptfs/bin/ckptfs").is_file());

    // Completions: bash loads its file and completes subcommands; the others name them.
    let bash = usr.join("share/bash-completion/completions/ckptfs");
    let out = run(Command::new("bash").arg("-c").arg(format!(
        "source {}; COMP_WORDS=(ckptfs mo); COMP_CWORD=1; COMP_LINE='ckptfs mo'; \
         COMP_POINT=9; _ckptfs ckptfs mo ckptfs; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bash.display()
    )))
    .success();
    assert!(
        out.lines().contains(&"mount"),
        "bash completes `ckptfs mo`: {out}"
    );
    for file in [
        "share/zsh/site-functions/_ckptfs",
        "share/fish/vendor_completions.d/ckptfs.fish",
    ] {
        let text = fs::read_to_string(usr.join(file)).unwrap();
        for word in ["mount", "verify", "diff"] {
            assert!(text.contains(word), "{file} does not name {word}");
        }
    }
    // A page for the program and for each command, each a roff page of its own.
    let man = usr.join("share/man/man1");
    for page in [
        "ckptfs.1",
        "ckptfs-mount.1",
        "ckptfs-put.1",
        "ckptfs-log.1",
        "ckptfs-diff.1",
    ] {
        let text = fs::read_to_string(man.join(page)).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is not roff"
        );
    }
}

#[test]
fn systemd_unit_and_its_environment_file_are_valid() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = repo.join("contrib/systemd/ckptfs@.service");
    let example = fs::read_to_string(repo.join("contrib/systemd/ckptfs.env.example")).unwrap();

    // Every CKPTFS_ variable the example names is one `ckptfs mount` reads: an unknown
    // name would be ignored without a word.
    let help = run(ckptfs().args(["mount", "--help"])).success().stdout;
    let global = run(ckptfs().arg("--help")).success().stdout;
    let mut named = 0;
    for line in example.lines() {
        let line = line.trim_start_matches('#');
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        if !name.starts_with("CKPTFS_") || name.contains(' ') {
            continue;
        }
        named += 1;
        if name == "CKPTFS_STORE" {
            // The unit's own: its ExecStart passes it as the store argument.
            assert!(
                fs::read_to_string(&unit)
                    .unwrap()
                    .contains("${CKPTFS_STORE}")
            );
            continue;
        }
        let env = format!("[env: {name}]");
        assert!(
            help.contains(&env) || global.contains(&env),
            "{name} in ckptfs.env.example is not a variable ckptfs reads"
        );
    }
    assert!(named >= 10, "only {named} variables found in the example");

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is not installed: the unit file is not verified");
        return;
    }
    // `verify` checks that ExecStart's program exists, so it runs where ckptfs is on
    // the unit's search path, and on an instance name.
    let tmp = repo_temp_dir("eco-systemd-");
    let instance = tmp.path().join("ckptfs@mnt-ckpt.service");
    fs::copy(&unit, &instance).unwrap();
    let out = in_namespace(
        tmp.path(),
        &format!("systemd-analyze verify --man=no {}", instance.display()),
    )
    .success();
    assert!(out.stderr.trim().is_empty(), "systemd-analyze warns: {out}");
}
