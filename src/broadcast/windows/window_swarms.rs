//! The swarms of a window's versions as the server's requests drive them: a getter's join into
//! its version's swarm, its syncs, and the fetches chosen for it between syncs (its mail), each
//! answered with where to reach the members it names.

use super::broadcasts::Broadcasts;
use super::error::BroadcastError;
use super::members::WindowState;
use super::nodes::{NodeView, Seed};
use super::version_swarm::{Pieces, Swarm, MIN_SWARM_PIECES};
use crate::broadcast::swarm::{Plan, DEFAULT_UPLOADS};
use crate::clock::Moment;
use crate::hash::Version;
use crate::proto::{Source, SwarmPeer, SwarmSyncReply, SwarmSyncRequest};

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
        if Swarm::is_holder(id) {
            let s = self.swarms.get(version)?;
            return s.holder_node(id).map(str::to_string);
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
        let seed_slots = self.seed_slots;
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
            .or_insert_with(|| Swarm::new(pieces, &plan, seed, (seed_slots, uploads)));
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
}
