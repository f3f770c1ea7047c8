//! Sending blocks while the scan still hashes later ones. The scan hands each block it cuts to
//! a queue; a task takes them in batches, asks the store which it lacks and sends those, one
//! connection a batch, while the hashing threads go on. The queue holds at most [`QUEUED_BYTES`]
//! of blocks (a batch being sent and the next one filling), so memory stays bounded whatever
//! the size of the put, and many small files still make few large batches: a store slower than
//! the disk holds the hashing back.
//!
//! Used for a put with nothing to send a delta against (a new key): blocks that replace blocks
//! of an earlier version go after the scan, as deltas (`upload_missing_for`). Whatever this
//! misses (a failed batch, a dead connection), that final pass sends: it asks again and finds
//! the rest missing.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::dataplane::error::TransferError;
use crate::dataplane::wire::{self, Peer, Response};
use crate::hash::BlockHash;
use crate::locks;
use crate::manifest::BlockRef;
use crate::proto::MissingBlocksRequest;
use crate::rpc::Store;

/// Bytes of blocks queued or being sent at most: two batches.
const QUEUED_BYTES: usize = 2 * BATCH_BYTES;

/// A batch closes at this many bytes or [`BATCH_BLOCKS`] blocks, or when the queue is empty.
const BATCH_BYTES: usize = 32 << 20;
const BATCH_BLOCKS: usize = 256;

struct Found {
    hash: BlockHash,
    data: Bytes,
}

/// The bytes queued: the hashing threads (plain threads, not the runtime's) wait on it while
/// it is full; the task gives bytes back once their batch is sent.
#[derive(Default)]
struct Budget {
    used: Mutex<usize>,
    freed: Condvar,
}

impl Budget {
    /// Takes `n` bytes, waiting while they do not fit (a block larger than the whole budget
    /// goes alone).
    fn take(&self, n: usize) {
        let mut used = locks::lock(&self.used);
        while *used > 0 && *used + n > QUEUED_BYTES {
            used = self
                .freed
                .wait(used)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *used += n;
    }

    fn give(&self, n: usize) {
        let mut used = locks::lock(&self.used);
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

/// The queue and the task that drains it.
pub struct EarlyUpload {
    tx: mpsc::UnboundedSender<Found>,
    budget: Arc<Budget>,
    task: JoinHandle<u64>,
}

impl EarlyUpload {
    /// Starts the task, which sends to the store at `addr` what `namespace` lacks.
    pub fn start(store: Store, addr: String, namespace: String, progress: ProgressBar) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget::default());
        let task = tokio::spawn(drain(rx, budget.clone(), store, addr, namespace, progress));
        EarlyUpload { tx, budget, task }
    }

    /// What the scan calls with each block, on its hashing threads (they wait while the queue
    /// is full). Once the task has given up, blocks are dropped: the final pass sends them.
    pub fn sink(&self) -> impl Fn(&Path, u64, &BlockRef, &[u8]) + Send + Sync + 'static {
        let (tx, budget) = (self.tx.clone(), self.budget.clone());
        move |_, _, r, bytes| {
            let Some(hash) = BlockHash::from_slice(&r.hash) else {
                return;
            };
            if tx.is_closed() {
                return;
            }
            budget.take(bytes.len());
            let found = Found {
                hash,
                data: Bytes::copy_from_slice(bytes),
            };
            if tx.send(found).is_err() {
                budget.give(bytes.len());
            }
        }
    }

    /// Waits for the queue to be sent; returns the bytes that crossed the network.
    pub async fn finish(self) -> u64 {
        drop(self.tx);
        self.task.await.unwrap_or(0)
    }
}

async fn drain(
    mut rx: mpsc::UnboundedReceiver<Found>,
    budget: Arc<Budget>,
    store: Store,
    addr: String,
    namespace: String,
    progress: ProgressBar,
) -> u64 {
    let mut sent = 0u64;
    // Blocks already taken: identical files hashed on two threads hand over the same blocks,
    // which must cross the network once.
    let mut seen = std::collections::HashSet::new();
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(f) = next.take() {
            if seen.insert(f.hash) {
                bytes += f.data.len();
                batch.push(f);
            } else {
                budget.give(f.data.len());
            }
            // More only if it is already there; otherwise send what there is.
            if bytes < BATCH_BYTES && batch.len() < BATCH_BLOCKS {
                next = rx.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let sending = send_batch(&store, &addr, &namespace, batch, &progress).await;
        budget.give(bytes);
        match sending {
            Ok(n) => sent += n,
            Err(e) => {
                // The final pass sends what is left, and reports what keeps failing.
                tracing::debug!(error = %e, "sending blocks early failed; they go after the scan");
                rx.close();
                while let Some(f) = rx.recv().await {
                    budget.give(f.data.len());
                }
                break;
            }
        }
    }
    sent
}

/// Asks which blocks of `batch` the store lacks for `namespace` and sends them on one
/// connection; returns the bytes sent.
async fn send_batch(
    store: &Store,
    addr: &str,
    namespace: &str,
    batch: Vec<Found>,
    progress: &ProgressBar,
) -> Result<u64, TransferError> {
    let resp = store
        .missing_blocks(MissingBlocksRequest {
            hashes: batch.iter().map(|f| f.hash.0.to_vec()).collect(),
            namespace: namespace.to_string(),
        })
        .await?;
    let missing: std::collections::HashSet<Vec<u8>> = resp.hashes.into_iter().collect();
    let todo: Vec<Found> = batch
        .into_iter()
        .filter(|f| missing.contains(&f.hash.0[..]))
        .collect();
    if todo.is_empty() {
        return Ok(0);
    }
    let fail = |reason: String| TransferError::Upload {
        addr: addr.to_string(),
        reason,
    };
    let (mut tx, mut rx) = wire::connect(addr, Peer::Store)
        .await
        .map_err(|e| fail(e.to_string()))?;
    tx.ticket(&resp.ticket)
        .await
        .map_err(|e| fail(e.to_string()))?;
    // Sent in order while the answers come back: the store answers in order.
    let hashes: Vec<(BlockHash, u64)> =
        todo.iter().map(|f| (f.hash, f.data.len() as u64)).collect();
    let sender = async move {
        for f in &todo {
            tx.put(&f.hash, &f.data)
                .await
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok::<_, TransferError>(tx)
    };
    let receiver = async {
        let mut sent = 0u64;
        for (hash, len) in &hashes {
            match rx.recv().await {
                Ok(Response::Stored(h)) if h == *hash => {
                    sent += len;
                    progress.inc_length(*len);
                    progress.inc(*len);
                }
                Ok(other) => return Err(fail(format!("unexpected reply {other:?}"))),
                Err(e) => return Err(fail(e.to_string())),
            }
        }
        Ok(sent)
    };
    let (s, r) = tokio::join!(sender, receiver);
    let _tx = s?;
    r
}
