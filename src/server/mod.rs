//! The store server: metadata ([`crate::meta`]), broadcast windows ([`crate::broadcast::windows`]) and
//! the central block store ([`crate::blocks::store`]), behind the gRPC control plane
//! ([`handler`], its errors in [`status`], its callers checked by [`auth`]) and the data plane,
//! on one port.

pub mod auth;
mod collect;
mod duties;
mod guard;
mod handler;
mod migrate;
mod patch;
mod ready;
mod role;
mod shards;
mod spec;
mod status;
mod tickets;
pub mod watch;

pub use migrate::{migrate, migrate_back, MigrateError, Migrated};
pub use spec::{MetaSpec, OpenError, StoreSpec};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::auth::ticket::{shared, Gate};
use crate::auth::tls::ServerTls;
use crate::blocks::files::{private_dir, BlockFiles};
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::blocks::BlockError;
use crate::clock::{self, SharedClock};
use crate::db::{Db, DbError};
use crate::meta::engine::{
    BoardReplicas, Elector, EngineError, EtcdNodes, EtcdUrl, Fence, GcBoard, ShardElector,
    Standing, DEFAULT_OWNER_TTL,
};
use crate::meta::{self, MetaError, MetaStore};
use crate::proto::store_server::StoreServer;
use crate::rpc::MAX_RPC_MESSAGE;
use auth::{AuthConfig, Authenticator};
use handler::StoreHandler;

/// Benchmark-only: `tree` makes a window that names its fanout a pipelined tree, as before the
/// swarm took every window (bench/broadcast.sh's herd and store-and-forward ways, and the tests
/// of the tree). Users get the swarm, with fanout as each member's uploads.
pub const BENCH_TOPOLOGY: &str = "KT_BENCH_TOPOLOGY";
/// Benchmark-only: `blocks` makes every swarm trade whole blocks, as before pieces smaller than
/// blocks (bench/broadcast.sh measures what those give).
pub const BENCH_PIECES: &str = "KT_BENCH_PIECES";

/// How often garbage is collected when nothing says otherwise: also the least time a block
/// uploaded for a publish, or a removed version's unread block, is kept.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);

/// What `/metrics` reads of the server's state when scraped.
fn register_gauges(meta: &Arc<MetaStore>, handler: &StoreHandler) {
    use crate::metrics::register_gauge;
    let m = meta.clone();
    register_gauge(
        "kt_nodes_live",
        "Nodes whose lease with the store server holds.",
        Box::new(move || m.live_nodes() as f64),
    );
    let m = meta.clone();
    register_gauge(
        "kt_open_versions",
        "Versions open on live nodes, which garbage collection keeps.",
        Box::new(move || m.open_versions().len() as f64),
    );
    let m = meta.clone();
    register_gauge(
        "kt_meta_commits",
        "Metadata changes acknowledged as durable since the server started.",
        Box::new(move || m.commit_stats().committed as f64),
    );
    let m = meta.clone();
    register_gauge(
        "kt_meta_wal_syncs",
        "Synced metadata batches (one WAL fsync each) since the server started.",
        Box::new(move || m.commit_stats().syncs as f64),
    );
    let w = handler.watchers.clone();
    register_gauge(
        "kt_watchers",
        "Mounts watching a namespace (each holds a lease on what it caches).",
        Box::new(move || w.count() as f64),
    );
    let w = handler.windows.clone();
    register_gauge(
        "kt_windows_open",
        "Broadcast windows whose transfer is not over.",
        Box::new(move || crate::locks::lock(&w).open().0 as f64),
    );
    let w = handler.windows.clone();
    register_gauge(
        "kt_window_members",
        "Members of the open broadcast windows.",
        Box::new(move || crate::locks::lock(&w).open().1 as f64),
    );
    let w = handler.swarm_waits.clone();
    register_gauge(
        "kt_swarm_waiting_syncs",
        "Swarm members' syncs held open until a fetch is chosen for them.",
        Box::new(move || crate::locks::lock(&w).len() as f64),
    );
}

/// How long a node stays a source without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("data directory {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The shared ticket secret could not be read, or is none (its error names the file).
    #[error("the ticket secret")]
    TicketSecret(#[source] std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Blocks(#[from] BlockError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("serving: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Another replica owns the store now: this one stopped, and serves again only from a
    /// fresh start, as a standby (its memory of the store is not the owner's).
    #[error("this store server lost its claim on the store ({0}); another replica owns it")]
    Deposed(String),
}

/// This machine's name (a pod's, in Kubernetes).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
}

/// How a replica of a store on etcd takes part in electing its owner.
struct Election {
    url: EtcdUrl,
    fence: Arc<Fence>,
}

