//! `ckptfs verify STORE [SHA256...]`: re-hashes checkpoints in the store, one line per
//! checkpoint on stdout (`<sha256> ok` or `<sha256> FAILED: reason`); exit status 1
//! when any failed.

use std::io::{self, Write};

use anyhow::Result;

use super::{open_store, resolve_name};
use crate::checkpoint::{self, CheckpointError};
use crate::cli::{Cli, VerifyArgs};
use crate::store::DEFAULT_PART_SIZE;

pub(super) fn run(cli: &Cli, args: &VerifyArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let ids = if args.sha256.is_empty() {
        checkpoint::list(store.as_ref())?
            .into_iter()
            .map(|c| c.id)
            .collect()
    } else {
        args.sha256
            .iter()
            .map(|given| resolve_name(store.as_ref(), given))
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut failed = 0;
    let mut out = io::stdout().lock();
    for id in &ids {
        match checkpoint::verify(store.as_ref(), id) {
            Ok(()) => writeln!(out, "{id} ok")?,
            Err(e) => {
                failed += 1;
                let reason = match e {
                    CheckpointError::Verify { failure, .. } => failure.to_string(),
                    other => format!("{:#}", anyhow::Error::from(other)),
                };
                writeln!(out, "{id} FAILED: {reason}")?;
            }
        }
    }
    out.flush()?;
    if failed > 0 {
        eprintln!("{failed} of {} checkpoints failed verification", ids.len());
        return Ok(1);
    }
    Ok(0)
}
