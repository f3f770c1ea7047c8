//! The board's state and who is on it: members joining (each linked to a few others), nodes
//! that hold the whole version already, mounts' readers, and members leaving.

use std::collections::HashMap;
use std::time::Instant;

use super::bounds::{LINKS, MAX_LINKS};
use super::pool::Pool;
use crate::broadcast::swarm::limits::{DEFAULT_UPLOADS, SEED_SLOTS};
use crate::broadcast::swarm::pieceset::PieceSet;
use crate::broadcast::swarm::rng::Rng;
use crate::proto::SwarmFetch;

/// Where a fetch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Src {
    Member(usize),
    Store,
}

/// A member as the board keeps it.
#[derive(Debug)]
pub(super) struct Slot {
    /// Joined, and neither died nor left without a copy.
    pub(super) live: bool,
    /// Its node serves what it holds: others may fetch from it.
    pub(super) serves: bool,
    /// A mount's reader: it needs what it asks for (`want`), lowest piece first, and the store
    /// may send it [`READER_SEED_SLOTS`](crate::broadcast::swarm::limits::READER_SEED_SLOTS) pieces at once.
    pub(super) reads: bool,
    pub(super) zone: String,
    /// Verified pieces (what it may serve).
    pub(super) have: PieceSet,
    /// Pieces it still needs and is not fetching.
    pub(super) need: PieceSet,
    /// Fetches it runs: piece, source, and whether the source's upload was freed already (the
    /// member said the fetch is ending).
    pub(super) fetching: Vec<(u32, Src, bool)>,
    /// Download slots free, as it said at its last sync, less what was chosen for it since.
    pub(super) idle: u32,
    /// Uploads the board started from it that have not ended.
    pub(super) up: u32,
    /// Uploads from it that were freed by an ending fetch and still run: at most one, so that
    /// a fetch slower than its member thought does not heap more uploads on its source.
    pub(super) early: u32,
    pub(super) busy_until: Option<Instant>,
    /// Sources that broke for it: not chosen for it again.
    pub(super) avoid: Vec<usize>,
    /// The members it fetches from and sends to.
    pub(super) links: Vec<usize>,
    pub(super) mail: Vec<SwarmFetch>,
    /// It sent its first sync (`need` holds what it said it needs).
    pub(super) synced: bool,
    /// When it last synced.
    pub(super) heard: Option<Instant>,
}

/// One swarm (a window's members fetching one version), as the server keeps it.
#[derive(Debug)]
pub struct Board {
    pub(super) pieces: u32,
    /// Members in join order; every index below is a place in this list.
    pub(super) slots: Vec<Slot>,
    /// The caller's ids of the members, and back.
    pub(super) ids: HashMap<u64, usize>,
    pub(super) ext: Vec<u64>,
    /// Live members holding each piece, and fetches of it running: how rare it is.
    pub(super) holders: Vec<u32>,
    pub(super) copies: Vec<u32>,
    /// The store's fetch of each piece: by whom, since when, and whether it is ending (then
    /// it no longer holds one of the store's slots).
    pub(super) store_grant: Vec<Option<(usize, Instant, bool)>>,
    pub(super) seed_slots: usize,
    pub(super) uploads: u32,
    /// Members that serve, hold something and have an upload slot free (a superset: checked
    /// when sampled).
    pub(super) free: Pool,
    /// Members with download slots free and nothing chosen for them (a superset likewise).
    pub(super) waiting: Pool,
    /// Live members that serve, to link joiners to.
    pub(super) live: Pool,
    pub(super) woken: Vec<u64>,
    pub(super) granted: u64,
    /// Uploads freed before they ended ([`Board::ending`]), so far.
    pub(super) freed_early: u64,
    /// When members were last looked at for silence.
    pub(super) swept: Option<Instant>,
    pub(super) rng: Rng,
}

impl Board {
    pub fn new(pieces: u32, seed: u64) -> Self {
        Self::with_slots(pieces, SEED_SLOTS, DEFAULT_UPLOADS, seed)
    }

    /// How many pieces a member sends at once.
    pub fn uploads(&self) -> u32 {
        self.uploads
    }

    /// A board whose store sends `seed_slots` pieces at once and whose members send `uploads`.
    pub fn with_slots(pieces: u32, seed_slots: usize, uploads: u32, seed: u64) -> Self {
        let n = pieces as usize;
        Board {
            pieces,
            slots: Vec::new(),
            ids: HashMap::new(),
            ext: Vec::new(),
            holders: vec![0; n],
            copies: vec![0; n],
            store_grant: vec![None; n],
            seed_slots: seed_slots.max(1),
            uploads: uploads.max(1),
            free: Pool::default(),
            waiting: Pool::default(),
            live: Pool::default(),
            woken: Vec::new(),
            granted: 0,
            freed_early: 0,
            swept: None,
            rng: Rng::new(seed),
        }
    }

    /// Pieces fetched from the store so far: the store's egress in pieces.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Uploads whose source was given its next before they ended, so far.
    pub fn freed_early(&self) -> u64 {
        self.freed_early
    }

    /// Live members holding piece `p`.
    pub fn holders(&self, p: u32) -> u32 {
        self.holders.get(p as usize).copied().unwrap_or(0)
    }

