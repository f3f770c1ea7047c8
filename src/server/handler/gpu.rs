//! GPU windows: joining, waiting for a window to close or its getters to finish, and a
//! member's finish. Members are told each other's registration secrets, since each fetches
//! from another.

use tonic::{Request, Response, Status};

use super::state::{namespace_for, StoreHandler};
use crate::broadcast::windows::{place_in, GpuJoiner, GpuWindows};
use crate::locks;
use crate::proto::{
    GpuAwaitRequest, GpuFinishRequest, GpuFinishResponse, GpuJoinRequest, GpuJoinResponse,
    GpuWindow, RegistrationSecretRequest, RegistrationSecretResponse,
};
use crate::rpc;
use crate::rpc::status::{to_status, Fault};
use crate::server::auth::{group_namespace, principal};
use crate::server::status::parse_key;

/// The longest a GPU window call is held before it answers with the window as it stands (the
/// caller asks again): long enough to spare the server, short enough that a member whose node
/// lapsed is noticed soon after the lease says so.
const GPU_AWAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

impl StoreHandler {
    /// A GPU window as its members are told it: with each member's secret, since each fetches
    /// from another.
    fn gpu_window_for_members(&self, mut w: GpuWindow) -> GpuWindow {
        if w.adopted {
            // Taken up from a member's copy, which could name any registration.
            return w;
        }
        let ns = group_namespace(&w.group_id).unwrap_or_default().to_string();
        for m in &mut w.members {
            m.secret = self.gpu_secret(&ns, &m.node_id, m.registration);
        }
        w
    }

    fn gpu_windows(&self) -> std::sync::MutexGuard<'_, GpuWindows> {
        locks::lock(&self.gpu_windows)
    }

    fn alive(&self) -> impl Fn(&str) -> bool + '_ {
        |n: &str| self.meta.live_node(n).is_some()
    }
}

/// The secret of a registration of the caller's own node (`auth::gpu_secret`), which its
/// worker serves the registration's bytes with; asked per registration, so that no node holds
/// what every secret is derived from. Empty where the cluster issues none.
pub(super) async fn registration_secret(
    handler: &StoreHandler,
    req: Request<RegistrationSecretRequest>,
) -> Result<Response<RegistrationSecretResponse>, Status> {
    let ns = namespace_for(&req, &req.get_ref().namespace)?;
    principal(&req)?.may_act_for_node(&req.get_ref().node_id)?;
    let r = req.into_inner();
    Ok(Response::new(RegistrationSecretResponse {
        secret: handler.gpu_secret(ns.as_str(), &r.node_id, r.registration),
    }))
}

pub(super) async fn join_gpu_window(
    handler: &StoreHandler,
    req: Request<GpuJoinRequest>,
) -> Result<Response<GpuJoinResponse>, Status> {
    let remote_ip = req.remote_addr().map(|a| a.ip().to_string());
    let ns = handler.namespace_here(&req, &req.get_ref().namespace)?;
    // A member names the node of its worker: within a node, tensors move by CUDA IPC.
    let caller = principal(&req)?;
    if caller.node_claim(&req.get_ref().node_id)? != req.get_ref().node_id {
        return Err(to_status(
            Fault::Denied,
            format!(
                "{caller} names node {:?} in a GPU window, and no pod binding of its token says \
                 it runs there",
                req.get_ref().node_id
            ),
        ));
    }
    let mut r = req.into_inner();
    parse_key(&r.key)?;
    let known = r.known.take();
    let mut spec = r.window.clone().unwrap_or_default();
    if spec.group_id.is_empty() {
        spec.group_id = rpc::default_gpu_group(&r.namespace, &r.key);
    }
    spec.group_id = rpc::scope_group(ns.as_str(), &spec.group_id);
    let role = r.role();
    let joiner = GpuJoiner {
        key: r.key.clone(),
        node_id: r.node_id.clone(),
        ip: if r.ip.is_empty() {
            remote_ip.unwrap_or_default()
        } else {
            r.ip.clone()
        },
        role,
        worker_addr: r.worker_addr,
        registration: r.registration,
        digest: r.table_digest,
        table_json: r.table_json,
        flags: r.flags,
        unique_id: r.unique_id,
        nccl: r.nccl,
        // Compared with other members' keys only; bounded, so a window's plan is too.
        comms: r
            .comms
            .into_iter()
            .filter(|c| c.key.len() == 32)
            .take(crate::broadcast::windows::comms::MAX_HELD)
            .collect(),
    };
    let ((window, _), member) = {
        let alive = handler.alive();
        let now = handler.clock.now();
        let mut windows = handler.gpu_windows();
        match &known {
            Some(known) => {
                let member = member_of(known, &spec.group_id, &joiner)?;
                (windows.adopt(known, &alive, now)?, member)
            }
            None if r.again => windows.join_again(spec, joiner, &alive, now)?,
            None => windows.join(spec, joiner, &alive, now)?,
        }
    };
    handler.gpu_changed.notify_waiters();
    tracing::info!(
        group = %window.group_id,
        member,
        node = %r.node_id,
        ?role,
        closed = window.closed,
        "joined GPU window"
    );
    Ok(Response::new(GpuJoinResponse {
        window: Some(handler.gpu_window_for_members(window)),
        member,
    }))
}

/// The place in `known` (a closed window a member brings from an owner that died) of the
/// member joining with `joiner`: a caller may bring only a window of the group it joins, and
/// one that holds it.
fn member_of(known: &GpuWindow, group: &str, joiner: &GpuJoiner) -> Result<u64, Status> {
    if known.group_id != group {
        return Err(to_status(
            Fault::Invalid,
            format!(
                "a member of window {group} brought window {}",
                known.group_id
            ),
        ));
    }
    place_in(known, joiner).ok_or_else(|| {
        to_status(
            Fault::Invalid,
            format!("window {group} as brought does not hold its bringer"),
        )
    })
}

pub(super) async fn await_gpu_window(
    handler: &StoreHandler,
    req: Request<GpuAwaitRequest>,
) -> Result<Response<GpuWindow>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let r = req.into_inner();
    let wait = std::time::Duration::from_millis(u64::from(r.wait_ms)).min(GPU_AWAIT_MAX);
    let until = tokio::time::Instant::now() + wait;
    loop {
        // Armed before the look, so a change between the look and the wait is not lost.
        let changed = handler.gpu_changed.notified();
        let (w, deadline) = {
            let alive = handler.alive();
            handler
                .gpu_windows()
                .view(&r.group_id, r.generation, &alive, handler.clock.now())?
        };
        let ready = if r.until_finished {
            crate::rpc::gpu_window::getters_finished(&w) || !w.error.is_empty()
        } else {
            w.closed
        };
        if ready || tokio::time::Instant::now() >= until {
            return Ok(Response::new(handler.gpu_window_for_members(w)));
        }
        let wake = deadline.map_or(until, |d| until.min(d.into()));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

pub(super) async fn finish_gpu_window(
    handler: &StoreHandler,
    req: Request<GpuFinishRequest>,
) -> Result<Response<GpuFinishResponse>, Status> {
    handler.window_here(&req, &req.get_ref().group_id)?;
    let r = req.into_inner();
    handler.gpu_windows().finish(
        &r.group_id,
        r.generation,
        r.member,
        &r.error,
        handler.clock.now(),
    )?;
    handler.gpu_changed.notify_waiters();
    tracing::info!(group = %r.group_id, member = r.member, error = %r.error, "GPU window member finished");
    Ok(Response::new(GpuFinishResponse {}))
}
