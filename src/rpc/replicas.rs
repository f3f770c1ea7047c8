//! A store served by several replicas (cluster mode: `KT_SERVER=a,b,c`), as one [`StoreApi`]:
//! each call goes to the replica that answered last, and moves on where that one is gone or
//! does not own the store. Reads of a caller that holds no lease (resolves and listings with
//! no watcher: `kt get`, Python) go to a replica this client picked at random, which answers
//! them where it may (see `server::role`), so that many readers spread over the replicas. A replica that stands by names the owner (`kt-owner`), so the next
//! try goes there; while a dead owner's claim runs out and a standby takes over (a few
//! seconds), calls wait and try again rather than fail.
//!
//! What may be tried again: a call no replica took (it could not connect, or a replica that
//! stands by refused it) always; a call that was cut off after it was sent only if doing it
//! twice does what doing it once does (reads; a publish, since a version is the hash of its
//! manifest and publishing the version a key is at already succeeds; setting attributes;
//! heartbeats; a GPU window's calls, as a member joining again keeps its place). A rename or a remove cut off by a replica's death fails as it did before, as
//! the caller cannot know whether it was done.
//!
//! A store in shards has an owner for each: a replica refusing a namespace of another's shard
//! names that shard's owner and how many shards there are (`kt-shards`), and this client
//! keeps a route for each shard, so that a caller of several namespaces (a mount, an agent,
//! Python) goes to each namespace's owner at once rather than be refused on every switch.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::ClientError;
use super::status::Fault;
use super::store::messages::*;
use super::store::{Store, StoreApi, WatchDowns, WatchUps};
use crate::key::{namespace_hash, shard_of_hash};

/// How long a call keeps looking for the owner: beyond a dead owner's claim's time (3 s by
/// default) and a standby's look at it, with room for a slow etcd.
pub const FAILOVER_WITHIN: Duration = Duration::from_secs(20);

/// The longest pause between two rounds of the replicas: a round costs each replica a refusal,
/// and a takeover is noticed within this much of its end.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// The replicas of one store, as one.
pub struct Replicas {
    replicas: Vec<(String, Store)>,
    /// The replica that answered last.
    current: AtomicUsize,
    /// The replica that answered a lease-free read last.
    reader: AtomicUsize,
    /// How many shards the store has, once a replica said (0: not known, or owned whole).
    shards: AtomicU32,
    /// The replica that answered a call of each shard last.
    routes: Mutex<HashMap<u32, usize>>,
    within: Duration,
}

/// Which replica a call goes to first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The one that answered last: the owner, most often.
    Owner,
    /// This client's reader.
    Reader,
    /// The owner of the shard of the namespace whose hash this is (`key::namespace_hash`),
    /// where the store has shards; else as `Owner`.
    Namespace(u64),
}

/// Where a read goes: a caller with a lease (a mount's watch) reads at its namespace's owner,
/// which tells it of changes; one without, at its reader.
fn reads(watcher: u64, namespace: &str) -> Route {
    match watcher {
        0 => Route::Reader,
        _ => Route::Namespace(namespace_hash(namespace)),
    }
}

/// Where a change of `namespace` goes: its shard's owner.
fn owner_of(namespace: &str) -> Route {
    Route::Namespace(namespace_hash(namespace))
}

/// Where a call on the window of `group` goes: the owner of its namespace's shard, which
/// holds its windows (a group is `NAMESPACE/...`).
fn window_of(group: &str) -> Route {
    match group.split_once('/') {
        Some((ns, _)) if !ns.is_empty() => owner_of(ns),
        _ => Route::Owner,
    }
}

/// A replica for this process's reads: one picked by chance, so that the readers of a store
/// spread over its replicas.
fn pick(replicas: usize) -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    (nanos ^ std::process::id() as usize) % replicas.max(1)
}

/// Whether a call may be sent again after it failed so.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Doing it twice does what doing it once does.
    Always,
    /// Only where no replica took it.
    Untaken,
}

type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, ClientError>> + Send + 'a>>;

impl Replicas {
    /// `replicas`, each an address and its client; calls go to the first until it fails.
    pub fn new(replicas: Vec<(String, Store)>) -> Self {
        Replicas {
            reader: AtomicUsize::new(pick(replicas.len())),
            replicas,
            current: AtomicUsize::new(0),
            shards: AtomicU32::new(0),
            routes: Mutex::default(),
            within: FAILOVER_WITHIN,
        }
    }

