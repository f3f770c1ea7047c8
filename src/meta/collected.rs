//! The blocks garbage collection took, remembered for a while so that node agents drop them
//! from their caches too (they learn of them with their heartbeats). A cache is bounded by its
//! budget anyway; this gives the disk back as soon as the store's own.
//!
//! In memory only: after a restart the server starts a new epoch, and a node's cursor from the
//! last one no longer means anything.

use std::collections::VecDeque;

use crate::hash::BlockHash;
use crate::locks::lock;

/// Collected blocks remembered: more than a node that misses a few heartbeats needs.
const KEPT: usize = 1 << 18;
/// Most blocks told to a node in one heartbeat.
pub const PER_HEARTBEAT: usize = 8192;

pub struct Collected {
    epoch: u64,
    /// The sequence number of the last block pushed, and the blocks still remembered.
    log: std::sync::Mutex<(u64, VecDeque<(u64, BlockHash)>)>,
}

/// What a node is told: blocks, and the cursor it presents next time.
#[derive(Debug, PartialEq, Eq)]
pub struct Since {
    pub blocks: Vec<BlockHash>,
    pub upto: u64,
    pub epoch: u64,
}

impl Collected {
    pub fn new(epoch: u64) -> Self {
        Collected {
            epoch: epoch.max(1),
            log: Default::default(),
        }
    }

    pub fn push(&self, h: BlockHash) {
        let mut log = lock(&self.log);
        log.0 += 1;
        let seq = log.0;
        if log.1.len() == KEPT {
            log.1.pop_front();
        }
        log.1.push_back((seq, h));
    }

    /// The blocks after `after` of `epoch`; a cursor of another epoch starts from what is
    /// remembered now, since that node was never told of them.
    pub fn since(&self, after: u64, epoch: u64) -> Since {
        let log = lock(&self.log);
        let after = if epoch == self.epoch { after } else { 0 };
        let start = log.1.partition_point(|(seq, _)| *seq <= after);
        let blocks: Vec<BlockHash> = log
            .1
            .iter()
            .skip(start)
            .take(PER_HEARTBEAT)
            .map(|(_, h)| *h)
            .collect();
        let upto = match blocks.len() {
            0 => after,
            n => log.1.get(start + n - 1).map_or(after, |(seq, _)| *seq),
        };
        Since {
            blocks,
            upto,
            epoch: self.epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_told_each_collected_block_once_in_its_epoch() {
        let c = Collected::new(7);
        let h = |i: u8| BlockHash::of(&[i]);
        c.push(h(1));
        c.push(h(2));
        let first = c.since(0, 0);
        assert_eq!(first.blocks, vec![h(1), h(2)]);
        assert_eq!((first.upto, first.epoch), (2, 7));
        let none = c.since(first.upto, 7);
        assert!(none.blocks.is_empty());
        assert_eq!(none.upto, 2);
        c.push(h(3));
        assert_eq!(c.since(2, 7).blocks, vec![h(3)]);
        // A cursor of an earlier run of the server: all that is remembered now.
        assert_eq!(c.since(2, 6).blocks, vec![h(1), h(2), h(3)]);
    }

    #[test]
    fn a_heartbeat_carries_a_bounded_batch_and_the_rest_comes_next() {
        let c = Collected::new(1);
        for i in 0..(PER_HEARTBEAT as u32 + 5) {
            c.push(BlockHash::of(&i.to_be_bytes()));
        }
        let a = c.since(0, 1);
        assert_eq!(a.blocks.len(), PER_HEARTBEAT);
        let b = c.since(a.upto, 1);
        assert_eq!(b.blocks.len(), 5);
        assert_eq!(b.upto, PER_HEARTBEAT as u64 + 5);
    }
}
