//! The swarm of one version a window's getters fetch: a [`Board`], keyed by the window's member
//! ids, with the nodes that already hold the whole version (earlier getters) added as holders
//! under ids of their own; and the version's pieces as a join's answer carries them.

use std::collections::HashMap;

use super::nodes::Seed;
use crate::broadcast::swarm::{Board, Plan};

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
    pub(super) fn plan(&self) -> Plan {
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
    pub(super) pieces: Pieces,
    /// Holders by node id, and their ids on the board.
    holders: HashMap<String, u64>,
    holder_nodes: Vec<String>,
}

impl Swarm {
    /// A swarm of the blocks of `pieces`, cut as its plan says, whose store sends `seed_slots`
    /// pieces at once and whose members each serve `uploads`.
    pub(super) fn new(
        mut pieces: Pieces,
        plan: &Plan,
        seed: u64,
        (seed_slots, uploads): (usize, u32),
    ) -> Self {
        pieces.log2 = plan.log2();
        Swarm {
            board: Board::with_slots(plan.pieces(), seed_slots, uploads, seed),
            pieces,
            holders: HashMap::new(),
            holder_nodes: Vec::new(),
        }
    }

    /// Adds the nodes (not the store, not the origin: those serve the store's grants) that
    /// hold the whole version now, but for those with a getter `receiving` it (see
    /// [`Swarm::drop_holder`]).
    pub(super) fn add_holders(&mut self, seeds: &[Seed], receiving: &[String]) {
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
    pub(super) fn drop_holder(&mut self, node: &str) {
        if let Some(&id) = self.holders.get(node) {
            self.board.leave(id, false);
        }
    }

    /// The node of holder `id`; `None` for a member's id (the window knows its node), or an
    /// id this swarm never gave.
    pub(super) fn holder_node(&self, id: u64) -> Option<&str> {
        let i = id.checked_sub(HOLDER_IDS)?;
        self.holder_nodes.get(i as usize).map(String::as_str)
    }

    /// Whether `id` names a holder rather than a member of the window.
    pub(super) fn is_holder(id: u64) -> bool {
        id >= HOLDER_IDS
    }

    /// Node `node` was found dead: its members (`members`, their window ids) and its holder
    /// leave the board.
    pub(super) fn node_dead(&mut self, members: &[u64], node: &str) {
        for &id in members {
            self.board.leave(id, false);
        }
        if let Some(&id) = self.holders.get(node) {
            self.board.leave(id, false);
        }
    }
}
