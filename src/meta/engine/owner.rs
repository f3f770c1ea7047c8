//! Which replica owns a store whose metadata is on etcd. A replica claims the owner key
//! (`PREFIX/owner`, naming the address its clients reach it at) under a lease of its own, if no
//! one holds it, and keeps the lease alive while it serves; the others stand by, polling the
//! key, and tell callers where the owner is. When the owner dies its lease expires, the key goes
//! with it, and the first standby to see it gone claims it. The revision of the claim is the
//! fence every transaction of the owner compares (`Fence`), so an owner that lost its claim
//! without knowing it writes nothing.
//!
//! An owner that cannot renew its lease within the lease's time does not know whether it still
//! owns the store: it stops answering (`Standing::Unsure`) until a renewal says the lease lives
//! (nothing was taken over: it serves again as it was) or that it died (the claim is lost; the
//! server stops, and restarts as a standby with nothing of the old owner's memory).

use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::watch;

use super::etcd_url::EtcdUrl;
use super::fence::OWNER_KEY;
use super::lease::renew;
use super::members::{header_revision, Members};
use super::seam::{EngineError, Revision};

/// Where a replica stands, as its answers tell callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It owns the store and serves.
    Owner,
    /// It stands by; `owner` is where the owner said it is reached, if one holds the store.
    Standby { owner: Option<String> },
    /// It owned the store and could not renew its claim in time: it answers nothing until it
    /// learns whether the claim lives.
    Unsure,
}

/// How long a claim lives without renewal when nothing says otherwise: a dead owner's
/// standby takes over within about this long.
pub const DEFAULT_OWNER_TTL: Duration = Duration::from_secs(3);

/// A replica's part in electing the owner of one store.
pub struct Elector {
    members: Members,
    key: Vec<u8>,
    /// The address this replica's clients reach it at, which the claim names.
    me: String,
    /// Who this replica is across its restarts (kept in its data directory, which one process
    /// at a time holds): a claim that names it was made by this replica's previous life, dead
    /// since, and is taken back at once rather than after its lease runs out.
    id: String,
    ttl: Duration,
}

/// What the owner key holds: where the owner is reached, and who it is.
fn claim_value(addr: &str, id: &str) -> String {
    format!("{addr} {id}")
}

/// The address and the replica a claim names.
fn read_claim(value: &[u8]) -> (String, String) {
    let v = String::from_utf8_lossy(value);
    match v.split_once(' ') {
        Some((addr, id)) => (addr.to_string(), id.to_string()),
        None => (v.into_owned(), String::new()),
    }
}

/// This replica's claim on the store.
pub struct Claim {
    /// The revision the claim was written at: the fence.
    pub revision: Revision,
    lease: i64,
    /// Until when etcd keeps the lease at least, as this replica last learnt it.
    safe_until: Instant,
}

impl Elector {
    /// The election of the store `url` names, for the replica `id` reached at `me`.
    pub async fn connect(
        url: &EtcdUrl,
        me: &str,
        id: &str,
        ttl: Duration,
    ) -> Result<Self, EngineError> {
        let mut key = url.prefix.as_bytes().to_vec();
        key.extend_from_slice(OWNER_KEY);
        Ok(Elector {
            members: Members::new(url),
            key,
            me: me.to_string(),
            id: id.to_string(),
            ttl: ttl.max(Duration::from_secs(2)),
        })
    }

