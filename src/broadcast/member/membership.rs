//! Membership of a broadcast window, the same for every getter (`kt get`, a mount's reader):
//! join, fetch from the source the window assigns, report a source that fails and get another,
//! leave.
//!
//! Where the server gives the version's pieces at the join, the member fetches through the
//! version's swarm (`swarm_fetch.rs`: each piece from any member that holds it, several at
//! once).
//! Otherwise callers see sources, not parents: [`Membership::sources`] says where to fetch from
//! now and [`Membership::failed`] reports a source that failed; the window decides what comes
//! next: one parent at a time, within the fanout (a new one outside the member's own subtree
//! when it fails). [`fetch_through`] and its callers are the same either way.

use std::sync::Arc;

use bytes::Bytes;
use indicatif::ProgressBar;
use serde::Serialize;

use super::rejoin::Moved;
use super::swarm_fetch::{SwarmSetup, SwarmTask};
use crate::broadcast::swarm::Plan;
use crate::dataplane::fetch::{self, BlockJob, BlockSink, FetchReport, Partial, SourceFailure};
use crate::dataplane::peers::Peers;
use crate::dataplane::sources::{source_addr, NodeRef, SourceAddr};
use crate::dataplane::TransferError;
use crate::hash::{BlockHash, Version};
use crate::proto::{JoinRequest, LeaveRequest, NewParentRequest, Role, Window, WindowSpec};
use crate::rpc::{ClientError, Store, DEFAULT_FANOUT};

/// Parents a getter tries before it falls back to every source it knows.
const MAX_PARENTS: usize = 8;

/// What a getter tells about its place in a window.
#[derive(Debug, Serialize, Default, Clone)]
pub struct TreeReport {
    pub group_id: String,
    pub generation: u64,
    pub member: u64,
    /// Parents in the order they were used: node ids, or `store`.
    pub parents: Vec<String>,
    pub closed: bool,
    pub closed_by: String,
    pub members: usize,
    /// Times it joined the window again, at a new owner.
    pub rejoins: u32,
}

/// Who joins, and for what.
pub struct JoinSpec<'a> {
    pub namespace: &'a str,
    pub key: &'a str,
    pub version: Version,
    pub window: WindowSpec,
    /// This node, when the getter has an agent.
    pub node: Option<NodeRef>,
    /// The node's agent serves what this getter receives (it can be a parent).
    pub serves: bool,
    /// A mount's reader: it asks the swarm for the blocks it reads, as it reads them.
    pub reads: bool,
    /// What to present to parents.
    pub ticket: Bytes,
    /// How this getter reaches its sources.
    pub peers: Peers,
}

struct State {
    /// The source assigned now, if any.
    parent: Option<SourceAddr>,
    report: TreeReport,
    left: bool,
}

/// A getter's place in a window. Shared by the threads that fetch for it (a mount's reads);
/// leaves the window when dropped, if it has not left already.
pub struct Membership {
    store: Store,
    server: String,
    ticket: Bytes,
    /// The version's unique blocks, when the window runs a swarm for it.
    pieces: Vec<BlockHash>,
    /// How the swarm cuts them into pieces.
    plan: Plan,
    reads: bool,
    /// This getter's node (empty without an agent).
    node_id: String,
    /// The swarm's task, once a fetch started it.
    swarm: std::sync::Mutex<Option<SwarmTask>>,
    state: tokio::sync::Mutex<State>,
    /// Where a leave on drop runs.
    rt: Option<tokio::runtime::Handle>,
    /// How this getter reaches its sources.
    peers: Peers,
    /// The join that made this member, for its swarm task to send again.
    request: JoinRequest,
    /// The seat the swarm task moved it to, joining the window again.
    moved: Moved,
}

