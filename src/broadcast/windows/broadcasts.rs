//! Every file window the server knows ([`Broadcasts`]): joins, each getter given its parent at
//! once, new parents for members whose parent failed, leaves, and idle windows forgotten.

use std::collections::HashMap;
use std::time::Instant;

use super::error::BroadcastError;
use super::generations::Generations;
use super::members::{MemberState, WindowState};
use super::nodes::{Joiner, NodeView, Seed};
use super::quorum::WINDOW_IDLE;
use crate::broadcast::swarm::SEED_SLOTS;
use crate::clock::Moment;
use crate::proto::{Role, Source, Window, WindowSpec};

/// What a join returns.
#[derive(Debug)]
pub struct Joined {
    pub window: Window,
    pub member: u64,
    pub parent: Option<Source>,
    /// When the quorum closes by timeout, if it is still open.
    pub deadline: Option<Instant>,
}

/// Every window the server knows.
pub struct Broadcasts {
    pub(super) windows: HashMap<String, WindowState>,
    generations: Generations,
    /// Benchmark-only (`KT_BENCH_TOPOLOGY=tree` in the server's environment): a window that
    /// names its fanout keeps the pipelined tree, so bench/broadcast.sh can run the herd and
    /// store-and-forward ways beside the swarm. Never a user's choice.
    tree_for_fanout: bool,
    /// Benchmark-only (`KT_BENCH_PIECES=blocks`): swarms trade whole blocks, never pieces
    /// smaller than blocks, so bench/broadcast.sh can measure what the smaller pieces give.
    pub(super) whole_blocks: bool,
    /// Pieces the store sends at once in each swarm.
    pub(super) seed_slots: usize,
}

impl Default for Broadcasts {
    fn default() -> Self {
        Broadcasts {
            windows: HashMap::new(),
            generations: Generations::default(),
            tree_for_fanout: false,
            whole_blocks: false,
            seed_slots: SEED_SLOTS,
        }
    }
}

impl Broadcasts {
    /// Whether a getter of a window of `spec` may join its version's swarm: one whose node
    /// serves what it receives (a getter without an agent fetches from its parent), and not in
    /// a window that names its fanout under the benchmarks' switch (a fanout is otherwise how
    /// many fetches each member serves at once).
    pub fn may_swarm(&self, spec: &WindowSpec, serves: bool) -> bool {
        serves && !(self.tree_for_fanout && spec.fanout > 0)
    }

    /// Windows where an explicit fanout keeps the tree (`true`: benchmarks and the tree's
    /// tests only).
    pub fn with_tree_for_fanout(tree_for_fanout: bool) -> Self {
        Broadcasts {
            tree_for_fanout,
            ..Default::default()
        }
    }

    /// Swarms whose store sends `slots` pieces at once ([`SEED_SLOTS`]; a store on an object
    /// store more, [`OBJECT_SEED_SLOTS`]).
    ///
    /// [`OBJECT_SEED_SLOTS`]: crate::broadcast::swarm::OBJECT_SEED_SLOTS
    pub fn with_seed_slots(self, slots: usize) -> Self {
        Broadcasts {
            seed_slots: slots.max(1),
            ..self
        }
    }

    /// Swarms that trade whole blocks only (`true`: benchmarks only).
    pub fn with_whole_blocks(self, whole_blocks: bool) -> Self {
        Broadcasts {
            whole_blocks,
            ..self
        }
    }

    fn sweep(&mut self, now: Moment) {
        self.windows
            .retain(|_, w| now.at.duration_since(w.touched) < WINDOW_IDLE);
    }

