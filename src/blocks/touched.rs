//! What changed since the start of the previous pass of garbage collection (in the metadata
//! store), which a pass keeps whatever its mark saw: blocks uploaded or asked about, versions
//! published.
//!
//! Where a store's replicas share collection (a store in shards, `meta::gc_shared`), a pass
//! also dooms what it is about to delete here: whatever was touched since this replica last
//! reported is spared (returned to the collector), and a touch of what is doomed waits until
//! the pass says it is done (or the doom's hold runs out), so that nothing asked about, or
//! published, after the answer names what the collector then deletes.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::locks;

struct State<T> {
    on: bool,
    current: HashSet<T>,
    previous: HashSet<T>,
    /// What a pass is deleting: the pass, and when its hold runs out.
    doomed: HashMap<T, (u64, Instant)>,
}

/// What changed since the start of the previous pass, which a pass keeps. Empty and inert until
/// the first pass starts, so a server without collection keeps no such record.
pub struct Touched<T> {
    state: Mutex<State<T>>,
    spared: Condvar,
}

impl<T: Eq + Hash> Default for Touched<T> {
    fn default() -> Self {
        Touched {
            state: Mutex::new(State {
                on: false,
                current: HashSet::new(),
                previous: HashSet::new(),
                doomed: HashMap::new(),
            }),
            spared: Condvar::new(),
        }
    }
}

impl<T: Eq + Hash + Clone> Touched<T> {
    /// Notes `t`; where a pass is deleting it, first waits until the pass is done (or its hold
    /// ran out), so that what touches it then finds it gone and writes it again.
    pub fn touch(&self, t: T) {
        let mut s = locks::lock(&self.state);
        while let Some(&(_, until)) = s.doomed.get(&t) {
            let now = Instant::now();
            if now >= until {
                s.doomed.remove(&t);
                break;
            }
            s = match self.spared.wait_timeout(s, until - now) {
                Ok((s, _)) => s,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        if s.on {
            s.current.insert(t);
        }
    }

    /// A pass starts: what the pass before it saw touched ages out. Returns whether anything
    /// was recorded before (a first pass has no record of what is in flight, and deletes
    /// nothing).
    pub fn rotate(&self) -> bool {
        let mut s = locks::lock(&self.state);
        let was_on = std::mem::replace(&mut s.on, true);
        s.previous = std::mem::take(&mut s.current);
        was_on
    }

    /// [`Touched::rotate`], and what was touched since the rotation before: what a replica
    /// tells a pass it shares.
    pub fn rotate_and_report(&self) -> (bool, Vec<T>) {
        let recorded = self.rotate();
        let s = locks::lock(&self.state);
        (recorded, s.previous.iter().cloned().collect())
    }

    pub fn contains(&self, t: &T) -> bool {
        let s = locks::lock(&self.state);
        s.current.contains(t) || s.previous.contains(t)
    }

    pub fn all(&self) -> Vec<T> {
        let s = locks::lock(&self.state);
        s.current.iter().chain(s.previous.iter()).cloned().collect()
    }

    /// Pass `pass` deletes `candidates` but for those touched since the previous rotation
    /// (returned: spared); a touch of the others waits until [`Touched::release`] of the
    /// pass, or `hold`.
    pub fn doom(&self, pass: u64, candidates: &[T], hold: Duration) -> Vec<T> {
        let until = Instant::now() + hold;
        let mut s = locks::lock(&self.state);
        let mut spared = Vec::new();
        for c in candidates {
            if s.current.contains(c) || s.previous.contains(c) {
                spared.push(c.clone());
            } else {
                s.doomed.insert(c.clone(), (pass, until));
            }
        }
        spared
    }

    /// Pass `pass` is done: what it doomed may be touched again.
    pub fn release(&self, pass: u64) {
        let mut s = locks::lock(&self.state);
        let now = Instant::now();
        s.doomed.retain(|_, (p, until)| *p != pass && *until > now);
        self.spared.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_pass_dooms_is_spared_where_touched_and_waited_for_where_not() {
        let t: Touched<u32> = Touched::default();
        t.rotate();
        t.touch(1);
        assert_eq!(t.doom(7, &[1, 2], Duration::from_secs(60)), vec![1]);
        let t = std::sync::Arc::new(t);
        let (done_tx, done) = std::sync::mpsc::channel();
        let toucher = {
            let t = t.clone();
            std::thread::spawn(move || {
                t.touch(2);
                let _ = done_tx.send(());
            })
        };
        // The toucher waits for the pass to be done.
        assert!(done.recv_timeout(Duration::from_millis(100)).is_err());
        t.release(7);
        done.recv().unwrap();
        toucher.join().unwrap();
        assert!(t.contains(&2));
    }

    #[test]
    fn a_doom_whose_hold_ran_out_no_longer_holds_a_touch() {
        let t: Touched<u32> = Touched::default();
        t.rotate();
        assert!(t.doom(3, &[5], Duration::from_millis(20)).is_empty());
        t.touch(5);
        assert!(t.contains(&5));
        let (recorded, reported) = t.rotate_and_report();
        assert!(recorded);
        assert_eq!(reported, vec![5]);
    }
}
