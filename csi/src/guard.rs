//! One operation at a time per volume, as the CSI spec asks: a call for a volume that already
//! has one in flight is answered `ABORTED` at once (the CO retries it later), while calls for
//! other volumes run concurrently.
//!
//! A [`VolumeGuard`] is the set of ids with an operation in flight; [`VolumeGuard::try_acquire`]
//! adds one and hands back a [`Permit`] that takes it out again when dropped, so an early
//! return, an error or a panic in the call frees the volume. A handler moves its permit into
//! the blocking task that does the work, so that a call the client gives up on (its future
//! dropped) still holds the volume until that work has finished.
//!
//! Waiting instead of refusing would pile up the CO's retries behind a slow call; refusing
//! also tells a CO that lost its state (and sends a call twice) what is going on.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use tonic::Status;

/// The ids (volume ids, or other names a service serialises on) with an operation in flight.
#[derive(Debug, Clone)]
pub struct VolumeGuard {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// What an id names, for the ABORTED message: "volume", "target path", ...
    what: &'static str,
    in_flight: Mutex<HashSet<String>>,
}

impl Inner {
    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // The lock is only held to insert or remove one id, which cannot panic half-way: a
        // poisoned set is still consistent.
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for VolumeGuard {
    fn default() -> Self {
        VolumeGuard::new()
    }
}

impl VolumeGuard {
    /// A guard of volume ids.
    pub fn new() -> Self {
        VolumeGuard::of("volume")
    }

    /// A guard of ids that `what` names in its messages ("target path", "volume name").
    pub fn of(what: &'static str) -> Self {
        VolumeGuard {
            inner: Arc::new(Inner {
                what,
                in_flight: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// A permit for `id`, or `ABORTED` when an operation for `id` is already in progress.
    pub fn try_acquire(&self, id: &str) -> Result<Permit, Status> {
        if !self.inner.set().insert(id.to_string()) {
            return Err(Status::aborted(format!(
                "an operation for {} {id} is already in progress",
                self.inner.what
            )));
        }
        Ok(Permit {
            inner: self.inner.clone(),
            id: id.to_string(),
        })
    }

    /// Whether an operation for `id` is in flight.
    pub fn is_held(&self, id: &str) -> bool {
        self.inner.set().contains(id)
    }
}

/// An operation in flight for one id; dropping it ends the operation.
#[derive(Debug)]
#[must_use = "the id is free again as soon as the permit is dropped"]
pub struct Permit {
    inner: Arc<Inner>,
    id: String,
}

impl Permit {
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.set().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn one_operation_per_id() {
        let g = VolumeGuard::new();
        let a = g.try_acquire("ns/a").unwrap();
        assert_eq!(a.id(), "ns/a");
        assert!(g.is_held("ns/a"));

        let again = g.try_acquire("ns/a").unwrap_err();
        assert_eq!(again.code(), Code::Aborted);
        assert_eq!(
            again.message(),
            "an operation for volume ns/a is already in progress"
        );
        // A clone is the same guard.
        assert_eq!(
            g.clone().try_acquire("ns/a").unwrap_err().code(),
            Code::Aborted
        );

        // Other ids go on.
        let b = g.try_acquire("ns/b").unwrap();
        assert!(g.is_held("ns/b"));

        drop(a);
        assert!(!g.is_held("ns/a"));
        let a2 = g.try_acquire("ns/a").unwrap();
        assert!(g.is_held("ns/a") && g.is_held("ns/b"));
        drop((a2, b));
        assert!(!g.is_held("ns/a") && !g.is_held("ns/b"));
    }

    #[test]
    fn guards_are_independent_and_name_what_they_hold() {
        let volumes = VolumeGuard::new();
        let targets = VolumeGuard::of("target path");
        let _v = volumes.try_acquire("/x").unwrap();
        let _t = targets.try_acquire("/x").unwrap();
        assert_eq!(
            targets.try_acquire("/x").unwrap_err().message(),
            "an operation for target path /x is already in progress"
        );
    }

    #[test]
    fn a_panic_frees_the_id() {
        let g = VolumeGuard::new();
        let g2 = g.clone();
        let r = std::thread::spawn(move || {
            let _p = g2.try_acquire("ns/a").unwrap();
            panic!("the operation failed half-way");
        })
        .join();
        assert!(r.is_err());
        assert!(!g.is_held("ns/a"));
        let _p = g.try_acquire("ns/a").unwrap();
    }

    #[test]
    fn concurrent_acquires_of_one_id_let_exactly_one_through() {
        let g = VolumeGuard::new();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (g, barrier) = (g.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let p = g.try_acquire("ns/a").ok();
                    // Hold it until every thread has tried.
                    barrier.wait();
                    p.is_some()
                })
            })
            .collect();
        let won = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|w| *w)
            .count();
        assert_eq!(won, 1);
        assert!(!g.is_held("ns/a"));
    }
}
