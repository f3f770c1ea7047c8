//! The store server's gRPC handler: the service logic of the control plane. Sockets and
//! shutdown belong to [`super::StoreServerProcess`].

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::auth::{group_namespace, principal};
use super::patch::{self, Patched};
use super::status::{blocking, invalid, parse_key, parse_ns, parse_version};
use super::watch::Watchers;
use crate::blocks::store::StoreBlocks;
use crate::blocks::Served;
use crate::broadcast::windows::{
    Broadcasts, GpuJoiner, GpuWindows, Joiner, NodeView, Seed, SwarmPieces,
};
use crate::clock::SharedClock;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::locks;
use crate::meta::{MetaError, MetaStore};
use crate::proto::store_server::Store;
use crate::proto::*;
use crate::rpc::status::{to_status, Fault};
use crate::auth::gpu_secret;
use crate::rpc::{self, MAX_INLINE_BYTES, MAX_INLINE_FILE};
use crate::auth::ticket::{self, Grant, TicketKey};

/// Items of one `PublishBatch`, at most.
const MAX_BATCH_ITEMS: usize = 256;
/// Inline bytes of one `PublishBatch`, at most.
const MAX_BATCH_INLINE: usize = 8 << 20;
/// Keys of one `ResolveMany`, at most.
const MAX_RESOLVE_MANY: usize = 256;
/// The most entries a listing's `ahead` brings, and the most bytes: well inside a gRPC
/// message, and a few milliseconds of the server's time.
const LIST_AHEAD_MAX: usize = 8192;
const LIST_AHEAD_BYTES: usize = 1 << 20;

/// One item of a batch, checked as far as it can be before anything is stored.
struct Item {
    key: KeyPath,
    manifest: Manifest,
    inline: Vec<(BlockHash, Vec<u8>)>,
    locale: Locale,
    origin: String,
    ttl_secs: u64,
    force: bool,
}

/// `paths` and the directory of each: what a publish's maker is answered about.
fn with_parents(paths: &[String]) -> Vec<String> {
    let mut out: Vec<String> = paths
        .iter()
        .flat_map(|p| [p.clone(), super::watch::dir_of(p).to_string()])
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
    })
}

