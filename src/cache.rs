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
        Ok(Some(Bytes::from(v)))
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
        let mut idx = age.to_be_bytes().to_vec();
        idx.extend_from_slice(&(data.len() as u32).to_be_bytes());
        // No WAL: a crash may lose recent inserts (both families together, see `Db::open`),
        // which only means fetching them again.
        self.db.write_volatile(vec![
            BatchOp::Put(CF_CACHE, h.0.to_vec(), data.to_vec()),
            BatchOp::Put(CF_CACHE_INDEX, h.0.to_vec(), idx),
        ])?;
        self.lru
            .lock()
            .map_err(|_| poisoned())?
            .add(*h, data.len() as u32, age);
        self.evict()
    }

    fn evict(&self) -> Result<(), DbError> {
        loop {
            let victim = {
                let mut l = self.lru.lock().map_err(|_| poisoned())?;
                if l.used <= self.budget {
                    return Ok(());
                }
                l.remove_oldest()
            };
            let Some(h) = victim else { return Ok(()) };
            self.db.write_volatile(vec![
                BatchOp::Delete(CF_CACHE, h.0.to_vec()),
                BatchOp::Delete(CF_CACHE_INDEX, h.0.to_vec()),
            ])?;
        }
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
}
