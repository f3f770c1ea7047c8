//! A version's pieces: its unique blocks in manifest order, each cut into pieces of `2^log2`
//! bytes when the version has too few blocks for a swarm to pipeline.
//!
//! A piece's holders double at best once per piece time, so the last piece reaches N members
//! about log2(N) piece times after the store sent it: a version of 16 pieces (64 MiB in the
//! default 4 MiB blocks) cannot finish within 1.3x of one transfer at 5,000 members, one of
//! 128 can (the simulation: bench/RESULTS.md). Pieces smaller than a block are checked on
//! their own against the block's hash (`hash::subtree`), so a member forwards each as soon as
//! it has it. Cutting finer than [`TARGET_PIECES`] buys little and costs a sync per piece.
//!
//! The server and every member compute the same plan from the same block lengths, so pieces
//! are named by number alone.

use std::ops::Range;

use crate::hash::subtree::MIN_SWARM_PIECE_LOG2;

/// Pieces a version is cut into at least, where its blocks allow.
pub const TARGET_PIECES: u64 = 128;

/// How a version's unique blocks are cut into pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `2^log2` bytes a piece; 0: whole blocks.
    log2: u8,
    /// The first piece of each block, and the number of pieces last.
    firsts: Vec<u32>,
}

impl Plan {
    /// The plan for blocks of these lengths: whole blocks where there are [`TARGET_PIECES`] of
    /// them or more, else pieces of the largest power of two that makes about that many (not
    /// below `2^MIN_SWARM_PIECE_LOG2` bytes).
    pub fn new(lens: &[u64]) -> Plan {
        let total: u64 = lens.iter().sum();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let per = total / TARGET_PIECES;
        let log2 = if lens.len() as u64 >= TARGET_PIECES || per == 0 {
            0
        } else {
            // The largest power of two at most `per`, and not below the floor.
            (63 - per.leading_zeros() as u8).max(MIN_SWARM_PIECE_LOG2)
        };
        let log2 = if log2 == 0 || 1u64 << log2 >= longest {
            0
        } else {
            log2
        };
        Self::with_log2(lens, log2)
    }

    /// `blocks` blocks, each one piece.
    pub fn whole(blocks: usize) -> Plan {
        Plan {
            log2: 0,
            firsts: (0..=blocks as u32).collect(),
        }
    }

    /// The plan with pieces of `2^log2` bytes (0: whole blocks).
    pub fn with_log2(lens: &[u64], log2: u8) -> Plan {
        let mut firsts = Vec::with_capacity(lens.len() + 1);
        let mut next = 0u32;
        for &len in lens {
            firsts.push(next);
            let n = match log2 {
                0 => 1,
                _ => len.div_ceil(1u64 << log2).max(1) as u32,
            };
            next = next.saturating_add(n);
        }
        firsts.push(next);
        Plan { log2, firsts }
    }

    /// Bytes a piece as a power of two; 0 for whole blocks.
    pub fn log2(&self) -> u8 {
        self.log2
    }

    pub fn pieces(&self) -> u32 {
        self.firsts.last().copied().unwrap_or(0)
    }

    pub fn blocks(&self) -> usize {
        self.firsts.len().saturating_sub(1)
    }

    /// The pieces of block `b`.
    pub fn pieces_of(&self, b: usize) -> Option<Range<u32>> {
        Some(*self.firsts.get(b)?..*self.firsts.get(b + 1)?)
    }

    /// The block piece `p` is part of, and its place among that block's pieces.
    pub fn block_of(&self, p: u32) -> Option<(usize, u32)> {
        if p >= self.pieces() {
            return None;
        }
        // The last block whose first piece is at most `p`.
        let b = self.firsts.partition_point(|&f| f <= p) - 1;
        Some((b, p - self.firsts[b]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn few_blocks_are_cut_into_about_the_target_and_many_are_left_whole() {
        // 64 MiB in 4 MiB blocks: 512 KiB pieces, 8 a block.
        let p = Plan::new(&[4 * MIB; 16]);
        assert_eq!((p.log2(), p.pieces()), (19, 128));
        assert_eq!(p.pieces_of(3), Some(24..32));
        assert_eq!(p.block_of(24), Some((3, 0)));
        assert_eq!(p.block_of(127), Some((15, 7)));
        assert_eq!(p.block_of(128), None);
        // Blocks of any length: each cut on its own, the last piece of each shorter.
        let p = Plan::new(&[3 * MIB + 5, 1, 5 * MIB]);
        assert_eq!(p.log2(), 16);
        assert_eq!(p.pieces_of(0), Some(0..49));
        assert_eq!(p.pieces_of(1), Some(49..50));
        assert_eq!(p.pieces_of(2), Some(50..130));
        assert_eq!(p.block_of(49), Some((1, 0)));
        assert_eq!(p.block_of(50), Some((2, 0)));
        // Enough blocks already, or too little data to cut: whole blocks.
        let p = Plan::new(&[MIB; 200]);
        assert_eq!((p.log2(), p.pieces()), (0, 200));
        assert_eq!(p.block_of(199), Some((199, 0)));
        assert_eq!(Plan::new(&[40 * 1024; 3]).log2(), 0);
        assert_eq!(Plan::new(&[]).pieces(), 0);
        assert_eq!(Plan::whole(3), Plan::with_log2(&[5, 6, 7], 0));
        assert_eq!(Plan::whole(0).pieces(), 0);
        // Never below the floor.
        assert_eq!(Plan::new(&[2 * MIB; 2]).log2(), MIN_SWARM_PIECE_LOG2);
    }
}