impl Membership {
    /// Joins the window of `spec` as a getter; the window assigns a source at once.
    pub async fn join(
        store: &Store,
        server: &str,
        spec: JoinSpec<'_>,
    ) -> Result<Membership, ClientError> {
        let node = spec.node.unwrap_or_default();
        let node_id = node.node_id.clone();
        let mut request = JoinRequest {
            namespace: spec.namespace.to_string(),
            key: spec.key.to_string(),
            version: spec.version.0.to_vec(),
            window: Some(spec.window),
            role: Role::Getter as i32,
            node_id: node.node_id,
            serves: spec.serves,
            reads: spec.reads,
            ip: node.ip,
            wait_quorum: false,
        };
        let joined = store.clone().join_broadcast(request.clone()).await?;
        let window = joined.window.unwrap_or_default();
        // Joined again (the owner changed), it is the same window.
        if let Some(w) = request.window.as_mut() {
            w.group_id.clone_from(&window.group_id);
        }
        let parent = joined
            .parent
            .map(|p| source_addr(&p, server, &spec.ticket, &node_id));
        let mut pieces: Vec<BlockHash> = joined
            .pieces
            .chunks_exact(32)
            .filter_map(BlockHash::from_slice)
            .collect();
        let lens: Vec<u64> = joined.block_lens.iter().map(|&l| u64::from(l)).collect();
        let log2 = u8::try_from(joined.piece_log2).unwrap_or(u8::MAX);
        // Pieces smaller than blocks need every block's length and a cut the data plane
        // serves; a server that sends less is not followed into a swarm.
        let plan = match log2 {
            0 => Plan::whole(pieces.len()),
            _ if lens.len() == pieces.len() && crate::dataplane::piece::cut(1, log2).is_some() => {
                Plan::with_log2(&lens, log2)
            }
            _ => {
                pieces.clear();
                Plan::whole(0)
            }
        };
        let swarm = !pieces.is_empty();
        Ok(Membership {
            store: store.clone(),
            server: server.to_string(),
            ticket: spec.ticket.clone(),
            pieces,
            plan,
            reads: spec.reads,
            node_id: node_id.clone(),
            peers: spec.peers.clone(),
            request,
            moved: Moved::default(),
            swarm: std::sync::Mutex::new(None),
            state: tokio::sync::Mutex::new(State {
                report: TreeReport {
                    group_id: window.group_id.clone(),
                    generation: window.generation,
                    member: joined.member,
                    // A swarm reports the members it fetched from instead.
                    parents: match swarm {
                        false => parent.iter().map(|p| p.label.clone()).collect(),
                        true => Vec::new(),
                    },
                    closed: window.closed,
                    closed_by: window.closed_by.clone(),
                    members: window.members.len(),
                    rejoins: 0,
                },
                parent,
                left: false,
            }),
            rt: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Where to fetch from now, best first; empty when the window has nothing left to offer
    /// (the caller falls back to every source it knows).
    pub async fn sources(&self) -> Vec<SourceAddr> {
        self.state.lock().await.parent.iter().cloned().collect()
    }

    /// Reports that fetching from `f.source` failed; returns whether there is another source to
    /// try. A source that broke its connection is reported dead for the whole window; one that
    /// stalled or lacked blocks stays available to others. Failures of a source that is no
    /// longer assigned (another thread reported it first) change nothing.
    pub async fn failed(&self, f: &SourceFailure) -> bool {
        let mut st = self.state.lock().await;
        if st.parent.as_ref() != Some(&f.source) {
            return st.parent.is_some();
        }
        st.parent = None;
        if st.report.parents.len() >= MAX_PARENTS {
            return false;
        }
        let asked = self
            .store
            .clone()
            .new_parent(NewParentRequest {
                group_id: st.report.group_id.clone(),
                generation: st.report.generation,
                member: st.report.member,
                failed_parent: f.source.label.clone(),
                unreachable: f.broken,
            })
            .await;
        match asked {
            Ok(r) => {
                let parent = r
                    .parent
                    .map(|p| source_addr(&p, &self.server, &self.ticket, &self.node_id));
                if let Some(p) = &parent {
                    tracing::info!(parent = %p.label, addr = %p.addr, failed = %f.source.label, "new parent");
                    st.report.parents.push(p.label.clone());
                }
                st.parent = parent;
            }
            Err(e) => tracing::warn!(error = %e.to_string(), "no new parent"),
        }
        st.parent.is_some()
    }

    /// The member's place in the window so far.
    pub async fn report(&self) -> TreeReport {
        let mut report = self.state.lock().await.report.clone();
        self.seated(&mut report);
        report
    }

    /// `report` with the seat the member moved to, if it joined its window again.
    fn seated(&self, report: &mut TreeReport) {
        if let Some(seat) = crate::locks::lock(&self.moved).clone() {
            report.group_id = seat.group_id;
            report.generation = seat.generation;
            report.member = seat.member;
            report.rejoins = seat.rejoins;
        }
    }

    /// Notes a source the swarm fetched from, for the report.
    async fn used(&self, label: &str) {
        let mut st = self.state.lock().await;
        if !st.report.parents.iter().any(|p| p == label) {
            st.report.parents.push(label.to_string());
        }
    }

    /// Fetches `jobs` through the swarm of this member's version, starting its task at the
    /// first fetch. The store's grants go to the last of `fallback` (the origin or the store);
    /// sources labelled `exclude` (this node) are never used. Returns what was fetched, from
    /// whom, and what is left (everything, once the swarm was given up).
    async fn fetch_in_swarm(
        &self,
        jobs: Vec<BlockJob>,
        sinks: Arc<dyn BlockSink>,
        fallback: &[SourceAddr],
        exclude: &str,
        progress: &ProgressBar,
    ) -> Result<Partial, TransferError> {
        let given_up = || Partial {
            pending: jobs.clone(),
            ..Default::default()
        };
        let answer = {
            let place = self.report().await;
            let mut task = crate::locks::lock(&self.swarm);
            match task.as_ref() {
                None => {
                    *task = Some(SwarmTask::start(SwarmSetup {
                        store: self.store.clone(),
                        server: &self.server,
                        ticket: self.ticket.clone(),
                        group_id: place.group_id,
                        generation: place.generation,
                        member: place.member,
                        pieces: &self.pieces,
                        plan: self.plan.clone(),
                        reads: self.reads,
                        node_id: &self.node_id,
                        peers: self.peers.clone(),
                        join: self.request.clone(),
                        moved: self.moved.clone(),
                    }));
                }
                // The swarm was given up: everything goes to the fallback.
                Some(t) if !t.live() => return Ok(given_up()),
                Some(_) => {}
            }
            let seed = fallback.last().cloned();
            task.as_ref()
                .and_then(|t| t.ask(jobs.clone(), sinks, seed, exclude, progress))
        };
        let Some(answer) = answer else {
            return Ok(given_up());
        };
        let part = answer.await.unwrap_or_else(|_| Ok(given_up()))?;
        for (src, _) in &part.report.by_source {
            self.used(&src.label).await;
        }
        Ok(part)
    }

    /// Leaves the window: with a verified copy (`done`), or giving the slot back.
    pub async fn leave(&self, done: bool) {
        let req = {
            let mut st = self.state.lock().await;
            if st.left {
                return;
            }
            st.left = true;
            let mut report = st.report.clone();
            self.seated(&mut report);
            leave_request(&report, done)
        };
        if let Err(e) = self.store.clone().leave_broadcast(req).await {
            tracing::warn!(error = %e.to_string(), "could not leave the broadcast window");
        }
    }
}

fn leave_request(r: &TreeReport, done: bool) -> LeaveRequest {
    LeaveRequest {
        group_id: r.group_id.clone(),
        generation: r.generation,
        member: r.member,
        done,
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        // A reader that fetched every piece leaves with a copy, and stays a source.
        let complete = crate::locks::lock(&self.swarm)
            .as_ref()
            .is_some_and(SwarmTask::complete);
        let mut report = match self.state.get_mut() {
            st if st.left => return,
            st => st.report.clone(),
        };
        self.seated(&mut report);
        let (Some(rt), req) = (&self.rt, leave_request(&report, complete)) else {
            return;
        };
        let store = self.store.clone();
        rt.spawn(async move {
            if let Err(e) = store.leave_broadcast(req).await {
                tracing::debug!(error = %e.to_string(), "could not leave the window");
            }
        });
    }
}

/// Fetches `jobs` through a window: from the sources it assigns, asking again each time one
/// fails, then from `fallback` (every known source, nearest first) for what none gave. Sources
/// labelled `exclude` (this node itself, for a reader that already looked in its own cache) are
/// skipped. Returns what was fetched and what is still missing.
pub async fn fetch_through(
    member: &Membership,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    fallback: &[SourceAddr],
    exclude: &str,
    progress: &ProgressBar,
) -> Result<Partial, TransferError> {
    let mut part = if member.pieces.is_empty() {
        Partial {
            pending: jobs,
            ..Default::default()
        }
    } else {
        member
            .fetch_in_swarm(jobs, sinks.clone(), fallback, exclude, progress)
            .await?
    };
    while !part.pending.is_empty() && member.pieces.is_empty() {
        let sources: Vec<SourceAddr> = member
            .sources()
            .await
            .into_iter()
            .filter(|s| s.label != exclude)
            .collect();
        if sources.is_empty() {
            break;
        }
        for s in &sources {
            tracing::debug!(source = %s.label, addr = %s.addr, "fetching from the window's source");
        }
        let pending = std::mem::take(&mut part.pending);
        let pass =
            fetch::fetch_partial(&member.peers, pending, sinks.clone(), &sources, progress).await?;
        let failures = pass.failures.clone();
        part.absorb(pass);
        if part.pending.is_empty() {
            break;
        }
        let mut more = false;
        for f in &failures {
            more |= member.failed(f).await;
        }
        if !more {
            break;
        }
    }
    if !part.pending.is_empty() && !fallback.is_empty() {
        tracing::info!(
            missing = part.pending.len(),
            "no source left in the window; fetching from every source"
        );
        let pending = std::mem::take(&mut part.pending);
        let fallback: Vec<SourceAddr> = fallback
            .iter()
            .filter(|s| s.label != exclude)
            .cloned()
            .collect();
        let pass = fetch::fetch_partial(&member.peers, pending, sinks, &fallback, progress).await?;
        part.absorb(pass);
    }
    Ok(part)
}

/// `kt get`'s fetch: joins the window and fetches through it. A window that cannot be joined
/// only loses the spreading: everything comes from `fallback`. The membership comes back
/// unleft: whether this member holds a copy others may fetch is known only once its agent has
/// taken the files over, so the caller leaves then ([`Membership::leave`]); dropped, it leaves
/// without one.
pub async fn fetch_in_window(
    store: &Store,
    server: &str,
    spec: JoinSpec<'_>,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    fallback: &[SourceAddr],
    progress: &ProgressBar,
) -> Result<(FetchReport, Option<Membership>), TransferError> {
    let peers = spec.peers.clone();
    let member = match Membership::join(store, server, spec).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "could not join a broadcast; fetching from the sources");
            let got = fetch::fetch(&peers, jobs, sinks, fallback, progress).await?;
            return Ok((got, None));
        }
    };
    tracing::debug!("get: joined the window");
    let part = fetch_through(&member, jobs, sinks, fallback, "", progress).await?;
    Ok((part.complete(fallback.is_empty())?, Some(member)))
}

