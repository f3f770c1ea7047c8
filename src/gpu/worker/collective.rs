//! A window's bytes as one NCCL broadcast: every member's worker joins one communicator (the
//! putter's unique id, ranks from the server's plan, the putter the root) and the putter's
//! buffers go into every getter's, device to device, with NCCL's own pipelined broadcast.
//!
//! Unpacked, each entry is its own broadcast, in place. Packed, entries smaller than a bucket go
//! together: the root copies a run of them into a bucket of device memory, the bucket is
//! broadcast, and each receiver copies the run out again; an entry of a bucket or more goes in
//! place. So a state dict of many small tensors of mixed dtypes costs a few launches, not one
//! per tensor, and no second full copy of the model. There are two buckets, and the copies run
//! on a stream of their own: one bucket is filled or emptied while the other's bytes move.
//! Everything is queued at once, in order (events hand a bucket between the two streams), and
//! waited for once, watched for NCCL errors, by the deadline.
//!
//! A communicator that served a window is kept ([`Comms`]) for the next window of the same
//! workers, which the store server runs on it when every member holds it (see
//! `crate::broadcast::windows::comms`): forming one costs far more than a small broadcast. The putter's
//! unique id that such a window did not need is kept too, and handed out for the next window
//! that does: NCCL's bootstrap thread for an id waits until its ranks have joined, so an id
//! dropped unused would leave a thread and a socket behind for good.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::memory::Buffers;
use super::WorkerError;
use crate::gpu::cuda::{
    AbortHandle, Comm, Device, DeviceBuffer, DeviceRange, Event, NcclError, Stream, UniqueId,
};
use crate::locks::lock;
use crate::proto::HeldComm;
use crate::rpc::gpu_window::comm_key;

/// Communicators a worker keeps, at most: each holds NCCL's buffers on its GPU, and a pod
/// syncs with a few groups of peers at once, not more.
pub const KEEP: usize = 4;
/// Unique ids this worker made and handed out, remembered to take back one a window did not
/// use (a window that failed before its broadcast never says).
const MADE: usize = 16;

/// What [`Comms`] needs of a communicator.
pub trait Kept {
    fn device(&self) -> i32;
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// Ends it at once, for good: it is idle, and its peers may be gone (finalizing it could
    /// wait on them), so it is aborted rather than finalized.
    fn let_go(&self);
}

impl Kept for Comm {
    fn device(&self) -> i32 {
        Comm::device(self).ordinal()
    }
    fn rank(&self) -> usize {
        Comm::rank(self)
    }
    fn nranks(&self) -> usize {
        Comm::nranks(self)
    }
    fn let_go(&self) {
        self.abort();
    }
}

/// The communicators a worker kept from its windows and its point-to-point GETs, least recently
/// used first, and its spare unique id. Those it lets go of (the least recently used beyond
/// [`KEEP`], and all of them when the worker ends) are aborted.
///
/// A window's communicator and a pair's are kept apart: the store server plans windows on the
/// first kind only (it is told of no other), and the two workers of a pair run their GETs on
/// the second only, each holding its turn, so that every communicator's members issue its
/// collectives in one order.
pub struct Comms<C: Kept = Comm> {
    state: Mutex<KeptState<C>>,
}

impl<C: Kept> Drop for Comms<C> {
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, c, _) in st.kept.drain(..) {
            c.let_go();
        }
    }
}

/// What a kept communicator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Windows the store server plans on it.
    Window,
    /// Point-to-point GETs between its two workers, the source rank 0.
    Pair,
}

struct KeptState<C> {
    kept: VecDeque<(Vec<u8>, C, Use)>,
    made: VecDeque<UniqueId>,
    spare: Option<UniqueId>,
}

impl<C: Kept> Default for Comms<C> {
    fn default() -> Self {
        Comms {
            state: Mutex::new(KeptState {
                kept: VecDeque::new(),
                made: VecDeque::new(),
                spare: None,
            }),
        }
    }
}

