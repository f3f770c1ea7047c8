//! The agent's side of the GPU control files: what each open control file holds (its table,
//! its buffers, its window, its transfers) and what its ioctls do.
//!
//! Nothing here blocks a FUSE thread on a transfer: a commit checks what it can at once (the
//! table, the buffers), starts the transfer on the runtime and returns its id; STATUS reads
//! the transfer's state; poll(2) readiness comes from wakers the FUSE adapter hands over, called
//! when a transfer finishes. A registration belongs to its open file: [`GpuControl::release`]
//! lets the worker go of it and unpublishes a publisher's key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use super::abi::{self, Command, KtGpuBuffer, KtGpuStatus};
use super::table::{Table, TableError};
use super::window::{self, Asked, Joining, Membership, WindowError};
use super::worker::enter::{ids_of, Namespaces};
use super::worker::spawn::WorkerClient;
use super::worker::WorkerError;
use crate::key::{KeyPath, Namespace};
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{
    GpuKey, ListRequest, PublishGpuRequest, RemoveRequest, ResolveRequest, Role, WorkerBroadcast,
    WorkerBuffer, WorkerFetch, WorkerHeld, WorkerNcclId, WorkerProgress, WorkerRegister,
    WorkerRelease, WorkerReply,
};
use crate::auth::gpu_secret::HostKey;
use crate::rpc::{ClientError, Store};

