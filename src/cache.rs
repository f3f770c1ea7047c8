//! The node's block cache: verified blocks in RocksDB, within a byte budget.
//!
//! Blocks live in one column family (as blob files, so 4 MiB values are not rewritten by
//! compaction) and a small index family records each block's length and insertion order, so a
//! restarted agent finds its cache and its budget use without reading any block. Eviction is
//! least-recently-used: reads refresh a block's place in memory; after a restart the order
//! starts from the order of insertion. Only verified blocks are inserted, each in one atomic
//! write, so a crash never leaves a partial block behind; the cache is written without the
//! write-ahead log (losing recent inserts in a crash only means fetching them again), and every
//! block read back is checked against its hash. Blocks that this node publishes in
//! place are not here at all (they are served from their files), so eviction never touches data
//! a local publication needs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;

use crate::db::{BatchOp, Db, DbError};
use crate::hash::BlockHash;

pub const CF_CACHE: &str = "cache";
pub const CF_CACHE_INDEX: &str = "cache_index";

/// Default budget: 10 GiB.
pub const DEFAULT_BUDGET: u64 = 10 << 30;
/// Blob-file bytes over the budget that never trigger a reclaim (for budgets at least as large).
const RECLAIM_SLACK: u64 = 256 << 20;

#[derive(Default)]
struct Lru {
    used: u64,
    clock: u64,
    by_hash: HashMap<BlockHash, (u64, u32)>,
    by_age: BTreeMap<u64, BlockHash>,
}

impl Lru {
    fn touch(&mut self, h: &BlockHash) {
        if let Some((age, _)) = self.by_hash.get_mut(h) {
            self.by_age.remove(age);
            self.clock += 1;
            *age = self.clock;
            self.by_age.insert(self.clock, *h);
        }
    }

    fn add(&mut self, h: BlockHash, len: u32, age: u64) {
        self.clock = self.clock.max(age);
        self.by_hash.insert(h, (age, len));
        self.by_age.insert(age, h);
        self.used += u64::from(len);
    }

    fn remove(&mut self, h: &BlockHash) {
        if let Some((age, len)) = self.by_hash.remove(h) {
            self.by_age.remove(&age);
            self.used -= u64::from(len);
        }
    }

    fn remove_oldest(&mut self) -> Option<BlockHash> {
        let (_, h) = self.by_age.pop_first()?;
        if let Some((_, len)) = self.by_hash.remove(&h) {
            self.used -= u64::from(len);
        }
        Some(h)
    }
}

pub struct BlockCache {
    db: Db,
    budget: u64,
    lru: Mutex<Lru>,
    reclaimer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl BlockCache {
    /// Opens the cache over `db` (which must have [`CF_CACHE`] and [`CF_CACHE_INDEX`]).
    pub fn open(db: Db, budget: u64) -> Result<Self, DbError> {
        let mut lru = Lru::default();
        for (k, v) in db.scan_prefix(CF_CACHE_INDEX, &[])? {
            let (Some(h), Ok(v)) = (
                BlockHash::from_slice(&k),
                <[u8; 12]>::try_from(v.as_slice()),
            ) else {
                continue;
            };
            let age = u64::from_be_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
            let len = u32::from_be_bytes([v[8], v[9], v[10], v[11]]);
            lru.add(h, len, age);
        }
        let cache = BlockCache {
            db,
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
        self.lru.lock().map_or(0, |l| l.used)
    }

    pub fn contains(&self, h: &BlockHash) -> bool {
        self.lru.lock().is_ok_and(|l| l.by_hash.contains_key(h))
    }

    /// A cached block, checked against its hash (RocksDB's own checksum is skipped: blake3 is
    /// both stronger and, with Debian's portable build, several times faster). A block that no
    /// longer matches is dropped and reported absent, so it is fetched again.
    pub fn get(&self, h: &BlockHash) -> Result<Option<Bytes>, DbError> {
        if !self.contains(h) {
            return Ok(None);
        }
        let Some(v) = self.db.get_unverified(CF_CACHE, h.as_bytes())? else {
            self.forget(h)?;
            return Ok(None);
        };
        if BlockHash::of(&v) != *h {
            tracing::warn!(block = %h, "cached block is corrupt; dropping it");
            self.forget(h)?;
            return Ok(None);
        }
        if let Ok(mut l) = self.lru.lock() {
            l.touch(h);
        }
        Ok(Some(v))
    }

    fn forget(&self, h: &BlockHash) -> Result<(), DbError> {
        if let Ok(mut l) = self.lru.lock() {
            l.remove(h);
        }
        self.db.write_volatile(vec![
            BatchOp::Delete(CF_CACHE, h.0.to_vec()),
            BatchOp::Delete(CF_CACHE_INDEX, h.0.to_vec()),
        ])
    }

    /// Inserts a block that has already been verified against `h`.
    pub fn insert(&self, h: &BlockHash, data: &[u8]) -> Result<(), DbError> {
        let age = {
            let mut l = self.lru.lock().map_err(|_| poisoned())?;
            if l.by_hash.contains_key(h) {
                l.touch(h);
                return Ok(());
            }
            l.clock += 1;
            l.clock
        };
        let mut idx = [0u8; 12];
        idx[..8].copy_from_slice(&age.to_be_bytes());
        idx[8..].copy_from_slice(&(data.len() as u32).to_be_bytes());
        // No WAL: a crash may lose recent inserts (both families together, see `Db::open`),
        // which only means fetching them again.
        self.db.put_volatile(&[
            (CF_CACHE, h.as_bytes(), data),
            (CF_CACHE_INDEX, h.as_bytes(), &idx),
        ])?;
        self.lru
            .lock()
            .map_err(|_| poisoned())?
            .add(*h, data.len() as u32, age);
        self.evict()
    }

    fn evict(&self) -> Result<(), DbError> {
        let mut evicted = false;
        loop {
            let victim = {
                let mut l = self.lru.lock().map_err(|_| poisoned())?;
                if l.used <= self.budget {
                    break;
                }
                l.remove_oldest()
            };
            let Some(h) = victim else { break };
            self.db.write_volatile(vec![
                BatchOp::Delete(CF_CACHE, h.0.to_vec()),
                BatchOp::Delete(CF_CACHE_INDEX, h.0.to_vec()),
            ])?;
            evicted = true;
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
    fn reclaim_if_worth_it(&self) -> Result<(), DbError> {
        let on_disk = self.db.blob_file_bytes(CF_CACHE)?;
        let slack = (self.budget / 4).max(RECLAIM_SLACK.min(self.budget));
        if on_disk <= self.budget + slack {
            return Ok(());
        }
        let mut running = self.reclaimer.lock().map_err(|_| poisoned())?;
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
        let h = self.reclaimer.lock().ok().and_then(|mut r| r.take());
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

fn poisoned() -> DbError {
    DbError::Poisoned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path, budget: u64) -> BlockCache {
        let db = Db::open(dir, &[CF_CACHE, CF_CACHE_INDEX], &[CF_CACHE]).unwrap();
        BlockCache::open(db, budget).unwrap()
    }

    #[test]
    fn evicts_least_recently_used_within_budget_and_survives_restart() {
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