    /// Adds a participant; a getter is given its parent at once.
    pub fn join(
        &mut self,
        spec: WindowSpec,
        joiner: Joiner,
        seeds: &[Seed],
        live: &dyn Fn(&str) -> Option<NodeView>,
        now: Moment,
    ) -> Result<Joined, BroadcastError> {
        if spec.group_id.is_empty() {
            return Err(BroadcastError::Bad("group id missing".into()));
        }
        self.sweep(now);
        let fresh = match self.windows.get(&spec.group_id) {
            None => true,
            Some(w) => w.finished(),
        };
        if fresh {
            let generation = self.generations.next();
            let w = WindowState::new(spec.group_id.clone(), generation, spec.clone(), now);
            self.windows.insert(spec.group_id.clone(), w);
        }
        let Some(w) = self.windows.get_mut(&spec.group_id) else {
            return Err(BroadcastError::NoWindow(spec.group_id));
        };
        w.touched = now.at;
        if let Some(v) = joiner.version {
            w.seeds.insert(v, seeds.to_vec());
        }
        let getter = joiner.role == Role::Getter;
        w.members.push(MemberState {
            joiner,
            parent: None,
            depth: 0,
            children: 0,
            done: !getter,
            failed: false,
            left: false,
            failed_parents: Vec::new(),
        });
        let m = w.members.len() - 1;
        let parent = if getter {
            w.assign(m, live).map(|(_, s)| s)
        } else {
            None
        };
        w.update_quorum(now);
        Ok(Joined {
            window: w.to_proto(),
            member: m as u64,
            parent,
            deadline: w.deadline(),
        })
    }

    pub(super) fn member(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
    ) -> Result<(&mut WindowState, usize), BroadcastError> {
        let w = self
            .windows
            .get_mut(group)
            .filter(|w| w.generation == generation)
            .ok_or_else(|| BroadcastError::NoWindow(group.to_string()))?;
        let m = member as usize;
        if m >= w.members.len() {
            return Err(BroadcastError::NoMember(group.to_string(), member));
        }
        Ok((w, m))
    }

    /// A new parent for a member whose parent failed. `unreachable` marks that parent dead for
    /// the whole window; a parent that only stalled stays available to others.
    #[allow(clippy::too_many_arguments)]
    pub fn new_parent(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        failed: &str,
        unreachable: bool,
        live: &dyn Fn(&str) -> Option<NodeView>,
        now: Moment,
    ) -> Result<Option<Source>, BroadcastError> {
        let (w, m) = self.member(group, generation, member)?;
        w.touched = now.at;
        if unreachable && !failed.is_empty() {
            if !w.dead.iter().any(|d| d == failed) {
                w.dead.push(failed.to_string());
            }
            // The dead node's own downloads are over too: their parents get their slots back.
            for i in 0..w.members.len() {
                if w.members[i].joiner.node_id == failed && i != m {
                    w.members[i].failed = true;
                    w.release(i);
                }
            }
            w.swarm_node_dead(failed);
        }
        w.release(m);
        if !failed.is_empty() && !w.members[m].failed_parents.iter().any(|f| f == failed) {
            w.members[m].failed_parents.push(failed.to_string());
        }
        Ok(w.assign(m, live).map(|(_, s)| s))
    }

    /// A member is finished: with a verified copy (`done`) or not.
    pub fn leave(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        done: bool,
        now: Moment,
    ) -> Result<(), BroadcastError> {
        let (w, m) = self.member(group, generation, member)?;
        w.touched = now.at;
        w.release(m);
        w.swarm_leave(m, done);
        let x = &mut w.members[m];
        x.left = true;
        x.done = x.done || done;
        // A getter that served others and gave up is failed; a mount's reader closing a file
        // it read in part just leaves.
        if !done && x.joiner.serves && !x.joiner.reads {
            x.failed = true;
        }
        Ok(())
    }

    /// Windows whose transfer is not over, and their members.
    pub fn open(&self) -> (usize, usize) {
        self.windows
            .values()
            .filter(|w| !w.finished())
            .fold((0, 0), |(n, m), w| (n + 1, m + w.members.len()))
    }

    /// The window as it stands, with its quorum brought up to date.
    pub fn window(&mut self, group: &str, now: Moment) -> Option<(Window, Option<Instant>)> {
        let w = self.windows.get_mut(group)?;
        w.update_quorum(now);
        Some((w.to_proto(), w.deadline()))
    }
}
