//! Optional TLS on both planes, with rustls on ring (the provider kube already builds).
//!
//! A server given a certificate (`--tls-cert`, `--tls-key`) speaks TLS only on its port: a
//! plaintext data-plane or gRPC connection is refused with an answer that says so, and only
//! `/metrics` (no credential, no key names) is still served in the clear, so a scraper needs no
//! CA. A process that trusts a CA (`KT_TLS_CA`) speaks TLS to every server it reaches, the store
//! and peers alike: a cluster runs TLS or it does not, and a client cannot be talked down to
//! plaintext by an address. One port still carries every protocol: a TLS connection names its
//! protocol by ALPN, where a plaintext one is told apart by its first bytes.
//!
//! Certificates are checked against the host part of the address dialled, or against a name:
//! the store's against `KT_TLS_SERVER_NAME` (the Service name behind a port-forward from a
//! laptop, say), a node agent's against `KT_TLS_NODE_NAME`, else `KT_TLS_SERVER_NAME` too. One
//! certificate for the store and every agent (a name such as `ktfs`, as a cluster without
//! per-pod certificates has) works with the first alone; with the second, the store and the
//! nodes hold certificates of different names, and a node's key (on every node) cannot pass
//! for the store, which receives every caller's token.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

/// The CA bundle (PEM) a client trusts; set, every connection it opens is TLS.
pub const ENV_CA: &str = "KT_TLS_CA";
/// The name the store's certificate is checked against instead of the host dialled (and the
/// nodes' where [`ENV_NODE_NAME`] is not set).
pub const ENV_SERVER_NAME: &str = "KT_TLS_SERVER_NAME";
/// The name node agents' certificates are checked against instead of the host dialled.
pub const ENV_NODE_NAME: &str = "KT_TLS_NODE_NAME";
/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const ALPN_DATA: &[u8] = b"ktdp/1";
const ALPN_GRPC: &[u8] = b"h2";
const ALPN_HTTP: &[u8] = b"http/1.1";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0:?} is not a DNS name or an IP address to check a certificate against")]
    ServerName(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Whom a connection is for: the store server, or a node agent (a peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Store,
    Node,
}

/// Which protocol a connection carries, as a TLS server learns it from ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Data,
    Grpc,
    Http,
}

impl Plane {
    fn alpn(self) -> &'static [u8] {
        match self {
            Plane::Data => ALPN_DATA,
            Plane::Grpc => ALPN_GRPC,
            Plane::Http => ALPN_HTTP,
        }
    }
}

/// A server's certificate and key, ready to accept connections.
#[derive(Clone)]
pub struct ServerTls(TlsAcceptor);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// From a PEM certificate chain (leaf first) and a PEM private key, read again when the
    /// files change (see [`Reloading`]).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let resolver = Reloading::new(cert, key)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = [Plane::Grpc, Plane::Data, Plane::Http]
            .iter()
            .map(|p| p.alpn().to_vec())
            .collect();
        Ok(ServerTls(TlsAcceptor::from(Arc::new(config))))
    }

    /// Completes the handshake on an accepted connection and says which plane it asked for (a
    /// client that named none is taken for an HTTP one).
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<(Conn, Plane)> {
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.0.accept(tcp))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        let plane = match tls.get_ref().1.alpn_protocol() {
            Some(ALPN_DATA) => Plane::Data,
            Some(ALPN_GRPC) => Plane::Grpc,
            _ => Plane::Http,
        };
        Ok((Conn::Tls(Box::new(TlsStream::Server(tls))), plane))
    }
}

/// How often a handshake looks whether the certificate's files changed.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// A server's certificate, read again from its files when they change (a renewal by
/// cert-manager, a rotated Secret: Kubernetes swaps a mounted Secret's files in place), so a
/// renewal needs no restart. A handshake looks at the files' times at most once a second; a
/// pair that does not load (half written, or a key of another certificate) keeps the last good
/// one, with a warning, and is tried again once the files change again.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    state: std::sync::Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    checked: std::time::Instant,
    stamps: Stamps,
    certified: Arc<rustls::sign::CertifiedKey>,
}

/// The files' modification times, as last loaded.
type Stamps = (Option<std::time::SystemTime>, Option<std::time::SystemTime>);

impl Reloading {
    fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let stamps = stamps(cert, key);
        Ok(Reloading {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            state: std::sync::Mutex::new(Loaded {
                checked: std::time::Instant::now(),
                stamps,
                certified: Arc::new(certified(cert, key)?),
            }),
        })
    }
}