/// How long an NCCL communicator may take to form, and a broadcast beyond its bytes' time at
/// [`NCCL_SLOWEST_BYTES_PER_MS`]: a member that died or hangs fails the others by then.
const NCCL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
/// 100 MB/s: slower than any link NCCL runs over.
const NCCL_SLOWEST_BYTES_PER_MS: u64 = 100_000;
/// How long a putter whose NCCL broadcast failed waits for the getters' reports, to say whose
/// failure it was.
const NAME_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Abi(#[from] abi::AbiError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("{0}")]
    Buffers(String),
    #[error("this control file has a registration already: open the key again for another")]
    Busy,
    #[error("no transfer {0} on this control file")]
    NoTransfer(u64),
    #[error("GPU key {0} is not published")]
    NotFound(String),
    #[error("the tensor table does not match the publisher's: {0}")]
    Mismatch(String),
    #[error("a window needs a quorum: world_size, timeout_ms or ips")]
    NoQuorum,
    #[error(transparent)]
    Window(#[from] WindowError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Rpc(#[from] ClientError),
}

impl GpuError {
    /// The errno the caller sees, from the ioctl or in its STATUS.
    pub fn errno(&self) -> i32 {
        match self {
            GpuError::Abi(abi::AbiError::Foreign(_)) => libc::ENOTTY,
            GpuError::Abi(_) | GpuError::Table(_) | GpuError::Buffers(_) | GpuError::NoQuorum => {
                libc::EINVAL
            }
            GpuError::Busy => libc::EBUSY,
            GpuError::NoTransfer(_) | GpuError::NotFound(_) => libc::ENOENT,
            GpuError::Mismatch(_) => libc::EBADMSG,
            GpuError::Window(w) => w.errno(),
            GpuError::Worker(w) => w.errno(),
            GpuError::Rpc(e) => e.fault().errno(),
        }
    }
}

/// Called once when a transfer finishes: the FUSE adapter's poll notification.
pub type Waker = Box<dyn FnOnce() + Send>;

/// One transfer of a control file, as STATUS reports it.
struct Transfer {
    id: u64,
    status: Mutex<KtGpuStatus>,
    wakers: Mutex<Vec<Waker>>,
}

impl Transfer {
    fn new(id: u64, total: u64) -> Arc<Transfer> {
        Arc::new(Transfer {
            id,
            status: Mutex::new(KtGpuStatus {
                transfer: id,
                state: abi::PENDING,
                error: 0,
                bytes_done: 0,
                bytes_total: total,
                message: [0; 256],
            }),
            wakers: Mutex::default(),
        })
    }

    fn finished(&self) -> bool {
        matches!(lock(&self.status).state, abi::DONE | abi::FAILED)
    }

    fn set(&self, state: u32) {
        lock(&self.status).state = state;
    }

    fn finish(&self, result: Result<u64, GpuError>) {
        {
            let mut st = lock(&self.status);
            match result {
                Ok(bytes) => {
                    st.state = abi::DONE;
                    st.bytes_done = bytes;
                }
                Err(e) => {
                    tracing::warn!(transfer = self.id, error = %e, "GPU transfer failed");
                    *st = st.clone().with_message(&e.to_string());
                    st.state = abi::FAILED;
                    st.error = e.errno();
                }
            }
        }
        for w in std::mem::take(&mut *lock(&self.wakers)) {
            w();
        }
    }
}

struct Registration {
    id: u64,
    publisher: bool,
    /// The process that made it.
    caller: u32,
    worker: Arc<WorkerClient>,
    /// The window it joined, told when the registration ends before its transfer does.
    window: Option<Membership>,
}

/// How long a STATUS waits for a worker to say how far its transfer is.
const PROGRESS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Why a registration's transfer ends when its control file closes first: what the members
/// that receive from it are told.
const CLOSED: &str = "its caller closed its control file";

/// An open control file: `/kt/.gpu/<key>` as one open file description holds it.
pub struct ControlFile {
    pub key: KeyPath,
    caller: u32,
    table: Mutex<Vec<u8>>,
    buffers: Mutex<Vec<KtGpuBuffer>>,
    window: Mutex<Option<Asked>>,
    transfers: Mutex<Vec<Arc<Transfer>>>,
    next_transfer: AtomicU64,
    registration: Arc<Mutex<Option<Registration>>>,
    /// Set by the last close: a commit still running lets go of what it registers.
    closed: Arc<AtomicBool>,
    /// What a read returns: the key's description, taken at the first read.
    description: Mutex<Option<Vec<u8>>>,
}

impl ControlFile {
    /// Bytes the caller writes: its tensor table.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<u32, GpuError> {
        let mut t = lock(&self.table);
        let end = offset as usize + data.len();
        if end > super::table::MAX_TABLE_BYTES {
            return Err(TableError::TooLarge.into());
        }
        if t.len() < end {
            t.resize(end, 0);
        }
        t[offset as usize..end].copy_from_slice(data);
        Ok(data.len() as u32)
    }

    /// Whether the latest transfer has finished; if not, `waker` is called when it does.
    pub fn poll(&self, waker: Option<Waker>) -> bool {
        let Some(t) = lock(&self.transfers).last().cloned() else {
            return false;
        };
        if t.finished() {
            return true;
        }
        if let Some(w) = waker {
            lock(&t.wakers).push(w);
            // It may have finished between the look and the push.
            if t.finished() {
                for w in std::mem::take(&mut *lock(&t.wakers)) {
                    w();
                }
            }
        }
        false
    }

    fn table(&self) -> Result<Table, GpuError> {
        Ok(Table::parse(&lock(&self.table))?)
    }

    /// The buffers handed over, checked against `table`: each entry once, each its size.
    fn checked_buffers(&self, table: &Table) -> Result<Vec<WorkerBuffer>, GpuError> {
        let buffers = lock(&self.buffers).clone();
        let mut seen = vec![false; table.entries.len()];
        let mut out = Vec::with_capacity(buffers.len());
        for b in buffers {
            let i = b.entry as usize;
            let e = table.entries.get(i).ok_or_else(|| {
                GpuError::Buffers(format!(
                    "a buffer names entry {i}; the table has {}",
                    seen.len()
                ))
            })?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(GpuError::Buffers(format!(
                    "entry {:?} has two buffers",
                    e.name
                )));
            }
            if b.nbytes != e.nbytes() {
                return Err(GpuError::Buffers(format!(
                    "entry {:?} is {} bytes, its buffer {}",
                    e.name,
                    e.nbytes(),
                    b.nbytes
                )));
            }
            out.push(WorkerBuffer {
                entry: b.entry,
                kind: b.kind,
                device: b.device,
                offset: b.offset,
                nbytes: b.nbytes,
                handle: b.handle.to_vec(),
            });
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(GpuError::Buffers(format!(
                "entry {:?} has no buffer",
                table.entries[i].name
            )));
        }
        Ok(out)
    }
}

/// The workers of this agent, one per caller's namespaces and ids (a pod's user), each with
/// the number of registrations it holds and how many it ever took; a worker that holds none
/// is let go (after [`LINGER`], if it keeps communicators).
#[derive(Default)]
struct Workers {
    by_caller: HashMap<WorkerKey, (Arc<WorkerClient>, usize, u64)>,
}

