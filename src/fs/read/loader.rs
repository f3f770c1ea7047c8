//! The read path: blocks for the mount, from this node first and from the nearest source next.
//!
//! A block is looked up in a small set of hot blocks in memory (a 1 MiB FUSE read touches the
//! same 4 MiB block four times), then in what the agent holds (its cache and its in-place
//! files), and only then fetched along the file's [`Route`]: the sources its broadcast window
//! assigns (a new one when one fails, as for `kt get`), then every source of the version.
//! Fetches are shared: a block being fetched is waited for, not fetched twice. Sequential reads
//! start fetching the next blocks in the background so that throughput is not bounded by round
//! trips. Fetched blocks are verified, go into the block cache, and from there are served to
//! peers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::watch;

use crate::blocks::node::NodeBlocks;
use crate::broadcast::member::membership::{self, Membership};
use crate::dataplane::fetch::{self, BlockJob, BlockSink};
use crate::dataplane::{SourceAddr, TransferError};
use crate::fs::error::FsError;
use crate::hash::BlockHash;
use crate::locks::lock;

/// Blocks kept in memory for reads that land in the same block again.
const HOT_BLOCKS: usize = 16;

type Waiters = Arc<Mutex<HashMap<BlockHash, watch::Sender<bool>>>>;

/// Where a file's blocks come from.
#[derive(Clone, Default)]
pub struct Route {
    /// The reader's place in the version's window, when it joined one.
    pub member: Option<Arc<Membership>>,
    /// Every source of the version, nearest first.
    pub fallback: Vec<SourceAddr>,
    /// This node's label: its own blocks were looked at before any fetch.
    pub own: String,
}

impl Route {
    async fn fetch(
        &self,
        jobs: Vec<BlockJob>,
        sink: Arc<dyn BlockSink>,
    ) -> Result<fetch::FetchReport, TransferError> {
        let progress = ProgressBar::hidden();
        match &self.member {
            Some(m) => {
                membership::fetch_through(m, jobs, sink, &self.fallback, &self.own, &progress)
                    .await?
                    .complete(self.fallback.is_empty())
            }
            None => fetch::fetch(jobs, sink, &self.fallback, &progress).await,
        }
    }
}

/// Recently used blocks, newest last.
#[derive(Default)]
struct Hot(Mutex<VecDeque<(BlockHash, Bytes)>>);

impl Hot {
    fn get(&self, h: &BlockHash) -> Option<Bytes> {
        let hot = lock(&self.0);
        hot.iter().find(|(k, _)| k == h).map(|(_, b)| b.clone())
    }

    fn put(&self, h: BlockHash, b: Bytes) {
        let mut hot = lock(&self.0);
        if hot.iter().any(|(k, _)| *k == h) {
            return;
        }
        if hot.len() >= HOT_BLOCKS {
            hot.pop_front();
        }
        hot.push_back((h, b));
    }
}

pub struct Loader {
    blocks: Arc<NodeBlocks>,
    hot: Arc<Hot>,
    inflight: Waiters,
}

/// Verified blocks go into the cache and the hot set, and whoever waits for them is woken.
struct CacheSink {
    blocks: Arc<NodeBlocks>,
    hot: Arc<Hot>,
    waiters: Waiters,
}

impl BlockSink for CacheSink {
    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        // The cache write comes first, though the reader could go on without it: it is what
        // holds the fetches back when the disk is slower than the network (waking the reader
        // first let a cold read queue most of a 1 GiB file in memory).
        match self.blocks.cache().insert(&job.hash, data) {
            Ok(()) => {}
            // Not even evicting made room (the disk is full of other things): this node keeps
            // no copy, and the reader still gets its block.
            Err(e) if e.is_no_space() => {
                tracing::warn!(block = %job.hash, error = %e, "not cached: the disk is full");
            }
            Err(e) => {
                return Err(TransferError::Write {
                    path: "block cache".into(),
                    source: std::io::Error::other(e),
                })
            }
        }
        // The reader that waits for this block takes it from memory, not back from disk.
        self.hot.put(job.hash, data.clone());
        if let Some(tx) = lock(&self.waiters).get(&job.hash) {
            let _ = tx.send(true);
        }
        Ok(())
    }
}

