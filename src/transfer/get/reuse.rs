//! What a get takes from an older copy at its destination (`kt get -f` onto a file that was
//! modified or left behind locally), as rsync does.
//!
//! The copy is cut into blocks the way the version's were cut ([`Chunking::of_manifest`]), so
//! an edit leaves every block away from it as it was: those are copied from the copy, never
//! fetched. A block the copy lacks is asked for as an rsync delta (`OP_GET_DELTA`) against the
//! bytes of the copy it replaces: the same place, moved by what the blocks before it moved.
//! Nothing is trusted: a copied block is hashed again as it is read, a rebuilt one is checked
//! against its hash, and whatever fails goes back to the plain fetch.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::dataplane::delta;
use crate::dataplane::fetch::{BlockJob, BlockSink, FetchReport};
use crate::dataplane::peers::Peers;
use crate::dataplane::sources::SourceAddr;
use crate::dataplane::wire::Response;
use crate::hash::BlockHash;
use crate::transfer::put::chunk::{hash_blocks, Chunking};
use crate::transfer::TransferError;

/// Blocks shorter than this are fetched whole: their signature and round trip cost about
/// what they would save.
const DELTA_MIN: u32 = 16 << 10;
/// Delta requests in flight on the connection (each holds a signature until it is answered).
const DELTA_WINDOW: usize = 4;

/// An older copy of a fetched file at its destination, and the blocks cut from it.
pub(super) struct OldCopy {
    file: File,
    len: u64,
    /// `(offset, length, hash)` in the copy, in order.
    blocks: Vec<(u64, u32, BlockHash)>,
}

/// The older copies at the destinations of the files being fetched (by file index), cut as
/// `chunking` cuts. A destination that is no regular file, or cannot be read, has none.
pub(super) fn old_copies(dests: &[PathBuf], chunking: Chunking) -> HashMap<usize, OldCopy> {
    let mut buf = Vec::new();
    let mut copies = HashMap::new();
    for (idx, path) in dests.iter().enumerate() {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if !meta.is_file() || meta.len() == 0 {
            continue;
        }
        let cut = File::open(path).and_then(|mut f| {
            buf.resize(chunking.buffer_len(meta.len()), 0);
            let (len, refs) = hash_blocks(&mut f, &chunking, &mut buf)?;
            Ok((f, len, refs))
        });
        let (file, len, refs) = match cut {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "older copy unreadable: fetching whole");
                continue;
            }
        };
        let mut off = 0u64;
        let blocks = refs
            .iter()
            .filter_map(|b| {
                let at = off;
                off += u64::from(b.len);
                Some((at, b.len, BlockHash::from_slice(&b.hash)?))
            })
            .collect();
        copies.insert(idx, OldCopy { file, len, blocks });
    }
    copies
}

/// A block to ask for as a delta against `range` of the older copy of file `file`.
pub(super) struct DeltaJob {
    job: BlockJob,
    file: usize,
    range: (u64, u64),
}

/// What [`reuse`] left to fetch.
pub(super) struct Reused {
    /// Blocks no older copy holds and none to ask for as a delta.
    pub jobs: Vec<BlockJob>,
    pub deltas: Vec<DeltaJob>,
    /// Bytes copied from older copies.
    pub bytes: u64,
}

