//! The GPU control files of one mount, as the filesystem core calls them: open, the ioctls,
//! read (a key's description), readdir, unlink, and the last close.
//!
//! Nothing here blocks a FUSE thread on a transfer: a commit checks what it can at once (the
//! table, the buffers), starts the transfer on the runtime (`Commit`) and returns its id;
//! STATUS reads the transfer's state.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Mutex as AsyncMutex;

use super::commit::Commit;
use super::error::GpuError;
use super::file::ControlFile;
use super::transfer::Transfer;
use super::workers::{let_go, Workers};
use crate::gpu::abi::{self, Command};
use crate::gpu::table::Table;
use crate::gpu::window::Asked;
use crate::key::{KeyPath, Namespace};
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{GpuKey, ListRequest, RemoveRequest, ResolveRequest, WorkerProgress};
use crate::rpc::Store;

/// How long a STATUS waits for a worker to say how far its transfer is.
const PROGRESS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

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
    workers: Arc<AsyncMutex<Workers>>,
}

impl GpuControl {
    pub fn new(
        rt: tokio::runtime::Handle,
        store: Store,
        namespace: Namespace,
        node_id: String,
        exe: PathBuf,
        host: String,
    ) -> Self {
        GpuControl {
            rt,
            store,
            namespace,
            node_id,
            exe,
            host,
            workers: Arc::default(),
        }
    }

    pub fn open(&self, key: KeyPath, caller: u32) -> Arc<ControlFile> {
        Arc::new(ControlFile::new(key, caller))
    }

    /// An ioctl on `cf`: the value the call returns, and the bytes copied back to the caller.
    pub async fn ioctl(
        &self,
        cf: &Arc<ControlFile>,
        cmd: u32,
        data: &[u8],
    ) -> Result<(i32, Vec<u8>), GpuError> {
        // A descriptor passed on, or a pid taken over, acts for no one once its opener is gone.
        super::file::opener_alive(&cf.opener)?;
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
                    st.bytes_done = self.filled(cf).await.unwrap_or(st.bytes_done);
                }
                Ok((0, st.encode()))
            }
        }
    }

    /// How much of a getter's buffers its worker has filled; `None` for a publisher, or when
    /// the worker does not answer at once (a STATUS never waits on a transfer).
    async fn filled(&self, cf: &ControlFile) -> Option<u64> {
        let (id, worker) = {
            let r = lock(&cf.registration);
            let r = r.as_ref().filter(|r| !r.publisher)?;
            (r.id, r.worker.clone())
        };
        let asked = worker.call(Op::Progress(WorkerProgress { registration: id }));
        let r = tokio::time::timeout(PROGRESS_WAIT, asked)
            .await
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
            workers: self.workers.clone(),
            key: cf.key.clone(),
            caller: cf.caller,
            opener: cf.opener.clone(),
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
    pub async fn read(
        &self,
        cf: &ControlFile,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, GpuError> {
        let kept = lock(&cf.description).clone().filter(|_| offset != 0);
        let text = match kept {
            Some(text) => text,
            None => {
                let text = self.describe(&cf.key).await?;
                *lock(&cf.description) = Some(text.clone());
                text
            }
        };
        let start = (offset as usize).min(text.len());
        let end = start.saturating_add(size as usize).min(text.len());
        Ok(text[start..end].to_vec())
    }

    async fn resolve(&self, key: &KeyPath) -> Result<Option<(GpuKey, Vec<u8>)>, GpuError> {
        let store = self.store.clone();
        let r = store
            .resolve(ResolveRequest {
                watcher: 0,
                namespace: self.namespace.to_string(),
                key: key.to_string(),
                inline_up_to: 0,
            })
            .await;
        match r {
            Ok(r) => Ok(r.gpu.map(|g| (g, r.version))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a GPU key is published at `key`.
    pub async fn exists(&self, key: &KeyPath) -> Result<bool, GpuError> {
        Ok(self.resolve(key).await?.is_some())
    }

    async fn describe(&self, key: &KeyPath) -> Result<Vec<u8>, GpuError> {
        let Some((gpu, version)) = self.resolve(key).await? else {
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
    pub async fn list(&self, prefix: Option<&KeyPath>) -> Result<Vec<(String, bool)>, GpuError> {
        let store = self.store.clone();
        let resp = store
            .list_all(ListRequest {
                namespace: self.namespace.to_string(),
                prefix: prefix.map(|p| p.to_string()).unwrap_or_default(),
                recursive: true,
                ..Default::default()
            })
            .await?;
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
    pub async fn unpublish(&self, key: &KeyPath) -> Result<(), GpuError> {
        if !self.exists(key).await? {
            return Err(GpuError::NotFound(key.to_string()));
        }
        let store = self.store.clone();
        store
            .remove(RemoveRequest {
                namespace: self.namespace.to_string(),
                key: key.to_string(),
                recursive: false,
                prefix: false,
                gpu_registration: 0,
                watcher: 0,
            })
            .await?;
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
