//! The read path: blocks for the mount, from this node first and from the nearest source next.
//!
//! A block is looked up in a small set of hot blocks in memory (a 1 MiB FUSE read touches the
//! same 4 MiB block four times), then in what the agent holds (its cache and its in-place
//! files), and only then fetched. Fetches are shared: a block being fetched is waited for, not
//! fetched twice. Sequential reads start fetching the next blocks in the background so that
//! throughput is not bounded by round trips. Fetched blocks are verified, go into the block
//! cache, and from there are served to peers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::watch;

use super::FsError;
use crate::agent::AgentBlocks;
use crate::hash::BlockHash;
use crate::transfer::{self, BlockJob, BlockSink, SourceAddr, TransferError};

/// Blocks kept in memory for reads that land in the same block again.
const HOT_BLOCKS: usize = 16;

type Waiters = Arc<Mutex<HashMap<BlockHash, watch::Sender<bool>>>>;

/// Recently used blocks, newest last.
#[derive(Default)]
struct Hot(Mutex<VecDeque<(BlockHash, Bytes)>>);

impl Hot {
    fn get(&self, h: &BlockHash) -> Option<Bytes> {
        let hot = self.0.lock().ok()?;
        hot.iter().find(|(k, _)| k == h).map(|(_, b)| b.clone())
    }

    fn put(&self, h: BlockHash, b: Bytes) {
        if let Ok(mut hot) = self.0.lock() {
            if hot.iter().any(|(k, _)| *k == h) {
                return;
            }
            if hot.len() >= HOT_BLOCKS {
                hot.pop_front();
            }
            hot.push_back((h, b));
        }
    }
}

pub struct Loader {
    blocks: Arc<AgentBlocks>,
    hot: Arc<Hot>,
    inflight: Waiters,
}

/// Verified blocks go into the cache and the hot set, and whoever waits for them is woken.
struct CacheSink {
    blocks: Arc<AgentBlocks>,
    hot: Arc<Hot>,
    waiters: Waiters,
}

impl BlockSink for CacheSink {
    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        // The cache write comes first, though the reader could go on without it: it is what
        // holds the fetches back when the disk is slower than the network (waking the reader
        // first let a cold read queue most of a 1 GiB file in memory).
        self.blocks
            .cache()
            .insert(&job.hash, data)
            .map_err(|e| TransferError::Write {
                path: "block cache".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
        // The reader that waits for this block takes it from memory, not back from disk.
        self.hot.put(job.hash, data.clone());
        if let Ok(w) = self.waiters.lock() {
            if let Some(tx) = w.get(&job.hash) {
                let _ = tx.send(true);
            }
        }
        Ok(())
    }
}

impl Loader {
    pub fn new(blocks: Arc<AgentBlocks>) -> Self {
        Loader {
            blocks,
            hot: Arc::new(Hot::default()),
            inflight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    async fn local(&self, h: BlockHash) -> Result<Option<Bytes>, FsError> {
        if let Some(b) = self.hot.get(&h) {
            return Ok(Some(b));
        }
        let blocks = self.blocks.clone();
        let found = tokio::task::spawn_blocking(move || blocks.find(&h))
            .await
            .map_err(|e| FsError::Other(e.to_string()))?
            .map_err(FsError::Other)?;
        if let Some(b) = &found {
            self.hot.put(h, b.clone());
        }
        Ok(found)
    }

    /// Starts fetching the jobs that are neither here nor on their way; returns at once.
    /// `fetched` learns whether any block came over the network.
    pub fn prefetch(
        &self,
        jobs: Vec<BlockJob>,
        sources: &[SourceAddr],
        on_fetched: impl FnOnce() + Send + 'static,
    ) {
        let mut todo = Vec::new();
        if let Ok(mut w) = self.inflight.lock() {
            for j in jobs {
                if w.contains_key(&j.hash) || self.blocks.cache().contains(&j.hash) {
                    continue;
                }
                w.insert(j.hash, watch::channel(false).0);
                todo.push(j);
            }
        }
        if todo.is_empty() {
            return;
        }
        let sink = Arc::new(CacheSink {
            blocks: self.blocks.clone(),
            hot: self.hot.clone(),
            waiters: self.inflight.clone(),
        });
        let waiters = self.inflight.clone();
        let sources = sources.to_vec();
        tokio::spawn(async move {
            let hashes: Vec<BlockHash> = todo.iter().map(|j| j.hash).collect();
            let r = transfer::fetch(todo, sink, &sources, &ProgressBar::hidden()).await;
            match r {
                Ok(report) if report.bytes() > 0 => on_fetched(),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "block fetch failed"),
            }
            // Dropping the senders wakes whoever still waits; they find the block or an error.
            if let Ok(mut w) = waiters.lock() {
                for h in hashes {
                    w.remove(&h);
                }
            }
        });
    }

    /// A block that came with its file's resolve: verified, then kept like a fetched one.
    pub fn accept(&self, hash: BlockHash, data: Bytes) -> Result<(), FsError> {
        if BlockHash::of(&data) != hash {
            return Err(FsError::Io(
                libc::EIO,
                format!("inline block {hash} does not match its hash"),
            ));
        }
        self.blocks
            .cache()
            .insert(&hash, &data)
            .map_err(|e| FsError::Io(libc::EIO, e.to_string()))?;
        self.hot.put(hash, data);
        Ok(())
    }

    /// One block, from here or fetched, verified.
    pub async fn block(
        &self,
        job: &BlockJob,
        sources: &[SourceAddr],
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        if let Some(b) = self.local(job.hash).await? {
            return Ok(b);
        }
        self.prefetch(vec![job.clone()], sources, on_fetched);
        let rx = self
            .inflight
            .lock()
            .ok()
            .and_then(|w| w.get(&job.hash).map(|tx| tx.subscribe()));
        if let Some(mut rx) = rx {
            while !*rx.borrow_and_update() {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }
        self.local(job.hash).await?.ok_or_else(|| {
            FsError::Io(
                libc::EIO,
                format!("block {} is unavailable from every source", job.hash),
            )
        })
    }
}
