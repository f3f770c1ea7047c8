//! etcd as a metadata engine: every key under one prefix of the cluster's keyspace (so several
//! stores, or a store and other users, share one etcd), reads linearizable, transactions as
//! etcd's own compare-and-swap on modification revisions.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KvClient, TlsOptions, TxnOp,
};

use super::members::Members;
use super::seam::{prefix_end, EngineError, Entry, MetaEngine, Page, Revision, Txn, Write};

/// How long a connection to etcd may take to open, and a request to be answered: beyond it the
/// member is taken for gone and the call fails as unavailable, rather than hanging a publish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// An engine address: `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX[?TLS]`, as
/// JuiceFS names its metadata engines. The prefix is required: it is this store's part of the
/// keyspace. TLS, as etcd's own `--cacert`, `--cert` and `--key`: `ca=FILE` (the CA that signed
/// the members' certificates; it turns TLS on), `cert=FILE&key=FILE` (this client's, for a
/// cluster with `--client-cert-auth`), `server_name=NAME` (checked instead of the host dialled).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub user: Option<(String, String)>,
    pub tls: Option<EtcdTls>,
}

/// Where the files of an etcd client's TLS are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("bad etcd address {url:?}: {why} (expected etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX)")]
pub struct BadEtcdUrl {
    url: String,
    why: &'static str,
}

impl std::str::FromStr for EtcdUrl {
    type Err = BadEtcdUrl;

    fn from_str(url: &str) -> Result<Self, BadEtcdUrl> {
        let bad = |why| BadEtcdUrl {
            // A password in the address stays out of the error.
            url: match url.rsplit_once('@') {
                Some((_, host)) => format!("etcd://...@{host}"),
                None => url.to_string(),
            },
            why,
        };
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("not an etcd:// address"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /PREFIX after the hosts"))?;
        let prefix = prefix.trim_end_matches('/');
        let mut tls = EtcdTls::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("a query without ="))?;
            match name {
                "ca" => tls.ca = PathBuf::from(value),
                "cert" => tls.cert = Some(PathBuf::from(value)),
                "key" => tls.key = Some(PathBuf::from(value)),
                "server_name" => tls.server_name = Some(value.to_string()),
                _ => return Err(bad("an unknown option (ca, cert, key, server_name)")),
            }
        }
        let tls = match (tls.ca.as_os_str().is_empty(), &tls) {
            (true, t) if *t == EtcdTls::default() => None,
            (true, _) => return Err(bad("TLS options without ca=FILE")),
            (false, t) if t.cert.is_some() != t.key.is_some() => {
                return Err(bad("cert= and key= go together"))
            }
            (false, _) => Some(tls),
        };
        let scheme = match tls {
            Some(_) => "https",
            None => "http",
        };
        if prefix.is_empty() {
            return Err(bad("the prefix is empty"));
        }
        let (user, hosts) = match hosts.rsplit_once('@') {
            Some((cred, hosts)) => {
                let (u, p) = cred
                    .split_once(':')
                    .ok_or_else(|| bad("a user without a password"))?;
                (Some((u.to_string(), p.to_string())), hosts)
            }
            None => (None, hosts),
        };
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(bad("no hosts"));
        }
        if hosts.split(',').any(|h| !h.contains(':')) {
            return Err(bad("a host without a port"));
        }
        Ok(EtcdUrl {
            endpoints,
            prefix: format!("{prefix}/"),
            user,
            tls,
        })
    }
}

/// A connection to an etcd cluster, and the prefix this store's keys live under.
/// The largest answer taken from etcd (tonic's default is 4 MiB).
const MAX_ANSWER: usize = 128 << 20;

#[derive(Clone)]
pub struct EtcdEngine {
    members: std::sync::Arc<Members>,
    prefix: Vec<u8>,
}

/// A read's or a transaction's KV client on `c`: a page of up to 4,096 keys of up to 16 KiB
/// each, with their records, is taken whole.
fn kv(c: Client) -> KvClient {
    c.kv_client().max_decoding_message_size(MAX_ANSWER)
}

impl EtcdEngine {
    pub async fn connect(url: &EtcdUrl) -> Result<Self, EngineError> {
        let engine = EtcdEngine {
            members: std::sync::Arc::new(Members::new(url)),
            prefix: url.prefix.as_bytes().to_vec(),
        };
        // The client connects lazily: one request now, so a server whose etcd cannot be
        // reached says so at its start rather than with its first publish.
        engine.revision().await?;
        Ok(engine)
    }

