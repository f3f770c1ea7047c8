//! The swarm inside a broadcast window, as plain state machines: no sockets, no clock of their
//! own, no threads. The store server keeps a [`Board`] per window and version; each member keeps
//! a [`Schedule`]. The real server and getters drive them over gRPC and the data plane; the
//! [`sim`] drives the same code against simulated links and nodes.
//!
//! A version's **pieces** are its unique blocks, numbered in manifest order, so that the server
//! and every member name them alike without sending hashes.
//!
//! Availability travels through the server in batches ([`crate::proto::SwarmSyncRequest`]): a
//! member sends the pieces it verified since its last sync; the server answers with what the
//! member's neighbours announced since, and with new neighbours. Each member has a bounded set of
//! neighbours (about [`NEIGHBOURS`], chosen at random, links both ways), so what one sync carries
//! does not grow with the window. A member fetches each piece from a neighbour that holds it,
//! rarest first among its neighbours, several neighbours at once, and serves at most `fanout`
//! downloaders. A member with nothing to fetch from its neighbours says so (`starving`); the
//! server then introduces it to members holding what it lacks. Only pieces that no member holds
//! or is fetching are granted from the store, to members with idle slots (`want_seed`), a few
//! at a time ([`SEED_SLOTS`]): the store sends each piece about once, whatever the number of
//! members, and each at its full rate, so that members trade it early.
//!
//! Why through the server: it already knows the members (the window), so introducing a member
//! to holders of what it lacks needs no search, and a member that dies is known to everyone at
//! their next sync. The cost is one small message per member per sync interval while it has
//! something to say (measured by the simulation at up to 5,000 members, bench/RESULTS.md).

mod board;
mod schedule;
pub mod sim;

pub use board::Board;
pub use schedule::{Failure, From, Request, Schedule, ScheduleConfig};

/// Neighbours the server gives a member at its join. Links are made both ways, so a member may
/// end with more (up to [`MAX_NEIGHBOURS`]).
pub const NEIGHBOURS: usize = 16;
/// A member accepts new links from joiners until it has this many neighbours.
pub const MAX_NEIGHBOURS: usize = 2 * NEIGHBOURS;
/// Holders the server introduces to a member that has nothing to fetch from its neighbours.
pub const INTRODUCE: usize = 2;
/// Pieces fetched from the store at once, over the whole swarm. Few, so that each arrives at
/// the store's full rate and members trade it while the store sends the next: a store that
/// sent every piece at once would finish none before it had sent them all.
pub const SEED_SLOTS: usize = 3;

/// Downloaders a member sends to at once when the window names no fanout. A sender that
/// splits its uplink among many finishes none of them early, and a piece is forwarded only once
/// it is whole and verified: the simulation finished soonest with two (bench/RESULTS.md).
pub const DEFAULT_UPLOADS: u32 = 2;

/// A fixed-size set of piece indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PieceSet {
    words: Vec<u64>,
    len: u32,
    count: u32,
}

impl PieceSet {
    pub fn new(len: u32) -> Self {
        PieceSet {
            words: vec![0; (len as usize).div_ceil(64)],
            len,
            count: 0,
        }
    }

    /// Adds `i`; whether it was new. Indices out of range are refused (they come from peers).
    pub fn insert(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        let new = self.words[w] & (1 << b) == 0;
        self.words[w] |= 1 << b;
        self.count += u32::from(new);
        new
    }

    /// Removes `i`; whether it was there.
    pub fn remove(&mut self, i: u32) -> bool {
        if !self.contains(i) {
            return false;
        }
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
        self.count -= 1;
        true
    }

    pub fn contains(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn full(&self) -> bool {
        self.count == self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).filter(|&i| self.contains(i))
    }
}

/// A small deterministic generator (splitmix64): choices among equals are random, so that
/// members do not all pick the same piece or neighbour, and a seed makes a run repeatable.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests;
