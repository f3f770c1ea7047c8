//! A point-to-point GET over NCCL: where the getter's buffers and the publisher's are both CUDA
//! memory on one device, in workers that loaded NCCL, the bytes go device to device over a
//! communicator of the two workers instead of being staged through host memory and TCP.
//!
//! The two agree on the host transport's connection for the registration (so the same hello,
//! and the same sealing where the cluster issues secrets): the getter's worker, holding its
//! turn (one NCCL transfer at a time in a worker), sends an offer, a request of
//! [`OFFER`](super::host::frames::OFFER) bytes whose body is a `HostNcclOffer`: its byte
//! count, a fresh unique id it made, and the pair communicators it keeps as rank 1. The source
//! takes its own turn (waiting at most [`TURN_WAIT`], so that two workers getting from each
//! other at once cannot wait on each other for good) and answers yes, naming one of those
//! communicators that it keeps as rank 0 or none (form one from the id), or no with why. After
//! a yes both run a broadcast of two ranks from the source, and the source's verdict follows on
//! the connection; the end of the connection on either side stops the other's transfer. A no,
//! or a transfer that failed, leaves the GET to the host transport, so an NCCL that does not
//! work here costs time, never the bytes.
//!
//! A pair's communicator is kept by both workers for their next GET (it is not offered to the
//! store server for windows, see [`Use::Pair`]): a trainer's weights synced to the same
//! inference pod every step pay for forming it once.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::collective::{self, Broadcast};
use super::comms::{Comms, Use};
use super::error::WorkerError;
use super::host::conn::{connect, Conn, Source};
use super::host::fetch::fetch as host_fetch;
use super::host::frames::head;
use super::memory::Buffers;
use super::stop::Stop;
use crate::gpu::cuda::UniqueId;
use crate::proto::{HostNcclAnswer, HostNcclOffer};

/// The longest answer's body.
const MAX_ANSWER: u32 = 4096;
/// How long a source waits for its turn before it says no.
pub const TURN_WAIT: Duration = Duration::from_secs(10);
/// Beyond [`TURN_WAIT`], how long a getter waits for the answer to its offer.
const ANSWER_SLACK: Duration = Duration::from_secs(20);
/// The longest a getter may ask a source to spend on each of forming and moving.
const LONGEST: Duration = Duration::from_secs(3600);

/// One side's part in a pair's transfer.
pub struct Pair {
    pub unique_id: Vec<u8>,
    /// The pair communicator both keep, to run on instead of forming one.
    pub comm: Option<Vec<u8>>,
    /// 0: the source; 1: the getter.
    pub rank: usize,
    pub pack: bool,
    pub within: Duration,
    /// The other side, for messages.
    pub peer: String,
}

/// What a worker's NCCL does for a pair (a seam: the tests stand in for NCCL).
pub trait Lane: Send + Sync {
    /// The device of `b`'s buffers, where they are all CUDA memory on one device and this worker
    /// loaded NCCL.
    fn device(&self, b: &Buffers) -> Option<i32>;
    /// A fresh unique id, made in this worker.
    fn unique_id(&self) -> Result<Vec<u8>, WorkerError>;
    /// `id` (from [`Lane::unique_id`]) formed nothing.
    fn unused(&self, id: &[u8]);
    /// The pair communicators kept as `rank` on `device`.
    fn pairs(&self, rank: usize, device: i32) -> Vec<Vec<u8>>;
    /// Moves the bytes (blocking): a broadcast of two ranks from rank 0, kept afterwards as a
    /// pair communicator.
    fn run(&self, b: &Buffers, p: &Pair, stop: &Stop) -> Result<u64, WorkerError>;
    /// One NCCL transfer at a time in a worker: two communicators active at once on one GPU
    /// can deadlock.
    fn turn(&self) -> Arc<AsyncMutex<()>>;
}

/// The worker's own: its kept communicators and its turn.
pub struct WorkerLane {
    pub comms: Arc<Comms>,
    pub turn: Arc<AsyncMutex<()>>,
}

impl Lane for WorkerLane {
    fn device(&self, b: &Buffers) -> Option<i32> {
        if !crate::gpu::cuda::probe().nccl_transfers() {
            return None;
        }
        b.device_ranges().map(|(d, _)| d.ordinal())
    }

