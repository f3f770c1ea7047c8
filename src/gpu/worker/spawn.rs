//! The agent's side of a transfer worker: starting it, and calling it over its control socket.
//!
//! A worker must live in the caller's namespaces (PID, IPC, mount, network): CUDA IPC handles
//! do not cross PID namespaces, a pod's /dev/shm is its own, and NCCL must use the pod's
//! network and devices. Where the caller shares the agent's namespaces (`kt up`, bare metal,
//! CI) the worker is a plain child; otherwise the child joins the caller's namespaces before it
//! becomes the worker (see [`super::enter`]). Either way it runs as the caller's uid and gid
//! with no capability.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{oneshot, Mutex as AsyncMutex};

use super::error::WorkerError;
use crate::gpu::wire;
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{WorkerReply, WorkerRequest};

/// The descriptor number of the control socket in the worker.
pub const CONTROL_FD: i32 = 3;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<WorkerReply>>>>;

/// A running worker and the way to it.
pub struct WorkerClient {
    tx: AsyncMutex<OwnedWriteHalf>,
    pending: Pending,
    next: AtomicU64,
    /// Where other workers reach this one's data port.
    pub data_addr: String,
    pid: u32,
    /// It kept an NCCL communicator from a window (see `collective::Comms`).
    pub keeps_comms: std::sync::atomic::AtomicBool,
}

/// How a worker finds the NCCL its caller uses.
enum NcclSetup {
    /// `LD_LIBRARY_PATH` for a worker in the agent's own namespaces.
    Path(std::ffi::OsString),
    /// For a worker that enters a pod: the library's path in the pod, and a directory of a
    /// random name, first on the worker's `LD_LIBRARY_PATH`, where the worker makes its
    /// `libnccl.so` link inside the pod once it entered it (`kt gpu-worker --nccl-dir
    /// --nccl-target`). The loader reads the path when NCCL is loaded, in the pod, so the
    /// worker holds nothing that leads back into the agent's filesystem: what the pod's
    /// libraries run in it sees the pod's files only. The agent makes the same directory
    /// (empty, the caller's) in its own filesystem for the worker's start, when the loader
    /// notes which of its directories exist.
    InPod {
        dir: std::path::PathBuf,
        target: std::path::PathBuf,
    },
}

/// The NCCL process `caller` uses, as a path in its own mount namespace: the one it has
/// mapped (torch's own, loaded with `import torch`), else the one its `KT_NCCL_LIBRARY`
/// names (a C caller's).
fn callers_nccl(caller: u32) -> Option<std::path::PathBuf> {
    std::fs::read_to_string(format!("/proc/{caller}/maps"))
        .ok()
        .and_then(|maps| crate::gpu::cuda::loaded_nccl(&maps))
        .or_else(|| {
            std::fs::read(format!("/proc/{caller}/environ"))
                .ok()
                .and_then(|env| crate::gpu::cuda::nccl_named_in(&env))
        })
}

/// A link directory per library (callers may bring different NCCLs), the same one for every
/// agent of the machine, so none is left behind per run.
fn link_scratch(lib: &Path) -> std::path::PathBuf {
    let digest = blake3::hash(lib.as_os_str().as_encoded_bytes()).to_hex();
    std::env::temp_dir().join(format!("kt-nccl-{}", &digest[..16]))
}

/// How a worker for `caller` loads its NCCL: the caller's (see [`callers_nccl`]); for a worker
/// in the agent's namespaces, else the one this agent finds (`KT_NCCL_LIBRARY`, pip's, a
/// distribution's; see [`crate::gpu::cuda::nccl_lib`]). A worker that enters a pod and is
/// given none loads what the pod's loader finds under NCCL's own names.
fn nccl_setup(caller: u32, entered: bool) -> Option<NcclSetup> {
    static BY_LIBRARY: std::sync::LazyLock<Mutex<HashMap<std::path::PathBuf, std::ffi::OsString>>> =
        std::sync::LazyLock::new(Mutex::default);
    static FOUND: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let callers = callers_nccl(caller);
    if entered {
        let target = callers.filter(|t| t.is_absolute())?;
        let dir = std::env::temp_dir().join(format!(
            "kt-nccl-pod-{:016x}",
            crate::gpu::random::random_u64().ok()?
        ));
        tracing::info!(library = %target.display(), caller, "the pod's transfer worker loads the NCCL its caller uses");
        return Some(NcclSetup::InPod { dir, target });
    }
    let lib = callers.or_else(|| {
        FOUND
            .get_or_init(|| {
                crate::gpu::cuda::find_nccl_library(|v| std::env::var_os(v), Path::new("/"))
            })
            .clone()
    })?;
    let mut known = lock(&BY_LIBRARY);
    if let Some(path) = known.get(&lib) {
        return Some(NcclSetup::Path(path.clone()));
    }
    match crate::gpu::cuda::loader_path_for(&lib, &link_scratch(&lib)) {
        Ok(path) => {
            tracing::info!(library = %lib.display(), caller, "the transfer worker loads this NCCL");
            known.insert(lib, path.clone());
            Some(NcclSetup::Path(path))
        }
        Err(e) => {
            tracing::warn!(library = %lib.display(), "linking NCCL for a transfer worker: {e}");
            None
        }
    }
}

/// Makes `dir`, empty and `uid`:`gid`'s (where the pod's /tmp is this one, the worker makes its
/// link in it).
fn own_dir(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
}

/// In a worker that entered a pod, as the caller: `dir/libnccl.so`, a link to `target`, both
/// paths in the pod (see [`NcclSetup::InPod`]).
pub fn link_pod_nccl(dir: &Path, target: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, link)
}

