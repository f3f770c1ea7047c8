//! The server's schedule of one swarm: who holds which pieces, who sends to whom, and which
//! fetch each member starts next.
//!
//! Every fetch is the board's choice, so it knows each node's uploads in flight exactly: a
//! source is asked for no more pieces at once than the board's `uploads`, and never answers
//! busy for this swarm. Two moments start fetches: a member's sync (it has download slots free:
//! the rarest piece among its links with an upload slot free), and a source's slot coming free
//! or the source verifying a piece (the rarest piece it holds, to one of its links that waits).
//! Fetches made for a member between its syncs wait in its mailbox; [`Board::woken`] names the
//! members that have mail, so that the server can answer their waiting syncs at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::limits::{DEFAULT_UPLOADS, READER_UPLOADS, SEED_SLOTS};
use super::pieceset::PieceSet;
use super::rng::Rng;
use crate::proto::{SwarmFetch, SwarmSyncReply, SwarmSyncRequest};

/// A store fetch not followed by the piece's verification within this long is given again:
/// its member stalled, and the piece must not wait on it.
pub const GRANT_TTL: Duration = Duration::from_secs(30);
/// A source that answered busy (it serves other swarms or readers too) is not chosen again for
/// this long.
pub const BUSY_BACKOFF: Duration = Duration::from_millis(200);
/// A member that still fetches and has not synced for this long is taken for dead (its process
/// was killed): it leaves, and the uploads to it end. Members sync at least every
/// [`KEEPALIVE`] while they fetch.
pub const SILENCE: Duration = Duration::from_secs(10);
/// How often a member that fetches syncs at least, with nothing else to say.
pub const KEEPALIVE: Duration = Duration::from_secs(3);
/// Members (or waiting members) looked at for one choice beyond a member's links, when none
/// of its links can help: enough to find a rare piece, few enough that a choice costs the same
/// at 5,000 members as at 50.
const SAMPLE: usize = 24;
/// Links a member gets at its join (both ways, same zone first). A member fetches from and
/// sends to its links, so each node keeps a bounded set of connections (a new connection per
/// block pays TCP's slow start, and every pair of nodes a full mesh: measured, 32 nodes on
/// 400 Mbit links took 8x one transfer with sources chosen from the whole swarm); a member
/// whose links hold nothing it needs, or a source none of whose links need what it holds, is
/// linked to one more.
pub const LINKS: usize = 8;
/// A member accepts links from joiners, and takes links to free sources when its own are busy,
/// until it has this many that still fetch.
const MAX_LINKS: usize = 2 * LINKS;
/// Store fetches at once while the members waiting on the store read (mounts' readers): a
/// reader waits for the very block it asked for, and readers of different parts of a file
/// want different blocks, so the store keeps a reader's readahead going as a plain fetch
/// would, rather than one block per round trip.
pub const READER_SEED_SLOTS: usize = 4;

/// Why a member's fetch gave nothing, as the sync reports it.
pub const WHY_BUSY: u32 = 1;
pub const WHY_MISSING: u32 = 2;
pub const WHY_BROKEN: u32 = 3;
pub const WHY_DECLINED: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Member(usize),
    Store,
}

