//! `mount -t fuse.ckptfs SOURCE MOUNTPOINT -o OPTIONS`, and the same line in
//! `/etc/fstab`: the arguments `mount.fuse3` (or a `mount.fuse.ckptfs` link to the
//! binary) hands over, turned into `ckptfs mount SOURCE MOUNTPOINT --option...`.
//!
//! mount(8) runs `/sbin/mount.fuse.ckptfs` if it exists, else fuse3's
//! `mount.fuse3`, which runs `ckptfs SOURCE MOUNTPOINT -o OPTIONS` from a fixed
//! `PATH` (`/usr/local/bin` and the system directories). Every `ckptfs mount` flag has
//! an `-o` spelling: `cache_dir=DIR` is `--cache-dir DIR`, `allow_other` is
//! `--allow-other`, `ro` is `--read-only`. mount(8) options that concern it only
//! (`noauto`, `_netdev`, `x-systemd.*`, `nofail`, `user`...) are dropped, and so are
//! `suid`, `dev`, `exec` and their opposites: a ckptfs mount is always
//! `nosuid,nodev`, whatever is asked. `--long` flags pass through as they are: the
//! daemon is started with the same arguments (and program name) plus `--foreground`.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// Options that mount(8) and mount.fuse3 pass or keep for themselves.
const IGNORED: &[&str] = &[
    "rw",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "defaults",
    "nofail",
    "_netdev",
    "async",
    "sync",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
];

/// A `ckptfs mount` flag, as `-o` spells it (`cache_dir`), and whether it takes a value.
pub type MountFlag<'a> = (&'a str, bool);

/// The `ckptfs mount` arguments for a mount-helper invocation, or `None` when `args`
/// (the process's arguments, the program first) is an ordinary `ckptfs` command line.
/// `mount_flags` are the options `-o` may give; another is refused with the list.
pub fn translate(
    args: &[OsString],
    subcommands: &[&str],
    mount_flags: &[MountFlag<'_>],
) -> Option<Result<Vec<OsString>, String>> {
    let program = Path::new(args.first()?).file_name().unwrap_or_default();
    let as_helper = program.to_string_lossy().starts_with("mount.");
    let first = args.get(1)?.to_string_lossy();
    // mount.fuse3 always passes `-o` (as root it adds at least `dev,suid`); without it a
    // word that is not a subcommand is more likely a typo, which clap explains better.
    let has_options = args.iter().any(|a| a.to_string_lossy().starts_with("-o"));
    let looks_like_helper =
        has_options && !first.starts_with('-') && !subcommands.contains(&first.as_ref());
    if !(as_helper || looks_like_helper) {
        return None;
    }
    Some(parse(&args[1..], mount_flags))
}

fn parse(args: &[OsString], mount_flags: &[MountFlag<'_>]) -> Result<Vec<OsString>, String> {
    let mut positional = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let mut flags = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-o") => {
                let value = args.next().ok_or("-o needs a value")?;
                let value = value.to_str().ok_or("mount options must be UTF-8")?;
                options.extend(
                    value
                        .split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_owned),
                );
            }
            Some(o) if o.starts_with("-o") => {
                options.extend(
                    o[2..]
                        .split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_owned),
                );
            }
            // mount(8)'s own flags: no mtab, sloppy, verbose.
            Some("-n" | "-s" | "-v") => {}
            Some("-t") => {
                args.next();
            }
            // `ckptfs mount` flags as they are, such as the `--foreground` that the
            // daemon is started with (it is the same command line again, plus that
            // flag). A value goes with `=`: `--cache-dir=DIR`.
            Some(o) if o.starts_with("--") => flags.push(arg.clone()),
            Some(o) if o.starts_with('-') => {
                return Err(format!(
                    "unexpected mount option {o:?} (give options with -o)"
                ));
            }
            _ => positional.push(arg.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Err("usage: ckptfs STORE MOUNTPOINT [-o OPTIONS] (as mount.fuse3 runs it)".into());
    };
    let mut out: Vec<OsString> = vec![
        "ckptfs".into(),
        "mount".into(),
        source.clone(),
        mountpoint.clone(),
    ];
    for option in &options {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option.as_str(), None),
        };
        if IGNORED.contains(&key) || key.starts_with("x-") || key.starts_with("comment") {
            continue;
        }
        let flag = match key {
            "ro" => "read-only".to_owned(),
            // The mount is `nosuid,nodev` and served by the daemon whatever fsname says.
            "fsname" | "subtype" => continue,
            other if mount_flags.iter().any(|(name, _)| *name == other) => other.replace('_', "-"),
            other => return Err(unknown_option(other, mount_flags)),
        };
        out.push(OsString::from(format!("--{flag}")));
        if let Some(value) = value {
            out.push(OsStr::new(value).to_owned());
        }
    }
    out.extend(flags);
    Ok(out)
}

