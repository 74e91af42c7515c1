//! The text of `.status`: the store, the listing, the cache, the seals, and one line
//! per checkpoint with its state. The format is documented in the README and kept
//! stable (lines may be added, never changed): `#` lines first, then
//! `<sha256>  <size>  <time>  <state>` per checkpoint, oldest first, where state is
//! `listed`, `verifying`, `verified <time> from the store` (downloaded and verified
//! then), `verified <time> when sealed by this mount` (archived and stored then),
//! `verified <time> from the store, served from the cache (re-checked <time>)` (a
//! cache entry made then, its contents checked against its index since), or
//! `FAILED: <reason>`.

use std::sync::Arc;

use super::listing::Listing;
use super::loader::Loader;
use super::metrics::Latencies;
use super::sealer::SealsReport;
use crate::cache::{Cache, CacheStats};

/// What `.status` reports on besides the listing and the seals: the store's name, the
/// cache, the loader's queue and the request latencies.
pub struct Sources {
    pub store_name: String,
    pub cache: Arc<Cache>,
    pub loader: Arc<Loader>,
    pub latencies: Arc<Latencies>,
}

impl Sources {
    /// The text of `.status` now.
    pub fn render(&self, listing: &Listing, seals: &SealsReport) -> Vec<u8> {
        render(
            &self.store_name,
            listing,
            self.cache.stats(),
            seals,
            self.loader.queued(),
            super::error::counts(),
            &self.latencies.render(),
        )
    }
}

pub fn render(
    store: &str,
    listing: &Listing,
    cache: CacheStats,
    seals: &SealsReport,
    loads_waiting: usize,
    errors: super::error::Counts,
    latencies: &str,
) -> Vec<u8> {
    let mut text = format!("# ckptfs: {store}\n");
    if let Some(at) = listing.listed_at {
        text += &format!("# listed: {}\n", humantime::format_rfc3339_seconds(at));
    }
    if let Some(error) = &listing.error {
        text += &format!("# listing failed: {error}\n");
    }
    text += &format!(
        "# checkpoints: {}; cache: {} bytes in {} checkpoints; downloads: {}; loaded from cache: {}\n",
        listing.order.len(),
        cache.used_bytes,
        cache.entries,
        cache.downloads,
        cache.reuses,
    );
    text += &format!(
        "# downloaded: {} bytes; evicted: {}; seals: {} sealed, {} failed; I/O errors: {}\n",
        cache.downloaded_bytes, cache.evictions, seals.succeeded, seals.failed, errors.io_errors,
    );
    if errors.commit_refusals > 0 {
        text += &format!(
            "# refused in commit/: {} (it only takes `mv staging/NAME commit/`)\n",
            errors.commit_refusals
        );
    }
    text += &format!(
        "# gzip members of downloads: {} rebuilt from the cache, {} inflated\n",
        cache.reused_members, cache.inflated_members,
    );
    text += &format!(
        "# large files of checkpoints linked to an earlier entry's, unwritten: {} bytes\n",
        cache.linked_unwritten_bytes,
    );
    if loads_waiting > 0 {
        text += &format!("# loads waiting for a loader: {loads_waiting}\n");
    }
    text += latencies;
    for name in &seals.in_progress {
        text += &format!("# seal in progress: {}\n", crate::printable::escape(name));
    }
    for outcome in &seals.outcomes {
        text += &format!("# seal {outcome}\n");
    }
    for slot in &listing.order {
        let state = slot.load.lock().expect("slot lock").describe();
        text += &format!(
            "{}  {}  {}  {state}\n",
            slot.info.id,
            slot.info.size,
            humantime::format_rfc3339_seconds(slot.info.last_modified)
        );
    }
    text.into_bytes()
}

