//! `ckptfs report STORE OUTDIR [CHECKPOINT...] [--lineage CHECKPOINT]`: a static HTML
//! history of the turns (see `REPORT_ABOUT` in the CLI, and [`crate::review::html`] for
//! what keeps hostile names and contents text).
//!
//! OUTDIR holds `index.html`, `turns/<sha256>.html`, and `.ckptfs-report/`: a manifest
//! of the turns computed so far (each by its digest and the digest it was compared
//! with) and each one's page body. A later run reuses a body whose turn and base are
//! the same, made by the same version: both are named by their digests, so the body
//! cannot differ. Every turn shown is verified again in every run (downloaded and
//! hashed), so that the report's integrity section speaks of that run; only the diffs
//! are not recomputed. Turns that failed are never reused.
//!
//! Whoever can write OUTDIR (its owner, when root makes the report) must not be able
//! to steer the report's writes, renames, deletions or reads elsewhere: every file is
//! reached through descriptors of OUTDIR and its two folders ([`OutDir`]), one name at
//! a time, never through a symlink, and the folders must be the user's own. Nor may
//! they put words in a page: what a run reuses (a body and the counts the manifest
//! gives it) is taken only if it carries a MAC under a key kept in the user's cache
//! directory ([`Signer`]), which no one else can read; files of the user's own are not
//! enough, since root's `get` makes files owned by root with anyone's contents.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

use super::review_session::{ReviewSession, lineage, unreadable};
use crate::beneath;
use crate::checkpoint::{CheckpointError, CheckpointId, CheckpointInfo, Exact};
use crate::cli::{Cli, ReportArgs};
use crate::commands::say;
use crate::review::diff::PatchBudget;
use crate::review::html::{self, ChartTurn, Lines, PAGE_END, page_start};
use crate::review::report::{self, TurnStats};

/// Where a report keeps what later runs reuse.
const STATE: &str = ".ckptfs-report";
const MANIFEST: &str = "manifest.json";
const TURNS: &str = "turns";
const INDEX: &str = "index.html";
/// Bumped when the pages' bodies or the manifest change shape.
const FORMAT: u32 = 3;

#[derive(Serialize, Deserialize, Default)]
struct Manifest {
    format: u32,
    version: String,
    /// By sha256.
    turns: BTreeMap<String, Computed>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Computed {
    /// The sha256 the turn was compared with.
    base: Option<String>,
    stats: TurnStats,
    /// [`Signer::sign`] of the turn, its base, its counts and its body.
    mac: String,
}

/// Signs what a report keeps for later runs, with a key of 32 random bytes kept in the
/// user's cache directory (`report.key`, 0600), which [`crate::cache::CacheDir`]
/// makes sure no one else can write or swap.
struct Signer {
    key: [u8; 32],
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl Signer {
    /// The key kept in the cache directory (`--cache-dir`, else the default one),
    /// made on first use; a key of this run alone if there is no such directory.
    fn open(cache_dir: Option<&Path>) -> Result<Signer> {
        const KEY: &str = "report.key";
        let dir = match super::cache_dir(cache_dir) {
            Ok(dir) => dir,
            Err(e) => {
                say::note!("no cache directory ({e:#}): nothing is reused from an earlier report");
                return Ok(Signer { key: random_key()? });
            }
        };
        let shown = dir.path().display();
        let dir = rfs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("cannot open the cache directory {shown}"))?;
        if let Some(bytes) = beneath::read_own_file_at(&dir, OsStr::new(KEY), 32)
            && let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice())
        {
            return Ok(Signer { key });
        }
        let key = random_key()?;
        beneath::replace_file_at(&dir, KEY, &key, 0o600)
            .with_context(|| format!("cannot keep the report's key in {shown}"))?;
        Ok(Signer { key })
    }

    fn mac(
        &self,
        turn: &str,
        computed_base: Option<&str>,
        stats: &TurnStats,
        body: &[u8],
    ) -> HmacSha256 {
        use hmac::Mac as _;
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key");
        let stats = serde_json::to_vec(stats).expect("counts serialise");
        // Each part's length first: no two different inputs give the same bytes.
        for part in [
            turn.as_bytes(),
            computed_base.unwrap_or("first").as_bytes(),
            &stats,
            body,
        ] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }

