//! The members of an etcd cluster and how they are reached: one client each (with its
//! timeouts, TLS and user), and what their refusals mean for a caller. etcd's own client
//! balances its requests over every member it is given, and with one member down it kept
//! sending some of them there:
//! measured, a store server given three members, one of them killed, failed at its start with
//! "tcp connect error" for more than 5 s. Any member answers (a follower forwards to the
//! leader), so a request goes to the member that answered last and, where that one cannot be
//! reached, to the next.
//!
//! A request that failed for want of a member may be sent again: a read does no harm, and a
//! transaction either compares what it read (it fails rather than applies twice) or puts and
//! deletes what it names, which applied twice leaves what applied once does.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::etcd_url::{EtcdTls, EtcdUrl};
use super::seam::{EngineError, Revision};

/// How long a connection to etcd may take to open, and a request to be answered: beyond it the
/// member is taken for gone and the call fails as unavailable, rather than hanging a publish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct Members {
    url: EtcdUrl,
    /// Each member's client, made on first use (a member down at the start is tried later).
    clients: Mutex<Vec<Option<Client>>>,
    /// The member that answered last.
    at: AtomicUsize,
}

impl Members {
    pub fn new(url: &EtcdUrl) -> Self {
        Members {
            url: url.clone(),
            clients: Mutex::new(vec![None; url.endpoints.len()]),
            at: AtomicUsize::new(0),
        }
    }

    /// Member `i`'s client, connected now if it was not yet.
    async fn client(&self, i: usize) -> Result<Client, EngineError> {
        let known = crate::locks::lock(&self.clients)[i].clone();
        if let Some(c) = known {
            return Ok(c);
        }
        let c = connect_one(&self.url, &self.url.endpoints[i]).await?;
        crate::locks::lock(&self.clients)[i] = Some(c.clone());
        Ok(c)
    }

    /// `f` on a member's client: on the one that answered last, then on each other once while
    /// none can be reached.
    pub async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, EngineError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.url.endpoints.len();
        let first = self.at.load(Ordering::Relaxed) % n;
        let mut failed = None;
        for i in (first..n).chain(0..first) {
            let answer = match self.client(i).await {
                Ok(c) => f(c).await.map_err(fault),
                Err(e) => Err(e),
            };
            match answer {
                Err(EngineError::Unavailable(why)) => {
                    tracing::debug!(member = %self.url.endpoints[i], error = %why, "trying another etcd member");
                    failed = Some(EngineError::Unavailable(why));
                }
                answered => {
                    self.at.store(i, Ordering::Relaxed);
                    return answered;
                }
            }
        }
        Err(failed.unwrap_or_else(|| EngineError::Unavailable("no etcd member".into())))
    }
}

/// A client of one member of the cluster `url` names (`endpoint`, one of its endpoints), with
/// its timeouts, TLS and user.
async fn connect_one(url: &EtcdUrl, endpoint: &str) -> Result<Client, EngineError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        // A member cut off from its cluster's leader answers nothing rather than stale data.
        .with_require_leader(true);
    if let Some((u, p)) = &url.user {
        opts = opts.with_user(u, p);
    }
    if let Some(tls) = &url.tls {
        opts = opts.with_tls(tls_options(tls)?);
    }
    Client::connect([endpoint], Some(opts)).await.map_err(fault)
}

fn tls_options(t: &EtcdTls) -> Result<TlsOptions, EngineError> {
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| {
            EngineError::Other(format!("etcd TLS: cannot read {}: {e}", p.display()).into())
        })
    };
    let mut opts = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&t.ca)?));
    if let (Some(cert), Some(key)) = (&t.cert, &t.key) {
        opts = opts.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &t.server_name {
        opts = opts.domain_name(name.clone());
    }
    Ok(opts)
}

/// What etcd's refusal means for the caller.
pub(super) fn fault(e: etcd_client::Error) -> EngineError {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => {
            let msg = s.message();
            if msg.contains("too many operations") || msg.contains("request is too large") {
                EngineError::TooLarge {
                    compares: 0,
                    writes: 0,
                    bytes: 0,
                }
            } else if msg.contains("database space exceeded") {
                EngineError::NoSpace(msg.to_string())
            } else if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) {
                EngineError::Unavailable(msg.to_string())
            } else {
                EngineError::Other(Box::new(s))
            }
        }
        E::TransportError(t) => EngineError::Unavailable(t.to_string()),
        E::IoError(io) => EngineError::Unavailable(io.to_string()),
        other => EngineError::other(other),
    }
}

pub(super) fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Revision {
    h.map_or(0, etcd_client::ResponseHeader::revision)
}
