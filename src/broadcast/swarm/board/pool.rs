//! A set of member places that the board samples at random: the sources with an upload free,
//! the members waiting, the live members to link joiners to.

use std::collections::HashMap;

use crate::broadcast::swarm::rng::Rng;

/// A set of member places that can be sampled at random and changed in constant time.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) list: Vec<usize>,
    /// Each member's place in `list`, if it is there.
    at: HashMap<usize, usize>,
}

impl Pool {
    pub(super) fn add(&mut self, x: usize) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.at.entry(x) {
            e.insert(self.list.len());
            self.list.push(x);
        }
    }

    pub(super) fn remove(&mut self, x: usize) {
        let Some(i) = self.at.remove(&x) else { return };
        self.list.swap_remove(i);
        if let Some(&moved) = self.list.get(i) {
            self.at.insert(moved, i);
        }
    }

    /// Up to `k` members, from a random place on (all of them when there are no more).
    pub(super) fn sample(&self, rng: &mut Rng, k: usize) -> Vec<usize> {
        let n = self.list.len();
        if n == 0 {
            return Vec::new();
        }
        let start = rng.below(n);
        (0..n.min(k)).map(|j| self.list[(start + j) % n]).collect()
    }
}