/// `.status` read back, for `ckptfs status --json`. Parsing lives beside rendering so
/// that the two cannot drift apart; lines this version does not know are skipped.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub store: String,
    pub listed: Option<String>,
    pub listing_error: Option<String>,
    pub counters: Counters,
    pub seals_in_progress: Vec<String>,
    pub seals: Vec<Seal>,
    pub latencies: Vec<Latency>,
    pub checkpoints: Vec<CheckpointState>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub checkpoints: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    pub downloads: u64,
    pub loaded_from_cache: u64,
    pub loads_waiting: u64,
    pub downloaded_bytes: u64,
    /// Gzip members of downloads rebuilt from the cache, and inflated.
    pub members_rebuilt: u64,
    pub members_inflated: u64,
    pub evictions: u64,
    pub seals_sealed: u64,
    pub seals_failed: u64,
    /// Requests answered EIO.
    pub io_errors: u64,
    /// Requests refused in `commit/` (anything but a seal).
    pub commit_refusals: u64,
}

/// One of the last seals: `.status`'s `# seal NAME: sealed as SHA (HOW)` or
/// `# seal NAME: FAILED: ERROR`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Seal {
    /// The name moved into `commit/`, as it was.
    pub workspace: String,
    /// `sealed` or `failed`.
    pub outcome: String,
    pub checkpoint: Option<String>,
    /// For `sealed`: `stored`, `already present, verified`, or `stored over a
    /// damaged copy (...)`.
    pub how: Option<String>,
    pub error: Option<String>,
}

/// Request latencies of one operation, in microseconds: each percentile is the upper
/// bound of a power-of-two bucket.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Latency {
    pub operation: String,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The time all these requests took, in seconds.
    pub total_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointState {
    pub sha256: String,
    pub size: u64,
    pub time: String,
    /// `listed`, `verifying`, `verified` or `failed`.
    pub state: String,
    /// For `verified`: when the object was downloaded and verified.
    pub verified_at: Option<String>,
    /// For `verified`: `store` (verified by this load), `seal` (archived and stored
    /// by this mount) or `cache` (an entry verified earlier, re-checked against its
    /// index at `rechecked_at`).
    pub from: Option<String>,
    pub rechecked_at: Option<String>,
    /// For `failed`: why.
    pub reason: Option<String>,
}

/// A name or an outcome as `.status` shows it escaped, given back as it was (lossily
/// made UTF-8 for JSON).
fn unescaped(text: &str) -> String {
    String::from_utf8_lossy(&crate::printable::unescape(text)).into_owned()
}

fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// A `Duration`'s `Debug` text (`512ns`, `32µs`, `1.024ms`, `2.097152s`) in
/// microseconds.
fn micros(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit {
        "ns" => 1e-3,
        "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        _ => return None,
    };
    Some(number * scale)
}

/// A seal line after `# seal `: the name (escaped, colons too, so that the first
/// `: ` ends it), then `sealed as SHA (HOW)` or `FAILED: ERROR`.
fn seal(line: &str) -> Option<Seal> {
    let (name, rest) = line.split_once(": ")?;
    let workspace = unescaped(name);
    if let Some(sealed) = rest.strip_prefix("sealed as ") {
        let (checkpoint, how) = sealed.split_once(" (")?;
        return Some(Seal {
            workspace,
            outcome: "sealed".to_owned(),
            checkpoint: Some(checkpoint.to_owned()),
            how: Some(how.strip_suffix(')')?.to_owned()),
            error: None,
        });
    }
    let error = rest.strip_prefix("FAILED: ")?;
    Some(Seal {
        workspace,
        outcome: "failed".to_owned(),
        checkpoint: None,
        how: None,
        error: Some(unescaped(error)),
    })
}

