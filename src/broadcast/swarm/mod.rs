//! The swarm inside a broadcast window, as plain state machines: no sockets, no clock of their
//! own, no threads. The store server keeps a [`Board`] per window and version; each member keeps
//! a [`Schedule`]. The real server and getters drive them over gRPC and the data plane; the
//! [`sim`] drives the same code against simulated links and nodes.
//!
//! A version's **pieces** are its unique blocks, numbered in manifest order, so that the server
//! and every member name them alike without sending hashes; a version of few blocks has each
//! cut into smaller pieces ([`Plan`]), each checked on its own against its block's hash.
//!
//! The server schedules the swarm ([`crate::proto::SwarmSyncRequest`]). A member reports the
//! pieces it verified, the fetches that failed, and its free download slots; the board chooses
//! each fetch (a piece and its source) and counts every member's uploads, so a source is asked
//! for at most [`DEFAULT_UPLOADS`] pieces at once and the rarest pieces spread first. A fetch
//! is chosen at two moments: when a member syncs with a slot free (the rarest piece among a
//! sample of sources with an upload free, same zone first), and when a source's upload ends or
//! it verifies a piece (the rarest piece it holds, to one of a sample of the members waiting).
//! A member waiting for fetches holds its sync open at the server until one is chosen for it,
//! so a free uplink is used within one round trip, and a member tells the board of fetches
//! about to end ([`Pace`]: their expected end, less two round trips), so that their sources'
//! next uploads are lined up behind them rather than chosen once the news has travelled. Only pieces that no member holds are fetched
//! from the store, [`SEED_SLOTS`] at a time: the store sends each piece about once, whatever the
//! number of members, and each at its full rate, so that members trade it early.
//!
//! A mount's reader is a member too ([`Board::join_reader`]): it needs nothing until it says
//! what it reads (`want` in its syncs), is given the lowest piece it wants first (it waits for
//! that one), may take [`READER_UPLOADS`] pieces at once from a source that sends to it alone,
//! and serves what it read like any member.
//!
//! Why the server chooses: the first design let members choose from their neighbours'
//! announcements, and members crowded the few holders of the newest pieces, which answered most
//! of them busy: downlinks were idle half the time (2.77x one transfer at 5,000 simulated
//! members with 64 pieces, against 1.40x now; bench/RESULTS.md). The server knows every member and every
//! upload, so no fetch waits on a busy source or on news that has not arrived. The cost is a
//! sync per fetch, a few dozen bytes each; the simulation counts them at up to 5,000 members.

mod board;
mod pace;
mod plan;
mod schedule;
pub mod sim;

pub use board::{Board, BUSY_BACKOFF, GRANT_TTL, KEEPALIVE, SILENCE};
pub use pace::Pace;
pub use plan::{Plan, TARGET_PIECES};
pub use schedule::{Failure, From, Request, Schedule, ScheduleConfig};

/// Pieces fetched from the store at once, over the whole swarm. One, so that it arrives at the
/// store's full rate and members trade it while the store sends the next: a store that sent
/// every piece at once would finish none before it had sent them all.
pub const SEED_SLOTS: usize = 1;

/// Downloaders a member sends to at once. A piece is forwarded only once it is whole and
/// verified, so a sender that splits its uplink delays every piece it sends: with one upload
/// each, a piece's holders double once per piece time (the simulation, before members had
/// links: 1.33x one transfer at 5,000 members with 64 pieces, against 1.38x with two, and 1.77x
/// against 2.35x with 16).
pub const DEFAULT_UPLOADS: u32 = 1;

/// Uploads a source sends at once to a reader (a mount's) that it alone sends to, so that its
/// uplink stays busy across the round trips between them (measured, 512 MiB from one holder
/// to a fresh mount over loopback: 0.60 s as the parent's plain fetch did, 0.76 s with two at
/// once, 1.17 s with one). No more than a node serves at once (`UPLOAD_SLOTS`): a node answers
/// busy beyond, and the board backs off from it (asked for four with two slots: 11.5 s).
pub const READER_UPLOADS: u32 = 4;

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

    /// The indices in both sets, in order.
    pub fn iter_and<'a>(&'a self, other: &'a PieceSet) -> impl Iterator<Item = u32> + 'a {
        self.words
            .iter()
            .zip(&other.words)
            .enumerate()
            .flat_map(|(w, (&a, &b))| {
                let mut bits = a & b;
                std::iter::from_fn(move || {
                    (bits != 0).then(|| {
                        let i = bits.trailing_zeros();
                        bits &= bits - 1;
                        w as u32 * 64 + i
                    })
                })
            })
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
