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
//! `crate::broadcast::windows::comms`): forming one costs far more than a small broadcast. The
//! putter's unique id that such a window did not need is kept too, and handed out for the next
//! window that does: NCCL's bootstrap thread for an id waits until its ranks have joined, so an id
//! dropped unused would leave a thread and a socket behind for good.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::comms::{Comms, Kept, Use};
use super::error::WorkerError;
use super::memory::Buffers;
use super::stop::Stop;
use crate::gpu::cuda::{
    AbortHandle, Comm, Device, DeviceBuffer, DeviceRange, Event, Stream, UniqueId,
};
use crate::rpc::gpu_window::comm_key;

/// A fanout's tree, which the device checks also run on their own.
pub use super::tree::{tree_place, tree_unit};

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
    /// A window of several keys: this member's parent and children in its key's tree, as the
    /// plan gives them (`root` is its key's putter), moved by sends and receives whatever the
    /// fanout; the ranks of other keys take no part in them.
    pub place: Option<Place>,
}

/// A member's parent and children in a tree, by rank.
pub type Place = (Option<usize>, Vec<usize>);

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
    let placed_off = b.place.as_ref().is_some_and(|(parent, children)| {
        let ranks = parent.iter().chain(children);
        let mut ranks = ranks.copied().chain([b.rank]).collect::<Vec<_>>();
        let n = ranks.len();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.len() != n
            || ranks.iter().any(|&r| r >= b.nranks)
            || (parent.is_none() != (b.rank == b.root))
    });
    if b.rank >= b.nranks || b.root >= b.nranks || b.fanout > b.nranks || placed_off {
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
    let place = match &b.place {
        Some(p) => Some(p.clone()),
        None => (b.fanout > 0).then(|| tree_place(b.rank, b.root, b.nranks, b.fanout)),
    };
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
            place: None,
        };
        for (rank, root, fanout) in [(0, 3, 0), (3, 0, 0), (1, 0, 4), (0, usize::MAX, 1)] {
            let e = run(&bufs, &b(rank, root, fanout), &Stop::default(), &comms).unwrap_err();
            assert!(e.to_string().contains("not a transfer"), "{e}");
        }
        // A place in a key's tree must name other ranks of the window, a root no parent.
        for place in [
            (Some(3), vec![]),
            (Some(1), vec![1]),
            (None, vec![0]),
            (None, vec![]),
        ] {
            let bc = Broadcast {
                place: Some(place.clone()),
                ..b(1, 2, 0)
            };
            let e = run(&bufs, &bc, &Stop::default(), &comms).unwrap_err();
            assert!(e.to_string().contains("not a transfer"), "{place:?}: {e}");
        }
        // What fits goes on to the buffers, which here are not on a GPU.
        let e = run(&bufs, &b(2, 0, 3), &Stop::default(), &comms).unwrap_err();
        assert!(e.to_string().contains("CUDA memory"), "{e}");
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
