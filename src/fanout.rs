//! The getter's side of a broadcast tree: join the window, fetch from the parent the server
//! assigns, and when that parent fails, ask for another and resume with the blocks still missing.
//!
//! While it fetches, the getter streams each verified block to its node's agent
//! ([`Offer`]), which serves it to this getter's own children at once: blocks flow down the tree
//! as soon as each level has them, not when whole files are done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::client::{Agent, Store};
use crate::get::source_addr;
use crate::hash::Version;
use crate::manifest::Manifest;
use crate::proto::{
    JoinRequest, LeaveRequest, LocalFile, NewParentRequest, ReceiveEvent, Role, WindowSpec,
};
use crate::transfer::{self, BlockJob, BlockSink, FetchReport, Partial, SourceAddr, TransferError};

/// Parents a getter tries before it falls back to every source it knows.
const MAX_PARENTS: usize = 8;

/// What a getter tells about its place in a tree.
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
}

/// Where a getter is in the tree and how to reach the server about it.
pub struct TreeFetch<'a> {
    pub store: &'a mut Store,
    pub server: &'a str,
    pub namespace: &'a str,
    pub key: &'a str,
    pub version: Version,
    pub spec: WindowSpec,
    /// This node's agent, when there is one: `(node id, ip)`.
    pub node: Option<(String, String)>,
    /// The agent serves what this getter receives.
    pub serves: bool,
}

impl TreeFetch<'_> {
    /// Fetches `jobs` through the tree; `fallback` (every known source, nearest first) takes
    /// what no parent could give.
    pub async fn run(
        mut self,
        jobs: Vec<BlockJob>,
        sinks: Arc<dyn BlockSink>,
        fallback: &[SourceAddr],
        progress: &ProgressBar,
    ) -> Result<(FetchReport, Option<TreeReport>), TransferError> {
        let (node_id, ip) = self.node.clone().unwrap_or_default();
        let joined = self
            .store
            .join_broadcast(JoinRequest {
                namespace: self.namespace.to_string(),
                key: self.key.to_string(),
                version: self.version.0.to_vec(),
                window: Some(self.spec.clone()),
                role: Role::Getter as i32,
                node_id,
                serves: self.serves,
                ip,
                wait_quorum: false,
            })
            .await;
        let joined = match joined {
            Ok(j) => j.into_inner(),
            Err(e) => {
                tracing::warn!(error = %e.message(), "could not join a broadcast; fetching from the sources");
                return Ok((
                    transfer::fetch(jobs, sinks, fallback, progress).await?,
                    None,
                ));
            }
        };
        let window = joined.window.unwrap_or_default();
        let mut tree = TreeReport {
            group_id: window.group_id.clone(),
            generation: window.generation,
            member: joined.member,
            closed: window.closed,
            closed_by: window.closed_by.clone(),
            members: window.members.len(),
            ..Default::default()
        };
        let mut part = Partial {
            pending: jobs,
            ..Default::default()
        };
        let mut parent = joined.parent;
        for _ in 0..MAX_PARENTS {
            let Some(p) = parent.take() else { break };
            let src = source_addr(&p, self.server);
            tree.parents.push(src.label.clone());
            tracing::info!(parent = %src.label, addr = %src.addr, "fetching from parent");
            let pending = std::mem::take(&mut part.pending);
            let pass = transfer::fetch_partial(
                pending,
                sinks.clone(),
                std::slice::from_ref(&src),
                progress,
            )
            .await?;
            let broken = pass.failures.iter().any(|f| f.broken);
            part.absorb(pass);
            if part.pending.is_empty() {
                break;
            }
            parent = match self
                .store
                .new_parent(NewParentRequest {
                    group_id: tree.group_id.clone(),
                    generation: tree.generation,
                    member: tree.member,
                    failed_parent: src.label.clone(),
                    unreachable: broken,
                })
                .await
            {
                Ok(r) => r.into_inner().parent,
                Err(e) => {
                    tracing::warn!(error = %e.message(), "no new parent");
                    None
                }
            };
        }
        if !part.pending.is_empty() {
            tracing::info!(
                missing = part.pending.len(),
                "no parent left; fetching from the sources"
            );
            let pending = std::mem::take(&mut part.pending);
            let pass = transfer::fetch_partial(pending, sinks, fallback, progress).await?;
            part.absorb(pass);
        }
        let done = part.pending.is_empty();
        let report = part.complete(fallback.is_empty());
        self.leave(&tree, done).await;
        Ok((report?, Some(tree)))
    }

    async fn leave(&mut self, tree: &TreeReport, done: bool) {
        if let Err(e) = self
            .store
            .leave_broadcast(LeaveRequest {
                group_id: tree.group_id.clone(),
                generation: tree.generation,
                member: tree.member,
                done,
            })
            .await
        {
            tracing::warn!(error = %e.message(), "could not leave the broadcast window");
        }
    }
}

/// Blocks being received, offered to peers through this node's agent as each is verified.
pub struct Offer {
    tx: mpsc::Sender<ReceiveEvent>,
    call: tokio::task::JoinHandle<()>,
}

