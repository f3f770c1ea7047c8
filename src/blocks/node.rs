//! A node's blocks, as its agent serves them to peers and its mounts read them: the block
//! cache, the files it serves in place, and the blocks it is receiving right now.
//!
//! Blocks are served by hash, only from what this node holds. A block in flight is served once
//! its getter has written and verified it, and a request for one that is expected but not yet
//! here waits for it (up to [`PENDING_WAIT`]) instead of being refused: that is what pipelines
//! a broadcast tree.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::cache::BlockCache;
use super::in_flight::{InFlight, Place, PENDING_WAIT};
use super::in_place::{entry_of, Check, InPlace, InPlaceError, Opener};
use super::pins::Pins;
use super::{BlockError, BlockServe, Pending, Served};
use crate::db::Db;
use crate::hash::subtree::Cv;
use crate::hash::BlockHash;
use crate::manifest::{self, Manifest};
use crate::proto::LocalFile;

/// What this node holds and serves to peers.
pub struct NodeBlocks {
    db: Db,
    cache: Arc<BlockCache>,
    in_place: InPlace,
    in_flight: Arc<InFlight>,
    pins: Pins,
    bytes_served: AtomicU64,
    blocks_served: AtomicU64,
    /// Blocks sent to swarm members at once (the swarm's `DEFAULT_UPLOADS`, for its reasons).
    upload_slots: Arc<tokio::sync::Semaphore>,
}

/// Swarm requests a node serves at once, over every swarm it is in: the board asks it for at
/// most the swarm's `DEFAULT_UPLOADS` per swarm, or its `READER_UPLOADS` for a
/// mount's reader it alone sends to (repeated as a number here because this layer may not
/// depend on the swarm's; a test of the transfer layer keeps this no smaller), so a node may
/// serve four swarms at once before it answers busy.
pub const UPLOAD_SLOTS: usize = 4;

impl NodeBlocks {
    /// The blocks of a node over its database (which holds the cache's and the in-place
    /// families) and its block cache.
    pub fn new(db: Db, cache: BlockCache) -> Self {
        NodeBlocks {
            in_place: InPlace::new(db.clone()),
            db,
            cache: Arc::new(cache),
            in_flight: Arc::default(),
            pins: Pins::default(),
            bytes_served: AtomicU64::new(0),
            blocks_served: AtomicU64::new(0),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(UPLOAD_SLOTS)),
        }
    }

    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    /// The versions open on this node.
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Drops blocks the store collected: no live version holds them, so no one will ask for
    /// them again. Cached ones give their space back; files published or seeded in place are
    /// no longer served. The cache's bytes dropped.
    pub fn drop_collected(&self, hashes: &[BlockHash]) -> Result<u64, BlockError> {
        let mut dropped = 0;
        for h in hashes {
            dropped += self.cache.discard(h)?;
        }
        let forgotten = self.in_place.forget(hashes)?;
        if forgotten > 0 {
            tracing::info!(
                blocks = forgotten,
                "no longer serving collected blocks in place"
            );
        }
        Ok(dropped)
    }

    /// The node's database, for the records that live beside its blocks (a mount's xattrs and
    /// inode journal).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Bytes and blocks served to peers so far.
    pub fn served(&self) -> (u64, u64) {
        (
            self.bytes_served.load(Ordering::Relaxed),
            self.blocks_served.load(Ordering::Relaxed),
        )
    }

    /// Registers files on disk as holding the blocks of `m`, served in place from now on.
    pub fn register(
        &self,
        m: &Manifest,
        files: &[LocalFile],
        check: Check,
        open: Opener<'_>,
    ) -> Result<usize, InPlaceError> {
        self.in_place.register(m, files, check, open)
    }

    /// Registers files a get handed this node as holding `version` (of manifest `m`), and
    /// records them so that the version is withdrawn once one of them is gone
    /// ([`NodeBlocks::sweep_seeds`]). Every block is hashed where it lies but those this agent
    /// hashed there already, serving them while the get ran: in a broadcast most of them, and
    /// hashing them all again at the end held every getter up (about 1 s of a 7.4 s broadcast
    /// of 64 MiB to 32 nodes on two cores).
    pub fn seed(
        &self,
        version: &crate::hash::Version,
        m: &Manifest,
        files: &[LocalFile],
        open: Opener<'_>,
    ) -> Result<usize, InPlaceError> {
        let known = self.in_flight.checked();
        let n = self
            .in_place
            .register_known(m, files, Check::Hashes, &known, open)?;
        self.in_place.record_seed(version, files, open)?;
        Ok(n)
    }

    /// The seeded versions whose files are gone or changed since, a part at a time (see
    /// [`InPlace::sweep_seeds`]).
    pub fn sweep_seeds(
        &self,
        cursor: &[u8],
        max_files: usize,
    ) -> Result<(Vec<crate::hash::Version>, Vec<u8>), InPlaceError> {
        self.in_place.sweep_seeds(cursor, max_files)
    }

    /// Forgets seeded versions the store server was told are gone.
    pub fn forget_seeds(&self, versions: &[crate::hash::Version]) -> Result<(), InPlaceError> {
        self.in_place.forget_seeds(versions)
    }

    /// The block from the cache, a file served in place or a fetch in flight; not counted as
    /// served.
    pub fn find(&self, hash: &BlockHash) -> Result<Option<Bytes>, BlockError> {
        if let Some(v) = self.cache.get(hash)? {
            return Ok(Some(v));
        }
        if let Some(v) = self.in_place.find(hash)? {
            return Ok(Some(v));
        }
        Ok(self.in_flight.read(hash))
    }

    /// Offers the blocks of files being received (entries of `m` at absolute temporary paths):
    /// each is served once marked ready. The offer ends when the returned guard drops.
    pub fn offer(
        &self,
        m: &Manifest,
        files: &[LocalFile],
        open: Opener<'_>,
    ) -> Result<Offered, InPlaceError> {
        let mut expected: HashMap<BlockHash, Vec<Place>> = HashMap::new();
        for f in files {
            let entry = entry_of(m, f)?;
            let file = open(Path::new(&f.disk_path)).map_err(|source| InPlaceError::Disk {
                path: f.disk_path.clone(),
                source,
            })?;
            let file = Arc::new(file);
            let mut offset = 0u64;
            for b in &entry.blocks {
                let hash = manifest::block_hash(b)
                    .ok_or_else(|| InPlaceError::BadHash(entry.path.clone()))?;
                expected.entry(hash).or_default().push(Place {
                    file: file.clone(),
                    offset,
                    len: b.len,
                });
                offset += u64::from(b.len);
            }
        }
        let id = self.in_flight.open(expected);
        Ok(Offered {
            in_flight: self.in_flight.clone(),
            id,
        })
    }
}

