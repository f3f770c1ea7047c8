//! A gRPC channel to a CSI endpoint on a unix socket, as the kubelet and the sidecars open it.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Connects to the CSI socket at `path`.
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let sock: PathBuf = path.to_path_buf();
    // The URI is required by the HTTP/2 layer and ignored by the connector.
    Endpoint::from_static("http://csi.local")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(sock).await?)) }
        }))
        .await
}
