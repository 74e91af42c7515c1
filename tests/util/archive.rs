//! Hand-made tar.gz archives, including hostile ones that a careful writer refuses to
//! produce (`../x`, absolute paths, links pointing outside). Header bytes are set
//! directly, so nothing is normalised or rejected on the way.
//!
//! - [`raw_tar_gz`]: a small archive of [`RawEntry`]s, in order, exactly as given.
//! - [`TarGz`]: a block-level writer for the security corpus, which needs what no tar
//!   library writes: pax records (local `x` and global `g`) and GNU long-name/long-link
//!   records of any size, GNU sparse maps with extension chains, raw header fields
//!   (bad checksums, base-256 sizes), streams cut mid-entry, several gzip members,
//!   and gzip bombs made in milliseconds without ever holding the bomb in memory.

use std::collections::HashMap;
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

// ---------------------------------------------------------------------------------------
// A streaming tar.gz writer for archives of any shape, including bombs.

/// Bytes in one tar block.
pub const BLOCK: u64 = 512;

/// Uncompressed length of the gzip member that stands for a long run of one pattern
/// (see [`TarGz::run`]).
const RUN_CHUNK: u64 = 256 * 1024;

/// Pending bytes beyond which [`TarGz`] closes its current gzip member.
const MEMBER_LIMIT: usize = 1 << 20;

/// A GNU header named `name` (< 100 bytes) of type `kind`, with `mode`, data `size` and
/// link target `link` (< 100 bytes); fixed mtime, owner 0. The checksum is left for
/// the writer ([`TarGz::header`] sets it, [`TarGz::header_as_is`] does not).
pub fn raw_header(name: &[u8], kind: EntryType, mode: u32, size: u64, link: &[u8]) -> Header {
    let mut h = header(name, kind, mode, size);
    set_link(&mut h, link);
    h
}

/// One pax record, `"<len> <key>=<value>\n"`, with its self-counting length.
pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let len = pax_record_len(key.len() as u64, value.len() as u64);
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

/// The length of a pax record whose key and value have these lengths: the decimal
/// length counts its own digits.
pub fn pax_record_len(key_len: u64, value_len: u64) -> u64 {
    let body = key_len + value_len + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while body + len.to_string().len() as u64 != len {
        len = body + len.to_string().len() as u64;
    }
    len
}

/// A GNU sparse (`S`) header: `real_size` bytes once expanded, `blocks` (at most 4) as
/// `(offset, length)` of the data that follows in the archive, and the flag saying an
/// extension block follows.
pub fn sparse_header(name: &[u8], real_size: u64, blocks: &[(u64, u64)], extended: bool) -> Header {
    let data: u64 = blocks.iter().map(|b| b.1).sum();
    let mut h = header(name, EntryType::GNUSparse, 0o644, data);
    let gnu = h.as_gnu_mut().expect("a GNU header");
    for (slot, &(offset, length)) in gnu.sparse.iter_mut().zip(blocks) {
        slot.set_offset(offset);
        slot.set_length(length);
    }
    gnu.set_real_size(real_size);
    gnu.set_is_extended(extended);
    h
}

/// A GNU sparse extension block that maps nothing, and says whether another follows.
pub fn sparse_extension(extended: bool) -> [u8; 512] {
    let mut block = [0u8; 512];
    block[504] = u8::from(extended);
    block
}

/// One gzip member of `data` at best compression.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(data).expect("compress");
    gz.finish().expect("finish gzip")
}

/// Writes a tar stream, block by block and exactly as told, into gzip, so that any
/// shape can be made: headers with any field (bad checksums, base-256 sizes), pax and
/// GNU long-name records of any size, sparse maps, streams cut mid-entry, several gzip
/// members.
///
/// Bombs stay cheap: a long run of one pattern ([`TarGz::run`]) becomes copies of one
/// gzip member compressed once (256 KiB of zeros take 289 bytes), because the test
/// build's deflate and CRC run at ~5 MB/s and a 200 MiB run through them would take
/// 45 s. Readers see one stream (multi-member gzip is standard, and what `ckptfs put`
/// writes itself). Nothing large is ever held uncompressed.
#[derive(Default)]
pub struct TarGz {
    /// Finished gzip members.
    out: Vec<u8>,
    /// Uncompressed bytes of the member being written.
    pending: Vec<u8>,
    /// Bytes of tar stream written so far.
    offset: u64,
    /// Compressed members of runs already made, by (unit, length).
    memo: HashMap<(Vec<u8>, u64), Vec<u8>>,
}