pub fn parse(text: &str) -> Report {
    let mut report = Report::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            if let Some(store) = rest.strip_prefix("ckptfs: ") {
                report.store = store.to_owned();
            } else if let Some(at) = rest.strip_prefix("listed: ") {
                report.listed = Some(at.to_owned());
            } else if let Some(error) = rest.strip_prefix("listing failed: ") {
                report.listing_error = Some(error.to_owned());
            } else if let Some(counts) = rest.strip_prefix("checkpoints: ") {
                if let [n, bytes, entries, downloads, reuses] = numbers(counts)[..] {
                    let c = &mut report.counters;
                    c.checkpoints = n;
                    c.cache_bytes = bytes;
                    c.cache_entries = entries;
                    c.downloads = downloads;
                    c.loaded_from_cache = reuses;
                }
            } else if let Some(counts) = rest.strip_prefix("downloaded: ") {
                if let [bytes, evicted, sealed, failed, errors] = numbers(counts)[..] {
                    let c = &mut report.counters;
                    c.downloaded_bytes = bytes;
                    c.evictions = evicted;
                    c.seals_sealed = sealed;
                    c.seals_failed = failed;
                    c.io_errors = errors;
                }
            } else if let Some(counts) = rest.strip_prefix("gzip members of downloads: ") {
                if let [reused, inflated] = numbers(counts)[..] {
                    report.counters.members_rebuilt = reused;
                    report.counters.members_inflated = inflated;
                }
            } else if let Some(n) = rest.strip_prefix("refused in commit/: ") {
                report.counters.commit_refusals = numbers(n).first().copied().unwrap_or(0);
            } else if let Some(n) = rest.strip_prefix("loads waiting for a loader: ") {
                report.counters.loads_waiting = n.trim().parse().unwrap_or(0);
            } else if let Some(rest) = rest.strip_prefix("latency ") {
                let Some((operation, facts)) = rest.split_once(": ") else {
                    continue;
                };
                let parts: Vec<&str> = facts.split(", ").collect();
                if let [requests, p50, p99, ref more @ ..] = parts[..] {
                    report.latencies.push(Latency {
                        operation: operation.to_owned(),
                        requests: numbers(requests).first().copied().unwrap_or(0),
                        p50_us: micros(p50.trim_start_matches("p50 < ")).unwrap_or(0.0),
                        p99_us: micros(p99.trim_start_matches("p99 < ")).unwrap_or(0.0),
                        total_s: more.first().and_then(|t| {
                            t.strip_prefix("total ")?
                                .trim_end_matches(" s")
                                .parse()
                                .ok()
                        }),
                    });
                }
            } else if let Some(name) = rest.strip_prefix("seal in progress: ") {
                report.seals_in_progress.push(unescaped(name));
            } else if let Some(outcome) = rest.strip_prefix("seal ") {
                report.seals.extend(seal(outcome));
            }
            continue;
        }
        let fields: Vec<&str> = line.splitn(4, "  ").collect();
        if let [sha, size, time, state] = fields[..] {
            let mut checkpoint = CheckpointState {
                sha256: sha.to_owned(),
                size: size.parse().unwrap_or(0),
                time: time.to_owned(),
                state: state.to_owned(),
                verified_at: None,
                from: None,
                rechecked_at: None,
                reason: None,
            };
            if let Some(reason) = state.strip_prefix("FAILED: ") {
                checkpoint.state = "failed".to_owned();
                checkpoint.reason = Some(reason.to_owned());
            } else if let Some(verdict) = state.strip_prefix("verified ") {
                checkpoint.state = "verified".to_owned();
                checkpoint.verified_at = verdict.split(' ').next().map(str::to_owned);
                let rechecked = verdict
                    .split_once("(re-checked ")
                    .map(|(_, rest)| rest.trim_end_matches(')').to_owned());
                let from = if rechecked.is_some() {
                    "cache"
                } else if verdict.ends_with("when sealed by this mount") {
                    "seal"
                } else {
                    "store"
                };
                checkpoint.from = Some(from.to_owned());
                checkpoint.rechecked_at = rechecked;
            }
            report.checkpoints.push(checkpoint);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_text_parses_back() {
        let text = "# ckptfs: s3://b/p/\n# listed: 2026-12-01T00:00:00Z\n\
            # checkpoints: 2; cache: 300 bytes in 1 checkpoints; downloads: 4; loaded from cache: 1\n\
            # downloaded: 5000 bytes; evicted: 2; seals: 3 sealed, 1 failed; I/O errors: 7\n\
            # loads waiting for a loader: 3\n\
            # refused in commit/: 2 (it only takes `mv staging/NAME commit/`)\n\
            # latency lookup: 10 requests, p50 < 32µs, p99 < 1.024ms, total 0.046 s\n\
            # latency read: 1 request, p50 < 512ns, p99 < 2.097152s\n\
            # seal in progress: turn-9\n# seal turn-8: sealed as abc (stored)\n\
            # seal a\\x0ab: FAILED: too many entries: 20000\n\
            # seal w\\x3a sealed as ffff (stored: FAILED: the path ddd is longer (PATH_MAX)\n\
            aaaa  12  2026-12-01T00:00:00Z  verified 2026-12-01T00:00:05Z from the store\n\
            dddd  78  2026-12-01T00:00:03Z  verified 2026-12-01T00:00:03Z when sealed by this mount\n\
            cccc  56  2026-12-01T00:00:02Z  verified 2026-11-30T10:00:00Z from the store, served from the cache (re-checked 2026-12-01T00:00:09Z)\n\
            bbbb  34  2026-12-01T00:00:01Z  FAILED: Checkpoint checksum mismatch: x  y\n";
        let report = parse(text);
        assert_eq!(report.store, "s3://b/p/");
        assert_eq!(report.counters.downloads, 4);
        assert_eq!(report.counters.loads_waiting, 3);
        assert_eq!(report.counters.commit_refusals, 2);
        let [lookup, read] = &report.latencies[..] else {
            panic!("{:?}", report.latencies)
        };
        assert_eq!(
            (lookup.p50_us, lookup.p99_us, lookup.total_s),
            (32.0, 1024.0, Some(0.046))
        );
        assert_eq!(
            (read.p50_us, read.p99_us, read.total_s),
            (0.512, 2_097_152.0, None)
        );
        let [sealed, failed, forged] = &report.seals[..] else {
            panic!("{:?}", report.seals)
        };
        assert_eq!(
            (sealed.workspace.as_str(), sealed.outcome.as_str()),
            ("turn-8", "sealed")
        );
        assert_eq!(
            (sealed.checkpoint.as_deref(), sealed.how.as_deref()),
            (Some("abc"), Some("stored"))
        );
        assert_eq!(
            (failed.workspace.as_str(), failed.outcome.as_str()),
            ("a\nb", "failed")
        );
        assert_eq!(failed.error.as_deref(), Some("too many entries: 20000"));
        // A name that holds the text of a success is still a failure of that name.
        assert_eq!(
            (
                forged.workspace.as_str(),
                forged.outcome.as_str(),
                forged.checkpoint.as_deref()
            ),
            ("w: sealed as ffff (stored", "failed", None)
        );
        assert_eq!(report.counters.downloaded_bytes, 5000);
        assert_eq!(report.counters.evictions, 2);
        assert_eq!(report.counters.seals_sealed, 3);
        assert_eq!(report.counters.seals_failed, 1);
        assert_eq!(report.counters.io_errors, 7);
        assert_eq!(report.checkpoints.len(), 4);
        let [store, sealed, cache, failed] = &report.checkpoints[..] else {
            unreachable!()
        };
        assert_eq!(sealed.from.as_deref(), Some("seal"));
        assert_eq!(store.state, "verified");
        assert_eq!(store.from.as_deref(), Some("store"));
        assert_eq!(store.verified_at.as_deref(), Some("2026-12-01T00:00:05Z"));
        assert_eq!(cache.from.as_deref(), Some("cache"));
        assert_eq!(cache.verified_at.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert_eq!(cache.rechecked_at.as_deref(), Some("2026-12-01T00:00:09Z"));
        assert_eq!(failed.state, "failed");
        assert_eq!(
            failed.reason.as_deref(),
            Some("Checkpoint checksum mismatch: x  y")
        );
    }
}