    /// How long a call keeps looking for a replica that serves it.
    pub fn within(mut self, within: Duration) -> Self {
        self.within = within;
        self
    }

    /// Where a failed call goes next: the owner a standby named, if it is one of the
    /// replicas, else the replica after the one that failed.
    fn move_on(&self, route: Route, from: usize, e: &ClientError) {
        let (named, shards) = match e {
            ClientError::Remote(r) => (
                r.owner.as_deref().filter(|o| !o.is_empty()),
                r.shards.filter(|n| *n > 1),
            ),
            _ => (None, None),
        };
        if let Some(n) = shards {
            self.shards.store(n, Ordering::Relaxed);
        }
        let next = named
            .and_then(|o| self.replicas.iter().position(|(a, _)| a == o))
            .unwrap_or((from + 1) % self.replicas.len());
        match self.shard(route) {
            Some(shard) => {
                let mut routes = crate::locks::lock(&self.routes);
                let at = routes.entry(shard).or_insert(from);
                if *at == from {
                    *at = next;
                }
            }
            None => {
                // Another call may have moved on already; it knows as much as this one.
                let _ =
                    self.at(route)
                        .compare_exchange(from, next, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }

    /// The shard a call of `route` is for, where the store has shards.
    fn shard(&self, route: Route) -> Option<u32> {
        let Route::Namespace(hash) = route else {
            return None;
        };
        match self.shards.load(Ordering::Relaxed) {
            0 | 1 => None,
            n => Some(shard_of_hash(hash, n)),
        }
    }

    /// The replica a call of `route` goes to first.
    fn first(&self, route: Route) -> usize {
        let at = match self.shard(route) {
            Some(s) => crate::locks::lock(&self.routes).get(&s).copied(),
            None => None,
        };
        at.unwrap_or_else(|| self.at(route).load(Ordering::SeqCst)) % self.replicas.len()
    }

    fn at(&self, route: Route) -> &AtomicUsize {
        match route {
            Route::Owner | Route::Namespace(_) => &self.current,
            Route::Reader => &self.reader,
        }
    }

    /// Calls `f` on one replica after another until one serves it, for at most `within`.
    async fn call<'a, T>(
        &'a self,
        route: Route,
        retry: Retry,
        mut f: impl FnMut(&'a Store) -> Call<'a, T>,
    ) -> Result<T, ClientError> {
        let deadline = Instant::now() + self.within;
        let mut pause = Duration::from_millis(50);
        let mut failed_in_round = 0;
        loop {
            let at = self.first(route);
            let e = match f(&self.replicas[at].1).await {
                Err(e) if moves_on(&e, retry) => e,
                answered => return answered,
            };
            tracing::debug!(replica = %self.replicas[at].0, error = %e, "trying another replica");
            self.move_on(route, at, &e);
            failed_in_round += 1;
            if failed_in_round >= self.replicas.len() {
                // Every replica was tried: wait for a standby to take a dead owner's place.
                failed_in_round = 0;
                if Instant::now() + pause > deadline {
                    return Err(e);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

/// Whether a call that failed with `e` goes to another replica.
fn moves_on(e: &ClientError, retry: Retry) -> bool {
    match e {
        // Nothing was sent.
        ClientError::Unreachable { .. } => true,
        ClientError::AgentUnreachable { .. } => false,
        // A replica that does not own the store refused it: nothing was done.
        ClientError::Remote(r) if r.owner.is_some() => true,
        ClientError::Remote(r) if r.fault == Fault::Unreachable => {
            retry == Retry::Always || never_connected(&r.message)
        }
        // The connection broke under the call (tonic says so with another code).
        ClientError::Remote(r) => retry == Retry::Always && cut_off(&r.message),
    }
}

/// Whether a call failed because its connection broke, not because a replica answered so.
fn cut_off(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "transport error",
        "h2 protocol error",
        "connection reset",
        "broken pipe",
        // The replica stopped answering its connection's pings (`rpc::client`).
        "keep-alive",
        "keepalive",
        // The connection's task ended (its replica died) with the call queued or in flight.
        "operation was canceled",
    ]
    .iter()
    .any(|s| m.contains(s))
}

/// Whether a transport failure happened before the call could be sent (the connection was
/// never made).
fn never_connected(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "connect error",
        "connection refused",
        "error trying to connect",
        "dns error",
    ]
    .iter()
    .any(|s| m.contains(s))
}

/// One method per RPC: the request is cloned for each try; `route` says from the request where
/// it goes first.
macro_rules! routed {
    ($($name:ident($req:ty) -> $resp:ty, $retry:expr, $route:expr;)*) => {
        #[async_trait::async_trait]
        impl StoreApi for Replicas {
            $(
                async fn $name(&self, req: $req) -> Result<$resp, ClientError> {
                    let route: fn(&$req) -> Route = $route;
                    self.call(route(&req), $retry, |s| {
                        let req = req.clone();
                        Box::pin(async move { s.$name(req).await })
                    })
                    .await
                }
            )*

            /// A watch goes to the owner, its first messages sent again on each try (the
            /// owner reads the first before it answers); once one takes it, what the watcher
            /// sends after goes there.
            async fn watch(&self, mut ups: WatchUps) -> Result<WatchDowns, ClientError> {
                let mut early = Vec::new();
                let (down, tx) = self
                    .call(Route::Owner, Retry::Always, |s| {
                        while let Ok(m) = ups.try_recv() {
                            early.push(m);
                        }
                        let (tx, rx) = tokio::sync::mpsc::channel(early.len().max(1) + 16);
                        for m in &early {
                            let _ = tx.try_send(m.clone());
                        }
                        Box::pin(async move { s.watch(rx).await.map(|d| (d, tx)) })
                    })
                    .await?;
                tokio::spawn(async move {
                    while let Some(m) = ups.recv().await {
                        if tx.send(m).await.is_err() {
                            break;
                        }
                    }
                });
                Ok(down)
            }
        }
    };
}

routed! {
    register_node(RegisterNodeRequest) -> RegisterNodeResponse, Retry::Always, |_| Route::Owner;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse, Retry::Always, |_| Route::Owner;
    missing_blocks(MissingBlocksRequest) -> MissingBlocksResponse, Retry::Always, |_| Route::Owner;
    publish(PublishRequest) -> PublishResponse, Retry::Always, |r| owner_of(&r.namespace);
    publish_batch(PublishBatchRequest) -> PublishBatchResponse, Retry::Always, |r| owner_of(&r.namespace);
    publish_gpu(PublishGpuRequest) -> PublishResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    resolve(ResolveRequest) -> ResolveResponse, Retry::Always, |r| reads(r.watcher, &r.namespace);
    resolve_many(ResolveManyRequest) -> ResolveManyResponse, Retry::Always, |r| reads(r.watcher, &r.namespace);
    list(ListRequest) -> ListResponse, Retry::Always, |r| reads(r.watcher, &r.namespace);
    remove(RemoveRequest) -> RemoveResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    add_location(AddLocationRequest) -> AddLocationResponse, Retry::Always, |_| Route::Owner;
    version_blocks(VersionBlocksRequest) -> VersionBlocksResponse, Retry::Always, |_| Route::Owner;
    rename(RenameRequest) -> RenameResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    exchange(ExchangeRequest) -> RenameResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    link(LinkRequest) -> LinkResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    set_attr(SetAttrRequest) -> SetAttrResponse, Retry::Always, |r| owner_of(&r.namespace);
    join_broadcast(JoinRequest) -> JoinResponse, Retry::Untaken, |r| owner_of(&r.namespace);
    new_parent(NewParentRequest) -> NewParentResponse, Retry::Untaken, |r| window_of(&r.group_id);
    leave_broadcast(LeaveRequest) -> LeaveResponse, Retry::Untaken, |r| window_of(&r.group_id);
    swarm_sync(SwarmSyncRequest) -> SwarmSyncReply, Retry::Untaken, |r| window_of(&r.group_id);
    get_window(GetWindowRequest) -> Window, Retry::Always, |r| window_of(&r.group_id);
    registration_secret(RegistrationSecretRequest) -> RegistrationSecretResponse, Retry::Always, |_| Route::Owner;
    join_gpu_window(GpuJoinRequest) -> GpuJoinResponse, Retry::Always, |r| owner_of(&r.namespace);
    await_gpu_window(GpuAwaitRequest) -> GpuWindow, Retry::Always, |r| window_of(&r.group_id);
    finish_gpu_window(GpuFinishRequest) -> GpuFinishResponse, Retry::Always, |r| window_of(&r.group_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::RemoteError;

    fn remote(fault: Fault, message: &str, owner: Option<&str>) -> ClientError {
        let mut e = RemoteError::new(fault, message);
        e.owner = owner.map(str::to_string);
        ClientError::Remote(e)
    }

    /// A refusal naming a shard's owner and the store's shards routes that shard's calls
    /// there, and no other shard's: a caller of several namespaces goes to each one's owner.
    #[tokio::test]
    async fn a_shards_owner_named_in_a_refusal_takes_that_shards_calls_alone() {
        let addrs = ["10.0.0.1:7447", "10.0.0.2:7447", "10.0.0.3:7447"];
        let none = crate::auth::Credential::none();
        let r = Replicas::new(
            addrs
                .iter()
                .map(|a| {
                    (
                        a.to_string(),
                        super::super::client::store_lazy(a, &none).unwrap(),
                    )
                })
                .collect(),
        );
        let ns_in = |shard: u32| {
            (0..)
                .map(|i| format!("team-{i}"))
                .find(|ns| crate::key::shard_of(ns, 8) == shard)
                .unwrap()
        };
        let (x, y) = (owner_of(&ns_in(1)), owner_of(&ns_in(5)));
        assert_eq!((r.first(x), r.first(y)), (0, 0));
        let refused = |owner: &str| {
            let mut e = RemoteError::new(Fault::Unreachable, "another replica's shard");
            e.owner = Some(owner.into());
            e.shards = Some(8);
            ClientError::Remote(e)
        };
        r.move_on(x, 0, &refused(addrs[2]));
        assert_eq!((r.first(x), r.first(y)), (2, 0));
        r.move_on(y, 0, &refused(addrs[1]));
        assert_eq!((r.first(x), r.first(y)), (2, 1));
        // A read with a lease goes to its namespace's owner too, as a window's calls go to
        // their group's; calls of no namespace, and lease-free reads, where they went.
        assert_eq!(r.first(reads(7, &ns_in(1))), 2);
        assert_eq!(r.first(window_of(&format!("{}/weights", ns_in(5)))), 1);
        assert_eq!(r.first(window_of("no-namespace")), 0);
        assert_eq!(r.first(Route::Owner), 0);
        assert_eq!(r.first(reads(0, &ns_in(1))), r.first(Route::Reader));
    }

    /// What goes to another replica: a call no replica took, always; one cut off after it was
    /// sent, only where doing it twice does what once does; an answer, never.
    #[test]
    fn a_call_moves_on_only_where_sending_it_again_is_safe() {
        let refused = remote(
            Fault::Unreachable,
            "tcp connect error: Connection refused",
            None,
        );
        let standby = remote(Fault::Unreachable, "stands by", Some("10.0.0.2:7447"));
        let unknown_owner = remote(Fault::Unreachable, "stands by", Some(""));
        let cut = remote(Fault::Internal, "transport error", None);
        let broken = remote(Fault::Unreachable, "connection reset by peer", None);
        let canceled = remote(Fault::Timeout, "operation was canceled", None);
        assert!(moves_on(&canceled, Retry::Always) && !moves_on(&canceled, Retry::Untaken));
        for retry in [Retry::Always, Retry::Untaken] {
            assert!(moves_on(&refused, retry));
            assert!(moves_on(&standby, retry));
            assert!(moves_on(&unknown_owner, retry));
        }
        assert!(moves_on(&cut, Retry::Always));
        assert!(moves_on(&broken, Retry::Always));
        assert!(
            !moves_on(&cut, Retry::Untaken),
            "a rename cut off could be done twice"
        );
        assert!(!moves_on(&broken, Retry::Untaken));
        for answered in [
            remote(Fault::NotFound, "no such key", None),
            remote(Fault::Exists, "exists", None),
            remote(Fault::Internal, "a corrupt record", None),
        ] {
            assert!(!moves_on(&answered, Retry::Always), "{answered}");
        }
    }
}
