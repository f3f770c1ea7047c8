//! The server's view of one swarm: who holds which pieces, who neighbours whom, and which
//! pieces the store was asked for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{PieceSet, Rng, INTRODUCE, MAX_NEIGHBOURS, NEIGHBOURS, SEED_SLOTS};
use crate::proto::{SwarmPeer, SwarmSyncReply, SwarmSyncRequest};

/// A store grant not followed by the piece's announcement within this long is given again: its
/// member stalled, and the piece must not wait on it.
pub const GRANT_TTL: Duration = Duration::from_secs(30);
/// Holders remembered per piece, to introduce to members that lack it.
const RECENT_HOLDERS: usize = 8;

#[derive(Debug)]
struct Slot {
    /// Joined, and neither died nor left without a copy.
    live: bool,
    /// Its node serves what it holds: others may fetch from it.
    serves: bool,
    zone: String,
    /// Announcements in order: what a neighbour's cursor counts.
    log: Vec<u32>,
    have: PieceSet,
    neighbours: Vec<usize>,
}

/// One swarm (a window's members fetching one version), as the server keeps it.
#[derive(Debug)]
pub struct Board {
    pieces: u32,
    /// Members in join order; every index below is a place in this list.
    slots: Vec<Slot>,
    /// The caller's ids of the members, and back.
    ids: HashMap<u64, usize>,
    ext: Vec<u64>,
    /// Live members holding each piece.
    holders: Vec<u32>,
    /// Some of them, to introduce.
    recent: Vec<Vec<usize>>,
    /// Members fetching each piece from the store, and since when.
    grants: Vec<Vec<(usize, Instant)>>,
    /// Store fetches allowed at once.
    seed_slots: usize,
    /// Live members that serve, for random neighbours.
    live: Vec<usize>,
    granted: u64,
    rng: Rng,
}

impl Board {
    pub fn new(pieces: u32, seed: u64) -> Self {
        Self::with_seed_slots(pieces, SEED_SLOTS, seed)
    }

    pub fn with_seed_slots(pieces: u32, seed_slots: usize, seed: u64) -> Self {
        let n = pieces as usize;
        Board {
            pieces,
            slots: Vec::new(),
            ids: HashMap::new(),
            ext: Vec::new(),
            holders: vec![0; n],
            recent: vec![Vec::new(); n],
            grants: vec![Vec::new(); n],
            seed_slots: seed_slots.max(1),
            live: Vec::new(),
            granted: 0,
            rng: Rng::new(seed),
        }
    }

    /// Pieces granted from the store so far: the store's egress in pieces.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Live members holding piece `p`.
    pub fn holders(&self, p: u32) -> u32 {
        self.holders.get(p as usize).copied().unwrap_or(0)
    }

    /// The member's neighbours, as member ids.
    pub fn neighbours(&self, m: u64) -> Vec<u64> {
        self.idx(m)
            .and_then(|i| self.slot(i))
            .map(|s| s.neighbours.iter().map(|&n| self.ext[n]).collect())
            .unwrap_or_default()
    }

    fn idx(&self, m: u64) -> Option<usize> {
        self.ids.get(&m).copied()
    }

    fn slot(&self, m: usize) -> Option<&Slot> {
        self.slots.get(m)
    }

    fn live_slot(&self, m: usize) -> bool {
        self.slot(m).is_some_and(|s| s.live)
    }

    fn serving(&self, m: usize) -> bool {
        self.slot(m).is_some_and(|s| s.live && s.serves)
    }

    /// Whether `m` is here (live or not).
    pub fn knows(&self, m: u64) -> bool {
        self.ids.contains_key(&m)
    }

    /// Adds a node that holds the whole version already (it fetched it before), under id `m`:
    /// members are introduced to it like to any holder.
    pub fn join_holder(&mut self, m: u64, zone: &str) {
        if self.knows(m) {
            return;
        }
        self.join(m, zone, true);
        let all: Vec<u32> = (0..self.pieces).collect();
        if let Some(i) = self.idx(m) {
            self.record(i, &all);
        }
    }

