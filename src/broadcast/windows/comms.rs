//! Which NCCL communicator a GPU window's broadcast runs on: one its members' workers kept from
//! an earlier window of the same workers, or a fresh one.
//!
//! Forming a communicator (NCCL's bootstrap, every rank connecting to every other, buffers
//! allocated on each GPU) costs far more than broadcasting a few megabytes, and a training job
//! that syncs weights every step to the same pods would pay it every time. So each worker keeps
//! the communicators its windows formed, and each member says at its join which it holds (key,
//! its rank, the size). At the quorum the server picks one that every member holds, of exactly
//! the window's size, each member at a rank of its own: then the members are exactly that
//! communicator's ranks, and the plan gives each its rank there (the putter's is the root).
//!
//! Two rules keep a kept communicator safe to use. NCCL needs every rank to issue the same
//! collectives on it in the same order, so no two windows run on one at a time: a communicator
//! is in use from the plan that picks it until that window has finished, and meanwhile another
//! window of the same workers forms a fresh one. And a window that failed may have left its
//! communicator broken on some member (aborted there, kept elsewhere), so its key is retired:
//! never picked again, whoever still reports it.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::proto::HeldComm;

/// How many retired keys are remembered; a worker keeps a few communicators at most, so an
/// old retired key is long gone from every worker.
const RETIRED: usize = 4096;
/// What one member may report holding, at most (a worker keeps fewer).
pub const MAX_HELD: usize = 16;

/// Keys in use by a window, and retired keys.
#[derive(Debug, Default)]
pub struct CommBook {
    /// Key -> the window (group id, generation) running on it.
    in_use: HashMap<Vec<u8>, (String, u64)>,
    retired: HashSet<Vec<u8>>,
    retired_order: VecDeque<Vec<u8>>,
}

/// How a window that used a communicator ended, as [`CommBook::release_finished`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Running,
    Succeeded,
    Failed,
}

impl CommBook {
    /// Lets go of the keys whose windows have ended (`ended` says how), retiring those of
    /// windows that failed.
    pub fn release_finished(&mut self, ended: &dyn Fn(&str, u64) -> Ended) {
        let mut failed = Vec::new();
        self.in_use
            .retain(|key, (group, generation)| match ended(group, *generation) {
                Ended::Running => true,
                Ended::Succeeded => false,
                Ended::Failed => {
                    failed.push(key.clone());
                    false
                }
            });
        for key in failed {
            self.retire(key);
        }
    }

    /// Window (`group`, `generation`) let go of `key`, having `ended` so.
    pub fn end(&mut self, key: &[u8], group: &str, generation: u64, ended: Ended) {
        if self
            .in_use
            .get(key)
            .is_some_and(|(g, n)| g == group && *n == generation)
        {
            self.in_use.remove(key);
        }
        if ended == Ended::Failed {
            self.retire(key.to_vec());
        }
    }

    fn retire(&mut self, key: Vec<u8>) {
        if self.retired.insert(key.clone()) {
            self.retired_order.push_back(key);
            while self.retired_order.len() > RETIRED {
                if let Some(old) = self.retired_order.pop_front() {
                    self.retired.remove(&old);
                }
            }
        }
    }

    /// Whether `key` may be picked now.
    fn usable(&self, key: &[u8]) -> bool {
        !self.in_use.contains_key(key) && !self.retired.contains(key)
    }

    /// Records that window (`group`, `generation`) runs on `key` until it ends.
    pub fn use_for(&mut self, key: Vec<u8>, group: &str, generation: u64) {
        self.in_use.insert(key, (group.to_string(), generation));
    }

    /// A communicator every member holds, with each member's rank in it (by member index), if
    /// there is one that may be used now.
    pub fn shared(&self, held: &[&[HeldComm]]) -> Option<(Vec<u8>, Vec<u32>)> {
        let n = held.len();
        let first = held.first()?;
        'candidates: for c in first.iter() {
            if c.nranks as usize != n || !self.usable(&c.key) {
                continue;
            }
            let mut ranks = Vec::with_capacity(n);
            let mut taken = vec![false; n];
            for member in held {
                let Some(mine) = member.iter().find(|h| h.key == c.key) else {
                    continue 'candidates;
                };
                let r = mine.rank as usize;
                if mine.nranks != c.nranks || r >= n || taken[r] {
                    continue 'candidates;
                }
                taken[r] = true;
                ranks.push(mine.rank);
            }
            return Some((c.key.clone(), ranks));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(key: u8, rank: u32, nranks: u32) -> HeldComm {
        HeldComm {
            key: vec![key; 32],
            rank,
            nranks,
        }
    }

    #[test]
    fn a_communicator_is_shared_only_by_exactly_its_ranks() {
        let book = CommBook::default();
        let a = [held(1, 2, 3), held(2, 0, 2)];
        let b = [held(1, 0, 3)];
        let c = [held(1, 1, 3), held(2, 1, 2)];
        let (key, ranks) = book.shared(&[&a, &b, &c]).unwrap();
        assert_eq!((key, ranks), (vec![1; 32], vec![2, 0, 1]));
        // Two of the three members of key 1: not it (the third rank would be missing), and key
        // 2 is held by only one of these two.
        assert_eq!(book.shared(&[&a, &b]), None);
        // Key 2's two ranks.
        assert_eq!(book.shared(&[&c, &a]).map(|s| s.1), Some(vec![1, 0]));
        // A member that does not hold it.
        assert_eq!(book.shared(&[&a, &b, &[held(3, 0, 3)]]), None);
        // Two members claiming one rank (a worker restarted in between, say) or a rank out of
        // range: not shared.
        assert_eq!(book.shared(&[&a, &b, &[held(1, 0, 3)]]), None);
        assert_eq!(book.shared(&[&a, &b, &[held(1, 3, 3)]]), None);
        assert_eq!(book.shared(&[]), None);
    }

    #[test]
    fn a_communicator_in_use_waits_for_its_window_and_a_failed_one_is_retired() {
        let mut book = CommBook::default();
        let a = [held(1, 0, 2)];
        let b = [held(1, 1, 2)];
        book.use_for(vec![1; 32], "g", 1);
        assert_eq!(book.shared(&[&a, &b]), None, "in use by window g/1");
        book.release_finished(&|_, _| Ended::Running);
        assert_eq!(book.shared(&[&a, &b]), None);
        book.release_finished(&|g, n| {
            assert_eq!((g, n), ("g", 1));
            Ended::Succeeded
        });
        assert!(book.shared(&[&a, &b]).is_some(), "free again");
        book.use_for(vec![1; 32], "h", 2);
        book.release_finished(&|_, _| Ended::Failed);
        assert_eq!(book.shared(&[&a, &b]), None, "retired for good");
    }
}
