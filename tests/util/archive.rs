//! Hand-made tar.gz archives, including hostile ones that a careful writer refuses to
//! produce (`../x`, absolute paths, links pointing outside). Header bytes are set
//! directly, so nothing is normalised or rejected on the way.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

/// One archive member. Names and link targets are raw bytes, at most 100 of them.
pub enum RawEntry<'a> {
    File {
        name: &'a [u8],
        data: &'a [u8],
    },
    Dir {
        name: &'a [u8],
    },
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    HardLink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Fifo {
        name: &'a [u8],
    },
    CharDevice {
        name: &'a [u8],
        major: u32,
        minor: u32,
    },
}

fn header(name: &[u8], kind: EntryType, mode: u32, size: u64) -> Header {
    assert!(name.len() < 100, "raw names must fit the old header");
    let mut h = Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn set_link(h: &mut Header, target: &[u8]) {
    assert!(
        target.len() < 100,
        "raw link targets must fit the old header"
    );
    h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
}

/// Builds a gzip-compressed tar of `entries`, in order, exactly as given.
pub fn raw_tar_gz(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    for entry in entries {
        let (mut h, data): (Header, &[u8]) = match entry {
            RawEntry::File { name, data } => (
                header(name, EntryType::Regular, 0o644, data.len() as u64),
                data,
            ),
            RawEntry::Dir { name } => (header(name, EntryType::Directory, 0o755, 0), &[]),
            RawEntry::Symlink { name, target } => {
                let mut h = header(name, EntryType::Symlink, 0o777, 0);
                set_link(&mut h, target);
                (h, &[])
            }
            RawEntry::HardLink { name, target } => {
                let mut h = header(name, EntryType::Link, 0o644, 0);
                set_link(&mut h, target);
                (h, &[])
            }
            RawEntry::Fifo { name } => (header(name, EntryType::Fifo, 0o644, 0), &[]),
            RawEntry::CharDevice { name, major, minor } => {
                let mut h = header(name, EntryType::Char, 0o666, 0);
                h.set_device_major(*major).expect("device major");
                h.set_device_minor(*minor).expect("device minor");
                (h, &[])
            }
        };
        h.set_cksum();
        builder.append(&h, data).expect("append raw entry");
    }
    let mut gz = builder.into_inner().expect("finish tar");
    gz.flush().expect("flush gzip");
    gz.finish().expect("finish gzip")
}
