//! Connections to the store server and to this node's agent, with timeouts and errors a user
//! can read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

pub use super::error::ClientError;
use super::limits::MAX_RPC_MESSAGE;
use super::store::messages::*;
use super::store::{StoreApi, WatchDowns, WatchUps};
use crate::auth::credential::Credential;
use crate::proto::agent_client::AgentClient;
use crate::proto::store_client::StoreClient;

/// Where the node's agent (root's) listens when nothing says otherwise: a directory of root's
/// that every user may enter, a socket every user may connect to (the agent acts for each caller
/// with the caller's own rights and token).
pub const NODE_AGENT_SOCKET: &str = "/run/ktfs/agent.sock";

/// Where an agent this user starts listens when nothing says otherwise (`kt agent`, `kt up`):
/// root's at [`NODE_AGENT_SOCKET`]; another user's in its own runtime directory
/// (`$XDG_RUNTIME_DIR/ktfs`, else `/tmp/ktfs-UID`).
pub fn own_agent_socket() -> PathBuf {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from(NODE_AGENT_SOCKET);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("ktfs/agent.sock"),
        None => PathBuf::from(format!("/tmp/ktfs-{uid}/agent.sock")),
    }
}

/// The agent a client talks to when nothing says otherwise (`KT_AGENT`, `--agent`): this user's
/// own where one listens (`kt up` as that user), else the node's.
pub fn default_agent_socket() -> PathBuf {
    let own = own_agent_socket();
    match own.exists() {
        true => own,
        false => PathBuf::from(NODE_AGENT_SOCKET),
    }
}
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const RPC_TIMEOUT: Duration = Duration::from_secs(300);

fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    // tonic wraps the io error a few levels down; the innermost says what happened.
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

pub use super::store::Store;
pub type Agent = AgentClient<Channel>;

/// The store server over gRPC, presenting a credential on every call.
pub struct GrpcStore {
    client: StoreClient<InterceptedService<Channel, Credential>>,
}

/// A unary call's answer, its status turned into the client's error.
fn answer<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Result<T, ClientError> {
    r.map(tonic::Response::into_inner)
        .map_err(ClientError::from)
}

#[async_trait::async_trait]
impl StoreApi for GrpcStore {
    async fn register_node(
        &self,
        req: RegisterNodeRequest,
    ) -> Result<RegisterNodeResponse, ClientError> {
        answer(self.client.clone().register_node(req).await)
    }

    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, ClientError> {
        answer(self.client.clone().heartbeat(req).await)
    }

    async fn missing_blocks(
        &self,
        req: MissingBlocksRequest,
    ) -> Result<MissingBlocksResponse, ClientError> {
        answer(self.client.clone().missing_blocks(req).await)
    }

    async fn publish(&self, req: PublishRequest) -> Result<PublishResponse, ClientError> {
        answer(self.client.clone().publish(req).await)
    }

    async fn publish_batch(
        &self,
        req: PublishBatchRequest,
    ) -> Result<PublishBatchResponse, ClientError> {
        answer(self.client.clone().publish_batch(req).await)
    }

    async fn publish_gpu(&self, req: PublishGpuRequest) -> Result<PublishResponse, ClientError> {
        answer(self.client.clone().publish_gpu(req).await)
    }

    async fn resolve(&self, req: ResolveRequest) -> Result<ResolveResponse, ClientError> {
        answer(self.client.clone().resolve(req).await)
    }

