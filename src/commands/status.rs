//! `ckptfs status MOUNTPOINT`: what the mount's `.status` says, as text or JSON.

use std::io::{self, Write};

use anyhow::{Context, Result, bail};

use crate::cli::StatusArgs;
use crate::fs::status;

pub fn run(args: &StatusArgs) -> Result<i32> {
    let path = args.mountpoint.join(".status");
    if !args.mountpoint.exists() {
        bail!("{} does not exist", args.mountpoint.display());
    }
    // Opened once, never through a symlink or a FIFO, and read up to a bound (the
    // mount's own is at most 16 MiB): a directory that only looks like a mount could
    // hold anything under the name.
    let Ok(file) = crate::beneath::open_regular(&path) else {
        bail!(
            "{} is not a ckptfs mount (it has no .status)",
            args.mountpoint.display()
        );
    };
    const MOST: u64 = 64 << 20;
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(file, MOST + 1), &mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if text.len() as u64 > MOST {
        bail!("{} is larger than a mount's .status can be", path.display());
    }
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &status::parse(&text))?;
        writeln!(out)?;
    } else {
        // The mount escapes every name it writes there; a directory that only looks
        // like a mount could hold anything, so control characters are escaped here too.
        out.write_all(&crate::printable::for_terminal(text.as_bytes()))?;
    }
    out.flush()?;
    Ok(0)
}
