//! `ckptfs cat STORE CHECKPOINT PATH`: one regular file of a verified checkpoint to
//! stdout, byte for byte.

use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result};

use super::review_session::ReviewSession;
use crate::cli::{CatArgs, Cli};
use crate::review::tree::open_file;

pub(super) fn run(cli: &Cli, args: &CatArgs) -> Result<i32> {
    let session = ReviewSession::open(
        cli,
        &args.store,
        &args.review,
        crate::review::exact_for(&[args.checkpoint.as_str()]),
    )?;
    let info = session.resolve(&args.checkpoint)?;
    let checkpoint = session.load(&info)?;
    session.trim(&[&info.id]);
    let mut file = open_file(&checkpoint, args.path.as_bytes())
        .with_context(|| format!("checkpoint {}", info.id))?;
    let mut out = io::stdout().lock();
    io::copy(&mut file, &mut out).map_err(|e| {
        // A closed pipe (`| head`) is reported as such; other errors say what failed.
        if e.kind() == io::ErrorKind::BrokenPipe {
            anyhow::Error::from(e)
        } else {
            anyhow::Error::from(e).context(format!(
                "cannot read {} of checkpoint {}",
                args.path.display(),
                info.id
            ))
        }
    })?;
    out.flush()?;
    Ok(0)
}