impl Offer {
    /// Starts offering the blocks of `files` (entries of `m`, at absolute temporary paths).
    pub async fn open(
        agent: &mut Agent,
        version: Version,
        m: &Manifest,
        files: Vec<LocalFile>,
    ) -> Option<Offer> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(ReceiveEvent {
            version: version.0.to_vec(),
            manifest: Some(m.clone()),
            files,
            ready: Vec::new(),
        })
        .await
        .ok()?;
        let mut agent = agent.clone();
        let call = tokio::spawn(async move {
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            if let Err(e) = agent.receive(stream).await {
                tracing::warn!(error = %e.message(), "the agent stopped serving blocks in flight");
            }
        });
        Some(Offer { tx, call })
    }

    /// A handle for announcing verified blocks from the sink's blocking threads.
    pub fn announcer(&self) -> mpsc::Sender<ReceiveEvent> {
        self.tx.clone()
    }

    /// Ends the offer; the agent serves from what was registered in the meantime.
    pub async fn close(self) {
        drop(self.tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.call).await;
    }
}

/// Writes blocks through another sink, then tells the agent that they are there, and keeps
/// to a byte rate if one is set.
pub struct Announcing {
    pub inner: Arc<dyn BlockSink>,
    pub tx: Option<mpsc::Sender<ReceiveEvent>>,
    pub limit: Option<RateLimit>,
}

impl BlockSink for Announcing {
    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        // Under a rate limit blocks go out one at a time: the count stays locked from the write
        // to the end of the pause that keeps the average under the limit.
        let mut written = self.limit.as_ref().and_then(|l| l.written.lock().ok());
        self.inner.put(job, data)?;
        if let Some(tx) = &self.tx {
            // The agent may be gone; the get goes on without serving others.
            let _ = tx.blocking_send(ReceiveEvent {
                ready: vec![job.hash.0.to_vec()],
                ..Default::default()
            });
        }
        if let (Some(l), Some(n)) = (&self.limit, written.as_deref_mut()) {
            *n += data.len() as u64;
            l.pause(*n);
        }
        Ok(())
    }
}

/// `--bwlimit`: at most `bytes_per_sec` written on average since the start, as rsync does.
pub struct RateLimit {
    bytes_per_sec: u64,
    start: Instant,
    written: std::sync::Mutex<u64>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> Self {
        RateLimit {
            bytes_per_sec: bytes_per_sec.max(1),
            start: Instant::now(),
            written: std::sync::Mutex::new(0),
        }
    }

    /// Sleeps (on a blocking thread) until `written` bytes are due at the limit's rate.
    fn pause(&self, written: u64) {
        let due = Duration::from_secs_f64(written as f64 / self.bytes_per_sec as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// The address other nodes see for this host: the agent's advertised address's host.
pub fn host_of(addr: &str) -> String {
    addr.parse::<std::net::SocketAddr>()
        .map(|a| a.ip().to_string())
        .unwrap_or_default()
}

/// The window a putter joins, and whether it waits there for the quorum.
pub async fn join_as_putter(
    store: &mut Store,
    namespace: &str,
    key: &str,
    version: Version,
    spec: WindowSpec,
    node: Option<(String, String)>,
) -> Result<crate::proto::Window, crate::client::ClientError> {
    let wait = spec.world_size > 0 || spec.timeout_ms > 0 || !spec.ips.is_empty();
    let (node_id, ip) = node.unwrap_or_default();
    let r = store
        .join_broadcast(JoinRequest {
            namespace: namespace.to_string(),
            key: key.to_string(),
            version: version.0.to_vec(),
            window: Some(spec),
            role: Role::Putter as i32,
            node_id,
            serves: false,
            ip,
            wait_quorum: wait,
        })
        .await?;
    Ok(r.into_inner().window.unwrap_or_default())
}

/// A window as JSON: what `kt window` prints and what `kt put --json` adds.
pub fn window_json(w: &crate::proto::Window) -> serde_json::Value {
    let spec = w.spec.clone().unwrap_or_default();
    serde_json::json!({
        "group_id": w.group_id,
        "generation": w.generation,
        "closed": w.closed,
        "closed_by": w.closed_by,
        "world_size": spec.world_size,
        "timeout_ms": spec.timeout_ms,
        "ips": spec.ips,
        "fanout": if spec.fanout == 0 { crate::broadcast::DEFAULT_FANOUT } else { spec.fanout },
        "members": w.members.iter().map(|m| serde_json::json!({
            "id": m.id,
            "node_id": m.node_id,
            "ip": m.ip,
            "role": if m.role == crate::proto::Role::Putter as i32 { "putter" } else { "getter" },
            "parent": m.parent,
            "children": m.children,
            "done": m.done,
            "failed": m.failed,
        })).collect::<Vec<_>>(),
    })
}

/// `serialize_with` for an optional window: its JSON form.
pub fn serialize_window<S: serde::Serializer>(
    w: &Option<crate::proto::Window>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    w.as_ref().map(window_json).serialize(s)
}
