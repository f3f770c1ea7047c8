//! One port for every protocol: a listener that tells a data-plane connection (it opens with
//! `KTDP`) from a Prometheus scrape (`GET `, HTTP/1.1) and a gRPC one (HTTP/2) by peeking at its
//! first bytes, and hands each to its server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;

use super::ticket::SharedGate;
use super::wire;
use crate::blocks::BlockServe;

#[derive(PartialEq)]
enum Protocol {
    Data,
    Http,
    Grpc,
}

async fn protocol(stream: &TcpStream) -> Protocol {
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
    match (peeked, buf) {
        (Ok(true), b) if b == wire::MAGIC => Protocol::Data,
        (Ok(true), b) if &b == b"GET " => Protocol::Http,
        _ => Protocol::Grpc,
    }
}

/// Answers one HTTP/1.1 request: `/metrics` (no credential: names and counts only), else 404.
async fn serve_http(mut stream: TcpStream) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let path = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .unwrap_or("");
    let (status, body) = match path.split('?').next() {
        Some("/metrics") => ("200 OK", crate::metrics::render()),
        _ => ("404 Not Found", "only /metrics here\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await
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
                match protocol(&stream).await {
                    Protocol::Data => wire::serve_connection(stream, blocks, gate).await,
                    Protocol::Http => {
                        if let Err(e) = serve_http(stream).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Protocol::Grpc => {
                        let _ = stream.set_nodelay(true);
                        let _ = tx.send(Ok(stream)).await;
                    }
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
