//! The store server: metadata ([`crate::meta`]), broadcast windows ([`crate::broadcast::windows`]) and
//! the central block store ([`crate::blocks::store`]), behind the gRPC control plane
//! ([`handler`], its errors in [`status`], its callers checked by [`auth`]) and the data plane,
//! on one port.

pub mod auth;
mod handler;
mod migrate;
mod patch;
mod ready;
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
use crate::meta::engine::EngineError;
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

/// Collects garbage every `every`, off the async threads; a failed pass is logged and the next
/// one tries again.
/// Rotates the ticket keys when due, looking every minute (well within the time a new epoch is
/// announced before it signs). A key that cannot be kept on disk is not used: the one in force
/// goes on signing, and the next look tries again.
async fn rotate_every(keys: Arc<tickets::TicketKeys>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let k = keys.clone();
        match tokio::task::spawn_blocking(move || k.rotate()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "rotating the ticket keys"),
            Err(e) => tracing::warn!(error = %e, "rotating the ticket keys"),
        }
    }
}

async fn collect_every(meta: Arc<MetaStore>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let m = meta.clone();
        match tokio::task::spawn_blocking(move || m.collect_garbage()).await {
            Ok(Ok(r)) if r == Default::default() => tracing::debug!("nothing to collect"),
            Ok(Ok(r)) => tracing::info!(
                blocks = r.blocks,
                bytes = r.block_bytes,
                manifests = r.manifests,
                expired_keys = r.expired_keys,
                orphan_files = r.orphan_files,
                "collected garbage"
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "garbage collection failed"),
            Err(e) => tracing::warn!(error = %e, "garbage collection panicked"),
        }
    }
}

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
        let blocks = Arc::new(match &objects {
            Some(o) => StoreBlocks::on_objects(db.clone(), o.clone()),
            None => {
                let files = BlockFiles::open(&data_dir.join("blocks")).map_err(dir_err)?;
                StoreBlocks::new(db.clone(), files)
            }
        });
        blocks.index_old_blocks()?;
        let backend = spec::open_backend(&spec.meta, db, objects).await?;
        let meta = MetaStore::new(backend, blocks, lease, clock.clone());
        Ok(StoreServerProcess {
            listener,
            meta: Arc::new(meta),
            clock,
            auth: AuthConfig::default(),
            tls: None,
            data_dir: data_dir.to_path_buf(),
            gc_every: Some(DEFAULT_GC_INTERVAL),
        })
    }

    /// How often garbage is collected (`None`: never).
    pub fn with_gc(mut self, every: Option<Duration>) -> Self {
        self.gc_every = every;
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

    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        // Where callers are authenticated, the data plane asks for tickets too.
        let data_dir_error = |source| ServerError::DataDir {
            path: self.data_dir.display().to_string(),
            source,
        };
        let (keys, gpu_seed) = match self.auth.is_open() {
            true => (None, None),
            false => {
                let mark = tickets::token_mark(self.auth.shared_token.as_deref());
                let keys = tickets::TicketKeys::load_or_create(&self.data_dir, mark)
                    .map_err(data_dir_error)?;
                let seed = tickets::load_or_create_key(&self.data_dir).map_err(data_dir_error)?;
                (Some(Arc::new(keys)), Some(seed))
            }
        };
        // With tenants, a namespace names only the blocks it references; a store that kept
        // no references has them rebuilt from its keys before it serves.
        let meta = self.meta.clone();
        let tenants = !self.auth.is_open();
        tokio::task::spawn_blocking(move || meta.separate_namespaces(tenants))
            .await
            .map_err(|e| ServerError::Meta(MetaError::Corrupt(e.to_string())))?
            .map_err(ServerError::Meta)?;
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
            windows: Arc::new(std::sync::Mutex::new(
                crate::broadcast::windows::Broadcasts::with_tree_for_fanout(
                    std::env::var(BENCH_TOPOLOGY).is_ok_and(|v| v == "tree"),
                )
                .with_whole_blocks(std::env::var(BENCH_PIECES).is_ok_and(|v| v == "blocks")),
            )),
            joined: Default::default(),
            swarm_waits: Default::default(),
            gpu_windows: Default::default(),
            gpu_changed: Default::default(),
            watchers: Default::default(),
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
        let gc = self.gc_every.map(|every| {
            let meta = self.meta.clone();
            tokio::spawn(collect_every(meta, every))
        });
        let rotation = keys.map(|keys| tokio::spawn(rotate_every(keys)));
        // Probes carry no token: the health service stands outside authentication.
        let (reporter, health) = tonic_health::server::health_reporter();
        let readiness = tokio::spawn(ready::report(self.meta.clone(), reporter));
        let svc = auth::layer::authenticated(svc, Arc::new(Authenticator::new(self.auth)));
        // Watch streams never end by themselves: a shutdown ends them, else it would wait on
        // them forever.
        let watchers = handler_watchers;
        let shutdown = async move {
            shutdown.await;
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
        if let Some(gc) = gc {
            gc.abort();
        }
        if let Some(rotation) = rotation {
            rotation.abort();
        }
        self.meta.flush()?;
        Ok(())
    }
}
