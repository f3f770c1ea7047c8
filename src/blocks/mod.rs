//! Blocks by hash: what the store and each node hold, and how they serve them.
//!
//! A block is served only from what the server holds ([`BlockServe`]): the store's files and
//! database ([`store`]), a node's cache ([`cache`]), the files it published or fetched, served
//! in place ([`in_place`]), and the blocks it is receiving right now ([`in_flight`]); [`node`]
//! puts a node's three together. Large blocks live in files named by hash ([`files`]), written
//! in pieces ([`pieces`]); a store on an object store keeps its small blocks in the metadata
//! ([`block_table`]); which namespace may name which of the store's blocks in [`refs`]; what garbage collection must keep is noted in [`touched`], and the
//! versions a node has open in [`pins`]. Everything here is below the transfers and the filesystem, and knows
//! nothing of either.

pub mod pieces;

#[cfg(feature = "daemons")]
pub mod block_table;
#[cfg(feature = "daemons")]
pub mod cache;
#[cfg(feature = "daemons")]
pub mod files;
#[cfg(feature = "daemons")]
pub mod in_flight;
#[cfg(feature = "daemons")]
pub mod in_place;
#[cfg(feature = "daemons")]
pub mod node;
#[cfg(feature = "daemons")]
pub mod pins;
#[cfg(feature = "daemons")]
pub mod ref_table;
#[cfg(feature = "daemons")]
pub mod refs;
#[cfg(feature = "daemons")]
pub mod store;
#[cfg(feature = "daemons")]
pub mod touched;

use std::sync::Arc;

use bytes::Bytes;

use crate::hash::{BlockHash, Scope};

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[cfg(feature = "daemons")]
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("block files in {dir}: {source}")]
    Files {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("this peer takes no uploads")]
    NoUploads,
    #[cfg(feature = "daemons")]
    #[error(transparent)]
    Objects(#[from] crate::objects::ObjectError),
    /// The namespaces' references, where the metadata keeps them (cluster mode); `no_space`
    /// where its engine is full.
    #[error("block references: {source}")]
    References {
        no_space: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The small blocks the metadata keeps (cluster mode); `no_space` where its engine is
    /// full.
    #[error("small blocks in the metadata: {source}")]
    InMeta {
        no_space: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BlockError {
    /// The disk's own error, if the failure was one (a full disk, say).
    pub fn io(&self) -> Option<&std::io::Error> {
        match self {
            BlockError::Files { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether the disk is full, in the files or in the database.
    pub fn is_no_space(&self) -> bool {
        match self {
            BlockError::Files { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            #[cfg(feature = "daemons")]
            BlockError::Db(e) => e.is_no_space(),
            BlockError::NoUploads => false,
            #[cfg(feature = "daemons")]
            BlockError::Objects(_) => false,
            BlockError::References { no_space, .. } | BlockError::InMeta { no_space, .. } => {
                *no_space
            }
        }
    }
}

/// A block as a server holds it.
pub enum Served {
    Bytes(Bytes),
    /// The whole of a file of this length, sent straight from the page cache (sendfile).
    File(std::fs::File, u64),
}

/// What a data-plane server serves. Calls block (disk, RocksDB); the server runs them off the
/// async threads.
pub trait BlockServe: Send + Sync + 'static {
    /// The block, or `None` if this peer does not hold it. Bytes in memory must match `hash`;
    /// a file is what was stored under `hash` (its reader verifies it, as every reader does).
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError>;
    /// Stores a block. Peers that take no uploads refuse.
    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), BlockError>;
    /// Stores a block uploaded under upload tickets of `scopes` (the namespaces it is uploaded
    /// for): the store records it as referenced by each. Others store it as [`BlockServe::put`].
    fn put_for(&self, hash: &BlockHash, data: Bytes, _scopes: &[Scope]) -> Result<(), BlockError> {
        self.put(hash, data)
    }
    /// For a block this peer does not hold yet but is receiving: resolves once it may have
    /// arrived, so that a child in a broadcast tree is answered as soon as its parent has it.
    fn pending(&self, _hash: &BlockHash) -> Option<Pending> {
        None
    }
    /// The upload slots swarm requests share: a swarm request that finds none free is answered
    /// "busy" at once, so that its member asks another holder. `None`: no limit (the store,
    /// whose swarm fetches the server grants a few at a time already).
    fn upload_slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        None
    }
    /// Piece `index` of a block this peer does not hold whole but is receiving in pieces of
    /// `2^log2` bytes, checked against the block's values, if it is here.
    fn piece(
        &self,
        _hash: &BlockHash,
        _log2: u8,
        _index: u32,
    ) -> Result<Option<crate::hash::subtree::Piece>, BlockError> {
        Ok(None)
    }
    /// `len` bytes from `start` of a block this peer holds whole, where it can read them alone
    /// (`None`: read the block whole). Unchecked: the caller checks them (a piece against its
    /// chaining value).
    fn read_range(
        &self,
        _hash: &BlockHash,
        _start: u64,
        _len: usize,
    ) -> Result<Option<Bytes>, BlockError> {
        Ok(None)
    }
    /// For such a piece not here yet: resolves once it may have arrived.
    fn piece_pending(&self, _hash: &BlockHash, _log2: u8, _index: u32) -> Option<Pending> {
        None
    }
}

/// See [`BlockServe::pending`].
pub type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
