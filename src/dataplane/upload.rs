//! Uploading blocks from files to the store, after asking it which it lacks.
//!
//! A block that replaces a block of the key's previous version (the old block covering most of
//! the same bytes of the same file) goes as an rsync delta against it where that is smaller:
//! the store sends the old block's signature, this side the delta, and the store rebuilds the
//! block and checks its hash. Each such block is a round trip of its own, one block in memory
//! at a time per connection; the store lacking the old block, or a delta as large as the
//! block, sends the block whole.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::Semaphore;

use super::budget::{permits, CONNS_PER_SOURCE, UNIT, WINDOW_BYTES};
use super::error::TransferError;
use super::wire::{self, Peer, Response};
use crate::hash::BlockHash;
use crate::manifest::EntryKind;
use crate::proto::{Locale, Manifest, MissingBlocksRequest, PublishRequest, ResolveRequest};
use crate::rpc::{Store, MISSING_BATCH};

/// One block to upload, read from a file.
#[derive(Clone, Debug)]
pub struct UploadJob {
    pub hash: BlockHash,
    pub len: u32,
    pub path: Arc<PathBuf>,
    pub offset: u64,
    /// The block of the previous version it replaces, which the store may hold: sent as a
    /// delta against it.
    pub base: Option<BlockHash>,
}

/// Uploads blocks to a data-plane server that takes them (the store), presenting `ticket`.
/// Returns the bytes sent.
pub async fn upload(
    addr: &str,
    ticket: &Bytes,
    jobs: Vec<UploadJob>,
    progress: &ProgressBar,
) -> Result<u64, TransferError> {
    let mut lanes: Vec<Vec<UploadJob>> = vec![Vec::new(); CONNS_PER_SOURCE.min(jobs.len().max(1))];
    for (i, j) in jobs.into_iter().enumerate() {
        let n = lanes.len();
        lanes[i % n].push(j);
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            tokio::spawn(upload_lane(
                addr.to_string(),
                ticket.clone(),
                lane,
                progress.clone(),
            ))
        })
        .collect();
    sum_lanes(addr, tasks).await
}

async fn upload_lane(
    addr: String,
    ticket: Bytes,
    jobs: Vec<UploadJob>,
    progress: ProgressBar,
) -> Result<u64, TransferError> {
    if jobs.is_empty() {
        return Ok(0);
    }
    let fail = |reason: String| TransferError::Upload {
        addr: addr.clone(),
        reason,
    };
    let (mut tx, mut rx) = wire::connect(&addr, Peer::Store)
        .await
        .map_err(|e| fail(e.to_string()))?;
    tx.ticket(&ticket).await.map_err(|e| fail(e.to_string()))?;
    let window = Arc::new(Semaphore::new((WINDOW_BYTES / UNIT) as usize));
    let sender = {
        let window = window.clone();
        let jobs = jobs.clone();
        async move {
            for j in jobs {
                let Ok(p) = window.acquire_many(permits(j.len)).await else {
                    break;
                };
                p.forget();
                let data = tokio::task::spawn_blocking(move || read_block(&j))
                    .await
                    .map_err(|e| TransferError::Read {
                        path: String::new(),
                        source: std::io::Error::other(e.to_string()),
                    })??;
                if let Err(e) = tx.put(&BlockHash::of(&data), &data).await {
                    return Err(TransferError::Upload {
                        addr: String::new(),
                        reason: e.to_string(),
                    });
                }
            }
            // The connection stays whole until the last reply: dropping the sender would
            // half-close it, which a port-forward through the Kubernetes API (`--kubeconfig`)
            // turns into a full close.
            Ok(tx)
        }
    };
    let receiver = async {
        let mut sent = 0u64;
        for j in &jobs {
            match rx.recv().await {
                Ok(Response::Stored(h)) if h == j.hash => {
                    window.add_permits(permits(j.len) as usize);
                    sent += u64::from(j.len);
                    progress.inc(u64::from(j.len));
                }
                Ok(Response::Error(m)) => {
                    window.close();
                    return Err(fail(m));
                }
                Ok(Response::NoSpace(reason)) => {
                    window.close();
                    return Err(TransferError::NoSpace {
                        addr: addr.clone(),
                        reason,
                    });
                }
                Ok(other) => {
                    window.close();
                    return Err(fail(format!("unexpected reply {other:?}")));
                }
                Err(e) => {
                    window.close();
                    return Err(fail(e.to_string()));
                }
            }
        }
        Ok(sent)
    };
    let (s, r) = tokio::join!(sender, receiver);
    // A read error on our side explains a closed connection better than the receiver's view.
    let _tx = s?;
    r
}