#[derive(Debug)]
struct Slot {
    /// Joined, and neither died nor left without a copy.
    live: bool,
    /// Its node serves what it holds: others may fetch from it.
    serves: bool,
    /// A mount's reader: it needs what it asks for (`want`), lowest piece first, and the store
    /// may send it [`READER_SEED_SLOTS`] pieces at once.
    reads: bool,
    zone: String,
    /// Verified pieces (what it may serve).
    have: PieceSet,
    /// Pieces it still needs and is not fetching.
    need: PieceSet,
    /// Fetches it runs: piece, source, and whether the source's upload was freed already (the
    /// member said the fetch is ending).
    fetching: Vec<(u32, Src, bool)>,
    /// Download slots free, as it said at its last sync, less what was chosen for it since.
    idle: u32,
    /// Uploads the board started from it that have not ended.
    up: u32,
    /// Uploads from it that were freed by an ending fetch and still run: at most one, so that
    /// a fetch slower than its member thought does not heap more uploads on its source.
    early: u32,
    busy_until: Option<Instant>,
    /// Sources that broke for it: not chosen for it again.
    avoid: Vec<usize>,
    /// The members it fetches from and sends to.
    links: Vec<usize>,
    mail: Vec<SwarmFetch>,
    /// It sent its first sync (`need` holds what it said it needs).
    synced: bool,
    /// When it last synced.
    heard: Option<Instant>,
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
    /// Live members holding each piece, and fetches of it running: how rare it is.
    holders: Vec<u32>,
    copies: Vec<u32>,
    /// The store's fetch of each piece: by whom, since when, and whether it is ending (then
    /// it no longer holds one of the store's slots).
    store_grant: Vec<Option<(usize, Instant, bool)>>,
    seed_slots: usize,
    uploads: u32,
    /// Members that serve, hold something and have an upload slot free (a superset: checked
    /// when sampled).
    free: Pool,
    /// Members with download slots free and nothing chosen for them (a superset likewise).
    waiting: Pool,
    /// Live members that serve, to link joiners to.
    live: Pool,
    woken: Vec<u64>,
    granted: u64,
    /// Uploads freed before they ended ([`Board::ending`]), so far.
    freed_early: u64,
    /// When members were last looked at for silence.
    swept: Option<Instant>,
    rng: Rng,
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

    fn idx(&self, m: u64) -> Option<usize> {
        self.ids.get(&m).copied()
    }

