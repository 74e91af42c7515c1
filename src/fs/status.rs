//! The text of `.status`: the store, the listing, the cache, the seals, and one line
//! per checkpoint with its state. The format is documented in the README and kept
//! stable: `#` lines first, then `<sha256>  <size>  <time>  <state>` per checkpoint,
//! oldest first, where state is `listed`, `verifying`, `verified` or
//! `FAILED: <reason>`.

use super::listing::Listing;
use super::sealer::SealsReport;
use crate::cache::CacheStats;

pub fn render(
    store: &str,
    listing: &Listing,
    cache: CacheStats,
    seals: &SealsReport,
    loads_waiting: usize,
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
    if loads_waiting > 0 {
        text += &format!("# loads waiting for a loader: {loads_waiting}\n");
    }
    text += latencies;
    for name in &seals.in_progress {
        text += &format!("# seal in progress: {}\n", String::from_utf8_lossy(name));
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