    fn unique_id(&self) -> Result<Vec<u8>, WorkerError> {
        Ok(self.comms.unique_id(UniqueId::new)?.as_bytes().to_vec())
    }

    fn unused(&self, id: &[u8]) {
        if let Ok(id) = UniqueId::from_bytes(id) {
            self.comms.unused(&id);
        }
    }

    fn pairs(&self, rank: usize, device: i32) -> Vec<Vec<u8>> {
        self.comms.pairs(rank, device)
    }

    fn run(&self, b: &Buffers, p: &Pair, stop: &Stop) -> Result<u64, WorkerError> {
        let bc = Broadcast {
            unique_id: UniqueId::from_bytes(&p.unique_id)?,
            nranks: 2,
            rank: p.rank,
            root: 0,
            pack: p.pack,
            within: p.within,
            comm: p.comm.clone(),
            window: format!("a point-to-point GET with {}", p.peer),
            fanout: 0,
            place: None,
        };
        collective::run_as(b, &bc, Use::Pair, stop, &self.comms)
    }

    fn turn(&self) -> Arc<AsyncMutex<()>> {
        self.turn.clone()
    }
}

/// A GET's bytes from the registration `src_registration` at `addr` into `dst`: over NCCL
/// where `nccl` gives the time it may take and both sides can, else (and where that failed)
/// over the host transport, taking `serialised` first where given. `stop` stops an NCCL
/// transfer (the registration was let go of). The bytes moved, and whether NCCL moved them.
pub async fn fetch_either(
    src: Source<'_>,
    dst: Arc<Buffers>,
    pack: bool,
    nccl: Option<Duration>,
    lane: &Arc<dyn Lane>,
    serialised: Option<Arc<AsyncMutex<()>>>,
    stop: &Arc<Stop>,
) -> (Result<u64, WorkerError>, bool) {
    if let Some(within) = nccl {
        match fetch(src, &dst, pack, within, lane, stop).await {
            Ok(Some(n)) => return (Ok(n), true),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, source = src.name, "the GET over NCCL failed; its bytes go over the host transport");
            }
        }
    }
    // KT_GPU_PG_GLOBAL: in arrival order (tokio's mutex is fair), one at a time.
    let _turn = match &serialised {
        Some(s) => Some(s.lock().await),
        None => None,
    };
    let moved = host_fetch(src, dst, pack).await;
    (moved, false)
}

