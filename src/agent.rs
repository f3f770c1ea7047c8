//! The node agent: this node's block cache and in-place sources, its peer server, its lease with
//! the store server, and the unix socket on which local CLIs publish and seed.
//!
//! Blocks are served by hash, only from what this agent holds: its cache, and files registered
//! as holding the blocks of a version it published or fetched. A registered file is served in
//! place, with no copy; before its bytes go out, the agent checks the file's size and mtime and
//! the block's hash, so a file changed after publishing is never served as the published block.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::cache::{BlockCache, CF_CACHE, CF_CACHE_INDEX};
use crate::client::{self, ClientError};
use crate::dataplane::{BlockServe, Pending, Served};
use crate::db::{BatchOp, Db};
use crate::fs::inode::CF_INODES;
use crate::fs::FsConfig;
use crate::hash::{BlockHash, Version};
use crate::hosted::HostedMounts;
use crate::inflight::{Inflight, Place, PENDING_WAIT};
use crate::keeper::KeeperClient;
use crate::key::Namespace;
use crate::manifest::{self, EntryKind, Manifest};
use crate::mount::Stop;
use crate::proto::agent_server::{Agent, AgentServer};
use crate::proto::*;

pub const CF_LOCAL: &str = "local";
/// Per-directory settings of the mount (`user.kt.locale`).
pub const CF_XATTR: &str = "xattr";
const FAMILIES: &[&str] = &[CF_CACHE, CF_CACHE_INDEX, CF_LOCAL, CF_XATTR, CF_INODES];

pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// How this agent is set up.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub server: String,
    pub listen: String,
    /// The address peers reach this agent on; the bound address when `None`.
    pub advertise: Option<String>,
    pub cache_dir: PathBuf,
    /// Byte budget of the block cache.
    pub cache_size: u64,
    pub socket: PathBuf,
    pub node_id: String,
    pub zone: String,
    pub heartbeat: Duration,
    /// Mount namespaces in this process on request over the socket (`kt attach`).
    pub host_mounts: bool,
    /// The FUSE device keeper this agent runs under (`kt keeper`): hosted mounts are handed to
    /// it and taken back from it at start.
    pub fd_keeper: Option<PathBuf>,
}

impl AgentConfig {
    /// The filesystem of `namespace` as this agent's node sees it.
    pub fn fs_config(
        &self,
        namespace: Namespace,
        locale: Locale,
        read_only: bool,
        fanout: u32,
    ) -> FsConfig {
        FsConfig {
            server: self.server.clone(),
            namespace,
            locale,
            read_only,
            node_id: self.node_id.clone(),
            zone: self.zone.clone(),
            fanout,
            staging: self.cache_dir.join("staging"),
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
        }
    }
}

/// What this agent holds and serves to peers: its block cache and its in-place files.
pub struct AgentBlocks {
    db: Db,
    cache: Arc<BlockCache>,
    inflight: Arc<Inflight>,
    bytes_served: AtomicU64,
    blocks_served: AtomicU64,
}

impl AgentBlocks {
    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    fn local_places(&self, hash: &BlockHash) -> Result<Vec<LocalBlock>, String> {
        match self
            .db
            .get(CF_LOCAL, hash.as_bytes())
            .map_err(|e| e.to_string())?
        {
            Some(v) => LocalBlocks::decode(v.as_slice())
                .map(|l| l.places)
                .map_err(|e| e.to_string()),
            None => Ok(Vec::new()),
        }
    }

    /// Registers files on disk as holding the blocks of `m`, in place.
    pub fn register(&self, m: &Manifest, files: &[LocalFile]) -> Result<usize, Status> {
        let mut ops = Vec::new();
        let mut count = 0;
        for f in files {
            let entry = m
                .entries
                .iter()
                .find(|e| e.path == f.entry_path && e.kind() == EntryKind::File)
                .ok_or_else(|| {
                    Status::invalid_argument(format!("no file entry {:?}", f.entry_path))
                })?;
            let disk = Path::new(&f.disk_path);
            if !disk.is_absolute() {
                return Err(Status::invalid_argument("disk paths must be absolute"));
            }
            let meta = std::fs::metadata(disk)
                .map_err(|e| Status::failed_precondition(format!("{}: {e}", disk.display())))?;
            if meta.len() != entry.size {
                return Err(Status::failed_precondition(format!(
                    "{} changed since it was scanned",
                    disk.display()
                )));
            }
            let mut offset = 0u64;
            for b in &entry.blocks {
                let hash =
                    manifest::block_hash(b).ok_or_else(|| Status::invalid_argument("bad hash"))?;
                let mut places = self.local_places(&hash).map_err(Status::internal)?;
                places.retain(|p| p.disk_path != f.disk_path || p.offset != offset);
                places.push(LocalBlock {
                    disk_path: f.disk_path.clone(),
                    offset,
                    len: b.len,
                    file_size: meta.len(),
                    mtime_sec: meta.mtime(),
                    mtime_nsec: meta.mtime_nsec() as u32,
                });
                // Older places first tried; keep the list short.
                if places.len() > 8 {
                    places.remove(0);
                }
                ops.push(BatchOp::Put(
                    CF_LOCAL,
                    hash.0.to_vec(),
                    LocalBlocks { places }.encode_to_vec(),
                ));
                offset += u64::from(b.len);
                count += 1;
            }
        }
        self.db
            .write(ops)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(count)
    }
}