    fn sign(&self, turn: &str, base: Option<&str>, stats: &TurnStats, body: &[u8]) -> String {
        use hmac::Mac as _;
        let tag = self.mac(turn, base, stats, body).finalize().into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `computed`'s MAC is that of `turn` and `body` (in constant time).
    fn verifies(&self, turn: &str, computed: &Computed, body: &[u8]) -> bool {
        use hmac::Mac as _;
        let Some(tag) = hex_bytes(&computed.mac) else {
            return false;
        };
        self.mac(turn, computed.base.as_deref(), &computed.stats, body)
            .verify_slice(&tag)
            .is_ok()
    }
}

fn random_key() -> Result<[u8; 32]> {
    use std::io::Read as _;
    let mut key = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut key))
        .context("cannot read /dev/urandom")?;
    Ok(key)
}

fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One turn as the pages show it.
struct Row<'a> {
    info: &'a CheckpointInfo,
    /// The parent its metadata claims, whether or not the store has it.
    parent: Option<CheckpointId>,
    /// What it was compared with: its parent when the store has it, else the last
    /// turn before it that verified.
    base: Option<&'a CheckpointInfo>,
    /// Its counts, or why it did not verify.
    outcome: Result<TurnStats, String>,
}

pub(super) fn run(cli: &Cli, args: &ReportArgs) -> Result<i32> {
    let session = ReviewSession::open(cli, &args.store, &args.review, Exact::All)?;
    let parents = session.claimed_parents()?;
    let listed = session.by_id();
    let shown = chosen(&session, args, &parents, &listed)?;
    let outdir = OutDir::prepare(&args.outdir)?;
    let signer = Signer::open(args.review.cache_dir.as_deref())?;
    let mut manifest = outdir.read_manifest();
    let started = SystemTime::now();
    let mut budget = PatchBudget::default();
    let (mut computed, mut reused) = (0, 0);
    let mut verified: HashSet<&CheckpointId> = HashSet::new();
    let mut walked: HashSet<&CheckpointId> = HashSet::new();
    let mut previous: Option<&CheckpointInfo> = None;
    let mut rows = Vec::with_capacity(shown.len());
    for (n, &info) in shown.iter().enumerate() {
        let _shown = super::spinner(format!(
            "report: turn {} of {} ({})",
            n + 1,
            shown.len(),
            info.id.short()
        ));
        let parent = parents[&info.id].clone();
        let listed_parent = parent.as_ref().and_then(|p| listed.get(p).copied());
        let base = match listed_parent {
            Some(p) if verified.contains(&p.id) => Some(p),
            Some(p) if !walked.contains(&p.id) && loads(&session, p)? => Some(p),
            _ => previous,
        };
        let base_id = base.map(|b| b.id.as_str().to_owned());
        let key = info.id.as_str();
        let earlier = manifest
            .turns
            .get(key)
            .filter(|c| c.base == base_id && outdir.body_verifies(&signer, &info.id, base, c))
            .cloned();
        let outcome = match earlier {
            Some(earlier) => match session.verify(info) {
                Ok(()) => {
                    reused += 1;
                    Ok(earlier.stats)
                }
                Err(CheckpointError::Verify { failure, .. }) => {
                    Err(crate::printable::message(&failure.to_string()).into_owned())
                }
                Err(e) => return Err(e).with_context(|| format!("checkpoint {}", info.id)),
            },
            None => match compute(&session, info, base, &mut budget)? {
                Ok(body) => {
                    // The body first, under a name that says what it was compared
                    // with, then the manifest: a run that stops between the two
                    // leaves nothing that a later run would take for another pair.
                    outdir.write_body(&info.id, base, body.html.as_bytes())?;
                    let mac =
                        signer.sign(key, base_id.as_deref(), &body.stats, body.html.as_bytes());
                    manifest.turns.insert(
                        key.to_owned(),
                        Computed {
                            base: base_id,
                            stats: body.stats,
                            mac,
                        },
                    );
                    outdir.write_manifest(&manifest)?;
                    computed += 1;
                    Ok(body.stats)
                }
                Err(reason) => Err(reason),
            },
        };
        if outcome.is_ok() {
            verified.insert(&info.id);
            previous = Some(info);
        }
        walked.insert(&info.id);
        rows.push(Row {
            info,
            parent,
            base,
            outcome,
        });
    }
    let finished = SystemTime::now();
    outdir.write_manifest(&manifest)?;
    let when = Verified { started, finished };
    for (i, row) in rows.iter().enumerate() {
        let body = match &row.outcome {
            Ok(_) => Some(outdir.read_body(&signer, &row.info.id, row.base, &manifest)?),
            Err(_) => None,
        };
        let page = turn_page(&rows, i, &when, body.as_deref())?;
        outdir.write(&outdir.turns, &turn_name(&row.info.id), page.as_bytes())?;
    }
    let index = index_page(&args.store, &rows, &when);
    outdir.write(&outdir.top, INDEX, index.as_bytes())?;
    outdir.remove_stale_files(&rows, &manifest)?;
    let failed = rows.iter().filter(|r| r.outcome.is_err()).count();
    say::note!(
        "wrote {} ({} turns: {computed} computed, {reused} taken from the earlier report, \
         {failed} FAILED)",
        outdir.path.join(INDEX).display(),
        rows.len()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}

/// The turns to show, in capture order.
fn chosen<'a>(
    session: &'a ReviewSession,
    args: &ReportArgs,
    parents: &HashMap<&CheckpointId, Option<CheckpointId>>,
    listed: &HashMap<&CheckpointId, &'a CheckpointInfo>,
) -> Result<Vec<&'a CheckpointInfo>> {
    if let Some(given) = &args.lineage {
        let tip = session.resolve(given)?;
        let Some(&tip) = listed.get(&tip.id) else {
            bail!(
                "--lineage {given}: checkpoint {} is not listed in the store",
                tip.id
            );
        };
        return Ok(lineage(tip, parents, listed));
    }
    if args.checkpoints.is_empty() {
        return Ok(session.listing.iter().collect());
    }
    let mut wanted = HashSet::new();
    for given in &args.checkpoints {
        let info = session.resolve(given)?;
        if !listed.contains_key(&info.id) {
            bail!("{given}: checkpoint {} is not listed in the store", info.id);
        }
        wanted.insert(info.id);
    }
    Ok(session
        .listing
        .iter()
        .filter(|info| wanted.contains(&info.id))
        .collect())
}