    fn live_slot(&self, m: usize) -> bool {
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
    fn roomy(&self, m: usize) -> bool {
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
    fn link(&mut self, a: usize, b: usize) {
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

    /// One member's sync: records what it verified and which fetches failed, chooses fetches
    /// for its free download slots and for the sources it freed, and answers with its mail
    /// (the caller adds where to reach each source). Bad indices from a member are ignored.
    pub fn sync(&mut self, req: &SwarmSyncRequest, now: Instant) -> SwarmSyncReply {
        let Some(m) = self.idx(req.member).filter(|&m| self.live_slot(m)) else {
            return SwarmSyncReply::default();
        };
        if let Some(s) = self.slots.get_mut(m) {
            s.heard = Some(now);
            if !s.synced {
                s.synced = true;
                for &p in &req.skip {
                    s.need.remove(p);
                }
            }
            for &p in &req.want {
                if !s.have.contains(p) && !s.fetching.iter().any(|f| f.0 == p) {
                    s.need.insert(p);
                }
            }
        }
        let mut freed: Vec<Src> = Vec::new();
        for f in &req.failed {
            let src = if f.store {
                Src::Store
            } else {
                match self.idx(f.from) {
                    Some(x) => Src::Member(x),
                    None => continue,
                }
            };
            if self.fail(m, f.piece, src, f.why, now) {
                freed.push(src);
            }
        }
        freed.extend(self.record(m, &req.verified));
        for &p in &req.ending {
            freed.extend(self.ending(m, p));
        }
        // What was chosen for it since its last sync goes out now; the slots it reports free
        // do not count those yet.
        let mail = self
            .slots
            .get_mut(m)
            .map(|s| std::mem::take(&mut s.mail))
            .unwrap_or_default();
        if let Some(s) = self.slots.get_mut(m) {
            s.idle = req.idle.saturating_sub(mail.len() as u32);
        }
        self.expire(now);
        // The store first: it alone has what no member holds, and its uplink is the swarm's
        // narrowest.
        self.serve(Src::Store, now);
        self.fill(m, now);
        freed.push(Src::Member(m));
        for src in freed {
            self.serve(src, now);
        }
        let mut reply = SwarmSyncReply::default();
        if let Some(s) = self.slots.get_mut(m) {
            reply.fetch = mail;
            reply.fetch.append(&mut s.mail);
        }
        self.woken.retain(|&w| w != req.member);
        reply
    }

    /// Takes what was chosen for `id` since its last sync (after a waiting sync was woken).
    pub fn take_mail(&mut self, id: u64) -> SwarmSyncReply {
        let fetch = self
            .idx(id)
            .and_then(|m| self.slots.get_mut(m))
            .map(|s| std::mem::take(&mut s.mail))
            .unwrap_or_default();
        SwarmSyncReply {
            fetch,
            ..Default::default()
        }
    }

    /// Records verified pieces; returns the sources whose uploads they ended.
    fn record(&mut self, m: usize, verified: &[u32]) -> Vec<Src> {
        let mut freed = Vec::new();
        for &p in verified {
            let Some(s) = self.slots.get_mut(m) else {
                break;
            };
            if !s.have.insert(p) {
                continue;
            }
            s.need.remove(p);
            let i = p as usize;
            self.holders[i] += 1;
            let at = s.fetching.iter().position(|f| f.0 == p);
            match at {
                Some(k) => {
                    let (_, src, was_freed) = s.fetching.swap_remove(k);
                    // A fetch's copy was counted when it started.
                    self.finish(src, was_freed);
                    freed.push(src);
                }
                None => self.copies[i] += 1,
            }
            if self.store_grant[i].is_some_and(|(x, _, _)| x == m) {
                self.store_grant[i] = None;
            }
        }
        if self
            .slots
            .get(m)
            .is_some_and(|s| s.serves && s.have.count() > 0)
        {
            self.free.add(m);
        }
        freed
    }

    /// A failed fetch of `p` by `m` from `src`; whether it was one the board started.
    fn fail(&mut self, m: usize, p: u32, src: Src, why: u32, now: Instant) -> bool {
        let Some(s) = self.slots.get_mut(m) else {
            return false;
        };
        let Some(k) = s.fetching.iter().position(|f| f.0 == p && f.1 == src) else {
            return false;
        };
        let (_, _, was_freed) = s.fetching.swap_remove(k);
        if why != WHY_DECLINED {
            s.need.insert(p);
        }
        if let (WHY_BROKEN, Src::Member(x)) = (why, src) {
            if !s.avoid.contains(&x) {
                s.avoid.push(x);
            }
        }
        self.end_fetch(m, p, src, was_freed);
        match (why, src) {
            (WHY_BUSY, Src::Member(x)) => {
                if let Some(xs) = self.slots.get_mut(x) {
                    xs.busy_until = Some(now + BUSY_BACKOFF);
                }
            }
            (WHY_MISSING, Src::Member(x)) => {
                if let Some(xs) = self.slots.get_mut(x) {
                    if xs.have.remove(p) {
                        self.holders[p as usize] = self.holders[p as usize].saturating_sub(1);
                        self.copies[p as usize] = self.copies[p as usize].saturating_sub(1);
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// A fetch ended without its piece: it no longer counts as a copy or an upload (unless
    /// its upload was freed already).
    fn end_fetch(&mut self, m: usize, p: u32, src: Src, was_freed: bool) {
        let i = p as usize;
        self.copies[i] = self.copies[i].saturating_sub(1);
        if src == Src::Store && self.store_grant[i].is_some_and(|(x, _, _)| x == m) {
            self.store_grant[i] = None;
        }
        self.finish(src, was_freed);
    }

    /// A fetch from `src` ended: its upload is free, unless it was freed early.
    fn finish(&mut self, src: Src, was_freed: bool) {
        match (was_freed, src) {
            (false, _) => self.release(src),
            (true, Src::Member(x)) => {
                if let Some(xs) = self.slots.get_mut(x) {
                    xs.early = xs.early.saturating_sub(1);
                }
            }
            (true, Src::Store) => {}
        }
    }

    /// Member `m` says its fetch of `p` ends within a round trip: the source's upload is free
    /// for its next from now (the piece still counts as being fetched, and a failure still
    /// comes back to it). Returns the source freed, to be given its next at once.
    fn ending(&mut self, m: usize, p: u32) -> Option<Src> {
        let k = self
            .slots
            .get(m)?
            .fetching
            .iter()
            .position(|f| f.0 == p && !f.2)?;
        let src = self.slots[m].fetching[k].1;
        match src {
            Src::Member(x) => {
                let xs = self.slots.get_mut(x)?;
                if xs.early > 0 {
                    return None;
                }
                xs.early += 1;
                self.release(src);
            }
            Src::Store => {
                let early = self.store_grant.iter().any(|g| g.is_some_and(|g| g.2));
                let g = self.store_grant.get_mut(p as usize)?.as_mut()?;
                if early || g.0 != m {
                    return None;
                }
                g.2 = true;
            }
        }
        self.slots[m].fetching[k].2 = true;
        self.freed_early += 1;
        Some(src)
    }

    fn release(&mut self, src: Src) {
        if let Src::Member(x) = src {
            if let Some(xs) = self.slots.get_mut(x) {
                xs.up = xs.up.saturating_sub(1);
                if xs.live && xs.serves && xs.have.count() > 0 {
                    self.free.add(x);
                }
            }
        }
    }

    /// Store fetches older than [`GRANT_TTL`] free their pieces for others, and members that
    /// still fetch but went silent for [`SILENCE`] leave (looked for once a second: a sync
    /// costs the same at 5,000 members as at 50).
    fn expire(&mut self, now: Instant) {
        for g in &mut self.store_grant {
            if g.is_some_and(|(_, at, _)| now.saturating_duration_since(at) >= GRANT_TTL) {
                *g = None;
            }
        }
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.swept = Some(now);
        let silent: Vec<u64> = (0..self.slots.len())
            .filter(|&m| {
                let s = &self.slots[m];
                s.live
                    && (!s.fetching.is_empty() || s.need.count() > 0)
                    && s.heard
                        .is_some_and(|h| now.saturating_duration_since(h) >= SILENCE)
            })
            .map(|m| self.ext[m])
            .collect();
        for id in silent {
            self.leave(id, false);
        }
    }

    /// Store fetches running and not about to end (those past their time were expired at this
    /// sync).
    fn store_busy(&self) -> usize {
        self.store_grant
            .iter()
            .filter(|g| g.is_some_and(|(_, _, ending)| !ending))
            .count()
    }

    /// Store fetches that may run while `m` is given one.
    fn store_slots(&self, m: usize) -> usize {
        match self.slots.get(m).is_some_and(|s| s.reads) {
            true => self.seed_slots.max(READER_SEED_SLOTS),
            false => self.seed_slots,
        }
    }

    /// Whether `x` can send one more upload now.
    fn can_send(&self, x: usize, now: Instant) -> bool {
        self.slots.get(x).is_some_and(|s| {
            s.live
                && s.serves
                && s.up < self.uploads
                && s.have.count() > 0
                && s.busy_until.is_none_or(|t| now >= t)
        })
    }

    /// Whether `x` can send one more upload to `m` now: within its uploads, or, for a reader,
    /// [`super::READER_UPLOADS`] at once from a source that sends to that reader alone and
    /// that no other link of it waits for (a reader waits for each block it reads: one at a
    /// time, with a round trip between them, halved a lone reader's rate where no one else
    /// wanted the uplink).
    fn can_send_to(&self, x: usize, m: usize, now: Instant) -> bool {
        if self.can_send(x, now) {
            return true;
        }
        let (Some(xs), Some(ms)) = (self.slots.get(x), self.slots.get(m)) else {
            return false;
        };
        let to_m = ms
            .fetching
            .iter()
            .filter(|f| f.1 == Src::Member(x) && !f.2)
            .count();
        ms.reads
            && xs.live
            && xs.serves
            && xs.busy_until.is_none_or(|t| now >= t)
            && xs.up < READER_UPLOADS
            && to_m == xs.up as usize
            && !xs.links.iter().any(|&l| {
                l != m
                    && self.wants(l)
                    && self
                        .slots
                        .get(l)
                        .is_some_and(|o| xs.have.iter_and(&o.need).next().is_some())
            })
    }

    /// Whether `m` serves and has an upload slot free (for what it receives next).
    fn can_pass_on(&self, m: usize) -> bool {
        self.slots
            .get(m)
            .is_some_and(|s| s.serves && s.up < self.uploads)
    }

    fn wants(&self, m: usize) -> bool {
        self.slots
            .get(m)
            .is_some_and(|s| s.live && s.synced && s.idle > 0 && s.need.count() > 0)
    }

    /// The rarest piece `src` can give `m`, with its rarity; ties broken at random.
    fn best_piece(&mut self, src: Src, m: usize) -> Option<(u32, u32)> {
        let me = self.slots.get(m)?;
        let mut best: Option<(u32, u32)> = None;
        let mut ties = 0usize;
        match src {
            Src::Member(x) => {
                if me.avoid.contains(&x) || x == m {
                    return None;
                }
                let from = self.slots.get(x)?;
                if me.reads {
                    let p = from.have.iter_and(&me.need).next()?;
                    return Some((p, self.copies[p as usize]));
                }
                for p in from.have.iter_and(&me.need) {
                    let c = self.copies[p as usize];
                    match best {
                        Some((bc, _)) if c > bc => {}
                        Some((bc, _)) if c == bc => {
                            ties += 1;
                            if self.rng.below(ties) == 0 {
                                best = Some((c, p));
                            }
                        }
                        _ => {
                            best = Some((c, p));
                            ties = 1;
                        }
                    }
                }
            }
            Src::Store => {
                // Only what no member holds, and not twice at once; a reader's lowest first.
                let n = self.pieces as usize;
                let start = match me.reads {
                    true => 0,
                    false => self.rng.below(n.max(1)),
                };
                for k in 0..n {
                    let p = ((start + k) % n) as u32;
                    let i = p as usize;
                    if self.store_grant[i].is_none()
                        && me.need.contains(p)
                        && self.holders[i] == self.avoided_holders(m, p)
                    {
                        return Some((p, 0));
                    }
                }
            }
        }
        best.map(|(c, p)| (p, c))
    }

    /// Live holders of `p` that broke for `m`: while they are all it has, the store sends it
    /// `p` (a dead node stays a holder until its lease runs out, and `m` must not wait on it).
    fn avoided_holders(&self, m: usize, p: u32) -> u32 {
        let Some(me) = self.slots.get(m) else {
            return 0;
        };
        me.avoid
            .iter()
            .filter(|&&x| {
                self.slots
                    .get(x)
                    .is_some_and(|s| s.live && s.have.contains(p))
            })
            .count() as u32
    }

    fn start(&mut self, m: usize, p: u32, src: Src, now: Instant) {
        let i = p as usize;
        self.copies[i] += 1;
        let from = match src {
            Src::Member(x) => {
                if let Some(xs) = self.slots.get_mut(x) {
                    xs.up += 1;
                    if xs.up >= self.uploads {
                        self.free.remove(x);
                    }
                }
                self.ext[x]
            }
            Src::Store => {
                self.store_grant[i] = Some((m, now, false));
                self.granted += 1;
                0
            }
        };
        let Some(s) = self.slots.get_mut(m) else {
            return;
        };
        s.need.remove(p);
        s.idle = s.idle.saturating_sub(1);
        s.fetching.push((p, src, false));
        s.mail.push(SwarmFetch {
            piece: p,
            from,
            store: src == Src::Store,
        });
        let id = self.ext[m];
        if !self.woken.contains(&id) {
            self.woken.push(id);
        }
    }

    /// Chooses fetches for `m`'s free download slots: the rarest piece among its links with an
    /// upload slot free (same zone first); if no link holds anything it needs, from a sample of
    /// all sources with a slot free (then linked to it); else from the store.
    fn fill(&mut self, m: usize, now: Instant) {
        while self.wants(m) {
            let links = self
                .slots
                .get(m)
                .map(|s| s.links.clone())
                .unwrap_or_default();
            let (best, any) = self.best_source(m, &links, now);
            // Its links hold nothing it needs: any source. They are all busy: a source that
            // has room for one more link, while it has room too.
            let best = match best {
                Some(b) => Some(b),
                None if !any || self.roomy(m) => {
                    let mut sample = self.free.sample(&mut self.rng, SAMPLE);
                    if any {
                        sample.retain(|&x| self.roomy(x));
                    }
                    let (b, _) = self.best_source(m, &sample, now);
                    if let Some((_, x)) = b {
                        self.link(m, x);
                    }
                    b
                }
                None => None,
            };
            if let Some((p, x)) = best {
                self.start(m, p, Src::Member(x), now);
                continue;
            }
            if self.store_busy() < self.store_slots(m) {
                if let Some((p, _)) = self.best_piece(Src::Store, m) {
                    self.start(m, p, Src::Store, now);
                    continue;
                }
            }
            self.waiting.add(m);
            break;
        }
    }

    /// The rarest piece `m` can fetch now from one of `sources` (same zone first), and whether
    /// any of them holds something `m` needs at all (busy or not).
    fn best_source(
        &mut self,
        m: usize,
        sources: &[usize],
        now: Instant,
    ) -> (Option<(u32, usize)>, bool) {
        let (zone, reads) = self
            .slots
            .get(m)
            .map(|s| (s.zone.clone(), s.reads))
            .unwrap_or_default();
        let mut best: Option<(u32, bool, u32, usize)> = None;
        let mut any = false;
        // From a random place on, so that equal sources share the fetches.
        let start = self.rng.below(sources.len().max(1));
        for k in 0..sources.len() {
            let x = sources[(start + k) % sources.len()];
            let Some(xs) = self.slots.get(x) else {
                continue;
            };
            if !xs.live || !xs.serves {
                continue;
            }
            let Some((p, c)) = self.best_piece(Src::Member(x), m) else {
                continue;
            };
            any = true;
            if !self.can_send_to(x, m, now) {
                continue;
            }
            let other_zone = !zone.is_empty() && self.slots[x].zone != zone;
            // A reader's lowest piece first; anyone else's rarest.
            let rank = if reads { p } else { c };
            if best.is_none_or(|(bc, bz, _, _)| (rank, other_zone) < (bc, bz)) {
                best = Some((rank, other_zone, p, x));
            }
        }
        (best.map(|(_, _, p, x)| (p, x)), any)
    }

    /// Gives `src`'s free upload slots to members waiting: the rarest piece it can give, among
    /// its links that wait; if none of them needs anything it holds, among a sample of all the
    /// members waiting (then linked to it).
    fn serve(&mut self, src: Src, now: Instant) {
        loop {
            let free = match src {
                Src::Store => self.store_busy() < self.seed_slots.max(READER_SEED_SLOTS),
                Src::Member(x) => self.can_send(x, now),
            };
            if !free {
                return;
            }
            let (best, link) = match src {
                Src::Member(x) => {
                    let links = self
                        .slots
                        .get(x)
                        .map(|s| s.links.clone())
                        .unwrap_or_default();
                    match self.best_taker(src, &links) {
                        Some(b) => (Some(b), false),
                        None if self.roomy(x) => {
                            let mut sample = self.waiting.sample(&mut self.rng, SAMPLE);
                            sample.retain(|&w| self.roomy(w));
                            (self.best_taker(src, &sample), true)
                        }
                        None => (None, false),
                    }
                }
                Src::Store => {
                    let sample = self.waiting.sample(&mut self.rng, SAMPLE);
                    (self.best_taker(src, &sample), false)
                }
            };
            let Some((p, w)) = best else { return };
            if let (true, Src::Member(x)) = (link, src) {
                self.link(x, w);
            }
            self.start(w, p, src, now);
            if !self.wants(w) {
                self.waiting.remove(w);
            }
        }
    }

    /// Among `members`, the one waiting that `src` can give the rarest piece to (among equals,
    /// one that can pass it on at once), and the piece.
    fn best_taker(&mut self, src: Src, members: &[usize]) -> Option<(u32, usize)> {
        let mut best: Option<((u32, bool), u32, usize)> = None;
        for &w in members {
            if !self.wants(w) || (src == Src::Store && self.store_busy() >= self.store_slots(w)) {
                continue;
            }
            if let Some((p, c)) = self.best_piece(src, w) {
                let key = (c, !self.can_pass_on(w));
                if best.is_none_or(|(bk, _, _)| key < bk) {
                    best = Some((key, p, w));
                }
            }
        }
        best.map(|(_, p, w)| (p, w))
    }
}

/// A set of member places that can be sampled at random and changed in constant time.
#[derive(Debug, Default)]
struct Pool {
    list: Vec<usize>,
    /// Each member's place in `list`, if it is there.
    at: HashMap<usize, usize>,
}

impl Pool {
    fn add(&mut self, x: usize) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.at.entry(x) {
            e.insert(self.list.len());
            self.list.push(x);
        }
    }

    fn remove(&mut self, x: usize) {
        let Some(i) = self.at.remove(&x) else { return };
        self.list.swap_remove(i);
        if let Some(&moved) = self.list.get(i) {
            self.at.insert(moved, i);
        }
    }

    /// Up to `k` members, from a random place on (all of them when there are no more).
    fn sample(&self, rng: &mut Rng, k: usize) -> Vec<usize> {
        let n = self.list.len();
        if n == 0 {
            return Vec::new();
        }
        let start = rng.below(n);
        (0..n.min(k)).map(|j| self.list[(start + j) % n]).collect()
    }
}