/// "unknown mount option X", and the ones there are.
fn unknown_option(option: &str, mount_flags: &[MountFlag<'_>]) -> String {
    let known: Vec<String> = std::iter::once("ro".to_owned())
        .chain(mount_flags.iter().map(|(name, takes_value)| {
            if *takes_value {
                format!("{name}=VALUE")
            } else {
                (*name).to_owned()
            }
        }))
        .collect();
    format!(
        "unknown mount option {option}; ckptfs takes {} (and mount(8)'s own, such as \
         noauto, nofail, _netdev and x-*)",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    const COMMANDS: &[&str] = &["mount", "put", "get"];
    const FLAGS: &[MountFlag<'static>] = &[
        ("read_only", false),
        ("allow_other", false),
        ("cache_dir", true),
        ("refresh", true),
        ("owner_self", false),
    ];

    #[test]
    fn mount_fuse3_lines_become_mount_commands() {
        let got = translate(
            &args(&[
                "ckptfs",
                "s3://b/p",
                "/mnt/ckpt",
                "-o",
                "ro,allow_other,cache_dir=/var/cache/c,refresh=10,dev,suid",
            ]),
            COMMANDS,
            FLAGS,
        );
        let want = args(&[
            "ckptfs",
            "mount",
            "s3://b/p",
            "/mnt/ckpt",
            "--read-only",
            "--allow-other",
            "--cache-dir",
            "/var/cache/c",
            "--refresh",
            "10",
        ]);
        assert_eq!(got, Some(Ok(want)));
    }

    #[test]
    fn ordinary_command_lines_are_left_alone() {
        assert_eq!(
            translate(&args(&["ckptfs", "put", "store", "dir"]), COMMANDS, FLAGS),
            None
        );
        assert_eq!(
            translate(&args(&["ckptfs", "--help"]), COMMANDS, FLAGS),
            None
        );
        assert_eq!(translate(&args(&["ckptfs"]), COMMANDS, FLAGS), None);
        // A mistyped subcommand is clap's to explain, not a mount.
        assert_eq!(
            translate(&args(&["ckptfs", "lss", "store"]), COMMANDS, FLAGS),
            None
        );
    }

    #[test]
    fn a_helper_link_is_a_mount_whatever_its_arguments() {
        let got = translate(
            &args(&[
                "/sbin/mount.fuse.ckptfs",
                "put",
                "/mnt",
                "-o",
                "noauto,_netdev,x-systemd.automount,owner_self",
            ]),
            COMMANDS,
            FLAGS,
        );
        assert_eq!(
            got,
            Some(Ok(args(&[
                "ckptfs",
                "mount",
                "put",
                "/mnt",
                "--owner-self"
            ])))
        );
        let bad = translate(&args(&["mount.ckptfs", "only-one"]), COMMANDS, FLAGS);
        assert!(matches!(bad, Some(Err(_))));
    }

    /// The daemon is the same command line again plus `--foreground` (see
    /// `spawn_daemon`), so a helper line must take `ckptfs mount` flags too.
    #[test]
    fn long_flags_pass_through_for_the_daemon() {
        let want = args(&[
            "ckptfs",
            "mount",
            "s3://b/p",
            "/mnt/ckpt",
            "--refresh",
            "10",
            "--foreground",
            "--cache-dir=/var/cache/c",
        ]);
        for program in ["ckptfs", "/sbin/mount.fuse.ckptfs"] {
            let got = translate(
                &args(&[
                    program,
                    "s3://b/p",
                    "/mnt/ckpt",
                    "-o",
                    "refresh=10,dev,suid",
                    "--foreground",
                    "--cache-dir=/var/cache/c",
                ]),
                COMMANDS,
                FLAGS,
            );
            assert_eq!(got, Some(Ok(want.clone())), "{program}");
        }
        // Short flags other than mount(8)'s own stay refused.
        let bad = translate(
            &args(&["ckptfs", "s", "/mnt", "-o", "ro", "-x"]),
            COMMANDS,
            FLAGS,
        );
        assert!(matches!(bad, Some(Err(_))));
    }

    /// Issue 27, item 10: an option ckptfs does not have is named, with the ones it has.
    #[test]
    fn an_unknown_option_is_named_with_the_known_ones() {
        let got = translate(
            &args(&["ckptfs", "s3://b/p", "/mnt", "-o", "ro,bogus_opt=1"]),
            COMMANDS,
            FLAGS,
        );
        let Some(Err(message)) = got else {
            panic!("accepted: {got:?}")
        };
        assert!(
            message.starts_with("unknown mount option bogus_opt;")
                && message.contains("cache_dir=VALUE")
                && message.contains("allow_other"),
            "{message}"
        );
    }
}
