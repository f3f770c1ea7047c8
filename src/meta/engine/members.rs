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
//!
//! A request that a member took but does not answer (the member is a follower whose leader
//! died: etcd holds the request until its own timeout, 5 s and two election timeouts) is sent
//! on: measured with bench/failover.sh's etcd (elections of 2.5 s), writes after the leader's
//! `kill -9` stopped for 10 s when the store's member was a follower. A read is sent on after
//! a read attempt (2 s). A write is sent on only once etcd's term moved past the one it was sent
//! in: the leader it went to is gone, and it was either lost with it or committed by the next
//! leader before anything sent since. A write given up while it may still apply could apply
//! after a later one (a key put back to what it held before), so one that is merely slow is
//! waited for. The term a write is compared with is the latest this replica learnt (at its
//! start, and from every read's and write's answer): a write slower than a second right after
//! an election that no answer since this replica's last read named is taken for one sent in the
//! older term and sent again, the one case where a late write could still land after a later
//! one. A publish reads what it changes just before it writes, so that window is the time
//! between its reads and its write.
//!
//! A request that met a reset connection ("transport error", which tonic answers as
//! `Unknown`) goes on to the next member too: before, it failed the call.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::etcd_url::{EtcdTls, EtcdUrl};
use super::seam::{EngineError, Revision};

/// How long a connection to etcd may take to open, and a request to be answered: beyond it the
/// member is taken for gone and the call fails as unavailable, rather than hanging a publish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long requests wait, and for what.
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// How long a request may go round the members.
    request: Duration,
    /// How long one member has to answer a read before it goes to the next: a healthy member
    /// answers in milliseconds, and a new leader is elected within about two election
    /// timeouts.
    read_attempt: Duration,
    /// How long a write waits before etcd is first asked whether its leader changed, and then
    /// between two askings.
    first_look: Duration,
    look: Duration,
    /// The pause before going round the members again, once none of them answered.
    round_pause: Duration,
}

const TIMING: Timing = Timing {
    request: Duration::from_secs(10),
    read_attempt: Duration::from_secs(2),
    first_look: Duration::from_secs(1),
    look: Duration::from_millis(500),
    round_pause: Duration::from_millis(100),
};

pub(super) struct Members {
    url: EtcdUrl,
    /// Each member's client, made on first use (a member down at the start is tried later).
    clients: Mutex<Vec<Option<Client>>>,
    /// The member that answered last.
    at: AtomicUsize,
    /// The latest raft term etcd answered with (0: none yet).
    term: AtomicU64,
    timing: Timing,
}

/// An answer of etcd's that names the raft term it was given in.
pub(super) trait Headed {
    fn raft_term(&self) -> Option<u64>;
}

macro_rules! headed {
    ($($t:ty),*) => {$(
        impl Headed for $t {
            fn raft_term(&self) -> Option<u64> {
                self.header().map(|h| h.raft_term())
            }
        }
    )*};
}

headed!(
    etcd_client::TxnResponse,
    etcd_client::DeleteResponse,
    etcd_client::GetResponse,
    etcd_client::StatusResponse
);

impl Members {
    pub fn new(url: &EtcdUrl) -> Self {
        Members {
            url: url.clone(),
            clients: Mutex::new(vec![None; url.endpoints.len()]),
            at: AtomicUsize::new(0),
            term: AtomicU64::new(0),
            timing: TIMING,
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

    /// A read (or a request whose second application does no harm, whenever it lands): `f`
    /// on a member's client, on the one that answered last, then on the next while none
    /// answers, round the members until the request's time (10 s).
    pub async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, EngineError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.round(|c, _| {
            let asked = f(c);
            async move {
                match tokio::time::timeout(self.timing.read_attempt, asked).await {
                    Ok(answer) => answer.map_err(fault),
                    Err(_) => Err(EngineError::Unavailable("no answer in time".into())),
                }
            }
        })
        .await
    }

    /// A read of keys: as [`Members::call`], and its answer's term learnt, so that the term a
    /// write is compared with is as fresh as the last read (a publish reads before it writes).
    pub async fn read<T, F, Fut>(&self, f: F) -> Result<T, EngineError>
    where
        T: Headed,
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let answer = self.call(f).await?;
        self.learn(answer.raft_term());
        Ok(answer)
    }

