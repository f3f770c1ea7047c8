//! Uploading blocks from files to the store, after asking it which it lacks.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::Semaphore;

use super::wire::{self, Response};
use super::{permits, TransferError, CONNS_PER_SOURCE, UNIT, WINDOW_BYTES};
use crate::hash::BlockHash;
use crate::proto::MissingBlocksRequest;
use crate::rpc::{ClientError, Store, MISSING_BATCH};

/// One block to upload, read from a file.
#[derive(Clone, Debug)]
pub struct UploadJob {
    pub hash: BlockHash,
    pub len: u32,
    pub path: Arc<PathBuf>,
    pub offset: u64,
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
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| TransferError::Upload {
            addr: addr.to_string(),
            reason: e.to_string(),
        })??;
    }
    Ok(total)
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
    let (mut tx, mut rx) = wire::connect(&addr)
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
                    });
                }
            }
            offset += u64::from(b.len);
        }
    }
    jobs
}

/// Uploads the jobs whose blocks the store lacks (asked in batches of [`MISSING_BATCH`]).
/// Returns the bytes sent.
pub async fn upload_missing(
    store: &mut Store,
    addr: &str,
    jobs: Vec<UploadJob>,
    progress: &ProgressBar,
) -> Result<u64, TransferError> {
    let mut missing = HashSet::new();
    let mut ticket = Bytes::new();
    for chunk in jobs.chunks(MISSING_BATCH) {
        let resp = store
            .missing_blocks(MissingBlocksRequest {
                hashes: chunk.iter().map(|j| j.hash.0.to_vec()).collect(),
            })
            .await
            .map_err(ClientError::from)?
            .into_inner();
        missing.extend(resp.hashes.iter().filter_map(|h| BlockHash::from_slice(h)));
        ticket = resp.ticket.into();
    }
    let todo: Vec<UploadJob> = jobs
        .into_iter()
        .filter(|j| missing.contains(&j.hash))
        .collect();
    progress.inc_length(todo.iter().map(|j| u64::from(j.len)).sum());
    let sent = upload(addr, &ticket, todo, progress).await?;
    crate::metrics::UPLOADED_BYTES.add(sent);
    Ok(sent)
}
