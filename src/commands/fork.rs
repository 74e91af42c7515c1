//! `ckptfs fork MOUNTPOINT REF NAME`: a workspace made from a checkpoint by a running
//! mount's daemon (`mkdir staging/NAME`, then a `setxattr` of `user.ckptfs.fork` on it;
//! see `fs/forker.rs`).
//! REF is resolved here against the mount's own listing, so that the daemon is sent a
//! whole id.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::cli::ForkArgs;
use crate::printable::escape;

const ATTRIBUTE: &str = "user.ckptfs.fork";

pub fn run(args: &ForkArgs) -> Result<i32> {
    let mount = &args.mountpoint;
    let staging = mount.join("staging");
    if !mount.join(".status").is_file() {
        bail!(
            "{} is not a ckptfs mount (it has no .status)",
            mount.display()
        );
    }
    if !staging.is_dir() {
        bail!(
            "{} has no staging/: it is mounted --read-only, where nothing is forked",
            mount.display()
        );
    }
    let name = args.name.as_bytes();
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        bail!(
            "a workspace's name is one path component, not {:?}",
            args.name
        );
    }
    let id = resolve(mount, &args.reference)?;
    let workspace = staging.join(&args.name);
    let shown = format!("{}/{}", staging.display(), escape(name));
    let started = Instant::now();
    if let Err(e) = std::fs::create_dir(&workspace) {
        match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                bail!("{shown} exists: a fork makes a new workspace")
            }
            _ => bail!("cannot make {shown}: {e}"),
        }
    }
    if let Err(e) = rustix::fs::setxattr(
        &workspace,
        ATTRIBUTE,
        id.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    ) {
        // Made here and still empty: nothing of anyone else's goes with it.
        let _ = std::fs::remove_dir(&workspace);
        match e {
            rustix::io::Errno::NOENT => bail!("no checkpoint {id} in {}", mount.display()),
            rustix::io::Errno::NOTSUP => {
                bail!(
                    "{} does not fork (a ckptfs older than this one?)",
                    mount.display()
                )
            }
            rustix::io::Errno::BUSY => {
                bail!("the daemon is running as many forks as it takes; try again")
            }
            rustix::io::Errno::IO => bail!(
                "the daemon could not fork {id}: see `ckptfs status {}` and its log",
                mount.display()
            ),
            e => bail!("cannot fork {id} into {shown}: {}", std::io::Error::from(e)),
        }
    }
    eprintln!(
        "forked {id} into {shown} in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// The whole id `reference` names in the mount: `latest`, an id, or a prefix of
/// exactly one of the checkpoints listed at its root.
fn resolve(mount: &Path, reference: &str) -> Result<String> {
    if reference == "latest" {
        let target = std::fs::read_link(mount.join("latest"))
            .map_err(|e| anyhow::anyhow!("{} has no latest checkpoint: {e}", mount.display()))?;
        let id = target
            .file_name()
            .unwrap_or(OsStr::new(""))
            .to_string_lossy();
        return Ok(id.into_owned());
    }
    if reference.is_empty() || !reference.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("REF is a checkpoint id, a prefix of one, or `latest`; not {reference:?}");
    }
    let reference = reference.to_ascii_lowercase();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(mount)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.len() == 64
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && name.starts_with(&reference)
        {
            found.push(name.into_owned());
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("no checkpoint {reference} in {}", mount.display()),
        n => bail!(
            "{reference} names {n} checkpoints in {}; give more of the id",
            mount.display()
        ),
    }
}
