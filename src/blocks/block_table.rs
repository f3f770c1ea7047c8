//! Where a store on an object store keeps its small blocks: in the metadata, beside the keys
//! that name them, while the metadata has room (`meta::small_blocks::TableBlocks` behind the
//! seam).
//!
//! Every block of an object store is an object of its own, and a small file's block is a PUT
//! when it is written and a GET when it is read: against a real object store some 10 to 30 ms
//! each, with a test server on this machine 2.5 ms of its CPU, more than the metadata's two
//! transactions for the same file (measured: 2,000 files of 4 KiB through a mount on etcd and
//! s3s-fs, bench/cluster_rows.sh). A block of a few KiB in etcd costs one small write and
//! one read; etcd's quota bounds what it may hold, so blocks go there only while its database
//! stays under a budget, and to the object store after.

use bytes::Bytes;

use super::BlockError;
use crate::hash::BlockHash;

/// The largest block kept in the metadata: a file of a few pages. Larger blocks are few
/// beside their bytes, and an object store moves them at its own speed.
pub const META_BLOCK_MAX: usize = 16 << 10;

/// Blocks by hash, in a table every replica of a store reads and writes.
pub trait BlockTable: Send + Sync {
    /// The block's bytes, if the table holds it.
    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>, BlockError>;
    /// Writes a block (verified against its hash by the caller); any replica may.
    fn put(&self, hash: &BlockHash, data: &[u8]) -> Result<(), BlockError>;
    /// Whether a block of `len` bytes may go in now: small enough, and the metadata under its
    /// budget.
    fn takes(&self, len: usize) -> bool;
    /// Deletes a block, as the store's owner collects one.
    fn remove(&self, hash: &BlockHash) -> Result<(), BlockError>;
    /// Calls `f` with every block's hash and length.
    fn for_each(&self, f: &mut dyn FnMut(BlockHash, usize)) -> Result<(), BlockError>;
}
