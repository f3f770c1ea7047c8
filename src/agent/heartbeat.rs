//! The agent's lease with the store server: registered at start, renewed by heartbeat, and
//! registered again whenever the server does not know the node (a restarted server). Each
//! answer brings the node's data-plane ticket, and registration the key that checks the
//! tickets of whoever fetches from this node (`crate::transfer::ticket`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::locks;
use crate::proto::{HeartbeatRequest, NodeInfo, RegisterNodeRequest, RegisterNodeResponse};
use crate::rpc::{client, Credential};
use crate::transfer::ticket::{Gate, SharedGate, TicketHolder, TicketKey, VersionBlocks};

/// Keeps this node's lease alive; registers again whenever the server does not know it (first
/// start, or the server restarted).
/// What a registration tells this node: the gate of its data plane and its own ticket.
/// A read ticket's holder is served only its version's blocks, as `versions` learns them.
pub(super) fn registered(
    r: &RegisterNodeResponse,
    gate: &SharedGate,
    ticket: &TicketHolder,
    versions: &Arc<dyn VersionBlocks>,
) {
    ticket.set(Bytes::from(r.ticket.clone()));
    *locks::write(gate) = match TicketKey::from_bytes(&r.ticket_key) {
        Some(key) => Gate::Tickets {
            key,
            versions: Some(versions.clone()),
        },
        None => Gate::Open,
    };
}

/// Where the lease loop reports what the store server said.
pub(super) struct Lease {
    pub server: String,
    pub credential: Credential,
    pub node: NodeInfo,
    pub every: Duration,
    pub gate: SharedGate,
    pub ticket: TicketHolder,
    pub versions: Arc<dyn VersionBlocks>,
}

pub(super) async fn heartbeat_loop(lease: Lease) {
    let Lease {
        server,
        credential,
        node,
        every,
        gate,
        ticket,
        versions,
    } = lease;
    let mut registered = false;
    loop {
        match client::connect_store(&server, &credential).await {
            Ok(mut store) => loop {
                let ok = if registered {
                    match store
                        .heartbeat(HeartbeatRequest {
                            node_id: node.node_id.clone(),
                        })
                        .await
                    {
                        Ok(r) => {
                            let r = r.into_inner();
                            registered = r.known;
                            if !r.ticket.is_empty() {
                                ticket.set(Bytes::from(r.ticket));
                            }
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "heartbeat failed");
                            false
                        }
                    }
                } else {
                    match store
                        .register_node(RegisterNodeRequest {
                            node: Some(node.clone()),
                        })
                        .await
                    {
                        Ok(r) => {
                            self::registered(r.get_ref(), &gate, &ticket, &versions);
                            registered = true;
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "registering with the store server failed");
                            false
                        }
                    }
                };
                if !registered && ok {
                    continue;
                }
                tokio::time::sleep(every).await;
                if !ok {
                    break;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "store server unreachable; retrying");
                registered = false;
                tokio::time::sleep(every).await;
            }
        }
    }
}