/// Writes every job an older copy holds into `sink` from that copy, and sorts the rest into
/// delta candidates (a target file has an older copy) and plain jobs.
pub(super) fn reuse(
    jobs: Vec<BlockJob>,
    copies: &HashMap<usize, OldCopy>,
    sink: &dyn BlockSink,
) -> Result<Reused, TransferError> {
    let mut held: HashMap<BlockHash, (usize, u64, u32)> = HashMap::new();
    // Where each block lies in each copy: a block found in its own file's copy anchors it.
    let mut at: HashMap<(usize, BlockHash), u64> = HashMap::new();
    for (&idx, c) in copies {
        for &(off, len, h) in &c.blocks {
            held.entry(h).or_insert((idx, off, len));
            at.entry((idx, h)).or_insert(off);
        }
    }
    // Where each file's blocks found their place in its own copy: the shift a block between
    // them takes to find the bytes it replaces.
    let mut anchors: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
    let mut out = Reused {
        jobs: Vec::new(),
        deltas: Vec::new(),
        bytes: 0,
    };
    let mut missing = Vec::new();
    for job in jobs {
        let data = match held.get(&job.hash) {
            Some(&(idx, off, len)) if len == job.len => read_verified(&copies[&idx], off, &job),
            _ => None,
        };
        let Some(data) = data else {
            missing.push(job);
            continue;
        };
        sink.put(&job, &data)?;
        out.bytes += u64::from(job.len);
        for &(idx, new_off) in &job.targets {
            if let Some(&old_off) = at.get(&(idx, job.hash)) {
                anchors.entry(idx).or_default().push((new_off, old_off));
            }
        }
    }
    for a in anchors.values_mut() {
        a.sort_unstable();
    }
    for job in missing {
        let base = job.targets.iter().find_map(|&(idx, new_off)| {
            let c = copies.get(&idx)?;
            let shift = anchors.get(&idx).and_then(|a| {
                let i = a.partition_point(|&(n, _)| n < new_off);
                i.checked_sub(1).map(|i| a[i].1 as i128 - a[i].0 as i128)
            });
            base_range(new_off, job.len, shift.unwrap_or(0), c.len).map(|r| (idx, r))
        });
        match base {
            Some((file, range)) if job.len >= DELTA_MIN => {
                out.deltas.push(DeltaJob { job, file, range })
            }
            _ => out.jobs.push(job),
        }
    }
    Ok(out)
}

/// The bytes of the older copy that a block of `len` at `new_off` replaces: the same place
/// moved by `shift` (what the blocks before it moved), with a margin either side for an
/// insertion or a deletion inside it; `None` where that lies past the copy's end.
fn base_range(new_off: u64, len: u32, shift: i128, copy_len: u64) -> Option<(u64, u64)> {
    let margin = i128::from((len / 4).max(64 << 10));
    let at = i128::from(new_off) + shift;
    let start = (at - margin).clamp(0, i128::from(copy_len)) as u64;
    let end = (at + i128::from(len) + margin).clamp(0, i128::from(copy_len)) as u64;
    (start < end).then_some((start, end))
}

/// `job`'s bytes read from the copy at `off`, if they still hash to it (the copy may have
/// changed since it was cut).
fn read_verified(c: &OldCopy, off: u64, job: &BlockJob) -> Option<Bytes> {
    let mut data = vec![0u8; job.len as usize];
    c.file.read_exact_at(&mut data, off).ok()?;
    (BlockHash::of(&data) == job.hash).then(|| Bytes::from(data))
}

fn read_range(c: &OldCopy, (start, end): (u64, u64)) -> std::io::Result<Vec<u8>> {
    let mut data = vec![0u8; (end - start) as usize];
    c.file.read_exact_at(&mut data, start)?;
    Ok(data)
}

/// What [`fetch_deltas`] did: the blocks that came as deltas, the length of all it got (as
/// deltas or whole), the bytes that crossed the network for them (signatures up, answers
/// down), and the jobs left to fetch plainly.
pub(super) struct DeltaReport {
    pub report: FetchReport,
    pub blocks: u64,
    /// The length of the blocks it got.
    pub block_bytes: u64,
    pub left: Vec<BlockJob>,
}

