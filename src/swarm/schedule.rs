//! A member's side of the swarm: which piece to fetch next, and from whom.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::{PieceSet, Rng};
use crate::proto::{SwarmCursor, SwarmSyncReply, SwarmSyncRequest};

/// How many pieces a member fetches at once, and from how many places.
#[derive(Clone, Debug)]
pub struct ScheduleConfig {
    /// Pieces in flight in all. Two keep the downlink full when each sender shares its uplink
    /// between two downloaders; more only waits on busy senders (measured: bench/swarm_sim.rs).
    pub max_inflight: u32,
    /// Pieces in flight from one neighbour: spreading the fetches spreads the load.
    pub per_peer: u32,
    /// A neighbour that answered "busy" (it serves `fanout` downloaders already) is not asked
    /// again for this long.
    pub busy_backoff: Duration,
    /// Rarest piece first among the neighbours; otherwise any piece a usable neighbour holds.
    pub rarest_first: bool,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            max_inflight: 2,
            per_peer: 1,
            busy_backoff: Duration::from_millis(200),
            rarest_first: true,
        }
    }
}

/// Where a piece is fetched from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum From {
    /// A neighbour, by member id.
    Peer(u64),
    /// The store (or the origin), on the server's grant.
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
    /// It serves `fanout` downloaders already: ask again later.
    Busy,
    /// It does not hold the piece (evicted, or announced wrongly).
    Missing,
    /// Its connection broke, it stalled, or it sent bytes that did not match: asked no more.
    Broken,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    Missing,
    Flight,
    Have,
}

#[derive(Debug)]
struct Peer {
    have: PieceSet,
    /// Announcements received: the cursor sent back at each sync.
    seen: u32,
    inflight: u32,
    busy_until: Option<Instant>,
    gone: bool,
}

impl Peer {
    fn usable(&self, now: Instant, per_peer: u32) -> bool {
        !self.gone && self.inflight < per_peer && self.busy_until.is_none_or(|t| now >= t)
    }
}

/// One member's fetch plan over the pieces of a version.
#[derive(Debug)]
pub struct Schedule {
    me: u64,
    cfg: ScheduleConfig,
    state: Vec<Piece>,
    have: PieceSet,
    /// Neighbours (not gone) holding each piece.
    avail: Vec<u32>,
    peers: BTreeMap<u64, Peer>,
    /// Store grants not yet asked for.
    seed: VecDeque<u32>,
    seed_busy_until: Option<Instant>,
    inflight: u32,
    unannounced: Vec<u32>,
    rng: Rng,
}

impl Schedule {
    pub fn new(me: u64, pieces: u32, cfg: ScheduleConfig) -> Self {
        Schedule {
            me,
            cfg,
            state: vec![Piece::Missing; pieces as usize],
            have: PieceSet::new(pieces),
            avail: vec![0; pieces as usize],
            peers: BTreeMap::new(),
            seed: VecDeque::new(),
            seed_busy_until: None,
            inflight: 0,
            unannounced: Vec::new(),
            rng: Rng::new(me.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ u64::from(pieces)),
        }
    }

    pub fn done(&self) -> bool {
        self.have.full()
    }

    /// A piece this member holds already (its node's cache had it): announced at the next sync.
    pub fn already(&mut self, piece: u32) {
        if self.state.get(piece as usize) == Some(&Piece::Missing) && self.have.insert(piece) {
            self.state[piece as usize] = Piece::Have;
            self.unannounced.push(piece);
        }
    }

    /// A piece this member does not need (its files hold it already): never fetched, and not
    /// announced, since its node may not serve it.
    pub fn skip(&mut self, piece: u32) {
        if self.state.get(piece as usize) == Some(&Piece::Missing) && self.have.insert(piece) {
            self.state[piece as usize] = Piece::Have;
        }
    }

    /// Whether `piece` is here (fetched, held or skipped).
    pub fn has(&self, piece: u32) -> bool {
        self.have.contains(piece)
    }

    /// What to tell the server now: the pieces verified since the last sync, the cursors, the
    /// idle slots, and whether no neighbour holds anything this member lacks.
    pub fn sync_request(&mut self) -> SwarmSyncRequest {
        let idle = self
            .cfg
            .max_inflight
            .saturating_sub(self.inflight + self.seed.len() as u32);
        let wanting = !self.done() && idle > 0;
        let starving = wanting && !self.fetchable();
        SwarmSyncRequest {
            member: self.me,
            verified: std::mem::take(&mut self.unannounced),
            seen: self
                .peers
                .iter()
                .filter(|(_, p)| !p.gone)
                .map(|(&member, p)| SwarmCursor {
                    member,
                    seen: p.seen,
                })
                .collect(),
            want_seed: if wanting { idle } else { 0 },
            starving,
            ..Default::default()
        }
    }

    /// Whether some missing piece is held by a neighbour (busy or not).
    fn fetchable(&self) -> bool {
        self.state
            .iter()
            .zip(&self.avail)
            .any(|(s, &a)| *s == Piece::Missing && a > 0)
    }

