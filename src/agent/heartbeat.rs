//! The agent's lease with the store server: registered at start, renewed by heartbeat, and
//! registered again whenever the server does not know the node (a restarted server). Each
//! answer brings the node's data-plane ticket, and registration the key that checks the
//! tickets of whoever fetches from this node (`crate::auth::ticket`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::auth::gpu_secret::HostKey;
use crate::auth::ticket::{Gate, SharedGate, TicketHolder, TicketVerifier, VersionBlocks};
use crate::auth::Credential;
use crate::blocks::node::NodeBlocks;
use crate::hash::{BlockHash, Version};
use crate::locks;
use crate::proto::{
    HeartbeatRequest, HeartbeatResponse, NodeInfo, RegisterNodeRequest, RegisterNodeResponse,
};
use crate::rpc::client;

/// Keeps this node's lease alive; registers again whenever the server does not know it (first
/// start, or the server restarted).
/// What a registration tells this node: the gate of its data plane and its own ticket.
/// A read ticket's holder is served only its version's blocks, as `versions` learns them.
pub(super) fn registered(
    r: &RegisterNodeResponse,
    gate: &SharedGate,
    ticket: &TicketHolder,
    host_key: &HostKey,
    versions: &Arc<dyn VersionBlocks>,
) {
    ticket.set(Bytes::from(r.ticket.clone()));
    let key = TicketVerifier::from_bytes(&r.ticket_key);
    // The GPU side derives its registrations' secrets from a key of its own (see
    // `auth::gpu_secret`).
    host_key.set(<[u8; 32]>::try_from(r.gpu_key.as_slice()).ok());
    *locks::write(gate) = match key {
        Some(key) => Gate::Tickets {
            key,
            versions: Some(versions.clone()),
        },
        None => Gate::Open,
    };
}

/// Drops from the cache the blocks the store says it collected; the cursor to present next.
async fn drop_collected(
    blocks: &Arc<NodeBlocks>,
    r: &HeartbeatResponse,
    cursor: (u64, u64),
) -> (u64, u64) {
    if r.collected_epoch == 0 {
        return cursor;
    }
    let hashes: Vec<BlockHash> = r
        .collected
        .iter()
        .filter_map(|h| BlockHash::from_slice(h))
        .collect();
    if hashes.is_empty() {
        return (r.collected_upto, r.collected_epoch);
    }
    let blocks = blocks.clone();
    match tokio::task::spawn_blocking(move || blocks.drop_collected(&hashes)).await {
        Ok(Ok(bytes)) => {
            if bytes > 0 {
                tracing::info!(bytes, "dropped blocks the store collected from the cache");
            }
            (r.collected_upto, r.collected_epoch)
        }
        // Asked again with the next heartbeat.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "dropping collected blocks from the cache");
            cursor
        }
        Err(e) => {
            tracing::warn!(error = %e, "dropping collected blocks from the cache");
            cursor
        }
    }
}

/// Where the lease loop reports what the store server said.
pub(super) struct Lease {
    pub server: String,
    pub credential: Credential,
    pub node: NodeInfo,
    pub every: Duration,
    pub gate: SharedGate,
    pub ticket: TicketHolder,
    pub host_key: HostKey,
    pub versions: Arc<dyn VersionBlocks>,
    /// Whose open versions the heartbeat reports, and whose cache drops what the store
    /// collected.
    pub blocks: Arc<NodeBlocks>,
}

/// Seeded files checked per heartbeat (a stat each): a node seeding a million files goes over
/// them in about 20 minutes at the default heartbeat, at a few milliseconds each time.
const SWEEP_FILES: usize = 4096;

/// The seeded versions whose files are gone or changed since, among the next part of them
/// from `cursor` (see [`NodeBlocks::sweep_seeds`]), off the async threads.
async fn swept(blocks: &Arc<NodeBlocks>, cursor: &mut Vec<u8>) -> Vec<Version> {
    let (b, from) = (blocks.clone(), std::mem::take(cursor));
    match tokio::task::spawn_blocking(move || b.sweep_seeds(&from, SWEEP_FILES)).await {
        Ok(Ok((v, next))) => {
            *cursor = next;
            v
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "checking the seeded copies");
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// The server was told these seeded versions are gone: forgotten here.
async fn forget_seeds(blocks: &Arc<NodeBlocks>, gone: Vec<Version>) {
    if gone.is_empty() {
        return;
    }
    for version in &gone {
        tracing::info!(%version, "a seeded copy is gone: no longer a source of it");
    }
    let b = blocks.clone();
    match tokio::task::spawn_blocking(move || b.forget_seeds(&gone)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "forgetting seeded copies that are gone"),
        Err(_) => {}
    }
}

pub(super) async fn heartbeat_loop(lease: Lease) {
    let Lease {
        server,
        credential,
        node,
        every,
        gate,
        ticket,
        host_key,
        versions,
        blocks,
    } = lease;
    let mut registered = false;
    // What this node has been told of the store's collected blocks: (upto, epoch).
    let mut collected = (0u64, 0u64);
    // Where the next sweep of the seeded copies begins.
    let mut cursor = Vec::new();
    loop {
        match client::connect_store(&server, &credential).await {
            Ok(store) => loop {
                // Seeded versions whose files are gone, forgotten once the server was told.
                let gone = match registered {
                    true => swept(&blocks, &mut cursor).await,
                    false => Vec::new(),
                };
                let ok = if registered {
                    match store
                        .heartbeat(HeartbeatRequest {
                            gone_versions: gone.iter().map(|v| v.0.to_vec()).collect(),
                            node_id: node.node_id.clone(),
                            open_versions: blocks
                                .pins()
                                .versions()
                                .iter()
                                .map(|v| v.0.to_vec())
                                .collect(),
                            collected_after: collected.0,
                            collected_epoch: collected.1,
                        })
                        .await
                    {
                        Ok(r) => {
                            registered = r.known;
                            if !r.ticket.is_empty() {
                                ticket.set(Bytes::from(r.ticket.clone()));
                            }
                            collected = drop_collected(&blocks, &r, collected).await;
                            forget_seeds(&blocks, gone).await;
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.to_string(), "heartbeat failed");
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
                            self::registered(&r, &gate, &ticket, &host_key, &versions);
                            registered = true;
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.to_string(), "registering with the store server failed");
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
