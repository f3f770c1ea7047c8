//! Node leases: which nodes are alive, as their heartbeats say.
//!
//! Leases live in memory: after a restart of the store server no node is offered as a source
//! until it heartbeats again, which is exactly when it is known to be alive. Time comes from
//! the injected clock, so tests expire a lease by moving the clock, not by sleeping.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::SharedClock;
use crate::hash::Version;
use crate::locks::lock;
use crate::proto::NodeInfo;

pub struct NodeLeases {
    nodes: Mutex<HashMap<String, (NodeInfo, Instant)>>,
    /// The versions each node has open, as its last heartbeat said.
    open: Mutex<HashMap<String, HashSet<Version>>>,
    lease: Duration,
    clock: SharedClock,
}

impl NodeLeases {
    pub fn new(lease: Duration, clock: SharedClock) -> Self {
        NodeLeases {
            nodes: Mutex::default(),
            open: Mutex::default(),
            lease,
            clock,
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    pub fn register(&self, node: NodeInfo) {
        let until = self.clock.now().at + self.lease;
        lock(&self.nodes).insert(node.node_id.clone(), (node, until));
    }

    /// Renews a node's lease; `false` when the node must register again (e.g. after a restart).
    pub fn heartbeat(&self, node_id: &str) -> bool {
        let until = self.clock.now().at + self.lease;
        match lock(&self.nodes).get_mut(node_id) {
            Some((_, u)) => {
                *u = until;
                true
            }
            None => false,
        }
    }

    /// How many nodes hold a lease now.
    pub fn live_count(&self) -> usize {
        let now = self.clock.now().at;
        lock(&self.nodes).values().filter(|(_, u)| *u > now).count()
    }

    /// The node, if its lease has not run out.
    pub fn live(&self, node_id: &str) -> Option<NodeInfo> {
        let now = self.clock.now().at;
        let nodes = lock(&self.nodes);
        let (info, until) = nodes.get(node_id)?;
        (*until > now).then(|| info.clone())
    }

    /// Records the versions `node_id` has open now (its heartbeat says all of them each time).
    pub fn set_open(&self, node_id: &str, versions: HashSet<Version>) {
        let mut open = lock(&self.open);
        if versions.is_empty() {
            open.remove(node_id);
        } else {
            open.insert(node_id.to_string(), versions);
        }
    }

    /// The versions open on nodes whose lease holds: a node that died keeps nothing.
    pub fn open_versions(&self) -> HashSet<Version> {
        let now = self.clock.now().at;
        let nodes = lock(&self.nodes);
        lock(&self.open)
            .iter()
            .filter(|(n, _)| nodes.get(*n).is_some_and(|(_, until)| *until > now))
            .flat_map(|(_, vs)| vs.iter().copied())
            .collect()
    }
}
