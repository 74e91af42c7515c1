//! The hostile corpus: generated archives in six classes (A path escapes, B symlink
//! traversal, C hard links, D metadata bombs, E size bombs, F corrupt or odd), each
//! with what `get` must do. Every one is stored with correct metadata, must pass
//! `verify` (its bytes hash to its name), must be refused by `get` with a one-line
//! error or restored harmlessly, within 150 MiB and a time limit, and must leave
//! everything outside DEST as it was; then one mount serves them all, answering each
//! with a readable tree or EIO (its reason in `.status`), within 200 MiB, and
//! survives.

use std::fs;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tar::{EntryType, Header};

use super::{
    MAX_DAEMON_RSS_KIB, MAX_RSS_KIB, Outcome, Sandbox, daemon_pid, describe_tree, dir_bytes,
    remove_tree, report, run_measured, snapshot_diff, vm_hwm_kib,
};
use crate::util::archive::{TarGz, gzip, pax_record, raw_header, sparse_extension, sparse_header};
use crate::util::mount::Mount;
use crate::util::tree::random_bytes;
use crate::util::{COMMAND_TIMEOUT, TestStore, ckptfs, run, sha256_hex};

/// What `get` must do with an archive.
enum Expect {
    /// Exit non-zero with a one-line error containing this (or one of its
    /// `|`-separated alternatives), DEST absent or empty.
    Refused(&'static str),
    /// Exit 0 with DEST holding exactly these entries (see [`describe_tree`]);
    /// `{OUT}` stands for the outside directory.
    Safe(&'static [&'static str]),
}
use Expect::{Refused, Safe};

struct Case {
    id: &'static str,
    what: &'static str,
    bytes: Vec<u8>,
    /// Extra `get` flags (the mount always runs with [`MOUNT_LIMITS`]).
    args: &'static [&'static str],
    expect: Expect,
}

fn case(id: &'static str, what: &'static str, expect: Expect, bytes: Vec<u8>) -> Case {
    let args = &[];
    Case {
        id,
        what,
        bytes,
        args,
        expect,
    }
}

impl Case {
    fn args(mut self, args: &'static [&'static str]) -> Self {
        self.args = args;
        self
    }
}

const LIMIT_64M: &[&str] = &["--max-unpacked-size", "64MiB"];
const MOUNT_LIMITS: [&str; 4] = ["--max-entries", "50000", "--max-unpacked-size", "64MiB"];
const MIB: u64 = 1 << 20;

/// A whole archive: what `build` writes, then the end-of-archive marker.
fn tar(build: impl FnOnce(&mut TarGz) -> &mut TarGz) -> Vec<u8> {
    let mut t = TarGz::new();
    build(&mut t);
    t.end().finish()
}

/// An archive cut short: no end-of-archive marker.
fn cut(build: impl FnOnce(&mut TarGz) -> &mut TarGz) -> Vec<u8> {
    let mut t = TarGz::new();
    build(&mut t);
    t.finish()
}

fn hdr(name: &[u8], kind: EntryType, mode: u32) -> Header {
    raw_header(name, kind, mode, 0, b"")
}

