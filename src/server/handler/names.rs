//! Changes of names and attributes: remove, rename, exchange, link and set_attr, each told to
//! the namespace's watchers once it is made.

use tonic::{Request, Response, Status};

use super::state::StoreHandler;
use crate::proto::{
    ExchangeRequest, LinkRequest, LinkResponse, RemoveRequest, RemoveResponse, RenameRequest,
    RenameResponse, SetAttrRequest, SetAttrResponse,
};
use crate::server::status::{blocking, parse_key};

pub(super) async fn remove(
    handler: &StoreHandler,
    req: Request<RemoveRequest>,
) -> Result<Response<RemoveResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let key = parse_key(&r.key)?;
    let meta = handler.meta.clone();
    let mut change = handler.change(&ns, Vec::new());
    let watcher = r.watcher;
    let removed = blocking(move || {
        if r.gpu_registration != 0 {
            let gone = meta.remove_gpu(&ns, &key, r.gpu_registration)?;
            return Ok(if gone {
                vec![key.to_string()]
            } else {
                Vec::new()
            });
        }
        meta.remove(&ns, &key, r.recursive, r.prefix)
    })
    .await?;
    if !removed.is_empty() {
        change.paths = removed.clone();
        handler.tell_except(change, watcher).await;
    }
    tracing::info!(count = removed.len(), "removed keys");
    Ok(Response::new(RemoveResponse { removed }))
}

pub(super) async fn rename(
    handler: &StoreHandler,
    req: Request<RenameRequest>,
) -> Result<Response<RenameResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let (from, to) = (parse_key(&r.from)?, parse_key(&r.to)?);
    let meta = handler.meta.clone();
    let change = handler.change(&ns, vec![from.to_string(), to.to_string()]);
    blocking(move || meta.rename(&ns, &from, &to, r.no_replace)).await?;
    handler.tell_except(change, r.watcher).await;
    Ok(Response::new(RenameResponse {}))
}

pub(super) async fn exchange(
    handler: &StoreHandler,
    req: Request<ExchangeRequest>,
) -> Result<Response<RenameResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let (a, b) = (parse_key(&r.a)?, parse_key(&r.b)?);
    let meta = handler.meta.clone();
    let change = handler.change(&ns, vec![a.to_string(), b.to_string()]);
    blocking(move || meta.exchange(&ns, &a, &b)).await?;
    handler.tell_except(change, r.watcher).await;
    Ok(Response::new(RenameResponse {}))
}

pub(super) async fn link(
    handler: &StoreHandler,
    req: Request<LinkRequest>,
) -> Result<Response<LinkResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let (from, to) = (parse_key(&r.from)?, parse_key(&r.to)?);
    let meta = handler.meta.clone();
    let change = handler.change(&ns, vec![from.to_string(), to.to_string()]);
    blocking(move || meta.link(&ns, &from, &to)).await?;
    handler.tell_except(change, r.watcher).await;
    Ok(Response::new(LinkResponse {}))
}

pub(super) async fn set_attr(
    handler: &StoreHandler,
    req: Request<SetAttrRequest>,
) -> Result<Response<SetAttrResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let key = parse_key(&r.key)?;
    let mtime = r.mtime_sec.map(|s| (s, r.mtime_nsec.min(999_999_999)));
    let meta = handler.meta.clone();
    let change = handler.change(&ns, vec![key.to_string()]);
    let watcher = r.watcher;
    blocking(move || meta.set_attr(&ns, &key, r.mode, mtime, (r.uid, r.gid))).await?;
    handler.tell_except(change, watcher).await;
    Ok(Response::new(SetAttrResponse {}))
}