/// Asks the nearest source that answers, other than this node (`own`: its agent may serve the
/// very copy being replaced, in place), for each block as a delta against its base, a few in
/// flight; what fails (no source, a refusal, a delta that rebuilds other bytes) is left for the
/// plain fetch.
pub(super) async fn fetch_deltas(
    peers: &Peers,
    deltas: Vec<DeltaJob>,
    copies: Arc<HashMap<usize, OldCopy>>,
    sources: &[SourceAddr],
    own: &str,
    sink: Arc<dyn BlockSink>,
) -> DeltaReport {
    let mut out = DeltaReport {
        report: FetchReport::default(),
        blocks: 0,
        block_bytes: 0,
        left: Vec::new(),
    };
    if deltas.is_empty() {
        return out;
    }
    let mut conn = None;
    for s in sources.iter().filter(|s| own.is_empty() || s.label != own) {
        match peers.connect(&s.addr, s.peer()).await {
            Ok(mut c) => {
                if c.0.ticket(&s.ticket).await.is_ok() {
                    conn = Some((s, c));
                    break;
                }
            }
            Err(e) => tracing::debug!(source = %s.label, error = %e, "no delta from this source"),
        }
    }
    let Some((source, (mut tx, mut rx))) = conn else {
        out.left = deltas.into_iter().map(|d| d.job).collect();
        return out;
    };
    let mut bytes = 0u64;
    let mut todo: VecDeque<DeltaJob> = deltas.into();
    let mut sent: VecDeque<DeltaJob> = VecDeque::new();
    let mut broken = false;
    while !broken && (!todo.is_empty() || !sent.is_empty()) {
        while sent.len() < DELTA_WINDOW {
            let Some(d) = todo.pop_front() else { break };
            let (c, range) = (copies.clone(), d.range);
            let sig = tokio::task::spawn_blocking(move || {
                read_range(&c[&d.file], range).map(|b| delta::signature(&b))
            });
            let sig = match sig.await {
                Ok(Ok(sig)) => sig,
                _ => {
                    out.left.push(d.job);
                    continue;
                }
            };
            if tx.get_delta(&d.job.hash, &sig).await.is_err() {
                broken = true;
                todo.push_front(d);
                break;
            }
            bytes += sig.len() as u64;
            sent.push_back(d);
        }
        let Some(d) = sent.pop_front() else { continue };
        let answer = match rx.recv().await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(source = %source.label, error = %e, "delta connection broke");
                out.left.push(d.job);
                broken = true;
                continue;
            }
        };
        let (c, sink, job) = (copies.clone(), sink.clone(), d.job.clone());
        let got = tokio::task::spawn_blocking(move || rebuild(&c[&d.file], &d, answer, &*sink))
            .await
            .unwrap_or(None);
        match got {
            Some((n, was_delta)) => {
                bytes += n;
                out.blocks += u64::from(was_delta);
                out.block_bytes += u64::from(job.len);
            }
            None => out.left.push(job),
        }
    }
    out.left.extend(todo.into_iter().map(|d| d.job));
    out.left.extend(sent.into_iter().map(|d| d.job));
    if bytes > 0 {
        out.report.by_source.push((source.clone(), bytes));
    }
    out
}

/// Writes the block an answer to `d` gives into `sink`, rebuilt against its base where it is
/// a delta; the bytes that came and whether they were a delta, or `None` where the answer gave
/// no block that matches its hash (the job is then fetched plainly).
fn rebuild(
    c: &OldCopy,
    d: &DeltaJob,
    answer: Response,
    sink: &dyn BlockSink,
) -> Option<(u64, bool)> {
    let (data, came) = match answer {
        Response::Delta(h, delta) if h == d.job.hash => {
            let base = read_range(c, d.range).ok()?;
            let data = delta::apply(&base, &delta, d.job.len as usize).ok()?;
            (Bytes::from(data), (delta.len() as u64, true))
        }
        Response::Block(h, b) if h == d.job.hash => {
            let n = b.len() as u64;
            (b, (n, false))
        }
        other => {
            let why = match other {
                Response::Error(m) | Response::NoSpace(m) => m,
                Response::NotFound(_) => "not found".into(),
                _ => "an answer for another block".into(),
            };
            tracing::debug!(block = %d.job.hash, %why, "no delta: fetching the block whole");
            return None;
        }
    };
    if data.len() != d.job.len as usize || BlockHash::of(&data) != d.job.hash {
        tracing::warn!(block = %d.job.hash, "a delta rebuilt other bytes: fetching the block whole");
        return None;
    }
    match sink.put(&d.job, &data) {
        Ok(()) => Some(came),
        Err(e) => {
            tracing::warn!(error = %e, "writing a block rebuilt from a delta");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_range_follows_the_shift_of_the_blocks_before_it_and_stays_inside_the_copy() {
        let m = 64 << 10;
        // In place, with margins.
        assert_eq!(
            base_range(1 << 20, 1 << 20, 0, 8 << 20),
            Some(((1 << 20) - (256 << 10), (2 << 20) + (256 << 10)))
        );
        // The blocks before it moved 100 bytes later: so does its base.
        let (s, e) = base_range(1 << 20, 1 << 20, 100, 8 << 20).unwrap();
        assert_eq!(
            (s, e),
            ((1 << 20) - (256 << 10) + 100, (2 << 20) + (256 << 10) + 100)
        );
        // Clamped at both ends; none past the copy's end.
        assert_eq!(base_range(0, 20 << 10, 0, 30 << 10), Some((0, 30 << 10)));
        assert_eq!(base_range(0, 20 << 10, -(1 << 30), 30 << 10), None);
        assert_eq!(base_range(10 << 20, 1 << 20, 0, 8 << 20), None);
        assert_eq!(base_range(100, 4096, 0, 1 << 20), Some((0, 100 + 4096 + m)));
    }
}