fn read_place(p: &LocalBlock, hash: &BlockHash) -> Option<Bytes> {
    let f = std::fs::File::open(&p.disk_path).ok()?;
    let meta = f.metadata().ok()?;
    if meta.len() != p.file_size
        || meta.mtime() != p.mtime_sec
        || meta.mtime_nsec() as u32 != p.mtime_nsec
    {
        tracing::warn!(path = %p.disk_path, "published file changed on disk; not serving it");
        return None;
    }
    let mut buf = vec![0u8; p.len as usize];
    f.read_exact_at(&mut buf, p.offset).ok()?;
    if BlockHash::of(&buf) != *hash {
        tracing::warn!(path = %p.disk_path, block = %hash, "published file no longer matches its hash; not serving it");
        return None;
    }
    Some(Bytes::from(buf))
}

impl AgentBlocks {
    /// The block from the cache, a local publication or a fetch in flight; not counted as served.
    pub(crate) fn find(&self, hash: &BlockHash) -> Result<Option<Bytes>, String> {
        if let Some(v) = self.cache.get(hash).map_err(|e| e.to_string())? {
            return Ok(Some(v));
        }
        if let Some(v) = self
            .local_places(hash)?
            .iter()
            .find_map(|p| read_place(p, hash))
        {
            return Ok(Some(v));
        }
        Ok(self.inflight.read(hash))
    }
}

impl BlockServe for AgentBlocks {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, String> {
        let got = self.find(hash)?;
        if let Some(b) = &got {
            self.bytes_served
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            self.blocks_served.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got.map(Served::Bytes))
    }

    fn pending(&self, hash: &BlockHash) -> Option<Pending> {
        if !self.inflight.pending(hash) {
            return None;
        }
        let (inflight, hash) = (self.inflight.clone(), *hash);
        Some(Box::pin(async move {
            inflight.wait(&hash, PENDING_WAIT).await;
        }))
    }

    fn put(&self, _hash: &BlockHash, _data: Bytes) -> Result<(), String> {
        Err("this node agent does not take uploads".into())
    }
}

/// The agent's unix-socket service for CLIs on this node.
struct AgentHandler {
    cfg: AgentConfig,
    data_addr: String,
    blocks: Arc<AgentBlocks>,
    hosted: Option<Arc<HostedMounts>>,
}

impl AgentHandler {
    fn hosted(&self) -> Result<&HostedMounts, Status> {
        self.hosted.as_deref().ok_or_else(|| {
            Status::failed_precondition(
                "this agent does not host mounts (start it with --host-mounts)",
            )
        })
    }
}

fn status_of(e: ClientError) -> Status {
    match e {
        ClientError::Rpc(s) => s,
        other => Status::unavailable(other.to_string()),
    }
}

#[tonic::async_trait]
impl Agent for AgentHandler {
    async fn publish_local(
        &self,
        req: Request<PublishLocalRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let r = req.into_inner();
        let mut publish = r
            .publish
            .ok_or_else(|| Status::invalid_argument("publish missing"))?;
        let m = publish
            .manifest
            .clone()
            .ok_or_else(|| Status::invalid_argument("manifest missing"))?;
        manifest::validate(&m).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let blocks = self.blocks.clone();
        let files = r.files;
        let n = tokio::task::spawn_blocking(move || blocks.register(&m, &files))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        publish.locale = Locale::Local as i32;
        publish.origin_node = self.cfg.node_id.clone();
        let mut store = client::connect_store(&self.cfg.server)
            .await
            .map_err(status_of)?;
        let resp = store.publish(publish).await?;
        tracing::info!(blocks = n, "published in place");
        Ok(resp)
    }

