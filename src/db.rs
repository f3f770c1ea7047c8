//! The one place that knows RocksDB.
//!
//! Each stored kind names its column family; everything above this file sees `get`, `put`,
//! `delete`, prefix scans and atomic batches, never the raw database.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, DB};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database at {path}: {source}")]
    Open {
        path: String,
        source: rocksdb::Error,
    },
    #[error("database: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("database has no column family {0}")]
    NoFamily(&'static str),
    #[error("a lock was poisoned by a panic")]
    Poisoned,
}

pub type KeyValue = (Vec<u8>, Vec<u8>);

/// A RocksDB database opened with a fixed set of column families.
#[derive(Clone)]
pub struct Db {
    inner: Arc<DB>,
}

/// Values at least this large go to blob files, out of the LSM tree, so 4 MiB blocks are not
/// rewritten by every compaction.
const MIN_BLOB_SIZE: u64 = 64 * 1024;

impl Db {
    /// Opens (creating if needed) a database with the given families. `blob_families` hold large
    /// values (blocks) and are stored with RocksDB's integrated blob files.
    pub fn open(
        path: &Path,
        families: &[&'static str],
        blob_families: &[&'static str],
    ) -> Result<Self, DbError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        // Families are flushed together, so writes made without the WAL (the block cache) are
        // lost together in a crash and never leave one family ahead of another.
        opts.set_atomic_flush(true);
        let cfs = families.iter().map(|name| {
            let mut cf_opts = Options::default();
            if blob_families.contains(name) {
                cf_opts.set_enable_blob_files(true);
                cf_opts.set_min_blob_size(MIN_BLOB_SIZE);
                cf_opts.set_blob_file_size(256 << 20);
                cf_opts.set_enable_blob_gc(true);
                // Memtables of large values are flushed soon; memory stays small.
                cf_opts.set_write_buffer_size(32 << 20);
                cf_opts.set_max_write_buffer_number(2);
            }
            ColumnFamilyDescriptor::new(*name, cf_opts)
        });
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|source| DbError::Open {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Db {
            inner: Arc::new(db),
        })
    }

    fn cf(&self, family: &'static str) -> Result<&rocksdb::ColumnFamily, DbError> {
        self.inner
            .cf_handle(family)
            .ok_or(DbError::NoFamily(family))
    }

    pub fn get(&self, family: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, DbError> {
        Ok(self.inner.get_cf(self.cf(family)?, key)?)
    }

    /// Like [`Db::get`] without RocksDB's own checksum check: for blocks whose readers verify
    /// their blake3 hash anyway, where the check doubled the store server's CPU per byte served.
    pub fn get_unverified(
        &self,
        family: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, DbError> {
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_verify_checksums(false);
        Ok(self.inner.get_cf_opt(self.cf(family)?, key, &opts)?)
    }

    pub fn contains(&self, family: &'static str, key: &[u8]) -> Result<bool, DbError> {
        let cf = self.cf(family)?;
        if !self.inner.key_may_exist_cf(cf, key) {
            return Ok(false);
        }
        Ok(self.inner.get_pinned_cf(cf, key)?.is_some())
    }

    pub fn put(&self, family: &'static str, key: &[u8], value: &[u8]) -> Result<(), DbError> {
        Ok(self.inner.put_cf(self.cf(family)?, key, value)?)
    }

    pub fn delete(&self, family: &'static str, key: &[u8]) -> Result<(), DbError> {
        Ok(self.inner.delete_cf(self.cf(family)?, key)?)
    }

    /// All `(key, value)` pairs whose key starts with `prefix`, in key order.
    pub fn scan_prefix(
        &self,
        family: &'static str,
        prefix: &[u8],
    ) -> Result<Vec<KeyValue>, DbError> {
        let mut out = Vec::new();
        let iter = self.inner.iterator_cf(
            self.cf(family)?,
            IteratorMode::From(prefix, Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// Applies puts and deletes atomically: readers see all of them or none.
    pub fn write(&self, ops: Vec<BatchOp>) -> Result<(), DbError> {
        Ok(self.inner.write(self.batch(ops)?)?)
    }

    /// Like [`Db::write`] but without the write-ahead log: for data that may be lost in a crash
    /// (a cache) and is written whole or not at all. Saves writing every byte twice.
    pub fn write_volatile(&self, ops: Vec<BatchOp>) -> Result<(), DbError> {
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        Ok(self.inner.write_opt(self.batch(ops)?, &wo)?)
    }

    fn batch(&self, ops: Vec<BatchOp>) -> Result<WriteBatch, DbError> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                BatchOp::Put(family, k, v) => batch.put_cf(self.cf(family)?, k, v),
                BatchOp::Delete(family, k) => batch.delete_cf(self.cf(family)?, k),
            }
        }
        Ok(batch)
    }

    /// Flushes memtables so a crash right after loses nothing already acknowledged twice over.
    pub fn flush(&self) -> Result<(), DbError> {
        Ok(self.inner.flush()?)
    }
}

pub enum BatchOp {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_and_prefix_scans() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), &["a", "b"], &["b"]).unwrap();
        db.write(vec![
            BatchOp::Put("a", b"x/1".to_vec(), b"one".to_vec()),
            BatchOp::Put("a", b"x/2".to_vec(), b"two".to_vec()),
            BatchOp::Put("a", b"y/1".to_vec(), b"three".to_vec()),
            BatchOp::Put("b", b"big".to_vec(), vec![7u8; 100_000]),
        ])
        .unwrap();
        let xs = db.scan_prefix("a", b"x/").unwrap();
        assert_eq!(xs.len(), 2);
        assert_eq!(xs[1].1, b"two");
        assert!(db.contains("b", b"big").unwrap());
        assert!(!db.contains("b", b"small").unwrap());
        drop(db);
        let db = Db::open(dir.path(), &["a", "b"], &["b"]).unwrap();
        assert_eq!(db.get("b", b"big").unwrap().unwrap().len(), 100_000);
    }
}
