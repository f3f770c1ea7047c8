//! Connections to the store server and to this node's agent, with timeouts and errors a user
//! can read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

use super::credential::Credential;
use super::status::{Fault, RemoteError};
use super::MAX_RPC_MESSAGE;
use crate::proto::agent_client::AgentClient;
use crate::proto::store_client::StoreClient;

/// Where this node's agent listens when nothing says otherwise (`KT_AGENT`, `--agent`).
pub const DEFAULT_AGENT_SOCKET: &str = "/tmp/ktfs/agent.sock";
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const RPC_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the store server at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("cannot reach the agent at {path}: {reason}")]
    AgentUnreachable { path: String, reason: String },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Remote(s.into())
    }
}

impl ClientError {
    pub fn fault(&self) -> Fault {
        match self {
            ClientError::Unreachable { .. } | ClientError::AgentUnreachable { .. } => {
                Fault::Unreachable
            }
            ClientError::Remote(r) => r.fault,
        }
    }

    /// Whether the peer answered that the thing asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        self.fault() == Fault::NotFound
    }
}

fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    // tonic wraps the io error a few levels down; the innermost says what happened.
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A store client that presents a credential on every call.
pub type Store = StoreClient<InterceptedService<Channel, Credential>>;
pub type Agent = AgentClient<Channel>;

/// Connects to a store server at `host:port`, presenting `credential` on every call.
pub async fn connect_store(addr: &str, credential: &Credential) -> Result<Store, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable {
        addr: addr.to_string(),
        reason,
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT)
        .tcp_nodelay(true);
    let channel = tokio::time::timeout(CONNECT_TIMEOUT * 2, endpoint.connect())
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(reason(&e)))?;
    Ok(StoreClient::with_interceptor(channel, credential.clone())
        .max_decoding_message_size(MAX_RPC_MESSAGE)
        .max_encoding_message_size(MAX_RPC_MESSAGE))
}

/// A store client that connects on first use and reconnects after failures: for long-lived
/// processes (the mount) that must outlive a store server restart.
pub fn store_lazy(addr: &str, credential: &Credential) -> Result<Store, ClientError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ClientError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT)
        .tcp_nodelay(true);
    Ok(
        StoreClient::with_interceptor(endpoint.connect_lazy(), credential.clone())
            .max_decoding_message_size(MAX_RPC_MESSAGE)
            .max_encoding_message_size(MAX_RPC_MESSAGE),
    )
}

/// Connects to an agent's unix socket.
pub async fn connect_agent(path: &Path) -> Result<Agent, ClientError> {
    let unreachable = |reason: String| ClientError::AgentUnreachable {
        path: path.display().to_string(),
        reason,
    };
    let sock: PathBuf = path.to_path_buf();
    // The URI is required by the HTTP/2 layer and ignored by the connector.
    let endpoint = Endpoint::from_static("http://agent.local")
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT);
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(sock).await?)) }
        }))
        .await
        .map_err(|e| unreachable(reason(&e)))?;
    Ok(AgentClient::new(channel)
        .max_decoding_message_size(MAX_RPC_MESSAGE)
        .max_encoding_message_size(MAX_RPC_MESSAGE))
}
