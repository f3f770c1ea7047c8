//! Shards of a store's namespaces, and which replica owns each (doc/cluster.md, "Shards"):
//! a namespace belongs to one of a fixed number of shards, and each shard to one live replica
//! at a time, so that the writes of different namespaces are planned and committed by
//! different replicas. Not yet served through: the store is still owned whole
//! (`owner::Elector`); this is the election the shards will stand on.
//!
//! Every replica registers under one etcd lease of its own (`PREFIX/servers/<id>`, naming
//! the address its clients reach it at) and claims shards under the same lease
//! (`PREFIX/owner/<shard>`, naming its address and id): one keep-alive renews them all, and a
//! replica's death frees every shard it held at once. Each replica computes, from the live
//! replicas, which one each shard should belong to ([`assign`]: the same answer everywhere);
//! it claims the unowned shards assigned to it, and hands over the shards it holds that are
//! assigned to another: it lets the caller drain the shard (stop admitting its calls, let what
//! it took commit), then deletes its claim, compared at the claim's revision, and the other
//! claims it at its next look. A shard left unowned for a while (its replica slow to look) is
//! claimed by whichever replica sees it first, and handed over later. The revision of a claim
//! is the shard's fence: a transaction of the shard's rows compares it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use tokio::sync::watch;

use super::etcd_url::EtcdUrl;
use super::lease::renew;
use super::members::{header_revision, Beside, Members};
use super::seam::{EngineError, Revision};

/// Where the replicas register, beside the tables: its first byte is no table's tag (as
/// `replicas/` was: the block references' `r`, whose rebuild deleted every registration).
pub(super) const REPLICAS: &[u8] = b"servers/";
/// Where the shards' claims lie: `owner/<shard>` (the store's one claim is `owner`).
pub(super) const CLAIMS: &[u8] = b"owner/";
/// Looks a shard stays unowned before a replica it is not assigned to claims it.
const UNOWNED_LOOKS: u32 = 8;

pub use crate::key::shard_of;

/// How much replica `id` wants shard `shard` (rendezvous hashing: a replica's arrival or
/// departure changes no other pair's score).
fn score(shard: u32, id: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&shard.to_le_bytes());
    h.update(id.as_bytes());
    *h.finalize().as_bytes()
}

/// Which of `live` (replica ids) each of `count` shards belongs to: the pairs of a shard and
/// a replica taken in the order of how much the replica wants the shard, each where the shard
/// has no replica yet and the replica is below its fair share (`count` over the live, rounded
/// up). A replica's arrival or departure moves its own shards and few others; every replica
/// that sees the same live set computes the same.
pub fn assign(count: u32, live: &[String]) -> Vec<Option<usize>> {
    let mut out = vec![None; count as usize];
    if live.is_empty() {
        return out;
    }
    let fair = (count as usize).div_ceil(live.len());
    let mut pairs: Vec<([u8; 32], u32, usize)> = (0..count)
        .flat_map(|s| (0..live.len()).map(move |r| (s, r)))
        .map(|(s, r)| (score(s, &live[r]), s, r))
        .collect();
    pairs.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0usize; live.len()];
    for (_, s, r) in pairs {
        let slot = &mut out[s as usize];
        if slot.is_none() && load[r] < fair {
            *slot = Some(r);
            load[r] += 1;
        }
    }
    out
}

/// The shards as a replica last saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardView {
    /// Each shard's owner's address, where one holds it.
    pub owners: Vec<Option<String>>,
    /// The shards this replica holds, each with its claim's revision (the shard's fence);
    /// empty while it is unsure its lease lives.
    pub held: BTreeMap<u32, Revision>,
    /// The live replicas' ids, in order.
    pub live: Vec<String>,
}

/// A claim as read: who holds it, under which lease, written at which revision.
struct Held {
    addr: String,
    id: String,
    lease: i64,
    modified: Revision,
}

/// A replica's part in owning a store's shards.
pub struct ShardElector {
    members: Members,
    prefix: Vec<u8>,
    me: String,
    id: String,
    ttl: Duration,
    count: u32,
    /// Looks each shard has been seen unowned in a row.
    unowned: Vec<u32>,
}

