//! The transfer workers of an agent, one per caller's namespaces and ids, and the letting go of
//! a registration: the window told, a publisher's key unpublished, the worker told, and the
//! worker itself let go once it holds nothing (after a while, if it keeps communicators).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Mutex as AsyncMutex;

use crate::gpu::window::Membership;
use crate::gpu::worker::enter::Namespaces;
use crate::gpu::worker::spawn::WorkerClient;
use crate::proto::worker_request::Op;
use crate::proto::{RemoveRequest, WorkerRelease};
use crate::rpc::Store;

/// What a control file registered with its caller's worker.
pub(super) struct Registration {
    pub(super) id: u64,
    pub(super) publisher: bool,
    /// The process that made it.
    pub(super) caller: u32,
    pub(super) worker: Arc<WorkerClient>,
    /// The window it joined, told when the registration ends before its transfer does.
    pub(super) window: Option<Membership>,
}

/// Why a registration's transfer ends when its control file closes first: what the members
/// that receive from it are told.
pub(super) const CLOSED: &str = "its caller closed its control file";

/// The workers of this agent, one per caller's namespaces and ids (a pod's user), each with
/// the number of registrations it holds and how many it ever took; a worker that holds none
/// is let go (after [`LINGER`], if it keeps communicators).
#[derive(Default)]
pub(super) struct Workers {
    pub(super) by_caller: HashMap<WorkerKey, (Arc<WorkerClient>, usize, u64)>,
}

/// How long a worker that kept NCCL communicators outlives its last registration while the
/// process that made it lives: a trainer or an inference server that syncs weights every few
/// seconds finds its worker, and the communicators it formed with its peers, still there
/// (forming them again costs more than a small broadcast). It goes at once when that process
/// exits, and a worker that kept none goes with its last registration.
const LINGER: std::time::Duration = std::time::Duration::from_secs(60);

pub(super) type WorkerKey = (Namespaces, u32, u32);

/// Lets go of a registration: a publisher's key unpublished (unless published again since),
/// the worker told, and the worker itself let go once it holds nothing.
pub(super) async fn let_go(
    reg: Registration,
    store: Store,
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
                tracing::warn!(error = %e.to_string(), "could not unpublish a GPU key");
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
