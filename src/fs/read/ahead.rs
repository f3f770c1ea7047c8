//! Versions resolved ahead of a reader going through a directory of small files (`cat *`,
//! `cp -r`, `tar`, imports), their bytes inline: kept under the watch's lease, so most opens
//! need no request of their own. Soon after a reader enters a batch, the next is asked for in
//! the background, so it does not wait for one at each batch's end; an open that reaches a
//! batch still under way waits for it rather than asking again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

use super::file::file_entry;
use super::loader::Loader;
use crate::fs::config::FsConfig;
use crate::fs::names::listings::Listings;
use crate::fs::paths::split;
use crate::hash::BlockHash;
use crate::locks::lock;
use crate::manifest::FileEntry;
use crate::proto::{InlineBlock, Locale, ResolveManyRequest, ResolveResponse};
use crate::rpc::client::Store;
use crate::rpc::MAX_INLINE_FILE;

/// Small files of a directory resolved in one batch, at most, and their bytes.
pub(super) const RESOLVE_AHEAD: usize = 63;
pub(super) const RESOLVE_AHEAD_BYTES: u64 = 768 << 10;
/// The file of a batch whose open asks for the next one: early, so that the next has most of
/// a batch's opens to arrive in (bench/smallfiles.sh: asked halfway, a third of them came too
/// late on two busy cores, and their opens asked again).
const NEXT_AT: usize = 4;
const MAX_TRIGGERS: usize = 4096;

/// A batch asked for in the background: its keys, and whether it is answered.
struct UnderWay {
    keys: HashSet<String>,
    done: watch::Receiver<bool>,
}

/// What resolving ahead needs; shared with the batches asked in the background.
pub(super) struct Ahead {
    pub(super) cfg: Arc<FsConfig>,
    pub(super) store: Store,
    pub(super) listings: Arc<Listings>,
    pub(super) loader: Arc<Loader>,
    /// The file whose open asks for the next batch, of each batch asked.
    triggers: Mutex<HashSet<String>>,
    /// The batch under way in the background, of each directory (one each at a time).
    under_way: Mutex<HashMap<String, UnderWay>>,
}

impl Ahead {
    pub(super) fn new(
        cfg: Arc<FsConfig>,
        store: Store,
        listings: Arc<Listings>,
        loader: Arc<Loader>,
    ) -> Self {
        Ahead {
            cfg,
            store,
            listings,
            loader,
            triggers: Mutex::default(),
            under_way: Mutex::default(),
        }
    }

    /// A batch of `keys` was asked for: the open of its `NEXT_AT`th asks for the next.
    pub(super) fn asked(&self, keys: &[String]) {
        let Some(k) = keys.get(NEXT_AT.min(keys.len().saturating_sub(1))) else {
            return;
        };
        let mut triggers = lock(&self.triggers);
        // Those of readers that stopped short stay; past a bound they go (a lost trigger only
        // costs a batch its head start).
        if triggers.len() >= MAX_TRIGGERS {
            triggers.clear();
        }
        triggers.insert(k.clone());
    }

    /// Waits for the batch under way that holds `path`, if one does: whether one did.
    pub(super) async fn wait_for(&self, path: &str) -> bool {
        let done = {
            let under_way = lock(&self.under_way);
            match under_way.get(split(path).0) {
                Some(u) if u.keys.contains(path) => u.done.clone(),
                _ => return false,
            }
        };
        let mut done = done;
        // The sender goes only once the batch is answered: either way it is over.
        let _ = done.wait_for(|d| *d).await;
        true
    }