/// Publishes the items of a batch: each queued as a change of its own, then all made durable
/// with one wait (one sync of the log where nothing else interleaves), then answered each.
fn publish_items(
    meta: &MetaStore,
    ns: &Namespace,
    items: Vec<Result<Item, Status>>,
) -> Vec<PublishResult> {
    let queued: Vec<Result<(KeyPath, Version, crate::meta::Ticket), Status>> = items
        .into_iter()
        .map(|item| {
            let i = item?;
            for (hash, data) in &i.inline {
                meta.blocks().put(hash, data).map_err(MetaError::from)?;
            }
            let (v, t) = meta.publish_queued(
                ns,
                &i.key,
                &i.manifest,
                i.locale,
                &i.origin,
                i.ttl_secs,
                i.force,
            )?;
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

/// Inline blocks of a publish, each checked against its hash.
fn checked_inline(blocks: Vec<InlineBlock>) -> Result<Vec<(BlockHash, Vec<u8>)>, Status> {
    let total: usize = blocks.iter().map(|b| b.data.len()).sum();
    if total > MAX_INLINE_BYTES {
        return Err(invalid(format!(
            "{total} bytes of inline blocks exceed the limit of {MAX_INLINE_BYTES}; upload them on the data plane"
        )));
    }
    blocks
        .into_iter()
        .map(|b| {
            let hash =
                BlockHash::from_slice(&b.hash).ok_or_else(|| invalid("inline block: bad hash"))?;
            if BlockHash::of(&b.data) != hash {
                return Err(invalid(format!(
                    "inline block {} does not match its hash",
                    hash.hex()
                )));
            }
            Ok((hash, b.data))
        })
        .collect()
}

/// Every place `m` names an inline block gives it the block's length: checked before the
/// blocks are stored, so a refused publish leaves nothing behind.
fn check_inline_lengths(
    key: &KeyPath,
    m: &Manifest,
    inline: &[(BlockHash, Vec<u8>)],
) -> Result<(), Status> {
    if inline.is_empty() {
        return Ok(());
    }
    let lens: std::collections::HashMap<&[u8], usize> = inline
        .iter()
        .map(|(h, data)| (&h.0[..], data.len()))
        .collect();
    for e in &m.entries {
        for (i, b) in e.blocks.iter().enumerate() {
            let Some(&len) = lens.get(&b.hash[..]) else {
                continue;
            };
            if len != b.len as usize {
                let file = if e.path.is_empty() {
                    key.to_string()
                } else {
                    format!("{key}/{}", e.path)
                };
                return Err(invalid(format!(
                    "{file}: block {i} ({}) is {len} bytes inline, the manifest says {}",
                    BlockHash::from_slice(&b.hash)
                        .map(|h| h.hex())
                        .unwrap_or_default(),
                    b.len
                )));
            }
        }
    }
    Ok(())
}

/// The blocks of a small one-file manifest, if the caller wants them and they are all small
/// blocks in the database (never a block file: those go on the data plane).
fn inline_file(
    blocks: &StoreBlocks,
    m: &Manifest,
    up_to: u32,
) -> Result<Vec<InlineBlock>, MetaError> {
    let [entry] = &m.entries[..] else {
        return Ok(Vec::new());
    };
    if entry.kind() != EntryKind::File || entry.size > u64::from(up_to.min(MAX_INLINE_FILE)) {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(entry.blocks.len());
    for b in &entry.blocks {
        let Some(hash) = crate::manifest::block_hash(b) else {
            return Ok(Vec::new());
        };
        match blocks.get(&hash)? {
            Some(Served::Bytes(data)) => out.push(InlineBlock {
                hash: b.hash.clone(),
                data: data.to_vec(),
            }),
            _ => return Ok(Vec::new()),
        }
    }
    Ok(out)
}

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

/// The gRPC handler; sockets and shutdown belong to [`StoreServerProcess`].
pub struct StoreHandler {
    pub(super) meta: Arc<MetaStore>,
    /// The data plane's ticket key; `None` where callers are not authenticated.
    pub(super) tickets: Option<TicketKey>,
    pub(super) clock: SharedClock,
    pub(super) windows: Arc<std::sync::Mutex<Broadcasts>>,
    /// Wakes putters waiting for a quorum whenever someone joins.
    pub(super) joined: Arc<tokio::sync::Notify>,
    pub(super) gpu_windows: Arc<std::sync::Mutex<GpuWindows>>,
    /// Wakes whoever waits on a GPU window whenever one changes.
    pub(super) gpu_changed: Arc<tokio::sync::Notify>,
    /// The mounts watching each namespace; every change waits for them (see [`super::watch`]).
    pub(super) watchers: Arc<Watchers>,
    /// Swarm members whose syncs wait for fetches, by window, generation and member.
    pub(super) swarm_waits: Arc<std::sync::Mutex<SwarmWaits>>,
}

pub(super) type SwarmWaits =
    std::collections::HashMap<(String, u64, u64), Arc<tokio::sync::Notify>>;

/// A swarm member's sync waiting at the server, registered until dropped.
struct SwarmWait<'a> {
    waits: &'a std::sync::Mutex<SwarmWaits>,
    key: (String, u64, u64),
    notify: Arc<tokio::sync::Notify>,
}

impl Drop for SwarmWait<'_> {
    fn drop(&mut self) {
        let mut waits = locks::lock(self.waits);
        if waits
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            waits.remove(&self.key);
        }
    }
}

/// The longest a swarm member's sync waits for fetches to be chosen for it.
const SWARM_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// A change that touched more keys than this is sent to watchers as a change of its
/// namespace's root (everything), not key by key.
const WATCH_MAX_PATHS: usize = 256;

/// A change about to be made, to tell the namespace's watchers of once it is made.
struct Change {
    ns: Namespace,
    paths: Vec<String>,
    /// The store's count of hard-linked files' edits before the change.
    links: u64,
}

/// The longest a GPU window call is held before it answers with the window as it stands (the
/// caller asks again): long enough to spare the server, short enough that a member whose node
/// lapsed is noticed soon after the lease says so.
const GPU_AWAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The namespace a call names, once its caller is known to be allowed in it.
fn namespace_for<T>(req: &Request<T>, ns: &str) -> Result<Namespace, Status> {
    let ns = parse_ns(ns)?;
    principal(req)?.may_use(ns.as_str())?;
    Ok(ns)
}

/// Refuses a call on a broadcast window of a namespace its caller may not use.
fn window_for<T>(req: &Request<T>, group: &str) -> Result<(), Status> {
    principal(req)?.may_use(group_namespace(group)?)
}

impl StoreHandler {
    fn change(&self, ns: &Namespace, paths: Vec<String>) -> Change {
        Change {
            ns: ns.clone(),
            paths,
            links: self.meta.inode_changes(),
        }
    }

    /// Tells the watchers of a change once it is made, and returns when they know. A change
    /// that edited a hard-linked file changed its other names too, which nothing here names:
    /// it is told as a change of everything, as one of too many keys is.
    async fn tell(&self, c: Change) {
        self.tell_except(c, 0).await;
    }

    /// [`StoreHandler::tell`], but not to watcher `except`, whose own change it is (its caller
    /// takes the change from its answer); a change told as everything is told to it too.
    async fn tell_except(&self, c: Change, except: u64) {
        let everything = self.meta.inode_changes() != c.links || c.paths.len() > WATCH_MAX_PATHS;
        let (paths, except) = match everything {
            true => (vec![String::new()], 0),
            false => (c.paths, except),
        };
        self.watchers.changed(c.ns.as_str(), paths, except).await;
    }

    /// A ticket for `grant`, or none where the data plane asks for none.
    fn ticket(&self, grant: &Grant, ttl: std::time::Duration) -> Vec<u8> {
        self.tickets
            .as_ref()
            .map(|k| k.issue(grant, ttl).to_vec())
            .unwrap_or_default()
    }

    /// Fills a resolve's read ticket: what fetches of its version's blocks present.
    /// What a resolve that checked the caller's namespace gives: a read ticket of the version,
    /// and a GPU key's secret.
    fn grant_read(&self, ns: &Namespace, resp: &mut ResolveResponse) {
        if let Some(v) = Version::from_slice(&resp.version) {
            resp.ticket = self.ticket(&Grant::Read(v), ticket::READ_TTL);
        }
        if let Some(g) = resp.gpu.as_mut() {
            g.secret = self.gpu_secret(ns.as_str(), &g.publisher_node, g.registration);
        }
    }

    /// The secret of a GPU registration in namespace `ns` (`rpc::gpu_secret`); none where no
    /// tickets are issued.
    fn gpu_secret(&self, ns: &str, node: &str, registration: u64) -> Vec<u8> {
        self.tickets
            .as_ref()
            .map(|k| gpu_secret::registration_secret(k.as_bytes(), ns, node, registration).to_vec())
            .unwrap_or_default()
    }

    /// A GPU window as its members are told it: with each member's secret, since each fetches
    /// from another.
    fn gpu_window_for_members(&self, mut w: GpuWindow) -> GpuWindow {
        let ns = group_namespace(&w.group_id).unwrap_or_default().to_string();
        for m in &mut w.members {
            m.secret = self.gpu_secret(&ns, &m.node_id, m.registration);
        }
        w
    }

    fn windows(&self) -> std::sync::MutexGuard<'_, Broadcasts> {
        locks::lock(&self.windows)
    }

    fn gpu_windows(&self) -> std::sync::MutexGuard<'_, GpuWindows> {
        locks::lock(&self.gpu_windows)
    }

    fn alive(&self) -> impl Fn(&str) -> bool + '_ {
        |n: &str| self.meta.live_node(n).is_some()
    }

    fn live(&self) -> impl Fn(&str) -> Option<NodeView> + '_ {
        |n: &str| {
            self.meta.live_node(n).map(|i| NodeView {
                data_addr: i.data_addr,
                zone: i.zone,
            })
        }
    }

    /// Puts a getter into its version's swarm; the pieces it gets back, empty where there is no
    /// swarm (the getter then fetches from its parent). The manifest is read once per swarm.
    async fn swarm_join(
        &self,
        group: &str,
        window: &Window,
        member: u64,
        version: Version,
        seeds: &[Seed],
    ) -> SwarmPieces {
        let cached = self.windows().swarm_pieces(group, &version);
        let pieces = match cached {
            Some(p) => p,
            None => {
                let meta = self.meta.clone();
                let read = blocking(move || {
                    Ok(meta
                        .manifest_if_any(&version.0)?
                        .map(|m| {
                            let (hashes, lens) = crate::manifest::unique_blocks(&m);
                            SwarmPieces {
                                hashes,
                                lens,
                                log2: 0,
                            }
                        })
                        .unwrap_or_default())
                })
                .await;
                match read {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e.message(), "no swarm: the manifest could not be read");
                        return SwarmPieces::default();
                    }
                }
            }
        };
        match self
            .windows()
            .swarm_join(group, window.generation, member, pieces, seeds)
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "no swarm for this getter");
                SwarmPieces::default()
            }
        }
    }

    /// The nodes that hold the whole of `version` of `key` now.
    async fn seeds(&self, ns: &str, key: &str, version: &[u8]) -> Result<Vec<Seed>, Status> {
        let ns = parse_ns(ns)?;
        let key = parse_key(key)?;
        let version = parse_version(version)?;
        let meta = self.meta.clone();
        let sources = blocking(move || {
            let found = meta.resolve(&ns, &key)?;
            if found.record.version != version.0 {
                return Err(MetaError::Conflict(format!(
                    "{key} now names another version; resolve it again"
                )));
            }
            meta.sources(&version, &found.record)
        })
        .await?;
        Ok(sources
            .into_iter()
            .map(|s| Seed {
                origin: s.origin || s.node_id.is_empty(),
                node_id: s.node_id,
                data_addr: s.data_addr,
                zone: s.zone,
            })
            .collect())
    }
}