    fn ttl_secs(&self) -> i64 {
        i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX)
    }

    /// How often an owner renews its lease.
    fn tick(&self) -> Duration {
        (self.ttl / 3).min(Duration::from_millis(500))
    }

    /// How often a standby looks at the owner key: a dead owner's place is taken within this
    /// much of its claim's end.
    fn look(&self) -> Duration {
        (self.ttl / 4).min(Duration::from_millis(250))
    }

    /// Waits until this replica owns the store, telling `standing` meanwhile where the owner
    /// is. A failed request to etcd is retried at the next look: a standby outlives an etcd
    /// that comes and goes.
    pub async fn campaign(&mut self, standing: &watch::Sender<Standing>) -> Claim {
        loop {
            if let Some(claim) = self.try_once(standing).await {
                return claim;
            }
            tokio::time::sleep(self.look()).await;
        }
    }

    /// One try at the claim: it, or `None` having told `standing` where the owner is.
    pub async fn try_once(&mut self, standing: &watch::Sender<Standing>) -> Option<Claim> {
        match self.try_claim().await {
            Ok(Ok(claim)) => return Some(claim),
            Ok(Err(owner)) => {
                standing.send_replace(Standing::Standby { owner });
            }
            Err(e) => tracing::warn!(error = %e, "looking for the store's owner"),
        }
        None
    }

    /// Claims the owner key if no one holds it, or if this replica's previous life does:
    /// the claim, or where the owner is.
    async fn try_claim(&mut self) -> Result<Result<Claim, Option<String>>, EngineError> {
        let key = self.key.clone();
        let held = self
            .members
            .call(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        // The claim must still be the one read when it is written: absent, or this replica's
        // old one at the revision it was read at.
        let expected = match held.kvs().first() {
            None => Compare::create_revision(self.key.clone(), CompareOp::Equal, 0),
            Some(kv) => {
                let (addr, id) = read_claim(kv.value());
                if id != self.id || id.is_empty() {
                    return Ok(Err(Some(addr)));
                }
                tracing::info!("taking back the claim of this replica's previous start");
                Compare::mod_revision(self.key.clone(), CompareOp::Equal, kv.mod_revision())
            }
        };
        let asked = Instant::now();
        let ttl = self.ttl_secs();
        let lease = self
            .members
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?
            .id();
        let claim = Txn::new()
            .when([expected])
            .and_then([TxnOp::put(
                self.key.clone(),
                claim_value(&self.me, &self.id),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.clone(), Some(GetOptions::new()))]);
        let resp = self
            .members
            .call(|mut c| {
                let claim = claim.clone();
                async move { c.txn(claim).await }
            })
            .await?;
        if resp.succeeded() {
            tracing::info!(owner = %self.me, "this replica owns the store now");
            return Ok(Ok(Claim {
                revision: header_revision(resp.header()),
                lease,
                safe_until: asked + self.ttl,
            }));
        }
        // Another replica claimed it first; the lease is not needed.
        let _ = self.revoke(lease).await;
        let owner = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| read_claim(kv.value()).0),
            _ => None,
        });
        Ok(Err(owner))
    }

    /// Keeps `claim` alive, telling `standing` whether this replica may serve, until `stop`
    /// (then gives it up: a standby takes over at once rather than after the lease's time).
    /// Fails when the claim is lost (its lease expired), which no renewal undoes.
    pub async fn keep(
        &mut self,
        mut claim: Claim,
        standing: &watch::Sender<Standing>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), String> {
        // Stop answering a little before etcd could let the lease go.
        let margin = self.tick();
        let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => {
                    if let Err(e) = self.revoke(claim.lease).await {
                        tracing::warn!(error = %e, "giving up the claim on the store");
                    }
                    return Ok(());
                }
                _ = tokio::time::sleep(self.tick()) => {}
            }
            let asked = Instant::now();
            match renew(&self.members, &mut stream, claim.lease, self.ttl).await {
                Ok(true) => {
                    claim.safe_until = asked + self.ttl;
                    standing.send_if_modified(|s| {
                        let was = std::mem::replace(s, Standing::Owner);
                        was != Standing::Owner
                    });
                }
                Ok(false) => return Err("its lease expired".into()),
                Err(e) => {
                    stream = None;
                    tracing::warn!(error = %e, "renewing the claim on the store");
                }
            }
            if Instant::now() + margin >= claim.safe_until {
                standing.send_if_modified(|s| {
                    let was = std::mem::replace(s, Standing::Unsure);
                    if was == Standing::Owner {
                        tracing::warn!("the claim on the store could not be renewed in time");
                    }
                    was != Standing::Unsure
                });
            }
        }
    }

    async fn revoke(&self, lease: i64) -> Result<(), EngineError> {
        self.members
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await
            .map(|_| ())
    }
}
