//! The handler's state, and what every part of it shares: who may use a namespace or a
//! window, tickets, and telling watchers of a change.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::auth::gpu_secret;
use crate::auth::ticket::{Grant, TicketKey};
use crate::broadcast::windows::Broadcasts;
use crate::broadcast::windows::GpuWindows;
use crate::clock::SharedClock;
use crate::key::Namespace;
use crate::meta::engine::Standing;
use crate::meta::MetaStore;
use crate::server::auth::{group_namespace, may_use};
use crate::server::role::refusal;
use crate::server::shards::ShardGate;
use crate::server::status::{blocking, parse_ns};
use crate::server::tickets::TicketKeys;
use crate::server::watch::Watchers;

/// The gRPC handler; sockets and shutdown belong to [`crate::server::StoreServerProcess`].
pub struct StoreHandler {
    pub(crate) meta: Arc<MetaStore>,
    /// The data plane's ticket keys by epoch; `None` where callers are not authenticated.
    pub(crate) tickets: Option<Arc<TicketKeys>>,
    /// The seed the GPU host key is derived from; with `tickets`.
    pub(crate) gpu_seed: Option<TicketKey>,
    pub(crate) clock: SharedClock,
    pub(crate) windows: Arc<std::sync::Mutex<Broadcasts>>,
    /// Wakes putters waiting for a quorum whenever someone joins.
    pub(crate) joined: Arc<tokio::sync::Notify>,
    pub(crate) gpu_windows: Arc<std::sync::Mutex<GpuWindows>>,
    /// Wakes whoever waits on a GPU window whenever one changes.
    pub(crate) gpu_changed: Arc<tokio::sync::Notify>,
    /// The mounts watching each namespace; every change waits for them (see [`crate::server::watch`]).
    pub(crate) watchers: Arc<Watchers>,
    /// Swarm members whose syncs wait for fetches, by window, generation and member.
    pub(crate) swarm_waits: Arc<std::sync::Mutex<SwarmWaits>>,
    /// Whether this replica owns the store (a single server always does).
    pub(crate) standing: tokio::sync::watch::Receiver<Standing>,
    /// Of a store in shards, which namespaces this replica serves (the store's standing is
    /// then always its owner's: every replica serves some).
    pub(crate) shards: Option<ShardGate>,
}

pub(crate) type SwarmWaits =
    std::collections::HashMap<(String, u64, u64), Arc<tokio::sync::Notify>>;

/// A change that touched more keys than this is sent to watchers as a change of its
/// namespace's root (everything), not key by key.
const WATCH_MAX_PATHS: usize = 256;

/// A change about to be made, to tell the namespace's watchers of once it is made.
pub(super) struct Change {
    ns: Namespace,
    pub(super) paths: Vec<String>,
    /// The store's count of hard-linked files' edits before the change.
    links: u64,
}

/// The namespace a call names, once its caller is known to be allowed in it.
pub(super) fn namespace_for<T>(req: &Request<T>, ns: &str) -> Result<Namespace, Status> {
    let ns = parse_ns(ns)?;
    may_use(req, ns.as_str())?;
    Ok(ns)
}

/// Refuses a call on a broadcast window of a namespace its caller may not use.
pub(super) fn window_for<T>(req: &Request<T>, group: &str) -> Result<(), Status> {
    may_use(req, group_namespace(group)?)
}

impl StoreHandler {
    /// Refuses a read for watcher `watcher` (0: none) where its lease cannot be held: only the
    /// owner tells watchers of changes, so a standby answers lease-free reads alone, and names
    /// the owner for the others.
    pub(super) fn leased_here(&self, ns: &Namespace, watcher: u64) -> Result<(), Status> {
        match (watcher, &self.shards) {
            (0, _) => Ok(()),
            (_, Some(_)) => self.serves(ns.as_str()),
            (_, None) => refusal(&self.standing.borrow()).map_or(Ok(()), Err),
        }
    }

    /// The namespace a call that changes it names, once its caller is known to be allowed in
    /// it and this replica serves its shard.
    pub(super) fn namespace_here<T>(
        &self,
        req: &Request<T>,
        ns: &str,
    ) -> Result<Namespace, Status> {
        let ns = namespace_for(req, ns)?;
        self.serves(ns.as_str())?;
        Ok(ns)
    }

