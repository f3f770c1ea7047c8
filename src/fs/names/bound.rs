//! The bound every cache of a mount's names keeps (`listings`, `last_seen`).

use std::collections::BTreeMap;
use std::time::Instant;

/// How many directories' listings a mount keeps; past it the oldest quarter is forgotten.
/// Forgetting is always safe (the next look asks the store server again); without a bound a
/// long-lived mount that walked a large tree kept every listing, entry and resolved version it
/// ever saw. About 1 KiB per listing of ten names.
pub const MAX_LISTINGS: usize = 16_384;
/// The same for entries asked for alone, link counts and resolved versions (a version holds
/// its manifest: about 100 bytes per block).
pub const MAX_ENTRIES: usize = 65_536;

/// Keeps the cache `m` at most `max` long: past it, the oldest quarter (by when each was
/// taken) is forgotten at once, so the scan that finds them runs once per `max / 4` inserts.
pub(crate) fn bound<V>(m: &mut BTreeMap<String, V>, max: usize, at: impl Fn(&V) -> Instant) {
    if m.len() <= max {
        return;
    }
    let mut times: Vec<Instant> = m.values().map(&at).collect();
    let cut = times.len() - max * 3 / 4;
    let (_, oldest_kept, _) = times.select_nth_unstable(cut);
    let oldest_kept = *oldest_kept;
    m.retain(|_, v| at(v) >= oldest_kept);
    // Taken at one instant (a coarse clock): any of them go.
    if m.len() > max {
        let extra: Vec<String> = m.keys().take(m.len() - max * 3 / 4).cloned().collect();
        for k in extra {
            m.remove(&k);
        }
    }
}