/// The getter's side: `Some(bytes)` where they went over NCCL, `None` where the two cannot (the
/// GET then goes over the host transport), an error where the transfer failed once agreed.
pub async fn fetch(
    src: Source<'_>,
    dst: &Arc<Buffers>,
    pack: bool,
    within: Duration,
    lane: &Arc<dyn Lane>,
    stop: &Arc<Stop>,
) -> Result<Option<u64>, WorkerError> {
    let Some(device) = lane.device(dst) else {
        return Ok(None);
    };
    // Held until the transfer is over, on its thread: a GET let go of mid-transfer ends this
    // future, not the NCCL calls, which the stop ends.
    let turn = lane.turn().lock_owned().await;
    let id = lane.unique_id()?;
    let offer = HostNcclOffer {
        nbytes: dst.nbytes(),
        unique_id: id.clone(),
        comms: lane.pairs(1, device),
        pack,
        deadline_ms: within.as_millis() as u64,
        getter: format!("the worker of pid {}", std::process::id()),
    };
    // A source answers within its wait for its turn; one that does not is taken for gone.
    let agreed = tokio::time::timeout(TURN_WAIT + ANSWER_SLACK, agree(src, &offer))
        .await
        .unwrap_or_else(|_| {
            Err(WorkerError::Remote(
                libc::ETIMEDOUT,
                format!("{} ({}) did not answer an NCCL offer", src.name, src.addr),
            ))
        });
    let (mut conn, comm) = match agreed {
        Ok(Some(agreed)) => agreed,
        Ok(None) => {
            lane.unused(&id);
            return Ok(None);
        }
        Err(e) => {
            lane.unused(&id);
            return Err(e);
        }
    };
    let Source {
        addr, name: source, ..
    } = src;
    tracing::info!(%source, reusing = comm.is_some(), "a point-to-point GET over NCCL");
    if comm.is_some() {
        // Not needed: the next offer makes do with it.
        lane.unused(&id);
    }
    let (source_s, addr_s) = (source.to_string(), addr.to_string());
    // The source's verdict once its side is done; a connection that ends before it is a
    // source gone, which stops this side too.
    let verdict = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let v = conn.receive(MAX_ANSWER, &source_s, &addr_s).await;
            if v.is_err() {
                stop.stop_in_background();
            }
            (v, conn)
        })
    };
    let ran = {
        let (lane, dst, stop) = (lane.clone(), dst.clone(), stop.clone());
        let pair = Pair {
            unique_id: id,
            comm,
            rank: 1,
            pack,
            within,
            peer: source.to_string(),
        };
        tokio::task::spawn_blocking(move || {
            let moved = lane.run(&dst, &pair, &stop);
            drop(turn);
            moved
        })
        .await
        .map_err(|e| WorkerError::Bad(e.to_string()))?
    };
    // The source says how its side went within the time its transfer may take.
    let said = tokio::time::timeout(within + Duration::from_secs(5), verdict).await;
    let said = match said {
        Ok(Ok((v, _conn))) => v.map(|_| ()),
        Ok(Err(e)) => Err(WorkerError::Bad(e.to_string())),
        Err(_) => Err(WorkerError::Remote(
            libc::ETIMEDOUT,
            format!("{source} ({addr}) did not say how its side of the NCCL GET went"),
        )),
    };
    match (ran, said) {
        (Ok(n), Ok(())) => Ok(Some(n)),
        // The source's word says why where both failed: it stopped this side.
        (_, Err(e)) | (Err(e), Ok(())) => Err(e),
    }
}

