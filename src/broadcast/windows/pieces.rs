//! The swarm of each version a window's getters fetch: a [`Board`] per version, keyed by the
//! window's member ids, with the nodes that already hold the whole version (earlier getters)
//! added as holders under ids of their own.

use std::collections::HashMap;

use super::members::WindowState;
use super::{BroadcastError, Broadcasts, NodeView, Seed};
use crate::clock::Moment;
use crate::hash::Version;
use crate::proto::{Source, SwarmPeer, SwarmSyncReply, SwarmSyncRequest};
use crate::broadcast::swarm::{Board, Plan, DEFAULT_UPLOADS, SEED_SLOTS};

/// Board ids of holders start here; below are the window's member ids.
const HOLDER_IDS: u64 = 1 << 32;
/// A version of fewer pieces fetches from a parent: there is nothing to spread over several
/// sources, and a swarm's syncs would cost more round trips than the fetch.
pub const MIN_SWARM_PIECES: u32 = 4;

/// A version's unique blocks in manifest order, as a swarm's join answer carries them, and
/// how the swarm cuts them into pieces ([`Plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    /// 32 bytes a block.
    pub hashes: Vec<u8>,
    pub lens: Vec<u32>,
    /// Pieces of `2^log2` bytes; 0: whole blocks.
    pub log2: u8,
}

impl Pieces {
    /// No swarm: no blocks.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The swarm's plan for these blocks (whole blocks where their lengths are not all known).
    fn plan(&self) -> Plan {
        let lens: Vec<u64> = self.lens.iter().map(|&l| u64::from(l)).collect();
        match lens.len() == self.hashes.len() / 32 {
            true => Plan::new(&lens),
            false => Plan::whole(self.hashes.len() / 32),
        }
    }
}

#[derive(Debug)]
pub(super) struct Swarm {
    pub(super) board: Board,
    /// The version's pieces as the join response carries them.
    pieces: Pieces,
    /// Holders by node id, and their ids on the board.
    holders: HashMap<String, u64>,
    holder_nodes: Vec<String>,
}

impl Swarm {
    /// A swarm of the blocks of `pieces`, cut as its plan says, whose members each serve
    /// `uploads` pieces at once.
    fn new(mut pieces: Pieces, plan: &Plan, seed: u64, uploads: u32) -> Self {
        pieces.log2 = plan.log2();
        Swarm {
            board: Board::with_slots(plan.pieces(), SEED_SLOTS, uploads, seed),
            pieces,
            holders: HashMap::new(),
            holder_nodes: Vec::new(),
        }
    }

    /// Adds the nodes (not the store, not the origin: those serve the store's grants) that
    /// hold the whole version now, but for those with a getter `receiving` it (see
    /// [`Swarm::drop_holder`]).
    fn add_holders(&mut self, seeds: &[Seed], receiving: &[String]) {
        for s in seeds {
            if s.origin
                || s.node_id.is_empty()
                || self.holders.contains_key(&s.node_id)
                || receiving.contains(&s.node_id)
            {
                continue;
            }
            let id = HOLDER_IDS + self.holder_nodes.len() as u64;
            self.holders.insert(s.node_id.clone(), id);
            self.holder_nodes.push(s.node_id.clone());
            self.board.join_holder(id, &s.zone);
        }
    }

    /// A holder's node has a getter receiving the version: what the node serves of it may be
    /// what that getter is receiving (a copy seeded earlier and removed since leaves its
    /// registration), and its agent holds a request for such a block until it arrives, so it is
    /// a holder no more (its getter becomes a source as it verifies pieces). It stays known, so
    /// that the seeds of a later join do not add it again.
    fn drop_holder(&mut self, node: &str) {
        if let Some(&id) = self.holders.get(node) {
            self.board.leave(id, false);
        }
    }
}

impl WindowState {
    /// Fills in where to reach each member a reply's fetches name.
    fn swarm_sources(
        &self,
        version: &Version,
        reply: &mut SwarmSyncReply,
        live: &dyn Fn(&str) -> Option<NodeView>,
    ) {
        for f in &reply.fetch {
            if f.store || reply.peers.iter().any(|p| p.member == f.from) {
                continue;
            }
            let node = self.swarm_node(version, f.from);
            let source = node.as_deref().and_then(|n| {
                live(n).map(|v| Source {
                    node_id: n.to_string(),
                    data_addr: v.data_addr,
                    zone: v.zone,
                    origin: false,
                })
            });
            reply.peers.push(SwarmPeer {
                member: f.from,
                source,
            });
        }
    }

    /// The node behind a board id.
    fn swarm_node(&self, version: &Version, id: u64) -> Option<String> {
        if id >= HOLDER_IDS {
            let s = self.swarms.get(version)?;
            return s.holder_nodes.get((id - HOLDER_IDS) as usize).cloned();
        }
        self.members
            .get(id as usize)
            .map(|m| m.joiner.node_id.clone())
    }
}

impl Broadcasts {
    /// The pieces of `version` if the window of `group` runs its swarm already (so the caller
    /// need not read the manifest again).
    pub fn swarm_pieces(&self, group: &str, version: &Version) -> Option<Pieces> {
        let w = self.windows.get(group)?;
        w.swarms.get(version).map(|s| s.pieces.clone())
    }

