//! An NCCL communicator with deadlines and an abort, over `cudarc`'s raw NCCL bindings.
//!
//! `cudarc`'s own `Comm` blocks without a timeout in init and in every call, cannot be aborted
//! from another thread and is not `Send`. A transfer worker must never hang on a peer that
//! died, so this one is non-blocking (`ncclCommInitRankConfig` with `blocking = 0`): init and
//! every call return at once, possibly `ncclInProgress`, and [`Comm`] polls
//! `ncclCommGetAsyncError` until the communicator is ready, fails, or a deadline passes, when
//! it aborts the communicator (`ncclCommAbort`), as NCCL's fault-tolerance guide does.
//! Completion of work on a stream is polled the same way ([`Comm::wait`]).
//!
//! The raw communicator sits behind a mutex that every call takes for its duration (each call
//! returns at once), so an [`AbortHandle`] on another thread aborts between two calls, never
//! during one, and nothing uses the pointer after the abort freed it. Work is issued by one
//! thread at a time (a call and the polling that settles it are not one step under the mutex:
//! a second thread issuing between them would find the communicator busy); only the abort
//! comes from elsewhere.
//!
//! NCCL is loaded by the names `cudarc` knows (`libnccl.so`, `libnccl.so.12`, ...), which pip's
//! `libnccl.so.2` is not: [`super::nccl_lib`] finds that library and makes it loadable for a
//! process about to start.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::deadline::{poll_until, Backoff, Stopped};
use super::device::{Device, DeviceRange, Stream};
use super::nccl_error::{require_nccl, status, NcclError};
use super::unique_id::UniqueId;
use crate::locks::lock;

/// How long dropping a communicator waits for its work to flush before aborting it.
const DROP_GRACE: Duration = Duration::from_secs(10);

/// Polling a communicator that is joining or enqueueing (a call returns within milliseconds).
const SETTLE_BACKOFF: Backoff = Backoff {
    first: Duration::from_micros(50),
    max: Duration::from_millis(2),
};

/// Polling a stream that a transfer runs on (finer: a small transfer takes microseconds).
const WAIT_BACKOFF: Backoff = Backoff {
    first: Duration::from_micros(20),
    max: Duration::from_millis(1),
};

/// `NCCL_VERSION(2, 30, 0)`: the NCCL whose `ncclConfig_t` the bindings lay out (`cudarc`'s
/// `nccl` feature). An older library reads the fields it knows (the struct only grows at its
/// end and carries its size); a newer one fills the fields after ours with its defaults.
const CONFIG_VERSION: u32 = 23000;

/// `NCCL_CONFIG_UNDEF_INT`: "NCCL's default" for an integer field.
const UNDEF_INT: i32 = i32::MIN;

/// `NCCL_CONFIG_INITIALIZER`, which the bindings lack: size, magic, version, every integer
/// "undefined" and every pointer null, then `blocking` as asked.
fn config(blocking: bool) -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: CONFIG_VERSION,
        blocking: i32::from(blocking),
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
    }
}

