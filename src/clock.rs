//! The clock seam: every lease, TTL and quorum deadline is computed from a [`Clock`] passed in,
//! never from `Instant::now()` read on the spot, so tests move time forward instead of sleeping.
//!
//! Two readings travel together: a monotonic [`Instant`] for leases and deadlines (immune to
//! the wall clock being set), and wall-clock milliseconds for what is stored or shown (a key's
//! expiry, when a window opened).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One reading of a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    pub at: Instant,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: i64,
    /// The same reading in nanoseconds, for timestamps shown to the second's fraction.
    pub unix_ns: i64,
}

impl Moment {
    /// The wall-clock reading as seconds and nanoseconds since the Unix epoch.
    pub fn unix(&self) -> (i64, u32) {
        (
            self.unix_ns.div_euclid(1_000_000_000),
            self.unix_ns.rem_euclid(1_000_000_000) as u32,
        )
    }
}

impl std::ops::Add<Duration> for Moment {
    type Output = Moment;

    fn add(self, d: Duration) -> Moment {
        Moment {
            at: self.at + d,
            unix_ms: self.unix_ms + d.as_millis() as i64,
            unix_ns: self.unix_ns + d.as_nanos() as i64,
        }
    }
}

pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Moment;
}

pub type SharedClock = Arc<dyn Clock>;

/// The machine's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Moment {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Moment {
            at: Instant::now(),
            unix_ms: wall.as_millis() as i64,
            unix_ns: wall.as_nanos() as i64,
        }
    }
}

/// The machine's clocks, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to: for tests of leases, TTLs and quorum timeouts.
#[derive(Clone, Debug)]
pub struct ManualClock {
    start: Moment,
    elapsed: Arc<Mutex<Duration>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            start: SystemClock.now(),
            elapsed: Arc::default(),
        }
    }
}

impl ManualClock {
    /// Moves both readings forward by `d`.
    pub fn advance(&self, d: Duration) {
        *crate::locks::lock(&self.elapsed) += d;
    }

    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Moment {
        let d = *crate::locks::lock(&self.elapsed);
        self.start + d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::default();
        let a = c.now();
        assert_eq!(c.now(), a);
        c.advance(Duration::from_millis(1500));
        let b = c.now();
        assert_eq!(b.at - a.at, Duration::from_millis(1500));
        assert_eq!(b.unix_ms - a.unix_ms, 1500);
    }
}
