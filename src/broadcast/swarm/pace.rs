//! When a member's fetches will end, so that it can tell the server a round trip early.
//!
//! Without it, a source's uplink idles after every piece it sends: the member verifies the
//! piece, syncs (half a round trip), the board gives the source its next downloader, whose sync
//! is answered (another half), and that member's request reaches the source (a third): the
//! simulation's 2 ms links cost a source 8 ms per piece, 15% of a 52 ms piece (256 pieces of
//! 64 MiB at 40 Mbit/s). A member that says "ending" that long before the end lets the board
//! line the source's next upload up behind the one ending, and its own next fetch too.
//!
//! The estimate is plain: the time per byte of the fetches that ended (a moving average), and
//! the round trip of syncs the server answered at once. A fetch ending earlier than said costs
//! nothing; one ending later than said shares its source's uplink with the next for a while.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Weight of the newest sample in the moving averages.
const ALPHA: f64 = 0.25;

#[derive(Clone, Copy, Debug)]
struct Running {
    started: Instant,
    bytes: u64,
    told: bool,
}

/// One member's estimate of when its fetches end.
#[derive(Debug, Default)]
pub struct Pace {
    /// Seconds per byte of a whole fetch, its first byte's wait included.
    per_byte: Option<f64>,
    /// A sync's round trip, in seconds.
    round_trip: Option<f64>,
    running: HashMap<u32, Running>,
}

fn average(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(o) => o + ALPHA * (new - o),
        None => new,
    }
}

impl Pace {
    pub fn started(&mut self, piece: u32, bytes: u64, now: Instant) {
        self.running.insert(
            piece,
            Running {
                started: now,
                bytes,
                told: false,
            },
        );
    }

    /// A fetch ended; a whole one (`whole`: its piece verified) teaches the time per byte.
    pub fn ended(&mut self, piece: u32, whole: bool, now: Instant) {
        let Some(r) = self.running.remove(&piece) else {
            return;
        };
        if whole && r.bytes > 0 {
            let took = now.saturating_duration_since(r.started).as_secs_f64();
            self.per_byte = Some(average(self.per_byte, took / r.bytes as f64));
        }
    }

    /// A sync the server answered without holding it took this long.
    pub fn round_trip(&mut self, took: Duration) {
        self.round_trip = Some(average(self.round_trip, took.as_secs_f64()));
    }

    /// How long before its end a fetch is told ending: a sync's round trip for the news to
    /// reach the server and the next fetch to reach its member, and about as long again for
    /// that fetch's request to reach the source.
    fn lead(&self) -> Option<f64> {
        self.round_trip.map(|r| 2.0 * r)
    }

    fn tell_at(&self, r: &Running) -> Option<Instant> {
        let (per_byte, lead) = (self.per_byte?, self.lead()?);
        let left = (per_byte * r.bytes as f64 - lead).max(0.0);
        Some(r.started + Duration::from_secs_f64(left))
    }

    /// The fetches to tell ending now (each once), in piece order.
    pub fn due(&mut self, now: Instant) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .running
            .iter()
            .filter(|(_, r)| !r.told && self.tell_at(r).is_some_and(|t| t <= now))
            .map(|(&p, _)| p)
            .collect();
        out.sort_unstable();
        for p in &out {
            if let Some(r) = self.running.get_mut(p) {
                r.told = true;
            }
        }
        out
    }

    /// When the next fetch is due to be told ending, if any is.
    pub fn next_due(&self) -> Option<Instant> {
        self.running
            .values()
            .filter(|r| !r.told)
            .filter_map(|r| self.tell_at(r))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_is_told_ending_two_round_trips_before_its_expected_end_and_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pace::default();
        p.started(1, 1000, t0);
        assert!(p.due(t0 + ms(500)).is_empty(), "nothing learnt yet");
        p.round_trip(ms(4));
        assert!(p.due(t0 + ms(500)).is_empty(), "no time per byte yet");
        // 1000 bytes in 100 ms: 0.1 ms a byte.
        p.ended(1, true, t0 + ms(100));
        p.started(2, 1000, t0 + ms(100));
        assert_eq!(p.next_due(), Some(t0 + ms(192)));
        assert!(p.due(t0 + ms(191)).is_empty());
        assert_eq!(p.due(t0 + ms(192)), vec![2]);
        assert!(p.due(t0 + ms(300)).is_empty(), "told once");
        assert_eq!(p.next_due(), None);
        // A failed fetch teaches nothing.
        p.ended(2, false, t0 + ms(1000));
        p.started(3, 2000, t0 + ms(1000));
        assert_eq!(p.next_due(), Some(t0 + ms(1192)));
    }
}