/// The raw communicator; null once aborted or destroyed.
struct Raw(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as two threads do not call
// into it at once, which the mutex around it ensures.
unsafe impl Send for Raw {}

struct Shared {
    comm: Mutex<Raw>,
}

impl Shared {
    /// `f` on the live communicator, with the lock held.
    fn with<R>(
        &self,
        f: impl FnOnce(sys::ncclComm_t) -> Result<R, NcclError>,
    ) -> Result<R, NcclError> {
        let g = lock(&self.comm);
        if g.0.is_null() {
            return Err(NcclError::Aborted);
        }
        f(g.0)
    }

    /// Whether the communicator is ready (`Ok(true)`), still busy (`Ok(false)`), or failed.
    fn state(&self) -> Result<bool, NcclError> {
        self.with(|c| {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: `c` is live while the lock is held; `state` outlives the call.
            let r = unsafe { sys::ncclCommGetAsyncError(c, &mut state) };
            status(r, "ncclCommGetAsyncError", c)?;
            status(state, "the communicator", c)
        })
    }

    /// Aborts the communicator unless it is gone already; whether this call aborted it.
    fn abort(&self) -> bool {
        let mut g = lock(&self.comm);
        let c = std::mem::replace(&mut g.0, std::ptr::null_mut());
        if c.is_null() {
            return false;
        }
        // SAFETY: `c` was live, and nulled above under the lock, so nothing uses it after this.
        let r = unsafe { sys::ncclCommAbort(c) };
        if let Err(e) = status(r, "ncclCommAbort", std::ptr::null_mut()) {
            tracing::warn!("{e}");
        }
        true
    }
}

/// Aborts a [`Comm`] from any thread: what is in flight on it fails, and every later call on it
/// answers [`NcclError::Aborted`]. Aborting one that is gone does nothing.
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    /// Whether this call aborted it (false: it was aborted or dropped already).
    pub fn abort(&self) -> bool {
        self.0.abort()
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

/// One rank of a communicator on one device.
pub struct Comm {
    shared: Arc<Shared>,
    device: Arc<Device>,
    nranks: usize,
    rank: usize,
}

/// A collective or point-to-point call, checked, ready to issue.
enum Op {
    Broadcast {
        send: u64,
        recv: u64,
        len: usize,
        root: i32,
    },
    Send {
        ptr: u64,
        len: usize,
        peer: i32,
    },
    Recv {
        ptr: u64,
        len: usize,
        peer: i32,
    },
}

impl Op {
    fn call(&self) -> &'static str {
        match self {
            Op::Broadcast { .. } => "ncclBroadcast",
            Op::Send { .. } => "ncclSend",
            Op::Recv { .. } => "ncclRecv",
        }
    }

    /// Issues the call on `comm`, with bytes as `uint8` (any dtype moves as its bytes).
    fn issue(&self, comm: sys::ncclComm_t, stream: &Stream) -> Result<bool, NcclError> {
        let s: sys::cudaStream_t = stream.raw().cast();
        let u8s = sys::ncclDataType_t::ncclUint8;
        // SAFETY: `comm` is live (the caller holds its lock); the pointers are device memory of
        // `len` bytes on the communicator's device (checked when the op was made, and promised
        // by `DeviceRange`'s constructors); `s` is a live stream of that device.
        let r = unsafe {
            match *self {
                Op::Broadcast {
                    send,
                    recv,
                    len,
                    root,
                } => sys::ncclBroadcast(
                    send as *const c_void,
                    recv as *mut c_void,
                    len,
                    u8s,
                    root,
                    comm,
                    s,
                ),
                Op::Send { ptr, len, peer } => {
                    sys::ncclSend(ptr as *const c_void, len, u8s, peer, comm, s)
                }
                Op::Recv { ptr, len, peer } => {
                    sys::ncclRecv(ptr as *mut c_void, len, u8s, peer, comm, s)
                }
            }
        };
        status(r, self.call(), comm)
    }
}

impl Comm {
    /// Joins the communicator `id` names as `rank` of `nranks` on `device`, or fails by
    /// `deadline` (every rank must join; one that never comes makes the others time out).
    pub fn init(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<Device>,
        deadline: Instant,
    ) -> Result<Comm, NcclError> {
        Comm::init_then(id, nranks, rank, device, deadline, |_| {})
    }

    /// [`Comm::init`], handing `created` the communicator's abort while it still forms: an
    /// abort then (a peer known gone, a caller that let go) ends the wait at once, not at the
    /// deadline.
    pub fn init_then(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<Device>,
        deadline: Instant,
        created: impl FnOnce(AbortHandle),
    ) -> Result<Comm, NcclError> {
        require_nccl()?;
        if nranks == 0 || rank >= nranks || nranks > i32::MAX as usize {
            return Err(NcclError::Invalid(format!(
                "rank {rank} of {nranks} is not a rank of a communicator"
            )));
        }
        // NCCL takes its device from the calling thread's current context.
        device.bind()?;
        let mut config = config(false);
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: the probe found the symbol; `raw` and `config` outlive the call (NCCL copies
        // the config); the id is passed by value.
        let r = unsafe {
            sys::ncclCommInitRankConfig(&mut raw, nranks as i32, id.raw(), rank as i32, &mut config)
        };
        if raw.is_null() {
            status(r, "ncclCommInitRankConfig", raw)?;
            return Err(NcclError::Invalid(
                "ncclCommInitRankConfig returned no communicator".into(),
            ));
        }
        let comm = Comm {
            shared: Arc::new(Shared {
                comm: Mutex::new(Raw(raw)),
            }),
            device: device.clone(),
            nranks,
            rank,
        };
        if let Err(e) = status(r, "ncclCommInitRankConfig", raw) {
            comm.shared.abort();
            return Err(e);
        }
        created(comm.abort_handle());
        comm.settle("ncclCommInitRankConfig", deadline)?;
        tracing::debug!(
            nranks,
            rank,
            device = device.ordinal(),
            "NCCL communicator ready"
        );
        Ok(comm)
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.shared.clone())
    }

    /// Aborts the communicator (as its [`AbortHandle`] does).
    pub fn abort(&self) -> bool {
        self.shared.abort()
    }

    /// Enqueues a broadcast of `dst.len()` bytes from `root`'s `src` (`None`: in place, from
    /// `root`'s `dst`) into every rank's `dst`. Only the root's `src` is read.
    pub fn broadcast(
        &self,
        src: Option<DeviceRange<'_>>,
        dst: DeviceRange<'_>,
        root: usize,
        stream: &Stream,
        deadline: Instant,
    ) -> Result<(), NcclError> {
        let op = self.broadcast_op(src, dst, root, stream)?;
        self.enqueue(op, stream, deadline)
    }

    /// Enqueues sending `src` to rank `peer` (which must post a matching [`Comm::recv`]).
    pub fn send(
        &self,
        src: DeviceRange<'_>,
        peer: usize,
        stream: &Stream,
        deadline: Instant,
    ) -> Result<(), NcclError> {
        let op = self.send_op(src, peer, stream)?;
        self.enqueue(op, stream, deadline)
    }

    /// Enqueues receiving `dst.len()` bytes from rank `peer` into `dst`.
    pub fn recv(
        &self,
        dst: DeviceRange<'_>,
        peer: usize,
        stream: &Stream,
        deadline: Instant,
    ) -> Result<(), NcclError> {
        let op = self.recv_op(dst, peer, stream)?;
        self.enqueue(op, stream, deadline)
    }

    /// The calls `f` makes on [`Grouped`] as one NCCL group (`ncclGroupStart` ..
    /// `ncclGroupEnd`), as a pipelined tree's sends and receives of one step must be. The
    /// communicator cannot be aborted while `f` runs (it only enqueues). If `f` fails part of
    /// the way, what it enqueued still goes out and the peers would wait for the rest, so the
    /// communicator is aborted.
    pub fn group<R>(
        &self,
        deadline: Instant,
        f: impl FnOnce(&Grouped<'_>) -> Result<R, NcclError>,
    ) -> Result<R, NcclError> {
        self.device.bind()?;
        let guard = lock(&self.shared.comm);
        if guard.0.is_null() {
            return Err(NcclError::Aborted);
        }
        // SAFETY: the probe found the symbol; starting a group touches no communicator.
        status(
            unsafe { sys::ncclGroupStart() },
            "ncclGroupStart",
            std::ptr::null_mut(),
        )?;
        let grouped = Grouped {
            comm: self,
            raw: guard.0,
            _guard: guard,
        };
        let out = f(&grouped);
        let raw = grouped.raw;
        // SAFETY: ends the group started above on this thread; the communicator its calls
        // name is live (its lock is still held by `grouped`).
        let ended = status(unsafe { sys::ncclGroupEnd() }, "ncclGroupEnd", raw);
        drop(grouped);
        match (out, ended) {
            (Ok(out), Ok(done)) => {
                if !done {
                    self.settle("ncclGroupEnd", deadline)?;
                }
                Ok(out)
            }
            (Err(e), _) | (Ok(_), Err(e)) => {
                self.shared.abort();
                Err(e)
            }
        }
    }

    /// Waits until everything enqueued on `stream` is done, while watching the communicator
    /// for errors (a peer that died, a network fault); at `deadline` it aborts it.
    pub fn wait(&self, stream: &Stream, deadline: Instant) -> Result<(), NcclError> {
        let step = || {
            self.shared.state()?;
            // A stream error means kernels that may never end: the communicator is no use
            // after it, and is aborted like any other failure.
            Ok(stream.query()?)
        };
        self.until(deadline, WAIT_BACKOFF, "the transfer", step)
    }

    fn broadcast_op(
        &self,
        src: Option<DeviceRange<'_>>,
        dst: DeviceRange<'_>,
        root: usize,
        stream: &Stream,
    ) -> Result<Op, NcclError> {
        let root = self.peer(root)?;
        self.on_device(&dst, stream)?;
        let send = match src {
            Some(src) => {
                self.on_device(&src, stream)?;
                if src.len() != dst.len() {
                    return Err(NcclError::Invalid(format!(
                        "a broadcast from {} bytes into {}",
                        src.len(),
                        dst.len()
                    )));
                }
                src.ptr()
            }
            None => dst.ptr(),
        };
        Ok(Op::Broadcast {
            send,
            recv: dst.ptr(),
            len: dst.len(),
            root,
        })
    }

    fn send_op(&self, src: DeviceRange<'_>, peer: usize, stream: &Stream) -> Result<Op, NcclError> {
        self.on_device(&src, stream)?;
        Ok(Op::Send {
            ptr: src.ptr(),
            len: src.len(),
            peer: self.peer(peer)?,
        })
    }

    fn recv_op(&self, dst: DeviceRange<'_>, peer: usize, stream: &Stream) -> Result<Op, NcclError> {
        self.on_device(&dst, stream)?;
        Ok(Op::Recv {
            ptr: dst.ptr(),
            len: dst.len(),
            peer: self.peer(peer)?,
        })
    }

    fn peer(&self, rank: usize) -> Result<i32, NcclError> {
        if rank >= self.nranks {
            return Err(NcclError::Invalid(format!(
                "rank {rank} of a communicator of {}",
                self.nranks
            )));
        }
        Ok(rank as i32)
    }

    fn on_device(&self, r: &DeviceRange<'_>, stream: &Stream) -> Result<(), NcclError> {
        let d = self.device.ordinal();
        if r.device() != d || stream.device().ordinal() != d {
            return Err(NcclError::Invalid(format!(
                "memory on device {} and a stream on device {} for a communicator on device {d}",
                r.device(),
                stream.device().ordinal()
            )));
        }
        Ok(())
    }

    /// Issues `op` and waits for NCCL to have enqueued it.
    fn enqueue(&self, op: Op, stream: &Stream, deadline: Instant) -> Result<(), NcclError> {
        self.device.bind()?;
        if !self.shared.with(|c| op.issue(c, stream))? {
            self.settle(op.call(), deadline)?;
        }
        Ok(())
    }

    /// Polls until the communicator is ready; aborts it on an error or at `deadline`.
    fn settle(&self, what: &'static str, deadline: Instant) -> Result<(), NcclError> {
        self.until(deadline, SETTLE_BACKOFF, what, || self.shared.state())
    }

    /// Polls `step` until it is done; aborts the communicator when it fails or at `deadline`.
    fn until(
        &self,
        deadline: Instant,
        backoff: Backoff,
        what: &'static str,
        step: impl FnMut() -> Result<bool, NcclError>,
    ) -> Result<(), NcclError> {
        match poll_until(deadline, backoff, step) {
            Ok(()) => Ok(()),
            Err(Stopped::Failed(e)) => {
                self.abort_on(&e);
                Err(e)
            }
            Err(Stopped::TimedOut(waited)) => {
                self.shared.abort();
                Err(NcclError::Timeout { what, waited })
            }
        }
    }

    /// A failed communicator is aborted (NCCL cannot recover one), unless it is gone already.
    fn abort_on(&self, e: &NcclError) {
        if !matches!(e, NcclError::Aborted) {
            self.shared.abort();
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Finalize flushes what is still queued and lets the peers know; if that does not end
        // within the grace, abort (a dead peer must not hang the worker).
        let started = Instant::now();
        if self.device.bind().is_err() {
            self.shared.abort();
            return;
        }
        let finalized = self.shared.with(|c| {
            // SAFETY: `c` is live while the lock is held.
            status(unsafe { sys::ncclCommFinalize(c) }, "ncclCommFinalize", c)
        });
        let clean = match finalized {
            Ok(true) => true,
            Ok(false) => self
                .settle("ncclCommFinalize", started + DROP_GRACE)
                .is_ok(),
            Err(NcclError::Aborted) => return,
            Err(e) => {
                tracing::warn!("{e}");
                false
            }
        };
        if !clean {
            self.shared.abort();
            return;
        }
        let mut g = lock(&self.shared.comm);
        let c = std::mem::replace(&mut g.0, std::ptr::null_mut());
        if c.is_null() {
            return;
        }
        // SAFETY: `c` was live and is nulled under the lock above, so nothing uses it again.
        let r = unsafe { sys::ncclCommDestroy(c) };
        if let Err(e) = status(r, "ncclCommDestroy", std::ptr::null_mut()) {
            tracing::warn!("{e}");
        }
    }
}

/// The calls of one NCCL group, on one communicator (see [`Comm::group`]).
pub struct Grouped<'a> {
    comm: &'a Comm,
    raw: sys::ncclComm_t,
    _guard: MutexGuard<'a, Raw>,
}

impl Grouped<'_> {
    pub fn broadcast(
        &self,
        src: Option<DeviceRange<'_>>,
        dst: DeviceRange<'_>,
        root: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let op = self.comm.broadcast_op(src, dst, root, stream)?;
        op.issue(self.raw, stream).map(drop)
    }

    pub fn send(
        &self,
        src: DeviceRange<'_>,
        peer: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let op = self.comm.send_op(src, peer, stream)?;
        op.issue(self.raw, stream).map(drop)
    }

    pub fn recv(
        &self,
        dst: DeviceRange<'_>,
        peer: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let op = self.comm.recv_op(dst, peer, stream)?;
        op.issue(self.raw, stream).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cuda::probe;

    #[test]
    fn the_config_initializer_is_ncclconfig_initializer_non_blocking() {
        let c = config(false);
        assert_eq!(c.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 2 * 10000 + 30 * 100);
        assert_eq!(c.blocking, 0);
        assert_eq!(config(true).blocking, 1);
        let ints = [
            c.cgaClusterSize,
            c.minCTAs,
            c.maxCTAs,
            c.splitShare,
            c.trafficClass,
            c.collnetEnable,
            c.CTAPolicy,
            c.shrinkShare,
            c.nvlsCTAs,
            c.nChannelsPerNetPeer,
            c.nvlinkCentricSched,
            c.graphUsageMode,
            c.numRmaCtx,
            c.maxP2pPeers,
        ];
        assert!(ints.iter().all(|&i| i == i32::MIN), "{ints:?}");
        assert!(c.netName.is_null() && c.commName.is_null());
        // The layout NCCL 2.30's header has: size, magic, version, then the fields in order.
        assert_eq!(std::mem::offset_of!(sys::ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(sys::ncclConfig_t, netName), 32);
    }

    #[test]
    fn without_nccl_everything_is_an_error_not_a_panic() {
        if probe().nccl.is_ok() {
            return;
        }
        assert!(matches!(UniqueId::new(), Err(NcclError::Unavailable(_))));
        if probe().cuda.is_err() {
            assert!(Device::open(0).is_err());
        }
    }
}
