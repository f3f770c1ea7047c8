//! The read path: blocks for the mount, from this node first and from the nearest source next.
//!
//! A block is looked for in a small set of hot blocks in memory (a 1 MiB FUSE read touches the
//! same 4 MiB block four times), then, once, in what the agent holds (its cache and its
//! in-place files: [`Loader::held`]), and only then fetched along the file's [`Route`]: the
//! sources its broadcast window assigns (a new one when one fails, as for `kt get`), then every
//! source of the version. The reader that found a block missing fetches it in its own task and
//! gets the verified bytes back from the fetch ([`Loader::fetch`]); a reader that wants a block
//! already being fetched waits for that fetch, which hands it the same bytes. Neither looks
//! the block up again. Sequential reads start fetching the next blocks in the background
//! ([`Loader::prefetch`]) so that throughput is not bounded by round trips. Fetched blocks
//! are verified, go into the block cache and the hot set, and from there are served to peers.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::watch;

use crate::blocks::node::NodeBlocks;
use crate::broadcast::member::membership::{self, Membership};
use crate::dataplane::fetch::{self, BlockJob, BlockSink};
use crate::dataplane::peers::Peers;
use crate::dataplane::{SourceAddr, TransferError};
use crate::fs::error::FsError;
use crate::hash::BlockHash;
use crate::locks::lock;

/// Blocks kept in memory for reads that land in the same block again.
const HOT_BLOCKS: usize = 16;

/// Blocks being fetched, each with what its waiters are told: its bytes, once verified. A
/// fetch that ends without them drops its sender, which wakes the waiters too.
type Inflight = Arc<Mutex<HashMap<BlockHash, watch::Sender<Option<Bytes>>>>>;

/// Where a file's blocks come from.
#[derive(Clone, Default)]
pub struct Route {
    /// The reader's place in the version's window, when it joined one.
    pub member: Option<Arc<Membership>>,
    /// Every source of the version, nearest first.
    pub fallback: Vec<SourceAddr>,
    /// This node's label: its own blocks were looked at before any fetch.
    pub own: String,
    /// How the reader reaches its sources.
    pub peers: Peers,
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
            None => fetch::fetch(&self.peers, jobs, sink, &self.fallback, &progress).await,
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
    inflight: Inflight,
    /// Where fetches ahead of a reader run (a read may start them from a mount's thread).
    rt: tokio::runtime::Handle,
    /// Lookups in what this node holds, for this mount's reads.
    lookups: AtomicU64,
}

/// Verified blocks go into the cache and the hot set, and whoever waits for them is handed
/// them; the fetching reader takes its own from `got`.
struct CacheSink {
    blocks: Arc<NodeBlocks>,
    hot: Arc<Hot>,
    inflight: Inflight,
    /// The bytes of each block put, kept for the reader that fetched them (`None` for a
    /// fetch ahead, whose blocks no one waits for yet).
    got: Option<Mutex<HashMap<BlockHash, Bytes>>>,
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
        self.hot.put(job.hash, data.clone());
        if let Some(got) = &self.got {
            lock(got).insert(job.hash, data.clone());
        }
        if let Some(tx) = lock(&self.inflight).get(&job.hash) {
            tx.send_replace(Some(data.clone()));
        }
        Ok(())
    }
}

impl Loader {
    pub fn new(blocks: Arc<NodeBlocks>, rt: tokio::runtime::Handle) -> Self {
        Loader {
            blocks,
            hot: Arc::new(Hot::default()),
            inflight: Arc::default(),
            rt,
            lookups: AtomicU64::new(0),
        }
    }

