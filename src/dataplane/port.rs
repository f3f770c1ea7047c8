//! One port for every protocol: a listener that tells a data-plane connection (it opens with
//! `KTDP`) from a Prometheus scrape (`GET `, HTTP/1.1) and a gRPC one (HTTP/2) by peeking at its
//! first bytes, and hands each to its server. With a certificate, the port speaks TLS: a TLS
//! connection names its protocol by ALPN, and only a scrape is still served in the clear.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;

use super::wire;
use crate::auth::ticket::SharedGate;
use crate::auth::tls::{Conn, Plane, ServerTls};
use crate::blocks::BlockServe;

#[derive(PartialEq)]
enum Protocol {
    Data,
    Http,
    Grpc,
    Tls,
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
        // A TLS handshake record, version 3.x.
        (Ok(true), [0x16, 0x03, ..]) => Protocol::Tls,
        _ => Protocol::Grpc,
    }
}

/// Answers one HTTP/1.1 request: `/metrics` (no credential: names and counts only), `/ready`
/// (a store server's readiness, for a Kubernetes HTTP probe), else 404.
async fn serve_http<S>(mut stream: S) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
    let (status, body) = match (path.split('?').next(), crate::metrics::ready()) {
        (Some("/metrics"), _) => ("200 OK", crate::metrics::render()),
        (Some("/ready"), Some(true)) => ("200 OK", "ready\n".to_string()),
        (Some("/ready"), Some(false)) => ("503 Service Unavailable", "not ready\n".to_string()),
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
/// behind `gate`; the others to the gRPC `router` (or are closed when there is none). With
/// `tls`, plaintext data-plane and gRPC connections are refused with an answer that says why.
pub async fn serve(
    listener: TcpListener,
    router: Option<tonic::transport::server::Router>,
    blocks: Arc<dyn BlockServe>,
    gate: SharedGate,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Conn>>(64);
    let (plain_tx, plain_rx) = tokio::sync::mpsc::channel::<std::io::Result<TcpStream>>(16);
    let tls_only = tls.is_some();
    let admission = Arc::new(wire::admission::Admission::default());
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
            let (tx, plain_tx) = (tx.clone(), plain_tx.clone());
            let (blocks, gate, tls) = (blocks.clone(), gate.clone(), tls.clone());
            let admission = admission.clone();
            tokio::spawn(async move {
                let (conn, plane) = match (protocol(&stream).await, &tls) {
                    (Protocol::Http, _) => (Conn::Plain(stream), Plane::Http),
                    (Protocol::Tls, Some(tls)) => match tls.accept(stream).await {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                    (Protocol::Data, Some(_)) => return wire::refuse_plaintext(stream).await,
                    (Protocol::Data, None) => (Conn::Plain(stream), Plane::Data),
                    (Protocol::Grpc, Some(_)) => {
                        let _ = stream.set_nodelay(true);
                        let _ = plain_tx.send(Ok(stream)).await;
                        return;
                    }
                    (Protocol::Grpc | Protocol::Tls, None) => (Conn::Plain(stream), Plane::Grpc),
                };
                match plane {
                    Plane::Data => wire::serve_connection(conn, blocks, gate, admission).await,
                    Plane::Http => {
                        if let Err(e) = serve_http(conn).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Plane::Grpc => {
                        if let Conn::Plain(s) = &conn {
                            let _ = s.set_nodelay(true);
                        }
                        let _ = tx.send(Ok(conn)).await;
                    }
                }
            });
        }
    };
    let accept = tokio::spawn(accept);
    // Both gRPC servers of a TLS port stop on the one signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|done| *done).await;
    };
    let refusals = tokio::spawn(refuse_plaintext_grpc(
        tls_only,
        ReceiverStream::new(plain_rx),
        stopped(stop_rx.clone()),
    ));
    let result = match router {
        Some(router) => {
            router
                .serve_with_incoming_shutdown(ReceiverStream::new(rx), stopped(stop_rx))
                .await
        }
        None => {
            drop(rx);
            stopped(stop_rx).await;
            Ok(())
        }
    };
    accept.abort();
    refusals.abort();
    result
}

/// Answers every call on a plaintext gRPC connection to a TLS port with UNAVAILABLE and why,
/// so a client without the CA is told what to set rather than seeing a reset.
async fn refuse_plaintext_grpc(
    tls_only: bool,
    incoming: ReceiverStream<std::io::Result<TcpStream>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    if !tls_only {
        return;
    }
    let _ = tonic::transport::Server::builder()
        .add_service(TlsRequired)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
}

/// Stands in for the store service on a TLS port's plaintext connections.
#[derive(Clone)]
struct TlsRequired;

impl tonic::server::NamedService for TlsRequired {
    const NAME: &'static str = "ktfs.v1.Store";
}

impl<B> tower::Service<tonic::codegen::http::Request<B>> for TlsRequired {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Request<B>) -> Self::Future {
        let why = format!(
            "this server speaks TLS only: trust its CA with {}",
            crate::auth::tls::ENV_CA
        );
        std::future::ready(Ok(tonic::Status::unavailable(why).into_http()))
    }
}