/// An offer of blocks in flight; ends however its holder ends, a cancelled call included.
pub struct Offered {
    in_flight: Arc<InFlight>,
    id: u64,
}

impl Offered {
    /// Marks blocks written and verified: they are served from now on. Unknown ones are ignored.
    pub fn ready(&self, hashes: &[BlockHash]) {
        self.in_flight.ready(self.id, hashes);
    }

    /// Marks pieces of a block received in pieces written and verified (see
    /// [`InFlight::ready_pieces`]).
    pub fn ready_pieces(&self, hash: &BlockHash, log2: u8, cvs: &[Cv], indices: &[u32]) {
        self.in_flight
            .ready_pieces(self.id, hash, log2, cvs, indices);
    }
}

impl Drop for Offered {
    fn drop(&mut self) {
        self.in_flight.close(self.id);
    }
}

impl BlockServe for NodeBlocks {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        let got = self.find(hash)?;
        if let Some(b) = &got {
            self.bytes_served
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            self.blocks_served.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got.map(Served::Bytes))
    }

    fn upload_slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        Some(self.upload_slots.clone())
    }

    fn pending(&self, hash: &BlockHash) -> Option<Pending> {
        if !self.in_flight.pending(hash) {
            return None;
        }
        let (in_flight, hash) = (self.in_flight.clone(), *hash);
        Some(Box::pin(async move {
            in_flight.wait(&hash, PENDING_WAIT).await;
        }))
    }

    fn put(&self, _hash: &BlockHash, _data: Bytes) -> Result<(), BlockError> {
        Err(BlockError::NoUploads)
    }

    fn piece(
        &self,
        hash: &BlockHash,
        log2: u8,
        index: u32,
    ) -> Result<Option<crate::hash::subtree::Piece>, BlockError> {
        let got = self.in_flight.read_piece(hash, log2, index);
        if let Some(p) = &got {
            self.bytes_served
                .fetch_add(p.data.len() as u64, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn read_range(
        &self,
        hash: &BlockHash,
        start: u64,
        len: usize,
    ) -> Result<Option<Bytes>, BlockError> {
        let got = self.in_place.read_range(hash, start, len);
        if let Some(b) = &got {
            self.bytes_served
                .fetch_add(b.len() as u64, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn piece_pending(&self, hash: &BlockHash, log2: u8, index: u32) -> Option<Pending> {
        if !self.in_flight.pending(hash) {
            return None;
        }
        let (in_flight, hash) = (self.in_flight.clone(), *hash);
        Some(Box::pin(async move {
            in_flight.wait_piece(&hash, log2, index, PENDING_WAIT).await;
        }))
    }
}
