//! Broadcast windows and their swarms: joining (and waiting for a quorum), a swarm member's
//! syncs (held open until a fetch is chosen for it), a new parent, leaving, and a window's
//! state.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::state::{StoreHandler, SwarmWaits};
use crate::broadcast::windows::{Broadcasts, Joiner, NodeView, Seed, SwarmPieces};
use crate::hash::Version;
use crate::locks;
use crate::meta::MetaError;
use crate::proto::{
    GetWindowRequest, JoinRequest, JoinResponse, LeaveRequest, LeaveResponse, NewParentRequest,
    NewParentResponse, Role, SwarmSyncReply, SwarmSyncRequest, Window,
};
use crate::rpc;
use crate::rpc::status::{to_status, Fault};
use crate::server::auth::principal;
use crate::server::status::{blocking, parse_key, parse_ns, parse_version};

/// A swarm member's sync waiting at the server, registered until dropped.
struct SwarmWait<'a> {
    waits: &'a std::sync::Mutex<SwarmWaits>,
    key: (String, u64, u64),
    notify: Arc<tokio::sync::Notify>,
}

impl Drop for SwarmWait<'_> {
    fn drop(&mut self) {
        let mut waits = locks::lock(self.waits);
        if waits
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            waits.remove(&self.key);
        }
    }
}

/// The longest a swarm member's sync waits for fetches to be chosen for it.
const SWARM_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

impl StoreHandler {
    fn windows(&self) -> std::sync::MutexGuard<'_, Broadcasts> {
        locks::lock(&self.windows)
    }

    fn live(&self) -> impl Fn(&str) -> Option<NodeView> + '_ {
        |n: &str| {
            self.meta.live_node(n).map(|i| NodeView {
                data_addr: i.data_addr,
                zone: i.zone,
            })
        }
    }

    /// Puts a getter into its version's swarm; the pieces it gets back, empty where there is no
    /// swarm (the getter then fetches from its parent). The manifest is read once per swarm.
    async fn swarm_join(
        &self,
        group: &str,
        window: &Window,
        member: u64,
        version: Version,
        seeds: &[Seed],
    ) -> SwarmPieces {
        let cached = self.windows().swarm_pieces(group, &version);
        let pieces = match cached {
            Some(p) => p,
            None => {
                let meta = self.meta.clone();
                let read = blocking(move || {
                    Ok(meta
                        .manifest_if_any(&version.0)?
                        .map(|m| {
                            let (hashes, lens) = crate::manifest::unique_blocks(&m);
                            SwarmPieces {
                                hashes,
                                lens,
                                log2: 0,
                            }
                        })
                        .unwrap_or_default())
                })
                .await;
                match read {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e.message(), "no swarm: the manifest could not be read");
                        return SwarmPieces::default();
                    }
                }
            }
        };
        match self
            .windows()
            .swarm_join(group, window.generation, member, pieces, seeds)
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "no swarm for this getter");
                SwarmPieces::default()
            }
        }
    }

    /// The nodes that hold the whole of `version` of `key` now.
    async fn seeds(&self, ns: &str, key: &str, version: &[u8]) -> Result<Vec<Seed>, Status> {
        let ns = parse_ns(ns)?;
        let key = parse_key(key)?;
        let version = parse_version(version)?;
        let meta = self.meta.clone();
        let sources = blocking(move || {
            let found = meta.resolve(&ns, &key)?;
            if found.record.version != version.0 {
                return Err(MetaError::Conflict(format!(
                    "{key} now names another version; resolve it again"
                )));
            }
            meta.sources(&version, &found.record)
        })
        .await?;
        Ok(sources
            .into_iter()
            .map(|s| Seed {
                origin: s.origin || s.node_id.is_empty(),
                node_id: s.node_id,
                data_addr: s.data_addr,
                zone: s.zone,
            })
            .collect())
    }
}