/// How long a worker that kept NCCL communicators outlives its last registration while the
/// process that made it lives: a trainer or an inference server that syncs weights every few
/// seconds finds its worker, and the communicators it formed with its peers, still there
/// (forming them again costs more than a small broadcast). It goes at once when that process
/// exits, and a worker that kept none goes with its last registration.
const LINGER: std::time::Duration = std::time::Duration::from_secs(60);

type WorkerKey = (Namespaces, u32, u32);

/// The GPU control files of one mount.
pub struct GpuControl {
    rt: tokio::runtime::Handle,
    store: Store,
    namespace: Namespace,
    node_id: String,
    /// The `kt` binary, started as `kt gpu-worker`.
    exe: PathBuf,
    /// Where this node's workers listen.
    host: String,
    /// The key this node's registrations' secrets come from, once the store server gave it.
    host_key: HostKey,
    workers: Arc<AsyncMutex<Workers>>,
}

/// A registration id: 64 bits from the kernel's random source. It is the capability other
/// workers present for the registration's bytes on the host transport, so it never falls back
/// to anything guessable: without randomness there is no registration.
fn random_id() -> Result<u64, GpuError> {
    super::random_u64()
        .map(|v| v | 1)
        .map_err(|e| GpuError::Buffers(format!("no randomness for a registration id: {e}")))
}

impl GpuControl {
    pub fn new(
        rt: tokio::runtime::Handle,
        store: Store,
        namespace: Namespace,
        node_id: String,
        exe: PathBuf,
        host: String,
        host_key: HostKey,
    ) -> Self {
        GpuControl {
            rt,
            store,
            namespace,
            node_id,
            exe,
            host,
            host_key,
            workers: Arc::default(),
        }
    }

    pub fn open(&self, key: KeyPath, caller: u32) -> Arc<ControlFile> {
        Arc::new(ControlFile {
            key,
            caller,
            table: Mutex::default(),
            buffers: Mutex::default(),
            window: Mutex::default(),
            transfers: Mutex::default(),
            next_transfer: AtomicU64::new(1),
            registration: Arc::default(),
            closed: Arc::default(),
            description: Mutex::default(),
        })
    }

    /// An ioctl on `cf`: the value the call returns, and the bytes copied back to the caller.
    pub fn ioctl(
        &self,
        cf: &Arc<ControlFile>,
        cmd: u32,
        data: &[u8],
    ) -> Result<(i32, Vec<u8>), GpuError> {
        match abi::decode(cmd, data)? {
            Command::Join(w) => {
                let asked = Asked::from_abi(&w)?;
                if !asked.has_quorum() {
                    return Err(GpuError::NoQuorum);
                }
                *lock(&cf.window) = Some(asked);
                Ok((0, Vec::new()))
            }
            Command::Put(b) => self.batch(cf, b, true),
            Command::Get(b) => self.batch(cf, b, false),
            Command::Status(id) => {
                let t = lock(&cf.transfers)
                    .iter()
                    .find(|t| t.id == id)
                    .cloned()
                    .ok_or(GpuError::NoTransfer(id))?;
                let mut st = lock(&t.status).clone();
                if st.state == abi::RUNNING {
                    st.bytes_done = self.filled(cf).unwrap_or(st.bytes_done);
                }
                Ok((0, st.encode()))
            }
        }
    }

