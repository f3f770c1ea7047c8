//! A commit's work, on the runtime: the caller's worker found or started, the buffers
//! registered with it, and then a PUT (the key published, and in a window the broadcast from
//! it) or a GET (the bytes pulled from the publisher, or in a window from the parent the plan
//! names, or as a member of its NCCL broadcast).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use super::error::GpuError;
use super::transfer::Transfer;
use super::workers::{let_go, Registration, Workers};
use crate::gpu::abi;
use crate::gpu::table::Table;
use crate::gpu::window::{self, Asked, Joining, Membership, WindowError};
use crate::gpu::worker::enter::{ids_of, Namespaces};
use crate::gpu::worker::spawn::WorkerClient;
use crate::gpu::worker::WorkerError;
use crate::key::{KeyPath, Namespace};
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{
    GpuKey, PublishGpuRequest, RegistrationSecretRequest, ResolveRequest, Role, WorkerBroadcast,
    WorkerBuffer, WorkerFetch, WorkerHeld, WorkerNcclId, WorkerRegister, WorkerReply,
};
use crate::rpc::Store;

/// How long an NCCL communicator may take to form, and a broadcast beyond its bytes' time at
/// [`NCCL_SLOWEST_BYTES_PER_MS`]: a member that died or hangs fails the others by then.
const NCCL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
/// 100 MB/s: slower than any link NCCL runs over.
const NCCL_SLOWEST_BYTES_PER_MS: u64 = 100_000;
/// How long a putter whose NCCL broadcast failed waits for the getters' reports, to say whose
/// failure it was.
const NAME_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A registration id: 64 bits from the kernel's random source. It is the capability other
/// workers present for the registration's bytes on the host transport, so it never falls back
/// to anything guessable: without randomness there is no registration.
fn random_id() -> Result<u64, GpuError> {
    crate::gpu::random::random_u64()
        .map(|v| v | 1)
        .map_err(|e| GpuError::Buffers(format!("no randomness for a registration id: {e}")))
}

/// What a commit needs, moved onto the runtime.
pub(super) struct Commit {
    pub(super) store: Store,
    pub(super) namespace: Namespace,
    pub(super) node_id: String,
    pub(super) exe: PathBuf,
    pub(super) host: String,
    pub(super) workers: Arc<AsyncMutex<Workers>>,
    pub(super) key: KeyPath,
    pub(super) caller: u32,
    pub(super) opener: Option<Arc<super::file::Opener>>,
    pub(super) table: Table,
    pub(super) table_json: String,
    pub(super) buffers: Vec<WorkerBuffer>,
    pub(super) window: Option<Asked>,
    pub(super) registration: Arc<Mutex<Option<Registration>>>,
    pub(super) closed: Arc<AtomicBool>,
}

impl Commit {
    /// The caller's worker (started on its first registration), counted as holding one more.
    async fn worker(&self) -> Result<Arc<WorkerClient>, GpuError> {
        // Read while the opener lives, and checked after: what /proc said was the opener's.
        super::file::opener_alive(&self.opener)?;
        let pid = self.caller.to_string();
        let ns = Namespaces::of(&pid).map_err(|e| {
            GpuError::Worker(WorkerError::Spawn(format!(
                "the caller, process {pid}: {e}"
            )))
        })?;
        let (uid, gid) = ids_of(self.caller).map_err(|e| {
            GpuError::Worker(WorkerError::Spawn(format!(
                "the caller, process {pid}: {e}"
            )))
        })?;
        super::file::opener_alive(&self.opener)?;
        let key = (ns, uid, gid);
        let mut w = self.workers.lock().await;
        if let Some((c, n, taken)) = w.by_caller.get_mut(&key) {
            *n += 1;
            *taken += 1;
            return Ok(c.clone());
        }
        let c = WorkerClient::start(&self.exe, &self.host, self.caller).await?;
        // The worker entered the namespaces of the pid: the opener's only if it still lives.
        super::file::opener_alive(&self.opener)?;
        w.by_caller.insert(key, (c.clone(), 1, 1));
        Ok(c)
    }

