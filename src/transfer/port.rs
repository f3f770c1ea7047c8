//! One port for both planes: a listener that tells a data-plane connection (it opens with
//! `KTDP`) from a gRPC one (HTTP/2) by peeking at its first bytes, and hands each to its server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;

use super::ticket::SharedGate;
use super::wire;
use crate::blocks::BlockServe;

async fn is_dataplane(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 4];
    let peeked = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.peek(&mut buf).await {
                Ok(n) if n >= 4 => return true,
                Ok(0) | Err(_) => return false,
                Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    })
    .await;
    peeked == Ok(true) && buf == wire::MAGIC
}

/// Accepts connections until `shutdown` completes. Data-plane connections go to `blocks`,
/// behind `gate`; the others to the gRPC `router` (or are closed when there is none).
pub async fn serve(
    listener: TcpListener,
    router: Option<tonic::transport::server::Router>,
    blocks: Arc<dyn BlockServe>,
    gate: SharedGate,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<TcpStream>>(64);
    let accept = async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let tx = tx.clone();
            let (blocks, gate) = (blocks.clone(), gate.clone());
            tokio::spawn(async move {
                if is_dataplane(&stream).await {
                    wire::serve_connection(stream, blocks, gate).await;
                } else {
                    let _ = stream.set_nodelay(true);
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    };
    let accept = tokio::spawn(accept);
    let result = match router {
        Some(router) => {
            router
                .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown)
                .await
        }
        None => {
            drop(rx);
            shutdown.await;
            Ok(())
        }
    };
    accept.abort();
    result
}