    /// How much of a getter's buffers its worker has filled; `None` for a publisher, or when
    /// the worker does not answer at once (a STATUS never waits on a transfer).
    fn filled(&self, cf: &ControlFile) -> Option<u64> {
        let (id, worker) = {
            let r = lock(&cf.registration);
            let r = r.as_ref().filter(|r| !r.publisher)?;
            (r.id, r.worker.clone())
        };
        let asked = worker.call(Op::Progress(WorkerProgress { registration: id }));
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(PROGRESS_WAIT, asked).await })
            .ok()?
            .ok()?;
        Some(r.bytes)
    }

    fn batch(
        &self,
        cf: &Arc<ControlFile>,
        b: abi::KtGpuBuffers,
        publisher: bool,
    ) -> Result<(i32, Vec<u8>), GpuError> {
        if lock(&cf.registration).is_some() {
            return Err(GpuError::Busy);
        }
        if b.buffers[..b.count as usize]
            .iter()
            .any(|x| x.reserved != 0)
        {
            return Err(abi::AbiError::Reserved.into());
        }
        lock(&cf.buffers).extend_from_slice(&b.buffers[..b.count as usize]);
        if b.flags & abi::COMMIT == 0 {
            return Ok((0, Vec::new()));
        }
        let table = cf.table()?;
        let buffers = cf.checked_buffers(&table)?;
        let id = cf.next_transfer.fetch_add(1, Ordering::Relaxed);
        let transfer = Transfer::new(id, table.nbytes());
        lock(&cf.transfers).push(transfer.clone());
        let run = Commit {
            store: self.store.clone(),
            namespace: self.namespace.clone(),
            node_id: self.node_id.clone(),
            exe: self.exe.clone(),
            host: self.host.clone(),
            host_key: self.host_key.clone(),
            workers: self.workers.clone(),
            key: cf.key.clone(),
            caller: cf.caller,
            table,
            table_json: String::from_utf8_lossy(&lock(&cf.table)).into_owned(),
            buffers,
            window: lock(&cf.window).clone(),
            registration: cf.registration.clone(),
            closed: cf.closed.clone(),
        };
        self.rt.spawn(async move {
            let result = if publisher {
                run.put(&transfer).await
            } else {
                run.get(&transfer).await
            };
            transfer.finish(result);
        });
        Ok((id as i32, Vec::new()))
    }

    /// What a read of `cf` returns: the key's description as JSON (entries, publisher,
    /// version), or `{}` while nothing is published under it.
    pub fn read(&self, cf: &ControlFile, offset: u64, size: u32) -> Result<Vec<u8>, GpuError> {
        let mut d = lock(&cf.description);
        if d.is_none() || offset == 0 {
            *d = Some(self.describe(&cf.key)?);
        }
        let text = d.as_deref().unwrap_or_default();
        let start = (offset as usize).min(text.len());
        let end = start.saturating_add(size as usize).min(text.len());
        Ok(text[start..end].to_vec())
    }

    fn resolve(&self, key: &KeyPath) -> Result<Option<(GpuKey, Vec<u8>)>, GpuError> {
        let mut store = self.store.clone();
        let r = self.rt.block_on(store.resolve(ResolveRequest {
            watcher: 0,
            namespace: self.namespace.to_string(),
            key: key.to_string(),
            inline_up_to: 0,
        }));
        match r.map_err(ClientError::from) {
            Ok(r) => {
                let r = r.into_inner();
                Ok(r.gpu.map(|g| (g, r.version)))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a GPU key is published at `key`.
    pub fn exists(&self, key: &KeyPath) -> Result<bool, GpuError> {
        Ok(self.resolve(key)?.is_some())
    }

    fn describe(&self, key: &KeyPath) -> Result<Vec<u8>, GpuError> {
        let Some((gpu, version)) = self.resolve(key)? else {
            return Ok(b"{}\n".to_vec());
        };
        let table = Table::parse(gpu.table_json.as_bytes())?;
        let entries: Vec<serde_json::Value> = table
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name, "dtype": e.dtype, "shape": e.shape, "nbytes": e.nbytes(),
                })
            })
            .collect();
        let mut text = serde_json::to_vec(&serde_json::json!({
            "key": key.as_str(),
            "entries": entries,
            "nbytes": gpu.nbytes,
            "publisher": gpu.publisher_node,
            "window": gpu.window.map(|w| serde_json::json!({
                "group_id": w.group_id, "world_size": w.world_size, "timeout_ms": w.timeout_ms,
                "ips": w.ips, "fanout": w.fanout,
            })),
            "version": crate::hash::Version::from_slice(&version).map(|v| v.hex()),
        }))
        .unwrap_or_default();
        text.push(b'\n');
        Ok(text)
    }

    /// The GPU keys and directories directly below `prefix` (`None`: the namespace's root):
    /// `(name, is_directory)`.
    pub fn list(&self, prefix: Option<&KeyPath>) -> Result<Vec<(String, bool)>, GpuError> {
        let mut store = self.store.clone();
        let resp = self
            .rt
            .block_on(store.list(ListRequest {
                watcher: 0,
                namespace: self.namespace.to_string(),
                prefix: prefix.map(|p| p.to_string()).unwrap_or_default(),
                recursive: true,
                dir_only: false,
                ahead: 0,
            }))
            .map_err(ClientError::from)?
            .into_inner();
        let mut out: std::collections::BTreeMap<String, bool> = Default::default();
        for e in resp.entries {
            if e.kind() != crate::manifest::EntryKind::Gpu {
                continue;
            }
            let name = e.name.trim_end_matches('/');
            // The key at `prefix` itself (published since the caller looked for it) is not
            // below it.
            if name.is_empty() {
                continue;
            }
            match name.split_once('/') {
                Some((dir, _)) => {
                    out.insert(dir.to_string(), true);
                }
                None => {
                    out.entry(name.to_string()).or_insert(false);
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// `unlink` of a control file: unpublishes the GPU key (whoever published it).
    pub fn unpublish(&self, key: &KeyPath) -> Result<(), GpuError> {
        if !self.exists(key)? {
            return Err(GpuError::NotFound(key.to_string()));
        }
        let mut store = self.store.clone();
        self.rt
            .block_on(store.remove(RemoveRequest {
                namespace: self.namespace.to_string(),
                key: key.to_string(),
                recursive: false,
                prefix: false,
                gpu_registration: 0,
                watcher: 0,
            }))
            .map_err(ClientError::from)?;
        Ok(())
    }

    /// The last close of `cf`: its transfers are abandoned, its buffers let go, and a
    /// publisher's key unpublished (unless published again by another registration since).
    pub fn release(&self, cf: &ControlFile) {
        cf.closed.store(true, Ordering::SeqCst);
        let Some(reg) = lock(&cf.registration).take() else {
            return;
        };
        let (store, ns, key, workers) = (
            self.store.clone(),
            self.namespace.to_string(),
            cf.key.to_string(),
            self.workers.clone(),
        );
        self.rt.spawn(let_go(reg, store, ns, key, workers));
    }
}

/// Lets go of a registration: a publisher's key unpublished (unless published again since),
/// the worker told, and the worker itself let go once it holds nothing.
async fn let_go(
    reg: Registration,
    mut store: Store,
    ns: String,
    key: String,
    workers: Arc<AsyncMutex<Workers>>,
) {
    {
        if let Some(m) = &reg.window {
            m.finish(&store, CLOSED).await;
        }
        if reg.publisher {
            let r = store
                .remove(RemoveRequest {
                    namespace: ns,
                    key,
                    recursive: false,
                    prefix: false,
                    gpu_registration: reg.id,
                    watcher: 0,
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e.message(), "could not unpublish a GPU key");
            }
        }
        let release = Op::Release(WorkerRelease {
            registration: reg.id,
            reason: CLOSED.into(),
        });
        if let Err(e) = reg.worker.call(release).await {
            tracing::debug!(error = %e, "the worker did not take the release");
        }
        let mut w = workers.lock().await;
        let mine = w
            .by_caller
            .iter_mut()
            .find(|(_, (c, _, _))| Arc::ptr_eq(c, &reg.worker));
        if let Some((key, (_, n, taken))) = mine {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Its last registration is gone: closing the control socket ends it.
                let key = key.clone();
                if reg.worker.keeps_comms.load(Ordering::SeqCst) {
                    let taken = *taken;
                    drop(w);
                    tokio::spawn(linger(workers.clone(), key, taken, reg.caller));
                } else {
                    w.by_caller.remove(&key);
                }
            }
        }
    }
}

/// Lets go of the worker at `key` once its caller `pid` exits or [`LINGER`] has passed,
/// unless it took a registration since (`taken` counts them).
async fn linger(workers: Arc<AsyncMutex<Workers>>, key: WorkerKey, taken: u64, pid: u32) {
    let _ = tokio::time::timeout(LINGER, exited(pid)).await;
    let mut w = workers.lock().await;
    if w.by_caller
        .get(&key)
        .is_some_and(|(_, n, t)| *n == 0 && *t == taken)
    {
        w.by_caller.remove(&key);
    }
}

/// Resolves when the process of thread `tid` has exited (at once if it cannot be watched).
async fn exited(tid: u32) {
    // The caller the kernel names is a thread; its process is what must be watched.
    let tgid = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse::<libc::pid_t>().ok())
        });
    let Some(tgid) = tgid else { return };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid, 0) };
    if fd < 0 {
        return;
    }
    // SAFETY: a descriptor the call just opened, owned by nothing else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // A pidfd turns readable when its process exits.
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open on the same descriptor until it
    // is dropped with it.
    let watched = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    if let Ok(fd) = watched {
        let _ = fd.readable().await;
    }
}