    /// Hands the buffers to the caller's worker; a getter's are to be filled (and serve what
    /// they hold onwards meanwhile). With whether the worker can move them over NCCL.
    async fn register(&self, publisher: bool) -> Result<(Arc<WorkerClient>, bool), GpuError> {
        let worker = self.worker().await?;
        let reg = Registration {
            id: random_id()?,
            publisher,
            caller: self.caller,
            worker: worker.clone(),
            window: None,
        };
        // The store derives it; this node holds nothing to derive it from.
        let secret = self
            .store
            .registration_secret(RegistrationSecretRequest {
                namespace: self.namespace.to_string(),
                node_id: self.node_id.clone(),
                registration: reg.id,
            })
            .await?
            .secret;
        let registered = worker
            .call(Op::Register(WorkerRegister {
                registration: reg.id,
                buffers: self.buffers.clone(),
                receiving: !publisher,
                secret,
            }))
            .await;
        *lock(&self.registration) = Some(reg);
        let nccl = registered?.nccl;
        self.still_open().await?;
        Ok((worker, nccl))
    }

    /// Fails, letting go of what was registered, if the control file closed meanwhile.
    async fn still_open(&self) -> Result<(), GpuError> {
        if !self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let taken = lock(&self.registration).take();
        if let Some(reg) = taken {
            let_go(
                reg,
                self.store.clone(),
                self.namespace.to_string(),
                self.key.to_string(),
                self.workers.clone(),
            )
            .await;
        }
        Err(GpuError::Buffers("the control file was closed".into()))
    }

    fn registration(&self) -> u64 {
        lock(&self.registration).as_ref().map_or(0, |r| r.id)
    }

    /// Joins the window the caller asked for, recording the membership on the registration so
    /// that a close before the end tells the window.
    async fn join(
        &self,
        asked: &Asked,
        role: Role,
        worker: &WorkerClient,
        nccl: bool,
    ) -> Result<Membership, GpuError> {
        // The putter's worker makes the communicator's id; one that cannot takes the window to
        // the host transport (the server sees no id).
        let unique_id = if nccl && role == Role::Putter {
            let op = Op::NcclId(WorkerNcclId {});
            let what = "no NCCL unique id, so the host transport";
            self.ask(worker, op, what, |r| r.unique_id).await
        } else {
            Vec::new()
        };
        // Which communicators the worker kept, for the server to pick one all members hold.
        let comms = if nccl {
            let op = Op::Held(WorkerHeld {
                registration: self.registration(),
            });
            self.ask(worker, op, "the worker's kept communicators", |r| r.comms)
                .await
        } else {
            Vec::new()
        };
        let m = window::join(
            &self.store,
            Joining {
                namespace: self.namespace.as_str(),
                key: self.key.as_str(),
                asked,
                role,
                node_id: &self.node_id,
                worker_addr: &worker.data_addr,
                registration: self.registration(),
                digest: &self.table.digest().0,
                table_json: &self.table_json,
                nccl,
                unique_id,
                comms,
            },
        )
        .await?;
        if let Some(r) = lock(&self.registration).as_mut() {
            r.window = Some(m.clone());
        }
        self.still_open().await?;
        Ok(m)
    }

    /// What `pick` takes from the worker's answer to `op`; where it has none, the default (a
    /// window goes on without it), and `what` went wrong in the log.
    async fn ask<T: Default>(
        &self,
        worker: &WorkerClient,
        op: Op,
        what: &str,
        pick: impl FnOnce(WorkerReply) -> T,
    ) -> T {
        match worker.call(op).await {
            Ok(r) => pick(r),
            Err(e) => {
                tracing::warn!(key = %self.key, "{what}: {e}");
                T::default()
            }
        }
    }

