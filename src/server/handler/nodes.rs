//! Nodes: registering, heartbeats (which renew a lease, say what a node has open and has let
//! go of, and bring it the blocks collected since), and the versions a node holds.

use std::net::SocketAddr;

use tonic::{Request, Response, Status};

use super::state::namespace_for;
use super::state::StoreHandler;
use crate::auth::ticket::{self, Grant};
use crate::meta::MetaError;
use crate::proto::{
    AddLocationRequest, AddLocationResponse, HeartbeatRequest, HeartbeatResponse,
    RegisterNodeRequest, RegisterNodeResponse, TicketPublicKey,
};
use crate::rpc::status::{to_status, Fault};
use crate::server::auth::{expiry_of, principal, OnBehalf};
use crate::server::status::{blocking, invalid, parse_key, parse_version};

pub(super) async fn register_node(
    handler: &StoreHandler,
    req: Request<RegisterNodeRequest>,
) -> Result<Response<RegisterNodeResponse>, Status> {
    let caller = principal(&req)?;
    let expires = expiry_of(&req);
    let node = req
        .into_inner()
        .node
        .ok_or_else(|| invalid("node missing"))?;
    caller.may_act_for_node(&node.node_id)?;
    if node.node_id.is_empty() || node.data_addr.parse::<SocketAddr>().is_err() {
        return Err(invalid("node needs an id and a data address ip:port"));
    }
    tracing::info!(node = %node.node_id, addr = %node.data_addr, "node registered");
    // Where the leases are etcd's too, registering waits on it: off the async threads.
    let meta = handler.meta.clone();
    blocking(move || {
        meta.register_node(node);
        Ok(())
    })
    .await?;
    Ok(Response::new(RegisterNodeResponse {
        lease_secs: handler.meta.lease().as_secs() as u32,
        ticket: handler.ticket(&Grant::Node, ticket::NODE_TTL, expires),
        ticket_key: handler
            .tickets
            .as_ref()
            .map(|k| k.signing_public().as_bytes().to_vec())
            .unwrap_or_default(),
        // No longer sent: a node asks for each registration's secret (RegistrationSecret).
        gpu_key: Vec::new(),
        ticket_keys: ticket_keys(handler),
    }))
}

pub(super) async fn heartbeat(
    handler: &StoreHandler,
    req: Request<HeartbeatRequest>,
) -> Result<Response<HeartbeatResponse>, Status> {
    let caller = principal(&req)?;
    let expires = expiry_of(&req);
    let r = req.into_inner();
    caller.may_act_for_node(&r.node_id)?;
    let (meta, node) = (handler.meta.clone(), r.node_id.clone());
    let known = blocking(move || Ok(meta.heartbeat(&node))).await?;
    let open = r
        .open_versions
        .iter()
        .map(|v| parse_version(v))
        .collect::<Result<_, _>>()?;
    handler.meta.set_open_versions(&r.node_id, open);
    let gone = r
        .gone_versions
        .iter()
        .map(|v| parse_version(v))
        .collect::<Result<Vec<_>, _>>()?;
    if !gone.is_empty() {
        let (meta, node) = (handler.meta.clone(), r.node_id.clone());
        blocking(move || {
            for v in &gone {
                meta.remove_location(v, &node)?;
            }
            Ok::<_, MetaError>(())
        })
        .await?;
    }
    let collected = handler
        .meta
        .collected_since(r.collected_after, r.collected_epoch);
    Ok(Response::new(HeartbeatResponse {
        known,
        ticket: handler.ticket(&Grant::Node, ticket::NODE_TTL, expires),
        collected: collected.blocks.iter().map(|h| h.0.to_vec()).collect(),
        collected_upto: collected.upto,
        collected_epoch: collected.epoch,
        ticket_keys: ticket_keys(handler),
    }))
}

/// The public keys of the ticket epochs in force, as nodes check tickets with them.
fn ticket_keys(handler: &StoreHandler) -> Vec<TicketPublicKey> {
    let Some(keys) = &handler.tickets else {
        return Vec::new();
    };
    keys.verifiers()
        .get()
        .iter()
        .map(|v| TicketPublicKey {
            epoch: v.epoch(),
            key: v.as_bytes().to_vec(),
        })
        .collect()
}

pub(super) async fn add_location(
    handler: &StoreHandler,
    req: Request<AddLocationRequest>,
) -> Result<Response<AddLocationResponse>, Status> {
    principal(&req)?.may_act_for_node(&req.get_ref().node_id)?;
    // A node's agent seeding for a caller on its socket: the caller names the key it got, in
    // a namespace it may use, and the version must be that key's, so that no caller makes a
    // node a source of another namespace's versions.
    let seeded_for = match req.extensions().get::<OnBehalf>() {
        Some(_) => Some((
            namespace_for(&req, &req.get_ref().namespace)?,
            parse_key(&req.get_ref().key)?,
        )),
        None => None,
    };
    let r = req.into_inner();
    let version = parse_version(&r.version)?;
    if let Some((ns, key)) = seeded_for {
        let meta = handler.meta.clone();
        let (at, asked) = (ns.clone(), key.clone());
        let found = blocking(move || meta.resolve(&at, &asked)).await?;
        if found.record.version != version.0 {
            return Err(to_status(
                Fault::Conflict,
                format!("{ns}/{key} is not at version {version}: nothing to seed"),
            ));
        }
    }
    let meta = handler.meta.clone();
    blocking(move || meta.add_location(&version, &r.node_id)).await?;
    Ok(Response::new(AddLocationResponse {}))
}
