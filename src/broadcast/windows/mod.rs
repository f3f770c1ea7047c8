//! Broadcast windows and fan-out trees, kept in memory by the store server.
//!
//! A window gathers the participants of one distribution under a `group_id`. Its quorum closes
//! when ANY of its criteria is met: `world_size` participants joined, every address of `ips`
//! joined, or `timeout` passed since it opened. Putters may wait for the quorum; getters of files
//! do not: each is given a parent the moment it joins (rolling), among the nodes that already
//! hold the version (seeds: the store, the origin, earlier getters) and the participants that are
//! receiving it, at most `fanout` children each. Nearer is better (same node, then same zone),
//! then shallower, then less loaded. A child whose parent fails asks again and gets a parent
//! outside its own subtree, so that no one ever waits on its own descendants.
//!
//! Getters without window settings join an implicit window per version with no quorum: that is
//! how concurrent getters spread over the sources instead of all hitting the store.
//!
//! Everything here is plain state driven with an explicit `now` (a [`Moment`] of the server's
//! clock), so tests run it without a clock. [`window`] holds a window's members and its quorum,
//! [`tree`] the choice of parents, [`swarm`] each version's swarm (the board of the swarm
//! module below it), [`gpu`] the windows of GPU keys (one coordinated transfer).
//!
//! Getters of files fetch through the swarm when the server gives them the version's pieces at
//! their join; the parent it gives too is what a getter that does not speak the swarm uses.

pub mod comms;
pub mod gpu;
mod members;
mod parents;
mod pieces;
pub use pieces::Pieces as SwarmPieces;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::clock::Moment;
use crate::hash::Version;
use crate::proto::{Role, Source, Window, WindowSpec};
pub use crate::rpc::{DEFAULT_FANOUT, STORE};
use members::{MemberState, WindowState};

/// A window no one has touched for this long is forgotten.
pub const WINDOW_IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BroadcastError {
    #[error("no broadcast window {0}")]
    NoWindow(String),
    #[error("window {0} has no member {1}")]
    NoMember(String, u64),
    #[error("bad window request: {0}")]
    Bad(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Exists(String),
}

/// A node that holds a whole version already: the store server (empty `node_id`), the origin of
/// a local publication, or a node that fetched it before.
#[derive(Clone, Debug)]
pub struct Seed {
    pub node_id: String,
    pub data_addr: String,
    pub zone: String,
    /// The store or the origin: asked only when no other holder is as near, to spare it.
    pub origin: bool,
}

impl Seed {
    pub(crate) fn label(&self) -> &str {
        if self.node_id.is_empty() {
            STORE
        } else {
            &self.node_id
        }
    }
}

/// A live node as the server's lease table knows it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub data_addr: String,
    pub zone: String,
}

/// Who is joining.
#[derive(Clone, Debug, Default)]
pub struct Joiner {
    pub node_id: String,
    pub zone: String,
    pub ip: String,
    pub role: Role,
    pub version: Option<Version>,
    pub serves: bool,
    /// A mount's reader: it fetches what it reads, as it reads it.
    pub reads: bool,
}

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
#[derive(Default)]
pub struct Broadcasts {
    windows: HashMap<String, WindowState>,
    generations: u64,
    /// Benchmark-only (`KT_BENCH_TOPOLOGY=tree` in the server's environment): a window that
    /// names its fanout keeps the pipelined tree, so bench/broadcast.sh can run the herd and
    /// store-and-forward ways beside the swarm. Never a user's choice.
    tree_for_fanout: bool,
    /// Benchmark-only (`KT_BENCH_PIECES=blocks`): swarms trade whole blocks, never pieces
    /// smaller than blocks, so bench/broadcast.sh can measure what the smaller pieces give.
    whole_blocks: bool,
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
            self.generations += 1;
            let w = WindowState::new(spec.group_id.clone(), self.generations, spec.clone(), now);
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

    fn member(
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
            Self::swarm_node_dead(w, failed);
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
        Self::swarm_leave(w, m, done);
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

#[cfg(test)]
mod tests;