    pub(super) async fn put(self, t: &Transfer) -> Result<u64, GpuError> {
        if self.window.is_none() {
            t.set(abi::RUNNING);
        }
        let (worker, nccl) = self.register(true).await?;
        let store = self.store.clone();
        let published = store
            .publish_gpu(PublishGpuRequest {
                namespace: self.namespace.to_string(),
                key: self.key.to_string(),
                gpu: Some(GpuKey {
                    table_json: self.table_json.clone(),
                    table_digest: self.table.digest().0.to_vec(),
                    nbytes: self.table.nbytes(),
                    publisher_node: self.node_id.clone(),
                    worker_addr: worker.data_addr.clone(),
                    registration: self.registration(),
                    window: self.window.as_ref().map(|w| w.spec.clone()),
                    // The server's to issue.
                    secret: Vec::new(),
                }),
            })
            .await;
        if let Err(e) = published {
            if let Some(asked) = &self.window {
                // Its window still counts it, and fails at its quorum naming it (and the other
                // putter, where the key is put twice in it), rather than holding the others until
                // a timeout that may never come.
                if let Ok(m) = self.join(asked, Role::Putter, &worker, false).await {
                    m.finish(&self.store, &e.to_string()).await;
                }
            }
            return Err(e.into());
        }
        self.still_open().await?;
        tracing::info!(key = %self.key, "GPU key published");
        let Some(asked) = self.window.clone() else {
            return Ok(self.table.nbytes());
        };
        // In a window the putter's transfer is the broadcast: it ends when every getter's has.
        let m = self.join(&asked, Role::Putter, &worker, nccl).await?;
        let moved = async {
            let plan = m.plan(&self.store, &self.closed).await?;
            t.set(abi::RUNNING);
            if plan.window.nccl {
                if let Err(e) = self.broadcast(&worker, &plan).await {
                    // A collective fails everywhere at once and NCCL names no one; the window
                    // knows which member went first, once the getters have reported.
                    let named =
                        tokio::time::timeout(NAME_WAIT, m.getters_done(&self.store, &self.closed))
                            .await;
                    return Err(match named {
                        Ok(Err(WindowError::Failed(errno, why))) => GpuError::Window(
                            WindowError::Failed(errno, format!("{why} (this putter: {e})")),
                        ),
                        _ => e,
                    });
                }
            }
            Ok::<_, GpuError>(m.getters_done(&self.store, &self.closed).await?)
        }
        .await;
        m.finish(&self.store, "").await;
        moved?;
        Ok(self.table.nbytes())
    }

    pub(super) async fn get(self, t: &Transfer) -> Result<u64, GpuError> {
        if let Some(asked) = self.window.clone() {
            return self.get_in_window(&asked, t).await;
        }
        let gpu = self
            .published()
            .await?
            .ok_or_else(|| GpuError::NotFound(self.key.to_string()))?;
        self.check_table(&gpu.table_json)?;
        let (worker, _) = self.register(false).await?;
        t.set(abi::RUNNING);
        let r = worker
            .call(Op::Fetch(WorkerFetch {
                registration: self.registration(),
                source_addr: gpu.worker_addr,
                source_registration: gpu.registration,
                source_secret: gpu.secret,
                source: format!("the publisher on node {}", gpu.publisher_node),
                pack: true,
                serialised: false,
                nccl_deadline_ms: self.nccl_within(),
            }))
            .await?;
        if r.nccl {
            // It kept the pair's communicator: worth keeping the worker a while for the next.
            worker.keeps_comms.store(true, Ordering::SeqCst);
        }
        Ok(r.bytes)
    }

    /// How long an NCCL transfer of this table's bytes may take to form its communicator, and
    /// then to move them.
    fn nccl_within(&self) -> u64 {
        NCCL_DEADLINE.as_millis() as u64 + self.table.nbytes() / NCCL_SLOWEST_BYTES_PER_MS
    }

