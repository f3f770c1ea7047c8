//! The fence of a store that several replicas serve: a replica writes only while the claims
//! that cover its writes still name it. Every transaction it sends compares the revision of
//! each such claim with the one its election wrote, so a replica that lost a claim (its lease
//! expired while it was paused, or cut off) commits nothing under it, whatever it still
//! believes (doc/cluster.md, Replicas).
//!
//! A store owned whole has one claim (`owner`), covering every write. A store whose namespaces
//! fall into shards has one claim a shard (`owner/<shard>`): a namespace's rows are covered by
//! its shard's claim, and the shards are held and lost one by one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::RwLock;

use tokio::sync::watch;

use super::seam::{Compare, EngineError, Revision};

/// Where the owner's claim lies, beside the tables (whose keys begin with their tag).
pub const OWNER_KEY: &[u8] = b"owner";

/// The claims a replica's transactions must still hold, and word of their loss.
pub struct Fence {
    /// How many shards the store's namespaces fall into; 1: the store is owned whole.
    shards: AtomicU32,
    /// The claims held: each shard's, with the revision it was written at.
    held: RwLock<BTreeMap<u32, Revision>>,
    /// A store owned whole: its claim was found lost, which no renewal undoes.
    broken: watch::Sender<bool>,
    /// Of a sharded store: how many times a transaction found a held shard's claim lost.
    lost: watch::Sender<u64>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            shards: AtomicU32::new(1),
            held: RwLock::default(),
            broken: watch::channel(false).0,
            lost: watch::channel(0).0,
        }
    }
}

/// The key of `shard`'s claim among `shards`.
pub fn claim_key(shard: u32, shards: u32) -> Vec<u8> {
    match shards {
        0 | 1 => OWNER_KEY.to_vec(),
        _ => format!("owner/{shard}").into_bytes(),
    }
}

impl Fence {
    /// How many shards the store's namespaces fall into (1: owned whole).
    pub fn shards(&self) -> u32 {
        self.shards.load(Ordering::Relaxed)
    }

    /// The store's shards, as its tables found them when they were opened.
    pub(super) fn set_shards(&self, shards: u32) {
        self.shards.store(shards.max(1), Ordering::Relaxed);
    }

    /// From now on every transaction compares the owner key with `claimed`, the revision at
    /// which this replica's claim on the whole store was written.
    pub fn hold(&self, claimed: Revision) {
        self.hold_shards(&BTreeMap::from([(0, claimed)]));
    }

    /// The shards this replica holds now, each with its claim's revision: a transaction that
    /// writes another shard's rows is refused before it is sent.
    pub fn hold_shards(&self, held: &BTreeMap<u32, Revision>) {
        *self.held.write().unwrap_or_else(|p| p.into_inner()) = held.clone();
    }

    /// The shards held, with their claims' revisions.
    pub fn held(&self) -> BTreeMap<u32, Revision> {
        self.held.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The revision of `shard`'s claim, while this replica holds it and may write.
    pub(super) fn revision(&self, shard: u32) -> Option<Revision> {
        if *self.broken.borrow() {
            return None;
        }
        self.held
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shard)
            .copied()
    }

    /// The compare a transaction writing `shard`'s rows carries, or why this replica may not
    /// write them.
    pub(super) fn compare(&self, shard: u32) -> Result<Compare, EngineError> {
        if *self.broken.borrow() {
            return Err(EngineError::NotOwner(
                "another replica took the store over".into(),
            ));
        }
        let shards = self.shards();
        match self.revision(shard) {
            Some(modified) => Ok(Compare {
                key: claim_key(shard, shards),
                modified,
            }),
            None if shards == 1 => Err(EngineError::NotOwner("it stands by".into())),
            None => Err(EngineError::NotOwner(format!(
                "another replica owns shard {shard} of {shards}"
            ))),
        }
    }

    /// A transaction of a store in shards comparing `compare` found it changed: that shard is
    /// another replica's now, and lost alone (a store owned whole is lost whole: `broke`).
    pub(super) fn lost_claim(&self, compare: &Compare) {
        let shards = self.shards();
        let mut held = self.held.write().unwrap_or_else(|p| p.into_inner());
        let shard = held
            .iter()
            .find(|(s, rev)| claim_key(**s, shards) == compare.key && **rev == compare.modified)
            .map(|(s, _)| *s);
        if let Some(s) = shard {
            held.remove(&s);
            tracing::warn!(shard = s, "another replica claimed this replica's shard");
            self.lost.send_modify(|n| *n += 1);
        }
    }

    /// A transaction's compare of the owner key failed: another replica owns the store now.
    pub fn broke(&self) {
        self.broken.send_replace(true);
    }

    /// Waits until the claim is found lost (by a transaction or by the claim's keeper).
    pub async fn broken(&self) {
        let mut rx = self.broken.subscribe();
        // The sender lives as long as `self`, so the wait ends only when it says so.
        let _ = rx.wait_for(|b| *b).await;
    }

    pub fn is_broken(&self) -> bool {
        *self.broken.borrow()
    }

    /// Word of each shard a transaction found lost (its count moves), for the replica to
    /// forget what it kept of the shard.
    pub fn lost(&self) -> watch::Receiver<u64> {
        self.lost.subscribe()
    }
}