/// What a commit needs, moved onto the runtime.
struct Commit {
    store: Store,
    namespace: Namespace,
    node_id: String,
    exe: PathBuf,
    host: String,
    host_key: HostKey,
    workers: Arc<AsyncMutex<Workers>>,
    key: KeyPath,
    caller: u32,
    table: Table,
    table_json: String,
    buffers: Vec<WorkerBuffer>,
    window: Option<Asked>,
    registration: Arc<Mutex<Option<Registration>>>,
    closed: Arc<AtomicBool>,
}

impl Commit {
    /// The caller's worker (started on its first registration), counted as holding one more.
    async fn worker(&self) -> Result<Arc<WorkerClient>, GpuError> {
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
        let key = (ns, uid, gid);
        let mut w = self.workers.lock().await;
        if let Some((c, n, taken)) = w.by_caller.get_mut(&key) {
            *n += 1;
            *taken += 1;
            return Ok(c.clone());
        }
        let c = WorkerClient::start(&self.exe, &self.host, self.caller).await?;
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
        let registered = worker
            .call(Op::Register(WorkerRegister {
                registration: reg.id,
                buffers: self.buffers.clone(),
                receiving: !publisher,
                secret: self
                    .host_key
                    .secret(self.namespace.as_str(), &self.node_id, reg.id)
                    .map(Vec::from)
                    .unwrap_or_default(),
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

    async fn put(self, t: &Transfer) -> Result<u64, GpuError> {
        if self.window.is_none() {
            t.set(abi::RUNNING);
        }
        let (worker, nccl) = self.register(true).await?;
        let mut store = self.store.clone();
        store
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
            .await
            .map_err(ClientError::from)?;
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

    async fn get(self, t: &Transfer) -> Result<u64, GpuError> {
        if let Some(asked) = self.window.clone() {
            return self.get_in_window(&asked, t).await;
        }
        let mut store = self.store.clone();
        let r = store
            .resolve(ResolveRequest {
                watcher: 0,
                namespace: self.namespace.to_string(),
                key: self.key.to_string(),
                inline_up_to: 0,
            })
            .await
            .map_err(ClientError::from);
        let gpu = match r {
            Ok(r) => r.into_inner().gpu,
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        }
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

    /// This member's part in the window's NCCL broadcast; the bytes moved.
    async fn broadcast(&self, worker: &WorkerClient, plan: &window::Plan) -> Result<u64, GpuError> {
        let root = plan
            .window
            .members
            .iter()
            .find(|m| m.role() == Role::Putter)
            .map(|m| m.rank)
            .ok_or_else(|| GpuError::Buffers("the plan has no putter".into()))?;
        let within = self.nccl_within();
        let r = worker
            .call(Op::Broadcast(WorkerBroadcast {
                registration: self.registration(),
                unique_id: plan.window.unique_id.clone(),
                nranks: plan.window.members.len() as u32,
                rank: plan.me.rank,
                root,
                pack: plan.pack(),
                deadline_ms: within,
                window: plan.window.group_id.clone(),
                comm: plan.window.comm.clone(),
                fanout: plan.window.spec.as_ref().map_or(0, |s| s.fanout),
            }))
            .await?;
        // It kept the communicator: worth keeping the worker a while for the next window.
        worker.keeps_comms.store(true, Ordering::SeqCst);
        Ok(r.bytes)
    }

    /// The window's word on a mismatch, with where this caller's table differs from the
    /// putter's if it is one of those that do (the putter published its table before joining).
    async fn mismatch(&self, why: String) -> String {
        let r = self
            .store
            .clone()
            .resolve(ResolveRequest {
                watcher: 0,
                namespace: self.namespace.to_string(),
                key: self.key.to_string(),
                inline_up_to: 0,
            })
            .await;
        let theirs = r
            .ok()
            .and_then(|r| r.into_inner().gpu)
            .and_then(|g| Table::parse(g.table_json.as_bytes()).ok());
        match theirs.and_then(|t| self.table.difference(&t)) {
            Some(d) => format!("{why}; this caller's: {d}"),
            None => why,
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
            self.check_table(&plan.window.table_json)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lingering_worker_learns_when_its_caller_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watch = tokio::spawn(exited(child.id()));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!watch.is_finished(), "resolved while the caller lives");
        child.kill().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), watch)
            .await
            .expect("not told of the exit")
            .unwrap();
        // Reaped, it cannot be watched: at once, not after LINGER.
        child.wait().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), exited(child.id()))
            .await
            .expect("an exited caller is waited for");
    }
}
