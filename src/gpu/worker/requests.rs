//! The worker's side of its control socket: it binds its data port and serves the host
//! transport there, tells its agent where, then answers the agent's requests one by one
//! (register buffers, fill them from another worker, broadcast them in a window, let go of a
//! registration, ...) until the agent closes the socket. Transfers run on tasks of their own
//! and answer when they are done; a Release stops the one of its registration.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinHandle;

use super::collective::{self, Broadcast};
use super::comms::Comms;
use super::error::WorkerError;
use super::host::conn::Source;
use super::host::serve::{serve, Served};
use super::memory::{Buffers, SHM_DIR};
use super::p2p::{self, Lane, WorkerLane};
use super::stop::Stop;
use crate::auth::gpu_secret::Secret;
use crate::gpu::cuda::{probe, UniqueId};
use crate::gpu::wire;
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{
    WorkerBroadcast, WorkerFetch, WorkerHeld, WorkerProgress, WorkerRegister, WorkerRelease,
    WorkerReply, WorkerRequest,
};

/// Runs a worker on `control` (the socket its agent holds the other end of), with its data
/// port on `host` (an address other workers reach it at).
pub async fn run(control: UnixStream, host: &str) -> Result<(), WorkerError> {
    let listener = TcpListener::bind((host, 0)).await?;
    let (mut rd, wr) = control.into_split();
    let mut worker = Worker::start(listener, wr).await?;
    while let Some(req) = wire::recv::<_, WorkerRequest>(&mut rd).await? {
        worker.answer(req).await?;
        worker.forget_finished();
    }
    tracing::info!("the agent let go of this transfer worker; exiting");
    Ok(())
}

/// What the answers to the agent's requests share.
struct Worker {
    /// Where the host transport serves this worker's registrations.
    data_addr: String,
    served: Served,
    /// One NCCL transfer at a time in a worker, whatever a window's nccl_pg_mode (two
    /// communicators active at once on one GPU can deadlock), and host fetches one at a time
    /// under KT_GPU_PG_GLOBAL.
    serialised: Arc<AsyncMutex<()>>,
    comms: Arc<Comms>,
    lane: Arc<dyn Lane>,
    /// The control socket's sending half: the loop's answers and the transfers' alike.
    wr: Arc<AsyncMutex<OwnedWriteHalf>>,
    /// Per registration, the transfer filling or broadcasting it: the request it answers and
    /// its task.
    transfers: HashMap<u64, (u64, JoinHandle<()>)>,
    /// Per registration being filled or broadcast, the stop of its NCCL transfer, for a Release.
    stops: HashMap<u64, Arc<Stop>>,
}

impl Worker {
    /// Serves the host transport on `listener` and tells the agent its address on `wr`.
    async fn start(listener: TcpListener, wr: OwnedWriteHalf) -> Result<Worker, WorkerError> {
        let data_addr = listener.local_addr()?.to_string();
        let served: Served = Arc::default();
        let serialised = Arc::new(AsyncMutex::new(()));
        let comms: Arc<Comms> = Arc::default();
        let lane: Arc<dyn Lane> = Arc::new(WorkerLane {
            comms: comms.clone(),
            turn: serialised.clone(),
        });
        tokio::spawn(serve(listener, served.clone(), Some(lane.clone())));
        let worker = Worker {
            data_addr,
            served,
            serialised,
            comms,
            lane,
            wr: Arc::new(AsyncMutex::new(wr)),
            transfers: HashMap::new(),
            stops: HashMap::new(),
        };
        let ready = WorkerReply {
            data_addr: worker.data_addr.clone(),
            ..Default::default()
        };
        worker.send(&ready).await?;
        tracing::info!(data_addr = %worker.data_addr, "transfer worker ready");
        Ok(worker)
    }

    /// Answers `req`, at once or (a transfer) from its task once it is done.
    async fn answer(&mut self, req: WorkerRequest) -> Result<(), WorkerError> {
        let id = req.id;
        match req.op {
            Some(Op::Register(r)) => self.register(id, r).await,
            Some(Op::Fetch(f)) => {
                self.fetch(id, f);
                Ok(())
            }
            Some(Op::NcclId(_)) => self.nccl_id(id).await,
            Some(Op::Held(h)) => self.held(id, h).await,
            Some(Op::Broadcast(bc)) => {
                self.broadcast(id, bc);
                Ok(())
            }
            Some(Op::Release(r)) => self.release(id, r).await,
            Some(Op::Progress(p)) => self.progress(id, p).await,
            None => {
                let r = reply(id, Err(WorkerError::Bad("an empty request".into())));
                self.send(&r).await
            }
        }
    }