    /// Adds member `m` (an id the caller chooses: the window's member id) and links it to random
    /// live members that serve, same zone first. A member that does not serve (no agent of its
    /// own) fetches like any other but is never offered to others. An id already here is left
    /// as it is.
    pub fn join(&mut self, id: u64, zone: &str, serves: bool) {
        if self.knows(id) {
            return;
        }
        let m = self.slots.len();
        let mut picks: Vec<usize> = Vec::new();
        // Same zone first: a few tries each, so a window of one zone costs nothing extra.
        for same_zone in [true, false] {
            let tries = 3 * NEIGHBOURS;
            for _ in 0..tries {
                if picks.len() >= NEIGHBOURS || self.live.is_empty() {
                    break;
                }
                let c = self.live[self.rng.below(self.live.len())];
                let Some(s) = self.slot(c) else { continue };
                if picks.contains(&c)
                    || s.neighbours.len() >= MAX_NEIGHBOURS
                    || (same_zone && (zone.is_empty() || s.zone != zone))
                {
                    continue;
                }
                picks.push(c);
            }
        }
        // A small swarm: everyone.
        if picks.len() < NEIGHBOURS && self.live.len() <= NEIGHBOURS {
            for &c in &self.live {
                if !picks.contains(&c) {
                    picks.push(c);
                }
            }
        }
        if serves {
            for &c in &picks {
                if let Some(s) = self.slots.get_mut(c) {
                    s.neighbours.push(m);
                }
            }
        }
        self.ids.insert(id, m);
        self.ext.push(id);
        self.slots.push(Slot {
            live: true,
            serves,
            zone: zone.to_string(),
            log: Vec::new(),
            have: PieceSet::new(self.pieces),
            neighbours: picks,
        });
        if serves {
            self.live.push(m);
        }
    }

    /// Member `m` is finished. With a copy (`done`) on a node that serves, it stays a holder
    /// others fetch from (its node seeds what it fetched); otherwise it is gone: its neighbours
    /// are told at their next sync, and what it was fetching from the store may be granted to
    /// others.
    pub fn leave(&mut self, id: u64, done: bool) {
        let Some(m) = self.idx(id) else { return };
        if (done && self.serving(m)) || !self.live_slot(m) {
            return;
        }
        let Some(s) = self.slots.get_mut(m) else {
            return;
        };
        s.live = false;
        let had: Vec<u32> = s.have.iter().collect();
        let neighbours = std::mem::take(&mut s.neighbours);
        for p in had {
            let p = p as usize;
            self.holders[p] = self.holders[p].saturating_sub(1);
            self.recent[p].retain(|&h| h != m);
        }
        for g in &mut self.grants {
            g.retain(|&(x, _)| x != m);
        }
        for n in neighbours {
            if let Some(s) = self.slots.get_mut(n) {
                s.neighbours.retain(|&x| x != m);
            }
        }
        self.live.retain(|&x| x != m);
    }

