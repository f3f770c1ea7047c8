//! Reading: resolving one key or many (with a read ticket, and a small file's blocks inline)
//! and listing a directory (with the listings a walk reads next); what a watcher reads is held
//! in its lease.

use tonic::{Request, Response, Status};

use super::inline::inline_file;
use super::state::{namespace_for, StoreHandler};
use crate::auth::ticket::{self, Grant};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::meta::{MetaError, MetaStore, Page};
use crate::proto::{
    EntryKind, ListRequest, ListResponse, Locale, ResolveManyRequest, ResolveManyResponse,
    ResolveRequest, ResolveResponse, ResolveResult,
};
use crate::rpc::MAX_INLINE_BYTES;
use crate::server::auth::expiry_of;
use crate::server::status::{blocking, invalid, parse_key};

/// Keys of one `ResolveMany`, at most.
const MAX_RESOLVE_MANY: usize = 256;
/// The most entries a listing's `ahead` brings, and the most bytes: well inside a gRPC
/// message, and a few milliseconds of the server's time.
const LIST_AHEAD_MAX: usize = 8192;
const LIST_AHEAD_BYTES: usize = 1 << 20;
/// The most entries of a listing one answer holds; a caller asks for the rest page by page.
const LIST_PAGE: usize = 5000;
/// About the most bytes of entries one answer holds: with the listings ahead (a whole first
/// page alone) an answer stays under 4 MiB, whatever the names.
const LIST_PAGE_BYTES: usize = 3 << 20;

/// What `Resolve` answers for `key`, but its read ticket.
fn resolve_key(
    meta: &MetaStore,
    ns: &Namespace,
    key: &KeyPath,
    inline_up_to: u32,
) -> Result<ResolveResponse, MetaError> {
    let found = meta.resolve(ns, key)?;
    let version = Version::from_slice(&found.record.version)
        .ok_or_else(|| MetaError::Corrupt("version".into()))?;
    // A GPU key's bytes are in its holder's buffers: no source of blocks.
    let sources = if found.record.kind() == EntryKind::Gpu {
        Vec::new()
    } else {
        meta.sources(&version, &found.record)?
    };
    let rec = found.record;
    let inline_blocks = if rec.locale() == Locale::Store {
        inline_file(meta.blocks(), &found.manifest, inline_up_to)?
    } else {
        Vec::new()
    };
    Ok(ResolveResponse {
        key: found.key,
        version: rec.version.clone(),
        locale: rec.locale,
        origin_node: rec.origin_node.clone(),
        size: crate::manifest::total_size(&found.manifest),
        files: crate::manifest::file_count(&found.manifest),
        manifest: Some(found.manifest),
        sources,
        created_unix_ms: rec.created_unix_ms,
        expires_unix_ms: rec.expires_unix_ms,
        subpath: found.subpath,
        inline_blocks,
        gpu: rec.gpu,
        ticket: Vec::new(),
    })
}

impl StoreHandler {
    /// What a resolve that checked the caller's namespace gives: a read ticket of the version,
    /// and a GPU key's secret.
    fn grant_read(&self, ns: &Namespace, resp: &mut ResolveResponse, expires: Option<u64>) {
        if let Some(v) = Version::from_slice(&resp.version) {
            resp.ticket = self.ticket(&Grant::Read(v), ticket::READ_TTL, expires);
        }
        if let Some(g) = resp.gpu.as_mut() {
            g.secret = self.gpu_secret(ns.as_str(), &g.publisher_node, g.registration);
        }
    }
}

pub(super) async fn resolve(
    handler: &StoreHandler,
    req: Request<ResolveRequest>,
) -> Result<Response<ResolveResponse>, Status> {
    let ns = namespace_for(&req, &req.get_ref().namespace)?;
    let expires = expiry_of(&req);
    let r = req.into_inner();
    handler.leased_here(&ns, r.watcher)?;
    let key = parse_key(&r.key)?;
    let meta = handler.meta.clone();
    let since = handler.watchers.now();
    let (at, asked) = (ns.clone(), key.to_string());
    let mut resp = blocking(move || resolve_key(&meta, &at, &key, r.inline_up_to)).await?;
    handler
        .watchers
        .hold(ns.as_str(), r.watcher, since, vec![asked])
        .await;
    handler.grant_read(&ns, &mut resp, expires);
    Ok(Response::new(resp))
}