    /// Puts a getter that joined (`member` of the window's `generation`) into its version's
    /// swarm, starting the swarm with `pieces` if it has none. Returns the pieces to send it;
    /// empty if the version has no blocks or the getter fetches from a parent instead.
    pub fn swarm_join(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        pieces: Pieces,
        seeds: &[Seed],
    ) -> Result<Pieces, BroadcastError> {
        let (spec, serves, reads) = {
            let (w, m) = self.member(group, generation, member)?;
            let j = &w.members[m].joiner;
            (w.spec.clone(), j.serves, j.reads)
        };
        // A mount's reader keeps a block it fetched in pieces in memory until it is whole, so
        // it could not serve the pieces it reports: a swarm a reader starts trades whole
        // blocks (a reader reads a block at a time anyway), and a reader does not join one cut
        // finer (it fetches from the window's sources instead).
        let plan = match reads || self.whole_blocks {
            true => Plan::whole(pieces.hashes.len() / 32),
            false => pieces.plan(),
        };
        let wanted = self.may_swarm(&spec, serves) && plan.pieces() >= MIN_SWARM_PIECES;
        let (w, m) = self.member(group, generation, member)?;
        let joiner = w.members[m].joiner.clone();
        let uploads = match w.spec.fanout {
            0 => DEFAULT_UPLOADS,
            f => f,
        };
        let Some(version) = joiner.version.filter(|_| wanted) else {
            return Ok(Pieces::default());
        };
        let seed = generation ^ u64::from_le_bytes(version.0[..8].try_into().unwrap_or([0; 8]));
        let receiving = w.receiving_nodes(Some(&version), None);
        let s = w
            .swarms
            .entry(version)
            .or_insert_with(|| Swarm::new(pieces, &plan, seed, uploads));
        if s.pieces.hashes.is_empty() || (joiner.reads && s.pieces.log2 != 0) {
            return Ok(Pieces::default());
        }
        s.add_holders(seeds, &receiving);
        s.drop_holder(&joiner.node_id);
        match joiner.reads {
            true => s.board.join_reader(member, &joiner.zone),
            false => s.board.join(member, &joiner.zone, joiner.serves),
        }
        Ok(s.pieces.clone())
    }

    /// A member's sync: what the board answers, with where to reach each member it names (a
    /// source whose node is no longer alive is left without one: the member counts that fetch
    /// as broken), and the members that now have mail (their waiting syncs can end).
    pub fn swarm_sync(
        &mut self,
        req: &SwarmSyncRequest,
        live: &dyn Fn(&str) -> Option<NodeView>,
        now: Moment,
    ) -> Result<(SwarmSyncReply, Vec<u64>), BroadcastError> {
        let (w, m) = self.member(&req.group_id, req.generation, req.member)?;
        w.touched = now.at;
        let Some(version) = w.members[m].joiner.version else {
            return Err(BroadcastError::Bad("a putter has no swarm".into()));
        };
        let Some(s) = w.swarms.get_mut(&version) else {
            return Err(BroadcastError::Bad("this member is in no swarm".into()));
        };
        let early = s.board.freed_early();
        let mut reply = s.board.sync(req, now.at);
        crate::metrics::SWARM_FREED_EARLY.add(s.board.freed_early() - early);
        let woken = s.board.woken();
        w.swarm_sources(&version, &mut reply, live);
        Ok((reply, woken))
    }

    /// What the board chose for a member since its last sync, as [`Self::swarm_sync`] answers
    /// it; empty if it is no longer in a swarm.
    pub fn swarm_mail(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        live: &dyn Fn(&str) -> Option<NodeView>,
    ) -> SwarmSyncReply {
        let Ok((w, m)) = self.member(group, generation, member) else {
            return SwarmSyncReply::default();
        };
        let Some(version) = w.members[m].joiner.version else {
            return SwarmSyncReply::default();
        };
        let Some(s) = w.swarms.get_mut(&version) else {
            return SwarmSyncReply::default();
        };
        let mut reply = s.board.take_mail(member);
        w.swarm_sources(&version, &mut reply, live);
        reply
    }

    /// Takes every swarm member on `node` out of the window's swarms (it was found dead).
    pub(super) fn swarm_node_dead(w: &mut WindowState, node: &str) {
        let ids: Vec<u64> = w
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.joiner.node_id == node)
            .map(|(i, _)| i as u64)
            .collect();
        for s in w.swarms.values_mut() {
            for &id in &ids {
                s.board.leave(id, false);
            }
            if let Some(&id) = s.holders.get(node) {
                s.board.leave(id, false);
            }
        }
    }

    /// A member left: out of its swarm, unless it holds a copy its node serves.
    pub(super) fn swarm_leave(w: &mut WindowState, m: usize, done: bool) {
        let Some(version) = w.members[m].joiner.version else {
            return;
        };
        if let Some(s) = w.swarms.get_mut(&version) {
            s.board.leave(m as u64, done);
        }
    }
}
