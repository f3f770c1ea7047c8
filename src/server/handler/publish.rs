//! Publishing: one key (by manifest or by patch), a batch of small keys, or a GPU key; each
//! told to the namespace's watchers once it is made.

use tonic::{Request, Response, Status};

use super::inline::{check_inline_lengths, checked_inline, store_inline};
use super::state::StoreHandler;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::meta::{MetaError, MetaStore, Publish, Ticket};
use crate::proto::{
    Locale, Manifest, PublishBatchRequest, PublishBatchResponse, PublishGpuRequest, PublishRequest,
    PublishResponse, PublishResult,
};
use crate::server::auth::principal;
use crate::server::patch::{self, Patched};
use crate::server::status::{blocking, invalid, parse_key};
use crate::server::watch::dir_of;

/// Items of one `PublishBatch`, at most.
const MAX_BATCH_ITEMS: usize = 256;
/// Inline bytes of one `PublishBatch`, at most.
const MAX_BATCH_INLINE: usize = 8 << 20;

/// One item of a batch, checked as far as it can be before anything is stored.
struct Item {
    key: KeyPath,
    manifest: Manifest,
    inline: Vec<(BlockHash, Vec<u8>)>,
    locale: Locale,
    origin: String,
    ttl_secs: u64,
    force: bool,
    changed: Option<(i64, u32)>,
}

/// `paths` and the directory of each: what a publish's maker is answered about.
fn with_parents(paths: &[String]) -> Vec<String> {
    let mut out: Vec<String> = paths
        .iter()
        .flat_map(|p| [p.clone(), dir_of(p).to_string()])
        .collect();
    out.sort();
    out.dedup();
    out
}

fn check_item(r: PublishRequest) -> Result<Item, Status> {
    let key = parse_key(&r.key)?;
    let locale = r.locale();
    if locale != Locale::Store {
        return Err(invalid("a batch publishes locale=store items only"));
    }
    if r.patch.is_some() {
        return Err(invalid("a batch item carries a manifest, not a patch"));
    }
    let manifest = r.manifest.ok_or_else(|| invalid("manifest missing"))?;
    let inline = checked_inline(r.inline_blocks)?;
    check_inline_lengths(&key, &manifest, &inline)?;
    Ok(Item {
        key,
        manifest,
        inline,
        locale,
        origin: r.origin_node,
        ttl_secs: r.ttl_secs,
        force: r.force,
        changed: changed_at(r.changed_unix_ns),
    })
}

/// A publish's `changed_unix_ns` as seconds and nanoseconds; 0 (or less): none.
fn changed_at(ns: i64) -> Option<(i64, u32)> {
    (ns > 0).then_some((ns / 1_000_000_000, (ns % 1_000_000_000) as u32))
}

/// Publishes the items of a batch: each queued as a change of its own, then all made durable
/// with one wait (one sync of the log where nothing else interleaves), then answered each.
fn publish_items(
    meta: &MetaStore,
    ns: &Namespace,
    items: Vec<Result<Item, Status>>,
) -> Vec<PublishResult> {
    let queued: Vec<Result<(KeyPath, Version, Ticket), Status>> = items
        .into_iter()
        .map(|item| {
            let i = item?;
            let (v, t) = meta.publish_queued(Publish {
                locale: i.locale,
                origin: &i.origin,
                ttl_secs: i.ttl_secs,
                force: i.force,
                changed: i.changed,
                inline: &i.inline,
                ..Publish::new(ns, &i.key, &i.manifest)
            })?;
            Ok((i.key, v, t))
        })
        .collect();
    queued
        .into_iter()
        .map(|q| {
            let (key, version, ticket) = q?;
            meta.wait(ticket)?;
            let parent = key.as_str().rsplit_once('/').map(|(p, _)| p);
            let parent = parent.map(KeyPath::parse).transpose().ok().flatten();
            Ok(PublishResponse {
                version: version.0.to_vec(),
                parent: meta.list_dir_only(ns, parent.as_ref())?.dir,
                entry: meta.list_dir_only(ns, Some(&key))?.dir,
            })
        })
        .map(|r: Result<PublishResponse, Status>| match r {
            Ok(p) => PublishResult {
                published: Some(p),
                ..Default::default()
            },
            Err(s) => PublishResult {
                published: None,
                code: s.code() as i32,
                message: s.message().to_string(),
            },
        })
        .collect()
}

