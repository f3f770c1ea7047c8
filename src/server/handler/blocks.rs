//! Blocks: which of a put's blocks its namespace may not name yet (with a ticket to upload them
//! for that namespace), and the
//! blocks of a version (which nodes check tickets against).

use tonic::{Request, Response, Status};

use super::state::{namespace_for, StoreHandler};
use crate::auth::ticket::{self, Grant};
use crate::hash::{BlockHash, Scope};
use crate::proto::{
    MissingBlocksRequest, MissingBlocksResponse, VersionBlocksRequest, VersionBlocksResponse,
};
use crate::server::auth::{expiry_of, principal};
use crate::server::status::{blocking, invalid, parse_version};
use crate::server::tickets;

pub(super) async fn missing_blocks(
    handler: &StoreHandler,
    req: Request<MissingBlocksRequest>,
) -> Result<Response<MissingBlocksResponse>, Status> {
    let ns = namespace_for(&req, &req.get_ref().namespace)?;
    let expires = expiry_of(&req);
    let hashes = req
        .into_inner()
        .hashes
        .iter()
        .map(|h| BlockHash::from_slice(h).ok_or_else(|| invalid("bad hash")))
        .collect::<Result<Vec<_>, _>>()?;
    let meta = handler.meta.clone();
    let scope = meta.scope_of(&ns);
    let missing = blocking(move || Ok(meta.blocks().missing_for(scope.as_ref(), &hashes)?)).await?;
    Ok(Response::new(MissingBlocksResponse {
        hashes: missing.iter().map(|h| h.0.to_vec()).collect(),
        ticket: handler.ticket(
            &Grant::Write(Scope::of_namespace(ns.as_str())),
            ticket::WRITE_TTL,
            expires,
        ),
    }))
}

pub(super) async fn version_blocks(
    handler: &StoreHandler,
    req: Request<VersionBlocksRequest>,
) -> Result<Response<VersionBlocksResponse>, Status> {
    principal(&req)?.may_be_a_node()?;
    let version = parse_version(&req.into_inner().version)?;
    let meta = handler.meta.clone();
    let set = blocking(move || tickets::blocks_of(&meta, &version)).await?;
    Ok(Response::new(match set {
        None => VersionBlocksResponse::default(),
        Some(set) => VersionBlocksResponse {
            found: true,
            hashes: set.iter().flat_map(|h| h.0).collect(),
        },
    }))
}
