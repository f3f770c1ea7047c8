//! Node leases: which nodes are alive, as their heartbeats say.
//!
//! The replica that takes a node's heartbeats holds its lease in memory: after a restart of a
//! single store server no node is offered as a source until it heartbeats again, which is
//! exactly when it is known to be alive. Time comes from the injected clock, so tests expire a
//! lease by moving the clock, not by sleeping.
//!
//! Where several replicas serve one store (cluster mode), each lease is also one of etcd's
//! ([`SharedNodes`]), renewed with every heartbeat: a replica that takes no heartbeats (a
//! standby answering reads, an owner just elected) learns there which nodes live, so the
//! sources it names are the owner's.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::backend::BackendError;
use crate::clock::SharedClock;
use crate::hash::Version;
use crate::locks::lock;
use crate::proto::NodeInfo;

/// Node leases every replica of a store sees (etcd's, in cluster mode).
pub trait SharedNodes: Send + Sync {
    /// Makes `node` live for `lease`, in place of any lease it had.
    fn register(&self, node: &NodeInfo, lease: Duration) -> Result<(), BackendError>;
    /// Renews `node_id`'s lease: false where it has none (it ran out, or was never made).
    fn renew(&self, node_id: &str) -> Result<bool, BackendError>;
    /// `node_id`, while its lease lives.
    fn live(&self, node_id: &str) -> Result<Option<NodeInfo>, BackendError>;
}

/// How long a replica trusts what the shared leases said of a node it holds no lease of: a
/// resolve that names many sources asks etcd once a second for each, not once a call.
const SEEN_FOR: Duration = Duration::from_secs(1);
/// The most nodes remembered so, beyond which the stale ones are forgotten.
const SEEN_MAX: usize = 4096;

pub struct NodeLeases {
    nodes: Mutex<HashMap<String, (NodeInfo, Instant)>>,
    /// The versions each node has open, as its last heartbeat said.
    open: Mutex<HashMap<String, HashSet<Version>>>,
    lease: Duration,
    clock: SharedClock,
    shared: Option<Arc<dyn SharedNodes>>,
    /// What `shared` said of nodes whose lease this replica does not hold, and when.
    seen: Mutex<HashMap<String, (Option<NodeInfo>, Instant)>>,
}

impl NodeLeases {
    pub fn new(lease: Duration, clock: SharedClock) -> Self {
        NodeLeases {
            nodes: Mutex::default(),
            open: Mutex::default(),
            lease,
            clock,
            shared: None,
            seen: Mutex::default(),
        }
    }