/// The window a putter joins, and whether it waits there for the quorum.
pub async fn join_as_putter(
    store: &Store,
    namespace: &str,
    key: &str,
    version: Version,
    spec: WindowSpec,
    node: Option<NodeRef>,
) -> Result<Window, ClientError> {
    let wait = spec.world_size > 0 || spec.timeout_ms > 0 || !spec.ips.is_empty();
    let node = node.unwrap_or_default();
    let r = store
        .join_broadcast(JoinRequest {
            namespace: namespace.to_string(),
            key: key.to_string(),
            version: version.0.to_vec(),
            window: Some(spec),
            role: Role::Putter as i32,
            node_id: node.node_id,
            serves: false,
            reads: false,
            ip: node.ip,
            wait_quorum: wait,
        })
        .await?;
    Ok(r.window.unwrap_or_default())
}

/// A window as JSON: what `kt window` prints and what `kt put --json` adds.
pub fn window_json(w: &Window) -> serde_json::Value {
    let spec = w.spec.clone().unwrap_or_default();
    serde_json::json!({
        "group_id": w.group_id,
        "generation": w.generation,
        "closed": w.closed,
        "closed_by": w.closed_by,
        "world_size": spec.world_size,
        "timeout_ms": spec.timeout_ms,
        "ips": spec.ips,
        "fanout": if spec.fanout == 0 { DEFAULT_FANOUT } else { spec.fanout },
        "members": w.members.iter().map(|m| serde_json::json!({
            "id": m.id,
            "node_id": m.node_id,
            "ip": m.ip,
            "role": if m.role == Role::Putter as i32 { "putter" } else { "getter" },
            "parent": m.parent,
            "children": m.children,
            "done": m.done,
            "failed": m.failed,
        })).collect::<Vec<_>>(),
    })
}

/// `serialize_with` for an optional window: its JSON form.
pub fn serialize_window<S: serde::Serializer>(w: &Option<Window>, s: S) -> Result<S::Ok, S::Error> {
    w.as_ref().map(window_json).serialize(s)
}