pub(crate) fn read_block(j: &UploadJob) -> Result<Vec<u8>, TransferError> {
    let path = j.path.display().to_string();
    let f = File::open(j.path.as_ref()).map_err(|source| TransferError::Read {
        path: path.clone(),
        source,
    })?;
    let mut buf = vec![0u8; j.len as usize];
    f.read_exact_at(&mut buf, j.offset).map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            TransferError::Changed(path.clone())
        } else {
            TransferError::Read {
                path: path.clone(),
                source,
            }
        }
    })?;
    if BlockHash::of(&buf) != j.hash {
        return Err(TransferError::Changed(path));
    }
    Ok(buf)
}

/// One job per unique block of `files` (`(path on disk, its blocks in order)`), each read from
/// the first file that holds it.
pub fn jobs_of<'a>(
    files: impl IntoIterator<Item = (Arc<PathBuf>, &'a [crate::proto::BlockRef])>,
) -> Vec<UploadJob> {
    let mut seen = HashSet::new();
    let mut jobs = Vec::new();
    for (path, blocks) in files {
        let mut offset = 0u64;
        for b in blocks {
            if let Some(hash) = crate::manifest::block_hash(b) {
                if seen.insert(hash) {
                    jobs.push(UploadJob {
                        hash,
                        len: b.len,
                        path: path.clone(),
                        offset,
                        base: None,
                    });
                }
            }
            offset += u64::from(b.len);
        }
    }
    jobs
}

/// Uploads the jobs whose blocks the store lacks for the publication `req` (asked in batches of
/// [`MISSING_BATCH`], in `req`'s namespace: a block only another namespace holds is uploaded
/// too): blocks that replace blocks of the key's current version go as deltas against them.
/// Returns the bytes that crossed the network (signatures received included).
pub async fn upload_missing_for(
    store: &Store,
    addr: &str,
    req: &PublishRequest,
    jobs: Vec<UploadJob>,
    progress: &ProgressBar,
) -> Result<u64, TransferError> {
    let mut missing = HashSet::new();
    let mut ticket = Bytes::new();
    for chunk in jobs.chunks(MISSING_BATCH) {
        let resp = store
            .missing_blocks(MissingBlocksRequest {
                hashes: chunk.iter().map(|j| j.hash.0.to_vec()).collect(),
                namespace: req.namespace.clone(),
            })
            .await?;
        missing.extend(resp.hashes.iter().filter_map(|h| BlockHash::from_slice(h)));
        ticket = resp.ticket.into();
    }
    let mut todo: Vec<UploadJob> = jobs
        .into_iter()
        .filter(|j| missing.contains(&j.hash))
        .collect();
    progress.inc_length(todo.iter().map(|j| u64::from(j.len)).sum());
    let read_ticket = match todo.is_empty() {
        false => previous_bases(store, req, &mut todo).await,
        true => None,
    };
    let (deltas, whole): (Vec<UploadJob>, Vec<UploadJob>) =
        todo.into_iter().partition(|j| j.base.is_some());
    let sent = match read_ticket {
        Some(read) if !deltas.is_empty() => {
            let (a, b) = tokio::join!(
                upload(addr, &ticket, whole, progress),
                upload_deltas(addr, [&ticket, &read], deltas, progress)
            );
            a? + b?
        }
        _ => upload(addr, &ticket, whole, progress).await?,
    };
    crate::metrics::UPLOADED_BYTES.add(sent);
    Ok(sent)
}