/// How this server owns its store.
enum Ownership {
    /// From its start, alone: the owner's work runs until the server stops.
    Single(duties::Running),
    /// Through an election; the task answers why the claim was lost, if it was.
    Elected(tokio::task::JoinHandle<Option<String>>),
    /// Shard by shard, through their election, until the server stops.
    Sharded(tokio::task::JoinHandle<()>),
}

/// A bound store server, ready to run.
pub struct StoreServerProcess {
    listener: TcpListener,
    meta: Arc<MetaStore>,
    clock: SharedClock,
    auth: AuthConfig,
    tls: Option<ServerTls>,
    data_dir: std::path::PathBuf,
    gc_every: Option<Duration>,
    /// Where the metadata is on etcd: the owner's election (several replicas may serve).
    election: Option<Election>,
    /// The address clients reach this server at, which a standby names to them.
    advertise: Option<String>,
    owner_ttl: Duration,
    /// A file holding the secret the replicas of a store share, which their ticket keys are
    /// derived from (else each keeps keys of its own in its data directory).
    ticket_secret: Option<std::path::PathBuf>,
    /// Whether the blocks are in an object store every replica reaches.
    shared_blocks: bool,
    /// How many shards the store's namespaces fall into (1: owned whole).
    shards: u32,
}

impl StoreServerProcess {
    /// Opens the store in `data_dir` and binds `listen`, on the machine's clock.
    pub async fn bind(listen: &str, data_dir: &Path, lease: Duration) -> Result<Self, ServerError> {
        Self::bind_with_clock(listen, data_dir, lease, clock::system()).await
    }

    pub async fn bind_with_clock(
        listen: &str,
        data_dir: &Path,
        lease: Duration,
        clock: SharedClock,
    ) -> Result<Self, ServerError> {
        Self::bind_on(listen, data_dir, lease, clock, &StoreSpec::default()).await
    }

