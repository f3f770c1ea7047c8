//! How a node agent is set up, and the filesystem settings it gives each of its mounts.

use std::path::PathBuf;
use std::time::Duration;

use crate::auth::ticket::TicketHolder;
use crate::auth::tls::ServerTls;
use crate::auth::Credential;
use crate::clock;
use crate::fs::FsConfig;
use crate::key::Namespace;
use crate::proto::Locale;

pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// How this agent is set up.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub server: String,
    /// This node's credential: the node agent's ServiceAccount token, or the shared token.
    pub credential: Credential,
    /// This node's data-plane ticket, as the store server last issued it (shared by clones).
    pub node_ticket: TicketHolder,
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
    /// The certificate of this agent's port: with it, peers reach it over TLS only.
    pub tls: Option<ServerTls>,
    /// The FUSE device keeper this agent runs under (`kt keeper`): hosted mounts are handed to
    /// it and taken back from it at start.
    pub fd_keeper: Option<PathBuf>,
}

impl AgentConfig {
    /// Where this node's GPU transfer workers listen: the host peers reach this agent at.
    fn worker_host(&self) -> String {
        let addr = self.advertise.as_deref().unwrap_or(&self.listen);
        match addr.parse::<std::net::SocketAddr>() {
            Ok(a) if !a.ip().is_unspecified() => a.ip().to_string(),
            _ => "0.0.0.0".into(),
        }
    }

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
            credential: self.credential.clone(),
            node_ticket: self.node_ticket.clone(),
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
            clock: clock::system(),
            worker_exe: std::env::current_exe().unwrap_or_else(|_| "kt".into()),
            worker_host: self.worker_host(),
            writeback: false,
            stale_reads: false,
        }
    }
}
