//! A control file's part in a GPU window, as its agent plays it: join with the caller's
//! registration, wait for the quorum and the plan, report how it finished. The server side is
//! [`crate::broadcast::windows::GpuWindows`]; what the bytes do is the worker's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::abi::{self, KtGpuWindow};
use crate::proto::{
    GpuAwaitRequest, GpuFinishRequest, GpuJoinRequest, GpuMember, GpuMemberState, GpuWindow,
};
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

/// A member of a window: where it stands, shared by its clones (the registration keeps one to
/// tell the window of an early close), and what it joined with, to join again where the store's
/// owner died and the next knows nothing of the window (cluster mode).
#[derive(Clone, Debug)]
pub struct Membership {
    joined: Arc<GpuJoinRequest>,
    place: Arc<Mutex<Place>>,
}

#[derive(Clone, Debug)]
struct Place {
    group_id: String,
    generation: u64,
    member: u64,
    /// The window as last told, once its quorum closed: what a new owner takes up.
    known: Option<GpuWindow>,
    /// How this member finished, once it said so: told again to a new owner.
    reported: Option<String>,
    /// Joins again with no answer of the window between them.
    again: u32,
}

/// How many times in a row a member joins its window again (each time the store's owner died
/// and the next knew nothing of the window) before it gives up: an owner that dies at once
/// each time is not a window to wait for.
const MAX_AGAIN: u32 = 3;

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

/// A refused join as the caller sees it: a window that closed its quorum before it joined is
/// busy.
fn refused(e: &ClientError) -> WindowError {
    let errno = match e.fault() {
        crate::rpc::status::Fault::Conflict => libc::EBUSY,
        f => f.errno(),
    };
    WindowError::Failed(errno, e.to_string())
}

/// Joins the window; a window that refuses the joiner (its quorum closed already) is a
/// [`WindowError::Failed`] with the errno the caller sees.
pub async fn join(store: &Store, j: Joining<'_>) -> Result<Membership, WindowError> {
    let joined = GpuJoinRequest {
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
        known: None,
        // A join cut off by a replica's death is sent again, and must not join twice.
        again: true,
    };
    let r = store
        .clone()
        .join_gpu_window(joined.clone())
        .await
        .map_err(|e| refused(&e))?;
    let w = r.window.unwrap_or_default();
    tracing::info!(group = %w.group_id, member = r.member, role = ?j.role, "joined GPU window");
    Ok(Membership {
        joined: Arc::new(joined),
        place: Arc::new(Mutex::new(Place {
            group_id: w.group_id,
            generation: w.generation,
            member: r.member,
            known: None,
            reported: None,
            again: 0,
        })),
    })
}

impl Membership {
    fn place(&self) -> std::sync::MutexGuard<'_, Place> {
        crate::locks::lock(&self.place)
    }

    /// The group and generation of the window, and this member's place in it.
    pub fn at(&self) -> (String, u64, u64) {
        let p = self.place();
        (p.group_id.clone(), p.generation, p.member)
    }

    /// Waits until the window has closed its quorum (or, `until_getters`, until every getter
    /// has finished), giving up if `closed` is set meanwhile. A window the store no longer
    /// knows (its owner died) is joined again there.
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
            let (group_id, generation, _) = self.at();
            let w = store
                .clone()
                .await_gpu_window(GpuAwaitRequest {
                    group_id,
                    generation,
                    until_finished: until_getters,
                    wait_ms: AWAIT_MS,
                })
                .await;
            let w = match w {
                Ok(w) => w,
                Err(e) if e.is_not_found() => {
                    self.join_again(store).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let unheard = {
                let mut p = self.place();
                p.again = 0;
                if w.closed {
                    p.known = Some(w.clone());
                }
                // A window taken up from another member's copy may not show this member's
                // report, which went to the owner that died: told again.
                let member = usize::try_from(p.member)
                    .ok()
                    .and_then(|m| w.members.get(m));
                let waiting = member.is_some_and(|m| m.state() == GpuMemberState::GpuWaiting);
                p.reported.clone().filter(|_| waiting)
            };
            if let Some(error) = unheard {
                self.report(store, &error).await?;
            }
            if !w.error.is_empty() {
                return Err(WindowError::Failed(w.errno, w.error));
            }
            if (until_getters && getters_finished(&w)) || (!until_getters && w.closed) {
                return Ok(w);
            }
        }
    }

    /// Joins the window again at the store's owner, which knew nothing of it: with the window
    /// as this member last saw it closed (taken up as it stands), else as it first joined (the
    /// window forms again); then tells it again how this member finished, if it did.
    async fn join_again(&self, store: &Store) -> Result<(), WindowError> {
        let (known, again) = {
            let mut p = self.place();
            p.again += 1;
            (p.known.clone(), p.again)
        };
        let group = self.joined.window.as_ref().map(|w| w.group_id.clone());
        if again > MAX_AGAIN {
            return Err(WindowError::Failed(
                libc::EIO,
                format!(
                    "the store lost GPU window {} {MAX_AGAIN} times in a row",
                    group.unwrap_or_default()
                ),
            ));
        }
        let mut req = (*self.joined).clone();
        req.again = true;
        let adopting = known.is_some();
        req.known = known;
        let r = store
            .clone()
            .join_gpu_window(req)
            .await
            .map_err(|e| refused(&e))?;
        let w = r.window.unwrap_or_default();
        tracing::info!(group = %w.group_id, member = r.member, adopting, "joined the GPU window again at the store's owner");
        let reported = {
            let mut p = self.place();
            p.group_id.clone_from(&w.group_id);
            p.generation = w.generation;
            p.member = r.member;
            if w.closed {
                p.known = Some(w);
            }
            p.reported.clone()
        };
        if let Some(error) = reported {
            self.report(store, &error).await?;
        }
        Ok(())
    }

    /// The plan, once the quorum has closed and the window checked out.
    pub async fn plan(&self, store: &Store, closed: &AtomicBool) -> Result<Plan, WindowError> {
        let w = self.wait(store, false, closed).await?;
        Plan::of(w, self.at().2)
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

    async fn report(&self, store: &Store, error: &str) -> Result<(), ClientError> {
        let (group_id, generation, member) = self.at();
        store
            .clone()
            .finish_gpu_window(GpuFinishRequest {
                group_id,
                generation,
                member,
                error: error.to_string(),
            })
            .await
            .map(|_| ())
    }

    /// Tells the window how this member finished (`error` empty: filled, or done putting).
    pub async fn finish(&self, store: &Store, error: &str) {
        let (first, known) = {
            let mut p = self.place();
            let first = p.reported.replace(error.to_string()).is_none();
            (first, p.known.is_some())
        };
        let group = self.at().0;
        let r = match self.report(store, error).await {
            // The store's owner died since the plan: the next takes the window up, and hears
            // this report (`join_again` tells it). Only a first report: a later one (a control
            // file closed after its transfer) finds a window that finished and was let go of,
            // which is not to be brought back.
            Err(e) if e.is_not_found() && known && first => match self.join_again(store).await {
                Ok(()) => Ok(()),
                Err(WindowError::Rpc(e)) => Err(e),
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "could not report to the GPU window");
                    Ok(())
                }
            },
            r => r,
        };
        match r {
            Ok(()) => {}
            // A window that failed as a whole, or timed out, is gone: there is no one to tell.
            Err(e) if e.is_not_found() => {
                tracing::debug!(group = %group, "the GPU window is already gone");
            }
            Err(e) => {
                tracing::warn!(group = %group, error = %e.to_string(), "could not report to the GPU window");
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