    /// This member's part in the window's NCCL transfer; the bytes moved. One key: the
    /// window's broadcast (or its fanout's tree) from the putter. Several: each key down its
    /// own tree of sends and receives, on the window's one communicator.
    async fn broadcast(&self, worker: &WorkerClient, plan: &window::Plan) -> Result<u64, GpuError> {
        let within = self.nccl_within();
        let placed = plan.several_keys();
        let r = worker
            .call(Op::Broadcast(WorkerBroadcast {
                registration: self.registration(),
                unique_id: plan.window.unique_id.clone(),
                nranks: plan.window.members.len() as u32,
                rank: plan.me.rank,
                root: plan.putter.rank,
                pack: plan.pack(),
                deadline_ms: within,
                window: plan.window.group_id.clone(),
                comm: plan.window.comm.clone(),
                fanout: plan.window.spec.as_ref().map_or(0, |s| s.fanout),
                placed,
                parent_rank: plan.parent.as_ref().map_or(-1, |p| p.rank as i32),
                child_ranks: plan.children.iter().map(|c| c.rank).collect(),
            }))
            .await?;
        // It kept the communicator: worth keeping the worker a while for the next window.
        worker.keeps_comms.store(true, Ordering::SeqCst);
        Ok(r.bytes)
    }

    /// The window's word on a mismatch, with where this caller's table differs from the
    /// putter's if it is one of those that do (the putter published its table before joining).
    async fn mismatch(&self, why: String) -> String {
        let theirs = self
            .published()
            .await
            .ok()
            .flatten()
            .and_then(|g| Table::parse(g.table_json.as_bytes()).ok());
        match theirs.and_then(|t| self.table.difference(&t)) {
            Some(d) => format!("{why}; this caller's: {d}"),
            None => why,
        }
    }

    /// The GPU key as the store has it published now, if it is.
    async fn published(&self) -> Result<Option<GpuKey>, GpuError> {
        let r = self
            .store
            .resolve(ResolveRequest {
                watcher: 0,
                namespace: self.namespace.to_string(),
                key: self.key.to_string(),
                inline_up_to: 0,
            })
            .await;
        match r {
            Ok(r) => Ok(r.gpu),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A mismatch with the putter's table, said in full.
    fn check_table(&self, theirs: &str) -> Result<(), GpuError> {
        let theirs = Table::parse(theirs.as_bytes())?;
        if theirs.digest() == self.table.digest() {
            return Ok(());
        }
        let why = self
            .table
            .difference(&theirs)
            .unwrap_or_else(|| "the tables differ".into());
        Err(GpuError::Mismatch(why))
    }

    /// A GET in a window: the buffers registered (so that children can ask for bytes as soon as
    /// the plan is out), the quorum awaited, then the bytes pulled from the parent the plan
    /// names while this member's own children pull from it.
    async fn get_in_window(self, asked: &Asked, t: &Transfer) -> Result<u64, GpuError> {
        let (worker, nccl) = self.register(false).await?;
        let m = self.join(asked, Role::Getter, &worker, nccl).await?;
        let moved = async {
            let plan = match m.plan(&self.store, &self.closed).await {
                Err(WindowError::Failed(libc::EBADMSG, why)) => {
                    return Err(GpuError::Mismatch(self.mismatch(why).await));
                }
                r => r?,
            };
            self.check_table(&plan.putter.table_json)?;
            t.set(abi::RUNNING);
            if plan.window.nccl {
                return self.broadcast(&worker, &plan).await;
            }
            let parent = plan
                .parent
                .clone()
                .ok_or_else(|| GpuError::Buffers("the plan gives this getter no parent".into()))?;
            let r = worker
                .call(Op::Fetch(WorkerFetch {
                    registration: self.registration(),
                    source_addr: parent.worker_addr.clone(),
                    source_registration: parent.registration,
                    source_secret: parent.secret.clone(),
                    source: window::label(&parent),
                    pack: plan.pack(),
                    serialised: plan.serialised(),
                    // The plan chose the host transport for this window.
                    nccl_deadline_ms: 0,
                }))
                .await?;
            // Filled; but the transfer ends, and the caller may change its buffers, only once
            // no member below this one still reads from them.
            m.finish(&self.store, "").await;
            m.served(&self.store, &self.closed).await?;
            Ok(r.bytes)
        }
        .await;
        match &moved {
            Ok(_) => m.finish(&self.store, "").await,
            Err(e) => m.finish(&self.store, &e.to_string()).await,
        }
        moved
    }
}
