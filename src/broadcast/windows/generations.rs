//! Window generations, unique across the replicas that own a group's windows in turn: a
//! member's syncs name its window by group and generation and itself by its place in it, so a
//! member of a window whose owner died must find no window at the next owner (and join again),
//! never a window of the same generation where its place is someone else's. They start from
//! the clock, in microseconds, rather than from zero.

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub(super) struct Generations(u64);

impl Default for Generations {
    fn default() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX >> 1));
        Generations(now)
    }
}

impl Generations {
    /// The next window's generation.
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.saturating_add(1);
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_server_starts_past_an_earlier_ones_generations() {
        let mut earlier = Generations::default();
        let first = earlier.next();
        assert_eq!(earlier.next(), first + 1);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut later = Generations::default();
        assert!(later.next() > first + 1);
    }
}
