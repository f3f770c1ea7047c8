//! Polling against a deadline, the one loop behind every wait of [`super::nccl`].
//!
//! A non-blocking NCCL communicator answers at once and is asked again until it is ready, fails
//! or runs out of time; a stream is queried the same way. The loop is plain logic over a step
//! function, so it is tested here without NCCL: a step is always tried at least once (work that
//! is already done succeeds even past its deadline), pauses grow from `first` to `max`, and no
//! pause sleeps past the deadline.

use std::time::{Duration, Instant};

/// The pauses between two polls: `first`, doubling up to `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

/// Why [`poll_until`] stopped short of done.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stopped<E> {
    /// The step failed.
    Failed(E),
    /// The deadline passed; how long it polled.
    TimedOut(Duration),
}

/// Calls `step` until it answers `Ok(true)` (done), `Err` (failed), or `deadline` has passed
/// after an answer of `Ok(false)` (not yet).
pub(crate) fn poll_until<E>(
    deadline: Instant,
    backoff: Backoff,
    mut step: impl FnMut() -> Result<bool, E>,
) -> Result<(), Stopped<E>> {
    let started = Instant::now();
    let mut pause = backoff.first;
    loop {
        match step() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Stopped::Failed(e)),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Stopped::TimedOut(started.elapsed()));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(backoff.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Backoff = Backoff {
        first: Duration::from_micros(10),
        max: Duration::from_micros(200),
    };

    #[test]
    fn done_after_a_few_polls() {
        let mut polls = 0;
        let r: Result<(), Stopped<()>> =
            poll_until(Instant::now() + Duration::from_secs(10), FAST, || {
                polls += 1;
                Ok(polls == 3)
            });
        assert_eq!(r, Ok(()));
        assert_eq!(polls, 3);
    }

    #[test]
    fn work_already_done_succeeds_past_its_deadline() {
        let past = Instant::now() - Duration::from_secs(1);
        assert_eq!(poll_until::<()>(past, FAST, || Ok(true)), Ok(()));
    }

    #[test]
    fn a_failure_stops_polling_at_once() {
        let mut polls = 0;
        let r = poll_until(Instant::now() + Duration::from_secs(10), FAST, || {
            polls += 1;
            if polls == 2 {
                Err("peer died")
            } else {
                Ok(false)
            }
        });
        assert_eq!(r, Err(Stopped::Failed("peer died")));
        assert_eq!(polls, 2);
    }

    #[test]
    fn the_deadline_fires_on_time_and_no_sooner() {
        let wait = Duration::from_millis(50);
        let started = Instant::now();
        let slow = Backoff {
            first: Duration::from_millis(1),
            // A pause longer than the whole wait must not oversleep the deadline.
            max: Duration::from_secs(5),
        };
        let r = poll_until::<()>(started + wait, slow, || Ok(false));
        let elapsed = started.elapsed();
        match r {
            Err(Stopped::TimedOut(waited)) => assert!(waited >= wait, "{waited:?}"),
            other => panic!("{other:?}"),
        }
        assert!(elapsed >= wait, "{elapsed:?}");
        assert!(elapsed < wait + Duration::from_secs(2), "{elapsed:?}");
    }

    #[test]
    fn a_passed_deadline_still_polls_once() {
        let mut polls = 0;
        let r = poll_until::<()>(Instant::now(), FAST, || {
            polls += 1;
            Ok(false)
        });
        assert!(matches!(r, Err(Stopped::TimedOut(_))), "{r:?}");
        assert_eq!(polls, 1);
    }
}
