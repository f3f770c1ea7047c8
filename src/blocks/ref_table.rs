//! Where the store's block references are kept (see `refs`): the seam in front of them, and
//! the store's own database behind it.

use std::sync::Arc;

use super::BlockError;
use crate::db::{BatchOp, Db};

/// Which namespace references which block (`scope hash` -> nothing): see `refs`.
pub const CF_BLOCK_REFS: &str = "block_refs";
/// References written in one batch.
const BATCH: usize = 4096;

/// Where a store keeps its references, each a key of 64 bytes (the scope, then the hash) with
/// no value, beside the marker of `refs::COMPLETE`: the store's own database (a single server,
/// [`LocalRefs`]), or the metadata's table of them (`meta::references::TableRefs`), which
/// every replica of a store on etcd reads and writes, so that a block uploaded to any replica
/// counts at the owner's publish and a new owner finds them complete.
pub trait RefTable: Send + Sync {
    fn holds(&self, key: &[u8]) -> Result<bool, BlockError>;
    /// Writes references of uploads: whichever server took them may, a replica that stands
    /// by too (a reference says only that the namespace sent the block).
    fn add(&self, keys: Vec<Vec<u8>>) -> Result<(), BlockError>;
    /// Writes and deletes as the store's owner does (a rebuild, its marker, a collection), in
    /// batches each applied whole.
    fn change(&self, puts: Vec<Vec<u8>>, deletes: Vec<Vec<u8>>) -> Result<(), BlockError>;
    /// Calls `f` with every key, the marker's too.
    fn for_each(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), BlockError>;
}

/// References in the store's own database.
pub struct LocalRefs(pub Db);

impl RefTable for LocalRefs {
    fn holds(&self, key: &[u8]) -> Result<bool, BlockError> {
        Ok(self.0.get(CF_BLOCK_REFS, key)?.is_some())
    }

    fn add(&self, keys: Vec<Vec<u8>>) -> Result<(), BlockError> {
        self.change(keys, Vec::new())
    }

    fn change(&self, puts: Vec<Vec<u8>>, deletes: Vec<Vec<u8>>) -> Result<(), BlockError> {
        let ops: Vec<BatchOp> = puts
            .into_iter()
            .map(|k| BatchOp::Put(CF_BLOCK_REFS, k, Vec::new()))
            .chain(
                deletes
                    .into_iter()
                    .map(|k| BatchOp::Delete(CF_BLOCK_REFS, k)),
            )
            .collect();
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            self.0.write(ops.by_ref().take(BATCH).collect())?;
        }
        Ok(())
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), BlockError> {
        self.0.for_each(CF_BLOCK_REFS, |k, _| {
            f(k);
            Ok(())
        })?;
        Ok(())
    }
}

/// The references of a store in `db`, where no other table holds them.
pub(super) fn local(db: &Db) -> Arc<dyn RefTable> {
    Arc::new(LocalRefs(db.clone()))
}
