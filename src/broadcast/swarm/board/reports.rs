//! What a member's sync tells the board: pieces verified, fetches failed or about to end; and
//! what ends with them (uploads freed, store grants given again, silent members taken out).

use std::time::{Duration, Instant};

use super::bounds::{BUSY_BACKOFF, GRANT_TTL, SILENCE};
use super::roster::{Board, Src};
use crate::broadcast::swarm::why::{WHY_BROKEN, WHY_BUSY, WHY_DECLINED, WHY_MISSING};
use crate::proto::{SwarmSyncReply, SwarmSyncRequest};

impl Board {
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
    pub(super) fn record(&mut self, m: usize, verified: &[u32]) -> Vec<Src> {
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
    pub(super) fn fail(&mut self, m: usize, p: u32, src: Src, why: u32, now: Instant) -> bool {
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
    pub(super) fn end_fetch(&mut self, m: usize, p: u32, src: Src, was_freed: bool) {
        let i = p as usize;
        self.copies[i] = self.copies[i].saturating_sub(1);
        if src == Src::Store && self.store_grant[i].is_some_and(|(x, _, _)| x == m) {
            self.store_grant[i] = None;
        }
        self.finish(src, was_freed);
    }

    /// A fetch from `src` ended: its upload is free, unless it was freed early.
    pub(super) fn finish(&mut self, src: Src, was_freed: bool) {
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
    pub(super) fn ending(&mut self, m: usize, p: u32) -> Option<Src> {
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

    pub(super) fn release(&mut self, src: Src) {
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
    pub(super) fn expire(&mut self, now: Instant) {
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
}
