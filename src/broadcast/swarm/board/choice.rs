//! The board's choice of each fetch: at a member's sync, the rarest piece among its links with
//! an upload free (a sample of all sources when none can help, then the store); when a source
//! comes free, the rarest piece it holds to one of its links that waits.

use std::time::Instant;

use super::bounds::SAMPLE;
use super::roster::{Board, Src};
use crate::broadcast::swarm::limits::{READER_SEED_SLOTS, READER_UPLOADS};
use crate::proto::SwarmFetch;

impl Board {
    /// sync).
    pub(super) fn store_busy(&self) -> usize {
        self.store_grant
            .iter()
            .filter(|g| g.is_some_and(|(_, _, ending)| !ending))
            .count()
    }

    /// Store fetches that may run while `m` is given one.
    pub(super) fn store_slots(&self, m: usize) -> usize {
        match self.slots.get(m).is_some_and(|s| s.reads) {
            true => self.seed_slots.max(READER_SEED_SLOTS),
            false => self.seed_slots,
        }
    }

    /// Whether `x` can send one more upload now.
    pub(super) fn can_send(&self, x: usize, now: Instant) -> bool {
        self.slots.get(x).is_some_and(|s| {
            s.live
                && s.serves
                && s.up < self.uploads
                && s.have.count() > 0
                && s.busy_until.is_none_or(|t| now >= t)
        })
    }

    /// Whether `x` can send one more upload to `m` now: within its uploads, or, for a reader,
    /// [`READER_UPLOADS`] at once from a source that sends to that reader alone and
    /// that no other link of it waits for (a reader waits for each block it reads: one at a
    /// time, with a round trip between them, halved a lone reader's rate where no one else
    /// wanted the uplink).
    pub(super) fn can_send_to(&self, x: usize, m: usize, now: Instant) -> bool {
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
    pub(super) fn can_pass_on(&self, m: usize) -> bool {
        self.slots
            .get(m)
            .is_some_and(|s| s.serves && s.up < self.uploads)
    }

    pub(super) fn wants(&self, m: usize) -> bool {
        self.slots
            .get(m)
            .is_some_and(|s| s.live && s.synced && s.idle > 0 && s.need.count() > 0)
    }

    /// The rarest piece `src` can give `m`, with its rarity; ties broken at random.
    pub(super) fn best_piece(&mut self, src: Src, m: usize) -> Option<(u32, u32)> {
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
    pub(super) fn avoided_holders(&self, m: usize, p: u32) -> u32 {
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

    pub(super) fn start(&mut self, m: usize, p: u32, src: Src, now: Instant) {
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
    pub(super) fn fill(&mut self, m: usize, now: Instant) {
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
    pub(super) fn best_source(
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
    pub(super) fn serve(&mut self, src: Src, now: Instant) {
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
    pub(super) fn best_taker(&mut self, src: Src, members: &[usize]) -> Option<(u32, usize)> {
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
