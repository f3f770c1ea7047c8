//! A control file's part in a GPU window, as its agent plays it: join with the caller's
//! registration, wait for the quorum and the plan, report how it finished. The server side is
//! [`crate::broadcast::windows::GpuWindows`]; what the bytes do is the worker's.

use std::sync::atomic::{AtomicBool, Ordering};

use super::abi::{self, KtGpuWindow};
use crate::proto::{GpuAwaitRequest, GpuFinishRequest, GpuJoinRequest, GpuMember, GpuWindow};
use crate::proto::{HeldComm, Role, WindowSpec};
use crate::rpc::gpu_window::getters_finished;
use crate::rpc::{ClientError, Store};

/// How long one wait on the server lasts before the agent looks at its own state (has the
/// caller closed the file?) and asks again.
const AWAIT_MS: u32 = 2_000;

#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// The window failed as a whole, or this member could not take part: the errno and why.
    #[error("{1}")]
    Failed(i32, String),
    #[error("the control file was closed")]
    Closed,
    #[error(transparent)]
    Rpc(#[from] ClientError),
}

impl WindowError {
    pub fn errno(&self) -> i32 {
        match self {
            WindowError::Failed(e, _) => *e,
            WindowError::Closed => libc::ECONNABORTED,
            WindowError::Rpc(e) => e.fault().errno(),
        }
    }
}

/// What a caller's `KT_GPU_JOIN` asks for, checked: the window's spec and its flags.
#[derive(Clone, Debug)]
pub struct Asked {
    pub spec: WindowSpec,
    pub flags: u32,
}

impl Asked {
    pub fn from_abi(w: &KtGpuWindow) -> Result<Asked, abi::AbiError> {
        let group_id = abi::text(&w.group_id, "group_id")?.to_string();
        let ips = abi::text(&w.ips, "ips")?
            .split([',', ' '])
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        Ok(Asked {
            spec: WindowSpec {
                group_id,
                timeout_ms: w.timeout_ms,
                world_size: w.world_size,
                ips,
                fanout: w.fanout,
            },
            flags: w.flags,
        })
    }

    /// Whether the quorum can ever close: a window needs one of its criteria.
    pub fn has_quorum(&self) -> bool {
        self.spec.world_size > 0 || self.spec.timeout_ms > 0 || !self.spec.ips.is_empty()
    }
}

/// Where a member stands in its window.
#[derive(Clone, Debug)]
pub struct Membership {
    pub group_id: String,
    pub generation: u64,
    pub member: u64,
}

/// Who joins, with what.
pub struct Joining<'a> {
    pub namespace: &'a str,
    pub key: &'a str,
    pub asked: &'a Asked,
    pub role: Role,
    pub node_id: &'a str,
    pub worker_addr: &'a str,
    pub registration: u64,
    pub digest: &'a [u8],
    pub table_json: &'a str,
    /// Its worker can move its buffers over NCCL.
    pub nccl: bool,
    /// A putter's NCCL unique id (empty: none).
    pub unique_id: Vec<u8>,
    /// The communicators its worker keeps on its buffers' device.
    pub comms: Vec<HeldComm>,
}

/// Joins the window; a window that refuses the joiner (its quorum closed already) is a
/// [`WindowError::Failed`] with the errno the caller sees.
pub async fn join(store: &Store, j: Joining<'_>) -> Result<Membership, WindowError> {
    let r = store
        .clone()
        .join_gpu_window(GpuJoinRequest {
            namespace: j.namespace.to_string(),
            key: j.key.to_string(),
            window: Some(j.asked.spec.clone()),
            role: j.role as i32,
            node_id: j.node_id.to_string(),
            ip: String::new(),
            worker_addr: j.worker_addr.to_string(),
            registration: j.registration,
            table_digest: j.digest.to_vec(),
            table_json: if j.role == Role::Putter {
                j.table_json.to_string()
            } else {
                String::new()
            },
            flags: j.asked.flags,
            unique_id: j.unique_id,
            nccl: j.nccl,
            comms: j.comms,
        })
        .await;
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            let errno = match e.fault() {
                crate::rpc::status::Fault::Conflict => libc::EBUSY,
                f => f.errno(),
            };
            return Err(WindowError::Failed(errno, e.to_string()));
        }
    };
    let w = r.window.unwrap_or_default();
    tracing::info!(group = %w.group_id, member = r.member, role = ?j.role, "joined GPU window");
    Ok(Membership {
        group_id: w.group_id,
        generation: w.generation,
        member: r.member,
    })
}

