//! The seam under the metadata: five tables (keys, manifests, locations, path attributes, inodes) with gets, prefix
//! scans and atomic batches of writes, and nothing else. RocksDB is the backend today (its
//! implementation is below, beside the trait, which itself knows nothing of RocksDB); a
//! distributed KV such as etcd can take its place behind the same trait, never a home-made
//! consensus.

use std::sync::Arc;

pub use crate::db::Step;
use crate::db::{BatchOp, Db};

/// A table of the metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// `namespace NUL key` -> `KeyRecord`.
    Keys,
    /// version -> `Manifest`.
    Manifests,
    /// `version node-id` -> nothing: a node that holds the version.
    Locations,
    /// `namespace NUL path` -> `PathAttrs`: what a path shows beyond its manifest entry.
    Attrs,
    /// `namespace NUL id` -> `KeyRecord`: a hard-linked file, which its names point to.
    Inodes,
    /// `stamp number` -> what garbage collection buried then (`meta::graveyard`).
    Graveyard,
    /// `scope hash` -> nothing: a namespace references a block (`blocks::refs`). Any replica
    /// of a store writes them (the one that took the upload), not the owner alone.
    BlockRefs,
    /// hash -> bytes: a small block of a store whose blocks are in an object store
    /// (`blocks::block_table`). Any replica writes them, as the references.
    Blocks,
}

/// One write of an atomic batch.
#[derive(Clone, Debug)]
pub enum Op {
    Put(Table, Vec<u8>, Vec<u8>),
    Delete(Table, Vec<u8>),
}

pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What [`MetaBackend::for_each`] calls with each entry; an error stops the walk.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), BackendError> + 'a;

#[derive(Debug, thiserror::Error)]
#[error("metadata backend: {0}")]
pub struct BackendError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

pub trait MetaBackend: Send + Sync + 'static {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, BackendError>;
    /// Calls `f` with every entry of `table` in key order, one at a time: a whole table need
    /// not fit in memory (garbage collection reads every manifest).
    fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError>;
    /// Calls `f` with the entries whose key starts with `prefix`, in key order, going on as
    /// it says: to the next, past every key that begins as this one does, or nowhere.
    fn walk_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError> {
        self.walk_from(table, prefix, (prefix, None), f)
    }
    /// As [`MetaBackend::walk_prefix`] over a span `(from, to)`: from the first key at or
    /// after `from` (a page of a listing starts where the last one ended, without reading
    /// what came before) and, where `to` is given, before it (an engine that counts a range
    /// to answer part of it is asked for no more than the span).
    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError>;
    /// Applies every op or none.
    fn write(&self, ops: Vec<Op>) -> Result<(), BackendError>;
    /// Applies every op or none, and returns once they would survive a power loss.
    fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError>;
    /// Makes every write so far durable.
    fn flush(&self) -> Result<(), BackendError>;
    /// Makes `changes` durable, each all or nothing, in order: group commit's batch. One synced
    /// batch here; an engine whose transactions are bounded packs them into as few as fit.
    fn commit(&self, changes: Vec<Vec<Op>>) -> Result<(), BackendError> {
        self.write_synced(changes.concat())
    }
    /// Applies `ops` as a write any replica may make, the owner or one standing by: entries
    /// that hold whoever writes them (a namespace's reference to a block it uploaded). Each
    /// op on its own; durable when it returns.
    fn write_shared(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        self.write_synced(ops)
    }
    /// Whether the backend answers now (a remote engine's one request); a local one always
    /// does. A store server is ready while it does.
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }
    /// How many bytes the backend's engine takes where a quota bounds it (etcd's), `None`
    /// where nothing does.
    fn stored_bytes(&self) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }
    /// The values at `gets`, and whether `below` (a table and a prefix) holds any entry: in
    /// one request where the engine can ([`MetaEngine::read_many`]).
    ///
    /// [`MetaEngine::read_many`]: super::engine::MetaEngine::read_many
    fn read_many(&self, gets: &[(Table, Vec<u8>)], below: Option<(Table, &[u8])>) -> ReadMany {
        read_each(self, gets, below)
    }
}

/// What [`MetaBackend::read_many`] answers: each value, and whether anything lies below.
pub type ReadMany = Result<(Vec<Option<Vec<u8>>>, bool), BackendError>;

/// [`MetaBackend::read_many`] as one read after another.
pub fn read_each<B: MetaBackend + ?Sized>(
    backend: &B,
    gets: &[(Table, Vec<u8>)],
    below: Option<(Table, &[u8])>,
) -> ReadMany {
    let values = gets
        .iter()
        .map(|(t, k)| backend.get(*t, k))
        .collect::<Result<Vec<_>, _>>()?;
    let mut any = false;
    if let Some((t, p)) = below {
        backend.walk_prefix(t, p, &mut |_, _| {
            any = true;
            Step::Stop
        })?;
    }
    Ok((values, any))
}