    /// Refuses a call on a broadcast window its caller may not use, or whose group's
    /// namespace is in a shard another replica serves (its windows are there).
    pub(super) fn window_here<T>(&self, req: &Request<T>, group: &str) -> Result<(), Status> {
        window_for(req, group)?;
        self.serves(group_namespace(group)?)
    }

    fn serves(&self, ns: &str) -> Result<(), Status> {
        match &self.shards {
            Some(gate) => gate.admit(ns),
            None => Ok(()),
        }
    }

    /// Adds to `change` the highest directory each of its keys brings into being (a key put
    /// under directories that are not there makes them), where another mount watches the
    /// namespace: the mounts that hold the listing above such a directory are told, and forget
    /// it. Asked of the stored state before the change; a directory made meanwhile by another
    /// change is told twice, not missed.
    pub(super) async fn with_made_directories(
        &self,
        mut change: Change,
        except: u64,
    ) -> Result<Change, Status> {
        if !self.watchers.watched_besides(change.ns.as_str(), except) {
            return Ok(change);
        }
        // One key of each directory: what a key makes depends on its directory alone.
        let mut by_dir = std::collections::BTreeMap::new();
        for p in &change.paths {
            by_dir
                .entry(crate::server::watch::dir_of(p).to_string())
                .or_insert_with(|| p.clone());
        }
        let (meta, ns) = (self.meta.clone(), change.ns.clone());
        let made = blocking(move || {
            let mut made = Vec::new();
            for key in by_dir.into_values() {
                let Ok(key) = crate::key::KeyPath::parse(&key) else {
                    continue;
                };
                made.extend(meta.directory_made_by(&ns, &key)?);
            }
            Ok(made)
        })
        .await?;
        for m in made {
            if !change.paths.contains(&m) {
                change.paths.push(m);
            }
        }
        Ok(change)
    }

    pub(super) fn change(&self, ns: &Namespace, paths: Vec<String>) -> Change {
        Change {
            ns: ns.clone(),
            paths,
            links: self.meta.inode_changes(),
        }
    }

    /// Tells the watchers of a change once it is made, and returns when they know. A change
    /// that edited a hard-linked file changed its other names too, which nothing here names:
    /// it is told as a change of everything, as one of too many keys is.
    pub(super) async fn tell(&self, c: Change) {
        self.tell_except(c, 0).await;
    }

    /// [`StoreHandler::tell`], but not to watcher `except`, whose own change it is (its caller
    /// takes the change from its answer); a change told as everything is told to it too.
    pub(super) async fn tell_except(&self, c: Change, except: u64) {
        let everything = self.meta.inode_changes() != c.links || c.paths.len() > WATCH_MAX_PATHS;
        let (paths, except) = match everything {
            true => (vec![String::new()], 0),
            false => (c.paths, except),
        };
        self.watchers.changed(c.ns.as_str(), paths, except).await;
    }

    /// A ticket for `grant`, or none where the data plane asks for none. It holds for `ttl`,
    /// and no longer than the caller's credential (`expires`, seconds since the epoch).
    pub(super) fn ticket(
        &self,
        grant: &Grant,
        ttl: std::time::Duration,
        expires: Option<u64>,
    ) -> Vec<u8> {
        let ttl = match expires {
            Some(at) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                ttl.min(std::time::Duration::from_secs(at.saturating_sub(now)))
            }
            None => ttl,
        };
        self.tickets
            .as_ref()
            .map(|k| k.issue(grant, ttl).to_vec())
            .unwrap_or_default()
    }

    /// The secret of a GPU registration in namespace `ns` (`rpc::gpu_secret`); none where no
    /// tickets are issued.
    pub(super) fn gpu_secret(&self, ns: &str, node: &str, registration: u64) -> Vec<u8> {
        self.gpu_seed
            .as_ref()
            .map(|k| {
                let host = gpu_secret::host_key_of(k);
                gpu_secret::registration_secret(&host, ns, node, registration).to_vec()
            })
            .unwrap_or_default()
    }
}
