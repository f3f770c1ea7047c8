//! The node's block cache: verified blocks within a byte budget, kept in RocksDB.
//!
//! RocksDB holds the cache: an index family records each block's length, insertion order and
//! place, so a restarted agent finds its cache and its budget use without reading any block;
//! small blocks live in a family of their own (as blob files, so they are not rewritten by
//! compaction); blocks of 64 KiB and more are files named by hash next to the database
//! ([`BlockFiles`]). Why files: writing a 4 MiB block through RocksDB copied it into the memtable,
//! copied it again into the blob file's buffer and ran Debian's software CRC over it: measured,
//! 44% of a mount's CPU on a cold read, more than fetching and verifying the block cost.
//!
//! Eviction is least-recently-used: reads refresh a block's place in memory; after a restart the
//! order starts from the order of insertion. Only verified blocks are inserted, a file under its
//! hash is always whole (written aside and renamed), and the cache is written without the
//! write-ahead log or syncs: a crash may lose recent inserts (only fetched again), leave a file
//! the index no longer names (removed on the next open) or a block file whose bytes never
//! reached the disk; every block read back is checked against its hash, and one that fails is
//! dropped. Blocks that this node publishes in place are not here at all (they are served from
//! their files), so eviction never touches data a local publication needs.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;

use bytes::Bytes;

use super::files::{BlockFiles, MIN_FILE_BLOCK};
use super::BlockError;
use crate::db::{BatchOp, Db, DbError};
use crate::hash::BlockHash;
use crate::locks::lock;
use crate::metrics;

pub const CF_CACHE: &str = "cache";
pub const CF_CACHE_INDEX: &str = "cache_index";

/// Default budget: 10 GiB.
pub const DEFAULT_BUDGET: u64 = 10 << 30;
/// Blob-file bytes over the budget that never trigger a reclaim (for budgets at least as large).
const RECLAIM_SLACK: u64 = 256 << 20;
/// Bytes of block files evicted beyond the block itself when the disk fills before the budget:
/// room for the database's own writes and the next few blocks, so that the next insert does not
/// fail again at once.
const ROOM_ON_FULL_DISK: u64 = 16 << 20;
/// Marks an index entry (`age: u64 BE, len: u32 BE`, then this byte) whose block is a file.
const IN_FILE: u8 = b'f';

#[derive(Default)]
struct Lru {
    used: u64,
    clock: u64,
    /// Age, length, and whether the block is a file.
    by_hash: HashMap<BlockHash, (u64, u32, bool)>,
    by_age: BTreeMap<u64, BlockHash>,
}

impl Lru {
    fn touch(&mut self, h: &BlockHash) {
        if let Some((age, _, _)) = self.by_hash.get_mut(h) {
            self.by_age.remove(age);
            self.clock += 1;
            *age = self.clock;
            self.by_age.insert(self.clock, *h);
        }
    }

    fn add(&mut self, h: BlockHash, len: u32, age: u64, in_file: bool) {
        self.clock = self.clock.max(age);
        self.by_hash.insert(h, (age, len, in_file));
        self.by_age.insert(age, h);
        self.used += u64::from(len);
    }

    fn remove(&mut self, h: &BlockHash) -> Option<bool> {
        let (age, len, in_file) = self.by_hash.remove(h)?;
        self.by_age.remove(&age);
        self.used -= u64::from(len);
        Some(in_file)
    }

    /// The oldest block's hash, length and whether it is a file, taken out of the order.
    fn remove_oldest(&mut self) -> Option<(BlockHash, u32, bool)> {
        let (_, h) = self.by_age.pop_first()?;
        let (_, len, in_file) = self.by_hash.remove(&h)?;
        self.used -= u64::from(len);
        Some((h, len, in_file))
    }

    fn in_file(&self, h: &BlockHash) -> Option<bool> {
        self.by_hash.get(h).map(|e| e.2)
    }
}