impl<C: Kept> Comms<C> {
    /// What is kept on `device`, as a join reports it.
    pub fn held(&self, device: i32) -> Vec<HeldComm> {
        lock(&self.state)
            .kept
            .iter()
            .filter(|(_, c, u)| c.device() == device && *u == Use::Window)
            .map(|(key, c, _)| HeldComm {
                key: key.clone(),
                rank: c.rank() as u32,
                nranks: c.nranks() as u32,
            })
            .collect()
    }

    /// The keys of the pair communicators kept on `device` in which this worker is `rank` of
    /// two, most recently used first.
    pub fn pairs(&self, rank: usize, device: i32) -> Vec<Vec<u8>> {
        lock(&self.state)
            .kept
            .iter()
            .rev()
            .filter(|(_, c, u)| {
                *u == Use::Pair && c.device() == device && c.rank() == rank && c.nranks() == 2
            })
            .map(|(key, _, _)| key.clone())
            .collect()
    }

    /// Takes `key`'s communicator, kept for `used`, out for a transfer (so no other uses it
    /// meanwhile).
    pub fn take(&self, key: &[u8], used: Use) -> Option<C> {
        let mut st = lock(&self.state);
        let at = st
            .kept
            .iter()
            .position(|(k, _, u)| k == key && *u == used)?;
        st.kept.remove(at).map(|(_, c, _)| c)
    }

    /// Keeps `c` (after a transfer that went well) for `used`, as the most recently used,
    /// letting go of the least recently used beyond [`KEEP`].
    pub fn keep(&self, key: Vec<u8>, c: C, used: Use) {
        let evicted: Vec<(Vec<u8>, C, Use)> = {
            let mut st = lock(&self.state);
            st.kept.push_back((key, c, used));
            let over = st.kept.len().saturating_sub(KEEP);
            st.kept.drain(..over).collect()
        };
        for (_, c, _) in evicted {
            c.let_go();
        }
    }

    /// A unique id for a putter's join: the spare one if a window left one unused, else
    /// `make`'s.
    pub fn unique_id<E>(&self, make: impl FnOnce() -> Result<UniqueId, E>) -> Result<UniqueId, E> {
        let spare = lock(&self.state).spare.take();
        let id = match spare {
            Some(id) => id,
            None => make()?,
        };
        let mut st = lock(&self.state);
        st.made.push_back(id);
        while st.made.len() > MADE {
            st.made.pop_front();
        }
        Ok(id)
    }

    /// A window ran on a kept communicator and did not use `id`: if this worker made it, it is
    /// the spare for the next.
    pub fn unused(&self, id: &UniqueId) {
        let mut st = lock(&self.state);
        if let Some(at) = st.made.iter().position(|m| m == id) {
            st.made.remove(at);
            st.spare = Some(*id);
        }
    }

    /// A communicator is being formed from `id`: it is no one's spare.
    pub fn used(&self, id: &UniqueId) {
        lock(&self.state).made.retain(|m| m != id);
    }
}

/// The size of each of a packed broadcast's two buckets.
pub const BUCKET: usize = 32 << 20;

/// One member's part in a window's broadcast.
pub struct Broadcast {
    pub unique_id: UniqueId,
    pub nranks: usize,
    pub rank: usize,
    pub root: usize,
    pub pack: bool,
    /// How long forming the communicator, and then moving the bytes, may each take.
    pub within: Duration,
    /// The kept communicator to run on (the plan's), instead of forming one from `unique_id`.
    pub comm: Option<Vec<u8>>,
    /// Which window, for messages.
    pub window: String,
    /// 0: NCCL's own broadcast. Else a pipelined tree of that degree, of sends and receives.
    pub fanout: usize,
}

/// The chunk a pipelined tree moves per step: a member passes a chunk on while it receives
/// the next, so a tree of depth d costs about d chunks more than one copy.
pub const TREE_CHUNK: usize = 4 << 20;