    /// `path` opened on a version kept ahead: where it is a batch's trigger, the next batch
    /// (the small files after what is kept) is asked for in the background. Measured in
    /// bench/smallfiles.sh: without it every 64th open of `cat *` waited for a round trip.
    pub(super) fn read_on(self: &Arc<Self>, path: &str) {
        if !lock(&self.triggers).remove(path) {
            return;
        }
        let dir = split(path).0.to_string();
        if lock(&self.under_way).contains_key(&dir) {
            return;
        }
        let keys = self
            .listings
            .next_small_files(path, RESOLVE_AHEAD + 1, RESOLVE_AHEAD_BYTES);
        if keys.is_empty() {
            return;
        }
        let (tx, rx) = watch::channel(false);
        lock(&self.under_way).insert(
            dir.clone(),
            UnderWay {
                keys: keys.iter().cloned().collect(),
                done: rx,
            },
        );
        self.asked(&keys);
        crate::metrics::MOUNT_METADATA_REQUESTS.inc();
        let since = self.listings.epoch();
        let me = self.clone();
        tokio::spawn(async move {
            let asked = me
                .store
                .resolve_many(ResolveManyRequest {
                    watcher: me.listings.watcher(),
                    namespace: me.cfg.namespace.to_string(),
                    keys: keys.clone(),
                    inline_up_to: MAX_INLINE_FILE,
                })
                .await;
            // Only a help: a failure leaves each open to ask for itself.
            match asked {
                Ok(resp) if resp.results.len() == keys.len() => {
                    for (key, res) in keys.iter().zip(resp.results) {
                        if let Some(r) = res.resolved {
                            me.keep(key, r, since);
                        }
                    }
                    crate::metrics::MOUNT_RESOLVED_AHEAD.inc();
                }
                Ok(_) => tracing::debug!("a batch resolved ahead came back short"),
                Err(e) => tracing::debug!(error = %e, "no batch resolved ahead"),
            }
            lock(&me.under_way).remove(&dir);
            let _ = tx.send(true);
        });
    }

    /// Keeps a version resolved ahead of its open, once its bytes are here: a kept version
    /// whose bytes are not would cost its reader a fetch, where a resolve of its own would
    /// have brought them inline. Anything odd in it is left for its own open to find.
    pub(super) fn keep(&self, path: &str, mut r: ResolveResponse, since: u64) {
        let Ok(entry) = file_entry(&r) else {
            return;
        };
        let inline = std::mem::take(&mut r.inline_blocks);
        let held = self.take_inline(&entry, inline);
        let here = entry
            .blocks
            .iter()
            .all(|b| BlockHash::from_slice(&b.hash).is_some_and(|h| held.contains(&h)));
        if (here || r.locale() != Locale::Store) && self.may_keep(&r) {
            self.listings.put_resolved(path, Arc::new(r), since);
        }
    }

    /// Whether a resolved version may be kept under the lease: an expiry is not told to
    /// watchers, and a read ticket runs out (the node's own ticket lasts as long as the node),
    /// so such answers are asked for at every open.
    pub(super) fn may_keep(&self, r: &ResolveResponse) -> bool {
        r.expires_unix_ms == 0 && (!self.cfg.node_ticket.get().is_empty() || r.ticket.is_empty())
    }

    /// Keeps the blocks a resolve sent inline (a small file), so its reads need no fetch. Only
    /// blocks of the entry are taken; one that fails its hash is dropped (the read fetches it).
    /// The node does not register as a source of them: the store sends a small file's bytes
    /// inline to every reader, so no one would ask this node, and the registration cost the
    /// server a write per file read.
    /// Returns the blocks of the entry this node now holds from them.
    pub(super) fn take_inline(
        &self,
        entry: &FileEntry,
        blocks: Vec<InlineBlock>,
    ) -> HashSet<BlockHash> {
        let mut held = HashSet::new();
        for b in blocks {
            let Some(hash) = BlockHash::from_slice(&b.hash) else {
                continue;
            };
            if !entry.blocks.iter().any(|e| e.hash == b.hash) {
                continue;
            }
            match self.loader.accept(hash, Bytes::from(b.data)) {
                Ok(()) => {
                    held.insert(hash);
                }
                Err(e) => tracing::warn!(error = %e, "inline block dropped"),
            }
        }
        held
    }
}