    async fn send(&self, r: &WorkerReply) -> Result<(), WorkerError> {
        wire::send(&mut *self.wr.lock().await, r).await?;
        Ok(())
    }

    /// Transfers over are no longer the Release's to stop or answer for.
    fn forget_finished(&mut self) {
        self.transfers.retain(|_, (_, t)| !t.is_finished());
        let transfers = &self.transfers;
        self.stops.retain(|reg, _| transfers.contains_key(reg));
    }

    /// Opens the buffers of a registration and serves them; with whether they can move over
    /// NCCL.
    async fn register(&mut self, id: u64, r: WorkerRegister) -> Result<(), WorkerError> {
        let dir = PathBuf::from(SHM_DIR);
        let opened = tokio::task::spawn_blocking(move || {
            let secret = secret_of(&r.secret)?;
            Buffers::open(&dir, &r.buffers, r.receiving)
                .map(|b| (r.registration, b.sealed_by(secret)))
        })
        .await
        .map_err(|e| WorkerError::Bad(e.to_string()))
        .and_then(|x| x);
        let mut nccl = false;
        let registered = opened.map(|(reg, b)| {
            let n = b.nbytes();
            nccl = b.device_ranges().is_some() && probe().nccl_transfers();
            lock(&self.served).insert(reg, Arc::new(b));
            n
        });
        let mut r = reply(id, registered);
        r.nccl = nccl;
        self.send(&r).await
    }

    /// Starts filling a registration from another worker's, over NCCL where both can.
    fn fetch(&mut self, id: u64, f: WorkerFetch) {
        let dst = lock(&self.served).get(&f.registration).cloned();
        let wr = self.wr.clone();
        let one_at_a_time = self.serialised.clone();
        let lane = self.lane.clone();
        let stop = Arc::new(Stop::default());
        self.stops.insert(f.registration, stop.clone());
        // NCCL needs the two ends in two processes: a GET from this worker's own registration
        // goes over the host transport.
        let nccl = (f.nccl_deadline_ms > 0 && f.source_addr != self.data_addr)
            .then(|| Duration::from_millis(f.nccl_deadline_ms));
        let registration = f.registration;
        let task = tokio::spawn(async move {
            let (moved, over_nccl) = match (dst, secret_of(&f.source_secret)) {
                (Some(dst), Ok(secret)) => {
                    let src = Source {
                        addr: &f.source_addr,
                        registration: f.source_registration,
                        secret,
                        name: &f.source,
                    };
                    let serialised = f.serialised.then_some(one_at_a_time);
                    p2p::fetch_either(src, dst, f.pack, nccl, &lane, serialised, &stop).await
                }
                (Some(_), Err(e)) => (Err(e), false),
                (None, _) => (Err(WorkerError::NoRegistration(f.registration)), false),
            };
            let mut r = reply(id, moved);
            r.nccl = over_nccl;
            let _ = wire::send(&mut *wr.lock().await, &r).await;
        });
        self.transfers.insert(registration, (id, task));
    }

    /// A unique id for a window's communicator, made here (the putter's worker).
    async fn nccl_id(&self, id: u64) -> Result<(), WorkerError> {
        let r = match self.comms.unique_id(UniqueId::new) {
            Ok(made) => WorkerReply {
                id,
                unique_id: made.as_bytes().to_vec(),
                ..Default::default()
            },
            Err(e) => reply(id, Err(e.into())),
        };
        self.send(&r).await
    }

    /// The communicators kept on a registration's device, for a join to report.
    async fn held(&self, id: u64, h: WorkerHeld) -> Result<(), WorkerError> {
        let device = lock(&self.served)
            .get(&h.registration)
            .map(|b| b.device_ranges().map(|(d, _)| d.ordinal()));
        let r = match device {
            Some(device) => WorkerReply {
                id,
                // Host buffers: no communicator fits.
                comms: device.map(|d| self.comms.held(d)).unwrap_or_default(),
                ..Default::default()
            },
            None => reply(id, Err(WorkerError::NoRegistration(h.registration))),
        };
        self.send(&r).await
    }