    async fn add_source(
        &self,
        req: Request<AddSourceRequest>,
    ) -> Result<Response<AddSourceResponse>, Status> {
        let r = req.into_inner();
        let version = Version::from_slice(&r.version)
            .ok_or_else(|| Status::invalid_argument("bad version"))?;
        let m = r
            .manifest
            .ok_or_else(|| Status::invalid_argument("manifest missing"))?;
        manifest::validate(&m).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let blocks = self.blocks.clone();
        let files = r.files;
        tokio::task::spawn_blocking(move || blocks.register(&m, &files))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        let mut store = client::connect_store(&self.cfg.server)
            .await
            .map_err(status_of)?;
        store
            .add_location(AddLocationRequest {
                version: version.0.to_vec(),
                node_id: self.cfg.node_id.clone(),
            })
            .await?;
        tracing::info!(%version, "seeding");
        Ok(Response::new(AddSourceResponse {}))
    }

    async fn status(
        &self,
        _req: Request<AgentStatusRequest>,
    ) -> Result<Response<AgentStatusResponse>, Status> {
        Ok(Response::new(AgentStatusResponse {
            node_id: self.cfg.node_id.clone(),
            data_addr: self.data_addr.clone(),
            server: self.cfg.server.clone(),
            zone: self.cfg.zone.clone(),
            bytes_served: self.blocks.bytes_served.load(Ordering::Relaxed),
            blocks_served: self.blocks.blocks_served.load(Ordering::Relaxed),
        }))
    }

    async fn mount(&self, req: Request<MountRequest>) -> Result<Response<MountResponse>, Status> {
        let hosted = self.hosted()?;
        let already_mounted = hosted.mount(req.into_inner()).await?;
        Ok(Response::new(MountResponse { already_mounted }))
    }

    async fn unmount(
        &self,
        req: Request<UnmountRequest>,
    ) -> Result<Response<UnmountResponse>, Status> {
        let hosted = self.hosted()?;
        hosted.unmount(&req.into_inner().mountpoint).await?;
        Ok(Response::new(UnmountResponse {}))
    }

    async fn receive(
        &self,
        req: Request<tonic::Streaming<ReceiveEvent>>,
    ) -> Result<Response<ReceiveResponse>, Status> {
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty receive stream"))?;
        let m = first
            .manifest
            .ok_or_else(|| Status::invalid_argument("manifest missing"))?;
        manifest::validate(&m).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let expected = expected_places(&m, &first.files)?;
        let inflight = self.blocks.inflight.clone();
        let offer = OfferGuard(inflight.clone(), inflight.open(expected));
        let ready = |hashes: &[Vec<u8>]| {
            let hashes: Vec<BlockHash> = hashes
                .iter()
                .filter_map(|h| BlockHash::from_slice(h))
                .collect();
            inflight.ready(offer.1, &hashes);
        };
        ready(&first.ready);
        // The offer lasts as long as the getter's stream; a getter that dies ends it.
        while let Ok(Some(ev)) = stream.message().await {
            ready(&ev.ready);
        }
        drop(offer);
        Ok(Response::new(ReceiveResponse {}))
    }
}

/// Ends an offer however its stream ends, a cancelled call included.
struct OfferGuard(Arc<Inflight>, u64);