    /// Takes in the server's answer.
    pub fn apply(&mut self, reply: &SwarmSyncReply) {
        for up in &reply.peers {
            if up.member == self.me {
                continue;
            }
            let n = self.state.len() as u32;
            let peer = self.peers.entry(up.member).or_insert_with(|| Peer {
                have: PieceSet::new(n),
                seen: 0,
                inflight: 0,
                busy_until: None,
                gone: false,
            });
            if up.gone {
                if !peer.gone {
                    peer.gone = true;
                    for p in peer.have.iter() {
                        self.avail[p as usize] -= 1;
                    }
                }
                continue;
            }
            if peer.gone {
                continue;
            }
            // Announcements are a log: skip what this member has seen already, and ignore a
            // batch that leaves a gap (the next sync's cursor asks for it again).
            if up.from > peer.seen {
                continue;
            }
            let skip = (peer.seen - up.from) as usize;
            for &p in up.pieces.iter().skip(skip) {
                peer.seen += 1;
                if peer.have.insert(p) {
                    self.avail[p as usize] += 1;
                }
            }
        }
        for &p in &reply.seed {
            if self.state.get(p as usize) == Some(&Piece::Missing) && !self.seed.contains(&p) {
                self.seed.push_back(p);
            }
        }
    }

    /// The fetches to start now, within the slots left: the store's grants first (no member
    /// holds those), then the rarest piece among the neighbours, from the least loaded holder.
    pub fn next(&mut self, now: Instant) -> Vec<Request> {
        let mut out = Vec::new();
        while self.inflight < self.cfg.max_inflight {
            let r = self.next_seed(now).or_else(|| self.next_peer(now));
            let Some(r) = r else { break };
            self.state[r.piece as usize] = Piece::Flight;
            self.inflight += 1;
            if let From::Peer(p) = r.from {
                if let Some(peer) = self.peers.get_mut(&p) {
                    peer.inflight += 1;
                }
            }
            out.push(r);
        }
        out
    }

    fn next_seed(&mut self, now: Instant) -> Option<Request> {
        if self.seed_busy_until.is_some_and(|t| now < t) {
            return None;
        }
        while let Some(p) = self.seed.pop_front() {
            if self.state[p as usize] == Piece::Missing {
                return Some(Request {
                    piece: p,
                    from: From::Seed,
                });
            }
        }
        None
    }

    fn next_peer(&mut self, now: Instant) -> Option<Request> {
        let n = self.state.len();
        if n == 0 {
            return None;
        }
        let per_peer = self.cfg.per_peer;
        let usable: Vec<(u64, &Peer)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.usable(now, per_peer))
            .map(|(&id, p)| (id, p))
            .collect();
        if usable.is_empty() {
            return None;
        }
        // Rarest first; among equals, a random one (reservoir), so members spread.
        let mut best: Option<(u32, u32)> = None;
        let mut ties = 0usize;
        let start = self.rng.below(n);
        for k in 0..n {
            let p = ((start + k) % n) as u32;
            let a = if self.cfg.rarest_first {
                self.avail[p as usize]
            } else {
                1
            };
            if self.state[p as usize] != Piece::Missing || self.avail[p as usize] == 0 {
                continue;
            }
            if best.is_some_and(|(ba, _)| a > ba) {
                continue;
            }
            if !usable.iter().any(|(_, peer)| peer.have.contains(p)) {
                continue;
            }
            match best {
                Some((ba, _)) if a == ba => {
                    ties += 1;
                    if self.rng.below(ties) == 0 {
                        best = Some((a, p));
                    }
                }
                _ => {
                    best = Some((a, p));
                    ties = 1;
                }
            }
        }
        let (_, piece) = best?;
        let mut pick: Option<(u32, u64)> = None;
        let mut ties = 0usize;
        for (id, peer) in &usable {
            if !peer.have.contains(piece) {
                continue;
            }
            match pick {
                Some((load, _)) if peer.inflight > load => {}
                Some((load, _)) if peer.inflight == load => {
                    ties += 1;
                    if self.rng.below(ties) == 0 {
                        pick = Some((peer.inflight, *id));
                    }
                }
                _ => {
                    pick = Some((peer.inflight, *id));
                    ties = 1;
                }
            }
        }
        let (_, id) = pick?;
        Some(Request {
            piece,
            from: From::Peer(id),
        })
    }

    fn settle(&mut self, piece: u32, from: From) -> bool {
        if self.state.get(piece as usize) != Some(&Piece::Flight) {
            return false;
        }
        self.inflight = self.inflight.saturating_sub(1);
        if let From::Peer(p) = from {
            if let Some(peer) = self.peers.get_mut(&p) {
                peer.inflight = peer.inflight.saturating_sub(1);
            }
        }
        true
    }

    /// A piece arrived and matched its hash.
    pub fn verified(&mut self, piece: u32, from: From) {
        if !self.settle(piece, from) {
            return;
        }
        self.state[piece as usize] = Piece::Have;
        self.have.insert(piece);
        self.unannounced.push(piece);
    }

    /// A fetch gave nothing; the piece is fetched again, elsewhere if the source is gone.
    pub fn failed(&mut self, piece: u32, from: From, why: Failure, now: Instant) {
        if !self.settle(piece, from) {
            return;
        }
        self.state[piece as usize] = Piece::Missing;
        match from {
            From::Seed => {
                // The store is asked again after a pause; a broken store is the caller's to
                // report (it falls back to every source it knows).
                self.seed_busy_until = Some(now + self.cfg.busy_backoff);
                if why != Failure::Broken {
                    self.seed.push_back(piece);
                }
            }
            From::Peer(p) => {
                let Some(peer) = self.peers.get_mut(&p) else {
                    return;
                };
                match why {
                    Failure::Busy => peer.busy_until = Some(now + self.cfg.busy_backoff),
                    Failure::Missing => {
                        if peer.have.contains(piece) && !peer.gone {
                            peer.have.remove(piece);
                            self.avail[piece as usize] -= 1;
                        }
                    }
                    Failure::Broken => {
                        if !peer.gone {
                            peer.gone = true;
                            for q in peer.have.iter() {
                                self.avail[q as usize] -= 1;
                            }
                        }
                    }
                }
            }
        }
    }
}