pub struct BlockCache {
    db: Db,
    files: BlockFiles,
    /// Blocks at least this large are files ([`MIN_FILE_BLOCK`]; tests change it).
    file_min: usize,
    budget: u64,
    lru: Mutex<Lru>,
    reclaimer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl BlockCache {
    /// Opens the cache over `db` (which must have [`CF_CACHE`] and [`CF_CACHE_INDEX`]), with
    /// its block files in `files_dir`.
    pub fn open(db: Db, files_dir: &Path, budget: u64) -> Result<Self, BlockError> {
        Self::open_with(db, files_dir, budget, MIN_FILE_BLOCK)
    }

    fn open_with(
        db: Db,
        files_dir: &Path,
        budget: u64,
        file_min: usize,
    ) -> Result<Self, BlockError> {
        let (files, on_disk) =
            BlockFiles::open_volatile(files_dir).map_err(|e| files_err(files_dir, e))?;
        let mut lru = Lru::default();
        for (k, v) in db.scan_prefix(CF_CACHE_INDEX, &[])? {
            let (Some(h), Some(age), Some(len)) = (
                BlockHash::from_slice(&k),
                v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
                v.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok()),
            ) else {
                continue;
            };
            let in_file = v.get(12) == Some(&IN_FILE);
            lru.add(h, u32::from_be_bytes(len), u64::from_be_bytes(age), in_file);
        }
        // Files the index does not name: inserts whose index entry a crash lost, or evictions
        // a crash cut short. Nothing will ever read them.
        let orphans: Vec<BlockHash> = on_disk
            .into_iter()
            .filter(|h| lru.in_file(h) != Some(true))
            .collect();
        for h in &orphans {
            files.remove(h).map_err(|e| files_err(files_dir, e))?;
        }
        if !orphans.is_empty() {
            tracing::info!(
                files = orphans.len(),
                "removed cached block files no index named"
            );
        }
        let cache = BlockCache {
            db,
            files,
            file_min,
            budget,
            lru: Mutex::new(lru),
            reclaimer: Mutex::new(None),
        };
        cache.evict()?;
        Ok(cache)
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn used(&self) -> u64 {
        lock(&self.lru).used
    }

    pub fn contains(&self, h: &BlockHash) -> bool {
        lock(&self.lru).by_hash.contains_key(h)
    }

    /// A cached block, checked against its hash (RocksDB's own checksum is skipped: blake3 is
    /// both stronger and, with Debian's portable build, several times faster). A block that no
    /// longer matches is dropped and reported absent, so it is fetched again.
    pub fn get(&self, h: &BlockHash) -> Result<Option<Bytes>, BlockError> {
        if !self.contains(h) {
            metrics::CACHE_MISSES.inc();
            return Ok(None);
        }
        let in_file = lock(&self.lru).in_file(h);
        let found = if in_file == Some(true) {
            self.files
                .read(h)
                .map_err(|e| self.files.error(e))?
                .map(Bytes::from)
        } else {
            self.db.get_unverified(CF_CACHE, h.as_bytes())?
        };
        let Some(v) = found else {
            self.forget(h)?;
            return Ok(None);
        };
        if BlockHash::of(&v) != *h {
            tracing::warn!(block = %h, "cached block is corrupt; dropping it");
            self.forget(h)?;
            return Ok(None);
        }
        lock(&self.lru).touch(h);
        metrics::CACHE_HITS.inc();
        Ok(Some(v))
    }

    /// Drops a block, if it is here; the bytes it took.
    pub fn discard(&self, h: &BlockHash) -> Result<u64, BlockError> {
        let removed = {
            let mut l = lock(&self.lru);
            let len = l.by_hash.get(h).map(|e| e.1);
            l.remove(h).zip(len)
        };
        match removed {
            None => Ok(0),
            Some((in_file, len)) => {
                self.drop_block(h, in_file)?;
                Ok(u64::from(len))
            }
        }
    }

    fn forget(&self, h: &BlockHash) -> Result<(), BlockError> {
        let in_file = lock(&self.lru).remove(h);
        self.drop_block(h, in_file.unwrap_or(false))
    }

    /// Deletes a block's index entry and its bytes: the index entry first, so that a crash in
    /// between leaves an orphan file (removed on open), never an entry without its block.
    fn drop_block(&self, h: &BlockHash, in_file: bool) -> Result<(), BlockError> {
        self.db.write_volatile(vec![
            BatchOp::Delete(CF_CACHE_INDEX, h.0.to_vec()),
            BatchOp::Delete(CF_CACHE, h.0.to_vec()),
        ])?;
        if in_file {
            self.files.remove(h).map_err(|e| self.files.error(e))?;
        }
        Ok(())
    }

    /// Inserts a block that has already been verified against `h`. Where the disk fills up
    /// before the budget does, the disk is the limit: the oldest blocks make room, and the
    /// block is written once more.
    pub fn insert(&self, h: &BlockHash, data: &[u8]) -> Result<(), BlockError> {
        match self.insert_once(h, data) {
            // The database is being reopened after an earlier full disk (space has returned):
            // evicting would free nothing it needs.
            Err(e @ BlockError::Db(DbError::Closed)) => Err(e),
            Err(e) if e.is_no_space() => {
                let want = data.len() as u64 + ROOM_ON_FULL_DISK;
                if self.files.free_bytes().is_some_and(|free| free >= want) {
                    return self.insert_once(h, data);
                }
                let freed = self.make_room(want);
                metrics::CACHE_FULL_DISK.inc();
                tracing::warn!(
                    block = %h,
                    freed,
                    used = self.used(),
                    budget = self.budget,
                    "the cache's disk is full before its budget; evicted the oldest blocks"
                );
                if freed == 0 {
                    return Err(e);
                }
                self.insert_once(h, data)
            }
            r => r,
        }
    }

    fn insert_once(&self, h: &BlockHash, data: &[u8]) -> Result<(), BlockError> {
        let age = {
            let mut l = lock(&self.lru);
            if l.by_hash.contains_key(h) {
                l.touch(h);
                return Ok(());
            }
            l.clock += 1;
            l.clock
        };
        let in_file = data.len() >= self.file_min;
        let mut idx = Vec::with_capacity(13);
        idx.extend_from_slice(&age.to_be_bytes());
        idx.extend_from_slice(&(data.len() as u32).to_be_bytes());
        // No WAL: a crash may lose recent inserts (both families together, see `Db::open`),
        // which only means fetching them again. A file goes first, its index entry after it.
        if in_file {
            idx.push(IN_FILE);
            self.files.write(h, data).map_err(|e| self.files.error(e))?;
            if let Err(e) = self
                .db
                .put_volatile(&[(CF_CACHE_INDEX, h.as_bytes(), &idx)])
            {
                // A file no index names would hold its space until the next open.
                let _ = self.files.remove(h);
                return Err(e.into());
            }
        } else {
            self.db.put_volatile(&[
                (CF_CACHE, h.as_bytes(), data),
                (CF_CACHE_INDEX, h.as_bytes(), &idx),
            ])?;
        }
        lock(&self.lru).add(*h, data.len() as u32, age, in_file);
        self.evict()
    }

    /// Evicts the oldest blocks until `want` bytes of block files are gone or nothing is left;
    /// the bytes freed. A file goes before its index entry here: the disk is full, so the
    /// database may refuse the delete until space returns, and a read that finds an entry
    /// without its file drops the entry.
    fn make_room(&self, want: u64) -> u64 {
        let mut freed = 0;
        while freed < want {
            let Some((h, len, in_file)) = lock(&self.lru).remove_oldest() else {
                break;
            };
            if in_file {
                match self.files.remove(&h) {
                    Ok(()) => freed += u64::from(len),
                    Err(e) => tracing::warn!(block = %h, error = %e, "evicting a block file"),
                }
            }
            let _ = self.db.write_volatile(vec![
                BatchOp::Delete(CF_CACHE_INDEX, h.0.to_vec()),
                BatchOp::Delete(CF_CACHE, h.0.to_vec()),
            ]);
            metrics::CACHE_EVICTIONS.inc();
        }
        freed
    }

    fn evict(&self) -> Result<(), BlockError> {
        let mut evicted = false;
        loop {
            let victim = {
                let mut l = lock(&self.lru);
                if l.used <= self.budget {
                    break;
                }
                l.remove_oldest()
            };
            let Some((h, _, in_file)) = victim else { break };
            self.drop_block(&h, in_file)?;
            metrics::CACHE_EVICTIONS.inc();
            evicted |= !in_file;
        }
        if evicted {
            self.reclaim_if_worth_it()?;
        }
        Ok(())
    }

    /// Evicted blocks stay in their blob files until those are rewritten. Once the files exceed
    /// the budget by a quarter (at least [`RECLAIM_SLACK`]), the older half of them is compacted
    /// in the background: under least-recently-used eviction that half is mostly dead, so little
    /// live data is copied.
    fn reclaim_if_worth_it(&self) -> Result<(), BlockError> {
        let on_disk = self.db.blob_file_bytes(CF_CACHE)?;
        let slack = (self.budget / 4).max(RECLAIM_SLACK.min(self.budget));
        if on_disk <= self.budget + slack {
            return Ok(());
        }
        let mut running = lock(&self.reclaimer);
        if running.as_ref().is_some_and(|h| !h.is_finished()) {
            return Ok(());
        }
        let db = self.db.clone();
        let spawned = std::thread::Builder::new()
            .name("kt-cache-reclaim".into())
            .spawn(move || match db.reclaim_blobs(CF_CACHE, 0.5) {
                Ok(()) => tracing::info!(
                    before = on_disk,
                    after = db.blob_file_bytes(CF_CACHE).unwrap_or(0),
                    "reclaimed the space of evicted blocks"
                ),
                Err(e) => tracing::warn!(error = %e, "reclaiming the cache's space failed"),
            });
        match spawned {
            Ok(h) => *running = Some(h),
            Err(e) => tracing::warn!(error = %e, "could not start reclaiming the cache's space"),
        }
        Ok(())
    }

    /// Waits for a reclaim in progress, if any.
    pub fn wait_reclaimed(&self) {
        let h = lock(&self.reclaimer).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

impl Drop for BlockCache {
    /// A reclaim holds the database open; the next opener of this cache must find it closed.
    fn drop(&mut self) {
        self.wait_reclaimed();
    }
}

fn files_err(dir: &Path, source: std::io::Error) -> BlockError {
    BlockError::Files {
        dir: dir.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache whose blocks of `file_min` bytes and more are files.
    fn open_with(dir: &std::path::Path, budget: u64, file_min: usize) -> BlockCache {
        let db = Db::open(&dir.join("db"), &[CF_CACHE, CF_CACHE_INDEX], &[CF_CACHE]).unwrap();
        BlockCache::open_with(db, &dir.join("blocks"), budget, file_min).unwrap()
    }

    /// Every block in RocksDB.
    fn open(dir: &std::path::Path, budget: u64) -> BlockCache {
        open_with(dir, budget, usize::MAX)
    }

    #[test]
    fn evicts_least_recently_used_within_budget_and_survives_restart() {
        lru_within_budget_across_restarts(usize::MAX);
    }

    #[test]
    fn block_files_are_evicted_and_survive_restart_like_database_blocks() {
        lru_within_budget_across_restarts(0);
    }

    fn lru_within_budget_across_restarts(file_min: usize) {
        let open = |dir: &std::path::Path, budget| open_with(dir, budget, file_min);
        let dir = tempfile::tempdir().unwrap();
        let blocks: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1000]).collect();
        let hs: Vec<BlockHash> = blocks.iter().map(|b| BlockHash::of(b)).collect();
        {
            let c = open(dir.path(), 3000);
            for (h, b) in hs.iter().zip(&blocks).take(3) {
                c.insert(h, b).unwrap();
            }
            // Reading block 0 makes block 1 the least recently used.
            assert!(c.get(&hs[0]).unwrap().is_some());
            c.insert(&hs[3], &blocks[3]).unwrap();
            assert!(c.get(&hs[1]).unwrap().is_none());
            assert!(c.get(&hs[0]).unwrap().is_some());
            assert_eq!(c.used(), 3000);
        }
        let c = open(dir.path(), 3000);
        assert_eq!(c.used(), 3000);
        assert_eq!(&c.get(&hs[3]).unwrap().unwrap()[..], &blocks[3][..]);
        // A smaller budget after a restart evicts down to it.
        drop(c);
        let c = open(dir.path(), 1000);
        assert_eq!(c.used(), 1000);
        let files = std::fs::read_dir(dir.path().join("blocks"))
            .unwrap()
            .map(|fan| std::fs::read_dir(fan.unwrap().path()).unwrap().count())
            .sum::<usize>();
        assert_eq!(
            files,
            if file_min == 0 { 1 } else { 0 },
            "evicted blocks left files"
        );
    }

    #[test]
    fn crash_leftovers_in_block_files_are_cleaned_or_caught() {
        let dir = tempfile::tempdir().unwrap();
        let big = |i: u8| vec![i; MIN_FILE_BLOCK];
        let (a, b) = (big(1), big(2));
        let (ha, hb) = (BlockHash::of(&a), BlockHash::of(&b));
        {
            let c = open_with(dir.path(), 1 << 30, MIN_FILE_BLOCK);
            c.insert(&ha, &a).unwrap();
            c.insert(&hb, &b).unwrap();
        }
        let path = |h: &BlockHash| {
            let hex = h.hex();
            dir.path().join("blocks").join(&hex[..2]).join(hex)
        };
        // A file the index does not name (its entry lost in a crash) is removed on open.
        let orphan = big(3);
        let ho = BlockHash::of(&orphan);
        std::fs::create_dir_all(path(&ho).parent().unwrap()).unwrap();
        std::fs::write(path(&ho), &orphan).unwrap();
        // A file whose bytes never reached the disk is caught by its hash and dropped.
        std::fs::write(path(&hb), vec![0u8; MIN_FILE_BLOCK]).unwrap();
        let c = open_with(dir.path(), 1 << 30, MIN_FILE_BLOCK);
        assert!(!path(&ho).exists(), "an orphan block file was kept");
        assert_eq!(&c.get(&ha).unwrap().unwrap()[..], &a[..]);
        assert!(c.get(&hb).unwrap().is_none());
        assert!(!c.contains(&hb) && !path(&hb).exists());
        assert_eq!(c.used(), MIN_FILE_BLOCK as u64);
    }

    #[test]
    fn space_of_evicted_blocks_is_reclaimed() {
        // Blocks are 1 MiB and the budget 40 MiB, more than a memtable holds, so evicted blocks
        // have reached blob files. One block in 32 is kept hot: without reclaiming, each blob file
        // it sits in would stay on disk whole.
        let dir = tempfile::tempdir().unwrap();
        let c = open(dir.path(), 40 << 20);
        let block = |i: u32| {
            let mut b = vec![0u8; 1 << 20];
            b[..4].copy_from_slice(&i.to_be_bytes());
            b
        };
        let mut hot = Vec::new();
        for i in 0..320u32 {
            let b = block(i);
            let h = BlockHash::of(&b);
            c.insert(&h, &b).unwrap();
            if i % 32 == 0 {
                hot.push((h, b));
            }
            if i % 16 == 0 {
                for (h, b) in &hot {
                    assert_eq!(&c.get(h).unwrap().unwrap()[..], &b[..]);
                }
            }
        }
        // However late the background reclaims ran, one more check after them has the last word.
        c.wait_reclaimed();
        c.reclaim_if_worth_it().unwrap();
        c.wait_reclaimed();
        let on_disk = c.db.blob_file_bytes(CF_CACHE).unwrap();
        // 320 MiB were written; without reclaiming, about 300 MiB of blob files stay.
        assert!(
            on_disk < 120 << 20,
            "{on_disk} bytes of blob files for a 40 MiB cache"
        );
        assert_eq!(c.used(), 40 << 20);
        for (h, b) in &hot {
            assert_eq!(&c.get(h).unwrap().unwrap()[..], &b[..]);
        }
    }
}
