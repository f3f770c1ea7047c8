//! The store server: metadata and the central block store, behind the gRPC control plane and
//! the data plane on one port.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::blockfiles::BlockFiles;
use crate::broadcast::{self, BroadcastError, Broadcasts, Joiner, NodeView, Seed};
use crate::dataplane::{BlockServe, Served};
use crate::db::Db;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::meta::{MetaError, MetaStore, CF_BLOCKS, FAMILIES};
use crate::proto::store_server::{Store, StoreServer};
use crate::proto::*;

pub const DEFAULT_PORT: u16 = 7447;
/// How long a node stays a source without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// gRPC metadata key carrying the errno a filesystem should report for a failed call.
pub const ERRNO_KEY: &str = "kt-errno";

impl From<MetaError> for Status {
    fn from(e: MetaError) -> Self {
        let msg = e.to_string();
        let (mut status, errno) = match e {
            MetaError::NotFound(_) => (Status::not_found(msg), libc::ENOENT),
            MetaError::Exists(_) => (Status::already_exists(msg), libc::EEXIST),
            MetaError::NotEmpty(_) => (Status::failed_precondition(msg), libc::ENOTEMPTY),
            MetaError::NotDir(_) => (Status::failed_precondition(msg), libc::ENOTDIR),
            MetaError::IsDir(_) => (Status::failed_precondition(msg), libc::EISDIR),
            MetaError::Conflict(_) | MetaError::MissingBlocks(_) => {
                (Status::failed_precondition(msg), libc::EIO)
            }
            MetaError::BadRequest(_) | MetaError::Manifest(_) => {
                (Status::invalid_argument(msg), libc::EINVAL)
            }
            MetaError::Blocks(ref io) if io.raw_os_error() == Some(libc::ENOSPC) => {
                tracing::error!(error = %msg, "store failure");
                (Status::resource_exhausted(msg), libc::ENOSPC)
            }
            MetaError::Db(_) | MetaError::Corrupt(_) | MetaError::Blocks(_) => {
                tracing::error!(error = %msg, "store failure");
                (Status::internal(msg), libc::EIO)
            }
        };
        if let Ok(v) = errno.to_string().parse() {
            status.metadata_mut().insert(ERRNO_KEY, v);
        }
        status
    }
}

