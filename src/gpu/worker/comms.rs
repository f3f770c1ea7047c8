//! The NCCL communicators a worker keeps between transfers, and the unique id a window left
//! unused: forming a communicator costs far more than a small broadcast, so the next window of
//! the same workers (or the next GET of the same pair) runs on the one the last formed.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::gpu::cuda::{Comm, UniqueId};
use crate::locks::lock;
use crate::proto::HeldComm;

/// Communicators a worker keeps, at most: each holds NCCL's buffers on its GPU, and a pod
/// syncs with a few groups of peers at once, not more.
pub const KEEP: usize = 4;
/// Unique ids this worker made and handed out, remembered to take back one a window did not
/// use (a window that failed before its broadcast never says).
const MADE: usize = 16;

/// What [`Comms`] needs of a communicator.
pub trait Kept {
    fn device(&self) -> i32;
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// Ends it at once, for good: it is idle, and its peers may be gone (finalizing it could
    /// wait on them), so it is aborted rather than finalized.
    fn let_go(&self);
}

impl Kept for Comm {
    fn device(&self) -> i32 {
        Comm::device(self).ordinal()
    }
    fn rank(&self) -> usize {
        Comm::rank(self)
    }
    fn nranks(&self) -> usize {
        Comm::nranks(self)
    }
    fn let_go(&self) {
        self.abort();
    }
}

/// The communicators a worker kept from its windows and its point-to-point GETs, least recently
/// used first, and its spare unique id. Those it lets go of (the least recently used beyond
/// [`KEEP`], and all of them when the worker ends) are aborted.
///
/// A window's communicator and a pair's are kept apart: the store server plans windows on the
/// first kind only (it is told of no other), and the two workers of a pair run their GETs on
/// the second only, each holding its turn, so that every communicator's members issue its
/// collectives in one order.
pub struct Comms<C: Kept = Comm> {
    state: Mutex<KeptState<C>>,
}

impl<C: Kept> Drop for Comms<C> {
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, c, _) in st.kept.drain(..) {
            c.let_go();
        }
    }
}

/// What a kept communicator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Windows the store server plans on it.
    Window,
    /// Point-to-point GETs between its two workers, the source rank 0.
    Pair,
}

struct KeptState<C> {
    kept: VecDeque<(Vec<u8>, C, Use)>,
    made: VecDeque<UniqueId>,
    spare: Option<UniqueId>,
}

impl<C: Kept> Default for Comms<C> {
    fn default() -> Self {
        Comms {
            state: Mutex::new(KeptState {
                kept: VecDeque::new(),
                made: VecDeque::new(),
                spare: None,
            }),
        }
    }
}

impl<C: Kept> Comms<C> {
    /// What is kept on `device`, as a join reports it.
    pub fn held(&self, device: i32) -> Vec<HeldComm> {
        lock(&self.state)
            .kept
            .iter()
            .filter(|(_, c, u)| c.device() == device && *u == Use::Window)
            .map(|(key, c, _)| HeldComm {
                key: key.clone(),
                rank: c.rank() as u32,
                nranks: c.nranks() as u32,
            })
            .collect()
    }

    /// The keys of the pair communicators kept on `device` in which this worker is `rank` of
    /// two, most recently used first.
    pub fn pairs(&self, rank: usize, device: i32) -> Vec<Vec<u8>> {
        lock(&self.state)
            .kept
            .iter()
            .rev()
            .filter(|(_, c, u)| {
                *u == Use::Pair && c.device() == device && c.rank() == rank && c.nranks() == 2
            })
            .map(|(key, _, _)| key.clone())
            .collect()
    }

    /// Takes `key`'s communicator, kept for `used`, out for a transfer (so no other uses it
    /// meanwhile).
    pub fn take(&self, key: &[u8], used: Use) -> Option<C> {
        let mut st = lock(&self.state);
        let at = st
            .kept
            .iter()
            .position(|(k, _, u)| k == key && *u == used)?;
        st.kept.remove(at).map(|(_, c, _)| c)
    }

    /// Keeps `c` (after a transfer that went well) for `used`, as the most recently used,
    /// letting go of the least recently used beyond [`KEEP`].
    pub fn keep(&self, key: Vec<u8>, c: C, used: Use) {
        let evicted: Vec<(Vec<u8>, C, Use)> = {
            let mut st = lock(&self.state);
            st.kept.push_back((key, c, used));
            let over = st.kept.len().saturating_sub(KEEP);
            st.kept.drain(..over).collect()
        };
        for (_, c, _) in evicted {
            c.let_go();
        }
    }

    /// A unique id for a putter's join: the spare one if a window left one unused, else
    /// `make`'s.
    pub fn unique_id<E>(&self, make: impl FnOnce() -> Result<UniqueId, E>) -> Result<UniqueId, E> {
        let spare = lock(&self.state).spare.take();
        let id = match spare {
            Some(id) => id,
            None => make()?,
        };
        let mut st = lock(&self.state);
        st.made.push_back(id);
        while st.made.len() > MADE {
            st.made.pop_front();
        }
        Ok(id)
    }

    /// A window ran on a kept communicator and did not use `id`: if this worker made it, it is
    /// the spare for the next.
    pub fn unused(&self, id: &UniqueId) {
        let mut st = lock(&self.state);
        if let Some(at) = st.made.iter().position(|m| m == id) {
            st.made.remove(at);
            st.spare = Some(*id);
        }
    }