impl Loader {
    pub fn new(blocks: Arc<NodeBlocks>) -> Self {
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
        let (blocks, hot) = (self.blocks.clone(), self.hot.clone());
        tokio::task::spawn_blocking(move || find_kept(&blocks, &hot, h)).await?
    }

    /// The block if this node holds it, looked for on the calling thread, which may block (a
    /// FUSE thread): a cached small file's read then costs one lookup, without a hop to the
    /// runtime's blocking pool and back.
    pub fn held(&self, job: &BlockJob) -> Result<Option<Bytes>, FsError> {
        find_kept(&self.blocks, &self.hot, job.hash)?
            .map(|b| of_manifest_length(job, b))
            .transpose()
    }

    /// Starts fetching the jobs that are neither here nor on their way; returns at once.
    /// `on_fetched` runs if any block came over the network.
    pub fn prefetch(
        &self,
        jobs: Vec<BlockJob>,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) {
        let mut todo = Vec::new();
        {
            let mut w = lock(&self.inflight);
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
        let route = route.clone();
        tokio::spawn(async move {
            let hashes: Vec<BlockHash> = todo.iter().map(|j| j.hash).collect();
            let r = route.fetch(todo, sink).await;
            match r {
                Ok(report) if report.bytes() > 0 => on_fetched(),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "block fetch failed"),
            }
            // Dropping the senders wakes whoever still waits; they find the block or an error.
            let mut w = lock(&waiters);
            for h in hashes {
                w.remove(&h);
            }
        });
    }

    /// A block that came with its file's resolve: verified, then kept like a fetched one.
    pub fn accept(&self, hash: BlockHash, data: Bytes) -> Result<(), FsError> {
        if BlockHash::of(&data) != hash {
            return Err(FsError::BadInline(hash));
        }
        match self.blocks.cache().insert(&hash, &data) {
            Err(e) if e.is_no_space() => {
                tracing::warn!(block = %hash, error = %e, "not cached: the disk is full");
            }
            r => r?,
        }
        self.hot.put(hash, data);
        Ok(())
    }

    /// One block, from here or fetched, verified, of the length the manifest gives it.
    pub async fn block(
        &self,
        job: &BlockJob,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        let b = self.block_by_hash(job, route, on_fetched).await?;
        of_manifest_length(job, b)
    }

    async fn block_by_hash(
        &self,
        job: &BlockJob,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        if let Some(b) = self.local(job.hash).await? {
            return Ok(b);
        }
        self.prefetch(vec![job.clone()], route, on_fetched);
        let rx = lock(&self.inflight).get(&job.hash).map(|tx| tx.subscribe());
        if let Some(mut rx) = rx {
            while !*rx.borrow_and_update() {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }
        self.local(job.hash)
            .await?
            .ok_or(FsError::Unavailable(job.hash))
    }
}

/// Block `h` from the hot set, or from this node's blocks (a lookup that may block), then
/// kept hot.
fn find_kept(blocks: &NodeBlocks, hot: &Hot, h: BlockHash) -> Result<Option<Bytes>, FsError> {
    if let Some(b) = hot.get(&h) {
        return Ok(Some(b));
    }
    let found = blocks.find(&h)?;
    if let Some(b) = &found {
        hot.put(h, b.clone());
    }
    Ok(found)
}

/// What this node holds is found by hash alone, and its hash is right: a length that differs
/// from the manifest's is the manifest's lie, which no other source can mend.
fn of_manifest_length(job: &BlockJob, b: Bytes) -> Result<Bytes, FsError> {
    if b.len() != job.len as usize {
        return Err(FsError::BadManifest(format!(
            "block {} is {} bytes, the manifest says {}",
            job.hash,
            b.len(),
            job.len
        )));
    }
    Ok(b)
}
