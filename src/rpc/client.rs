//! Connections to the store server and to this node's agent, with timeouts and errors a user
//! can read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

use super::limits::MAX_RPC_MESSAGE;
use super::status::{Fault, RemoteError};
use crate::auth::credential::Credential;
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

/// Connects to a store server at `host:port`, presenting `credential` on every call (over TLS
/// where this process trusts a CA).
pub async fn connect_store(addr: &str, credential: &Credential) -> Result<Store, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable {
        addr: addr.to_string(),
        reason,
    };
    let endpoint = store_endpoint(addr)?;
    let connecting = async {
        match tls_connector(addr).map_err(|e| unreachable(e.to_string()))? {
            None => endpoint.connect().await,
            Some(connector) => endpoint.connect_with_connector(connector).await,
        }
        .map_err(|e| unreachable(reason(&e)))
    };
    let channel = tokio::time::timeout(
        CONNECT_TIMEOUT * 2 + crate::auth::tls::HANDSHAKE_TIMEOUT,
        connecting,
    )
    .await
    .map_err(|_| unreachable("timed out".into()))??;
    Ok(store_client(channel, credential))
}

/// A store client that connects on first use and reconnects after failures: for long-lived
/// processes (the mount) that must outlive a store server restart.
pub fn store_lazy(addr: &str, credential: &Credential) -> Result<Store, ClientError> {
    let endpoint = store_endpoint(addr)?;
    let channel = match tls_connector(addr).map_err(|e| ClientError::Unreachable {
        addr: addr.to_string(),
        reason: e.to_string(),
    })? {
        None => endpoint.connect_lazy(),
        Some(connector) => endpoint.connect_with_connector_lazy(connector),
    };
    Ok(store_client(channel, credential))
}

fn store_endpoint(addr: &str) -> Result<Endpoint, ClientError> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ClientError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT)
        .tcp_nodelay(true))
}

fn store_client(channel: Channel, credential: &Credential) -> Store {
    StoreClient::with_interceptor(channel, credential.clone())
        .max_decoding_message_size(MAX_RPC_MESSAGE)
        .max_encoding_message_size(MAX_RPC_MESSAGE)
}

/// Where this process trusts a CA, a connector that dials `addr` over TLS (the URI the HTTP/2
/// layer passes is the same address).
#[allow(clippy::type_complexity)]
fn tls_connector(
    addr: &str,
) -> std::io::Result<
    Option<
        impl tower::Service<
                Uri,
                Response = TokioIo<crate::auth::tls::Conn>,
                Error = std::io::Error,
                Future = impl Send,
            > + Clone
            + Send
            + 'static,
    >,
> {
    if crate::auth::tls::client()?.is_none() {
        return Ok(None);
    }
    let addr = addr.to_string();
    Ok(Some(tower::service_fn(move |_: Uri| {
        let addr = addr.clone();
        async move {
            let conn = crate::auth::tls::connect(
                &addr,
                crate::auth::tls::Plane::Grpc,
                crate::auth::tls::Peer::Store,
            )
            .await?;
            Ok::<_, std::io::Error>(TokioIo::new(conn))
        }
    })))
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