pub(super) async fn join_broadcast(
    handler: &StoreHandler,
    req: Request<JoinRequest>,
) -> Result<Response<JoinResponse>, Status> {
    let remote_ip = req.remote_addr().map(|a| a.ip().to_string());
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    // A member that names its node is served from that node: a node's agent names its own.
    let node = principal(&req)?.node_claim(&req.get_ref().node_id)?;
    let mut r = req.into_inner();
    r.node_id = node;
    let version = parse_version(&r.version)?;
    let seeds = handler.seeds(&r.namespace, &r.key, &r.version).await?;
    let mut spec = r.window.clone().unwrap_or_default();
    if spec.group_id.is_empty() {
        spec.group_id = rpc::default_group(&r.namespace, &r.key);
    }
    spec.group_id = rpc::scope_group(ns.as_str(), &spec.group_id);
    let group = spec.group_id.clone();
    let zone = handler
        .meta
        .live_node(&r.node_id)
        .map(|n| n.zone)
        .unwrap_or_default();
    let joiner = Joiner {
        node_id: r.node_id.clone(),
        zone,
        ip: if r.ip.is_empty() {
            remote_ip.unwrap_or_default()
        } else {
            r.ip.clone()
        },
        role: r.role(),
        version: Some(version),
        serves: r.serves && !r.node_id.is_empty(),
        reads: r.reads,
    };
    let joined = {
        let live = handler.live();
        handler
            .windows()
            .join(spec, joiner, &seeds, &live, handler.clock.now())?
    };
    handler.joined.notify_waiters();
    tracing::info!(
        group = %group,
        member = joined.member,
        node = %r.node_id,
        parent = ?joined.parent.as_ref().map(|p| p.node_id.clone()),
        closed = joined.window.closed,
        "joined broadcast"
    );
    let mut window = joined.window;
    let mut deadline = joined.deadline;
    while r.wait_quorum && !window.closed {
        let woken = handler.joined.notified();
        match deadline {
            Some(d) => {
                tokio::select! {
                    _ = woken => {}
                    _ = tokio::time::sleep_until(d.into()) => {}
                }
            }
            None => woken.await,
        }
        let Some((w, d)) = handler.windows().window(&group, handler.clock.now()) else {
            return Err(to_status(
                Fault::NotFound,
                format!("window {group} expired"),
            ));
        };
        window = w;
        deadline = d;
    }
    // Only a getter that may swarm costs a manifest read (a mount's reader joins at every
    // open).
    let may_swarm = window
        .spec
        .as_ref()
        .is_some_and(|s| handler.windows().may_swarm(s, r.serves));
    let pieces = if r.role() == Role::Getter && may_swarm {
        handler
            .swarm_join(&group, &window, joined.member, version, &seeds)
            .await
    } else {
        SwarmPieces::default()
    };
    Ok(Response::new(JoinResponse {
        window: Some(window),
        member: joined.member,
        parent: joined.parent,
        pieces: pieces.hashes,
        block_lens: pieces.lens,
        piece_log2: u32::from(pieces.log2),
    }))
}

pub(super) async fn swarm_sync(
    handler: &StoreHandler,
    req: Request<SwarmSyncRequest>,
) -> Result<Response<SwarmSyncReply>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let r = req.into_inner();
    let key = (r.group_id.clone(), r.generation, r.member);
    let wait = std::time::Duration::from_millis(u64::from(r.wait_ms)).min(SWARM_WAIT_MAX);
    let (reply, woken, waiter) = {
        let live = handler.live();
        let mut windows = handler.windows();
        let (reply, woken) = windows.swarm_sync(&r, &live, handler.clock.now())?;
        // Registered while the windows are locked, so that fetches chosen for this member
        // by a sync that follows find it waiting.
        let waiter = (reply.fetch.is_empty() && r.idle > 0 && !wait.is_zero()).then(|| {
            let n = Arc::new(tokio::sync::Notify::new());
            locks::lock(&handler.swarm_waits).insert(key.clone(), n.clone());
            n
        });
        (reply, woken, waiter)
    };
    {
        let waits = locks::lock(&handler.swarm_waits);
        for m in woken {
            if let Some(n) = waits.get(&(r.group_id.clone(), r.generation, m)) {
                n.notify_one();
            }
        }
    }
    let Some(waiter) = waiter else {
        return Ok(Response::new(reply));
    };
    // Unregistered however the wait ends, a caller that went away included.
    let _registered = SwarmWait {
        waits: &handler.swarm_waits,
        key,
        notify: waiter.clone(),
    };
    let _ = tokio::time::timeout(wait, waiter.notified()).await;
    let live = handler.live();
    let mail = handler
        .windows()
        .swarm_mail(&r.group_id, r.generation, r.member, &live);
    Ok(Response::new(mail))
}

pub(super) async fn new_parent(
    handler: &StoreHandler,
    req: Request<NewParentRequest>,
) -> Result<Response<NewParentResponse>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let r = req.into_inner();
    let parent = {
        let live = handler.live();
        handler.windows().new_parent(
            &r.group_id,
            r.generation,
            r.member,
            &r.failed_parent,
            r.unreachable,
            &live,
            handler.clock.now(),
        )?
    };
    tracing::info!(
        group = %r.group_id,
        member = r.member,
        failed = %r.failed_parent,
        unreachable = r.unreachable,
        parent = ?parent.as_ref().map(|p| p.node_id.clone()),
        "new parent"
    );
    Ok(Response::new(NewParentResponse { parent }))
}

pub(super) async fn leave_broadcast(
    handler: &StoreHandler,
    req: Request<LeaveRequest>,
) -> Result<Response<LeaveResponse>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let r = req.into_inner();
    handler.windows().leave(
        &r.group_id,
        r.generation,
        r.member,
        r.done,
        handler.clock.now(),
    )?;
    Ok(Response::new(LeaveResponse {}))
}

pub(super) async fn get_window(
    handler: &StoreHandler,
    req: Request<GetWindowRequest>,
) -> Result<Response<Window>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let group = req.into_inner().group_id;
    let (w, _) = handler
        .windows()
        .window(&group, handler.clock.now())
        .ok_or_else(|| to_status(Fault::NotFound, format!("no broadcast window {group}")))?;
    Ok(Response::new(w))
}
