//! `ckptfs find STORE CHECKPOINT [PATTERN]`: the paths of a verified checkpoint in
//! byte order, optionally only those matching a glob: escaped one per line (see
//! [`crate::printable`]), or raw and NUL-ended with `-0`.

use std::io::{self, Write};

use anyhow::{Context, Result};

use super::review_session::ReviewSession;
use crate::cli::{Cli, FindArgs};
use crate::review::tree::{PathFilter, walk};

pub(super) fn run(cli: &Cli, args: &FindArgs) -> Result<i32> {
    let filter = args
        .pattern
        .as_deref()
        .map(PathFilter::new)
        .transpose()
        .context("bad PATTERN")?;
    let session = ReviewSession::open(
        cli,
        &args.store,
        &args.review,
        crate::review::exact_for(&[args.checkpoint.as_str()]),
    )?;
    let info = session.resolve(&args.checkpoint)?;
    let checkpoint = session.load(&info)?;
    session.trim(&[&info.id]);
    let end: &[u8] = if args.null { b"\0" } else { b"\n" };
    let mut out = io::BufWriter::new(io::stdout().lock());
    walk(&checkpoint.index, |path, _, _| -> io::Result<()> {
        if filter.as_ref().is_none_or(|f| f.matches(path)) {
            if args.null {
                out.write_all(path)?;
            } else {
                out.write_all(crate::printable::escape(path).as_bytes())?;
            }
            out.write_all(end)?;
        }
        Ok(())
    })?;
    out.flush()?;
    Ok(0)
}