    /// A write (a transaction, a deletion): as [`Members::call`], but sent to another member
    /// only where it cannot apply late (see the module's comment).
    pub async fn write<T, F, Fut>(&self, mut f: F) -> Result<T, EngineError>
    where
        T: Headed,
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let answer = self
            .round(|c, until| {
                let before = self.term.load(Ordering::Relaxed);
                let asked = f(c);
                async move {
                    tokio::pin!(asked);
                    let mut wait = self.timing.first_look;
                    loop {
                        if let Ok(answer) = tokio::time::timeout(wait, &mut asked).await {
                            return answer.map_err(fault);
                        }
                        if tokio::time::Instant::now() >= until {
                            return Err(EngineError::Unavailable("no answer in time".into()));
                        }
                        if self.term_after(before).await {
                            return Err(EngineError::Unavailable(
                                "etcd's leader changed while the write was in flight".into(),
                            ));
                        }
                        wait = self.timing.look;
                    }
                }
            })
            .await?;
        self.learn(answer.raft_term());
        Ok(answer)
    }

    /// Learns etcd's current term, which later writes compare with.
    pub async fn learn_term(&self) {
        self.term_after(u64::MAX).await;
    }

    fn learn(&self, term: Option<u64>) {
        if let Some(t) = term {
            self.term.fetch_max(t, Ordering::Relaxed);
        }
    }

    /// Whether the first member that answers says etcd's term is past `before` (known: not 0).
    async fn term_after(&self, before: u64) -> bool {
        for j in 0..self.url.endpoints.len() {
            let Ok(c) = self.client(j).await else {
                continue;
            };
            let asked =
                tokio::time::timeout(self.timing.look, c.maintenance_client().status()).await;
            if let Ok(Ok(status)) = asked {
                self.learn(status.header().map(|h| h.raft_term()));
                return before != 0 && status.raft_term() > before;
            }
        }
        false
    }

    /// `attempt(client, until)` on a member's client: on the member that answered last, then
    /// the next while it is unavailable, round the members until `until` (the request's time,
    /// 10 s, from now).
    async fn round<T, A, Fut>(&self, mut attempt: A) -> Result<T, EngineError>
    where
        A: FnMut(Client, tokio::time::Instant) -> Fut,
        Fut: Future<Output = Result<T, EngineError>>,
    {
        let n = self.url.endpoints.len();
        let first = self.at.load(Ordering::Relaxed) % n;
        let until = tokio::time::Instant::now() + self.timing.request;
        let mut tried = 0;
        loop {
            let i = (first + tried) % n;
            let answer = match self.client(i).await {
                Ok(c) => attempt(c, until).await,
                Err(e) => Err(e),
            };
            match answer {
                Err(EngineError::Unavailable(why)) => {
                    tracing::debug!(member = %self.url.endpoints[i], error = %why, "trying another etcd member");
                    tried += 1;
                    let now = tokio::time::Instant::now();
                    if now >= until {
                        return Err(EngineError::Unavailable(why));
                    }
                    if tried % n == 0 {
                        tokio::time::sleep(
                            self.timing
                                .round_pause
                                .min(until.saturating_duration_since(now)),
                        )
                        .await;
                    }
                }
                answered => {
                    self.at.store(i, Ordering::Relaxed);
                    return answered;
                }
            }
        }
    }
}

