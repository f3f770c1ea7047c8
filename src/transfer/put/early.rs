//! Sending blocks while the scan still hashes later ones. The scan hands each block it cuts to
//! a bounded queue; a task takes them in batches, asks the store which it lacks and sends
//! those, one connection a batch, while the hashing threads go on. The queue holds a few
//! blocks, so memory stays bounded whatever the size of the put: a store slower than the disk
//! holds the hashing back.
//!
//! Used for a put with nothing to send a delta against (a new key): blocks that replace blocks
//! of an earlier version go after the scan, as deltas (`upload_missing_for`). Whatever this
//! misses (a failed batch, a dead connection), that final pass sends: it asks again and finds
//! the rest missing.

use std::path::Path;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::dataplane::error::TransferError;
use crate::dataplane::wire::{self, Peer, Response};
use crate::hash::BlockHash;
use crate::manifest::BlockRef;
use crate::proto::MissingBlocksRequest;
use crate::rpc::Store;

/// Blocks waiting in the queue at most (with the default block size, about 16 MiB).
const QUEUED: usize = 4;

/// A batch closes at this many bytes or [`BATCH_BLOCKS`] blocks, or when the queue is empty.
const BATCH_BYTES: usize = 32 << 20;
const BATCH_BLOCKS: usize = 64;

struct Found {
    hash: BlockHash,
    data: Bytes,
}

/// The queue and the task that drains it.
pub struct EarlyUpload {
    tx: mpsc::Sender<Found>,
    task: JoinHandle<u64>,
}

impl EarlyUpload {
    /// Starts the task, which sends to the store at `addr` what `namespace` lacks.
    pub fn start(store: Store, addr: String, namespace: String, progress: ProgressBar) -> Self {
        let (tx, rx) = mpsc::channel(QUEUED);
        let task = tokio::spawn(drain(rx, store, addr, namespace, progress));
        EarlyUpload { tx, task }
    }

    /// What the scan calls with each block, on its hashing threads (they wait while the queue
    /// is full). Once the task has given up, blocks are dropped: the final pass sends them.
    pub fn sink(&self) -> impl Fn(&Path, u64, &BlockRef, &[u8]) + Send + Sync + 'static {
        let tx = self.tx.clone();
        move |_, _, r, bytes| {
            let Some(hash) = BlockHash::from_slice(&r.hash) else {
                return;
            };
            let _ = tx.blocking_send(Found {
                hash,
                data: Bytes::copy_from_slice(bytes),
            });
        }
    }

    /// Waits for the queue to be sent; returns the bytes that crossed the network.
    pub async fn finish(self) -> u64 {
        drop(self.tx);
        self.task.await.unwrap_or(0)
    }
}

async fn drain(
    mut rx: mpsc::Receiver<Found>,
    store: Store,
    addr: String,
    namespace: String,
    progress: ProgressBar,
) -> u64 {
    let mut sent = 0u64;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let mut bytes = batch[0].data.len();
        while bytes < BATCH_BYTES && batch.len() < BATCH_BLOCKS {
            // More only if it is already there; otherwise send what there is.
            match rx.try_recv() {
                Ok(f) => {
                    bytes += f.data.len();
                    batch.push(f);
                }
                Err(_) => break,
            }
        }
        match send_batch(&store, &addr, &namespace, batch, &progress).await {
            Ok(n) => sent += n,
            Err(e) => {
                // The final pass sends what is left, and reports what keeps failing.
                tracing::debug!(error = %e, "sending blocks early failed; they go after the scan");
                rx.close();
                while rx.recv().await.is_some() {}
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

#[cfg(all(test, feature = "daemons"))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::auth::Credential;
    use crate::server::StoreServerProcess;

    async fn lacks(store: &Store, hash: &BlockHash) -> bool {
        let resp = store
            .missing_blocks(MissingBlocksRequest {
                hashes: vec![hash.0.to_vec()],
                namespace: "default".into(),
            })
            .await
            .unwrap();
        !resp.hashes.is_empty()
    }

    /// A block handed over is in the store before the queue is closed: sent while the scan
    /// goes on, not after it. A block the store holds is not sent again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocks_reach_the_store_while_the_scan_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let srv = StoreServerProcess::bind("127.0.0.116:0", dir.path(), Duration::from_secs(30))
            .await
            .unwrap();
        let addr = srv.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(srv.run(async move {
            let _ = stopped.await;
        }));
        let store = crate::rpc::client::connect_store(&addr, &Credential::none())
            .await
            .unwrap();
        let early = EarlyUpload::start(
            store.clone(),
            addr.clone(),
            "default".into(),
            ProgressBar::hidden(),
        );
        let sink = early.sink();
        let blocks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 3 << 20]).collect();
        let refs: Vec<BlockRef> = blocks
            .iter()
            .map(|b| BlockRef {
                hash: BlockHash::of(b).0.to_vec(),
                len: b.len() as u32,
            })
            .collect();
        let first = BlockHash::of(&blocks[0]);
        assert!(lacks(&store, &first).await);
        // The scan's threads are blocking ones.
        let (b0, r0) = (blocks[0].clone(), refs[0].clone());
        let sink = tokio::task::spawn_blocking(move || {
            sink(Path::new("a"), 0, &r0, &b0);
            sink
        })
        .await
        .unwrap();
        let mut waited = 0;
        while lacks(&store, &first).await {
            assert!(
                waited < 200,
                "the block did not arrive before the scan ended"
            );
            waited += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The rest, one of them a block the store already holds.
        let rest: Vec<(BlockRef, Vec<u8>)> = vec![
            (refs[1].clone(), blocks[1].clone()),
            (refs[0].clone(), blocks[0].clone()),
            (refs[2].clone(), blocks[2].clone()),
        ];
        tokio::task::spawn_blocking(move || {
            for (r, b) in rest {
                sink(Path::new("a"), 0, &r, &b);
            }
        })
        .await
        .unwrap();
        let sent = early.finish().await;
        assert_eq!(sent, 3 * (3 << 20));
        for b in &blocks {
            assert!(!lacks(&store, &BlockHash::of(b)).await);
        }
        let _ = stop.send(());
        served.await.unwrap().unwrap();
    }
}
