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
    if !path.is_file() {
        bail!(
            "{} is not a ckptfs mount (it has no .status)",
            args.mountpoint.display()
        );
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
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