fn parse_ns(ns: &str) -> Result<Namespace, Status> {
    if ns.is_empty() {
        return Ok(Namespace::default());
    }
    Namespace::parse(ns).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn parse_key(key: &str) -> Result<KeyPath, Status> {
    KeyPath::parse(key).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn parse_version(v: &[u8]) -> Result<Version, Status> {
    Version::from_slice(v).ok_or_else(|| Status::invalid_argument("version must be 32 bytes"))
}

/// Runs blocking store work off the async threads.
/// Most bytes of blocks one publish may carry inline.
pub const MAX_INLINE_BYTES: usize = 1 << 20;

/// Inline blocks of a publish, each checked against its hash.
fn checked_inline(blocks: Vec<InlineBlock>) -> Result<Vec<(BlockHash, Vec<u8>)>, Status> {
    let total: usize = blocks.iter().map(|b| b.data.len()).sum();
    if total > MAX_INLINE_BYTES {
        return Err(Status::invalid_argument(format!(
            "{total} bytes of inline blocks exceed the limit of {MAX_INLINE_BYTES}; upload them on the data plane"
        )));
    }
    blocks
        .into_iter()
        .map(|b| {
            let hash = BlockHash::from_slice(&b.hash)
                .ok_or_else(|| Status::invalid_argument("inline block: bad hash"))?;
            if BlockHash::of(&b.data) != hash {
                return Err(Status::invalid_argument(format!(
                    "inline block {} does not match its hash",
                    hash.hex()
                )));
            }
            Ok((hash, b.data))
        })
        .collect()
}

/// Largest file whose blocks a resolve sends inline.
pub const MAX_INLINE_FILE: u32 = 64 << 10;

/// The blocks of a small one-file manifest, if the caller wants them and they are all small
/// blocks in the database (never a block file: those go on the data plane).
fn inline_file(meta: &MetaStore, m: &Manifest, up_to: u32) -> Result<Vec<InlineBlock>, MetaError> {
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
        match meta.block(&hash)? {
            Some(Served::Bytes(data)) => out.push(InlineBlock {
                hash: b.hash.clone(),
                data: data.to_vec(),
            }),
            _ => return Ok(Vec::new()),
        }
    }
    Ok(out)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MetaError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(Status::from)
}

/// The gRPC handler; sockets and shutdown belong to [`StoreServerProcess`].
pub struct StoreHandler {
    meta: Arc<MetaStore>,
    windows: Arc<std::sync::Mutex<Broadcasts>>,
    /// Wakes putters waiting for a quorum whenever someone joins.
    joined: Arc<tokio::sync::Notify>,
}

impl From<BroadcastError> for Status {
    fn from(e: BroadcastError) -> Self {
        match e {
            BroadcastError::NoWindow(_) | BroadcastError::NoMember(..) => {
                Status::not_found(e.to_string())
            }
            BroadcastError::Bad(_) => Status::invalid_argument(e.to_string()),
        }
    }
}

impl StoreHandler {
    fn windows(&self) -> Result<std::sync::MutexGuard<'_, Broadcasts>, Status> {
        self.windows
            .lock()
            .map_err(|_| Status::internal("broadcast state poisoned"))
    }

    fn live(&self) -> impl Fn(&str) -> Option<NodeView> + '_ {
        |n: &str| {
            self.meta.live_node(n).map(|i| NodeView {
                data_addr: i.data_addr,
                zone: i.zone,
            })
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
    async fn register_node(
        &self,
        req: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeResponse>, Status> {
        let node = req
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("node missing"))?;
        if node.node_id.is_empty() || node.data_addr.parse::<SocketAddr>().is_err() {
            return Err(Status::invalid_argument(
                "node needs an id and a data address ip:port",
            ));
        }
        tracing::info!(node = %node.node_id, addr = %node.data_addr, "node registered");
        self.meta.register_node(node);
        Ok(Response::new(RegisterNodeResponse {
            lease_secs: self.meta.lease().as_secs() as u32,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let known = self.meta.heartbeat(&req.into_inner().node_id);
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn missing_blocks(
        &self,
        req: Request<MissingBlocksRequest>,
    ) -> Result<Response<MissingBlocksResponse>, Status> {
        let hashes = req
            .into_inner()
            .hashes
            .iter()
            .map(|h| BlockHash::from_slice(h).ok_or_else(|| Status::invalid_argument("bad hash")))
            .collect::<Result<Vec<_>, _>>()?;
        let meta = self.meta.clone();
        let missing = blocking(move || meta.missing_blocks(&hashes)).await?;
        Ok(Response::new(MissingBlocksResponse {
            hashes: missing.iter().map(|h| h.0.to_vec()).collect(),
        }))
    }

    async fn publish(
        &self,
        req: Request<PublishRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let key = parse_key(&r.key)?;
        let locale = r.locale();
        let manifest = r
            .manifest
            .ok_or_else(|| Status::invalid_argument("manifest missing"))?;
        let inline = checked_inline(r.inline_blocks)?;
        let meta = self.meta.clone();
        let version = blocking(move || {
            for (hash, data) in &inline {
                meta.put_block(hash, data)?;
            }
            meta.publish(
                &ns,
                &key,
                &manifest,
                locale,
                &r.origin_node,
                r.ttl_secs,
                r.force,
            )
        })
        .await?;
        tracing::info!(key = %r.key, %version, ?locale, "published");
        Ok(Response::new(PublishResponse {
            version: version.0.to_vec(),
        }))
    }

    async fn resolve(
        &self,
        req: Request<ResolveRequest>,
    ) -> Result<Response<ResolveResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let key = parse_key(&r.key)?;
        let meta = self.meta.clone();
        let resp = blocking(move || {
            let found = meta.resolve(&ns, &key)?;
            let version = Version::from_slice(&found.record.version)
                .ok_or_else(|| MetaError::Corrupt("version".into()))?;
            let sources = meta.sources(&version, &found.record)?;
            let rec = found.record;
            let inline_blocks = if rec.locale() == Locale::Store {
                inline_file(&meta, &found.manifest, r.inline_up_to)?
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
            })
        })
        .await?;
        Ok(Response::new(resp))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let prefix = KeyPath::parse_prefix(&r.prefix)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let meta = self.meta.clone();
        let (entries, exists) =
            blocking(move || meta.list(&ns, prefix.as_ref(), r.recursive)).await?;
        Ok(Response::new(ListResponse { entries, exists }))
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let key = parse_key(&r.key)?;
        let meta = self.meta.clone();
        let removed = blocking(move || meta.remove(&ns, &key, r.recursive, r.prefix)).await?;
        tracing::info!(count = removed.len(), "removed keys");
        Ok(Response::new(RemoveResponse { removed }))
    }

    async fn rename(
        &self,
        req: Request<RenameRequest>,
    ) -> Result<Response<RenameResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let (from, to) = (parse_key(&r.from)?, parse_key(&r.to)?);
        let meta = self.meta.clone();
        blocking(move || meta.rename(&ns, &from, &to, r.no_replace)).await?;
        Ok(Response::new(RenameResponse {}))
    }

    async fn set_attr(
        &self,
        req: Request<SetAttrRequest>,
    ) -> Result<Response<SetAttrResponse>, Status> {
        let r = req.into_inner();
        let ns = parse_ns(&r.namespace)?;
        let key = parse_key(&r.key)?;
        let mtime = r.mtime_sec.map(|s| (s, r.mtime_nsec.min(999_999_999)));
        let meta = self.meta.clone();
        blocking(move || meta.set_attr(&ns, &key, r.mode, mtime)).await?;
        Ok(Response::new(SetAttrResponse {}))
    }

    async fn join_broadcast(
        &self,
        req: Request<JoinRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        let remote_ip = req.remote_addr().map(|a| a.ip().to_string());
        let r = req.into_inner();
        let version = parse_version(&r.version)?;
        let seeds = self.seeds(&r.namespace, &r.key, &r.version).await?;
        let mut spec = r.window.clone().unwrap_or_default();
        if spec.group_id.is_empty() {
            spec.group_id = broadcast::default_group(&r.namespace, &r.key);
        }
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
        };
        let joined = {
            let live = self.live();
            self.windows()?
                .join(spec, joiner, &seeds, &live, Instant::now())?
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
            let Some((w, d)) = self.windows()?.window(&group, Instant::now()) else {
                return Err(Status::not_found(format!("window {group} expired")));
            };
            window = w;
            deadline = d;
        }
        Ok(Response::new(JoinResponse {
            window: Some(window),
            member: joined.member,
            parent: joined.parent,
        }))
    }

    async fn new_parent(
        &self,
        req: Request<NewParentRequest>,
    ) -> Result<Response<NewParentResponse>, Status> {
        let r = req.into_inner();
        let parent = {
            let live = self.live();
            self.windows()?.new_parent(
                &r.group_id,
                r.generation,
                r.member,
                &r.failed_parent,
                r.unreachable,
                &live,
                Instant::now(),
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
        let r = req.into_inner();
        self.windows()?
            .leave(&r.group_id, r.generation, r.member, r.done, Instant::now())?;
        Ok(Response::new(LeaveResponse {}))
    }

    async fn get_window(&self, req: Request<GetWindowRequest>) -> Result<Response<Window>, Status> {
        let group = req.into_inner().group_id;
        let (w, _) = self
            .windows()?
            .window(&group, Instant::now())
            .ok_or_else(|| Status::not_found(format!("no broadcast window {group}")))?;
        Ok(Response::new(w))
    }

    async fn add_location(
        &self,
        req: Request<AddLocationRequest>,
    ) -> Result<Response<AddLocationResponse>, Status> {
        let r = req.into_inner();
        let version = parse_version(&r.version)?;
        let meta = self.meta.clone();
        blocking(move || meta.add_location(&version, &r.node_id)).await?;
        Ok(Response::new(AddLocationResponse {}))
    }
}

/// The central block store, served on the data plane. Uploads are verified against their hash
/// by the data plane before they get here.
struct StoreBlocks {
    meta: Arc<MetaStore>,
}

impl BlockServe for StoreBlocks {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, String> {
        self.meta.block(hash).map_err(|e| e.to_string())
    }

    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), String> {
        self.meta.put_block(hash, &data).map_err(|e| e.to_string())
    }
}

/// A bound store server, ready to run.
pub struct StoreServerProcess {
    listener: TcpListener,
    meta: Arc<MetaStore>,
}

impl StoreServerProcess {
    pub async fn bind(listen: &str, data_dir: &Path, lease: Duration) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        let db = Db::open(&data_dir.join("meta.rocksdb"), FAMILIES, &[CF_BLOCKS])?;
        let files = BlockFiles::open(&data_dir.join("blocks"))
            .map_err(|e| anyhow::anyhow!("block directory in {}: {e}", data_dir.display()))?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
        let meta = MetaStore::new(db, files, lease);
        meta.index_blocks()?;
        Ok(StoreServerProcess {
            listener,
            meta: Arc::new(meta),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let handler = StoreHandler {
            meta: self.meta.clone(),
            windows: Default::default(),
            joined: Default::default(),
        };
        let svc = StoreServer::new(handler)
            .max_decoding_message_size(crate::net::MAX_RPC_MESSAGE)
            .max_encoding_message_size(crate::net::MAX_RPC_MESSAGE);
        let router = tonic::transport::Server::builder().add_service(svc);
        let blocks = Arc::new(StoreBlocks {
            meta: self.meta.clone(),
        });
        crate::net::serve(self.listener, Some(router), blocks, shutdown).await?;
        self.meta.db().flush()?;
        Ok(())
    }
}
