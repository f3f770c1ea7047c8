//! The agent's lease with the store server: registered at start, renewed by heartbeat, and
//! registered again whenever the server does not know the node (a restarted server). Each
//! answer brings the node's data-plane ticket, and registration the key that checks the
//! tickets of whoever fetches from this node (`crate::transfer::ticket`).

use std::time::Duration;

use bytes::Bytes;

use crate::locks;
use crate::proto::{HeartbeatRequest, NodeInfo, RegisterNodeRequest, RegisterNodeResponse};
use crate::rpc::{client, Credential};
use crate::transfer::ticket::{Gate, SharedGate, TicketHolder, TicketKey};

/// Keeps this node's lease alive; registers again whenever the server does not know it (first
/// start, or the server restarted).
/// What a registration tells this node: the gate of its data plane and its own ticket.
pub(super) fn registered(r: &RegisterNodeResponse, gate: &SharedGate, ticket: &TicketHolder) {
    ticket.set(Bytes::from(r.ticket.clone()));
    *locks::write(gate) = match TicketKey::from_bytes(&r.ticket_key) {
        Some(key) => Gate::Tickets {
            key,
            versions: None,
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
}

pub(super) async fn heartbeat_loop(lease: Lease) {
    let Lease {
        server,
        credential,
        node,
        every,
        gate,
        ticket,
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
                            self::registered(r.get_ref(), &gate, &ticket);
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