    /// How many times this mount's reads looked for a block in what this node holds.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    fn looked(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        crate::metrics::MOUNT_BLOCK_LOOKUPS.inc();
    }

    /// The block if this node holds it: the hot set, then one lookup in the node's blocks
    /// (which may block: call it where blocking is fine, a mount's thread). A block being
    /// fetched is not looked for: [`Loader::fetch`] waits for it.
    pub fn held(&self, job: &BlockJob) -> Result<Option<Bytes>, FsError> {
        let found = match self.hot.get(&job.hash) {
            Some(b) => Some(b),
            None if lock(&self.inflight).contains_key(&job.hash) => None,
            None => {
                self.looked();
                let found = self.blocks.find(&job.hash)?;
                if let Some(b) = &found {
                    self.hot.put(job.hash, b.clone());
                }
                found
            }
        };
        found.map(|b| of_manifest_length(job, b)).transpose()
    }

    /// One block, from here or fetched: [`Loader::held`], then [`Loader::fetch`].
    pub async fn block(
        &self,
        job: &BlockJob,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        match self.held(job)? {
            Some(b) => Ok(b),
            None => self.fetch(job, route, on_fetched).await,
        }
    }

    /// A block this node did not hold when [`Loader::held`] looked: fetched along `route` in
    /// the caller's task, or, when a fetch of it is under way, waited for. Its verified bytes
    /// come back from the fetch, of the length the manifest gives it. `on_fetched` runs if it
    /// came over the network.
    pub async fn fetch(
        &self,
        job: &BlockJob,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        let waiting = {
            let mut inflight = lock(&self.inflight);
            match inflight.get(&job.hash) {
                Some(tx) => Some(tx.subscribe()),
                None => {
                    inflight.insert(job.hash, watch::channel(None).0);
                    None
                }
            }
        };
        if let Some(mut rx) = waiting {
            // Sent before the fetch lets go of the block: a fetch that ends without it failed.
            let got = rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|b| b.clone());
            return match got.or_else(|| self.hot.get(&job.hash)) {
                Some(b) => of_manifest_length(job, b),
                None => Err(FsError::Unavailable(job.hash)),
            };
        }
        // A fetch that ended between the caller's look and this one left the block hot.
        let got = match self.hot.get(&job.hash) {
            Some(b) => Ok(b),
            None => self.fetch_now(job, route, on_fetched).await,
        };
        lock(&self.inflight).remove(&job.hash);
        of_manifest_length(job, got?)
    }

    async fn fetch_now(
        &self,
        job: &BlockJob,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, FsError> {
        let sink = Arc::new(CacheSink {
            blocks: self.blocks.clone(),
            hot: self.hot.clone(),
            inflight: self.inflight.clone(),
            got: Some(Mutex::default()),
        });
        match route.fetch(vec![job.clone()], sink.clone()).await {
            Ok(report) if report.bytes() > 0 => on_fetched(),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "block fetch failed"),
        }
        let got = sink.got.as_ref().and_then(|g| lock(g).remove(&job.hash));
        got.ok_or(FsError::Unavailable(job.hash))
    }

    /// Starts fetching, in the background, the jobs that are neither here nor on their way;
    /// returns at once. `on_fetched` runs if any block came over the network.
    pub fn prefetch(
        &self,
        jobs: Vec<BlockJob>,
        route: &Route,
        on_fetched: impl FnOnce() + Send + 'static,
    ) {
        let mut todo = Vec::new();
        for j in jobs {
            if lock(&self.inflight).contains_key(&j.hash) || self.hot.get(&j.hash).is_some() {
                continue;
            }
            self.looked();
            if self.blocks.cache().contains(&j.hash) {
                continue;
            }
            let mut inflight = lock(&self.inflight);
            if inflight.contains_key(&j.hash) {
                continue;
            }
            inflight.insert(j.hash, watch::channel(None).0);
            todo.push(j);
        }
        if todo.is_empty() {
            return;
        }
        let sink = Arc::new(CacheSink {
            blocks: self.blocks.clone(),
            hot: self.hot.clone(),
            inflight: self.inflight.clone(),
            got: None,
        });
        let inflight = self.inflight.clone();
        let route = route.clone();
        self.rt.spawn(async move {
            let hashes: Vec<BlockHash> = todo.iter().map(|j| j.hash).collect();
            match route.fetch(todo, sink).await {
                Ok(report) if report.bytes() > 0 => on_fetched(),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "block fetch failed"),
            }
            // Dropping the senders wakes whoever still waits: what they wait for failed.
            let mut w = lock(&inflight);
            for h in hashes {
                w.remove(&h);
            }
        });
    }

    /// A block that came with its file's resolve (a small file's bytes): verified, then kept
    /// like a fetched one, unless this node holds it already.
    pub fn accept(&self, hash: BlockHash, data: Bytes) -> Result<(), FsError> {
        if self.hot.get(&hash).is_some() {
            return Ok(());
        }
        self.looked();
        if self.blocks.cache().contains(&hash) {
            return Ok(());
        }
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