impl ShardElector {
    /// The election of the `count` shards of the store `url` names, for replica `id` reached
    /// at `me`, its claims living `ttl` without renewal.
    pub fn new(url: &EtcdUrl, me: &str, id: &str, ttl: Duration, count: u32) -> Self {
        ShardElector {
            members: Members::new(url),
            prefix: url.prefix.as_bytes().to_vec(),
            me: me.to_string(),
            id: id.to_string(),
            ttl: ttl.max(Duration::from_secs(2)),
            count: count.max(1),
            unowned: vec![0; count.max(1) as usize],
        }
    }

    fn key(&self, table: &[u8], rest: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(table);
        k.extend_from_slice(rest.as_bytes());
        k
    }

    fn look(&self) -> Duration {
        (self.ttl / 4).min(Duration::from_millis(250))
    }

    /// Takes part until `stop` (then gives every claim up at once, revoking the lease),
    /// telling `view` where the shards stand after each look; `drain(shard)` runs before a
    /// held shard is handed over. Outlives an etcd that comes and goes: a lease that lapsed
    /// is granted anew and the shards claimed again.
    pub async fn run<D, F>(
        mut self,
        view: watch::Sender<ShardView>,
        drain: D,
        stop: impl Future<Output = ()>,
    ) where
        D: Fn(u32) -> F,
        F: Future<Output = ()>,
    {
        tokio::pin!(stop);
        loop {
            let registered = tokio::select! {
                _ = &mut stop => return,
                r = self.register() => r,
            };
            let (lease, asked) = match registered {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "registering as a replica of the store");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(self.look()) => continue,
                    }
                }
            };
            let stopped = self.serve(lease, asked, &view, &drain, &mut stop).await;
            view.send_modify(|v| v.held.clear());
            if stopped {
                if let Err(e) = self.revoke(lease).await {
                    tracing::warn!(error = %e, "giving up the store's shards");
                }
                return;
            }
        }
    }

    /// A fresh lease, and this replica's registration under it.
    async fn register(&self) -> Result<(i64, Instant), EngineError> {
        let asked = Instant::now();
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let lease = self
            .members
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?
            .id();
        let key = self.key(REPLICAS, &self.id);
        let me = self.me.clone();
        self.members
            .call(|mut c| {
                let (key, me) = (key.clone(), me.clone());
                async move {
                    c.put(key, me, Some(PutOptions::new().with_lease(lease)))
                        .await
                }
            })
            .await?;
        Ok((lease, asked))
    }

    /// Looks and claims under `lease` until it lapses (false) or `stop` (true).
    async fn serve<D, F>(
        &mut self,
        lease: i64,
        asked: Instant,
        view: &watch::Sender<ShardView>,
        drain: &D,
        stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> bool
    where
        D: Fn(u32) -> F,
        F: Future<Output = ()>,
    {
        let mut safe_until = asked + self.ttl;
        let mut renewal: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
        let margin = self.look();
        loop {
            tokio::select! {
                _ = stop.as_mut() => return true,
                _ = tokio::time::sleep(self.look()) => {}
            }
            let renewed = Instant::now();
            match renew(&self.members, &mut renewal, lease, self.ttl).await {
                Ok(true) => safe_until = renewed + self.ttl,
                Ok(false) => {
                    tracing::warn!("this replica's lease lapsed: its shards are lost");
                    return false;
                }
                Err(e) => {
                    renewal = None;
                    tracing::warn!(error = %e, "renewing this replica's lease");
                }
            }
            if Instant::now() + margin >= safe_until {
                // Unsure whether the lease lives: serve no shard until a renewal says.
                view.send_modify(|v| v.held.clear());
                continue;
            }
            match self.look_once(lease, drain).await {
                Ok(v) => {
                    view.send_replace(v);
                }
                Err(e) => tracing::warn!(error = %e, "looking at the store's shards"),
            }
        }
    }

    /// One look: the live replicas and the claims read, the shards this replica should hold
    /// claimed, those it should not handed over.
    async fn look_once<D, F>(&mut self, lease: i64, drain: &D) -> Result<ShardView, EngineError>
    where
        D: Fn(u32) -> F,
        F: Future<Output = ()>,
    {
        let mut live: Vec<(String, String)> = self
            .range(REPLICAS)
            .await?
            .into_iter()
            .map(|(k, v, _, _)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        live.sort();
        let mut claims: Vec<Option<Held>> = (0..self.count).map(|_| None).collect();
        for (k, v, lease, modified) in self.range(CLAIMS).await? {
            let Some(slot) = k.parse::<usize>().ok().and_then(|s| claims.get_mut(s)) else {
                continue;
            };
            let v = String::from_utf8_lossy(&v);
            let (addr, id) = v.split_once(' ').unwrap_or((&v, ""));
            *slot = Some(Held {
                addr: addr.to_string(),
                id: id.to_string(),
                lease,
                modified,
            });
        }
        let ids: Vec<String> = live.iter().map(|(id, _)| id.clone()).collect();
        let target = assign(self.count, &ids);
        let mine = |s: usize| target[s].map(|r| ids[r].as_str()) == Some(self.id.as_str());
        let mut held = BTreeMap::new();
        let mut owners = Vec::with_capacity(claims.len());
        for (s, claim) in claims.into_iter().enumerate() {
            let shard = u32::try_from(s).unwrap_or(u32::MAX);
            self.unowned[s] = match &claim {
                None => self.unowned[s].saturating_add(1),
                Some(_) => 0,
            };
            let owner = match claim {
                // Held under this life's lease: kept, or handed over to the replica it is
                // assigned to.
                Some(c) if c.id == self.id && c.lease == lease => {
                    if target[s].is_some() && !mine(s) {
                        drain(shard).await;
                        self.give_up(shard, c.modified).await?;
                        None
                    } else {
                        held.insert(shard, c.modified);
                        Some(c.addr)
                    }
                }
                // This replica's previous life's, or no one's: claimed where it is this
                // replica's to hold (or has been no one's too long).
                c if c.as_ref().is_none_or(|c| c.id == self.id)
                    && (mine(s) || self.unowned[s] >= UNOWNED_LOOKS) =>
                {
                    match self
                        .claim(shard, lease, c.as_ref().map(|c| c.modified))
                        .await?
                    {
                        Some(rev) => {
                            held.insert(shard, rev);
                            Some(self.me.clone())
                        }
                        None => None,
                    }
                }
                c => c.map(|c| c.addr),
            };
            owners.push(owner);
        }
        Ok(ShardView {
            owners,
            held,
            live: ids,
        })
    }

    /// Every entry under `table`: the key past it, the value, its lease and revision.
    async fn range(&self, table: &[u8]) -> Result<Vec<Beside>, EngineError> {
        self.members.beside(self.key(table, "")).await
    }

    /// Claims `shard` under `lease` where it is still as read (absent, or this replica's
    /// previous claim at `was`): the claim's revision, or `None` where another took it first.
    async fn claim(
        &self,
        shard: u32,
        lease: i64,
        was: Option<Revision>,
    ) -> Result<Option<Revision>, EngineError> {
        let key = self.key(CLAIMS, &shard.to_string());
        let expected = match was {
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Some(r) => Compare::mod_revision(key.clone(), CompareOp::Equal, r),
        };
        let txn = Txn::new().when([expected]).and_then([TxnOp::put(
            key,
            format!("{} {}", self.me, self.id),
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let resp = self.members.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        tracing::info!(shard, "this replica owns the shard now");
        Ok(Some(header_revision(resp.header())))
    }

    /// Deletes this replica's claim on `shard`, where it is still the one written at `claimed`.
    async fn give_up(&self, shard: u32, claimed: Revision) -> Result<(), EngineError> {
        let key = self.key(CLAIMS, &shard.to_string());
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                claimed,
            )])
            .and_then([TxnOp::delete(key, None)]);
        self.members.txn(txn).await?;
        tracing::info!(shard, "handed the shard over");
        Ok(())
    }

    async fn revoke(&self, lease: i64) -> Result<(), EngineError> {
        self.members
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests;
