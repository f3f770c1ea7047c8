//! The transfer worker: the process that holds a caller's buffers and moves their bytes, in the
//! caller's namespaces (where the caller is not in the agent's, the agent starts it there; see
//! [`spawn`]). It takes requests from its agent over its control socket (register buffers,
//! fill buffers from another worker, let go of a registration), serves the bytes of what is
//! registered on its data port ([`host`]), and exits when its agent closes the control socket.

pub mod collective;
pub mod cuda_buffer;
pub mod enter;
pub mod host;
pub mod memory;
pub mod p2p;
pub mod spawn;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Mutex as AsyncMutex;

use super::wire::{self, WireError};
use crate::locks::lock;
use crate::proto::worker_request::Op;
use crate::proto::{WorkerReply, WorkerRequest};
use crate::auth::gpu_secret::Secret;
use memory::Buffers;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("worker: {0}")]
    Io(#[from] std::io::Error),
    #[error("buffer {path}: {source}")]
    Buffer {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Bad(String),
    #[error("CUDA buffers need a GPU, and this worker has none (host buffers work): {0}")]
    NoCuda(String),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("the peer worker {0}")]
    Peer(String),
    #[error("{1}")]
    Remote(i32, String),
    #[error("no registration {0} in this worker")]
    NoRegistration(u64),
    #[error("starting the transfer worker: {0}")]
    Spawn(String),
}