/// Whether `pid` lives in this process's PID, IPC, mount and network namespaces.
pub fn shares_namespaces(pid: u32) -> bool {
    ["pid", "ipc", "mnt", "net"].iter().all(|ns| {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}"));
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"));
        matches!((mine, theirs), (Ok(a), Ok(b)) if a == b)
    })
}

impl WorkerClient {
    /// Starts `exe gpu-worker` for a caller with process id `caller`: in the caller's
    /// namespaces, as the caller's uid and gid, its data port on `host` (this node's address)
    /// or, in a pod, on the pod's address towards it.
    pub async fn start(exe: &Path, host: &str, caller: u32) -> Result<Arc<Self>, WorkerError> {
        let (uid, gid) = super::enter::ids_of(caller)
            .map_err(|e| WorkerError::Spawn(format!("the caller, process {caller}: {e}")))?;
        let mut args = vec!["gpu-worker".to_string()];
        if shares_namespaces(caller) {
            args.extend(["--host".into(), host.to_string()]);
        } else {
            args.extend([
                "--enter".into(),
                caller.to_string(),
                "--near".into(),
                host.to_string(),
            ]);
        }
        args.extend([
            "--uid".into(),
            uid.to_string(),
            "--gid".into(),
            gid.to_string(),
        ]);
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| WorkerError::Spawn(e.to_string()))?;
        let theirs = OwnedFd::from(theirs);
        let raw = theirs.as_raw_fd();
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(false);
        // The loader reads LD_LIBRARY_PATH only at a process's start, and the bindings never ask
        // for pip's `libnccl.so.2` by that name.
        let pod_dir = match nccl_setup(caller, !shares_namespaces(caller)) {
            Some(NcclSetup::Path(path)) => {
                cmd.env("LD_LIBRARY_PATH", path);
                None
            }
            Some(NcclSetup::InPod { dir, target }) => match own_dir(&dir, uid, gid) {
                Ok(()) => {
                    cmd.env(
                        "LD_LIBRARY_PATH",
                        crate::gpu::cuda::nccl_lib::library_path_with(
                            &dir,
                            std::env::var_os("LD_LIBRARY_PATH").as_deref(),
                        ),
                    )
                    .arg("--nccl-dir")
                    .arg(&dir)
                    .arg("--nccl-target")
                    .arg(&target);
                    Some(dir)
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), "a directory for a pod's NCCL link: {e}");
                    None
                }
            },
            None => None,
        };
        // SAFETY: between fork and exec only async-signal-safe calls: dup2 onto the one
        // descriptor number the worker expects, which clears its close-on-exec flag.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            if let Some(dir) = &pod_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            WorkerError::Spawn(format!("{}: {e}", exe.display()))
        })?;
        drop(theirs);
        let pid = child.id().unwrap_or(0);
        // Reaped whenever it ends, so it never lingers as a zombie; its directory goes with it.
        tokio::spawn(async move {
            let _ = child.wait().await;
            if let Some(dir) = pod_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
        });
        ours.set_nonblocking(true)?;
        let (mut rd, wr) = UnixStream::from_std(ours)?.into_split();
        let hello: WorkerReply = wire::recv(&mut rd)
            .await?
            .ok_or_else(|| WorkerError::Spawn("the worker exited before it was ready".into()))?;
        let pending: Pending = Arc::default();
        let replies = pending.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = wire::recv::<_, WorkerReply>(&mut rd).await {
                if let Some(tx) = lock(&replies).remove(&r.id) {
                    let _ = tx.send(r);
                }
            }
            // The worker is gone: whoever still waits learns it.
            lock(&replies).clear();
        });
        tracing::info!(pid, data_addr = %hello.data_addr, "transfer worker started");
        Ok(Arc::new(WorkerClient {
            tx: AsyncMutex::new(wr),
            pending,
            next: AtomicU64::new(1),
            data_addr: hello.data_addr,
            pid,
            keeps_comms: Default::default(),
        }))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `op` and waits for its reply; a reply with an error is an error.
    pub async fn call(&self, op: Op) -> Result<WorkerReply, WorkerError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let sent = wire::send(
            &mut *self.tx.lock().await,
            &WorkerRequest { id, op: Some(op) },
        )
        .await;
        if let Err(e) = sent {
            lock(&self.pending).remove(&id);
            return Err(e.into());
        }
        let r = rx
            .await
            .map_err(|_| WorkerError::Spawn("the transfer worker exited".into()))?;
        if r.error.is_empty() {
            Ok(r)
        } else {
            Err(WorkerError::Remote(r.errno, r.error))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_worker_is_given_the_nccl_its_caller_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libnccl.so.2");
        std::fs::write(&lib, vec![0u8; 4096]).unwrap();
        let file = std::fs::File::open(&lib).unwrap();
        // SAFETY: a fresh read-only private mapping of a file this test owns, unmapped below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let path = match nccl_setup(std::process::id(), false) {
            Some(NcclSetup::Path(p)) => Some(p),
            _ => None,
        };
        // SAFETY: the mapping made above, once.
        unsafe { libc::munmap(at, 4096) };
        let path = path.expect("the mapped library was found");
        let first = std::env::split_paths(&path).next().unwrap();
        let link = first.join("libnccl.so");
        let linked = std::fs::canonicalize(&link);
        let _ = std::fs::remove_dir_all(first.parent().unwrap());
        assert_eq!(linked.unwrap(), std::fs::canonicalize(&lib).unwrap());
    }
}