/// This rank's parent and children in a tree of degree `fanout` rooted at `root` over
/// `nranks` ranks: the tree of ranks counted from the root (rank `root + v` has children
/// `root + fanout*v + 1 ..= root + fanout*v + fanout`, all modulo `nranks`), which with the
/// root at rank 0 is the tree the server plans.
pub fn tree_place(
    rank: usize,
    root: usize,
    nranks: usize,
    fanout: usize,
) -> (Option<usize>, Vec<usize>) {
    let fanout = fanout.max(1);
    let v = (rank + nranks - root) % nranks;
    let real = |v: usize| (v + root) % nranks;
    let parent = (v > 0).then(|| real((v - 1) / fanout));
    let children = (1..=fanout)
        .map(|i| fanout * v + i)
        .filter(|&c| c < nranks)
        .map(real)
        .collect();
    (parent, children)
}

/// A tree member's steps over `chunks` chunks: per step, the chunk it receives from its parent
/// and the chunk it sends its children. The root sends chunk s at step s; any other member
/// receives chunk s at step s and passes on chunk s - 1, which the step before received (the
/// steps run in order on one stream).
fn tree_steps(chunks: usize, root: bool) -> Vec<(Option<usize>, Option<usize>)> {
    if root {
        (0..chunks).map(|s| (None, Some(s))).collect()
    } else {
        (0..=chunks)
            .map(|s| ((s < chunks).then_some(s), s.checked_sub(1)))
            .collect()
    }
}

