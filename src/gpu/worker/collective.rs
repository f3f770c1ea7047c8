//! A window's bytes as one NCCL broadcast: every member's worker joins one communicator (the
//! putter's unique id, ranks from the server's plan, the putter the root) and the putter's
//! buffers go into every getter's, device to device, with NCCL's own pipelined broadcast.
//!
//! Unpacked, each entry is its own broadcast, in place. Packed, entries smaller than a bucket go
//! together: the root copies a run of them into a bucket of device memory, the bucket is
//! broadcast, and each receiver copies the run out again; an entry of a bucket or more goes in
//! place. So a state dict of many small tensors of mixed dtypes costs a few launches, not one
//! per tensor, and no second full copy of the model. Everything is queued on one stream, in
//! order, and waited for once, watched for NCCL errors, by the deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::memory::Buffers;
use super::WorkerError;
use crate::gpu::cuda::{AbortHandle, Comm, DeviceRange, NcclError, Stream, UniqueId};
use crate::locks::lock;

/// The size of a packed broadcast's bucket.
pub const BUCKET: usize = 64 << 20;

/// One member's part in a window's broadcast.
pub struct Broadcast {
    pub unique_id: UniqueId,
    pub nranks: usize,
    pub rank: usize,
    pub root: usize,
    pub pack: bool,
    /// How long forming the communicator, and then moving the bytes, may each take.
    pub within: Duration,
}

/// Where a Release finds the communicator to abort, once it is formed.
pub type AbortSlot = Arc<Mutex<Option<AbortHandle>>>;

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
pub fn run(bufs: &Buffers, b: &Broadcast, abort: &AbortSlot) -> Result<u64, WorkerError> {
    let (device, ranges) = bufs.device_ranges().ok_or_else(|| {
        WorkerError::Bad("an NCCL broadcast needs every buffer in CUDA memory on one device".into())
    })?;
    let stream = Stream::new(&device)?;
    let comm = Comm::init(
        &b.unique_id,
        b.nranks,
        b.rank,
        &device,
        Instant::now() + b.within,
    )?;
    *lock(abort) = Some(comm.abort_handle());
    let deadline = Instant::now() + b.within;
    let sender = b.rank == b.root;
    if b.pack {
        let bucket = device.alloc(BUCKET)?;
        for run in runs(&ranges, BUCKET) {
            match run {
                Run::InPlace(r) => comm.broadcast(None, r, b.root, &stream, deadline)?,
                Run::Packed(rs) => {
                    let mut at = 0;
                    if sender {
                        for r in &rs {
                            stream.copy(bucket.range().slice(at, r.len())?, *r)?;
                            at += r.len();
                        }
                    } else {
                        at = rs.iter().map(DeviceRange::len).sum();
                    }
                    let used = bucket.range().slice(0, at)?;
                    comm.broadcast(None, used, b.root, &stream, deadline)?;
                    if !sender {
                        let mut at = 0;
                        for r in &rs {
                            stream.copy(*r, bucket.range().slice(at, r.len())?)?;
                            at += r.len();
                        }
                    }
                }
            }
        }
    } else {
        for r in ranges.iter().filter(|r| !r.is_empty()) {
            comm.broadcast(None, *r, b.root, &stream, deadline)?;
        }
    }
    comm.wait(&stream, deadline)?;
    lock(abort).take();
    if !sender {
        bufs.filled(bufs.nbytes());
    }
    Ok(bufs.nbytes())
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
