//! The one place that knows RocksDB.
//!
//! Each stored kind names its column family; everything above this file sees `get`, `put`,
//! `delete`, prefix scans and atomic batches, never the raw database.
//!
//! A write that fails for want of space leaves RocksDB in a background error that refuses every
//! later write, and the C API of the pinned RocksDB has no `resume`: once space has returned,
//! the next write closes the database and opens it again (see [`Db::recover`]), so a server
//! recovers from a full disk without a restart.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
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
    #[error("database closed after a full disk, and not open again yet: No space left on device")]
    Closed,
}

pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Where a walk over a prefix goes after an entry (see [`Db::walk_prefix`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Next,
    /// Past every key that begins as this one's first `n` bytes do.
    Past(usize),
    Stop,
}

/// The first key after every key that begins with `prefix` (`None`: nothing comes after).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let end = prefix.iter().rposition(|&b| b != u8::MAX)?;
    let mut after = prefix[..=end].to_vec();
    after[end] += 1;
    Some(after)
}

/// A RocksDB database opened with a fixed set of column families.
#[derive(Clone)]
pub struct Db {
    shared: Arc<Shared>,
}

struct Shared {
    /// `None` only between closing a failed database and opening it again.
    db: RwLock<Option<Arc<DB>>>,
    /// A write failed for want of space: the database refuses writes until reopened.
    failed: AtomicBool,
    path: PathBuf,
    families: Vec<&'static str>,
    blob_families: Vec<&'static str>,
}

/// Free bytes a reopen waits for: less, and it would fail again at once.
const REOPEN_FREE: u64 = 1 << 20;
/// How long a reopen waits for the operations still using the failed database.
const REOPEN_PATIENCE: Duration = Duration::from_secs(5);

impl DbError {
    /// Whether the disk is full (RocksDB says so only in its message).
    pub fn is_no_space(&self) -> bool {
        let text = match self {
            DbError::Open { source, .. } | DbError::Rocks(source) => source.to_string(),
            DbError::NoFamily(_) => return false,
            DbError::Closed => return true,
        };
        text.contains("No space left on device") || text.contains("NoSpace")
    }
}

