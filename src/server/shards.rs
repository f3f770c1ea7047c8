//! A replica of a store whose namespaces fall into shards (doc/cluster.md, "Shards"): every
//! replica serves, each the writes and leased reads of the namespaces of the shards it holds,
//! and names a shard's owner (`kt-owner`) for a call of a namespace it does not hold.
//!
//! What the election says (`ShardElector`) reaches the rest of the replica in one order: the
//! fence first (its transactions compare the claims it holds), then the planner's memory
//! (changes planned so far decided, what it remembered forgotten: `MetaStore::shards_moved`),
//! then the handler's admission ([`ShardGate`]); a shard handed over goes the other way (no
//! longer admitted, its changes decided, then its claim given up). Mounts watching a namespace
//! whose shard went are cut off, and watch it again at its next owner. The store's own duties
//! (collection, the ticket keys' rotation) go with the first shard; every replica answers the
//! collector's steps (`collect`), since each takes uploads, publishes and heartbeats.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;

use super::collect::Follower;
use super::duties::{Duties, Running};
use super::role::not_owner;
use super::watch::Watchers;
use crate::meta::engine::{shard_of, Fence, GcBoard, ShardElector, ShardView};
use crate::meta::MetaStore;
use crate::rpc::status::SHARDS_HEADER;

/// The shards a replica serves now, and where the others are.
#[derive(Clone, Debug, Default)]
pub(crate) struct Serving {
    pub held: BTreeSet<u32>,
    /// Each shard's owner's address, where one holds it.
    pub owners: Vec<Option<String>>,
}

/// The handler's check that this replica serves a namespace's shard.
#[derive(Clone)]
pub(crate) struct ShardGate {
    count: u32,
    serving: watch::Receiver<Serving>,
}

impl ShardGate {
    /// Admits a call of `ns` where its shard is this replica's; else refuses it naming the
    /// shard's owner, which a client of several replicas goes to at once.
    pub fn admit(&self, ns: &str) -> Result<(), tonic::Status> {
        let shard = shard_of(ns, self.count);
        let serving = self.serving.borrow();
        if serving.held.contains(&shard) {
            return Ok(());
        }
        let owner = serving
            .owners
            .get(shard as usize)
            .cloned()
            .flatten()
            .unwrap_or_default();
        let message = match owner.as_str() {
            "" => format!(
                "namespace {ns} is in shard {shard} of {}, which no replica owns yet",
                self.count
            ),
            o => format!(
                "namespace {ns} is in shard {shard} of {}, owned by the replica at {o}",
                self.count
            ),
        };
        let mut status = not_owner(message, &owner);
        if let Ok(v) = self.count.to_string().parse() {
            status.metadata_mut().insert(SHARDS_HEADER, v);
        }
        Err(status)
    }
}

/// What a replica of a sharded store runs beside its handler.
pub(super) struct Sharded {
    pub meta: Arc<MetaStore>,
    pub fence: Arc<Fence>,
    pub watchers: Arc<Watchers>,
    /// The board of the collection the replicas share, which this one follows.
    pub board: Option<GcBoard>,
    pub duties: Duties,
}

impl Sharded {
    /// Starts taking part in the election of the store's `count` shards until `stop`: the
    /// task, and the gate the handler admits calls with.
    pub fn start(
        self,
        elector: ShardElector,
        count: u32,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (tokio::task::JoinHandle<()>, ShardGate) {
        let (tx, rx) = watch::channel(Serving::default());
        let task = tokio::spawn(self.run(elector, tx, stop));
        (task, ShardGate { count, serving: rx })
    }

    /// Takes part in the shards' election until `stop`, moving the fence, the planner and
    /// `serving` with what it says.
    async fn run(
        mut self,
        elector: ShardElector,
        serving: watch::Sender<Serving>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let serving = Arc::new(serving);
        // Every replica answers the collector, whichever that is, until the election ends.
        let (follower_stop, follower_stopped) = tokio::sync::oneshot::channel::<()>();
        let following = self.board.take().map(|board| {
            let follower = Follower {
                board,
                meta: self.meta.clone(),
                fence: self.fence.clone(),
            };
            tokio::spawn(follower.run(async move {
                let _ = follower_stopped.await;
            }))
        });
        let (view_tx, mut view) = watch::channel(ShardView::default());
        let drain = {
            let (serving, meta) = (serving.clone(), self.meta.clone());
            move |shard: u32| {
                let (serving, meta) = (serving.clone(), meta.clone());
                async move {
                    serving.send_modify(|s| {
                        s.held.remove(&shard);
                    });
                    settle(&meta).await;
                }
            }
        };
        let election = tokio::spawn(elector.run(view_tx, drain, stop));
        let mut lost = self.fence.lost();
        let mut duties: Option<Running> = None;
        loop {
            tokio::select! {
                changed = view.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let v = view.borrow_and_update().clone();
                    self.fence.hold_shards(&v.held);
                    self.moved(&serving, v.owners).await;
                }
                // A transaction found a claim lost: the fence let the shard go already.
                Ok(()) = lost.changed() => {
                    let owners = serving.borrow().owners.clone();
                    self.moved(&serving, owners).await;
                }
            }
            let first = self.fence.held().contains_key(&0);
            match (first, duties.is_some()) {
                (true, false) => match self.duties.start().await {
                    Ok(running) => duties = Some(running),
                    Err(e) => tracing::error!(error = %e, "taking up the store's duties"),
                },
                (false, true) => duties = None,
                _ => {}
            }
        }
        let _ = election.await;
        let _ = follower_stop.send(());
        if let Some(following) = following {
            let _ = following.await;
        }
    }

    /// The fence holds what it holds now: where that differs from what is served, the
    /// planner settles, the handler admits it, and watchers of what went are cut off.
    async fn moved(&self, serving: &watch::Sender<Serving>, owners: Vec<Option<String>>) {
        let held: BTreeSet<u32> = self.fence.held().into_keys().collect();
        let was = serving.borrow().held.clone();
        if held != was {
            settle(&self.meta).await;
            let count = self.fence.shards();
            self.watchers
                .end_unless(|ns| held.contains(&shard_of(ns, count)));
            tracing::info!(shards = ?held, "the shards this replica serves");
        }
        serving.send_replace(Serving { held, owners });
    }
}

/// Decides what was planned and forgets the planner's memory, off the async threads.
async fn settle(meta: &Arc<MetaStore>) {
    let meta = meta.clone();
    let _ = tokio::task::spawn_blocking(move || meta.shards_moved()).await;
}