pub(super) async fn publish(
    handler: &StoreHandler,
    req: Request<PublishRequest>,
) -> Result<Response<PublishResponse>, Status> {
    let _timed = crate::metrics::Timer::start(&crate::metrics::PUBLISH_SECONDS);
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let caller = principal(&req)?;
    let r = req.into_inner();
    let key = parse_key(&r.key)?;
    let locale = r.locale();
    if locale == Locale::Local {
        caller.may_publish_in_place(&r.origin_node)?;
    }
    let change = handler.change(&ns, vec![key.to_string()]);
    let change = handler.with_made_directories(change, r.watcher).await?;
    let since = handler.watchers.now();
    let inline = checked_inline(r.inline_blocks)?;
    let mut stored = false;
    let mut base_manifest = None;
    let manifest = match (r.manifest, r.patch) {
        (Some(m), None) => m,
        (None, Some(p)) if locale == Locale::Store => {
            let (meta, ns, key, ttl) = (handler.meta.clone(), ns.clone(), key.clone(), r.ttl_secs);
            let base = r.base_version;
            // The inline blocks first: a patch may name them, and the check of the patched
            // manifest's blocks needs them stored.
            let inline = inline.clone();
            let patched = blocking(move || {
                store_inline(&meta, &ns, &inline)?;
                patch::patched(&meta, &ns, &key, &base, &p, locale, ttl)
            })
            .await?;
            stored = true;
            match patched {
                Patched::Publish { manifest, base } => {
                    base_manifest = base;
                    manifest
                }
                Patched::Unchanged(version) => {
                    tracing::debug!(key = %r.key, %version, "unchanged");
                    return Ok(Response::new(PublishResponse {
                        version: version.0.to_vec(),
                        parent: None,
                        entry: None,
                    }));
                }
            }
        }
        (None, Some(_)) => return Err(invalid("only a locale=store publish takes a patch")),
        (Some(_), Some(_)) => return Err(invalid("a publish carries a manifest or a patch")),
        (None, None) => return Err(invalid("manifest missing")),
    };
    check_inline_lengths(&key, &manifest, &inline)?;
    let meta = handler.meta.clone();
    let at = ns.clone();
    let version = blocking(move || {
        let ns = at;
        // A patch's stored them before it was made.
        let inline = if stored { Vec::new() } else { inline };
        let version = meta.publish(Publish {
            ns: &ns,
            key: &key,
            manifest: &manifest,
            base: base_manifest.as_ref(),
            locale,
            origin: &r.origin_node,
            ttl_secs: r.ttl_secs,
            force: r.force,
            changed: changed_at(r.changed_unix_ns),
            inline: &inline,
        })?;
        let parent = key.as_str().rsplit_once('/').map(|(p, _)| p);
        let parent = parent.map(KeyPath::parse).transpose().ok().flatten();
        let dir = meta.list_dir_only(&ns, parent.as_ref())?.dir;
        let entry = meta.list_dir_only(&ns, Some(&key))?.dir;
        Ok::<_, MetaError>((version, dir, entry))
    })
    .await?;
    let (version, parent, entry) = version;
    // The maker keeps the entries it is answered (its listing takes the new one).
    handler
        .watchers
        .hold(ns.as_str(), r.watcher, since, with_parents(&change.paths))
        .await;
    handler.tell_except(change, r.watcher).await;
    tracing::debug!(key = %r.key, %version, ?locale, "published");
    Ok(Response::new(PublishResponse {
        version: version.0.to_vec(),
        parent,
        entry,
    }))
}

pub(super) async fn publish_batch(
    handler: &StoreHandler,
    req: Request<PublishBatchRequest>,
) -> Result<Response<PublishBatchResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    if r.items.len() > MAX_BATCH_ITEMS {
        return Err(invalid(format!(
            "{} items in one batch; at most {MAX_BATCH_ITEMS}",
            r.items.len()
        )));
    }
    let total: usize = r
        .items
        .iter()
        .flat_map(|i| &i.inline_blocks)
        .map(|b| b.data.len())
        .sum();
    if total > MAX_BATCH_INLINE {
        return Err(invalid(format!(
            "{total} bytes of inline blocks in one batch; at most {MAX_BATCH_INLINE}"
        )));
    }
    // What can be checked before anything is stored, item by item.
    let checked: Vec<Result<Item, Status>> = r.items.into_iter().map(check_item).collect();
    let keys = checked
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .map(|i| i.key.to_string())
        .collect();
    let change = handler.change(&ns, keys);
    let change = handler.with_made_directories(change, r.watcher).await?;
    let since = handler.watchers.now();
    let meta = handler.meta.clone();
    let nsb = ns.clone();
    let results = blocking(move || Ok(publish_items(&meta, &nsb, checked))).await?;
    handler
        .watchers
        .hold(ns.as_str(), r.watcher, since, with_parents(&change.paths))
        .await;
    handler.tell_except(change, r.watcher).await;
    tracing::info!(namespace = %ns, items = results.len(), "published a batch");
    Ok(Response::new(PublishBatchResponse { results }))
}

pub(super) async fn publish_gpu(
    handler: &StoreHandler,
    req: Request<PublishGpuRequest>,
) -> Result<Response<PublishResponse>, Status> {
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    let r = req.into_inner();
    let key = parse_key(&r.key)?;
    let mut gpu = r.gpu.ok_or_else(|| invalid("gpu key missing"))?;
    // Issued in each answer, never kept (nor taken from a caller).
    gpu.secret.clear();
    let meta = handler.meta.clone();
    let node = gpu.publisher_node.clone();
    let change = handler.change(&ns, vec![key.to_string()]);
    let version = blocking(move || meta.publish_gpu(&ns, &key, gpu)).await?;
    handler.tell(change).await;
    tracing::info!(key = %r.key, %version, %node, "published a GPU key");
    Ok(Response::new(PublishResponse {
        version: version.0.to_vec(),
        parent: None,
        entry: None,
    }))
}