/// A boxed backend is one (the store server picks its backend where it starts), and so is a
/// shared one (a replica's references reach the tables the metadata writes).
macro_rules! forward_backend {
    ($ptr:ident) => {
        impl<T: MetaBackend + ?Sized> MetaBackend for $ptr<T> {
            fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
                (**self).get(table, key)
            }

            fn scan_prefix(
                &self,
                table: Table,
                prefix: &[u8],
            ) -> Result<Vec<KeyValue>, BackendError> {
                (**self).scan_prefix(table, prefix)
            }

            fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError> {
                (**self).for_each(table, f)
            }

            fn walk_from(
                &self,
                table: Table,
                prefix: &[u8],
                span: (&[u8], Option<&[u8]>),
                f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
            ) -> Result<(), BackendError> {
                (**self).walk_from(table, prefix, span, f)
            }

            fn write(&self, ops: Vec<Op>) -> Result<(), BackendError> {
                (**self).write(ops)
            }

            fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError> {
                (**self).write_synced(ops)
            }

            fn write_shared(&self, ops: Vec<Op>) -> Result<(), BackendError> {
                (**self).write_shared(ops)
            }

            fn flush(&self) -> Result<(), BackendError> {
                (**self).flush()
            }

            fn commit(&self, changes: Vec<Vec<Op>>) -> Result<(), BackendError> {
                (**self).commit(changes)
            }

            fn check(&self) -> Result<(), BackendError> {
                (**self).check()
            }

            fn stored_bytes(&self) -> Result<Option<u64>, BackendError> {
                (**self).stored_bytes()
            }

            fn read_many(
                &self,
                gets: &[(Table, Vec<u8>)],
                below: Option<(Table, &[u8])>,
            ) -> ReadMany {
                (**self).read_many(gets, below)
            }
        }
    };
}
forward_backend!(Box);
forward_backend!(Arc);

pub const CF_KEYS: &str = "keys";
pub const CF_MANIFESTS: &str = "manifests";
pub const CF_LOCATIONS: &str = "locations";
pub const CF_ATTRS: &str = "attrs";
pub const CF_FILE_INODES: &str = "file_inodes";
pub const CF_GRAVEYARD: &str = "graveyard";
/// The column families the RocksDB backend needs.
pub const FAMILIES: &[&str] = &[
    CF_KEYS,
    CF_MANIFESTS,
    CF_LOCATIONS,
    CF_ATTRS,
    CF_FILE_INODES,
    CF_GRAVEYARD,
];

fn family(t: Table) -> &'static str {
    match t {
        Table::Keys => CF_KEYS,
        Table::Manifests => CF_MANIFESTS,
        Table::Locations => CF_LOCATIONS,
        Table::Attrs => CF_ATTRS,
        Table::Inodes => CF_FILE_INODES,
        Table::Graveyard => CF_GRAVEYARD,
        // Beside the blocks, in the same database (`blocks::store::FAMILIES`).
        Table::BlockRefs => crate::blocks::store::CF_BLOCK_REFS,
        Table::Blocks => crate::blocks::store::CF_BLOCKS,
    }
}

fn batch_ops(ops: Vec<Op>) -> Vec<BatchOp> {
    ops.into_iter()
        .map(|op| match op {
            Op::Put(t, k, v) => BatchOp::Put(family(t), k, v),
            Op::Delete(t, k) => BatchOp::Delete(family(t), k),
        })
        .collect()
}

fn err(e: crate::db::DbError) -> BackendError {
    BackendError(Box::new(e))
}

/// RocksDB: one column family per table.
impl MetaBackend for Db {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Db::get(self, family(table), key).map_err(err)
    }

    fn scan_prefix(&self, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, BackendError> {
        Db::scan_prefix(self, family(table), prefix).map_err(err)
    }

    fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError> {
        // The callback's own error travels through the database's error type and back.
        let mut failed = None;
        let r = Db::for_each(self, family(table), |k, v| {
            f(k, v).map_err(|e| {
                failed = Some(e);
                crate::db::DbError::NoFamily("stopped by the caller")
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        r.map_err(err)
    }

    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError> {
        Db::walk_prefix_from(self, family(table), prefix, span, f).map_err(err)
    }

    fn write(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        Db::write(self, batch_ops(ops)).map_err(err)
    }

    fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        Db::write_synced(self, batch_ops(ops)).map_err(err)
    }

    fn flush(&self) -> Result<(), BackendError> {
        Db::flush(self).map_err(err)
    }
}
