//! `get`: a checkpoint downloaded into a temporary file (written around the page
//! cache, see [`super::spool`]), verified whole, and only then extracted into a new
//! directory.

use std::io::{self, Read};
use std::path::Path;

use super::{CheckpointError, CheckpointId, open_object};
use crate::archive::{self, Limits};
use crate::store::{ObjectStore, Progress};

pub struct GetOptions<'a> {
    pub max_archive_size: u64,
    pub limits: Limits,
    /// Where the archive is downloaded before it is verified.
    pub temp_dir: &'a Path,
    /// One version of the object (a versioned bucket's) instead of the current one.
    pub version: Option<&'a str>,
}

/// Downloads a checkpoint to a temporary file, verifies it, and only then extracts it
/// into `dest`, within the limits.
pub fn get(
    store: &dyn ObjectStore,
    id: &CheckpointId,
    dest: &Path,
    options: &GetOptions<'_>,
    progress: Progress<'_>,
) -> Result<archive::extract::ExtractSummary, CheckpointError> {
    let io_err = |context: String| move |cause| CheckpointError::Io { context, cause };
    let temp_dir = options.temp_dir;
    let mut reader = open_object(store, id, options.version, options.max_archive_size)?;
    let temp = tempfile::Builder::new()
        .prefix(".ckptfs-get-")
        .tempfile_in(temp_dir)
        .map_err(io_err(format!(
            "create a temporary file in {}",
            temp_dir.display()
        )))?;
    let announced = reader.announced;
    let mut spool = super::spool::SpoolWriter::new(temp.as_file());
    copy_with_progress(&mut reader, &mut spool, &|done| progress(done, announced))
        .and_then(|_| io::Write::flush(&mut spool))
        .map_err(io_err(format!("download checkpoint {id}")))?;
    drop(spool);
    let read = reader.finish()?;
    tracing::debug!(checkpoint = %id, bytes = read, "downloaded and verified; extracting");
    let file = temp.reopen().map_err(io_err("reopen download".into()))?;
    let tar = flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 20, file));
    Ok(archive::extract::extract(tar, dest, options.limits)?)
}

fn copy_with_progress(
    reader: &mut impl Read,
    writer: &mut impl io::Write,
    progress: &dyn Fn(u64),
) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        writer.write_all(&buf[..n])?;
        total += n as u64;
        progress(total);
    }
}