pub(super) async fn resolve_many(
    handler: &StoreHandler,
    req: Request<ResolveManyRequest>,
) -> Result<Response<ResolveManyResponse>, Status> {
    let ns = namespace_for(&req, &req.get_ref().namespace)?;
    let expires = expiry_of(&req);
    let r = req.into_inner();
    handler.leased_here(&ns, r.watcher)?;
    if r.keys.len() > MAX_RESOLVE_MANY {
        return Err(invalid(format!(
            "{} keys in one call; at most {MAX_RESOLVE_MANY}",
            r.keys.len()
        )));
    }
    let meta = handler.meta.clone();
    let (watcher, at) = (r.watcher, ns.clone());
    let asked: Vec<Option<String>> = r
        .keys
        .iter()
        .map(|k| parse_key(k).ok().map(|k| k.to_string()))
        .collect();
    let since = handler.watchers.now();
    let mut results = blocking(move || {
        let ns = at;
        let mut inline_left = MAX_INLINE_BYTES;
        let results = r
            .keys
            .iter()
            .map(|k| {
                let key = parse_key(k)?;
                let up_to = r.inline_up_to.min(inline_left as u32);
                let found = resolve_key(&meta, &ns, &key, up_to)?;
                let sent: usize = found.inline_blocks.iter().map(|b| b.data.len()).sum();
                inline_left = inline_left.saturating_sub(sent);
                Ok(found)
            })
            .map(|r: Result<ResolveResponse, Status>| match r {
                Ok(found) => ResolveResult {
                    resolved: Some(found),
                    ..Default::default()
                },
                Err(s) => ResolveResult {
                    resolved: None,
                    code: s.code() as i32,
                    message: s.message().to_string(),
                },
            })
            .collect::<Vec<_>>();
        Ok(results)
    })
    .await?;
    let held = results
        .iter()
        .zip(asked)
        .filter(|(r, _)| r.resolved.is_some())
        .filter_map(|(_, k)| k)
        .collect();
    handler
        .watchers
        .hold(ns.as_str(), watcher, since, held)
        .await;
    for found in results.iter_mut().filter_map(|r| r.resolved.as_mut()) {
        handler.grant_read(&ns, found, expires);
    }
    Ok(Response::new(ResolveManyResponse { results }))
}

pub(super) async fn list(
    handler: &StoreHandler,
    req: Request<ListRequest>,
) -> Result<Response<ListResponse>, Status> {
    let ns = namespace_for(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    handler.leased_here(&ns, r.watcher)?;
    let prefix = KeyPath::parse_prefix(&r.prefix).map_err(|e| invalid(e.to_string()))?;
    let meta = handler.meta.clone();
    let (watcher, recursive, at) = (r.watcher, r.recursive, ns.clone());
    let listed = prefix.as_ref().map_or_else(String::new, |p| p.to_string());
    let since = handler.watchers.now();
    let listing = blocking(move || {
        let ns = at;
        if r.dir_only {
            return meta.list_dir_only(&ns, prefix.as_ref());
        }
        let page = Page {
            after: &r.after,
            limit: match r.limit {
                0 => LIST_PAGE,
                n => (n as usize).min(LIST_PAGE),
            },
            max_bytes: LIST_PAGE_BYTES,
        };
        let mut l = meta.list_page(&ns, prefix.as_ref(), r.recursive, page)?;
        let whole = r.after.is_empty() && l.next.is_empty();
        if r.ahead > 0 && !r.recursive && l.exists && whole {
            let budget = (r.ahead as usize).min(LIST_AHEAD_MAX);
            l.ahead = meta.listings_ahead(&ns, prefix.as_ref(), &l, budget, LIST_AHEAD_BYTES)?;
        }
        Ok(l)
    })
    .await?;
    // A recursive listing is not one a mount keeps.
    if !recursive {
        let held = std::iter::once(listed)
            .chain(listing.ahead.iter().map(|l| l.path.clone()))
            .collect();
        handler
            .watchers
            .hold(ns.as_str(), watcher, since, held)
            .await;
    }
    Ok(Response::new(listing))
}