/// The corpus; `o` is the absolute path of the outside directory the escapes aim at.
/// One case per row: rustfmt would spread each over ten lines.
#[rustfmt::skip]
fn corpus(o: &str) -> Vec<Case> {
    use EntryType::{Block, Char, Directory as Dir, Fifo, GNULongLink, GNULongName, Regular};
    use EntryType::{XGlobalHeader, XHeader};
    let (ob, secret) = (o.as_bytes(), format!("{o}/secret"));
    let sb = secret.as_bytes();
    let deep = "a/".repeat(2047) + "x"; // 4,095 bytes: 2,047 directories
    // 5,000 distinct empty files, repeated: one compressed member, copied (D9).
    let headers: Vec<u8> = (0..5000).flat_map(|i| {
        let mut h = hdr(format!("f{i:04}").as_bytes(), Regular, 0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }).collect();
    let rec = pax_record("comment", &[b'c'; 18]);
    let pax_bytes = rec.len() as u64 * (50_000_000 / rec.len() as u64);
    let mut huge_size = hdr(b"huge", Regular, 0o644);
    huge_size.as_old_mut().size = [0x80, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0];
    let mut bad_sum = hdr(b"bad", Regular, 0o644);
    bad_sum.set_size(2);
    bad_sum.as_old_mut().cksum = *b"0001234\0";
    let mut chmod_dir = hdr(b"d/", Dir, 0o777);
    chmod_dir.set_mtime(1_234_567_890);
    let mut dev = hdr(b"dev/null", Char, 0o666);
    dev.set_device_major(1).unwrap();
    dev.set_device_minor(3).unwrap();
    let mut plain = Vec::new();
    let gz = tar(|t| t.file(b"plain", b"tar"));
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut plain).unwrap();
    let mut truncated = tar(|t| t.file(b"random", &random_bytes(20_000, 7)));
    truncated.truncate(truncated.len() / 2);
    let mut garbage = tar(|t| t.file(b"f", b"ok"));
    garbage.extend_from_slice(b"\x1f\x8b trailing garbage after the gzip stream\n");
    let mut no_end = cut(|t| t.file(b"f", b"ok"));
    no_end.extend_from_slice(b"garbage where the next gzip member should be\n");

    vec![
        // A. Path escapes.
        case("A1", "file `../x`", Refused("../x"), tar(|t| t.file(b"../x", b"pwned"))),
        case("A2", "file `a/../../x`", Refused("a/../../x"),
            tar(|t| t.dir(b"a/").file(b"a/../../x", b"pwned"))),
        case("A3", "absolute path into OUTSIDE", Refused("absolute"),
            tar(|t| t.file(format!("{o}/evil").as_bytes(), b"pwned"))),
        case("A4", "file `./../x`", Refused("./../x"), tar(|t| t.file(b"./../x", b"pwned"))),
        case("A5", "pax path=../x", Refused("../x"),
            tar(|t| t.pax(XHeader, &[("path", b"../x")]).file(b"innocent", b"pwned"))),
        case("A6", "GNU long name (>100 bytes) with `../`", Refused("would leave"),
            tar(|t| t.gnu_long(GNULongName, format!("{}/../../../x", "a".repeat(120)).as_bytes())
                .file(b"short", b"pwned"))),
        case("A7", "hard link to `f/../../../outside/secret`", Refused("would leave"),
            tar(|t| t.file(b"f", b"x").hard_link(b"h", b"f/../../../outside/secret"))),
        case("A8", "pax path, absolute into OUTSIDE", Refused("absolute"),
            tar(|t| t.pax(XHeader, &[("path", format!("{o}/evil-pax").as_bytes())])
                .file(b"innocent", b"pwned"))),
        case("A9", "directory entry `../`", Refused("would leave"), tar(|t| t.dir(b"../"))),
        case("A10", "symlink named `../l`", Refused("would leave"), tar(|t| t.symlink(b"../l", ob))),
        case("A11", "2,047-deep tree, then `../x`", Refused("../x"),
            tar(|t| t.gnu_long(GNULongName, deep.as_bytes()).file(b"deep", b"x").file(b"../x", b"pwned"))),
        // B. Symlink traversal.
        case("B1", "file through an absolute symlink to OUTSIDE", Refused("symlink"),
            tar(|t| t.symlink(b"l", ob).file(b"l/evil", b"pwned"))),
        case("B2", "file through a `../..` symlink", Refused("symlink"),
            tar(|t| t.symlink(b"up", b"../..").file(b"up/evil", b"pwned"))),
        case("B3", "directory `l/sub/` through a symlink", Refused("symlink"),
            tar(|t| t.symlink(b"l", ob).dir(b"l/sub/"))),
        case("B4", "symlink chain a -> b -> OUTSIDE, file a/x", Refused("symlink"),
            tar(|t| t.symlink(b"a", b"b").symlink(b"b", ob).file(b"a/x", b"pwned"))),
        case("B5", "a/, a/b/, file a, a/, symlink a/b -> OUTSIDE, a/b/pwned", Refused("symlink"),
            tar(|t| t.dir(b"a/").dir(b"a/b/").file(b"a", b"file").dir(b"a/").symlink(b"a/b", ob)
                .file(b"a/b/pwned", b"pwned"))),
        case("B6", "the same, ending with hard link leak -> a/b/secret", Refused("not in the archive"),
            tar(|t| t.dir(b"a/").dir(b"a/b/").file(b"a", b"file").dir(b"a/").symlink(b"a/b", ob)
                .hard_link(b"leak", b"a/b/secret"))),
        case("B7", "chmod: d/ 0777 + mtime, then symlink d -> OUTSIDE/secret",
            Safe(&["d -> {OUT}/secret"]), tar(|t| t.member(chmod_dir.clone(), b"").symlink(b"d", sb))),
        case("B8", "chmod: d/ 0777 + mtime, then symlink d -> OUTSIDE", Safe(&["d -> {OUT}"]),
            tar(|t| t.member(chmod_dir.clone(), b"").symlink(b"d", ob))),
        case("B9", "d/, then symlink d -> OUTSIDE, then d/x", Refused("symlink"),
            tar(|t| t.dir(b"d/").symlink(b"d", ob).file(b"d/x", b"pwned"))),
        case("B10", "symlink f -> OUTSIDE/secret, then regular f", Safe(&["f 644 =replaced"]),
            tar(|t| t.symlink(b"f", sb).file(b"f", b"replaced"))),
        case("B11", "symlink s -> OUTSIDE, hard link h -> s/secret", Refused("not in the archive"),
            tar(|t| t.symlink(b"s", ob).hard_link(b"h", b"s/secret"))),
        case("B12", "symlink l -> OUTSIDE/secret, hard link h -> l, regular h",
            Safe(&["h 644 =replaced", "l -> {OUT}/secret"]),
            tar(|t| t.symlink(b"l", sb).hard_link(b"h", b"l").file(b"h", b"replaced"))),
        case("B13", "the root `.` as a symlink to OUTSIDE, then x", Safe(&["x 644 =ok"]),
            tar(|t| t.symlink(b".", ob).file(b"x", b"ok"))),
        case("B14", "hard link h -> symlink l -> OUTSIDE, then h/evil", Refused("symlink"),
            tar(|t| t.symlink(b"l", ob).hard_link(b"h", b"l").file(b"h/evil", b"pwned"))),
        // C. Hard links.
        case("C1", "hard link to ../../outside/secret, then regular", Refused("would leave"),
            tar(|t| t.hard_link(b"h", b"../../outside/secret").file(b"h", b"over"))),
        case("C2", "hard link to an absolute path, then regular", Refused("absolute"),
            tar(|t| t.hard_link(b"h", sb).file(b"h", b"over"))),
        case("C3", "hard link to a directory", Refused("hard link to a directory"),
            tar(|t| t.dir(b"dir/").hard_link(b"h", b"dir"))),
        case("C4", "hard link to a missing file", Refused("not in the archive"),
            tar(|t| t.hard_link(b"h", b"missing"))),
        case("C5", "hard link to itself, alone", Refused("not in the archive"),
            tar(|t| t.hard_link(b"h", b"h"))),
        case("C6", "file h, then hard link h -> h", Safe(&["h 644 =self"]),
            tar(|t| t.file(b"h", b"self").hard_link(b"h", b"h"))),
        case("C7", "GNU long link (>100 bytes) to ../../outside/secret", Refused("would leave"),
            tar(|t| t.gnu_long(GNULongLink, ("./".repeat(60) + "../../outside/secret").as_bytes())
                .hard_link(b"h", b""))),
        case("C8", "hard link to the archive's root `./`", Refused("root"),
            tar(|t| t.hard_link(b"h", b"./"))),
        // D. Metadata bombs.
        case("D1", "pax path of 1,000,000 `a/` (2 MB record)", Refused("larger than"),
            tar(|t| t.pax_run(XHeader, "path", b"a/", 2_000_000).file(b"short", b"x"))),
        case("D2", "GNU long name of 10 MiB", Refused("larger than"),
            tar(|t| t.gnu_long_run(GNULongName, b"a/", 10 * MIB).file(b"short", b"x"))),
        case("D3", "GNU long link of 10 MiB", Refused("larger than"),
            tar(|t| t.gnu_long_run(GNULongLink, b"b/", 10 * MIB).symlink(b"l", b"t"))),
        case("D4", "pax header with 50 MB of records", Refused("larger than"),
            tar(|t| t.header(&raw_header(b"././@PaxHeader", XHeader, 0o644, pax_bytes, b""))
                .run(&rec, pax_bytes).pad().file(b"short", b"x"))),
        case("D5", "GNU sparse entry with 100,000 extension headers", Refused("larger than"),
            tar(|t| t.header(&sparse_header(b"chain", 0, &[], true))
                .run(&sparse_extension(true), 99_999 * 512).raw(&sparse_extension(false)))),
        case("D6", "pax path of 4,097 bytes", Refused("longer than 4096"),
            tar(|t| t.pax(XHeader, &[("path", &[b'p'; 4097])]).file(b"short", b"x"))),
        case("D7", "pax linkpath of 5,000 bytes", Refused("longer than 4096"),
            tar(|t| t.pax(XHeader, &[("linkpath", &[b'l'; 5000])]).symlink(b"l", b"t"))),
        case("D8", "2,000 implicit directories in one path", Refused("more than 1000 entries"),
            tar(|t| t.gnu_long(GNULongName, ("a/".repeat(2000) + "x").as_bytes()).file(b"short", b"x")))
            .args(&["--max-entries", "1000"]),
        case("D9", "100,000 empty files", Refused("more than 50000 entries"),
            tar(|t| t.run(&headers, headers.len() as u64 * 20))).args(&["--max-entries", "50000"]),
        case("D10", "pax global header of 16 MiB", Safe(&["after 644 =ok"]),
            tar(|t| t.pax_run(XGlobalHeader, "comment", b"g", 16 * MIB).file(b"after", b"ok"))),
        case("D11", "pax mtime=1e300", Safe(&["t 644 =x"]),
            tar(|t| t.pax(XHeader, &[("mtime", b"1e300")]).file(b"t", b"x"))),
        case("D12", "pax path of 200 KiB (under the metadata cap)", Refused("longer than 4096"),
            tar(|t| t.pax_run(XHeader, "path", b"q", 200 << 10).file(b"short", b"x"))),
        case("D13", "pax global header of 160 MiB", Refused("--max-unpacked-size|larger than"),
            tar(|t| t.pax_run(XGlobalHeader, "comment", b"G", 160 * MIB).file(b"after", b"ok")))
            .args(LIMIT_64M),
        case("D14", "300 symlinks with 4,000-byte targets", Refused("--max-metadata-size"),
            tar(|t| {
                for i in 0..300 {
                    t.pax(XHeader, &[("linkpath", &[b'l'; 4000])]).symlink(format!("l{i}").as_bytes(), b"t");
                }
                t
            }))
            .args(&["--max-metadata-size", "1MiB"]),
        case("D15", "1,000 directories 1,900 levels deep", Refused("--max-metadata-size"),
            tar(|t| {
                let deep = "a/".repeat(1900);
                for i in 0..1000 {
                    t.pax(XHeader, &[("path", format!("{deep}d{i}/").as_bytes())]).dir(b"placeholder/");
                }
                t
            }))
            .args(&["--max-metadata-size", "1MiB"]),
        // E. Size bombs.
        case("E1", "200 MiB of zeros in one file", Refused("--max-unpacked-size"),
            tar(|t| t.header(&raw_header(b"zeros", Regular, 0o644, 200 * MIB, b"")).run(&[0], 200 * MIB)))
            .args(LIMIT_64M),
        case("E2", "2,000 files of 40 KiB (80 MiB)", Refused("--max-unpacked-size"), tar(|t| {
            for i in 0..2000 {
                t.header(&raw_header(format!("f{i:04}").as_bytes(), Regular, 0o644, 40 << 10, b""))
                    .run(&[0], 40 << 10);
            }
            t
        })).args(LIMIT_64M),
        case("E3", "GNU sparse file of 1 TiB", Refused("--max-unpacked-size"),
            tar(|t| t.header(&sparse_header(b"sparse", 1 << 40, &[((1 << 40) - 512, 512)], false))
                .raw(&[b'd'; 512]))).args(LIMIT_64M),
        case("E4", "size field of ~8 EiB (base-256)", Refused("not a valid tar.gz"),
            tar(|t| t.header(&huge_size).raw(b"tiny").pad())),
        case("E5", "directory entry with 72 MiB of data", Refused("--max-unpacked-size"),
            tar(|t| t.header(&raw_header(b"d/", Dir, 0o755, 72 * MIB, b"")).run(&[0], 72 * MIB)))
            .args(LIMIT_64M),
        case("E6", "pax size=10^15 on a 3-byte file", Refused("not a valid tar.gz"),
            tar(|t| t.pax(XHeader, &[("size", b"1000000000000000")]).file(b"small", b"abc"))),
        case("E7", "120 MiB bomb over --max-archive-size 64KiB", Refused("too large"),
            tar(|t| t.header(&raw_header(b"zeros", Regular, 0o644, 120 * MIB, b"")).run(&[0], 120 * MIB)))
            .args(&["--max-archive-size", "64KiB"]),
        // F. Corrupt, and odd but benign.
        case("F1", "tar cut mid-entry", Refused("not a valid tar.gz"),
            cut(|t| t.header(&raw_header(b"cut", Regular, 0o644, 1000, b"")).raw(&[b'x'; 300]))),
        case("F2", "tar cut mid-header", Refused("not a valid tar.gz"),
            cut(|t| t.file(b"whole", b"ok").raw(&hdr(b"next", Regular, 0o644).as_bytes()[..300]))),
        case("F3", "bad header checksum", Refused("checksum"),
            tar(|t| t.header_as_is(&bad_sum).raw(b"ok").pad())),
        case("F4", "garbage after the gzip stream", Safe(&["f 644 =ok"]), garbage),
        case("F5", "no end marker, then garbage", Refused("not a valid tar.gz"), no_end),
        case("F6", "an uncompressed tar", Refused("not a valid tar.gz"), plain),
        case("F7", "text, not gzip", Refused("not a valid tar.gz"), b"not an archive\n".to_vec()),
        case("F8", "gzip truncated halfway", Refused("not a valid tar.gz"), truncated),
        case("F9", "an empty object", Refused("not a valid tar.gz"), Vec::new()),
        case("F10", "two GNU long names for one entry", Refused("two long name"),
            tar(|t| t.gnu_long(GNULongName, b"first").gnu_long(GNULongName, b"second").file(b"x", b"y"))),
        case("F11", "pax record longer than its header", Safe(&["plain 644 =ok"]),
            tar(|t| t.member(hdr(b"././@PaxHeader", XHeader, 0o644), b"99 path=evil\n").file(b"plain", b"ok"))),
        case("F12", "pax record with a non-numeric length", Safe(&["plain 644 =ok"]),
            tar(|t| t.member(hdr(b"././@PaxHeader", XHeader, 0o644), b"xx path=../evil\n")
                .file(b"plain", b"ok"))),
        case("F13", "non-UTF-8 names", Safe(&["caf\\xe9/ 755", "caf\\xe9/\\xff\\xfe 644 =x"]),
            tar(|t| t.dir(b"caf\xe9/").file(b"caf\xe9/\xff\xfe", b"x"))),
        case("F14", "device files and a FIFO", Safe(&["dev/ 755", "dev/regular 644 =plain"]),
            tar(|t| t.dir(b"dev/").file(b"dev/regular", b"plain").member(dev.clone(), b"")
                .member(hdr(b"dev/sda", Block, 0o660), b"").member(hdr(b"dev/fifo", Fifo, 0o644), b""))),
        case("F15", "setuid and setgid files, a sticky dir", Safe(&["sgid 755 =g", "sticky/ 1777", "suid 755 =u"]),
            tar(|t| t.member(hdr(b"suid", Regular, 0o4755), b"u").member(hdr(b"sgid", Regular, 0o2755), b"g")
                .member(hdr(b"sticky/", Dir, 0o1777), b""))),
        case("F16", "file x, then directory x/", Safe(&["x/ 755"]), tar(|t| t.file(b"x", b"file").dir(b"x/"))),
        case("F17", "directory y/ with a child, then file y", Safe(&["y 644 =file"]),
            tar(|t| t.dir(b"y/").file(b"y/inner", b"i").file(b"y", b"file"))),
        case("F18", "an empty archive", Safe(&[]), tar(|t| t)),
        case("F19", "pax path with an embedded NUL", Refused("x00"),
            tar(|t| t.pax(XHeader, &[("path", b"a\0b")]).file(b"plain", b"x"))),
        case("F20", "two gzip members", Safe(&["one 644 =1", "two 644 =2"]),
            tar(|t| t.file(b"one", b"1").new_member().file(b"two", b"2"))),
        case("F21", "GNU sparse file of 1 MiB with a hole", Safe(&["holes 644 <1048576 bytes>"]),
            tar(|t| t.header(&sparse_header(b"holes", MIB, &[(0, 512), (MIB - 512, 512)], false))
                .raw(&[b's'; 1024]))),
        case("F22", "an entry of unknown type 'Z'", Safe(&["file 644 =ok"]),
            tar(|t| t.member(hdr(b"odd", EntryType::new(b'Z'), 0o644), b"zz").file(b"file", b"ok"))),
        case("F23", "gzip of an empty tar stream", Safe(&[]), gzip(b"")),
        case("F24", "2,047-deep tree, then file a replacing it", Safe(&["a 644 =file"]),
            tar(|t| t.gnu_long(GNULongName, deep.as_bytes()).file(b"deep", b"x").file(b"a", b"file"))),
    ]
}

