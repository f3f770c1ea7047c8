//! Where blocks come from: sources nearest first, and who this node is among them.
//!
//! Nearest means this node's own agent, then peers in its zone, then other peers, then the
//! origin of a local publication or the store; the store and the origin come last among
//! equals, to spare them.

use std::path::Path;

use bytes::Bytes;

use crate::proto::{AgentStatusRequest, Source};
use crate::rpc::client::{self, Agent};
use crate::rpc::STORE;

/// Somewhere to fetch blocks from, and the ticket to present there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceAddr {
    /// A node id, or [`STORE`] for the store server.
    pub label: String,
    pub addr: String,
    /// Empty where the cluster asks for none.
    pub ticket: Bytes,
    /// The fetching process's own node. It is asked only for what it holds now
    /// (`OP_GET_NOW`), never made to wait for a block it expects: the block it expects may be
    /// one this fetch is receiving and feeding it (a getter whose node was registered as a
    /// holder by an earlier get, whose files are gone since, waited 10 s per block).
    pub own: bool,
}

impl SourceAddr {
    /// Whom a connection to this source is for, which names the certificate it must present.
    pub fn peer(&self) -> crate::auth::tls::Peer {
        if self.label == STORE {
            crate::auth::tls::Peer::Store
        } else {
            crate::auth::tls::Peer::Node
        }
    }
}

/// Sources nearest first: this node's agent, then peers in its zone, then other peers, then the
/// origin or the store.
pub fn order_sources(
    sources: &[Source],
    node_id: &str,
    zone: &str,
    server: &str,
    ticket: &Bytes,
) -> Vec<SourceAddr> {
    let rank = |s: &Source| -> u8 {
        let own = !node_id.is_empty() && node_id == s.node_id;
        let same_zone = !zone.is_empty() && zone == s.zone;
        match (own, s.origin, same_zone) {
            (true, _, _) => 0,
            (false, false, true) => 1,
            (false, false, false) => 2,
            (false, true, _) if !s.node_id.is_empty() => 3,
            _ => 4,
        }
    };
    let mut v: Vec<&Source> = sources.iter().collect();
    v.sort_by_key(|s| rank(s));
    v.into_iter()
        .map(|s| source_addr(s, server, ticket, node_id))
        .collect()
}

/// Where to reach a source: the store server (no node id) at `server`, a node at its address;
/// `own_node` is the fetching process's node (empty: none).
pub fn source_addr(s: &Source, server: &str, ticket: &Bytes, own_node: &str) -> SourceAddr {
    let (label, addr) = if s.node_id.is_empty() {
        (STORE.to_string(), server.to_string())
    } else {
        (s.node_id.clone(), s.data_addr.clone())
    };
    SourceAddr {
        own: !own_node.is_empty() && s.node_id == own_node,
        label,
        addr,
        ticket: ticket.clone(),
    }
}

/// The address other nodes see for this host: the agent's advertised address's host.
pub fn host_of(addr: &str) -> String {
    addr.parse::<std::net::SocketAddr>()
        .map(|a| a.ip().to_string())
        .unwrap_or_default()
}

/// This node as a member of a broadcast window: its node id and the ip peers reach it on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRef {
    pub node_id: String,
    pub ip: String,
}

/// This node's agent, when one answers.
pub struct LocalAgent {
    pub client: Agent,
    pub node_id: String,
    pub zone: String,
    pub data_addr: String,
}

impl LocalAgent {
    /// Who this node is in a broadcast window.
    pub fn node(&self) -> NodeRef {
        NodeRef {
            node_id: self.node_id.clone(),
            ip: host_of(&self.data_addr),
        }
    }
}

/// The agent at `socket`, if one answers there.
pub async fn local_agent(socket: &Path) -> Option<LocalAgent> {
    let mut client = client::connect_agent(socket).await.ok()?;
    let st = client
        .status(AgentStatusRequest {})
        .await
        .ok()?
        .into_inner();
    Some(LocalAgent {
        client,
        node_id: st.node_id,
        zone: st.zone,
        data_addr: st.data_addr,
    })
}