/// Moves `unit` (the root's bytes, every other member's to fill) down the tree `place` gives
/// (from [`tree_place`]), chunk by chunk, enqueued on `stream`.
pub fn tree_unit(
    comm: &Comm,
    unit: DeviceRange<'_>,
    place: &(Option<usize>, Vec<usize>),
    stream: &Stream,
    deadline: Instant,
) -> Result<(), WorkerError> {
    let (parent, children) = place;
    let chunks = unit.len().div_ceil(TREE_CHUNK);
    let chunk = |c: usize| {
        let at = c * TREE_CHUNK;
        unit.slice(at, TREE_CHUNK.min(unit.len() - at))
    };
    for (recv, send) in tree_steps(chunks, parent.is_none()) {
        let send = send.filter(|_| !children.is_empty());
        if recv.is_none() && send.is_none() {
            continue;
        }
        comm.group(deadline, |g| {
            if let (Some(c), Some(p)) = (recv, *parent) {
                g.recv(chunk(c)?, p, stream)?;
            }
            if let Some(c) = send {
                for &child in children {
                    g.send(chunk(c)?, child, stream)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Stops a transfer from outside (its registration let go of, its peer known gone): the abort
/// of its communicator once there is one, or at once if it comes after the stop.
#[derive(Default)]
pub struct Stop(Mutex<StopState>);

pub type Abort = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct StopState {
    stopped: bool,
    done: bool,
    abort: Option<Abort>,
}

impl Stop {
    pub fn stop(&self) {
        let abort = {
            let mut st = lock(&self.0);
            st.stopped = true;
            st.abort.take()
        };
        if let Some(a) = abort {
            a();
        }
    }

    /// [`Stop::stop`] on a thread of its own: an abort waits for NCCL to wind the
    /// communicator down, which an async task must not.
    pub fn stop_in_background(self: &Arc<Self>) {
        if lock(&self.0).done {
            // Nothing to abort: the usual end of a pair's connection.
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || me.stop());
    }

    /// How to stop the transfer, now that it runs.
    pub fn on_stop(&self, abort: Abort) {
        let mut st = lock(&self.0);
        if st.done {
            return;
        }
        if st.stopped {
            drop(st);
            abort();
        } else {
            st.abort = Some(abort);
        }
    }

    /// The transfer is over: a later stop must not touch its communicator, which is kept.
    pub fn done(&self) {
        let mut st = lock(&self.0);
        st.done = true;
        st.abort = None;
    }

    pub fn stopped(&self) -> bool {
        lock(&self.0).stopped
    }
}

impl From<NcclError> for WorkerError {
    fn from(e: NcclError) -> WorkerError {
        match e {
            NcclError::Unavailable(why) => WorkerError::NoCuda(why),
            NcclError::Cuda(e) => e.into(),
            NcclError::Timeout { .. } => WorkerError::Remote(libc::ETIMEDOUT, e.to_string()),
            NcclError::Aborted => WorkerError::Remote(libc::ECONNABORTED, e.to_string()),
            e => WorkerError::Cuda(e.to_string()),
        }
    }
}

/// `e`, said of the broadcast of `window`.
pub fn in_window(e: WorkerError, window: &str) -> WorkerError {
    WorkerError::Remote(e.errno(), format!("the NCCL broadcast of {window}: {e}"))
}

/// Runs `b` over `bufs` (blocking: on a thread of its own); the bytes moved.
/// On success the communicator is kept in `comms` for a later window.
pub fn run(bufs: &Buffers, b: &Broadcast, stop: &Stop, comms: &Comms) -> Result<u64, WorkerError> {
    run_as(bufs, b, Use::Window, stop, comms)
}

/// Runs `b` over `bufs` as [`run`] does, on a communicator kept for `used` (`b.comm`) or one
/// formed from `b.unique_id`, kept for `used` afterwards; `stop` aborts it from the moment
/// there is one (while it still forms) until the transfer is over (a stop after a failure finds
/// it gone: a communicator dropped is nulled under its lock, and an abort then does nothing).
pub fn run_as(
    bufs: &Buffers,
    b: &Broadcast,
    used: Use,
    stop: &Stop,
    comms: &Comms,
) -> Result<u64, WorkerError> {
    let formed = |h: AbortHandle| {
        stop.on_stop(Box::new(move || {
            h.abort();
        }))
    };
    if b.rank >= b.nranks || b.root >= b.nranks || b.fanout > b.nranks {
        return Err(WorkerError::Bad(format!(
            "rank {} and root {} of {} ranks, fanout {}: not a transfer",
            b.rank, b.root, b.nranks, b.fanout
        )));
    }
    let (device, ranges) = bufs.device_ranges().ok_or_else(|| {
        WorkerError::Bad("an NCCL broadcast needs every buffer in CUDA memory on one device".into())
    })?;
    let stream = Stream::new(&device)?;
    let (key, comm) = match &b.comm {
        Some(key) => {
            comms.unused(&b.unique_id);
            let comm = comms.take(key, used).ok_or_else(|| {
                WorkerError::Remote(
                    libc::ESTALE,
                    "the communicator named for this transfer is no longer kept in this worker"
                        .into(),
                )
            })?;
            let fits = Kept::device(&comm) == device.ordinal()
                && comm.rank() == b.rank
                && comm.nranks() == b.nranks;
            if !fits {
                // Idle, and its peers are as lost as this member: ended at once, as a kept one
                // let go of is.
                comm.let_go();
                return Err(WorkerError::Bad(format!(
                    "the kept communicator is rank {} of {} on device {}, the transfer's rank {} \
                     of {} on device {}",
                    comm.rank(),
                    comm.nranks(),
                    Kept::device(&comm),
                    b.rank,
                    b.nranks,
                    device.ordinal()
                )));
            }
            tracing::info!(window = %b.window, "reusing a kept communicator");
            formed(comm.abort_handle());
            (key.clone(), comm)
        }
        None => {
            comms.used(&b.unique_id);
            // Told while it forms: a stop then need not wait out the deadline.
            let comm = Comm::init_then(
                &b.unique_id,
                b.nranks,
                b.rank,
                &device,
                Instant::now() + b.within,
                formed,
            )?;
            (comm_key(b.unique_id.as_bytes()), comm)
        }
    };
    let sender = b.rank == b.root;
    let deadline = Instant::now() + b.within;
    let mut packing = None;
    let moved = queue(&comm, &device, &stream, &ranges, b, deadline, &mut packing)
        .and_then(|()| Ok(comm.wait(&stream, deadline)?));
    if let Err(e) = moved {
        // Work still queued may wait on peers for good: aborted before the buckets are freed
        // (a free waits for the device's work), and so that the peers learn it now.
        comm.abort();
        return Err(e);
    }
    drop(packing);
    if !sender {
        bufs.filled(bufs.nbytes());
    }
    // Over: a stop from now on must leave the communicator be, which is kept.
    stop.done();
    comms.keep(key, comm, used);
    Ok(bufs.nbytes())
}

/// The buckets and the stream of copies of a packed transfer, kept until the transfer stream
/// has been waited for: work queued on it uses them.
type Packing = Option<(Stream, [Slot; 2])>;

/// Queues `b`'s transfer of `ranges` on `stream` (and, packed, on a stream of copies whose
/// buckets `packing` keeps), in order, without waiting for it.
fn queue(
    comm: &Comm,
    device: &Arc<Device>,
    stream: &Stream,
    ranges: &[DeviceRange<'_>],
    b: &Broadcast,
    deadline: Instant,
    packing: &mut Packing,
) -> Result<(), WorkerError> {
    let sender = b.rank == b.root;
    let place = (b.fanout > 0).then(|| tree_place(b.rank, b.root, b.nranks, b.fanout));
    // One unit of bytes (an entry in place, or a bucket) to every member.
    let transfer = |unit: DeviceRange<'_>| -> Result<(), WorkerError> {
        match &place {
            Some(place) => tree_unit(comm, unit, place, stream, deadline),
            None => Ok(comm.broadcast(None, unit, b.root, stream, deadline)?),
        }
    };
    if b.pack {
        // Two buckets, so that one is filled (the root) or emptied (the others) on a stream of
        // copies while the other's bytes move on the transfer stream; events hand each
        // bucket from one stream to the other, and the host never waits between them.
        let (copies, slots) = packing.insert((
            Stream::new(device)?,
            [Slot::new(device)?, Slot::new(device)?],
        ));
        let mut packed = 0;
        for run in runs(ranges, BUCKET) {
            match run {
                Run::InPlace(r) => transfer(r)?,
                Run::Packed(rs) => {
                    let slot = &mut slots[packed % 2];
                    packed += 1;
                    let used: usize = rs.iter().map(DeviceRange::len).sum();
                    let bucket = slot.bucket.range();
                    if sender {
                        if slot.used {
                            copies.wait_for(&slot.free)?;
                        }
                        let mut at = 0;
                        for r in &rs {
                            copies.copy(bucket.slice(at, r.len())?, *r)?;
                            at += r.len();
                        }
                        copies.record(&slot.filled)?;
                        stream.wait_for(&slot.filled)?;
                        transfer(bucket.slice(0, used)?)?;
                        stream.record(&slot.free)?;
                    } else {
                        if slot.used {
                            stream.wait_for(&slot.free)?;
                        }
                        transfer(bucket.slice(0, used)?)?;
                        stream.record(&slot.filled)?;
                        copies.wait_for(&slot.filled)?;
                        let mut at = 0;
                        for r in &rs {
                            copies.copy(*r, bucket.slice(at, r.len())?)?;
                            at += r.len();
                        }
                        copies.record(&slot.free)?;
                    }
                    slot.used = true;
                }
            }
        }
        // The caller's wait watches the transfer stream: it covers the copies once that stream
        // waits for them.
        let copied = Event::new(device)?;
        copies.record(&copied)?;
        stream.wait_for(&copied)?;
    } else {
        for r in ranges.iter().filter(|r| !r.is_empty()) {
            transfer(*r)?;
        }
    }
    Ok(())
}

/// One of a packed transfer's two buckets, with the events that pass it between the stream of
/// copies and the transfer stream.
struct Slot {
    bucket: DeviceBuffer,
    /// Its bytes are in place for the next step: copied in (the root), or received.
    filled: Event,
    /// Its last use is over: its bytes sent on (the root), or copied out.
    free: Event,
    used: bool,
}

impl Slot {
    fn new(device: &Arc<Device>) -> Result<Slot, WorkerError> {
        Ok(Slot {
            bucket: device.alloc(BUCKET)?,
            filled: Event::new(device)?,
            free: Event::new(device)?,
            used: false,
        })
    }
}

/// A step of a packed broadcast.
#[derive(Debug)]
enum Run<'a> {
    /// An entry of a bucket or more, broadcast where it is.
    InPlace(DeviceRange<'a>),
    /// Consecutive smaller entries that fit one bucket together.
    Packed(Vec<DeviceRange<'a>>),
}

/// Cuts entries (in table order, the same on every member) into [`Run`]s.
fn runs<'a>(ranges: &[DeviceRange<'a>], bucket: usize) -> Vec<Run<'a>> {
    let mut out = Vec::new();
    let mut open: Vec<DeviceRange<'a>> = Vec::new();
    let mut used = 0;
    for r in ranges.iter().filter(|r| !r.is_empty()) {
        if r.len() >= bucket {
            if !open.is_empty() {
                out.push(Run::Packed(std::mem::take(&mut open)));
                used = 0;
            }
            out.push(Run::InPlace(*r));
            continue;
        }
        if used + r.len() > bucket {
            out.push(Run::Packed(std::mem::take(&mut open)));
            used = 0;
        }
        used += r.len();
        open.push(*r);
    }
    if !open.is_empty() {
        out.push(Run::Packed(open));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    fn ranges(lens: &[usize]) -> Vec<DeviceRange<'static>> {
        let mut at = 0x1000;
        lens.iter()
            .map(|&n| {
                // SAFETY: never handed to the driver: `runs` only reads lengths.
                let r = unsafe { DeviceRange::from_raw(0, at, n) };
                at += n as u64;
                r
            })
            .collect()
    }

    fn lens(rs: &[Run<'_>]) -> Vec<Vec<usize>> {
        rs.iter()
            .map(|r| match r {
                Run::InPlace(r) => vec![r.len()],
                Run::Packed(v) => v.iter().map(DeviceRange::len).collect(),
            })
            .collect()
    }

    #[derive(Debug, PartialEq)]
    struct Fake {
        device: i32,
        rank: usize,
    }

    /// A communicator of two.
    #[derive(Debug, PartialEq)]
    struct Two(i32, usize);

    impl Kept for Two {
        fn device(&self) -> i32 {
            self.0
        }
        fn rank(&self) -> usize {
            self.1
        }
        fn nranks(&self) -> usize {
            2
        }
        fn let_go(&self) {}
    }

    #[test]
    fn a_pairs_communicators_are_neither_reported_for_windows_nor_taken_for_one() {
        let comms: Comms<Two> = Comms::default();
        comms.keep(vec![1; 32], Two(0, 0), Use::Pair);
        comms.keep(vec![2; 32], Two(0, 1), Use::Window);
        comms.keep(vec![3; 32], Two(0, 0), Use::Pair);
        comms.keep(vec![4; 32], Two(1, 0), Use::Pair);
        // A join tells the server of the window's only.
        let held: Vec<u8> = comms.held(0).iter().map(|h| h.key[0]).collect();
        assert_eq!(held, vec![2]);
        // A pair's GET finds its own, most recently used first, by rank and device.
        assert_eq!(comms.pairs(0, 0), vec![vec![3; 32], vec![1; 32]]);
        assert!(comms.pairs(1, 0).is_empty(), "the window's is no pair's");
        assert_eq!(comms.pairs(0, 1), vec![vec![4; 32]]);
        // Each kind is taken only as itself.
        assert_eq!(comms.take(&[1; 32], Use::Window), None);
        assert_eq!(comms.take(&[2; 32], Use::Pair), None);
        assert_eq!(comms.take(&[1; 32], Use::Pair), Some(Two(0, 0)));
        assert_eq!(comms.take(&[2; 32], Use::Window), Some(Two(0, 1)));
    }

    impl Kept for Fake {
        fn device(&self) -> i32 {
            self.device
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn nranks(&self) -> usize {
            3
        }
        fn let_go(&self) {
            LET_GO.with(|n| n.set(n.get() + 1));
        }
    }

    thread_local! {
        static LET_GO: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn a_worker_keeps_its_latest_communicators_and_reports_those_on_a_device() {
        let comms: Comms<Fake> = Comms::default();
        for k in 0..KEEP as u8 + 2 {
            comms.keep(
                vec![k; 32],
                Fake {
                    device: i32::from(k % 2),
                    rank: 1,
                },
                Use::Window,
            );
        }
        // The two least recently used went.
        let on = |d| -> Vec<u8> { comms.held(d).iter().map(|h| h.key[0]).collect() };
        assert_eq!(on(0), vec![2, 4]);
        assert_eq!(on(1), vec![3, 5]);
        assert!(comms.held(0).iter().all(|h| h.rank == 1 && h.nranks == 3));
        // Taken out while a broadcast runs on it: neither reported nor taken twice.
        assert_eq!(comms.take(&[4; 32], Use::Window).map(|c| c.device), Some(0));
        assert_eq!(comms.take(&[4; 32], Use::Window), None);
        assert_eq!(on(0), vec![2]);
        assert_eq!(comms.take(&[0; 32], Use::Window), None, "evicted");
        // Put back, it is the most recently used: the next eviction takes another.
        comms.keep(vec![4; 32], Fake { device: 0, rank: 1 }, Use::Window);
        comms.keep(vec![9; 32], Fake { device: 0, rank: 1 }, Use::Window);
        assert_eq!((on(0), on(1)), (vec![4, 9], vec![3, 5]));
        comms.keep(vec![8; 32], Fake { device: 1, rank: 1 }, Use::Window);
        assert_eq!((on(0), on(1)), (vec![4, 9], vec![5, 8]));
        // The four evicted were let go of (aborted), and so are the four kept when the worker
        // ends.
        assert_eq!(LET_GO.with(|n| n.get()), 4);
        drop(comms);
        assert_eq!(LET_GO.with(|n| n.get()), 8);
    }

    #[test]
    fn a_stop_before_the_communicator_forms_aborts_it_once_it_does_and_none_after_it_is_done() {
        let aborted = Arc::new(AtomicU8::new(0));
        let abort = || {
            let a = aborted.clone();
            Box::new(move || {
                a.fetch_add(1, Ordering::SeqCst);
            }) as Abort
        };
        let s = Stop::default();
        s.stop();
        s.on_stop(abort());
        assert_eq!(aborted.load(Ordering::SeqCst), 1);
        let s = Stop::default();
        s.on_stop(abort());
        s.stop();
        assert_eq!(aborted.load(Ordering::SeqCst), 2);
        // Done: the communicator is kept, and a late stop leaves it be.
        let s = Stop::default();
        s.on_stop(abort());
        s.done();
        s.stop();
        assert_eq!(aborted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_transfer_whose_ranks_or_fanout_do_not_fit_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let bufs = crate::gpu::worker::host::testing::buffers(dir.path(), "b", &[1; 64], false);
        let comms: Comms = Comms::default();
        let b = |rank, root, fanout| Broadcast {
            unique_id: UniqueId::from_bytes(&[0; 128]).unwrap(),
            nranks: 3,
            rank,
            root,
            pack: true,
            within: Duration::from_secs(1),
            comm: None,
            window: "w".into(),
            fanout,
        };
        for (rank, root, fanout) in [(0, 3, 0), (3, 0, 0), (1, 0, 4), (0, usize::MAX, 1)] {
            let e = run(&bufs, &b(rank, root, fanout), &Stop::default(), &comms).unwrap_err();
            assert!(e.to_string().contains("not a transfer"), "{e}");
        }
        // What fits goes on to the buffers, which here are not on a GPU.
        let e = run(&bufs, &b(2, 0, 3), &Stop::default(), &comms).unwrap_err();
        assert!(e.to_string().contains("CUDA memory"), "{e}");
    }

    #[test]
    fn a_unique_id_a_window_did_not_use_is_handed_out_for_the_next() {
        let comms: Comms<Fake> = Comms::default();
        let id = |n: u8| UniqueId::from_bytes(&[n; 128]).unwrap();
        let made = std::cell::Cell::new(0u8);
        let make = || -> Result<UniqueId, ()> {
            made.set(made.get() + 1);
            Ok(id(made.get()))
        };
        let first = comms.unique_id(make).unwrap();
        assert!(first == id(1));
        // A window on a kept communicator left it unused: the next join gets it, not a new one.
        comms.unused(&first);
        assert!(comms.unique_id(make).unwrap() == id(1));
        assert_eq!(made.get(), 1);
        // That one formed a communicator: the next is new.
        comms.used(&id(1));
        assert!(comms.unique_id(make).unwrap() == id(2));
        // An id another worker made (a getter is told the putter's) is never this one's spare.
        comms.unused(&id(7));
        assert!(comms.unique_id(make).unwrap() == id(3));
    }

    #[test]
    fn every_rank_has_one_parent_whose_children_it_is_in_a_tree_of_any_root_and_degree() {
        for nranks in 1..12 {
            for root in 0..nranks {
                for fanout in 1..5 {
                    let places: Vec<_> = (0..nranks)
                        .map(|r| tree_place(r, root, nranks, fanout))
                        .collect();
                    for (r, (parent, children)) in places.iter().enumerate() {
                        assert!(children.len() <= fanout);
                        match parent {
                            None => assert_eq!(r, root),
                            Some(p) => assert!(places[*p].1.contains(&r), "{r} not {p}'s child"),
                        }
                        for c in children {
                            assert_eq!(places[*c].0, Some(r));
                        }
                    }
                    // Every rank is reached from the root, within the depth of a full tree.
                    let mut depth = vec![None; nranks];
                    depth[root] = Some(0);
                    let mut todo = vec![root];
                    while let Some(r) = todo.pop() {
                        for &c in &places[r].1 {
                            depth[c] = depth[r].map(|d: usize| d + 1);
                            todo.push(c);
                        }
                    }
                    let full = |d: u32| (0..=d).map(|i| fanout.pow(i)).sum::<usize>();
                    let deepest = depth.iter().map(|d| d.unwrap()).max().unwrap();
                    assert!(deepest == 0 || full(deepest as u32 - 1) < nranks);
                }
            }
        }
        // With the root at rank 0: the server's tree (parent of rank r is rank (r - 1) / f).
        for r in 1..9 {
            assert_eq!(tree_place(r, 0, 9, 2).0, Some((r - 1) / 2));
        }
        // A chain.
        assert_eq!(tree_place(2, 0, 4, 1), (Some(1), vec![3]));
    }

    #[test]
    fn a_tree_member_passes_on_each_chunk_the_step_after_it_came() {
        assert_eq!(
            tree_steps(3, true),
            vec![(None, Some(0)), (None, Some(1)), (None, Some(2))]
        );
        assert_eq!(
            tree_steps(3, false),
            vec![
                (Some(0), None),
                (Some(1), Some(0)),
                (Some(2), Some(1)),
                (None, Some(2))
            ]
        );
        assert!(tree_steps(0, true).is_empty());
        assert_eq!(tree_steps(0, false), vec![(None, None)]);
    }

    #[test]
    fn small_entries_share_buckets_and_large_ones_go_in_place_in_table_order() {
        let rs = ranges(&[3, 4, 0, 2, 10, 5, 6, 1]);
        let cut = runs(&rs, 8);
        assert_eq!(
            lens(&cut),
            vec![vec![3, 4], vec![2], vec![10], vec![5], vec![6, 1]]
        );
        assert!(matches!(cut[2], Run::InPlace(_)));
        // Every byte once, in order.
        let flat: Vec<u64> = cut
            .iter()
            .flat_map(|r| match r {
                Run::InPlace(r) => vec![r.ptr()],
                Run::Packed(v) => v.iter().map(DeviceRange::ptr).collect(),
            })
            .collect();
        let want: Vec<u64> = rs
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| r.ptr())
            .collect();
        assert_eq!(flat, want);
        assert!(runs(&ranges(&[0, 0]), 8).is_empty());
        assert_eq!(lens(&runs(&ranges(&[8]), 8)), vec![vec![8]]);
    }
}