/// Whether a checkpoint outside the turns walked so far can be read (verified and
/// indexed), to compare with it.
fn loads(session: &ReviewSession, info: &CheckpointInfo) -> Result<bool> {
    match session.load(info) {
        Ok(_) => Ok(true),
        Err(e) => unreadable(&e).map(|_| false),
    }
}

/// A turn's body, compared with `base`; the reason when the turn, or its base, cannot
/// be read (the checkpoint's fault: it is shown as FAILED). Failures to reach the
/// store or the cache end the command.
fn compute(
    session: &ReviewSession,
    info: &CheckpointInfo,
    base: Option<&CheckpointInfo>,
    budget: &mut PatchBudget,
) -> Result<std::result::Result<report::TurnBody, String>> {
    let checkpoint = match session.load(info) {
        Ok(checkpoint) => checkpoint,
        Err(e) => return Ok(Err(unreadable(&e)?)),
    };
    let base_checkpoint = match base.map(|b| session.load(b)).transpose() {
        Ok(loaded) => loaded,
        Err(e) => {
            let reason = unreadable(&e)?;
            let base = base.expect("loaded only with a base");
            return Ok(Err(format!(
                "the checkpoint it is compared with, {}, cannot be read: {reason}",
                base.id.short()
            )));
        }
    };
    let body = report::turn(base_checkpoint.as_deref(), &checkpoint, budget)
        .with_context(|| format!("cannot read checkpoint {}", info.id))?;
    session.trim(&[&info.id]);
    Ok(Ok(body))
}