#[tonic::async_trait]
impl Store for StoreHandler {
    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchDown, Status>> + Send>>;

    async fn watch(
        &self,
        mut req: Request<tonic::Streaming<WatchUp>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let first = req
            .get_mut()
            .message()
            .await?
            .ok_or_else(|| invalid("a watch names its namespace in its first message"))?;
        let ns = namespace_for(&req, &first.namespace)?;
        let (reg, rx) = self
            .watchers
            .register(ns.as_str())
            .ok_or_else(|| Status::unavailable("the store server is shutting down"))?;
        // The first answer says the watcher's number (with the lease, or alone).
        let mut d = reg.up(first.acked, first.renew).unwrap_or_default();
        d.watcher = reg.id();
        reg.send(d);
        let mut inbound = req.into_inner();
        tokio::spawn(async move {
            // Until the watcher goes (its stream broke) or is dropped; `reg` unregisters it.
            loop {
                tokio::select! {
                    up = inbound.message() => match up {
                        Ok(Some(up)) => {
                            if let Some(d) = reg.up(up.acked, up.renew) {
                                reg.send(d);
                            }
                        }
                        _ => break,
                    },
                    () = reg.ended() => break,
                }
            }
        });
        tracing::debug!(namespace = %ns, "a mount watches");
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn register_node(
        &self,
        req: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeResponse>, Status> {
        let caller = principal(&req)?;
        let node = req
            .into_inner()
            .node
            .ok_or_else(|| invalid("node missing"))?;
        caller.may_act_for_node(&node.node_id)?;
        if node.node_id.is_empty() || node.data_addr.parse::<SocketAddr>().is_err() {
            return Err(invalid("node needs an id and a data address ip:port"));
        }
        tracing::info!(node = %node.node_id, addr = %node.data_addr, "node registered");
        self.meta.register_node(node);
        Ok(Response::new(RegisterNodeResponse {
            lease_secs: self.meta.lease().as_secs() as u32,
            ticket: self.ticket(&Grant::Node, ticket::NODE_TTL),
            ticket_key: self
                .tickets
                .as_ref()
                .map(|k| k.as_bytes().to_vec())
                .unwrap_or_default(),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = principal(&req)?;
        let r = req.into_inner();
        caller.may_act_for_node(&r.node_id)?;
        let known = self.meta.heartbeat(&r.node_id);
        let open = r
            .open_versions
            .iter()
            .map(|v| parse_version(v))
            .collect::<Result<_, _>>()?;
        self.meta.set_open_versions(&r.node_id, open);
        let gone = r
            .gone_versions
            .iter()
            .map(|v| parse_version(v))
            .collect::<Result<Vec<_>, _>>()?;
        if !gone.is_empty() {
            let (meta, node) = (self.meta.clone(), r.node_id.clone());
            blocking(move || {
                for v in &gone {
                    meta.remove_location(v, &node)?;
                }
                Ok::<_, crate::meta::MetaError>(())
            })
            .await?;
        }
        let collected = self
            .meta
            .collected_since(r.collected_after, r.collected_epoch);
        Ok(Response::new(HeartbeatResponse {
            known,
            ticket: self.ticket(&Grant::Node, ticket::NODE_TTL),
            collected: collected.blocks.iter().map(|h| h.0.to_vec()).collect(),
            collected_upto: collected.upto,
            collected_epoch: collected.epoch,
        }))
    }

    async fn missing_blocks(
        &self,
        req: Request<MissingBlocksRequest>,
    ) -> Result<Response<MissingBlocksResponse>, Status> {
        let hashes = req
            .into_inner()
            .hashes
            .iter()
            .map(|h| BlockHash::from_slice(h).ok_or_else(|| invalid("bad hash")))
            .collect::<Result<Vec<_>, _>>()?;
        let meta = self.meta.clone();
        let missing = blocking(move || Ok(meta.blocks().missing(&hashes)?)).await?;
        Ok(Response::new(MissingBlocksResponse {
            hashes: missing.iter().map(|h| h.0.to_vec()).collect(),
            ticket: self.ticket(&Grant::Write, ticket::WRITE_TTL),
        }))
    }

    async fn publish(
        &self,
        req: Request<PublishRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let caller = principal(&req)?;
        let r = req.into_inner();
        let key = parse_key(&r.key)?;
        let locale = r.locale();
        if locale == Locale::Local {
            caller.may_name_node(&r.origin_node)?;
        }
        let change = self.change(&ns, vec![key.to_string()]);
        let since = self.watchers.now();
        let inline = checked_inline(r.inline_blocks)?;
        let mut stored = false;
        let mut base_manifest = None;
        let manifest = match (r.manifest, r.patch) {
            (Some(m), None) => m,
            (None, Some(p)) if locale == Locale::Store => {
                let (meta, ns, key, ttl) = (self.meta.clone(), ns.clone(), key.clone(), r.ttl_secs);
                let base = r.base_version;
                // The inline blocks first: a patch may name them, and the check of the patched
                // manifest's blocks needs them stored.
                let inline = inline.clone();
                let patched = blocking(move || {
                    for (hash, data) in &inline {
                        meta.blocks().put(hash, data)?;
                    }
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
        let meta = self.meta.clone();
        let at = ns.clone();
        let version = blocking(move || {
            let ns = at;
            for (hash, data) in inline.iter().filter(|_| !stored) {
                meta.blocks().put(hash, data)?;
            }
            let version = meta.publish_over(
                &ns,
                &key,
                &manifest,
                base_manifest.as_ref(),
                locale,
                &r.origin_node,
                r.ttl_secs,
                r.force,
            )?;
            let parent = key.as_str().rsplit_once('/').map(|(p, _)| p);
            let parent = parent.map(KeyPath::parse).transpose().ok().flatten();
            let dir = meta.list_dir_only(&ns, parent.as_ref())?.dir;
            let entry = meta.list_dir_only(&ns, Some(&key))?.dir;
            Ok::<_, crate::meta::MetaError>((version, dir, entry))
        })
        .await?;
        let (version, parent, entry) = version;
        // The maker keeps the entries it is answered (its listing takes the new one).
        self.watchers
            .hold(ns.as_str(), r.watcher, since, with_parents(&change.paths))
            .await;
        self.tell_except(change, r.watcher).await;
        tracing::debug!(key = %r.key, %version, ?locale, "published");
        Ok(Response::new(PublishResponse {
            version: version.0.to_vec(),
            parent,
            entry,
        }))
    }

    async fn publish_batch(
        &self,
        req: Request<PublishBatchRequest>,
    ) -> Result<Response<PublishBatchResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
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
        let change = self.change(&ns, keys);
        let since = self.watchers.now();
        let meta = self.meta.clone();
        let nsb = ns.clone();
        let results = blocking(move || Ok(publish_items(&meta, &nsb, checked))).await?;
        self.watchers
            .hold(ns.as_str(), r.watcher, since, with_parents(&change.paths))
            .await;
        self.tell_except(change, r.watcher).await;
        tracing::info!(namespace = %ns, items = results.len(), "published a batch");
        Ok(Response::new(PublishBatchResponse { results }))
    }

    async fn publish_gpu(
        &self,
        req: Request<PublishGpuRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let key = parse_key(&r.key)?;
        let mut gpu = r.gpu.ok_or_else(|| invalid("gpu key missing"))?;
        // Issued in each answer, never kept (nor taken from a caller).
        gpu.secret.clear();
        let meta = self.meta.clone();
        let node = gpu.publisher_node.clone();
        let change = self.change(&ns, vec![key.to_string()]);
        let version = blocking(move || meta.publish_gpu(&ns, &key, gpu)).await?;
        self.tell(change).await;
        tracing::info!(key = %r.key, %version, %node, "published a GPU key");
        Ok(Response::new(PublishResponse {
            version: version.0.to_vec(),
            parent: None,
            entry: None,
        }))
    }

    async fn resolve(
        &self,
        req: Request<ResolveRequest>,
    ) -> Result<Response<ResolveResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let key = parse_key(&r.key)?;
        let meta = self.meta.clone();
        let since = self.watchers.now();
        let (at, asked) = (ns.clone(), key.to_string());
        let mut resp = blocking(move || resolve_key(&meta, &at, &key, r.inline_up_to)).await?;
        self.watchers
            .hold(ns.as_str(), r.watcher, since, vec![asked])
            .await;
        self.grant_read(&ns, &mut resp);
        Ok(Response::new(resp))
    }

    async fn resolve_many(
        &self,
        req: Request<ResolveManyRequest>,
    ) -> Result<Response<ResolveManyResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        if r.keys.len() > MAX_RESOLVE_MANY {
            return Err(invalid(format!(
                "{} keys in one call; at most {MAX_RESOLVE_MANY}",
                r.keys.len()
            )));
        }
        let meta = self.meta.clone();
        let (watcher, at) = (r.watcher, ns.clone());
        let asked: Vec<Option<String>> = r
            .keys
            .iter()
            .map(|k| parse_key(k).ok().map(|k| k.to_string()))
            .collect();
        let since = self.watchers.now();
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
        self.watchers.hold(ns.as_str(), watcher, since, held).await;
        for found in results.iter_mut().filter_map(|r| r.resolved.as_mut()) {
            self.grant_read(&ns, found);
        }
        Ok(Response::new(ResolveManyResponse { results }))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let prefix = KeyPath::parse_prefix(&r.prefix).map_err(|e| invalid(e.to_string()))?;
        let meta = self.meta.clone();
        let (watcher, recursive, at) = (r.watcher, r.recursive, ns.clone());
        let listed = prefix.as_ref().map_or_else(String::new, |p| p.to_string());
        let since = self.watchers.now();
        let listing = blocking(move || {
            let ns = at;
            if r.dir_only {
                return meta.list_dir_only(&ns, prefix.as_ref());
            }
            let mut l = meta.list(&ns, prefix.as_ref(), r.recursive)?;
            if r.ahead > 0 && !r.recursive && l.exists {
                let budget = (r.ahead as usize).min(LIST_AHEAD_MAX);
                l.ahead =
                    meta.listings_ahead(&ns, prefix.as_ref(), &l, budget, LIST_AHEAD_BYTES)?;
            }
            Ok(l)
        })
        .await?;
        // A recursive listing is not one a mount keeps.
        if !recursive {
            let held = std::iter::once(listed)
                .chain(listing.ahead.iter().map(|l| l.path.clone()))
                .collect();
            self.watchers.hold(ns.as_str(), watcher, since, held).await;
        }
        Ok(Response::new(listing))
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let key = parse_key(&r.key)?;
        let meta = self.meta.clone();
        let mut change = self.change(&ns, Vec::new());
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
            self.tell_except(change, watcher).await;
        }
        tracing::info!(count = removed.len(), "removed keys");
        Ok(Response::new(RemoveResponse { removed }))
    }

    async fn rename(
        &self,
        req: Request<RenameRequest>,
    ) -> Result<Response<RenameResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let (from, to) = (parse_key(&r.from)?, parse_key(&r.to)?);
        let meta = self.meta.clone();
        let change = self.change(&ns, vec![from.to_string(), to.to_string()]);
        blocking(move || meta.rename(&ns, &from, &to, r.no_replace)).await?;
        self.tell_except(change, r.watcher).await;
        Ok(Response::new(RenameResponse {}))
    }

    async fn exchange(
        &self,
        req: Request<ExchangeRequest>,
    ) -> Result<Response<RenameResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let (a, b) = (parse_key(&r.a)?, parse_key(&r.b)?);
        let meta = self.meta.clone();
        let change = self.change(&ns, vec![a.to_string(), b.to_string()]);
        blocking(move || meta.exchange(&ns, &a, &b)).await?;
        self.tell_except(change, r.watcher).await;
        Ok(Response::new(RenameResponse {}))
    }

    async fn link(&self, req: Request<LinkRequest>) -> Result<Response<LinkResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let (from, to) = (parse_key(&r.from)?, parse_key(&r.to)?);
        let meta = self.meta.clone();
        let change = self.change(&ns, vec![from.to_string(), to.to_string()]);
        blocking(move || meta.link(&ns, &from, &to)).await?;
        self.tell_except(change, r.watcher).await;
        Ok(Response::new(LinkResponse {}))
    }

    async fn set_attr(
        &self,
        req: Request<SetAttrRequest>,
    ) -> Result<Response<SetAttrResponse>, Status> {
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let key = parse_key(&r.key)?;
        let mtime = r.mtime_sec.map(|s| (s, r.mtime_nsec.min(999_999_999)));
        let meta = self.meta.clone();
        let change = self.change(&ns, vec![key.to_string()]);
        let watcher = r.watcher;
        blocking(move || meta.set_attr(&ns, &key, r.mode, mtime, (r.uid, r.gid))).await?;
        self.tell_except(change, watcher).await;
        Ok(Response::new(SetAttrResponse {}))
    }

    async fn join_broadcast(
        &self,
        req: Request<JoinRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        let remote_ip = req.remote_addr().map(|a| a.ip().to_string());
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        let version = parse_version(&r.version)?;
        let seeds = self.seeds(&r.namespace, &r.key, &r.version).await?;
        let mut spec = r.window.clone().unwrap_or_default();
        if spec.group_id.is_empty() {
            spec.group_id = rpc::default_group(&r.namespace, &r.key);
        }
        spec.group_id = rpc::scope_group(ns.as_str(), &spec.group_id);
        let group = spec.group_id.clone();
        let zone = self
            .meta
            .live_node(&r.node_id)
            .map(|n| n.zone)
            .unwrap_or_default();
        let joiner = Joiner {
            node_id: r.node_id.clone(),
            zone,
            ip: if r.ip.is_empty() {
                remote_ip.unwrap_or_default()
            } else {
                r.ip.clone()
            },
            role: r.role(),
            version: Some(version),
            serves: r.serves && !r.node_id.is_empty(),
            reads: r.reads,
        };
        let joined = {
            let live = self.live();
            self.windows()
                .join(spec, joiner, &seeds, &live, self.clock.now())?
        };
        self.joined.notify_waiters();
        tracing::info!(
            group = %group,
            member = joined.member,
            node = %r.node_id,
            parent = ?joined.parent.as_ref().map(|p| p.node_id.clone()),
            closed = joined.window.closed,
            "joined broadcast"
        );
        let mut window = joined.window;
        let mut deadline = joined.deadline;
        while r.wait_quorum && !window.closed {
            let woken = self.joined.notified();
            match deadline {
                Some(d) => {
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep_until(d.into()) => {}
                    }
                }
                None => woken.await,
            }
            let Some((w, d)) = self.windows().window(&group, self.clock.now()) else {
                return Err(to_status(
                    Fault::NotFound,
                    format!("window {group} expired"),
                ));
            };
            window = w;
            deadline = d;
        }
        // Only a getter that may swarm costs a manifest read (a mount's reader joins at every
        // open).
        let may_swarm = window
            .spec
            .as_ref()
            .is_some_and(|s| self.windows().may_swarm(s, r.serves));
        let pieces = if r.role() == Role::Getter && may_swarm {
            self.swarm_join(&group, &window, joined.member, version, &seeds)
                .await
        } else {
            SwarmPieces::default()
        };
        Ok(Response::new(JoinResponse {
            window: Some(window),
            member: joined.member,
            parent: joined.parent,
            pieces: pieces.hashes,
            block_lens: pieces.lens,
            piece_log2: u32::from(pieces.log2),
        }))
    }

    async fn swarm_sync(
        &self,
        req: Request<SwarmSyncRequest>,
    ) -> Result<Response<SwarmSyncReply>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let r = req.into_inner();
        let key = (r.group_id.clone(), r.generation, r.member);
        let wait = std::time::Duration::from_millis(u64::from(r.wait_ms)).min(SWARM_WAIT_MAX);
        let (reply, woken, waiter) = {
            let live = self.live();
            let mut windows = self.windows();
            let (reply, woken) = windows.swarm_sync(&r, &live, self.clock.now())?;
            // Registered while the windows are locked, so that fetches chosen for this member
            // by a sync that follows find it waiting.
            let waiter = (reply.fetch.is_empty() && r.idle > 0 && !wait.is_zero()).then(|| {
                let n = Arc::new(tokio::sync::Notify::new());
                locks::lock(&self.swarm_waits).insert(key.clone(), n.clone());
                n
            });
            (reply, woken, waiter)
        };
        {
            let waits = locks::lock(&self.swarm_waits);
            for m in woken {
                if let Some(n) = waits.get(&(r.group_id.clone(), r.generation, m)) {
                    n.notify_one();
                }
            }
        }
        let Some(waiter) = waiter else {
            return Ok(Response::new(reply));
        };
        // Unregistered however the wait ends, a caller that went away included.
        let _registered = SwarmWait {
            waits: &self.swarm_waits,
            key,
            notify: waiter.clone(),
        };
        let _ = tokio::time::timeout(wait, waiter.notified()).await;
        let live = self.live();
        let mail = self
            .windows()
            .swarm_mail(&r.group_id, r.generation, r.member, &live);
        Ok(Response::new(mail))
    }