    /// Starts this member's part in a window's NCCL broadcast.
    fn broadcast(&mut self, id: u64, bc: WorkerBroadcast) {
        let bufs = lock(&self.served).get(&bc.registration).cloned();
        let comms = self.comms.clone();
        let stop = Arc::new(Stop::default());
        self.stops.insert(bc.registration, stop.clone());
        let wr = self.wr.clone();
        let one_at_a_time = self.serialised.clone();
        let registration = bc.registration;
        let task = tokio::spawn(async move {
            let moved = async {
                let bufs = bufs.ok_or(WorkerError::NoRegistration(registration))?;
                let window = bc.window.clone();
                let b = broadcast_of(bc)?;
                // Held on the transfer's thread until its NCCL calls return: a Release ends
                // this task, not those calls, which its stop ends.
                let turn = one_at_a_time.lock_owned().await;
                tokio::task::spawn_blocking(move || {
                    let moved = collective::run(&bufs, &b, &stop, &comms);
                    drop(turn);
                    moved
                })
                .await
                .map_err(|e| WorkerError::Bad(e.to_string()))?
                .map_err(|e| collective::in_window(e, &window))
            }
            .await;
            let _ = wire::send(&mut *wr.lock().await, &reply(id, moved)).await;
        });
        self.transfers.insert(registration, (id, task));
    }

    /// Lets go of a registration: its transfer stopped (and answered for), its buffers failed
    /// for whoever still waits on them.
    async fn release(&mut self, id: u64, r: WorkerRelease) -> Result<(), WorkerError> {
        if let Some(s) = self.stops.remove(&r.registration) {
            s.stop_in_background();
        }
        if let Some((transfer_id, t)) = self.transfers.remove(&r.registration) {
            t.abort();
            // The aborted transfer still owes its caller an answer.
            if t.await.is_err() {
                let why = WorkerError::Remote(libc::ECONNABORTED, r.reason.clone());
                self.send(&reply(transfer_id, Err(why))).await?;
            }
        }
        if let Some(b) = lock(&self.served).remove(&r.registration) {
            b.fail(libc::ECONNABORTED, r.reason);
        }
        self.send(&reply(id, Ok(0))).await
    }

    /// How much of a registration is filled.
    async fn progress(&self, id: u64, p: WorkerProgress) -> Result<(), WorkerError> {
        let filled = lock(&self.served)
            .get(&p.registration)
            .map(|b| b.filled_up_to())
            .ok_or(WorkerError::NoRegistration(p.registration));
        self.send(&reply(id, filled)).await
    }
}

/// A member's part in a window's broadcast, as its agent asked for it.
fn broadcast_of(bc: WorkerBroadcast) -> Result<Broadcast, WorkerError> {
    Ok(Broadcast {
        unique_id: UniqueId::from_bytes(&bc.unique_id)
            .map_err(|e| WorkerError::Bad(e.to_string()))?,
        nranks: bc.nranks as usize,
        rank: bc.rank as usize,
        root: bc.root as usize,
        pack: bc.pack,
        within: Duration::from_millis(bc.deadline_ms.max(1)),
        comm: (!bc.comm.is_empty()).then_some(bc.comm),
        window: bc.window,
        fanout: bc.fanout as usize,
        place: bc.placed.then(|| {
            (
                usize::try_from(bc.parent_rank).ok(),
                bc.child_ranks.iter().map(|&r| r as usize).collect(),
            )
        }),
    })
}

/// The reply to request `id`: the bytes, or the error and its errno.
fn reply(id: u64, r: Result<u64, WorkerError>) -> WorkerReply {
    match r {
        Ok(bytes) => WorkerReply {
            id,
            bytes,
            ..Default::default()
        },
        Err(e) => WorkerReply {
            id,
            error: e.to_string(),
            errno: e.errno(),
            ..Default::default()
        },
    }
}

/// A registration's secret as its agent sent it: none, or 32 bytes.
fn secret_of(b: &[u8]) -> Result<Option<Secret>, WorkerError> {
    match b.len() {
        0 => Ok(None),
        _ => Secret::try_from(b)
            .map(Some)
            .map_err(|_| WorkerError::Bad(format!("a secret of {} bytes, not 32", b.len()))),
    }
}