/// OUTDIR and its two folders, opened once (see the module's comment).
struct OutDir {
    path: PathBuf,
    top: OwnedFd,
    /// `.ckptfs-report/`: the manifest and the page bodies.
    state: OwnedFd,
    turns: OwnedFd,
}

impl OutDir {
    /// Makes OUTDIR and its folders; refuses a directory that holds anything but a
    /// report, and folders that are not the user's own.
    fn prepare(outdir: &Path) -> Result<OutDir> {
        fs::create_dir_all(outdir)
            .with_context(|| format!("cannot make the report directory {}", outdir.display()))?;
        let top = rfs::open(
            outdir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("cannot open the report directory {}", outdir.display()))?;
        let empty = beneath::list(&top)
            .with_context(|| format!("cannot read {}", outdir.display()))?
            .is_empty();
        let is_report = beneath::open_dir(&top, OsStr::new(STATE))
            .is_ok_and(|state| beneath::is_own_file_at(&state, OsStr::new(MANIFEST)));
        if !empty && !is_report {
            bail!(
                "{} is not empty and holds no ckptfs report: give a new or empty directory \
                 (a report writes index.html and turns/ there)",
                outdir.display()
            );
        }
        Ok(OutDir {
            state: own_folder(&top, outdir, STATE)?,
            turns: own_folder(&top, outdir, TURNS)?,
            path: outdir.to_owned(),
            top,
        })
    }

    /// Writes `name` in `dir` (one of the three) whole or not at all, replacing what
    /// was there, a symlink included, rather than writing through it.
    fn write(&self, dir: &OwnedFd, name: &str, bytes: &[u8]) -> Result<()> {
        // Readable as a web page is (the umask still applies).
        beneath::replace_file_at(dir, name, bytes, 0o644)
            .with_context(|| format!("cannot write {}", self.shown(dir, name).display()))
    }

    fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        self.write(&self.state, MANIFEST, &serde_json::to_vec_pretty(manifest)?)
    }

    /// The earlier report's manifest; an empty one when there is none, or when
    /// another version made it.
    fn read_manifest(&self) -> Manifest {
        let fresh = Manifest {
            format: FORMAT,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            turns: BTreeMap::new(),
        };
        let Some(bytes) = beneath::read_own_file_at(&self.state, OsStr::new(MANIFEST), LARGEST)
        else {
            return fresh;
        };
        match serde_json::from_slice::<Manifest>(&bytes) {
            Ok(m) if m.format == fresh.format && m.version == fresh.version => m,
            Ok(_) => {
                say::note!(
                    "the earlier report was made by another version: every turn is computed again"
                );
                fresh
            }
            Err(e) => {
                say::note!(
                    "the earlier report's manifest cannot be read ({e}): every turn is computed again"
                );
                fresh
            }
        }
    }

    /// Whether the body of `id` against `base` is there, as a run signed it with
    /// `computed`'s counts.
    fn body_verifies(
        &self,
        signer: &Signer,
        id: &CheckpointId,
        base: Option<&CheckpointInfo>,
        computed: &Computed,
    ) -> bool {
        beneath::read_own_file_at(&self.state, OsStr::new(&body_name(id, base)), LARGEST)
            .is_some_and(|body| signer.verifies(id.as_str(), computed, &body))
    }

    fn write_body(
        &self,
        id: &CheckpointId,
        base: Option<&CheckpointInfo>,
        html: &[u8],
    ) -> Result<()> {
        self.write(&self.state, &body_name(id, base), html)
    }

    /// The body of `id` against `base` for its page, checked again against the MAC
    /// the manifest holds for it (whoever can write OUTDIR could have replaced it
    /// since it was written or checked).
    fn read_body(
        &self,
        signer: &Signer,
        id: &CheckpointId,
        base: Option<&CheckpointInfo>,
        manifest: &Manifest,
    ) -> Result<String> {
        let name = body_name(id, base);
        let shown = self.shown(&self.state, &name);
        let bytes = beneath::read_own_file_at(&self.state, OsStr::new(&name), LARGEST)
            .with_context(|| {
                format!(
                    "cannot read {} (not a file of this user, or gone)",
                    shown.display()
                )
            })?;
        let signed = manifest
            .turns
            .get(id.as_str())
            .is_some_and(|computed| signer.verifies(id.as_str(), computed, &bytes));
        if !signed {
            bail!(
                "{} changed while the report was being made (it is not what this run \
                 wrote or checked); make the report again",
                shown.display()
            );
        }
        String::from_utf8(bytes).with_context(|| format!("{name} is not text"))
    }

    /// Deletes the turn pages of turns this report does not show (a narrower run),
    /// and the bodies the manifest no longer names (a turn compared with another
    /// checkpoint since).
    fn remove_stale_files(&self, rows: &[Row<'_>], manifest: &Manifest) -> Result<()> {
        let pages: HashSet<String> = rows.iter().map(|r| turn_name(&r.info.id)).collect();
        let bodies: HashSet<String> = manifest
            .turns
            .iter()
            .map(|(id, c)| format!("{id}.{}.html", c.base.as_deref().unwrap_or("first")))
            .collect();
        let ours = |name: &str| {
            name.strip_suffix(".html").is_some_and(|stem| {
                let mut parts = stem.split('.');
                parts.next().and_then(CheckpointId::parse).is_some()
                    && parts.all(|p| p == "first" || CheckpointId::parse(p).is_some())
            })
        };
        for (dir, keep) in [(&self.turns, &pages), (&self.state, &bodies)] {
            let names = beneath::list(dir)
                .with_context(|| format!("cannot read {}", self.shown(dir, "").display()))?;
            for (name, is_dir) in names {
                let Ok(name) = String::from_utf8(name) else {
                    continue;
                };
                if !is_dir && ours(&name) && !keep.contains(&name) {
                    rfs::unlinkat(dir, name.as_str(), AtFlags::empty()).with_context(|| {
                        format!("cannot remove {}", self.shown(dir, &name).display())
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Where `name` in `dir` is, for messages.
    fn shown(&self, dir: &OwnedFd, name: &str) -> PathBuf {
        use std::os::fd::AsRawFd;
        let folder = if dir.as_raw_fd() == self.state.as_raw_fd() {
            self.path.join(STATE)
        } else if dir.as_raw_fd() == self.turns.as_raw_fd() {
            self.path.join(TURNS)
        } else {
            self.path.clone()
        };
        folder.join(name)
    }
}

/// Bodies and manifests larger than this are not read back (a report's own are far
/// smaller: patches are bounded by [`PatchBudget`]).
const LARGEST: u64 = 1 << 32;

/// Makes folder `name` of OUTDIR if missing and opens it, refusing a symlink and a
/// folder of another user; one of this user's that others may write is closed to them
/// first (nothing in it is taken that is not this user's).
fn own_folder(top: &OwnedFd, outdir: &Path, name: &str) -> Result<OwnedFd> {
    let path = outdir.join(name);
    match rfs::mkdirat(top, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot make {}", path.display())),
    }
    let dir = beneath::open_dir(top, OsStr::new(name))
        .with_context(|| format!("cannot open {} (a symlink is refused)", path.display()))?;
    let stat = rfs::fstat(&dir).with_context(|| format!("cannot stat {}", path.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != me {
        bail!(
            "{} belongs to uid {}, not to the user making the report ({me}): refusing to \
             write in it (its owner could turn its files into links to others)",
            path.display(),
            stat.st_uid
        );
    }
    if stat.st_mode & 0o022 != 0 {
        rfs::fchmod(&dir, Mode::from_raw_mode(stat.st_mode & 0o755))
            .with_context(|| format!("cannot chmod {}", path.display()))?;
    }
    Ok(dir)
}

/// The body of `id`'s page compared with `base`: `<sha256>.<base sha256>.html`, or
/// `<sha256>.first.html`.
fn body_name(id: &CheckpointId, base: Option<&CheckpointInfo>) -> String {
    let base = base.map_or("first", |b| b.id.as_str());
    format!("{}.{base}.html", id.as_str())
}

fn turn_name(id: &CheckpointId) -> String {
    format!("{}.html", id.as_str())
}

/// When this run verified the turns.
struct Verified {
    started: SystemTime,
    finished: SystemTime,
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn turn_link(info: &CheckpointInfo) -> String {
    format!("{}.html", info.id.as_str())
}

/// What a turn was compared with, as a sentence of HTML for its page.
fn compared_with(row: &Row<'_>) -> String {
    let link = |info: &CheckpointInfo| {
        format!(
            "<a class=\"mono\" href=\"{}\">{}</a>",
            turn_link(info),
            info.id.short()
        )
    };
    match (&row.parent, row.base) {
        (Some(parent), Some(base)) if base.id == *parent => {
            format!("its parent {} (from metadata)", link(base))
        }
        (Some(parent), base) => format!(
            "{} (its parent {} from metadata is not in the store)",
            base.map_or("nothing".to_owned(), |b| format!(
                "the turn before, {}",
                link(b)
            )),
            parent.short()
        ),
        (None, Some(base)) => format!("the turn before, {}", link(base)),
        (None, None) => "nothing (everything is added)".to_owned(),
    }
}

/// A size as people read it, and in bytes when that rounds.
fn size_in_full(size: u64) -> String {
    match html::bytes(size) {
        shown if size < 1024 => shown,
        shown => format!("{shown} ({size} bytes)"),
    }
}

/// [`compared_with`] in a word and a link, for the index's table.
fn compared_briefly(row: &Row<'_>) -> String {
    let Some(base) = row.base else {
        return "nothing".to_owned();
    };
    let word = match &row.parent {
        Some(parent) if *parent == base.id => "parent",
        _ => "turn before",
    };
    format!(
        "{word} <a class=\"mono\" href=\"turns/{}\">{}</a>",
        turn_link(base),
        base.id.short()
    )
}

/// The page of turn `i`, with `body`, its diff, when it verified.
fn turn_page(rows: &[Row<'_>], i: usize, when: &Verified, body: Option<&str>) -> Result<String> {
    let row = &rows[i];
    let id = &row.info.id;
    let mut out = page_start(&format!("turn {} · ckptfs report", id.short()));
    out.push_str("<nav><a href=\"../index.html\">All turns</a>");
    if let Some(before) = i.checked_sub(1).map(|j| rows[j].info) {
        let _ = write!(
            out,
            "<a href=\"{}\">&larr; turn {} ({})</a>",
            turn_link(before),
            i,
            before.id.short()
        );
    }
    if let Some(after) = rows.get(i + 1).map(|r| r.info) {
        let _ = write!(
            out,
            "<a href=\"{}\">turn {} ({}) &rarr;</a>",
            turn_link(after),
            i + 2,
            after.id.short()
        );
    }
    out.push_str("</nav>\n");
    let _ = write!(
        out,
        "<h1>Turn {} of {}: <span class=\"mono\">{}</span></h1>\n<div class=\"scroll\"><table>\
         <tr><th>sha256</th><td class=\"mono\">{}</td></tr>\
         <tr><th>stored</th><td>{}</td></tr>\
         <tr><th>object size</th><td>{}</td></tr>\
         <tr><th>compared with</th><td>{}</td></tr>",
        i + 1,
        rows.len(),
        id.short(),
        id.as_str(),
        time(row.info.last_modified),
        size_in_full(row.info.size),
        compared_with(row),
    );
    match &row.outcome {
        Ok(stats) => {
            let _ = writeln!(
                out,
                "<tr><th>workspace</th><td>{} files, {}</td></tr>\
                 <tr><th>verified</th><td>downloaded and hashed against its name \
                 between {} and {}</td></tr></table></div>",
                stats.files,
                html::bytes(stats.unpacked_bytes),
                time(when.started),
                time(when.finished)
            );
            out.push_str(body.expect("a body for every turn that verified"));
        }
        Err(reason) => {
            let _ = write!(
                out,
                "<tr><th>verified</th><td class=\"bad\">FAILED: {}</td></tr></table></div>\n\
                 <p>Nothing of this checkpoint is shown: it did not verify.</p>\n",
                html::text(reason)
            );
        }
    }
    out.push_str(PAGE_END);
    Ok(out)
}

fn index_page(store: &str, rows: &[Row<'_>], when: &Verified) -> String {
    let failed: Vec<&Row<'_>> = rows.iter().filter(|r| r.outcome.is_err()).collect();
    let mut out = page_start("ckptfs report");
    let _ = write!(
        out,
        "<h1>Checkpoint history</h1>\n<p>Store <code>{}</code> &middot; {} turns &middot; \
         made {} by ckptfs {}</p>\n<h2>Integrity</h2>\n<p>Every checkpoint below was \
         downloaded and hashed against its name (its SHA-256 and size) while this report \
         was made, between {} and {}: {} verified, {}.</p>\n",
        html::text(store),
        rows.len(),
        time(when.finished),
        env!("CARGO_PKG_VERSION"),
        time(when.started),
        time(when.finished),
        rows.len() - failed.len(),
        if failed.is_empty() {
            "none failed".to_owned()
        } else {
            format!("<span class=\"bad\">{} FAILED</span>", failed.len())
        }
    );
    if !failed.is_empty() {
        out.push_str("<ul>");
        for row in &failed {
            let _ = write!(
                out,
                "<li><a class=\"mono\" href=\"turns/{}\">{}</a>: <span class=\"bad\">FAILED</span> {}</li>",
                turn_link(row.info),
                row.info.id.short(),
                html::text(row.outcome.as_ref().err().map_or("", String::as_str))
            );
        }
        out.push_str("</ul>\n");
    }
    let chart: Vec<ChartTurn> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let stats = row.outcome.as_ref().ok();
            ChartTurn {
                size: stats.map_or(0, |s| s.unpacked_bytes),
                lines: Lines {
                    added: stats.map_or(0, |s| s.lines_added),
                    removed: stats.map_or(0, |s| s.lines_removed),
                },
                label: format!("turn {} ({})", i + 1, row.info.id.short()),
            }
        })
        .collect();
    out.push_str("<h2>Turns</h2>\n");
    out.push_str(&html::chart(&chart));
    out.push_str(
        "<div class=\"scroll\"><table>\n<tr><th class=\"num\">#</th><th>stored</th>\
         <th>sha256</th><th class=\"num\">size</th><th class=\"num\">files</th>\
         <th class=\"num\">added</th><th class=\"num\">modified</th>\
         <th class=\"num\">removed</th><th class=\"num\">renamed</th>\
         <th class=\"num\">lines</th><th>compared with</th></tr>\n",
    );
    for (i, row) in rows.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td class=\"num\">{}</td><td>{}</td>\
             <td><a class=\"mono\" href=\"turns/{}\">{}</a></td><td class=\"num\">{}</td>",
            i + 1,
            time(row.info.last_modified),
            turn_link(row.info),
            row.info.id.short(),
            html::bytes(row.info.size),
        );
        match &row.outcome {
            Ok(s) => {
                let _ = writeln!(
                    out,
                    "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                     <td class=\"num\">{}</td><td class=\"num\">{}</td>\
                     <td class=\"num\">+{} &minus;{}</td><td>{}</td></tr>",
                    s.files,
                    s.added,
                    s.modified,
                    s.removed,
                    s.renamed,
                    s.lines_added,
                    s.lines_removed,
                    compared_briefly(row)
                );
            }
            Err(_) => {
                out.push_str(
                    "<td colspan=\"7\" class=\"bad\">FAILED (see the integrity section)</td></tr>\n",
                );
            }
        }
    }
    out.push_str("</table></div>\n");
    out.push_str(PAGE_END);
    out
}