    async fn resolve_many(
        &self,
        req: ResolveManyRequest,
    ) -> Result<ResolveManyResponse, ClientError> {
        answer(self.client.clone().resolve_many(req).await)
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse, ClientError> {
        answer(self.client.clone().list(req).await)
    }

    async fn remove(&self, req: RemoveRequest) -> Result<RemoveResponse, ClientError> {
        answer(self.client.clone().remove(req).await)
    }

    async fn add_location(
        &self,
        req: AddLocationRequest,
    ) -> Result<AddLocationResponse, ClientError> {
        answer(self.client.clone().add_location(req).await)
    }

    async fn version_blocks(
        &self,
        req: VersionBlocksRequest,
    ) -> Result<VersionBlocksResponse, ClientError> {
        answer(self.client.clone().version_blocks(req).await)
    }

    async fn rename(&self, req: RenameRequest) -> Result<RenameResponse, ClientError> {
        answer(self.client.clone().rename(req).await)
    }

    async fn exchange(&self, req: ExchangeRequest) -> Result<RenameResponse, ClientError> {
        answer(self.client.clone().exchange(req).await)
    }

    async fn link(&self, req: LinkRequest) -> Result<LinkResponse, ClientError> {
        answer(self.client.clone().link(req).await)
    }

    async fn set_attr(&self, req: SetAttrRequest) -> Result<SetAttrResponse, ClientError> {
        answer(self.client.clone().set_attr(req).await)
    }

    async fn join_broadcast(&self, req: JoinRequest) -> Result<JoinResponse, ClientError> {
        answer(self.client.clone().join_broadcast(req).await)
    }

    async fn new_parent(&self, req: NewParentRequest) -> Result<NewParentResponse, ClientError> {
        answer(self.client.clone().new_parent(req).await)
    }

    async fn leave_broadcast(&self, req: LeaveRequest) -> Result<LeaveResponse, ClientError> {
        answer(self.client.clone().leave_broadcast(req).await)
    }

    async fn swarm_sync(&self, req: SwarmSyncRequest) -> Result<SwarmSyncReply, ClientError> {
        answer(self.client.clone().swarm_sync(req).await)
    }

    async fn get_window(&self, req: GetWindowRequest) -> Result<Window, ClientError> {
        answer(self.client.clone().get_window(req).await)
    }

    async fn registration_secret(
        &self,
        req: RegistrationSecretRequest,
    ) -> Result<RegistrationSecretResponse, ClientError> {
        answer(self.client.clone().registration_secret(req).await)
    }

    async fn join_gpu_window(&self, req: GpuJoinRequest) -> Result<GpuJoinResponse, ClientError> {
        answer(self.client.clone().join_gpu_window(req).await)
    }

    async fn await_gpu_window(&self, req: GpuAwaitRequest) -> Result<GpuWindow, ClientError> {
        answer(self.client.clone().await_gpu_window(req).await)
    }

    async fn finish_gpu_window(
        &self,
        req: GpuFinishRequest,
    ) -> Result<GpuFinishResponse, ClientError> {
        answer(self.client.clone().finish_gpu_window(req).await)
    }

    async fn watch(&self, ups: WatchUps) -> Result<WatchDowns, ClientError> {
        let down = answer(self.client.clone().watch(ReceiverStream::new(ups)).await)?;
        Ok(Box::pin(down.map(change)))
    }
}

fn change(m: Result<WatchDown, tonic::Status>) -> Result<WatchDown, ClientError> {
    m.map_err(ClientError::from)
}

/// The replicas a store address names: `a,b,c` (cluster mode), or one.
fn replicas(addr: &str) -> Option<Vec<&str>> {
    let all: Vec<&str> = addr
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    (all.len() > 1).then_some(all)
}

/// How often a client of several replicas asks each connection whether its replica answers,
/// and how long it waits: a replica that hangs (stopped, cut off) fails the calls sent to it
/// within about their sum, which then go to another, rather than wait for the call's timeout.
const REPLICA_PING: Duration = Duration::from_secs(5);
const REPLICA_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The store served by the replicas at `addrs`, each connected on first use.
fn replicated(addrs: &[&str], credential: &Credential) -> Result<Store, ClientError> {
    let each = addrs
        .iter()
        .map(|a| {
            let endpoint = store_endpoint(a)?
                .http2_keep_alive_interval(REPLICA_PING)
                .keep_alive_timeout(REPLICA_PING_TIMEOUT)
                .keep_alive_while_idle(true);
            Ok((a.to_string(), lazy_on(a, endpoint, credential)?))
        })
        .collect::<Result<Vec<_>, ClientError>>()?;
    Ok(Store::new(super::replicas::Replicas::new(each)))
}

/// Connects to a store server at `host:port`, presenting `credential` on every call (over TLS
/// where this process trusts a CA). Several addresses (`a,b,c`) name the replicas of one
/// store (cluster mode): calls go to whichever owns it, and move on when it goes.
pub async fn connect_store(addr: &str, credential: &Credential) -> Result<Store, ClientError> {
    if let Some(all) = replicas(addr) {
        return replicated(&all, credential);
    }
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
    if let Some(all) = replicas(addr) {
        return replicated(&all, credential);
    }
    lazy_on(addr, store_endpoint(addr)?, credential)
}

/// A client of the store server at `addr` through `endpoint`, connected on first use.
fn lazy_on(addr: &str, endpoint: Endpoint, credential: &Credential) -> Result<Store, ClientError> {
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
    Store::new(GrpcStore {
        client: StoreClient::with_interceptor(channel, credential.clone())
            .max_decoding_message_size(MAX_RPC_MESSAGE)
            .max_encoding_message_size(MAX_RPC_MESSAGE),
    })
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