fn free_bytes(path: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Values at least this large go to blob files, out of the LSM tree, so 4 MiB blocks are not
/// rewritten by every compaction.
const MIN_BLOB_SIZE: u64 = 64 * 1024;
/// Blob files of this size: 64 blocks of 4 MiB, so that a file whose blocks are all deleted is
/// dropped whole and soon.
const BLOB_FILE_SIZE: u64 = 256 << 20;

impl Db {
    /// Opens (creating if needed) a database with the given families. `blob_families` hold large
    /// values (blocks) and are stored with RocksDB's integrated blob files.
    pub fn open(
        path: &Path,
        families: &[&'static str],
        blob_families: &[&'static str],
    ) -> Result<Self, DbError> {
        let db = Self::open_raw(path, families, blob_families)?;
        Ok(Db {
            shared: Arc::new(Shared {
                db: RwLock::new(Some(Arc::new(db))),
                failed: AtomicBool::new(false),
                path: path.to_path_buf(),
                families: families.to_vec(),
                blob_families: blob_families.to_vec(),
            }),
        })
    }

    fn open_raw(
        path: &Path,
        families: &[&'static str],
        blob_families: &[&'static str],
    ) -> Result<DB, DbError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        // RocksDB's own log (LOG in the database's directory) only at open: Debian's RocksDB 7.8
        // is built with its assertions, and a log line written after an earlier one failed (a
        // full disk) aborts the process, as the store server did when its disk filled. The
        // error that follows a failed write is ours to report (`DbError`, in our log).
        opts.set_log_level(rocksdb::LogLevel::Fatal);
        // Families are flushed together, so writes made without the WAL (the block cache) are
        // lost together in a crash and never leave one family ahead of another.
        opts.set_atomic_flush(true);
        let cfs = families.iter().map(|name| {
            let mut cf_opts = Options::default();
            if blob_families.contains(name) {
                cf_opts.set_enable_blob_files(true);
                cf_opts.set_min_blob_size(MIN_BLOB_SIZE);
                cf_opts.set_blob_file_size(BLOB_FILE_SIZE);
                // RocksDB's age-based blob GC relocates every live blob of the oldest files at each
                // compaction, garbage or not: measured, it wrote every cached byte a second time
                // and took a third of the mount's CPU on a cold read. Space is reclaimed on
                // demand instead (`Db::reclaim_blobs`).
                cf_opts.set_enable_blob_gc(false);
                // Memtables of large values are flushed soon; memory stays small.
                cf_opts.set_write_buffer_size(32 << 20);
                cf_opts.set_max_write_buffer_number(2);
            }
            ColumnFamilyDescriptor::new(*name, cf_opts)
        });
        DB::open_cf_descriptors(&opts, path, cfs).map_err(|source| DbError::Open {
            path: path.display().to_string(),
            source,
        })
    }

    /// The database now (reopened first if a write failed for want of space and space has
    /// returned).
    fn db(&self) -> Result<Arc<DB>, DbError> {
        if self.shared.failed.load(Ordering::Acquire) {
            self.recover();
        }
        if let Some(db) = crate::locks::read(&self.shared.db).as_ref() {
            return Ok(db.clone());
        }
        self.recover();
        crate::locks::read(&self.shared.db)
            .clone()
            .ok_or(DbError::Closed)
    }

    /// Notes a failed write: one for want of space makes the next use reopen the database.
    fn check<T>(&self, r: Result<T, rocksdb::Error>) -> Result<T, DbError> {
        r.map_err(|e| {
            let e = DbError::Rocks(e);
            if e.is_no_space() {
                self.shared.failed.store(true, Ordering::Release);
            }
            e
        })
    }

    /// Closes and reopens a database whose writes failed for want of space, once there is
    /// space again. What was acknowledged is in its WAL and comes back with it.
    fn recover(&self) {
        let s = &self.shared;
        if free_bytes(&s.path).is_some_and(|f| f < REOPEN_FREE) {
            return;
        }
        let mut slot = crate::locks::write(&s.db);
        if !s.failed.load(Ordering::Acquire) && slot.is_some() {
            return;
        }
        if let Some(old) = slot.take() {
            // RocksDB's lock file allows one open database: the old one must close first, and
            // it closes when the last operation using it lets go.
            let since = Instant::now();
            let mut old = Some(old);
            while let Some(db) = old.take() {
                match Arc::try_unwrap(db) {
                    Ok(db) => drop(db),
                    Err(db) if since.elapsed() < REOPEN_PATIENCE => {
                        old = Some(db);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(db) => {
                        tracing::warn!("the database is still in use; reopening it later");
                        *slot = Some(db);
                        return;
                    }
                }
            }
        }
        match Self::open_raw(&s.path, &s.families, &s.blob_families) {
            Ok(db) => {
                tracing::info!(path = %s.path.display(), "database reopened after a full disk");
                *slot = Some(Arc::new(db));
                s.failed.store(false, Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reopening the database failed; trying again later")
            }
        }
    }

    pub fn get(&self, family: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, DbError> {
        let db = self.db()?;
        Ok(db.get_cf(cf(&db, family)?, key)?)
    }

    /// Like [`Db::get`] without RocksDB's own checksum check: for blocks whose readers verify
    /// their blake3 hash anyway, where the check doubled the store server's CPU per byte served.
    /// The value is copied once out of RocksDB's buffer (a plain get copies it twice).
    pub fn get_unverified(
        &self,
        family: &'static str,
        key: &[u8],
    ) -> Result<Option<Bytes>, DbError> {
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_verify_checksums(false);
        let db = self.db()?;
        let pinned = db.get_pinned_cf_opt(cf(&db, family)?, key, &opts)?;
        Ok(pinned.map(|v| Bytes::copy_from_slice(&v)))
    }

    /// Whether `key` is there. It reads the value: for a family of blob-file values keep an
    /// index family and ask that (see `meta::CF_BLOCK_INDEX`).
    pub fn contains(&self, family: &'static str, key: &[u8]) -> Result<bool, DbError> {
        let db = self.db()?;
        let cf = cf(&db, family)?;
        if !db.key_may_exist_cf(cf, key) {
            return Ok(false);
        }
        let found = db.get_pinned_cf(cf, key)?.is_some();
        Ok(found)
    }

    pub fn put(&self, family: &'static str, key: &[u8], value: &[u8]) -> Result<(), DbError> {
        let db = self.db()?;
        self.check(db.put_cf(cf(&db, family)?, key, value))
    }

    pub fn delete(&self, family: &'static str, key: &[u8]) -> Result<(), DbError> {
        let db = self.db()?;
        self.check(db.delete_cf(cf(&db, family)?, key))
    }

    pub fn is_empty(&self, family: &'static str) -> Result<bool, DbError> {
        let db = self.db()?;
        let mut iter = db.raw_iterator_cf(cf(&db, family)?);
        iter.seek_to_first();
        iter.status()?;
        Ok(!iter.valid())
    }

    /// Calls `f` on every pair of `family` in key order, one at a time (a family of blocks does
    /// not fit in memory).
    pub fn for_each(
        &self,
        family: &'static str,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), DbError>,
    ) -> Result<(), DbError> {
        let db = self.db()?;
        for item in db.iterator_cf(cf(&db, family)?, IteratorMode::Start) {
            let (k, v) = item?;
            f(&k, &v)?;
        }
        Ok(())
    }

    /// Calls `f` on the pairs of `family` from the first key at or after `from`, in key order,
    /// while it returns true.
    pub fn walk_from(
        &self,
        family: &'static str,
        from: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), DbError> {
        let db = self.db()?;
        let mut it = db.raw_iterator_cf(cf(&db, family)?);
        it.seek(from);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !f(k, v) {
                break;
            }
            it.next();
        }
        it.status()?;
        Ok(())
    }

    /// All `(key, value)` pairs whose key starts with `prefix`, in key order.
    pub fn scan_prefix(
        &self,
        family: &'static str,
        prefix: &[u8],
    ) -> Result<Vec<KeyValue>, DbError> {
        let mut out = Vec::new();
        let db = self.db()?;
        let iter = db.iterator_cf(
            cf(&db, family)?,
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

    /// Calls `f` on the pairs of `family` whose key starts with `prefix`, in key order, and
    /// goes on as it says: an existence check reads one entry, not all of them, and a listing
    /// of one level jumps over what lies deeper.
    pub fn walk_prefix(
        &self,
        family: &'static str,
        prefix: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), DbError> {
        self.walk_prefix_from(family, prefix, (prefix, None), f)
    }

    /// As [`Db::walk_prefix`] over a span: from the first key at or after `span.0`, and
    /// before `span.1` where given (a page of a listing).
    pub fn walk_prefix_from(
        &self,
        family: &'static str,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        mut f: impl FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), DbError> {
        let db = self.db()?;
        let mut it = db.raw_iterator_cf(cf(&db, family)?);
        it.seek(span.0.max(prefix));
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(prefix) || span.1.is_some_and(|to| k >= to) {
                break;
            }
            match f(k, v) {
                Step::Next => it.next(),
                Step::Stop => break,
                Step::Past(n) => match successor(k.get(..n).unwrap_or(k)) {
                    Some(after) => it.seek(after),
                    None => break,
                },
            }
        }
        it.status()?;
        Ok(())
    }

    /// Applies puts and deletes atomically: readers see all of them or none.
    pub fn write(&self, ops: Vec<BatchOp>) -> Result<(), DbError> {
        let db = self.db()?;
        self.check(db.write(batch(&db, ops)?))
    }

    /// Like [`Db::write`], and returns only once the write-ahead log is on stable storage (an
    /// fsync): the batch survives a power loss, and so does every write made before it, which
    /// share the one log.
    pub fn write_synced(&self, ops: Vec<BatchOp>) -> Result<(), DbError> {
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        let db = self.db()?;
        self.check(db.write_opt(batch(&db, ops)?, &wo))
    }

    /// Like [`Db::write`] but without the write-ahead log: for data that may be lost in a crash
    /// (a cache) and is written whole or not at all. Saves writing every byte twice.
    pub fn write_volatile(&self, ops: Vec<BatchOp>) -> Result<(), DbError> {
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        let db = self.db()?;
        self.check(db.write_opt(batch(&db, ops)?, &wo))
    }

    /// [`Db::write_volatile`] for puts of borrowed values, so a 4 MiB block is not copied into
    /// an owned buffer only to be copied again into the batch.
    pub fn put_volatile(&self, puts: &[(&'static str, &[u8], &[u8])]) -> Result<(), DbError> {
        let db = self.db()?;
        let mut batch = WriteBatch::default();
        for (family, k, v) in puts {
            batch.put_cf(cf(&db, family)?, k, v);
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        self.check(db.write_opt(batch, &wo))
    }

    /// Bytes of `family`'s blob files on disk, deleted values included.
    pub fn blob_file_bytes(&self, family: &'static str) -> Result<u64, DbError> {
        let db = self.db()?;
        Ok(db
            .property_int_value_cf(cf(&db, family)?, "rocksdb.live-blob-file-size")?
            .unwrap_or(0))
    }

    /// Reclaims the space of deleted values in the oldest `share` (0..=1) of `family`'s blob
    /// files: a full compaction that relocates what is still live in them and drops them. Costs a
    /// rewrite of those live values, so callers run it when the garbage is worth it, not on every
    /// delete.
    pub fn reclaim_blobs(&self, family: &'static str, share: f64) -> Result<(), DbError> {
        let db = self.db()?;
        let cf = cf(&db, family)?;
        let cutoff = format!("{:.3}", share.clamp(0.0, 1.0));
        db.set_options_cf(
            cf,
            &[
                ("enable_blob_garbage_collection", "true"),
                ("blob_garbage_collection_age_cutoff", cutoff.as_str()),
            ],
        )?;
        let mut opts = rocksdb::CompactOptions::default();
        opts.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        db.compact_range_cf_opt(cf, None::<&[u8]>, None::<&[u8]>, &opts);
        db.set_options_cf(cf, &[("enable_blob_garbage_collection", "false")])?;
        Ok(())
    }

    /// Flushes memtables so a crash right after loses nothing already acknowledged twice over.
    pub fn flush(&self) -> Result<(), DbError> {
        let db = self.db()?;
        self.check(db.flush())
    }

    /// Flushes one family's memtable: what was written to it without the WAL is then on disk.
    pub fn flush_family(&self, family: &'static str) -> Result<(), DbError> {
        let db = self.db()?;
        self.check(db.flush_cf(cf(&db, family)?))
    }
}

fn cf<'a>(db: &'a DB, family: &'static str) -> Result<&'a rocksdb::ColumnFamily, DbError> {
    db.cf_handle(family).ok_or(DbError::NoFamily(family))
}

fn batch(db: &DB, ops: Vec<BatchOp>) -> Result<WriteBatch, DbError> {
    let mut batch = WriteBatch::default();
    for op in ops {
        match op {
            BatchOp::Put(family, k, v) => batch.put_cf(cf(db, family)?, k, v),
            BatchOp::Delete(family, k) => batch.delete_cf(cf(db, family)?, k),
            BatchOp::DeleteRange(family, from, to) => {
                batch.delete_range_cf(cf(db, family)?, from, to)
            }
        }
    }
    Ok(batch)
}

pub enum BatchOp {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    /// Every key from the first (included) to the second (excluded).
    DeleteRange(&'static str, Vec<u8>, Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_on_a_full_disk_is_an_error_not_an_abort_and_the_database_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let disk = test_support::Tmpfs::mount(&dir.path().join("disk"), 16);
        let db = Db::open(&disk.0.join("db"), &["a"], &[]).unwrap();
        // Something only the memtable holds: the reopen below closes a database with work
        // left for a flush.
        db.write_volatile(vec![BatchOp::Put("a", b"v".to_vec(), b"x".to_vec())])
            .unwrap();
        let filler = disk.fill("filler");
        let failed = (0..10_000)
            .find_map(|i| db.put("a", format!("k{i}").as_bytes(), &[7u8; 100]).err())
            .expect("a logged write fails on the full disk");
        assert!(failed.is_no_space(), "{failed}");
        // RocksDB logs such a failure to its own log, on the same full disk: with that log on,
        // the write aborted the process instead. A flush says the disk is full too.
        for e in [db.flush_family("a").unwrap_err(), db.flush().unwrap_err()] {
            assert!(e.is_no_space(), "{e}");
        }
        // Space returns: the database opens again and takes writes.
        std::fs::remove_file(&filler).unwrap();
        db.put("a", b"after", b"1").unwrap();
        assert_eq!(db.get("a", b"after").unwrap().as_deref(), Some(&b"1"[..]));
        db.flush_family("a").unwrap();
    }

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
        assert_eq!(
            db.get_unverified("b", b"big").unwrap().unwrap(),
            vec![7u8; 100_000]
        );
    }

    #[test]
    fn a_walk_jumps_past_what_begins_alike_and_stops_where_told() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), &["a"], &[]).unwrap();
        let keys: &[&[u8]] = &[
            b"d/a",
            b"d/b/1",
            b"d/b/2",
            b"d/b0",
            b"d/c\xff",
            b"d/c\xff\xff/x",
            b"d/d",
            b"e",
        ];
        let ops = keys
            .iter()
            .map(|k| BatchOp::Put("a", k.to_vec(), Vec::new()))
            .collect();
        db.write(ops).unwrap();
        let mut seen = Vec::new();
        db.walk_prefix("a", b"d/", |k, _| {
            seen.push(k.to_vec());
            // Past a name's insides, as a listing of one level goes.
            match k[2..].iter().position(|&b| b == b'/') {
                Some(i) => Step::Past(2 + i + 1),
                None if k == b"d/d" => Step::Stop,
                None => Step::Next,
            }
        })
        .unwrap();
        let want: &[&[u8]] = &[
            b"d/a",
            b"d/b/1",
            b"d/b0",
            b"d/c\xff",
            b"d/c\xff\xff/x",
            b"d/d",
        ];
        assert_eq!(seen, want);
        assert_eq!(successor(b"ab\xff\xff"), Some(b"ac".to_vec()));
        assert_eq!(successor(b"\xff"), None);
    }

    #[test]
    fn blobs_are_written_once_and_reclaimed_on_demand() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), &["b"], &["b"]).unwrap();
        let value = |i: u32| vec![i as u8; 1 << 20];
        // Eight flushes of eight 1 MiB values: eight blob files.
        for f in 0..8u32 {
            for i in 0..8u32 {
                let k = (f * 8 + i).to_be_bytes();
                db.put_volatile(&[("b", &k, &value(f * 8 + i))]).unwrap();
            }
            db.flush_family("b").unwrap();
        }
        let written = db.blob_file_bytes("b").unwrap();
        assert!(written >= 64 << 20, "{written}");
        // Compactions alone do not rewrite blobs: the files stay what the flushes wrote.
        let raw = db.db().unwrap();
        raw.compact_range_cf(cf(&raw, "b").unwrap(), None::<&[u8]>, None::<&[u8]>);
        assert_eq!(db.blob_file_bytes("b").unwrap(), written);
        // Keep one value in eight; the files still hold the deleted ones until reclaimed.
        for k in 0..64u32 {
            if k % 8 != 0 {
                db.delete("b", &k.to_be_bytes()).unwrap();
            }
        }
        let raw = db.db().unwrap();
        raw.compact_range_cf(cf(&raw, "b").unwrap(), None::<&[u8]>, None::<&[u8]>);
        assert_eq!(db.blob_file_bytes("b").unwrap(), written);
        db.reclaim_blobs("b", 1.0).unwrap();
        let after = db.blob_file_bytes("b").unwrap();
        assert!(
            after < 10 << 20,
            "{after} bytes of blob files after reclaiming"
        );
        for k in 0..64u32 {
            let got = db.get_unverified("b", &k.to_be_bytes()).unwrap();
            assert_eq!(got.is_some(), k % 8 == 0, "value {k}");
            if let Some(v) = got {
                assert_eq!(v, value(k));
            }
        }
    }
}