    /// A page of `prefix` from `start`, before `end` where given: etcd counts every key of
    /// the range it is asked for, so a bound keeps a page's cost to what it needs.
    async fn range_to(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        let whole = self.full(prefix);
        let start = match start {
            Some(s) => self.full(s).max(whole.clone()),
            None => whole.clone(),
        };
        // The store's prefix ends in '/', so the end of a non-empty prefix always exists.
        let mut end_of = prefix_end(&whole).unwrap_or_else(|| vec![0]);
        if let Some(e) = end {
            end_of = end_of.min(self.full(e));
        }
        let end = end_of;
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let opts = GetOptions::new().with_range(end).with_limit(limit);
        let resp = self
            .members
            .call(|c| {
                let (start, opts) = (start.clone(), opts.clone());
                async move { kv(c).get(start, Some(opts)).await }
            })
            .await?;
        let entries = resp
            .kvs()
            .iter()
            .map(|kv| self.entry(kv))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page {
            entries,
            more: resp.more(),
            revision: header_revision(resp.header()),
        })
    }

    fn full(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    fn entry(&self, kv: &etcd_client::KeyValue) -> Result<Entry, EngineError> {
        let key = kv
            .key()
            .strip_prefix(&self.prefix[..])
            .ok_or_else(|| EngineError::Other("etcd answered a key outside the prefix".into()))?;
        Ok(Entry {
            key: key.to_vec(),
            value: kv.value().to_vec(),
            modified: kv.mod_revision(),
        })
    }
}

/// A client of one member of the cluster `url` names (`endpoint`, one of its endpoints), with
/// its timeouts, TLS and user.
pub(super) async fn connect_one(url: &EtcdUrl, endpoint: &str) -> Result<Client, EngineError> {
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

#[async_trait::async_trait]
impl MetaEngine for EtcdEngine {
    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let key = self.full(key);
        let resp = self
            .members
            .call(|c| {
                let key = key.clone();
                async move { kv(c).get(key, None).await }
            })
            .await?;
        resp.kvs().first().map(|kv| self.entry(kv)).transpose()
    }

    async fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        self.range_to(prefix, start, None, limit).await
    }

    async fn range_before(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        end: &[u8],
        limit: usize,
    ) -> Result<Page, EngineError> {
        self.range_to(prefix, start, Some(end), limit).await
    }

    async fn txn(&self, txn: Txn) -> Result<Revision, EngineError> {
        txn.check()?;
        let compares: Vec<Compare> = txn
            .compares
            .iter()
            .map(|c| Compare::mod_revision(self.full(&c.key), CompareOp::Equal, c.modified))
            .collect();
        let ops: Vec<TxnOp> = txn
            .writes
            .into_iter()
            .map(|w| match w {
                Write::Put { key, value } => TxnOp::put(self.full(&key), value, None),
                Write::Delete { key } => TxnOp::delete(self.full(&key), None),
            })
            .collect();
        let txn = etcd_client::Txn::new().when(compares).and_then(ops);
        let resp = self
            .members
            .call(|c| {
                let txn = txn.clone();
                async move { kv(c).txn(txn).await }
            })
            .await?;
        match resp.succeeded() {
            true => Ok(header_revision(resp.header())),
            false => Err(EngineError::Conflict),
        }
    }

    async fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError> {
        let whole = self.full(prefix);
        let end = prefix_end(&whole).unwrap_or_else(|| vec![0]);
        let opts = DeleteOptions::new().with_range(end);
        let resp = self
            .members
            .call(|c| {
                let (whole, opts) = (whole.clone(), opts.clone());
                async move { kv(c).delete(whole, Some(opts)).await }
            })
            .await?;
        Ok(header_revision(resp.header()))
    }

    async fn revision(&self) -> Result<Revision, EngineError> {
        // A count-only read of one key answers with the cluster's revision and no data.
        let opts = GetOptions::new().with_count_only();
        let resp = self
            .members
            .call(|c| {
                let (key, opts) = (self.prefix.clone(), opts.clone());
                async move { kv(c).get(key, Some(opts)).await }
            })
            .await?;
        Ok(header_revision(resp.header()))
    }
}