    /// A communicator is being formed from `id`: it is no one's spare.
    pub fn used(&self, id: &UniqueId) {
        lock(&self.state).made.retain(|m| m != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Fake {
        device: i32,
        rank: usize,
    }

    /// A communicator of two.
    #[derive(Debug, PartialEq)]
    struct Two(i32, usize);

    impl Kept for Two {
        fn device(&self) -> i32 {
            self.0
        }
        fn rank(&self) -> usize {
            self.1
        }
        fn nranks(&self) -> usize {
            2
        }
        fn let_go(&self) {}
    }

    impl Kept for Fake {
        fn device(&self) -> i32 {
            self.device
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn nranks(&self) -> usize {
            3
        }
        fn let_go(&self) {
            LET_GO.with(|n| n.set(n.get() + 1));
        }
    }

    thread_local! {
        static LET_GO: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn a_pairs_communicators_are_neither_reported_for_windows_nor_taken_for_one() {
        let comms: Comms<Two> = Comms::default();
        comms.keep(vec![1; 32], Two(0, 0), Use::Pair);
        comms.keep(vec![2; 32], Two(0, 1), Use::Window);
        comms.keep(vec![3; 32], Two(0, 0), Use::Pair);
        comms.keep(vec![4; 32], Two(1, 0), Use::Pair);
        // A join tells the server of the window's only.
        let held: Vec<u8> = comms.held(0).iter().map(|h| h.key[0]).collect();
        assert_eq!(held, vec![2]);
        // A pair's GET finds its own, most recently used first, by rank and device.
        assert_eq!(comms.pairs(0, 0), vec![vec![3; 32], vec![1; 32]]);
        assert!(comms.pairs(1, 0).is_empty(), "the window's is no pair's");
        assert_eq!(comms.pairs(0, 1), vec![vec![4; 32]]);
        // Each kind is taken only as itself.
        assert_eq!(comms.take(&[1; 32], Use::Window), None);
        assert_eq!(comms.take(&[2; 32], Use::Pair), None);
        assert_eq!(comms.take(&[1; 32], Use::Pair), Some(Two(0, 0)));
        assert_eq!(comms.take(&[2; 32], Use::Window), Some(Two(0, 1)));
    }

    #[test]
    fn a_worker_keeps_its_latest_communicators_and_reports_those_on_a_device() {
        let comms: Comms<Fake> = Comms::default();
        for k in 0..KEEP as u8 + 2 {
            comms.keep(
                vec![k; 32],
                Fake {
                    device: i32::from(k % 2),
                    rank: 1,
                },
                Use::Window,
            );
        }
        // The two least recently used went.
        let on = |d| -> Vec<u8> { comms.held(d).iter().map(|h| h.key[0]).collect() };
        assert_eq!(on(0), vec![2, 4]);
        assert_eq!(on(1), vec![3, 5]);
        assert!(comms.held(0).iter().all(|h| h.rank == 1 && h.nranks == 3));
        // Taken out while a broadcast runs on it: neither reported nor taken twice.
        assert_eq!(comms.take(&[4; 32], Use::Window).map(|c| c.device), Some(0));
        assert_eq!(comms.take(&[4; 32], Use::Window), None);
        assert_eq!(on(0), vec![2]);
        assert_eq!(comms.take(&[0; 32], Use::Window), None, "evicted");
        // Put back, it is the most recently used: the next eviction takes another.
        comms.keep(vec![4; 32], Fake { device: 0, rank: 1 }, Use::Window);
        comms.keep(vec![9; 32], Fake { device: 0, rank: 1 }, Use::Window);
        assert_eq!((on(0), on(1)), (vec![4, 9], vec![3, 5]));
        comms.keep(vec![8; 32], Fake { device: 1, rank: 1 }, Use::Window);
        assert_eq!((on(0), on(1)), (vec![4, 9], vec![5, 8]));
        // The four evicted were let go of (aborted), and so are the four kept when the worker
        // ends.
        assert_eq!(LET_GO.with(|n| n.get()), 4);
        drop(comms);
        assert_eq!(LET_GO.with(|n| n.get()), 8);
    }

    #[test]
    fn a_unique_id_a_window_did_not_use_is_handed_out_for_the_next() {
        let comms: Comms<Fake> = Comms::default();
        let id = |n: u8| UniqueId::from_bytes(&[n; 128]).unwrap();
        let made = std::cell::Cell::new(0u8);
        let make = || -> Result<UniqueId, ()> {
            made.set(made.get() + 1);
            Ok(id(made.get()))
        };
        let first = comms.unique_id(make).unwrap();
        assert!(first == id(1));
        // A window on a kept communicator left it unused: the next join gets it, not a new one.
        comms.unused(&first);
        assert!(comms.unique_id(make).unwrap() == id(1));
        assert_eq!(made.get(), 1);
        // That one formed a communicator: the next is new.
        comms.used(&id(1));
        assert!(comms.unique_id(make).unwrap() == id(2));
        // An id another worker made (a getter is told the putter's) is never this one's spare.
        comms.unused(&id(7));
        assert!(comms.unique_id(make).unwrap() == id(3));
    }
}