/// Points each job at the block of the key's current version it replaces; returns the read
/// ticket for that version, or `None` where there is nothing to delta against (a new key, a
/// key published in place, a key inside a directory).
async fn previous_bases(
    store: &Store,
    req: &PublishRequest,
    jobs: &mut [UploadJob],
) -> Option<Bytes> {
    let next = req.manifest.as_ref()?;
    if req.locale != Locale::Store as i32 {
        return None;
    }
    let prev = match store
        .resolve(ResolveRequest {
            watcher: 0,
            namespace: req.namespace.clone(),
            key: req.key.clone(),
            inline_up_to: 0,
        })
        .await
    {
        Ok(r) => r,
        // Mostly a key published for the first time; any failure means whole blocks.
        Err(status) => {
            tracing::debug!(key = %req.key, %status, "no previous version to delta against");
            return None;
        }
    };
    if prev.locale != Locale::Store as i32 || !prev.subpath.is_empty() {
        return None;
    }
    let bases = replaced_blocks(prev.manifest.as_ref()?, next);
    let mut any = false;
    for j in jobs.iter_mut() {
        j.base = bases.get(&j.hash).copied();
        any |= j.base.is_some();
    }
    any.then(|| Bytes::from(prev.ticket))
}

/// For each block of `next` that `prev` lacks, the block of `prev` it replaces: in the file of
/// the same path, the old block that overlaps most of its byte range.
pub fn replaced_blocks(prev: &Manifest, next: &Manifest) -> HashMap<BlockHash, BlockHash> {
    let ranges = |blocks: &[crate::proto::BlockRef]| {
        let mut at = 0u64;
        blocks
            .iter()
            .filter_map(|b| {
                let start = at;
                at += u64::from(b.len);
                Some((start, at, crate::manifest::block_hash(b)?))
            })
            .collect::<Vec<_>>()
    };
    let held: HashSet<&[u8]> = prev
        .entries
        .iter()
        .flat_map(|e| e.blocks.iter().map(|b| &b.hash[..]))
        .collect();
    let mut out = HashMap::new();
    for e in next.entries.iter().filter(|e| e.kind() == EntryKind::File) {
        let Ok(i) = prev.entries.binary_search_by(|p| p.path.cmp(&e.path)) else {
            continue;
        };
        let old = ranges(&prev.entries[i].blocks);
        for (start, end, hash) in ranges(&e.blocks) {
            if held.contains(&hash.0[..]) {
                continue;
            }
            let first = old.partition_point(|&(_, o_end, _)| o_end <= start);
            let best = old[first..]
                .iter()
                .take_while(|&&(o_start, _, _)| o_start < end)
                .max_by_key(|&&(o_start, o_end, _)| o_end.min(end) - o_start.max(start));
            if let Some(&(_, _, base)) = best {
                out.entry(hash).or_insert(base);
            }
        }
    }
    out
}

/// Uploads jobs that have a base, each as a delta against it where the store holds the base
/// and the delta is smaller than the block, on up to [`CONNS_PER_SOURCE`] connections that
/// present `tickets` (to upload, and to read the bases).
async fn upload_deltas(
    addr: &str,
    tickets: [&Bytes; 2],
    jobs: Vec<UploadJob>,
    progress: &ProgressBar,
) -> Result<u64, TransferError> {
    let mut lanes: Vec<Vec<UploadJob>> = vec![Vec::new(); CONNS_PER_SOURCE.min(jobs.len().max(1))];
    for (i, j) in jobs.into_iter().enumerate() {
        let n = lanes.len();
        lanes[i % n].push(j);
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            let tickets = [tickets[0].clone(), tickets[1].clone()];
            tokio::spawn(delta_lane(
                addr.to_string(),
                tickets,
                lane,
                progress.clone(),
            ))
        })
        .collect();
    sum_lanes(addr, tasks).await
}

