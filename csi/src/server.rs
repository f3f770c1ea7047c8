//! The gRPC server on the CSI unix socket: Identity and Node always, Controller with
//! `--controller`.

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::agents::{Agents, AgentsConfig};
use crate::controller::ControllerService;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::proto::controller_server::ControllerServer;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("bad endpoint {0:?}: expected unix:///PATH")]
    Endpoint(String),
    #[error("another process is listening on {0}")]
    InUse(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving gRPC: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// `unix:///PATH` (or a plain absolute path).
    pub endpoint: String,
    pub node_id: String,
    pub controller: bool,
    pub agents: AgentsConfig,
}

/// The socket path of a CSI endpoint: `unix:///csi/csi.sock`, `unix:/csi/csi.sock` or
/// `/csi/csi.sock`.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, ServeError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if path.starts_with('/') && path.len() > 1 {
        Ok(PathBuf::from(path))
    } else {
        Err(ServeError::Endpoint(endpoint.to_string()))
    }
}

/// Binds the socket, replacing one left by a process that is gone.
pub fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let io = |what, source| ServeError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(|e| io("removing the stale socket", e))?;
    }
    UnixListener::bind(path).map_err(|e| io("listening on", e))
}

/// Serves until `shutdown` completes, then removes the socket. Namespace mounts stay: pods
/// keep using them, and the next kt-csi finds them.
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let path = socket_path(&cfg.endpoint)?;
    let listener = bind(&path)?;
    let controller = cfg.controller.then(|| {
        ControllerServer::new(ControllerService::new(
            cfg.agents.kt.clone(),
            cfg.agents.server.clone(),
            &cfg.agents.state_dir,
        ))
    });
    let node = NodeServer::new(NodeService::new(
        cfg.node_id.clone(),
        Agents::new(cfg.agents.clone()),
    ));
    println!(
        "kt-csi {} ({}) listening on {}",
        cfg.node_id,
        if cfg.controller {
            "controller and node"
        } else {
            "node"
        },
        path.display()
    );
    let result = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(IdentityService))
        .add_optional_service(controller)
        .add_service(node)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    let _ = std::fs::remove_file(&path);
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(socket_path("/x.sock").unwrap(), Path::new("/x.sock"));
        for bad in ["", "unix://", "tcp://1.2.3.4:5", "relative.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }
}