    async fn new_parent(
        &self,
        req: Request<NewParentRequest>,
    ) -> Result<Response<NewParentResponse>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let r = req.into_inner();
        let parent = {
            let live = self.live();
            self.windows().new_parent(
                &r.group_id,
                r.generation,
                r.member,
                &r.failed_parent,
                r.unreachable,
                &live,
                self.clock.now(),
            )?
        };
        tracing::info!(
            group = %r.group_id,
            member = r.member,
            failed = %r.failed_parent,
            unreachable = r.unreachable,
            parent = ?parent.as_ref().map(|p| p.node_id.clone()),
            "new parent"
        );
        Ok(Response::new(NewParentResponse { parent }))
    }

    async fn leave_broadcast(
        &self,
        req: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let r = req.into_inner();
        self.windows().leave(
            &r.group_id,
            r.generation,
            r.member,
            r.done,
            self.clock.now(),
        )?;
        Ok(Response::new(LeaveResponse {}))
    }

    async fn get_window(&self, req: Request<GetWindowRequest>) -> Result<Response<Window>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let group = req.into_inner().group_id;
        let (w, _) = self
            .windows()
            .window(&group, self.clock.now())
            .ok_or_else(|| to_status(Fault::NotFound, format!("no broadcast window {group}")))?;
        Ok(Response::new(w))
    }

    async fn join_gpu_window(
        &self,
        req: Request<GpuJoinRequest>,
    ) -> Result<Response<GpuJoinResponse>, Status> {
        let remote_ip = req.remote_addr().map(|a| a.ip().to_string());
        let ns = namespace_for(&req, &req.get_ref().namespace)?;
        let r = req.into_inner();
        parse_key(&r.key)?;
        let mut spec = r.window.clone().unwrap_or_default();
        if spec.group_id.is_empty() {
            spec.group_id = rpc::default_gpu_group(&r.namespace, &r.key);
        }
        spec.group_id = rpc::scope_group(ns.as_str(), &spec.group_id);
        let role = r.role();
        let joiner = GpuJoiner {
            node_id: r.node_id.clone(),
            ip: if r.ip.is_empty() {
                remote_ip.unwrap_or_default()
            } else {
                r.ip.clone()
            },
            role,
            worker_addr: r.worker_addr,
            registration: r.registration,
            digest: r.table_digest,
            table_json: r.table_json,
            flags: r.flags,
            unique_id: r.unique_id,
            nccl: r.nccl,
            // Compared with other members' keys only; bounded, so a window's plan is too.
            comms: r
                .comms
                .into_iter()
                .filter(|c| c.key.len() == 32)
                .take(crate::broadcast::windows::comms::MAX_HELD)
                .collect(),
        };
        let ((window, _), member) = {
            let alive = self.alive();
            self.gpu_windows()
                .join(spec, joiner, &alive, self.clock.now())?
        };
        self.gpu_changed.notify_waiters();
        tracing::info!(
            group = %window.group_id,
            member,
            node = %r.node_id,
            ?role,
            closed = window.closed,
            "joined GPU window"
        );
        Ok(Response::new(GpuJoinResponse {
            window: Some(self.gpu_window_for_members(window)),
            member,
        }))
    }

    async fn await_gpu_window(
        &self,
        req: Request<GpuAwaitRequest>,
    ) -> Result<Response<GpuWindow>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let r = req.into_inner();
        let wait = std::time::Duration::from_millis(u64::from(r.wait_ms)).min(GPU_AWAIT_MAX);
        let until = tokio::time::Instant::now() + wait;
        loop {
            // Armed before the look, so a change between the look and the wait is not lost.
            let changed = self.gpu_changed.notified();
            let (w, deadline) = {
                let alive = self.alive();
                self.gpu_windows()
                    .view(&r.group_id, r.generation, &alive, self.clock.now())?
            };
            let ready = if r.until_finished {
                crate::rpc::gpu_window::getters_finished(&w) || !w.error.is_empty()
            } else {
                w.closed
            };
            if ready || tokio::time::Instant::now() >= until {
                return Ok(Response::new(self.gpu_window_for_members(w)));
            }
            let wake = deadline.map_or(until, |d| until.min(d.into()));
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    async fn finish_gpu_window(
        &self,
        req: Request<GpuFinishRequest>,
    ) -> Result<Response<GpuFinishResponse>, Status> {
        window_for(&req, &req.get_ref().group_id)?;
        let r = req.into_inner();
        self.gpu_windows().finish(
            &r.group_id,
            r.generation,
            r.member,
            &r.error,
            self.clock.now(),
        )?;
        self.gpu_changed.notify_waiters();
        tracing::info!(group = %r.group_id, member = r.member, error = %r.error, "GPU window member finished");
        Ok(Response::new(GpuFinishResponse {}))
    }

    async fn add_location(
        &self,
        req: Request<AddLocationRequest>,
    ) -> Result<Response<AddLocationResponse>, Status> {
        let caller = principal(&req)?;
        let r = req.into_inner();
        caller.may_act_for_node(&r.node_id)?;
        let version = parse_version(&r.version)?;
        let meta = self.meta.clone();
        blocking(move || meta.add_location(&version, &r.node_id)).await?;
        Ok(Response::new(AddLocationResponse {}))
    }

    async fn version_blocks(
        &self,
        req: Request<VersionBlocksRequest>,
    ) -> Result<Response<VersionBlocksResponse>, Status> {
        principal(&req)?.may_be_a_node()?;
        let version = parse_version(&req.into_inner().version)?;
        let meta = self.meta.clone();
        let set = blocking(move || super::tickets::blocks_of(&meta, &version)).await?;
        Ok(Response::new(match set {
            None => VersionBlocksResponse::default(),
            Some(set) => VersionBlocksResponse {
                found: true,
                hashes: set.iter().flat_map(|h| h.0).collect(),
            },
        }))
    }
}
