//! The store server's metadata store: what it holds (the backend, the commit queue, the node
//! leases, what garbage collection keeps and took) and its construction. Its methods live in
//! the files of their concern: reads of the stored state (`reads`), publishing (`publish`),
//! lookups and listings (`resolve`, `list`), changes of names and attributes (`names`,
//! `attrs`), nodes and locations (`locations`), GPU keys (`gpu`) and collection (`gc`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::backend::MetaBackend;
use super::collected::Collected;
use super::commit::{CommitStats, Commits, Ticket};
use super::error::MetaError;
use super::nodes::NodeLeases;
use crate::blocks::store::StoreBlocks;
use crate::blocks::touched::Touched;
use crate::clock::SharedClock;
use crate::hash::Version;
use crate::locks;

/// The metadata of one store server, on a [`MetaBackend`], with the node leases in memory.
pub struct MetaStore {
    pub(super) backend: Box<dyn MetaBackend>,
    pub(super) blocks: Arc<StoreBlocks>,
    /// Serialises the planning of publish, remove and every other change, which check and
    /// then write.
    pub(super) write_lock: Mutex<()>,
    /// Changes planned and waiting to be durable.
    pub(super) commits: Commits,
    pub(super) nodes: NodeLeases,
    pub(super) clock: SharedClock,
    /// Versions written lately, which garbage collection keeps.
    pub(super) touched: Touched<Version>,
    /// Blocks garbage collection took, which nodes learn of to drop them from their caches.
    pub(super) collected: Collected,
    /// Moves whenever a change edits a hard-linked file's inode record: every name of the
    /// file changed then, and those names are not listed anywhere the change could name them.
    pub(super) inode_changes: AtomicU64,
    /// Whether a namespace names in its publishes only the blocks it references (see
    /// `crate::blocks::refs`): on where callers are authenticated.
    pub(super) separate_namespaces: AtomicBool,
    /// How long garbage collection keeps what it found dead before deleting it, in ms (0: it
    /// deletes at once).
    gc_grace_ms: AtomicU64,
}

/// A number for this run of the server, different from the last one's: the time it started.
fn run_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

impl MetaStore {
    pub fn new(
        backend: impl MetaBackend,
        blocks: Arc<StoreBlocks>,
        lease: Duration,
        clock: SharedClock,
    ) -> Self {
        MetaStore {
            backend: Box::new(backend),
            blocks,
            write_lock: Mutex::new(()),
            commits: Commits::default(),
            nodes: NodeLeases::new(lease, clock.clone()),
            clock,
            touched: Touched::default(),
            collected: Collected::new(run_epoch()),
            inode_changes: Default::default(),
            separate_namespaces: AtomicBool::new(false),
            gc_grace_ms: AtomicU64::new(0),
        }
    }

    /// Keeps what collection finds dead for `grace` before deleting it (`graveyard`): a backup
    /// of the metadata no older than that restores to keys whose blocks exist.
    pub fn set_gc_grace(&self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.gc_grace_ms.store(ms, Ordering::SeqCst);
    }

    pub(super) fn gc_grace_ms(&self) -> u64 {
        self.gc_grace_ms.load(Ordering::SeqCst)
    }

    /// Keeps the node leases in `shared` too, where every replica of the store sees them.
    pub fn sharing_nodes(mut self, shared: std::sync::Arc<dyn super::nodes::SharedNodes>) -> Self {
        self.nodes.share(shared);
        self
    }

    /// How many changes edited a hard-linked file's inode record so far: a watcher told of a
    /// change that moved it is told that everything changed.
    pub fn inode_changes(&self) -> u64 {
        self.inode_changes.load(Ordering::SeqCst)
    }

    /// The store's blocks, which a publish of `locale=store` needs.
    pub fn blocks(&self) -> &Arc<StoreBlocks> {
        &self.blocks
    }

    pub(super) fn now_ms(&self) -> i64 {
        self.clock.now().unix_ms
    }

    pub(crate) fn clock_now(&self) -> crate::clock::Moment {
        self.clock.now()
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), MetaError> {
        Ok(self.backend.flush()?)
    }

    /// Whether the metadata's engine and the blocks' place answer now.
    pub fn check(&self) -> Result<(), MetaError> {
        self.backend.check()?;
        Ok(self.blocks.check()?)
    }

    /// The state of queued commits.
    pub fn commit_stats(&self) -> CommitStats {
        self.commits.stats()
    }

    /// The shards this replica writes changed (one gained, handed over or lost): the changes
    /// planned so far are decided first (stored, or refused where their shard went), and what
    /// the planner remembered is forgotten, as another replica may have written a namespace
    /// it now writes.
    pub fn shards_moved(&self) {
        let _write = self.lock();
        self.commits.drain(self.backend.as_ref());
        self.commits.forget_reads();
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        locks::lock(&self.write_lock)
    }

    /// Returns once the change of `ticket` is durable (or failed). Waiting for the last of
    /// several queued changes makes all of them durable, in one sync where they were queued
    /// together.
    pub fn wait(&self, ticket: Ticket) -> Result<(), MetaError> {
        Ok(self.commits.wait(ticket, self.backend.as_ref())?)
    }
}