impl Membership {
    /// Waits until the window has closed its quorum (or, `until_getters`, until every getter
    /// has finished), giving up if `closed` is set meanwhile.
    async fn wait(
        &self,
        store: &Store,
        until_getters: bool,
        closed: &AtomicBool,
    ) -> Result<GpuWindow, WindowError> {
        loop {
            if closed.load(Ordering::SeqCst) {
                return Err(WindowError::Closed);
            }
            let w = store
                .clone()
                .await_gpu_window(GpuAwaitRequest {
                    group_id: self.group_id.clone(),
                    generation: self.generation,
                    until_finished: until_getters,
                    wait_ms: AWAIT_MS,
                })
                .await?;
            if !w.error.is_empty() {
                return Err(WindowError::Failed(w.errno, w.error));
            }
            if (until_getters && getters_finished(&w)) || (!until_getters && w.closed) {
                return Ok(w);
            }
        }
    }

    /// The plan, once the quorum has closed and the window checked out.
    pub async fn plan(&self, store: &Store, closed: &AtomicBool) -> Result<Plan, WindowError> {
        let w = self.wait(store, false, closed).await?;
        Plan::of(w, self.member)
    }

    /// For the putter: waits until every getter has finished; `Err` names those that failed.
    pub async fn getters_done(
        &self,
        store: &Store,
        closed: &AtomicBool,
    ) -> Result<(), WindowError> {
        let w = self.wait(store, true, closed).await?;
        crate::rpc::gpu_window::outcome(&w).map_err(|why| WindowError::Failed(libc::EIO, why))
    }

    /// For a getter that has its bytes: waits until every getter has finished, since those
    /// below it read from its buffers until then. Others' failures are theirs; a window gone
    /// (replaced by the group's next, or idle) has no one left to serve.
    pub async fn served(&self, store: &Store, closed: &AtomicBool) -> Result<(), WindowError> {
        match self.wait(store, true, closed).await {
            Ok(_) | Err(WindowError::Failed(..)) => Ok(()),
            Err(WindowError::Rpc(e)) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Tells the window how this member finished (`error` empty: filled, or done putting).
    pub async fn finish(&self, store: &Store, error: &str) {
        let r = store
            .clone()
            .finish_gpu_window(GpuFinishRequest {
                group_id: self.group_id.clone(),
                generation: self.generation,
                member: self.member,
                error: error.to_string(),
            })
            .await;
        match r {
            Ok(_) => {}
            // A window that failed as a whole, or timed out, is gone: there is no one to tell.
            Err(e) if e.is_not_found() => {
                tracing::debug!(group = %self.group_id, "the GPU window is already gone");
            }
            Err(e) => {
                tracing::warn!(group = %self.group_id, error = %e.to_string(), "could not report to the GPU window");
            }
        }
    }
}

/// A member's part in the planned transfer.
#[derive(Clone, Debug)]
pub struct Plan {
    pub window: GpuWindow,
    pub me: GpuMember,
    /// Whom this member receives from; `None` for a putter.
    pub parent: Option<GpuMember>,
    /// The putter of this member's key: its table and flags are the key's.
    pub putter: GpuMember,
    /// Whom this member sends to, over NCCL (on the host transport they ask).
    pub children: Vec<GpuMember>,
}

impl Plan {
    fn of(window: GpuWindow, member: u64) -> Result<Plan, WindowError> {
        let find = |id: u64| window.members.iter().find(|m| m.id == id).cloned();
        let missing = |what: String| WindowError::Failed(libc::EIO, what);
        let me = find(member)
            .ok_or_else(|| missing(format!("the window does not list member {member}")))?;
        let parent = match u64::try_from(me.parent) {
            Ok(p) => Some(
                find(p).ok_or_else(|| missing(format!("the window does not list member {p}")))?,
            ),
            Err(_) => None,
        };
        let putter = window
            .members
            .iter()
            .find(|m| m.role() == Role::Putter && m.key == me.key)
            .cloned()
            .ok_or_else(|| missing(format!("the window has no putter of {}", me.key)))?;
        let mut children: Vec<GpuMember> = window
            .members
            .iter()
            .filter(|m| m.parent == me.id as i64)
            .cloned()
            .collect();
        children.sort_by_key(|m| m.rank);
        Ok(Plan {
            window,
            me,
            parent,
            putter,
            children,
        })
    }

    pub fn pack(&self) -> bool {
        self.putter.flags & abi::PACK != 0
    }

    pub fn serialised(&self) -> bool {
        self.putter.flags & abi::PG_GLOBAL != 0
    }

    /// Whether the window carries several keys: each then moves down its own tree.
    pub fn several_keys(&self) -> bool {
        let putters = self.window.members.iter();
        putters.filter(|m| m.role() == Role::Putter).count() > 1
    }
}

/// How a member is named in messages.
pub fn label(m: &GpuMember) -> String {
    let role = if m.role() == Role::Putter {
        " (the putter)"
    } else {
        ""
    };
    format!("member {} on node {}{role}", m.id, m.node_id)
}