    /// Opens the store with its metadata and blocks where `spec` says (by default in
    /// `data_dir`), and binds `listen`.
    pub async fn bind_on(
        listen: &str,
        data_dir: &Path,
        lease: Duration,
        clock: SharedClock,
        spec: &StoreSpec,
    ) -> Result<Self, ServerError> {
        let dir_err = |source| ServerError::DataDir {
            path: data_dir.display().to_string(),
            source,
        };
        private_dir(data_dir).map_err(dir_err)?;
        let mut families = meta::FAMILIES.to_vec();
        families.extend(store::FAMILIES);
        let db = Db::open(&data_dir.join("meta.rocksdb"), &families, &[CF_BLOCKS])?;
        let objects = spec::open_objects(spec).await?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServerError::Listen {
                addr: listen.to_string(),
                source,
            })?;
        let election = match &spec.meta {
            MetaSpec::Local => None,
            MetaSpec::Etcd(url) => Some(Election {
                url: url.clone(),
                fence: Arc::default(),
            }),
        };
        let fence = election.as_ref().map(|e| e.fence.clone());
        let shared_blocks = objects.is_some();
        let (backend, shared) =
            spec::open_backend(spec, db.clone(), objects.clone(), fence).await?;
        let shards = shared.as_ref().map_or(1, |s| s.shards);
        let mut blocks = match &objects {
            Some(o) => StoreBlocks::on_objects(db, o.clone()),
            None => {
                let files = BlockFiles::open(&data_dir.join("blocks")).map_err(dir_err)?;
                StoreBlocks::new(db, files)
            }
        };
        if let Some(shared) = shared {
            blocks = blocks
                .with_references(shared.refs)
                .with_small_blocks(shared.blocks);
        }
        let blocks = Arc::new(blocks);
        blocks.index_old_blocks()?;
        let mut meta = MetaStore::new(backend, blocks, lease, clock.clone());
        if let MetaSpec::Etcd(url) = &spec.meta {
            meta = meta.sharing_nodes(Arc::new(EtcdNodes::new(url)?));
        }
        Ok(StoreServerProcess {
            listener,
            meta: Arc::new(meta),
            clock,
            auth: AuthConfig::default(),
            tls: None,
            data_dir: data_dir.to_path_buf(),
            gc_every: Some(DEFAULT_GC_INTERVAL),
            election,
            advertise: None,
            owner_ttl: DEFAULT_OWNER_TTL,
            ticket_secret: None,
            shared_blocks,
            shards,
        })
    }

    /// The address this server's clients reach it at, where it differs from the one it
    /// listens on (a wildcard, a Service): a replica that stands by names the owner's.
    pub fn with_advertise(mut self, addr: Option<String>) -> Self {
        self.advertise = addr;
        self
    }

    /// How long the owner's claim lives without renewal: a standby takes a dead owner's place
    /// within about this long.
    pub fn with_owner_ttl(mut self, ttl: Duration) -> Self {
        self.owner_ttl = ttl;
        self
    }

    /// Signs tickets with keys derived from the secret in `path`, which every replica of the
    /// store shares, rather than with keys of its own data directory.
    pub fn with_ticket_secret(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.ticket_secret = path;
        self
    }

    /// What this server names itself to the others.
    fn advertised(&self) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        match self.listener.local_addr() {
            Ok(a) if !a.ip().is_unspecified() => a.to_string(),
            Ok(a) => format!("{}:{}", hostname(), a.port()),
            Err(_) => String::new(),
        }
    }

    /// How often garbage is collected (`None`: never).
    pub fn with_gc(mut self, every: Option<Duration>) -> Self {
        self.gc_every = every;
        self
    }

    /// How long collection keeps what it found dead before deleting it (see `meta::gc`).
    pub fn with_gc_grace(self, grace: Duration) -> Self {
        self.meta.set_gc_grace(grace);
        self
    }

    /// The certificate of the server's port: with one, both planes speak TLS only.
    pub fn with_tls(mut self, tls: Option<ServerTls>) -> Self {
        self.tls = tls;
        self
    }

    /// Whom the server accepts; without it, anyone.
    pub fn with_auth(mut self, auth: AuthConfig) -> Self {
        self.auth = auth;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The data plane's ticket keys and the GPU host key's seed, where callers are
    /// authenticated (the data plane then asks for tickets too).
    fn ticket_keys(
        &self,
    ) -> Result<
        (
            Option<Arc<tickets::TicketKeys>>,
            Option<crate::auth::ticket::TicketKey>,
        ),
        ServerError,
    > {
        if self.auth.is_open() {
            return Ok((None, None));
        }
        let data_dir_error = |source| ServerError::DataDir {
            path: self.data_dir.display().to_string(),
            source,
        };
        let mark = tickets::token_mark(self.auth.shared_token.as_deref());
        let (keys, seed) = match &self.ticket_secret {
            // The replicas of a store sign with the keys their shared secret gives.
            Some(path) => {
                let secret =
                    tickets::SharedSecret::read(path).map_err(ServerError::TicketSecret)?;
                let seed = secret.gpu_key();
                (tickets::TicketKeys::shared(secret, mark), seed)
            }
            None => (
                tickets::TicketKeys::load_or_create(&self.data_dir, mark)
                    .map_err(data_dir_error)?,
                tickets::load_or_create_key(&self.data_dir).map_err(data_dir_error)?,
            ),
        };
        Ok((Some(Arc::new(keys)), Some(seed)))
    }

    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let data_dir_error = |source| ServerError::DataDir {
            path: self.data_dir.display().to_string(),
            source,
        };
        let (keys, gpu_seed) = self.ticket_keys()?;
        let advertised = self.advertised();
        // A standby answers reads where what it answers (blocks, tickets) holds at every
        // replica: the blocks in an object store, tickets signed with the shared keys or none.
        let reads_anywhere =
            self.shared_blocks && (self.auth.is_open() || self.ticket_secret.is_some());
        let duties = duties::Duties {
            meta: self.meta.clone(),
            tenants: !self.auth.is_open(),
            gc_every: self.gc_every,
            shared_gc: None,
            keys: keys.clone(),
        };
        // A single server owns its store from the start; a replica of a store on etcd stands
        // by until it is elected, answering calls with where the owner is.
        let (standing, standing_rx) =
            tokio::sync::watch::channel(Standing::Standby { owner: None });
        let (stop_owning, stopped) = tokio::sync::oneshot::channel::<()>();
        let watchers: Arc<watch::Watchers> = Default::default();
        let mut shard_gate = None;
        let (owned, fence) = match self.election {
            None => {
                let running = duties.start().await?;
                standing.send_replace(Standing::Owner);
                (Ownership::Single(running), None)
            }
            // Every replica serves the namespaces of the shards it holds.
            Some(e) if self.shards > 1 => {
                let id = duties::replica_id(&self.data_dir).map_err(data_dir_error)?;
                let elector =
                    ShardElector::new(&e.url, &advertised, &id, self.owner_ttl, self.shards);
                standing.send_replace(Standing::Owner);
                let mut duties = duties;
                let replicas = BoardReplicas::new(&e.url, &id, e.fence.clone())?;
                duties.shared_gc = Some(Arc::new(replicas));
                let sharded = shards::Sharded {
                    meta: self.meta.clone(),
                    fence: e.fence.clone(),
                    watchers: watchers.clone(),
                    board: Some(GcBoard::new(&e.url, &id)),
                    duties,
                };
                let stop = async move {
                    let _ = stopped.await;
                };
                let (task, gate) = sharded.start(elector, self.shards, stop);
                shard_gate = Some(gate);
                (Ownership::Sharded(task), None)
            }
            Some(e) => {
                let id = duties::replica_id(&self.data_dir).map_err(data_dir_error)?;
                let mut elector =
                    Elector::connect(&e.url, &advertised, &id, self.owner_ttl).await?;
                // A first try before anything is served, so that a store's only server (or
                // one restarted) answers its first calls as the owner.
                let owned = match elector.try_once(&standing).await {
                    Some(claim) => Some(
                        duties::take_over(claim, &e.fence, &duties, &standing)
                            .await
                            .map_err(ServerError::Deposed)?,
                    ),
                    None => None,
                };
                let stop = async move {
                    let _ = stopped.await;
                };
                let task = duties::elected(elector, owned, e.fence.clone(), standing, duties, stop);
                (Ownership::Elected(tokio::spawn(task)), Some(e.fence))
            }
        };
        let gate = match &keys {
            None => Gate::Open,
            Some(keys) => Gate::Tickets {
                key: keys.verifiers(),
                versions: Some(Arc::new(tickets::ManifestBlocks::new(self.meta.clone()))),
            },
        };
        let handler = StoreHandler {
            meta: self.meta.clone(),
            tickets: keys.clone(),
            gpu_seed,
            clock: self.clock,
            windows: Arc::new(std::sync::Mutex::new(broadcasts(self.shared_blocks))),
            joined: Default::default(),
            swarm_waits: Default::default(),
            gpu_windows: Default::default(),
            gpu_changed: Default::default(),
            watchers,
            standing: standing_rx.clone(),
            shards: shard_gate,
        };
        register_gauges(&self.meta, &handler);
        let handler_watchers = handler.watchers.clone();
        let svc = StoreServer::new(handler)
            .max_decoding_message_size(MAX_RPC_MESSAGE)
            .max_encoding_message_size(MAX_RPC_MESSAGE);
        let loopback = self
            .listener
            .local_addr()
            .is_ok_and(|a| a.ip().is_loopback());
        if self.auth.is_open() && !loopback {
            tracing::warn!(
                "no authentication: anyone who reaches this port may read, write and remove every \
                 namespace's keys (--token-file, --token-review)"
            );
        }
        // Probes carry no token: the health service stands outside authentication.
        let (reporter, health) = tonic_health::server::health_reporter();
        let readiness = tokio::spawn(ready::report(self.meta.clone(), reporter));
        let svc = auth::layer::authenticated(svc, Arc::new(Authenticator::new(self.auth)));
        let svc = role::owner_only(svc, standing_rx, reads_anywhere);
        // Watch streams never end by themselves: a shutdown ends them, else it would wait on
        // them forever. A replica that lost its claim stops too.
        let watchers = handler_watchers;
        let deposed = fence.clone();
        let shutdown = async move {
            match deposed {
                None => shutdown.await,
                Some(f) => tokio::select! {
                    _ = shutdown => {}
                    _ = f.broken() => {}
                },
            }
            watchers.close();
        };
        let router = tonic::transport::Server::builder()
            .add_service(svc)
            .add_service(health);
        let blocks = self.meta.blocks().clone();
        let gate = shared(gate);
        crate::dataplane::port::serve(
            self.listener,
            Some(router),
            blocks,
            gate,
            self.tls,
            shutdown,
        )
        .await?;
        readiness.abort();
        let _ = stop_owning.send(());
        let lost = match owned {
            Ownership::Single(running) => {
                drop(running);
                None
            }
            Ownership::Elected(task) => task.await.unwrap_or_else(|e| Some(e.to_string())),
            Ownership::Sharded(task) => task.await.err().map(|e| e.to_string()),
        };
        self.meta.flush()?;
        match lost {
            Some(why) => Err(ServerError::Deposed(why)),
            None => Ok(()),
        }
    }
}

/// The broadcast windows of a store: the benchmarks' switches from the environment; a store
/// whose blocks are in an object store sends more pieces at once in each swarm.
fn broadcasts(shared_blocks: bool) -> crate::broadcast::windows::Broadcasts {
    use crate::broadcast::swarm::{OBJECT_SEED_SLOTS, SEED_SLOTS};
    crate::broadcast::windows::Broadcasts::with_tree_for_fanout(
        std::env::var(BENCH_TOPOLOGY).is_ok_and(|v| v == "tree"),
    )
    .with_whole_blocks(std::env::var(BENCH_PIECES).is_ok_and(|v| v == "blocks"))
    .with_seed_slots(match shared_blocks {
        true => OBJECT_SEED_SLOTS,
        false => SEED_SLOTS,
    })
}