/// The offer made and answered: the connection and the communicator to run on after a yes.
async fn agree(
    src: Source<'_>,
    offer: &HostNcclOffer,
) -> Result<Option<(Conn, Option<Vec<u8>>)>, WorkerError> {
    let mut conn = connect(src).await?;
    let Source {
        addr, name: source, ..
    } = src;
    conn.send_offer(offer.encode_to_vec())
        .await
        .map_err(|e| WorkerError::Peer(format!("{source} ({addr}): {e}")))?;
    let answer = match conn.receive(MAX_ANSWER, source, addr).await {
        Ok(a) => a,
        Err(WorkerError::Remote(errno, why)) => {
            tracing::info!(%source, errno, %why, "no point-to-point GET over NCCL");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let answer = HostNcclAnswer::decode(answer.as_slice())
        .map_err(|e| WorkerError::Peer(format!("{source} ({addr}): an answer: {e}")))?;
    if answer.comm.is_empty() {
        return Ok(Some((conn, None)));
    }
    if !offer.comms.contains(&answer.comm) {
        return Err(WorkerError::Peer(format!(
            "{source} ({addr}) named a communicator this worker did not offer"
        )));
    }
    Ok(Some((conn, Some(answer.comm))))
}

/// A head and body to send.
type Frame = (Vec<u8>, Vec<u8>);

/// The source's side of an offer for `b`: its answer (yes, or no with why), and then, after a
/// yes, the verdict of its side of the transfer (nothing after a no). `stop` stops the
/// transfer (the connection ended).
pub fn answer_offer(
    b: Arc<Buffers>,
    body: Vec<u8>,
    lane: Option<Arc<dyn Lane>>,
    stop: Arc<Stop>,
) -> (
    tokio::task::JoinHandle<Frame>,
    tokio::task::JoinHandle<Option<Frame>>,
) {
    let (yes, agreed) = tokio::sync::oneshot::channel();
    let answer = tokio::spawn(async move {
        match decide(&b, &body, lane).await {
            Ok((turn, lane, pair)) => {
                let a = HostNcclAnswer {
                    comm: pair.comm.clone().unwrap_or_default(),
                }
                .encode_to_vec();
                let _ = yes.send((turn, lane, pair, b));
                (head(0, a.len() as u32), a)
            }
            Err((errno, why)) => (head(errno as u32, why.len() as u32), why.into_bytes()),
        }
    });
    let verdict = tokio::spawn(async move {
        let (turn, lane, pair, b) = agreed.await.ok()?;
        let stop2 = stop.clone();
        let r = tokio::task::spawn_blocking(move || lane.run(&b, &pair, &stop2))
            .await
            .map_err(|e| WorkerError::Bad(e.to_string()))
            .and_then(|r| r);
        drop(turn);
        Some(match r {
            Ok(_) => (head(0, 0), Vec::new()),
            Err(e) => {
                let why = if stop.stopped() {
                    format!("the getter went away: {e}")
                } else {
                    e.to_string()
                };
                (head(e.errno() as u32, why.len() as u32), why.into_bytes())
            }
        })
    });
    (answer, verdict)
}

/// Whether this source takes the offer: its turn and part, or the errno and why not.
async fn decide(
    b: &Buffers,
    body: &[u8],
    lane: Option<Arc<dyn Lane>>,
) -> Result<(OwnedMutexGuard<()>, Arc<dyn Lane>, Pair), (i32, String)> {
    let offer = HostNcclOffer::decode(body).map_err(|e| {
        (
            libc::EINVAL,
            format!("an NCCL offer that does not decode: {e}"),
        )
    })?;
    if UniqueId::from_bytes(&offer.unique_id).is_err() {
        return Err((
            libc::EINVAL,
            format!(
                "an NCCL offer with an id of {} bytes",
                offer.unique_id.len()
            ),
        ));
    }
    let lane = lane.ok_or((libc::EOPNOTSUPP, "this worker has no NCCL".to_string()))?;
    let device = lane.device(b).ok_or((
        libc::EOPNOTSUPP,
        "the publisher's buffers are not all CUDA memory on one device of a worker with NCCL"
            .to_string(),
    ))?;
    if offer.nbytes != b.nbytes() || b.filled_up_to() < b.nbytes() {
        return Err((
            libc::EINVAL,
            format!(
                "the getter has {} bytes, the registration {} ({} there yet)",
                offer.nbytes,
                b.nbytes(),
                b.filled_up_to()
            ),
        ));
    }
    let turn = tokio::time::timeout(TURN_WAIT, lane.turn().lock_owned())
        .await
        .map_err(|_| {
            (
                libc::EBUSY,
                format!(
                    "the publisher's worker was busy with other NCCL transfers for {} s",
                    TURN_WAIT.as_secs()
                ),
            )
        })?;
    let ours = lane.pairs(0, device);
    let comm = offer.comms.iter().find(|k| ours.contains(k)).cloned();
    let within = Duration::from_millis(offer.deadline_ms).clamp(Duration::from_secs(1), LONGEST);
    Ok((
        turn,
        lane,
        Pair {
            unique_id: offer.unique_id,
            comm,
            rank: 0,
            pack: offer.pack,
            within,
            peer: offer.getter,
        },
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Condvar, Mutex};
    use std::time::Instant;

    use test_support::pseudo_random;

    use super::*;
    use crate::auth::gpu_secret::Secret;
    use crate::gpu::worker::host::frames::CHUNK;
    use crate::gpu::worker::host::testing::{at, buffers, served_through_relay, shows};
    use crate::locks::lock;
    use crate::rpc::gpu_window::comm_key;

    /// Bytes "broadcast" between two fake lanes of one process, by communicator.
    #[derive(Default)]
    struct Net {
        sent: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
        landed: Condvar,
    }

    /// A worker's NCCL, stood in for: a communicator is its key, a broadcast a hand-over
    /// through [`Net`].
    struct FakeLane {
        can: bool,
        fail: bool,
        net: Arc<Net>,
        ids: AtomicU8,
        unused: Mutex<Vec<Vec<u8>>>,
        kept: Mutex<Vec<(Vec<u8>, usize)>>,
        /// Each run: its rank and the kept communicator it was given.
        runs: Mutex<Vec<(usize, Option<Vec<u8>>)>>,
        turn: Arc<AsyncMutex<()>>,
    }

    fn lane(net: &Arc<Net>, can: bool, fail: bool, first_id: u8) -> Arc<FakeLane> {
        Arc::new(FakeLane {
            can,
            fail,
            net: net.clone(),
            ids: AtomicU8::new(first_id),
            unused: Mutex::default(),
            kept: Mutex::default(),
            runs: Mutex::default(),
            turn: Arc::default(),
        })
    }

    impl Lane for FakeLane {
        fn device(&self, _: &Buffers) -> Option<i32> {
            self.can.then_some(0)
        }
        fn unique_id(&self) -> Result<Vec<u8>, WorkerError> {
            Ok(vec![self.ids.fetch_add(1, Ordering::SeqCst); 128])
        }
        fn unused(&self, id: &[u8]) {
            lock(&self.unused).push(id.to_vec());
        }
        fn pairs(&self, rank: usize, _: i32) -> Vec<Vec<u8>> {
            lock(&self.kept)
                .iter()
                .filter(|(_, r)| *r == rank)
                .map(|(k, _)| k.clone())
                .collect()
        }
        fn run(&self, b: &Buffers, p: &Pair, stop: &Stop) -> Result<u64, WorkerError> {
            lock(&self.runs).push((p.rank, p.comm.clone()));
            if self.fail {
                return Err(WorkerError::Remote(
                    libc::EIO,
                    "an injected NCCL failure".into(),
                ));
            }
            let key = p.comm.clone().unwrap_or_else(|| comm_key(&p.unique_id));
            let n = b.nbytes();
            if p.rank == 0 {
                let data = b.read(0, n as usize)?;
                lock(&self.net.sent).insert(key.clone(), data);
                self.net.landed.notify_all();
            } else {
                let deadline = Instant::now() + p.within;
                let mut sent = lock(&self.net.sent);
                let data = loop {
                    if let Some(d) = sent.remove(&key) {
                        break d;
                    }
                    if stop.stopped() || Instant::now() > deadline {
                        return Err(WorkerError::Remote(libc::ECONNABORTED, "stopped".into()));
                    }
                    sent = self
                        .net
                        .landed
                        .wait_timeout(sent, Duration::from_millis(10))
                        .unwrap()
                        .0;
                };
                drop(sent);
                b.write(0, &data)?;
                b.filled(n);
            }
            let mut kept = lock(&self.kept);
            if !kept.iter().any(|(k, _)| *k == key) {
                kept.push((key, p.rank));
            }
            Ok(n)
        }
        fn turn(&self) -> Arc<AsyncMutex<()>> {
            self.turn.clone()
        }
    }

    fn runs(l: &FakeLane) -> Vec<(usize, Option<Vec<u8>>)> {
        lock(&l.runs).clone()
    }

    const WITHIN: Duration = Duration::from_secs(10);

    /// A GET of registration 7 at `addr` into `dst` over NCCL alone: `None` where it cannot be.
    async fn get_nccl(
        addr: &str,
        dst: &Arc<Buffers>,
        lane: &Arc<dyn Lane>,
    ) -> Result<Option<u64>, WorkerError> {
        fetch(at(addr, None), dst, true, WITHIN, lane, &Arc::default()).await
    }

    /// A GET of registration 7 at `addr` into `dst`, over NCCL where it can be.
    async fn get_either(
        addr: &str,
        secret: Option<Secret>,
        dst: &Arc<Buffers>,
        lane: &Arc<dyn Lane>,
    ) -> (Result<u64, WorkerError>, bool) {
        let src = at(addr, secret);
        fetch_either(
            src,
            dst.clone(),
            true,
            Some(WITHIN),
            lane,
            None,
            &Arc::default(),
        )
        .await
    }

    #[tokio::test]
    async fn a_get_between_workers_that_can_goes_over_nccl_and_the_next_reuses_their_communicator()
    {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(2 * CHUNK as usize + 777, 5);
        let secret = [9u8; 32];
        let src = buffers(dir.path(), "src", &data, false);
        let src = Arc::new(Arc::into_inner(src).unwrap().sealed_by(Some(secret)));
        let net = Arc::new(Net::default());
        let (source, getter) = (lane(&net, true, false, 1), lane(&net, true, false, 100));
        let getter_lane: Arc<dyn Lane> = getter.clone();

        for round in 0..2u8 {
            let (addr, seen) = served_through_relay(src.clone(), Some(source.clone())).await;
            let dst = buffers(
                dir.path(),
                &format!("dst{round}"),
                &vec![0; data.len()],
                true,
            );
            let (moved, nccl) = get_either(&addr, Some(secret), &dst, &getter_lane).await;
            assert_eq!(moved.unwrap(), data.len() as u64);
            assert!(nccl, "round {round} went over the host transport");
            assert!(dst.read(0, data.len()).unwrap() == data, "the bytes differ");
            assert_eq!(dst.filled_up_to(), data.len() as u64);
            // Not one chunk crossed the host transport.
            let wire = lock(&seen).clone();
            assert!(wire.len() < 4096, "{} bytes on the connection", wire.len());
            assert!(!shows(&wire, &data));
        }
        // The first GET formed a communicator from the getter's id, the second ran on it, as
        // rank 0 and 1 on each side; its id went unused (to be handed out again).
        let first = comm_key(&[100; 128]);
        assert_eq!(runs(&source), vec![(0, None), (0, Some(first.clone()))]);
        assert_eq!(runs(&getter), vec![(1, None), (1, Some(first))]);
        assert_eq!(*lock(&getter.unused), vec![vec![101u8; 128]]);
    }

    #[tokio::test]
    async fn a_source_that_cannot_says_no_and_the_bytes_go_over_the_host_transport() {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(CHUNK as usize + 3, 6);
        let net = Arc::new(Net::default());
        let getter = lane(&net, true, false, 1);
        let getter_lane: Arc<dyn Lane> = getter.clone();
        // A source without NCCL (no lane), and one whose buffers are not on a GPU.
        for source in [None, Some(lane(&net, false, false, 50))] {
            let src = buffers(dir.path(), "src", &data, false);
            let had_lane = source.is_some();
            let source = source.map(|l| l as Arc<dyn Lane>);
            let (addr, _) = served_through_relay(src.clone(), source.clone()).await;
            let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
            let said = get_nccl(&addr, &dst, &getter_lane).await;
            assert!(
                matches!(said, Ok(None)),
                "lane {had_lane}: {:?}",
                said.err()
            );
            let (addr, _) = served_through_relay(src, source).await;
            let (moved, nccl) = get_either(&addr, None, &dst, &getter_lane).await;
            assert_eq!((moved.unwrap(), nccl), (data.len() as u64, false));
            assert!(dst.read(0, data.len()).unwrap() == data);
        }
        assert!(runs(&getter).is_empty());
        // Every id the getter made for an offer refused is its to hand out again.
        assert_eq!(lock(&getter.unused).len(), 4);
    }

    #[tokio::test]
    async fn a_failed_nccl_transfer_stops_the_other_side_and_the_get_goes_over_the_host_transport()
    {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(CHUNK as usize * 3, 7);
        let net = Arc::new(Net::default());
        let source = lane(&net, true, true, 1);
        let getter = lane(&net, true, false, 100);
        let getter_lane: Arc<dyn Lane> = getter.clone();
        let src = buffers(dir.path(), "src", &data, false);
        let (addr, _) = served_through_relay(src.clone(), Some(source.clone())).await;
        let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
        // The source's failure reaches the getter long before its own deadline.
        let t = Instant::now();
        let e = get_nccl(&addr, &dst, &getter_lane).await.unwrap_err();
        assert!(t.elapsed() < WITHIN / 2, "{:?}", t.elapsed());
        assert!(e.to_string().contains("injected"), "{e}");
        assert_eq!(
            runs(&getter),
            vec![(1, None)],
            "the getter's side ran, and stopped"
        );
        assert!(lock(&getter.kept).is_empty() && lock(&source.kept).is_empty());

        let (addr, _) = served_through_relay(src, Some(source)).await;
        let (moved, nccl) = get_either(&addr, None, &dst, &getter_lane).await;
        assert_eq!((moved.unwrap(), nccl), (data.len() as u64, false));
        assert!(dst.read(0, data.len()).unwrap() == data);
    }
}
