//! A member's side of the swarm: the fetches the server chose for it, what it tells the server
//! back, and how many it runs at once.

use std::collections::VecDeque;

use super::limits::{DEFAULT_UPLOADS, READER_SEED_SLOTS};
use super::pieceset::PieceSet;
use super::why::{WHY_BROKEN, WHY_BUSY, WHY_DECLINED, WHY_MISSING};
use crate::proto::{SwarmFailure, SwarmSyncReply, SwarmSyncRequest};

/// How many pieces a member fetches at once.
#[derive(Clone, Debug)]
pub struct ScheduleConfig {
    /// Pieces in flight in all. One, from a source that sends only to this member, fills the
    /// downlink; a second would halve both sources' rates into it (measured:
    /// bench/swarm_sim.rs, 1.89x against 1.33x).
    pub max_inflight: u32,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            max_inflight: DEFAULT_UPLOADS,
        }
    }
}

impl ScheduleConfig {
    /// A mount's reader: the blocks it waits for and its readahead, at once, as a plain
    /// fetch would run them.
    pub fn reader() -> Self {
        ScheduleConfig {
            max_inflight: READER_SEED_SLOTS as u32,
        }
    }
}

/// Where a piece is fetched from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum From {
    /// A member, by member id.
    Peer(u64),
    /// The store (or the origin).
    Seed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub piece: u32,
    pub from: From,
}

/// Why a fetch gave nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// It serves as many downloaders as it may already (other swarms, readers): ask later.
    Busy,
    /// It does not hold the piece (evicted, or announced wrongly).
    Missing,
    /// Its connection broke, it stalled, or it sent bytes that did not match: asked no more.
    Broken,
}