async fn delta_lane(
    addr: String,
    tickets: [Bytes; 2],
    jobs: Vec<UploadJob>,
    progress: ProgressBar,
) -> Result<u64, TransferError> {
    if jobs.is_empty() {
        return Ok(0);
    }
    let fail = |reason: String| TransferError::Upload {
        addr: addr.clone(),
        reason,
    };
    let (mut tx, mut rx) = wire::connect(&addr, Peer::Store)
        .await
        .map_err(|e| fail(e.to_string()))?;
    for t in &tickets {
        tx.ticket(t).await.map_err(|e| fail(e.to_string()))?;
    }
    let mut sent = 0u64;
    for j in jobs {
        let len = j.len;
        let data = tokio::task::spawn_blocking(move || read_block(&j).map(|d| (j, d)))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (j, mut data) = data?;
        let mut against = None;
        if let Some(base) = j.base {
            tx.signature(&base).await.map_err(|e| fail(e.to_string()))?;
            match rx.recv().await.map_err(|e| fail(e.to_string()))? {
                Response::Signature(h, sig) if h == base => against = Some((base, sig)),
                Response::NotFound(_) => {}
                // A store that cannot read the old block still takes the new one whole.
                Response::Error(m) => {
                    tracing::debug!(block = %base, reason = %m, "no signature; sending whole")
                }
                other => return Err(fail(format!("unexpected reply {other:?}"))),
            }
        }
        let mut stored = false;
        if let Some((base, sig)) = against {
            sent += sig.len() as u64;
            let (back, delta) = tokio::task::spawn_blocking(move || {
                let d = super::delta::diff(&sig, &data);
                (data, d)
            })
            .await
            .map_err(|e| fail(e.to_string()))?;
            data = back;
            match delta {
                Ok(d) if d.len() < data.len() => {
                    tx.put_delta(&j.hash, &base, &d)
                        .await
                        .map_err(|e| fail(e.to_string()))?;
                    match rx.recv().await.map_err(|e| fail(e.to_string()))? {
                        Response::Stored(h) if h == j.hash => {
                            sent += d.len() as u64;
                            stored = true;
                        }
                        Response::NoSpace(reason) => {
                            return Err(TransferError::NoSpace {
                                addr: addr.clone(),
                                reason,
                            })
                        }
                        // The old block went away, or the delta rebuilt other bytes (a
                        // signature's short hashes can match wrongly): the block goes whole.
                        Response::NotFound(_) | Response::Error(_) => {}
                        other => return Err(fail(format!("unexpected reply {other:?}"))),
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(block = %j.hash, error = %e, "no delta; sending whole"),
            }
        }
        if !stored {
            tx.put(&j.hash, &data)
                .await
                .map_err(|e| fail(e.to_string()))?;
            match rx.recv().await.map_err(|e| fail(e.to_string()))? {
                Response::Stored(h) if h == j.hash => sent += u64::from(len),
                Response::NoSpace(reason) => {
                    return Err(TransferError::NoSpace {
                        addr: addr.clone(),
                        reason,
                    })
                }
                Response::Error(m) => return Err(fail(m)),
                other => return Err(fail(format!("unexpected reply {other:?}"))),
            }
        }
        progress.inc(u64::from(len));
    }
    Ok(sent)
}

/// The bytes the lanes of an upload sent, or the first failure among them.
async fn sum_lanes(
    addr: &str,
    tasks: Vec<tokio::task::JoinHandle<Result<u64, TransferError>>>,
) -> Result<u64, TransferError> {
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| TransferError::Upload {
            addr: addr.to_string(),
            reason: e.to_string(),
        })??;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{BlockRef, FileEntry};

    fn file(path: &str, blocks: &[(u8, u32)]) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind: EntryKind::File as i32,
            size: blocks.iter().map(|&(_, l)| u64::from(l)).sum(),
            blocks: blocks
                .iter()
                .map(|&(h, len)| BlockRef {
                    hash: vec![h; 32],
                    len,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn manifest(entries: Vec<FileEntry>) -> Manifest {
        Manifest {
            block_size: 100,
            entries,
        }
    }

    #[test]
    fn a_new_block_replaces_the_old_block_it_overlaps_most_in_the_same_file() {
        let prev = manifest(vec![
            file("a", &[(1, 100), (2, 100), (3, 100)]),
            file("b", &[(4, 50)]),
        ]);
        // In `a`, block 2 grew (an insertion) and block 3 kept its bytes; `b` kept block 4
        // and gained one at its end; `c` is new.
        let next = manifest(vec![
            file("a", &[(1, 100), (5, 130), (3, 100)]),
            file("b", &[(4, 50), (6, 20)]),
            file("c", &[(7, 10)]),
        ]);
        let bases = replaced_blocks(&prev, &next);
        let h = |b: u8| BlockHash([b; 32]);
        assert_eq!(bases.get(&h(5)), Some(&h(2)));
        assert_eq!(bases.len(), 1, "{bases:?}");
    }
}