impl TarGz {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes to the tar stream as they are (no padding).
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.pending.extend_from_slice(bytes);
        self.offset += bytes.len() as u64;
        if self.pending.len() >= MEMBER_LIMIT {
            self.new_member();
        }
        self
    }

    /// Appends `len` bytes of `pattern` repeated (the last copy cut short).
    pub fn run(&mut self, pattern: &[u8], len: u64) -> &mut Self {
        assert!(!pattern.is_empty(), "an empty pattern");
        // A unit of at least 4 KiB keeps the copies below few and large.
        let unit = pattern.repeat(4096usize.div_ceil(pattern.len()));
        let period = unit.len() as u64;
        // Whole units only, so that what follows a copy starts the pattern again; a
        // run shorter than one chunk (a small file of zeros) is one copy of itself.
        let chunk = ((RUN_CHUNK / period).max(1) * period).min(len / period * period);
        let copies = len.checked_div(chunk).unwrap_or(0);
        if copies > 0 {
            self.new_member();
            let member = self
                .memo
                .entry((unit.clone(), chunk))
                .or_insert_with(|| {
                    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
                    for _ in 0..chunk / period {
                        gz.write_all(&unit).expect("compress");
                    }
                    gz.finish().expect("finish gzip")
                })
                .clone();
            for _ in 0..copies {
                self.out.extend_from_slice(&member);
            }
            self.offset += copies * chunk;
        }
        let mut left = len - copies * chunk;
        while left > 0 {
            let n = left.min(period);
            self.raw(&unit[..n as usize]);
            left -= n;
        }
        self
    }

    /// Zeros up to the next block boundary.
    pub fn pad(&mut self) -> &mut Self {
        let rem = self.offset % BLOCK;
        if rem != 0 {
            self.raw(&[0; BLOCK as usize][..(BLOCK - rem) as usize]);
        }
        self
    }

    /// A header block with its checksum set.
    pub fn header(&mut self, h: &Header) -> &mut Self {
        let mut h = h.clone();
        h.set_cksum();
        self.header_as_is(&h)
    }

    /// A header block exactly as given (whatever its checksum).
    pub fn header_as_is(&mut self, h: &Header) -> &mut Self {
        self.pad().raw(h.as_bytes())
    }

    /// A member: `h` with its size set to `data`'s, then the data, padded.
    pub fn member(&mut self, h: Header, data: &[u8]) -> &mut Self {
        let mut h = h;
        h.set_size(data.len() as u64);
        self.header(&h).raw(data).pad()
    }

    /// A regular file, mode 0644.
    pub fn file(&mut self, name: &[u8], data: &[u8]) -> &mut Self {
        self.member(raw_header(name, EntryType::Regular, 0o644, 0, b""), data)
    }

    /// A directory, mode 0755.
    pub fn dir(&mut self, name: &[u8]) -> &mut Self {
        self.member(raw_header(name, EntryType::Directory, 0o755, 0, b""), b"")
    }

    pub fn symlink(&mut self, name: &[u8], target: &[u8]) -> &mut Self {
        self.member(raw_header(name, EntryType::Symlink, 0o777, 0, target), b"")
    }

    pub fn hard_link(&mut self, name: &[u8], target: &[u8]) -> &mut Self {
        self.member(raw_header(name, EntryType::Link, 0o644, 0, target), b"")
    }

    /// A pax header of `kind` (`XHeader` for the next entry, `XGlobalHeader`) holding
    /// `records` as `(key, value)`.
    pub fn pax(&mut self, kind: EntryType, records: &[(&str, &[u8])]) -> &mut Self {
        let body: Vec<u8> = records.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        self.member(raw_header(b"././@PaxHeader", kind, 0o644, 0, b""), &body)
    }

    /// A pax header of `kind` with one record whose value is `pattern` repeated to
    /// `len` bytes, streamed.
    pub fn pax_run(&mut self, kind: EntryType, key: &str, pattern: &[u8], len: u64) -> &mut Self {
        let size = pax_record_len(key.len() as u64, len);
        self.header(&raw_header(b"././@PaxHeader", kind, 0o644, size, b""))
            .raw(format!("{size} {key}=").as_bytes())
            .run(pattern, len)
            .raw(b"\n")
            .pad()
    }

    /// A GNU long-name (`GNULongName`, 'L') or long-link (`GNULongLink`, 'K') record
    /// for the next entry: `value` and a NUL.
    pub fn gnu_long(&mut self, kind: EntryType, value: &[u8]) -> &mut Self {
        let mut data = value.to_vec();
        data.push(0);
        self.member(raw_header(b"././@LongLink", kind, 0o644, 0, b""), &data)
    }

    /// A GNU long-name or long-link record whose value is `pattern` repeated to `len`
    /// bytes, streamed.
    pub fn gnu_long_run(&mut self, kind: EntryType, pattern: &[u8], len: u64) -> &mut Self {
        self.header(&raw_header(b"././@LongLink", kind, 0o644, len + 1, b""))
            .run(pattern, len)
            .raw(&[0])
            .pad()
    }

    /// The end-of-archive marker: two zero blocks.
    pub fn end(&mut self) -> &mut Self {
        self.pad().raw(&[0; 2 * BLOCK as usize])
    }

    /// Closes the current gzip member; what follows goes into a new one.
    pub fn new_member(&mut self) -> &mut Self {
        if !self.pending.is_empty() {
            let member = gzip(&self.pending);
            self.out.extend_from_slice(&member);
            self.pending.clear();
        }
        self
    }

    /// The gzip bytes written so far (adds no end-of-archive marker).
    pub fn finish(&mut self) -> Vec<u8> {
        self.new_member();
        std::mem::take(&mut self.out)
    }
}