impl Drop for OfferGuard {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

/// Where each block of the files being received will be.
fn expected_places(
    m: &Manifest,
    files: &[LocalFile],
) -> Result<HashMap<BlockHash, Vec<Place>>, Status> {
    let mut out: HashMap<BlockHash, Vec<Place>> = HashMap::new();
    for f in files {
        if !Path::new(&f.disk_path).is_absolute() {
            return Err(Status::invalid_argument("disk paths must be absolute"));
        }
        let entry = m
            .entries
            .iter()
            .find(|e| e.path == f.entry_path && e.kind() == EntryKind::File)
            .ok_or_else(|| Status::invalid_argument(format!("no file entry {:?}", f.entry_path)))?;
        let file = Arc::new(
            std::fs::File::open(&f.disk_path)
                .map_err(|e| Status::failed_precondition(format!("{}: {e}", f.disk_path)))?,
        );
        let mut offset = 0u64;
        for b in &entry.blocks {
            let hash =
                manifest::block_hash(b).ok_or_else(|| Status::invalid_argument("bad hash"))?;
            out.entry(hash).or_default().push(Place {
                file: file.clone(),
                offset,
                len: b.len,
            });
            offset += u64::from(b.len);
        }
    }
    Ok(out)
}

/// A bound agent, ready to run.
pub struct AgentProcess {
    cfg: AgentConfig,
    listener: TcpListener,
    unix: UnixListener,
    blocks: Arc<AgentBlocks>,
}

impl AgentProcess {
    pub async fn bind(cfg: AgentConfig) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&cfg.cache_dir)?;
        let db = Db::open(&cfg.cache_dir.join("agent.rocksdb"), FAMILIES, &[CF_CACHE])?;
        let cache = Arc::new(BlockCache::open(
            db.clone(),
            &cfg.cache_dir.join("blocks"),
            cfg.cache_size,
        )?);
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
        if let Some(dir) = cfg.socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A socket left by an agent that died is stale; one that answers belongs to a live agent.
        if cfg.socket.exists() {
            if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
                anyhow::bail!("another agent is listening on {}", cfg.socket.display());
            }
            std::fs::remove_file(&cfg.socket)?;
        }
        let unix = UnixListener::bind(&cfg.socket)
            .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", cfg.socket.display()))?;
        Ok(AgentProcess {
            cfg,
            listener,
            unix,
            blocks: Arc::new(AgentBlocks {
                db,
                cache,
                inflight: Default::default(),
                bytes_served: AtomicU64::new(0),
                blocks_served: AtomicU64::new(0),
            }),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn blocks(&self) -> Arc<AgentBlocks> {
        self.blocks.clone()
    }

    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    pub fn data_addr(&self) -> String {
        match &self.cfg.advertise {
            Some(a) => a.clone(),
            None => self.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        }
    }

    /// Registers this node with the store server once, so that a publish right after start
    /// finds it; the heartbeat keeps it registered from then on.
    pub async fn register(&self) -> Result<(), ClientError> {
        let mut store = client::connect_store(&self.cfg.server).await?;
        store
            .register_node(RegisterNodeRequest {
                node: Some(self.node_info()),
            })
            .await?;
        Ok(())
    }

    fn node_info(&self) -> NodeInfo {
        NodeInfo {
            node_id: self.cfg.node_id.clone(),
            data_addr: self.data_addr(),
            zone: self.cfg.zone.clone(),
        }
    }

    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let data_addr = self.data_addr();
        let node = self.node_info();
        let heartbeat = tokio::spawn(heartbeat_loop(
            self.cfg.server.clone(),
            node,
            self.cfg.heartbeat,
        ));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let hosted = self
            .cfg
            .host_mounts
            .then(|| Arc::new(HostedMounts::new(self.cfg.clone(), self.blocks.clone())));
        let keeper = self.cfg.fd_keeper.clone().map(KeeperClient::new);
        if let (Some(h), Some(k)) = (&hosted, &keeper) {
            match h.resume_kept(k.clone()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(mounts = n, "serving the mounts of the previous agent"),
                Err(e) => tracing::error!(error = %e, "could not ask the keeper for its mounts"),
            }
        }
        // Under a keeper, SIGUSR1 hands the mounts over to the next agent instead of
        // unmounting them (an upgrade).
        let handover = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut usr1 = match keeper {
            Some(_) => Some(tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::user_defined1(),
            )?),
            None => None,
        };
        let handler = AgentHandler {
            cfg: self.cfg.clone(),
            data_addr,
            blocks: self.blocks.clone(),
            hosted: hosted.clone(),
        };
        let svc = AgentServer::new(handler)
            .max_decoding_message_size(crate::net::MAX_RPC_MESSAGE)
            .max_encoding_message_size(crate::net::MAX_RPC_MESSAGE);
        let unix = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(self.unix),
                wait(stop_rx.clone()),
            );
        let peer = crate::net::serve(self.listener, None, self.blocks.clone(), wait(stop_rx));
        let handing_over = handover.clone();
        let stopper = async move {
            let usr1 = async {
                match usr1.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = shutdown => {}
                _ = usr1 => handing_over.store(true, std::sync::atomic::Ordering::SeqCst),
            }
            let _ = stop_tx.send(true);
        };
        let (u, p, ()) = tokio::join!(unix, peer, stopper);
        if let Some(h) = hosted {
            if handover.load(std::sync::atomic::Ordering::SeqCst) {
                h.stop_all(Stop::Handover).await;
                heartbeat.abort();
                self.blocks.db.flush()?;
                // The FUSE threads still take requests; leave now rather than let them meet a
                // runtime that is shutting down (errors a reader would see). What they had
                // read and not answered, the kernel resends to the next agent.
                tracing::info!("mounts handed over to the next agent");
                std::process::exit(0);
            }
            h.stop_all(Stop::Unmount).await;
        }
        heartbeat.abort();
        let _ = std::fs::remove_file(&self.cfg.socket);
        self.blocks.db.flush()?;
        u?;
        p?;
        Ok(())
    }
}

/// Keeps this node's lease alive; registers again whenever the server does not know it (first
/// start, or the server restarted).
async fn heartbeat_loop(server: String, node: NodeInfo, every: Duration) {
    let mut registered = false;
    loop {
        match client::connect_store(&server).await {
            Ok(mut store) => loop {
                let ok = if registered {
                    match store
                        .heartbeat(HeartbeatRequest {
                            node_id: node.node_id.clone(),
                        })
                        .await
                    {
                        Ok(r) => {
                            registered = r.into_inner().known;
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
                        Ok(_) => {
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