impl WorkerError {
    /// The errno a caller's STATUS reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            WorkerError::Bad(_) => libc::EINVAL,
            WorkerError::NoCuda(_) => libc::ENODEV,
            WorkerError::Remote(e, _) => *e,
            WorkerError::NoRegistration(_) => libc::ENOENT,
            WorkerError::Buffer { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
}

fn answer(id: u64, r: Result<u64, WorkerError>) -> WorkerReply {
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

/// Runs a worker on `control` (the socket its agent holds the other end of), with its data
/// port on `host` (an address other workers reach it at).
pub async fn run(control: UnixStream, host: &str) -> Result<(), WorkerError> {
    let listener = TcpListener::bind((host, 0)).await?;
    let data_addr = listener.local_addr()?.to_string();
    let served: host::Served = Arc::default();
    // One NCCL transfer at a time in a worker, whatever a window's nccl_pg_mode (two
    // communicators active at once on one GPU can deadlock), and host fetches one at a time
    // under KT_GPU_PG_GLOBAL.
    let serialised = Arc::new(AsyncMutex::new(()));
    let comms: Arc<collective::Comms> = Arc::default();
    let lane: Arc<dyn p2p::Lane> = Arc::new(p2p::WorkerLane {
        comms: comms.clone(),
        turn: serialised.clone(),
    });
    tokio::spawn(host::serve(listener, served.clone(), Some(lane.clone())));
    let (mut rd, wr) = control.into_split();
    let wr = Arc::new(AsyncMutex::new(wr));
    wire::send(
        &mut *wr.lock().await,
        &WorkerReply {
            data_addr: data_addr.clone(),
            ..Default::default()
        },
    )
    .await?;
    tracing::info!(%data_addr, "transfer worker ready");
    let shm = PathBuf::from(memory::SHM_DIR);
    // Per registration, the fetch filling it: the request it answers and its task.
    let mut fetches: HashMap<u64, (u64, tokio::task::JoinHandle<()>)> = HashMap::new();
    // Per registration being filled or broadcast, the stop of its NCCL transfer, for a Release.
    let mut stops: HashMap<u64, Arc<collective::Stop>> = HashMap::new();
    while let Some(req) = wire::recv::<_, WorkerRequest>(&mut rd).await? {
        let id = req.id;
        let reply = |r: Result<u64, WorkerError>| answer(id, r);
        match req.op {
            Some(Op::Register(r)) => {
                let dir = shm.clone();
                let opened = tokio::task::spawn_blocking(move || {
                    let secret = secret_of(&r.secret)?;
                    Buffers::open(&dir, &r.buffers, r.receiving)
                        .map(|b| (r.registration, b.sealed_by(secret)))
                })
                .await
                .map_err(|e| WorkerError::Bad(e.to_string()))
                .and_then(|x| x);
                let mut nccl = false;
                let answer = opened.map(|(reg, b)| {
                    let n = b.nbytes();
                    nccl =
                        b.device_ranges().is_some() && crate::gpu::cuda::probe().nccl_transfers();
                    lock(&served).insert(reg, Arc::new(b));
                    n
                });
                let mut r = reply(answer);
                r.nccl = nccl;
                wire::send(&mut *wr.lock().await, &r).await?;
            }
            Some(Op::Fetch(f)) => {
                let dst = lock(&served).get(&f.registration).cloned();
                let wr = wr.clone();
                let one_at_a_time = serialised.clone();
                let lane = lane.clone();
                let stop = Arc::new(collective::Stop::default());
                stops.insert(f.registration, stop.clone());
                // NCCL needs the two ends in two processes: a GET from this worker's own
                // registration goes over the host transport.
                let nccl = (f.nccl_deadline_ms > 0 && f.source_addr != data_addr)
                    .then(|| std::time::Duration::from_millis(f.nccl_deadline_ms));
                let task = tokio::spawn(async move {
                    let (moved, over_nccl) = match (dst, secret_of(&f.source_secret)) {
                        (Some(dst), Ok(secret)) => {
                            let src = host::Source {
                                addr: &f.source_addr,
                                registration: f.source_registration,
                                secret,
                                name: &f.source,
                            };
                            p2p::fetch_either(
                                src,
                                dst,
                                f.pack,
                                nccl,
                                &lane,
                                f.serialised.then_some(one_at_a_time),
                                &stop,
                            )
                            .await
                        }
                        (Some(_), Err(e)) => (Err(e), false),
                        (None, _) => (Err(WorkerError::NoRegistration(f.registration)), false),
                    };
                    let mut r = answer(id, moved);
                    r.nccl = over_nccl;
                    let _ = wire::send(&mut *wr.lock().await, &r).await;
                });
                fetches.insert(f.registration, (id, task));
            }
            Some(Op::NcclId(_)) => {
                let r = match comms.unique_id(crate::gpu::cuda::UniqueId::new) {
                    Ok(made) => WorkerReply {
                        id,
                        unique_id: made.as_bytes().to_vec(),
                        ..Default::default()
                    },
                    Err(e) => reply(Err(e.into())),
                };
                wire::send(&mut *wr.lock().await, &r).await?;
            }
            Some(Op::Held(h)) => {
                let device = lock(&served)
                    .get(&h.registration)
                    .map(|b| b.device_ranges().map(|(d, _)| d.ordinal()));
                let r = match device {
                    Some(device) => WorkerReply {
                        id,
                        // Host buffers: no communicator fits.
                        comms: device.map(|d| comms.held(d)).unwrap_or_default(),
                        ..Default::default()
                    },
                    None => reply(Err(WorkerError::NoRegistration(h.registration))),
                };
                wire::send(&mut *wr.lock().await, &r).await?;
            }
            Some(Op::Broadcast(bc)) => {
                let bufs = lock(&served).get(&bc.registration).cloned();
                let comms = comms.clone();
                let stop = Arc::new(collective::Stop::default());
                stops.insert(bc.registration, stop.clone());
                let wr = wr.clone();
                let one_at_a_time = serialised.clone();
                let registration = bc.registration;
                let task = tokio::spawn(async move {
                    let moved = async {
                        let bufs = bufs.ok_or(WorkerError::NoRegistration(registration))?;
                        let b = collective::Broadcast {
                            unique_id: crate::gpu::cuda::UniqueId::from_bytes(&bc.unique_id)
                                .map_err(|e| WorkerError::Bad(e.to_string()))?,
                            nranks: bc.nranks as usize,
                            rank: bc.rank as usize,
                            root: bc.root as usize,
                            pack: bc.pack,
                            within: std::time::Duration::from_millis(bc.deadline_ms.max(1)),
                            comm: (!bc.comm.is_empty()).then_some(bc.comm),
                            window: bc.window.clone(),
                            fanout: bc.fanout as usize,
                        };
                        // Held on the transfer's thread until its NCCL calls return: a Release
                        // ends this task, not those calls, which its stop ends.
                        let turn = one_at_a_time.lock_owned().await;
                        let window = bc.window;
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
                    let _ = wire::send(&mut *wr.lock().await, &answer(id, moved)).await;
                });
                fetches.insert(registration, (id, task));
            }
            Some(Op::Release(r)) => {
                if let Some(s) = stops.remove(&r.registration) {
                    s.stop_in_background();
                }
                if let Some((fetch_id, t)) = fetches.remove(&r.registration) {
                    t.abort();
                    // The aborted fetch still owes its caller an answer.
                    if t.await.is_err() {
                        let why = WorkerError::Remote(libc::ECONNABORTED, r.reason.clone());
                        wire::send(&mut *wr.lock().await, &answer(fetch_id, Err(why))).await?;
                    }
                }
                if let Some(b) = lock(&served).remove(&r.registration) {
                    b.fail(libc::ECONNABORTED, r.reason);
                }
                wire::send(&mut *wr.lock().await, &reply(Ok(0))).await?;
            }
            Some(Op::Progress(p)) => {
                let filled = lock(&served)
                    .get(&p.registration)
                    .map(|b| b.filled_up_to())
                    .ok_or(WorkerError::NoRegistration(p.registration));
                wire::send(&mut *wr.lock().await, &reply(filled)).await?;
            }
            None => {
                let r = reply(Err(WorkerError::Bad("an empty request".into())));
                wire::send(&mut *wr.lock().await, &r).await?;
            }
        }
        fetches.retain(|_, (_, t)| !t.is_finished());
        stops.retain(|reg, _| fetches.contains_key(reg));
    }
    tracing::info!("the agent let go of this transfer worker; exiting");
    Ok(())
}