    /// One member's sync: records what it verified, answers with what its neighbours announced
    /// since its cursors, and serves a `want_seed`. Peers appear with `source` unset; the
    /// caller fills in where to reach the new ones. Bad indices from a member are ignored.
    pub fn sync(&mut self, req: &SwarmSyncRequest, now: Instant) -> SwarmSyncReply {
        let mut reply = SwarmSyncReply::default();
        let Some(m) = self.idx(req.member).filter(|&m| self.live_slot(m)) else {
            return reply;
        };
        self.record(m, &req.verified);
        let seen: HashMap<u64, u32> = req.seen.iter().map(|c| (c.member, c.seen)).collect();
        if req.starving {
            self.introduce(m);
        }
        let Some(me) = self.slot(m) else {
            return reply;
        };
        for &n in &me.neighbours {
            let Some(ns) = self.slot(n) else { continue };
            let known = seen.get(&self.ext[n]).copied();
            let from = known.unwrap_or(0).min(ns.log.len() as u32);
            let pieces = &ns.log[from as usize..];
            if known.is_some() && pieces.is_empty() {
                continue;
            }
            reply.peers.push(SwarmPeer {
                member: self.ext[n],
                source: None,
                from,
                pieces: pieces.to_vec(),
                gone: false,
            });
        }
        for c in &req.seen {
            let still = self
                .idx(c.member)
                .is_some_and(|n| me.neighbours.contains(&n));
            if !still {
                reply.peers.push(SwarmPeer {
                    member: c.member,
                    gone: true,
                    ..Default::default()
                });
            }
        }
        if req.want_seed > 0 {
            reply.seed = self.grant(m, req.want_seed, now);
        }
        reply
    }

    fn record(&mut self, m: usize, verified: &[u32]) {
        let Some(s) = self.slots.get_mut(m) else {
            return;
        };
        for &p in verified {
            if !s.have.insert(p) {
                continue;
            }
            s.log.push(p);
            let i = p as usize;
            self.holders[i] += 1;
            if self.recent[i].len() < RECENT_HOLDERS {
                self.recent[i].push(m);
            }
            self.grants[i].retain(|&(x, _)| x != m);
        }
    }

    /// Links `m` to holders (or store fetchers) of pieces it lacks that no neighbour of it has
    /// announced: a member starves only when no one has what it lacks.
    fn introduce(&mut self, m: usize) {
        let n = self.pieces as usize;
        if n == 0 {
            return;
        }
        let start = self.rng.below(n);
        let Some(me) = self.slot(m) else { return };
        if me.have.full() {
            return;
        }
        let mut picks: Vec<usize> = Vec::new();
        for k in 0..n {
            if picks.len() >= INTRODUCE {
                break;
            }
            let p = (start + k) % n;
            if me.have.contains(p as u32)
                || me
                    .neighbours
                    .iter()
                    .any(|&x| self.slot(x).is_some_and(|s| s.have.contains(p as u32)))
            {
                continue;
            }
            let fetching = self.grants[p].iter().map(|&(x, _)| x);
            let pick = self.recent[p].iter().copied().chain(fetching).find(|&c| {
                c != m && self.serving(c) && !me.neighbours.contains(&c) && !picks.contains(&c)
            });
            if let Some(c) = pick {
                picks.push(c);
            }
        }
        let serves = self.serving(m);
        for c in picks {
            if serves {
                if let Some(s) = self.slots.get_mut(c) {
                    s.neighbours.push(m);
                }
            }
            if let Some(s) = self.slots.get_mut(m) {
                s.neighbours.push(c);
            }
        }
    }

    /// Up to `want` pieces `m` lacks that no live member holds and none is fetching from the
    /// store (or whose fetch is older than [`GRANT_TTL`]), from a random place in the version,
    /// within the store's free slots.
    fn grant(&mut self, m: usize, want: u32, now: Instant) -> Vec<u32> {
        let n = self.pieces as usize;
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        for g in &mut self.grants {
            g.retain(|&(_, at)| now.saturating_duration_since(at) < GRANT_TTL);
        }
        let busy: usize = self.grants.iter().map(Vec::len).sum();
        let want = (want as usize).min(self.seed_slots.saturating_sub(busy));
        let start = self.rng.below(n);
        for k in 0..n {
            if out.len() >= want {
                break;
            }
            let p = (start + k) % n;
            let lacks = self.slot(m).is_some_and(|s| !s.have.contains(p as u32));
            if !lacks || self.holders[p] > 0 {
                continue;
            }
            let g = &mut self.grants[p];
            if !g.is_empty() {
                continue;
            }
            g.push((m, now));
            out.push(p as u32);
        }
        self.granted += out.len() as u64;
        out
    }
}
