//! RocksDB as a metadata engine: one column family, each value stored behind the revision
//! that wrote it, and the last revision under a key of its own, written in the same batch as
//! the writes it numbers. Transactions are checked and written under one lock (one process
//! holds the database), synced before they return.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::seam::{prefix_end, EngineError, Entry, MetaEngine, Page, Revision, Txn, Write};
use crate::db::{BatchOp, Db, DbError};
use crate::locks;

/// The column family the engine keeps everything in.
pub const FAMILY: &str = "engine";

/// Entries live under `DATA`, the last revision under `REVISION`.
const DATA: u8 = b'd';
const REVISION: &[u8] = b"r";

/// Bytes of the revision in front of each value.
const STAMP: usize = 8;

#[derive(Clone)]
pub struct RocksEngine {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    /// Held while a transaction checks its compares and writes.
    writing: Mutex<()>,
    revision: AtomicI64,
}

impl RocksEngine {
    /// The engine in the database at `path`, created if need be.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        Self::on(Db::open(path, &[FAMILY], &[]).map_err(no_space_or_other)?)
    }

    /// The engine in `db`, which must hold the column family [`FAMILY`].
    pub fn on(db: Db) -> Result<Self, EngineError> {
        let revision = match db.get(FAMILY, REVISION).map_err(no_space_or_other)? {
            Some(v) => decode_revision(&v)?,
            None => 0,
        };
        Ok(RocksEngine {
            inner: Arc::new(Inner {
                db,
                writing: Mutex::new(()),
                revision: AtomicI64::new(revision),
            }),
        })
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(EngineError::other)?
    }
}

fn data_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(DATA);
    k.extend_from_slice(key);
    k
}

fn decode_revision(v: &[u8]) -> Result<Revision, EngineError> {
    let bytes: [u8; STAMP] = v
        .get(..STAMP)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| EngineError::Other("a stored revision is shorter than 8 bytes".into()))?;
    Ok(i64::from_be_bytes(bytes))
}

fn decode_entry(key: &[u8], stored: &[u8]) -> Result<Entry, EngineError> {
    Ok(Entry {
        key: key.to_vec(),
        modified: decode_revision(stored)?,
        value: stored[STAMP..].to_vec(),
    })
}

fn stamped(revision: Revision, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(STAMP + value.len());
    v.extend_from_slice(&revision.to_be_bytes());
    v.extend_from_slice(value);
    v
}

fn no_space_or_other(e: DbError) -> EngineError {
    match e.is_no_space() {
        true => EngineError::NoSpace(e.to_string()),
        false => EngineError::other(e),
    }
}

impl Inner {
    fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let stored = self
            .db
            .get(FAMILY, &data_key(key))
            .map_err(no_space_or_other)?;
        stored.map(|v| decode_entry(key, &v)).transpose()
    }

    fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        let revision = self.revision.load(Ordering::SeqCst);
        let from = data_key(match start {
            Some(a) if a > prefix => a,
            _ => prefix,
        });
        let whole = data_key(prefix);
        let mut entries = Vec::new();
        let (mut more, mut failed) = (false, None);
        self.db
            .walk_from(FAMILY, &from, |k, v| {
                if !k.starts_with(&whole) {
                    return false;
                }
                if entries.len() == limit {
                    more = true;
                    return false;
                }
                match decode_entry(&k[1..], v) {
                    Ok(e) => entries.push(e),
                    Err(e) => {
                        failed = Some(e);
                        return false;
                    }
                }
                true
            })
            .map_err(no_space_or_other)?;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Page {
            entries,
            more,
            revision,
        })
    }

    fn txn(&self, txn: Txn) -> Result<Revision, EngineError> {
        txn.check()?;
        let _writing = locks::lock(&self.writing);
        for c in &txn.compares {
            let now = self.get(&c.key)?.map_or(0, |e| e.modified);
            if now != c.modified {
                return Err(EngineError::Conflict);
            }
        }
        let revision = self.revision.load(Ordering::SeqCst) + 1;
        let mut ops: Vec<BatchOp> = txn
            .writes
            .into_iter()
            .map(|w| match w {
                Write::Put { key, value } => {
                    BatchOp::Put(FAMILY, data_key(&key), stamped(revision, &value))
                }
                Write::Delete { key } => BatchOp::Delete(FAMILY, data_key(&key)),
            })
            .collect();
        ops.push(BatchOp::Put(
            FAMILY,
            REVISION.to_vec(),
            revision.to_be_bytes().to_vec(),
        ));
        self.db.write_synced(ops).map_err(no_space_or_other)?;
        self.revision.store(revision, Ordering::SeqCst);
        Ok(revision)
    }

    fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError> {
        let _writing = locks::lock(&self.writing);
        let revision = self.revision.load(Ordering::SeqCst) + 1;
        // Past the data's own range when the prefix is all 0xff (or empty): the revision's
        // key sorts before the data's.
        let to = prefix_end(&data_key(prefix)).unwrap_or_else(|| vec![DATA + 1]);
        let ops = vec![
            BatchOp::DeleteRange(FAMILY, data_key(prefix), to),
            BatchOp::Put(FAMILY, REVISION.to_vec(), revision.to_be_bytes().to_vec()),
        ];
        self.db.write_synced(ops).map_err(no_space_or_other)?;
        self.revision.store(revision, Ordering::SeqCst);
        Ok(revision)
    }
}

#[async_trait::async_trait]
impl MetaEngine for RocksEngine {
    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let key = key.to_vec();
        self.run(move |i| i.get(&key)).await
    }

    async fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        let (prefix, start) = (prefix.to_vec(), start.map(<[u8]>::to_vec));
        self.run(move |i| i.range(&prefix, start.as_deref(), limit))
            .await
    }

    async fn txn(&self, txn: Txn) -> Result<Revision, EngineError> {
        self.run(move |i| i.txn(txn)).await
    }

    async fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError> {
        let prefix = prefix.to_vec();
        self.run(move |i| i.delete_range(&prefix)).await
    }

    async fn revision(&self) -> Result<Revision, EngineError> {
        Ok(self.inner.revision.load(Ordering::SeqCst))
    }
}