/// A client of one member of the cluster `url` names (`endpoint`, one of its endpoints), with
/// its timeouts, TLS and user.
async fn connect_one(url: &EtcdUrl, endpoint: &str) -> Result<Client, EngineError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(TIMING.request)
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
            ) || broken_connection(&s)
            {
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

/// Whether `s` is tonic's word for a connection that broke under the request (a member killed
/// while it was asked), which it answers as `Unknown`, not as `Unavailable`.
fn broken_connection(s: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// An entry read from beside the tables: its key past the prefix read, its value, the lease it
/// lives under and the revision it was written at.
pub(super) type Beside = (String, Vec<u8>, i64, Revision);

impl Members {
    /// A transaction of entries beside the tables (claims, the collection board), each
    /// comparing what it writes, so that a second application is refused.
    pub(super) async fn txn(
        &self,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse, EngineError> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Every entry whose key begins with `from`, each as [`Beside`].
    pub(super) async fn beside(&self, from: Vec<u8>) -> Result<Vec<Beside>, EngineError> {
        let got = self
            .call(|mut c| {
                let from = from.clone();
                async move {
                    c.get(from, Some(etcd_client::GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        Ok(got
            .kvs()
            .iter()
            .map(|kv| {
                let rest = kv.key().get(from.len()..).unwrap_or_default();
                (
                    String::from_utf8_lossy(rest).into_owned(),
                    kv.value().to_vec(),
                    kv.lease(),
                    kv.mod_revision(),
                )
            })
            .collect())
    }
}

pub(super) fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Revision {
    h.map_or(0, etcd_client::ResponseHeader::revision)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    /// A hundredth of the times.
    const FAST: Timing = Timing {
        request: Duration::from_millis(100),
        read_attempt: Duration::from_millis(20),
        first_look: Duration::from_millis(10),
        look: Duration::from_millis(5),
        round_pause: Duration::from_millis(1),
    };

    fn members(n: usize) -> Members {
        // Clients connect on their first request, which these tests never send; nothing
        // listens on these ports.
        let mut m = Members::new(&EtcdUrl {
            endpoints: (1..=n).map(|i| format!("127.0.0.{i}:1")).collect(),
            prefix: "kt/".into(),
            user: None,
            tls: None,
        });
        m.timing = FAST;
        m
    }

    #[tokio::test]
    async fn a_member_that_takes_a_request_and_never_answers_is_left_for_the_next() {
        let m = members(3);
        let asked = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let answer = m
            .call(|_| {
                let n = asked.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n == 0 {
                        std::future::pending::<()>().await;
                    }
                    Ok(n)
                }
            })
            .await
            .unwrap();
        assert_eq!(answer, 1);
        assert!(started.elapsed() >= FAST.read_attempt);
        // The member that answered is asked first from now on.
        assert_eq!(m.at.load(Ordering::Relaxed), 1);
    }

    struct Written;

    impl Headed for Written {
        fn raft_term(&self) -> Option<u64> {
            None
        }
    }

    /// A read's answer, given in a term.
    struct Read(u64);

    impl Headed for Read {
        fn raft_term(&self) -> Option<u64> {
            Some(self.0)
        }
    }

    #[tokio::test]
    async fn a_read_teaches_the_term_later_writes_are_compared_with() {
        let m = members(1);
        m.learn(Some(3));
        m.read(|_| async { Ok(Read(7)) }).await.unwrap();
        assert_eq!(m.term.load(Ordering::Relaxed), 7);
        // An answer of an older term (a member behind) teaches nothing.
        m.read(|_| async { Ok(Read(5)) }).await.unwrap();
        assert_eq!(m.term.load(Ordering::Relaxed), 7);
    }

    #[tokio::test]
    async fn a_write_that_may_still_apply_is_waited_for_not_sent_again() {
        // No member answers whether etcd's leader changed (nothing listens there): the write
        // sent may still apply, so it is not sent to another member, which could apply it
        // after a later one.
        let m = members(3);
        let asked = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let e = m
            .write(|_| {
                asked.fetch_add(1, Ordering::Relaxed);
                async move {
                    std::future::pending::<()>().await;
                    Ok(Written)
                }
            })
            .await
            .err()
            .unwrap();
        assert!(matches!(e, EngineError::Unavailable(_)), "{e}");
        assert!(started.elapsed() >= FAST.request);
        assert_eq!(asked.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn members_are_asked_round_and_round_until_the_request_timeout() {
        let m = members(2);
        let asked = AtomicU32::new(0);
        let refused = || {
            let e = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
            asked.fetch_add(1, Ordering::Relaxed);
            async move { Err::<(), _>(e) }
        };
        let started = tokio::time::Instant::now();
        let e = m.call(|_| refused()).await.unwrap_err();
        assert!(matches!(e, EngineError::Unavailable(_)), "{e}");
        assert!(started.elapsed() >= FAST.request);
        // Round and round, a pause between two rounds: more than one try each.
        assert!(asked.load(Ordering::Relaxed) > 4, "{asked:?}");
    }

    #[test]
    fn a_connection_broken_under_a_request_is_unavailable_not_a_failure() {
        // tonic answers a reset connection as `Unknown`, its cause the transport's error.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(status.code(), tonic::Code::Unknown);
        let e = fault(etcd_client::Error::GRpcStatus(status));
        assert!(matches!(e, EngineError::Unavailable(_)), "{e}");
        let other = fault(etcd_client::Error::GRpcStatus(tonic::Status::unknown(
            "odd",
        )));
        assert!(!matches!(other, EngineError::Unavailable(_)), "{other}");
    }
}