impl rustls::server::ResolvesServerCert for Reloading {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        // A panic under this lock leaves nothing half done: the state is used as it is.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.checked.elapsed() >= RELOAD_CHECK {
            st.checked = std::time::Instant::now();
            let now = stamps(&self.cert, &self.key);
            if now != st.stamps {
                st.stamps = now;
                match certified(&self.cert, &self.key) {
                    Ok(c) => {
                        st.certified = Arc::new(c);
                        tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "the changed TLS certificate does not load; serving the last good one"
                    ),
                }
            }
        }
        Some(st.certified.clone())
    }
}

fn stamps(cert: &Path, key: &Path) -> Stamps {
    let at = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (at(cert), at(key))
}

/// The certificate chain and its key, checked to belong together.
fn certified(cert: &Path, key: &Path) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    Ok(rustls::sign::CertifiedKey::from_der(
        chain,
        der,
        &provider(),
    )?)
}

/// The CA a client trusts and the name it checks, with one connector per plane (they differ in
/// the ALPN they offer).
pub struct ClientTls {
    data: TlsConnector,
    grpc: TlsConnector,
    server_name: Option<ServerName<'static>>,
    node_name: Option<ServerName<'static>>,
}

fn name_of(name: Option<&str>) -> Result<Option<ServerName<'static>>, TlsError> {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        None => Ok(None),
        Some(n) => ServerName::try_from(n.to_string())
            .map(Some)
            .map_err(|_| TlsError::ServerName(n.into())),
    }
}

impl ClientTls {
    /// Trusts the CAs of `ca`; checks the store against `server_name` and nodes against
    /// `node_name`, else `server_name`, where given (the host dialled otherwise).
    pub fn from_ca_file(
        ca: &Path,
        server_name: Option<&str>,
        node_name: Option<&str>,
    ) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca)? {
            roots.add(cert).map_err(|e| file_error(ca, e))?;
        }
        let roots = Arc::new(roots);
        let connector = |plane: Plane| -> Result<TlsConnector, TlsError> {
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            config.alpn_protocols = vec![plane.alpn().to_vec()];
            Ok(TlsConnector::from(Arc::new(config)))
        };
        let server_name = name_of(server_name)?;
        let node_name = name_of(node_name)?.or_else(|| server_name.clone());
        Ok(ClientTls {
            data: connector(Plane::Data)?,
            grpc: connector(Plane::Grpc)?,
            server_name,
            node_name,
        })
    }

    /// From `KT_TLS_CA`, `KT_TLS_SERVER_NAME` and `KT_TLS_NODE_NAME`; `None` where no CA is
    /// named.
    pub fn from_environment() -> Result<Option<Self>, TlsError> {
        let Some(ca) = std::env::var_os(ENV_CA).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let name = std::env::var(ENV_SERVER_NAME).ok();
        let node = std::env::var(ENV_NODE_NAME).ok();
        ClientTls::from_ca_file(&PathBuf::from(ca), name.as_deref(), node.as_deref()).map(Some)
    }

    fn name_for(&self, addr: &str, peer: Peer) -> io::Result<ServerName<'static>> {
        let named = match peer {
            Peer::Store => &self.server_name,
            Peer::Node => &self.node_name,
        };
        if let Some(n) = named {
            return Ok(n.clone());
        }
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr}: no host name to check the certificate against"),
            )
        })
    }

    /// The TLS handshake over a connected socket to `addr`, `peer`'s, for `plane` (gRPC or
    /// data).
    pub async fn connect(
        &self,
        tcp: TcpStream,
        addr: &str,
        plane: Plane,
        peer: Peer,
    ) -> io::Result<Conn> {
        let connector = match plane {
            Plane::Grpc => &self.grpc,
            Plane::Data | Plane::Http => &self.data,
        };
        let name = self.name_for(addr, peer)?;
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        Ok(Conn::Tls(Box::new(TlsStream::Client(tls))))
    }
}

static CLIENT: OnceLock<Result<Option<Arc<ClientTls>>, String>> = OnceLock::new();

/// Sets what this process trusts before its first connection (a command line's `--tls-ca`);
/// false where the process already chose (its first connection read the environment).
pub fn configure_client(tls: Option<ClientTls>) -> bool {
    CLIENT.set(Ok(tls.map(Arc::new))).is_ok()
}

/// What this process trusts: what [`configure_client`] set, else the environment, read once.
pub fn client() -> io::Result<Option<Arc<ClientTls>>> {
    CLIENT
        .get_or_init(|| {
            ClientTls::from_environment()
                .map(|t| t.map(Arc::new))
                .map_err(|e| format!("{ENV_CA}: {e}"))
        })
        .clone()
        .map_err(io::Error::other)
}