/// Stores `case`, verifies it, restores it with `get`, and checks the result and
/// everything outside DEST. Failures are added to `failures`.
fn run_case(
    store: &TestStore,
    sandbox: &Sandbox,
    case: &Case,
    failures: &mut Vec<String>,
) -> Outcome {
    let id = case.id;
    let sha = sha256_hex(&case.bytes);
    let mut fail = |msg: String| failures.push(format!("{id} ({}): {msg}", case.what));
    store.write_object_bytes(&sha, &case.bytes, Some((&sha, case.bytes.len() as u64)));
    let verify = run(ckptfs().arg("verify").arg(store.url()).arg(&sha));
    if !verify.status.success() || verify.lines() != [format!("{sha} ok")] {
        fail(format!("verify must print `{sha} ok`: {verify}"));
    }

    let before = sandbox.snapshot();
    let dest = &sandbox.dest;
    let mut cmd = ckptfs();
    cmd.arg("get")
        .arg(store.url())
        .arg(&sha)
        .arg(dest)
        .args(case.args);
    let mut outcome = Outcome {
        id,
        what: case.what,
        get: String::new(),
        rss_kib: 0,
        secs: 0.0,
        mount: String::new(),
    };
    match run_measured(&mut cmd, COMMAND_TIMEOUT) {
        Err(e) => {
            fail(e);
            outcome.get = "HANG".into();
        }
        Ok(m) => {
            (outcome.rss_kib, outcome.secs) = (m.max_rss_kib, m.elapsed.as_secs_f64());
            let out = &m.out;
            if m.max_rss_kib > MAX_RSS_KIB {
                fail(format!(
                    "get used {} KiB (peak RSS) > {MAX_RSS_KIB} KiB",
                    m.max_rss_kib
                ));
            }
            let errors: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            if let Some(signal) = out.status.signal() {
                fail(format!("get crashed (signal {signal}): {out}"));
                outcome.get = format!("CRASH (signal {signal})");
            } else if out.status.success() {
                let tree = describe_tree(dest);
                outcome.get = format!("safe: [{}]", tree.join(", "));
                let out_dir = sandbox.outside().display().to_string();
                match case.expect {
                    Refused(needle) => fail(format!(
                        "get succeeded; want an error with {needle:?}: {out}\nDEST: {tree:?}"
                    )),
                    Safe(want) => {
                        let mut want: Vec<String> =
                            want.iter().map(|w| w.replace("{OUT}", &out_dir)).collect();
                        want.sort();
                        if tree != want {
                            fail(format!("DEST holds {tree:?}, want {want:?}\n{out}"));
                        }
                    }
                }
            } else {
                let line = errors.last().copied().unwrap_or("");
                let into = format!(" into {}: ", dest.display());
                let reason = line.split_once(&into).map_or(line, |(_, r)| r);
                outcome.get = format!("refused: {reason}");
                match case.expect {
                    Safe(_) => fail(format!("get failed; want a safe restore: {out}")),
                    Refused(needle)
                        if errors.len() != 1 || !needle.split('|').any(|n| line.contains(n)) =>
                    {
                        fail(format!(
                            "want a one-line error containing {needle:?}: {out}"
                        ))
                    }
                    Refused(_) => {}
                }
                let left: Vec<_> = fs::read_dir(dest)
                    .map(|d| d.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                if !left.is_empty() {
                    fail(format!("a failed get left DEST non-empty: {left:?}\n{out}"));
                }
            }
        }
    }
    let diff = snapshot_diff(&before, &sandbox.snapshot());
    if !diff.is_empty() {
        fail(format!(
            "get changed things outside DEST:\n  {}",
            diff.join("\n  ")
        ));
        sandbox.reset();
    }
    remove_tree(dest);
    outcome
}

/// Runs the cases' `get`s; returns the outcomes and the failures.
fn run_cases(store: &TestStore, sandbox: &Sandbox, cases: &[Case]) -> (Vec<Outcome>, Vec<String>) {
    let mut failures = Vec::new();
    let outcomes = cases
        .iter()
        .map(|case| run_case(store, sandbox, case, &mut failures))
        .collect();
    (outcomes, failures)
}

#[test]
fn every_hostile_archive_is_refused_or_harmless() {
    let started = Instant::now();
    let sandbox = Sandbox::new();
    let cases = corpus(&sandbox.outside().display().to_string());
    let generated = started.elapsed();
    let mut shas: Vec<String> = cases.iter().map(|c| sha256_hex(&c.bytes)).collect();
    assert!(
        cases.len() >= 50,
        "the corpus has only {} archives",
        cases.len()
    );
    shas.sort();
    shas.dedup();
    assert_eq!(shas.len(), cases.len(), "two cases are the same archive");

    let store = TestStore::local();
    let (mut outcomes, mut failures) = run_cases(&store, &sandbox, &cases);
    let gets = started.elapsed();

    // One mount serves the whole store; each checkpoint is walked and read.
    let before = sandbox.snapshot();
    let mount = Mount::new(&store).args(MOUNT_LIMITS).start();
    let pid = daemon_pid(mount.path()).expect("find the mount daemon's pid");
    let (mut eio, mut hwm_reported) = (0, false);
    for (case, outcome) in cases.iter().zip(&mut outcomes) {
        let sha = sha256_hex(&case.bytes);
        let mut find = Command::new("timeout");
        find.args(["-k", "5", "60", "find"]).arg(mount.join(&sha));
        find.args(["-type", "f", "-execdir", "cat", "{}", "+"])
            .env("PATH", "/usr/bin:/bin");
        match run_measured(&mut find, Duration::from_secs(90)) {
            Err(e) => failures.push(format!("{} (mount): {e}", case.id)),
            Ok(m) if m.out.status.success() => outcome.mount = "tree".into(),
            Ok(m)
                if m.out
                    .stderr
                    .lines()
                    .all(|l| l.contains("Input/output error")) =>
            {
                eio += 1;
                outcome.mount = "EIO".into();
            }
            Ok(m) => {
                let log = mount.log_text();
                let lines: Vec<&str> = log.lines().filter(|l| l.contains(&sha)).collect();
                let log = lines[lines.len().saturating_sub(3)..].join("\n");
                failures.push(format!(
                    "{} (mount): want a readable tree or EIO: {}\ndaemon log:\n{log}",
                    case.id, m.out
                ));
                outcome.mount = format!("NEITHER TREE NOR EIO: {}", m.out.stderr.trim());
            }
        }
        let hwm = vm_hwm_kib(pid).unwrap_or(u64::MAX);
        if hwm > MAX_DAEMON_RSS_KIB && !hwm_reported {
            hwm_reported = true;
            failures.push(format!(
                "{} (mount): the daemon's peak RSS reached {hwm} KiB > {MAX_DAEMON_RSS_KIB} KiB",
                case.id
            ));
        }
    }
    let status = mount.status();
    for (case, outcome) in cases.iter().zip(&mut outcomes) {
        let state = status.state(&sha256_hex(&case.bytes));
        match outcome.mount.as_str() {
            "EIO" if state.len() <= "FAILED: ".len() || !state.starts_with("FAILED: ") => failures
                .push(format!(
                    "{} (mount): EIO but .status says {state:?}",
                    case.id
                )),
            "EIO" => outcome.mount = format!("EIO; .status {state}"),
            "tree" if state != "verified" => failures.push(format!(
                "{} (mount): read, but .status says {state:?}",
                case.id
            )),
            _ => {}
        }
    }
    let ls = run(Command::new("ls").arg(mount.path()));
    if !ls.status.success() || shas.iter().any(|s| !ls.stdout.contains(s.as_str())) {
        failures.push(format!(
            "the mount no longer answers `ls`: {ls}\n{}",
            mount.log_excerpt()
        ));
    }
    let hwm = vm_hwm_kib(pid).unwrap_or(u64::MAX);
    if hwm > MAX_DAEMON_RSS_KIB && !hwm_reported {
        failures.push(format!(
            "the mount daemon's peak RSS is {hwm} KiB > {MAX_DAEMON_RSS_KIB} KiB"
        ));
    }
    let cache_bytes = dir_bytes(mount.cache_dir());
    if cache_bytes > 100 * MIB {
        failures.push(format!("the mount's cache holds {cache_bytes} bytes"));
    }
    let diff = snapshot_diff(&before, &sandbox.snapshot());
    if !diff.is_empty() {
        failures.push(format!(
            "the mount changed things outside DEST:\n  {}",
            diff.join("\n  ")
        ));
    }
    report("case get/mount outcomes (local store):", &outcomes);
    let worst = outcomes.iter().max_by_key(|o| o.rss_kib).unwrap();
    println!(
        "{} cases ({} bytes); generated in {:.1} s; gets took {:.1} s, peak get RSS {:.1} MiB ({}); mount walk {:.1} s, \
         daemon VmHWM {:.1} MiB, cache {} bytes, {} checkpoints EIO; total {:.1} s",
        cases.len(),
        cases.iter().map(|c| c.bytes.len()).sum::<usize>(),
        generated.as_secs_f64(),
        (gets - generated).as_secs_f64(),
        worst.rss_kib as f64 / 1024.0,
        worst.id,
        (started.elapsed() - gets).as_secs_f64(),
        hwm as f64 / 1024.0,
        cache_bytes,
        eio,
        started.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The worst path and symlink escapes again, against S3: the object arrives another way.
#[test]
fn worst_path_and_symlink_archives_are_refused_from_s3() {
    const WORST: [&str; 8] = ["A1", "A3", "A6", "B1", "B5", "B7", "B12", "C1"];
    let sandbox = Sandbox::new();
    let cases: Vec<Case> = corpus(&sandbox.outside().display().to_string())
        .into_iter()
        .filter(|c| WORST.contains(&c.id))
        .collect();
    assert_eq!(cases.len(), WORST.len());
    let (outcomes, failures) = run_cases(&TestStore::s3(), &sandbox, &cases);
    report("case get outcomes (S3 store):", &outcomes);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
