//! The node agent: this node's blocks ([`crate::blocks::node`]) served to peers on the data
//! plane, its lease with the store server ([`heartbeat`]), the unix socket on which local CLIs
//! publish, seed and mount ([`local_rpc`]), and the namespaces it mounts in its own process
//! ([`hosted`]).

mod caller;
mod config;
mod heartbeat;
pub mod hosted;
mod local_rpc;
mod peer;
mod versions;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};

pub use config::{AgentConfig, DEFAULT_HEARTBEAT};
use hosted::HostedMounts;
use local_rpc::AgentHandler;

use crate::auth::ticket::{self, Gate, SharedGate, VersionBlocks};
use crate::blocks::cache::{BlockCache, CF_CACHE, CF_CACHE_INDEX};
use crate::blocks::files::private_dir;
use crate::blocks::in_place::{CF_LOCAL, CF_SEEDS};
use crate::blocks::node::NodeBlocks;
use crate::blocks::BlockError;
use crate::dataplane::port;
use crate::db::{Db, DbError};
use crate::fs::names::inode::CF_INODES;
use crate::fs::ops::xattr::CF_XATTR;
use crate::fs::session::Stop;
use crate::fs::write::journal::CF_WRITEBACK;
use crate::keeper::KeeperClient;
use crate::proto::agent_server::AgentServer;
use crate::proto::{NodeInfo, RegisterNodeRequest};
use crate::rpc::client::{self, ClientError};
use crate::rpc::MAX_RPC_MESSAGE;

/// Every column family of the agent's database, whoever owns it.
const FAMILIES: &[&str] = &[
    CF_CACHE,
    CF_CACHE_INDEX,
    CF_LOCAL,
    CF_SEEDS,
    CF_XATTR,
    CF_INODES,
    CF_WRITEBACK,
];

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{path}: {source}")]
    Io {
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
    #[error("another agent is listening on {0}")]
    SocketTaken(String),
    #[error("{path}: {why}: whoever may replace a file there may put a socket of their own where `kt` looks for the agent's")]
    SocketDir { path: String, why: String },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Blocks(#[from] BlockError),
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error("serving: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The directory of the agent's socket must be a directory of this user's (or root's) that no
/// one else may write to, unless it is sticky (`/tmp` itself): a `/tmp/ktfs` another user
/// made first was taken as it was.
fn check_socket_dir(dir: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| AgentError::SocketDir {
        path: dir.display().to_string(),
        why,
    };
    let m = std::fs::symlink_metadata(dir).map_err(|source| AgentError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() {
        return Err(refuse("not a directory (a symlink?)".into()));
    }
    if m.uid() != me && m.uid() != 0 {
        return Err(refuse(format!(
            "owned by uid {}, not by this user or root",
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
        return Err(refuse(format!(
            "others may write to it (mode {:o}) and it is not sticky",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// A bound agent, ready to run.
pub struct AgentProcess {
    cfg: AgentConfig,
    listener: TcpListener,
    unix: UnixListener,
    blocks: Arc<NodeBlocks>,
    /// Closed until the store server says what to ask of peers.
    gate: SharedGate,
    /// The blocks of the versions peers present read tickets for.
    versions: Arc<dyn VersionBlocks>,
}

impl AgentProcess {
    pub async fn bind(cfg: AgentConfig) -> Result<Self, AgentError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| AgentError::Io { path, source }
        };
        private_dir(&cfg.cache_dir).map_err(io(&cfg.cache_dir))?;
        let db = Db::open(&cfg.cache_dir.join("agent.rocksdb"), FAMILIES, &[CF_CACHE])?;
        let cache = BlockCache::open(db.clone(), &cfg.cache_dir.join("blocks"), cfg.cache_size)?;
        let listener =
            TcpListener::bind(&cfg.listen)
                .await
                .map_err(|source| AgentError::Listen {
                    addr: cfg.listen.clone(),
                    source,
                })?;
        if let Some(dir) = cfg.socket.parent() {
            if !dir.exists() {
                // Others may enter (not write): the socket in it is for every user of the node.
                std::fs::create_dir_all(dir).map_err(io(dir))?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                    .map_err(io(dir))?;
            }
            check_socket_dir(dir)?;
        }
        // A socket left by an agent that died is stale; one that answers belongs to a live agent.
        if cfg.socket.exists() {
            if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
                return Err(AgentError::SocketTaken(cfg.socket.display().to_string()));
            }
            std::fs::remove_file(&cfg.socket).map_err(io(&cfg.socket))?;
        }
        let unix = UnixListener::bind(&cfg.socket).map_err(|source| AgentError::Listen {
            addr: cfg.socket.display().to_string(),
            source,
        })?;
        // Every user of the node may call: each call acts with its caller's own rights (its
        // peer credentials) and in its caller's namespaces (its token), and only root mounts.
        std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o666))
            .map_err(io(&cfg.socket))?;
        Ok(AgentProcess {
            listener,
            unix,
            blocks: Arc::new(NodeBlocks::new(db, cache)),
            gate: ticket::shared(Gate::Closed),
            versions: Arc::new(versions::StoreVersions::new(
                &cfg.server,
                cfg.credential.clone(),
            )),
            cfg,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn blocks(&self) -> Arc<NodeBlocks> {
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
        let store = client::connect_store(&self.cfg.server, &self.cfg.credential).await?;
        let r = store
            .register_node(RegisterNodeRequest {
                node: Some(self.node_info()),
            })
            .await?;
        heartbeat::registered(&r, &self.gate, &self.cfg.node_ticket, &self.versions);
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
    ) -> Result<(), AgentError> {
        let data_addr = self.data_addr();
        let node = self.node_info();
        let cache = self.blocks.cache().clone();
        crate::metrics::register_gauge(
            "kt_cache_bytes",
            "Bytes of blocks in this node's cache.",
            Box::new(move || cache.used() as f64),
        );
        let cache = self.blocks.cache().clone();
        crate::metrics::register_gauge(
            "kt_cache_budget_bytes",
            "The byte budget of this node's cache.",
            Box::new(move || cache.budget() as f64),
        );
        let heartbeat = tokio::spawn(heartbeat::heartbeat_loop(heartbeat::Lease {
            server: self.cfg.server.clone(),
            credential: self.cfg.credential.clone(),
            node,
            every: self.cfg.heartbeat,
            gate: self.gate.clone(),
            ticket: self.cfg.node_ticket.clone(),
            versions: self.versions.clone(),
            blocks: self.blocks.clone(),
        }));
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
            Some(_) => Some(
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                    .map_err(AgentError::Signal)?,
            ),
            None => None,
        };
        let handler = AgentHandler {
            cfg: self.cfg.clone(),
            data_addr,
            blocks: self.blocks.clone(),
            hosted: hosted.clone(),
            gate: self.gate.clone(),
        };
        let svc = AgentServer::new(handler)
            .max_decoding_message_size(MAX_RPC_MESSAGE)
            .max_encoding_message_size(MAX_RPC_MESSAGE);
        let unix = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(peer::accepted(self.unix), wait(stop_rx.clone()));
        let peer = port::serve(
            self.listener,
            None,
            self.blocks.clone(),
            self.gate.clone(),
            self.cfg.tls.clone(),
            wait(stop_rx),
        );
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
                self.blocks.db().flush()?;
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
        self.blocks.db().flush()?;
        u?;
        p?;
        Ok(())
    }
}