/// Connects to `addr`, `peer`'s, for `plane`, over TLS where this process trusts a CA. The
/// caller bounds the time it takes. A store of several replicas (`a,b,c`) is reached at the
/// first that answers: any of them serves the store's blocks.
pub async fn connect(addr: &str, plane: Plane, peer: Peer) -> io::Result<Conn> {
    let mut failed = None;
    for one in addr.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match connect_one(one, plane, peer).await {
            Ok(conn) => return Ok(conn),
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address")))
}

async fn connect_one(addr: &str, plane: Plane, peer: Peer) -> io::Result<Conn> {
    let tls = client()?;
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    match tls {
        None => Ok(Conn::Plain(tcp)),
        Some(tls) => tls.connect(tcp, addr, plane, peer).await,
    }
}

/// A connection in the clear or over TLS, either end.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }

    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp().peer_addr()
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// Halves that read and write at once: a plain socket's own (its write half keeps
    /// sendfile), a TLS stream's through one lock.
    pub fn into_split(self) -> (ConnRead, ConnWrite) {
        match self {
            Conn::Plain(s) => {
                let (r, w) = s.into_split();
                (ConnRead::Plain(r), ConnWrite::Plain(w))
            }
            Conn::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (ConnRead::Tls(r), ConnWrite::Tls(w))
            }
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.tcp().local_addr().ok(),
            remote_addr: self.tcp().peer_addr().ok(),
        }
    }
}

pub enum ConnRead {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Box<TlsStream<TcpStream>>>),
}

pub enum ConnWrite {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Box<TlsStream<TcpStream>>>),
}

macro_rules! delegate_read {
    ($t:ty, $($v:path),+) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty, $($v:path),+) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($v(s) => s.is_write_vectored(),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($v(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_read!(Conn, Conn::Plain, Conn::Tls);
delegate_write!(Conn, Conn::Plain, Conn::Tls);
delegate_read!(ConnRead, ConnRead::Plain, ConnRead::Tls);
delegate_write!(ConnWrite, ConnWrite::Plain, ConnWrite::Tls);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_checked_against_the_host_dialled_or_the_name_given() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        // Any certificate parses as a trust root; this one is only read, never used.
        std::fs::write(&ca, test_support::tls::Pki::new(&["ktfs"]).ca_pem()).unwrap();
        let by_host = ClientTls::from_ca_file(&ca, None, None).unwrap();
        for peer in [Peer::Store, Peer::Node] {
            assert_eq!(
                by_host.name_for("127.0.0.9:7447", peer).unwrap(),
                ServerName::try_from("127.0.0.9").unwrap()
            );
            assert_eq!(
                by_host.name_for("[::1]:7447", peer).unwrap(),
                ServerName::try_from("::1").unwrap()
            );
            assert_eq!(
                by_host.name_for("kt-store.kt-system:7447", peer).unwrap(),
                ServerName::try_from("kt-store.kt-system").unwrap()
            );
        }
        // One name for every server.
        let named = ClientTls::from_ca_file(&ca, Some("ktfs"), None).unwrap();
        for peer in [Peer::Store, Peer::Node] {
            assert_eq!(
                named.name_for("10.0.0.1:7448", peer).unwrap(),
                ServerName::try_from("ktfs").unwrap()
            );
        }
        // The store's name and the nodes' apart; a node name alone leaves the store by host.
        let apart = ClientTls::from_ca_file(&ca, Some("store.ktfs"), Some("node.ktfs")).unwrap();
        assert_eq!(
            apart.name_for("10.0.0.1:7447", Peer::Store).unwrap(),
            ServerName::try_from("store.ktfs").unwrap()
        );
        assert_eq!(
            apart.name_for("10.0.0.2:7448", Peer::Node).unwrap(),
            ServerName::try_from("node.ktfs").unwrap()
        );
        let nodes_only = ClientTls::from_ca_file(&ca, None, Some("node.ktfs")).unwrap();
        assert_eq!(
            nodes_only
                .name_for("kt-store.kt-system:7447", Peer::Store)
                .unwrap(),
            ServerName::try_from("kt-store.kt-system").unwrap()
        );
        for bad in [(Some("not a name!"), None), (None, Some("not a name!"))] {
            assert!(matches!(
                ClientTls::from_ca_file(&ca, bad.0, bad.1),
                Err(TlsError::ServerName(_))
            ));
        }
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(matches!(
            ClientTls::from_ca_file(&empty, None, None),
            Err(TlsError::File { .. })
        ));
    }
}
