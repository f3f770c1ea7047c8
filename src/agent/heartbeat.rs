//! The agent's lease with the store server: registered at start, renewed by heartbeat, and
//! registered again whenever the server does not know the node (a restarted server). Each
//! answer brings the node's data-plane ticket, and registration the key that checks the
//! tickets of whoever fetches from this node (`crate::auth::ticket`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::auth::ticket::{
    Gate, SharedGate, TicketHolder, TicketVerifier, TicketVerifiers, VersionBlocks,
};
use crate::auth::Credential;
use crate::blocks::node::NodeBlocks;
use crate::hash::{BlockHash, Version};
use crate::locks;
use crate::proto::{
    HeartbeatRequest, HeartbeatResponse, NodeInfo, RegisterNodeRequest, RegisterNodeResponse,
    TicketPublicKey,
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
    versions: &Arc<dyn VersionBlocks>,
) {
    ticket.set(Bytes::from(r.ticket.clone()));
    let mut g = locks::write(gate);
    let Some(keys) = verifiers_of(&r.ticket_keys) else {
        *g = Gate::Open;
        return;
    };
    // The verifiers a gate has already are replaced in place, as each heartbeat does.
    let key = match &*g {
        Gate::Tickets { key, .. } => {
            key.set(keys);
            key.clone()
        }
        _ => TicketVerifiers::new(keys),
    };
    *g = Gate::Tickets {
        key,
        versions: Some(versions.clone()),
    };
}

/// The epochs in force as the store server sent them; `None` where it sent none (a server
/// without authentication).
fn verifiers_of(keys: &[TicketPublicKey]) -> Option<Vec<TicketVerifier>> {
    let keys: Vec<TicketVerifier> = keys
        .iter()
        .filter_map(|k| TicketVerifier::from_bytes(k.epoch, &k.key))
        .collect();
    (!keys.is_empty()).then_some(keys)
}

/// A heartbeat's epochs in force: a rotation, taken at once by every check of tickets.
fn rotated(r: &HeartbeatResponse, gate: &SharedGate) {
    let Some(keys) = verifiers_of(&r.ticket_keys) else {
        return;
    };
    if let Gate::Tickets { key, .. } = &*locks::read(gate) {
        if key.get() != keys {
            tracing::info!(epochs = ?keys.iter().map(TicketVerifier::epoch).collect::<Vec<_>>(), "ticket keys rotated");
            key.set(keys);
        }
    }
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
                            rotated(&r, &gate);
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
                            self::registered(&r, &gate, &ticket, &versions);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ticket::{Grant, TicketError, TicketKey, NODE_TTL};

    struct All;
    impl VersionBlocks for All {
        fn holds(&self, _v: &Version, _h: &BlockHash) -> bool {
            true
        }
    }

    fn public(k: &TicketKey) -> TicketPublicKey {
        TicketPublicKey {
            epoch: k.epoch(),
            key: k.verifier().as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_heartbeats_epochs_replace_the_gates_at_once() {
        let keys: Vec<TicketKey> = (1..=3)
            .map(|e| TicketKey::of_epoch(&[e as u8; 32], e).unwrap())
            .collect();
        let gate = crate::auth::ticket::shared(Gate::Closed);
        let r = RegisterNodeResponse {
            ticket_keys: vec![public(&keys[0])],
            ..Default::default()
        };
        let versions: Arc<dyn VersionBlocks> = Arc::new(All);
        registered(&r, &gate, &TicketHolder::default(), &versions);
        let admit = |k: &TicketKey| locks::read(&gate).admit(&k.issue(&Grant::Node, NODE_TTL));
        assert_eq!(admit(&keys[0]), Ok(Some(Grant::Node)));
        assert_eq!(admit(&keys[1]), Err(TicketError::Forged));
        let beat = HeartbeatResponse {
            ticket_keys: vec![public(&keys[1]), public(&keys[2])],
            ..Default::default()
        };
        rotated(&beat, &gate);
        assert_eq!(admit(&keys[1]), Ok(Some(Grant::Node)));
        assert_eq!(admit(&keys[2]), Ok(Some(Grant::Node)));
        assert_eq!(admit(&keys[0]), Err(TicketError::Retired(1)));
        // A server without authentication sends none: the node serves without tickets.
        registered(
            &RegisterNodeResponse::default(),
            &gate,
            &TicketHolder::default(),
            &versions,
        );
        assert!(locks::read(&gate).is_open());
    }
}
