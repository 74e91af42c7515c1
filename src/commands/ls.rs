//! `ckptfs ls STORE [--json]`: the checkpoints of a store, oldest first, from the
//! listing alone (sha256, size, the store's time).

use std::io::{self, Write};

use anyhow::Result;

use super::open_store;
use crate::checkpoint;
use crate::cli::{Cli, LsArgs};
use crate::store::DEFAULT_PART_SIZE;

pub(super) fn run(cli: &Cli, args: &LsArgs) -> Result<i32> {
    let store = open_store(cli, &args.store, DEFAULT_PART_SIZE)?;
    let checkpoints = checkpoint::list(store.as_ref())?;
    let mut out = io::stdout().lock();
    if args.json {
        let rows: Vec<_> = checkpoints
            .iter()
            .map(|c| {
                serde_json::json!({
                    "sha256": c.id.as_str(),
                    "size": c.size,
                    "last_modified": humantime::format_rfc3339_seconds(c.last_modified).to_string(),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        for c in &checkpoints {
            writeln!(
                out,
                "{}  {:>12}  {}",
                c.id,
                c.size,
                humantime::format_rfc3339_seconds(c.last_modified)
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}