impl Failure {
    fn code(self) -> u32 {
        match self {
            Failure::Busy => WHY_BUSY,
            Failure::Missing => WHY_MISSING,
            Failure::Broken => WHY_BROKEN,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    Missing,
    Flight,
    Have,
    /// Not needed (yet): a reader wants it when it reads it.
    Skipped,
}

/// One member's fetches over the pieces of a version.
#[derive(Debug)]
pub struct Schedule {
    me: u64,
    cfg: ScheduleConfig,
    state: Vec<Piece>,
    /// Pieces held, fetched or skipped.
    have: PieceSet,
    /// Pieces in state `Missing`.
    missing: u32,
    /// Fetches the server chose, not yet started.
    ready: VecDeque<Request>,
    inflight: u32,
    /// Fetches in flight about to end (see [`Schedule::ending`]): their slots count as free.
    ending: PieceSet,
    /// Those not yet told to the server.
    untold_ending: Vec<u32>,
    unannounced: Vec<u32>,
    skipped: Vec<u32>,
    /// Skipped pieces wanted since the last sync.
    wanted: Vec<u32>,
    failed: Vec<SwarmFailure>,
    synced: bool,
    /// Fetches chosen by the board of a window this member left by joining again (its owner
    /// died): how they end is not told, since their sources' ids were that board's.
    before_rejoin: PieceSet,
}

impl Schedule {
    pub fn new(me: u64, pieces: u32, cfg: ScheduleConfig) -> Self {
        Schedule {
            me,
            cfg,
            state: vec![Piece::Missing; pieces as usize],
            have: PieceSet::new(pieces),
            missing: pieces,
            ready: VecDeque::new(),
            inflight: 0,
            ending: PieceSet::new(pieces),
            untold_ending: Vec::new(),
            unannounced: Vec::new(),
            skipped: Vec::new(),
            wanted: Vec::new(),
            failed: Vec::new(),
            synced: false,
            before_rejoin: PieceSet::new(pieces),
        }
    }

    /// This member joined its window again, at a new owner that knew nothing of it, as member
    /// `me`: the new board hears everything it holds and skips at its first sync, as a new
    /// member's; what the old board chose and what was to be told of the old one's members is
    /// dropped. Fetches in flight go on and land as any other.
    pub fn rejoined(&mut self, me: u64) {
        self.me = me;
        let pieces = self.state.len() as u32;
        self.unannounced = (0..pieces).filter(|&p| self.has(p)).collect();
        self.skipped = (0..pieces)
            .filter(|&p| self.state[p as usize] == Piece::Skipped)
            .collect();
        self.wanted.clear();
        self.failed.clear();
        self.ready.clear();
        self.untold_ending.clear();
        self.ending = PieceSet::new(pieces);
        self.before_rejoin = PieceSet::new(pieces);
        for p in (0..pieces).filter(|&p| self.state[p as usize] == Piece::Flight) {
            self.before_rejoin.insert(p);
        }
        self.synced = false;
    }

    pub fn done(&self) -> bool {
        self.have.full()
    }

    /// Whether every piece was fetched (none skipped): the member holds the whole version.
    pub fn complete(&self) -> bool {
        self.state.iter().all(|s| *s == Piece::Have)
    }

    /// A piece this member holds already (its node's cache had it): announced at the next sync.
    pub fn already(&mut self, piece: u32) {
        if self.state.get(piece as usize) == Some(&Piece::Missing) && self.have.insert(piece) {
            self.state[piece as usize] = Piece::Have;
            self.missing -= 1;
            self.unannounced.push(piece);
        }
    }

    /// A piece this member does not need (its files hold it already, or a reader has not read
    /// it): not fetched, and not announced, since its node may not serve it.
    pub fn skip(&mut self, piece: u32) {
        if self.state.get(piece as usize) == Some(&Piece::Missing) && self.have.insert(piece) {
            self.state[piece as usize] = Piece::Skipped;
            self.missing -= 1;
            self.skipped.push(piece);
        }
    }

    /// A skipped piece is needed after all (a reader reads it): fetched like any other, and
    /// told to the server at the next sync. Returns whether it is still to come (false: it is
    /// here already).
    pub fn want(&mut self, piece: u32) -> bool {
        match self.state.get(piece as usize) {
            Some(Piece::Skipped) => {
                self.state[piece as usize] = Piece::Missing;
                self.missing += 1;
                self.have.remove(piece);
                // Not told yet that it was skipped: then it simply is not.
                match self.skipped.iter().position(|&p| p == piece) {
                    Some(k) if !self.synced => {
                        self.skipped.swap_remove(k);
                    }
                    _ => self.wanted.push(piece),
                }
                true
            }
            Some(Piece::Missing | Piece::Flight) => true,
            _ => false,
        }
    }

    /// Whether `piece` was fetched or held (not merely skipped).
    pub fn has(&self, piece: u32) -> bool {
        self.state.get(piece as usize) == Some(&Piece::Have)
    }

    /// Whether there is something to tell the server: verified pieces, failures, pieces newly
    /// wanted, or the first sync.
    pub fn news(&self) -> bool {
        !self.synced
            || !self.unannounced.is_empty()
            || !self.failed.is_empty()
            || !self.wanted.is_empty()
            || !self.untold_ending.is_empty()
    }

    /// Download slots free beyond the fetches chosen already (none while nothing more is
    /// needed).
    pub fn idle(&self) -> u32 {
        if self.missing as usize <= self.ready.len() {
            return 0;
        }
        // One fetch lined up behind those ending, whatever their number: a member whose
        // fetches end later than it thought must not heap more onto its downlink.
        let running = self.inflight.saturating_sub(self.ending.count().min(1));
        self.cfg
            .max_inflight
            .saturating_sub(running + self.ready.len() as u32)
    }

    /// A fetch in flight will end within about a round trip (the member's [`super::Pace`]
    /// says so): told to the server at the next sync, which gives its source its next upload
    /// and this member its next fetch now, so that neither link idles while the news of the
    /// end travels. While any fetch is ending, one slot more counts as free. Whether it was news.
    pub fn ending(&mut self, piece: u32) -> bool {
        if self.state.get(piece as usize) != Some(&Piece::Flight) || !self.ending.insert(piece) {
            return false;
        }
        self.untold_ending.push(piece);
        true
    }

    /// What to tell the server now: the pieces verified and the fetches failed since the last
    /// sync, the skipped pieces (once), and the free slots.
    pub fn sync_request(&mut self) -> SwarmSyncRequest {
        let skip = if self.synced {
            Vec::new()
        } else {
            std::mem::take(&mut self.skipped)
        };
        self.synced = true;
        SwarmSyncRequest {
            member: self.me,
            verified: std::mem::take(&mut self.unannounced),
            failed: std::mem::take(&mut self.failed),
            skip,
            want: std::mem::take(&mut self.wanted),
            ending: std::mem::take(&mut self.untold_ending),
            idle: self.idle(),
            ..Default::default()
        }
    }

    /// A sync that did not reach the server: what it reported goes in the next one.
    pub fn unsent(&mut self, req: SwarmSyncRequest) {
        self.unannounced.extend(req.verified);
        self.failed.extend(req.failed);
        self.wanted.extend(req.want);
        self.untold_ending
            .extend(req.ending.into_iter().filter(|&p| self.ending.contains(p)));
        if !req.skip.is_empty() {
            self.skipped.extend(req.skip);
            self.synced = false;
        }
    }

    /// Takes in the fetches the server chose. One for a piece this member holds or fetches
    /// already is declined at the next sync, so that its source's slot is freed.
    pub fn apply(&mut self, reply: &SwarmSyncReply) {
        for f in &reply.fetch {
            let from = if f.store {
                From::Seed
            } else {
                From::Peer(f.from)
            };
            let fresh = self.state.get(f.piece as usize) == Some(&Piece::Missing)
                && !self.ready.iter().any(|r| r.piece == f.piece);
            if fresh && (f.store || f.from != self.me) {
                self.ready.push_back(Request {
                    piece: f.piece,
                    from,
                });
            } else {
                self.failed.push(SwarmFailure {
                    piece: f.piece,
                    from: f.from,
                    store: f.store,
                    why: WHY_DECLINED,
                });
            }
        }
    }

    /// The fetches to start now.
    pub fn start(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        while let Some(r) = self.ready.pop_front() {
            if self.state[r.piece as usize] != Piece::Missing {
                continue;
            }
            self.state[r.piece as usize] = Piece::Flight;
            self.missing -= 1;
            self.inflight += 1;
            out.push(r);
        }
        out
    }

    fn settle(&mut self, piece: u32) -> bool {
        if self.state.get(piece as usize) != Some(&Piece::Flight) {
            return false;
        }
        self.inflight = self.inflight.saturating_sub(1);
        self.before_rejoin.remove(piece);
        // Ended: its source is freed by the verification or the failure, told or not.
        if self.ending.remove(piece) {
            self.untold_ending.retain(|&p| p != piece);
        }
        true
    }

    /// A piece arrived and matched its hash.
    pub fn verified(&mut self, piece: u32) {
        if !self.settle(piece) {
            return;
        }
        self.state[piece as usize] = Piece::Have;
        self.have.insert(piece);
        self.unannounced.push(piece);
    }

    /// A fetch gave nothing: reported at the next sync, and the piece is chosen again.
    pub fn failed(&mut self, piece: u32, from: From, why: Failure) {
        let told = !self.before_rejoin.contains(piece);
        if !self.settle(piece) {
            return;
        }
        self.state[piece as usize] = Piece::Missing;
        self.missing += 1;
        let (from, store) = match from {
            From::Peer(p) => (p, false),
            From::Seed => (0, true),
        };
        if told {
            self.failed.push(SwarmFailure {
                piece,
                from,
                store,
                why: why.code(),
            });
        }
    }
}