    /// Members that got fetches in their mailbox since the last call: their waiting syncs can
    /// be answered now.
    pub fn woken(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.woken)
    }

    /// Whether member `id` has fetches waiting to be sent to it.
    pub fn has_mail(&self, id: u64) -> bool {
        self.idx(id)
            .and_then(|m| self.slots.get(m))
            .is_some_and(|s| !s.mail.is_empty())
    }

    pub(super) fn idx(&self, m: u64) -> Option<usize> {
        self.ids.get(&m).copied()
    }

    pub(super) fn live_slot(&self, m: usize) -> bool {
        self.slots.get(m).is_some_and(|s| s.live)
    }

    /// Whether `m` is here (live or not).
    pub fn knows(&self, m: u64) -> bool {
        self.ids.contains_key(&m)
    }

    /// Adds a node that holds the whole version already (it fetched it before), under id `m`:
    /// a source like any member that holds a piece.
    pub fn join_holder(&mut self, m: u64, zone: &str) {
        if self.knows(m) {
            return;
        }
        self.join(m, zone, true);
        let Some(i) = self.idx(m) else { return };
        let all: Vec<u32> = (0..self.pieces).collect();
        if let Some(s) = self.slots.get_mut(i) {
            s.synced = true;
            s.need = PieceSet::new(self.pieces);
        }
        self.record(i, &all);
    }

    /// Adds member `m` (an id the caller chooses: the window's member id). A member that does
    /// not serve (no agent of its own) fetches like any other but is never a source. An id
    /// already here is left as it is.
    pub fn join(&mut self, id: u64, zone: &str, serves: bool) {
        if self.knows(id) {
            return;
        }
        let mut need = PieceSet::new(self.pieces);
        for p in 0..self.pieces {
            need.insert(p);
        }
        self.ids.insert(id, self.slots.len());
        self.ext.push(id);
        self.slots.push(Slot {
            live: true,
            serves,
            reads: false,
            zone: zone.to_string(),
            have: PieceSet::new(self.pieces),
            need,
            fetching: Vec::new(),
            idle: 0,
            up: 0,
            early: 0,
            busy_until: None,
            avoid: Vec::new(),
            links: Vec::new(),
            mail: Vec::new(),
            synced: false,
            heard: None,
        });
        let m = self.slots.len() - 1;
        // Random live members, same zone first: a few tries each, so a window of one zone
        // costs nothing extra.
        for same_zone in [true, false] {
            for _ in 0..3 * LINKS {
                if self.live.list.is_empty() || self.slots[m].links.len() >= LINKS {
                    break;
                }
                let c = self.live.list[self.rng.below(self.live.list.len())];
                let ok = self.slots.get(c).is_some_and(|s| {
                    s.links.len() < MAX_LINKS
                        && (!same_zone || (!zone.is_empty() && s.zone == zone))
                });
                if ok {
                    self.link(m, c);
                }
            }
        }
        if serves {
            self.live.add(m);
        }
    }

    /// Adds a mount's reader under id `m`: it serves what it reads, needs nothing until its
    /// syncs say what it wants, and is given the lowest piece it wants first (the reader
    /// waits for it), not the rarest.
    pub fn join_reader(&mut self, id: u64, zone: &str) {
        if self.knows(id) {
            return;
        }
        self.join(id, zone, true);
        if let Some(s) = self.idx(id).and_then(|i| self.slots.get_mut(i)) {
            s.reads = true;
        }
    }

    /// Whether `m` has room for another link: fewer than [`MAX_LINKS`] links that still fetch
    /// (links to members that are done do not count: they only send).
    pub(super) fn roomy(&self, m: usize) -> bool {
        self.slots.get(m).is_some_and(|s| {
            s.links
                .iter()
                .filter(|&&l| {
                    self.slots
                        .get(l)
                        .is_some_and(|o| o.live && o.need.count() > 0)
                })
                .count()
                < MAX_LINKS
        })
    }

    /// Links `a` and `b` both ways (once).
    pub(super) fn link(&mut self, a: usize, b: usize) {
        if a == b || self.slots.get(a).is_none_or(|s| s.links.contains(&b)) {
            return;
        }
        if let Some(s) = self.slots.get_mut(a) {
            s.links.push(b);
        }
        if let Some(s) = self.slots.get_mut(b) {
            s.links.push(a);
        }
    }

    /// Member `m` is finished. With a copy (`done`) on a node that serves, it stays a source
    /// (its node seeds what it fetched); otherwise it is gone: what it fetched and sent ends,
    /// and its pieces count no more.
    pub fn leave(&mut self, id: u64, done: bool) {
        let Some(m) = self.idx(id) else { return };
        let Some(s) = self.slots.get_mut(m) else {
            return;
        };
        if !s.live || (done && s.serves) {
            return;
        }
        s.live = false;
        s.idle = 0;
        s.mail.clear();
        self.free.remove(m);
        self.waiting.remove(m);
        self.live.remove(m);
        let links = std::mem::take(&mut s.links);
        let had: Vec<u32> = s.have.iter().collect();
        let fetching = std::mem::take(&mut s.fetching);
        for l in links {
            if let Some(o) = self.slots.get_mut(l) {
                o.links.retain(|&x| x != m);
            }
        }
        for p in had {
            let p = p as usize;
            self.holders[p] = self.holders[p].saturating_sub(1);
            self.copies[p] = self.copies[p].saturating_sub(1);
        }
        for (p, src, freed) in fetching {
            self.end_fetch(m, p, src, freed);
        }
        // Fetches from it end with a broken connection; their members report them, and until
        // then the pieces count as being fetched.
    }
}