    /// Keeps every lease in `shared` too, and asks it about nodes this replica holds none of.
    pub fn share(&mut self, shared: Arc<dyn SharedNodes>) {
        self.shared = Some(shared);
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    pub fn register(&self, node: NodeInfo) {
        let until = self.clock.now().at + self.lease;
        if let Some(shared) = &self.shared {
            // The node is live here whatever etcd said; its next heartbeat tries again.
            if let Err(e) = shared.register(&node, self.lease) {
                tracing::warn!(node = %node.node_id, error = %e, "the node's shared lease");
            }
            lock(&self.seen).remove(&node.node_id);
        }
        lock(&self.nodes).insert(node.node_id.clone(), (node, until));
    }

    /// Renews a node's lease; `false` when the node must register again (e.g. after a restart).
    pub fn heartbeat(&self, node_id: &str) -> bool {
        let until = self.clock.now().at + self.lease;
        let mine = lock(&self.nodes).get_mut(node_id).map(|(info, u)| {
            *u = until;
            info.clone()
        });
        let Some(shared) = &self.shared else {
            return mine.is_some();
        };
        match mine {
            Some(info) => {
                match shared.renew(node_id) {
                    Ok(true) => {}
                    // Its shared lease ran out while this replica's held (etcd unreachable
                    // for a while): made again, so the other replicas see the node.
                    Ok(false) => {
                        if let Err(e) = shared.register(&info, self.lease) {
                            tracing::warn!(node = %node_id, error = %e, "the node's shared lease");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(node = %node_id, error = %e, "the node's shared lease")
                    }
                }
                true
            }
            // A node another replica took the heartbeats of (the owner before this one):
            // its lease is taken over as it is, with no new registration.
            None => match shared.live(node_id).and_then(|n| match n {
                Some(n) => Ok(shared.renew(node_id)?.then_some(n)),
                None => Ok(None),
            }) {
                Ok(Some(info)) => {
                    lock(&self.nodes).insert(node_id.to_string(), (info, until));
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(node = %node_id, error = %e, "the node's shared lease");
                    false
                }
            },
        }
    }

    /// How many nodes hold a lease with this replica now (the owner's count, in cluster mode).
    pub fn live_count(&self) -> usize {
        let now = self.clock.now().at;
        lock(&self.nodes).values().filter(|(_, u)| *u > now).count()
    }

    /// The node, if its lease has not run out: this replica's where it holds one (one that ran
    /// out here ran out: the heartbeats come here), else the shared one.
    pub fn live(&self, node_id: &str) -> Option<NodeInfo> {
        let now = self.clock.now().at;
        if let Some((info, until)) = lock(&self.nodes).get(node_id) {
            return (*until > now).then(|| info.clone());
        }
        let shared = self.shared.as_ref()?;
        let asked = now;
        if let Some((seen, at)) = lock(&self.seen).get(node_id) {
            if asked.duration_since(*at) < SEEN_FOR {
                return seen.clone();
            }
        }
        let found = shared.live(node_id).unwrap_or_else(|e| {
            tracing::warn!(node = %node_id, error = %e, "the node's shared lease");
            None
        });
        let mut seen = lock(&self.seen);
        if seen.len() >= SEEN_MAX {
            seen.retain(|_, (_, at)| asked.duration_since(*at) < SEEN_FOR);
        }
        seen.insert(node_id.to_string(), (found.clone(), asked));
        found
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::clock::ManualClock;

    /// etcd's leases as a map, counting the reads.
    #[derive(Default)]
    struct Leases {
        nodes: Mutex<HashMap<String, NodeInfo>>,
        reads: AtomicUsize,
    }

    impl SharedNodes for Leases {
        fn register(&self, node: &NodeInfo, _: Duration) -> Result<(), BackendError> {
            lock(&self.nodes).insert(node.node_id.clone(), node.clone());
            Ok(())
        }
        fn renew(&self, node_id: &str) -> Result<bool, BackendError> {
            Ok(lock(&self.nodes).contains_key(node_id))
        }
        fn live(&self, node_id: &str) -> Result<Option<NodeInfo>, BackendError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(lock(&self.nodes).get(node_id).cloned())
        }
    }

    fn node(id: &str) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            data_addr: "10.0.0.1:7448".into(),
            ..Default::default()
        }
    }

    /// Two replicas sharing the leases: what the one that takes the heartbeats registered, the
    /// other sees (asking at most once a second); it takes over a node's heartbeats without a
    /// new registration, and a node unknown to both must register; a lease that ran out where
    /// the heartbeats come is out, whatever the shared one says.
    #[test]
    fn a_replica_sees_the_nodes_another_registered_and_takes_their_heartbeats_over() {
        let shared = Arc::new(Leases::default());
        let clock = ManualClock::default();
        let lease = Duration::from_secs(15);
        let mut owner = NodeLeases::new(lease, clock.shared());
        owner.share(shared.clone());
        let mut standby = NodeLeases::new(lease, clock.shared());
        standby.share(shared.clone());

        owner.register(node("n1"));
        assert_eq!(
            standby.live("n1").map(|n| n.data_addr),
            Some("10.0.0.1:7448".into())
        );
        assert!(standby.live("n1").is_some());
        assert_eq!(
            shared.reads.load(Ordering::SeqCst),
            1,
            "asked again within a second"
        );
        assert!(standby.live("n2").is_none());
        clock.advance(SEEN_FOR);
        assert!(standby.live("n1").is_some());
        assert_eq!(shared.reads.load(Ordering::SeqCst), 3);

        assert!(standby.heartbeat("n1"), "a live node had to register again");
        assert!(!standby.heartbeat("n2"));
        assert_eq!(standby.live_count(), 1);

        clock.advance(lease);
        let reads = shared.reads.load(Ordering::SeqCst);
        assert!(
            owner.live("n1").is_none(),
            "a lease that ran out here lives"
        );
        assert_eq!(shared.reads.load(Ordering::SeqCst), reads);
    }
}
