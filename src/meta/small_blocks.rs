//! A store's small blocks in the metadata's table of them ([`Table::Blocks`]), the engine's
//! size kept under a budget (see `blocks::block_table`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::backend::{BackendError, MetaBackend, Op, Table};
use super::commit::{refusal, Refusal};
use crate::blocks::block_table::{BlockTable, META_BLOCK_MAX};
use crate::blocks::BlockError;
use crate::hash::BlockHash;
use crate::locks;

/// How large the engine's database may grow before small blocks go to the object store
/// instead: half of etcd's default quota (2 GiB), the rest for the keys, manifests and the
/// history etcd keeps until it is compacted.
pub const DEFAULT_BUDGET: u64 = 1 << 30;

/// How long an answer of the engine's size holds: one status request a replica in so long,
/// whatever the rate of writes.
const SIZE_KEPT: Duration = Duration::from_secs(10);

pub struct TableBlocks {
    tables: Arc<dyn MetaBackend>,
    /// Bytes of the engine's database past which no block goes in (0: none ever does).
    budget: u64,
    /// Whether the engine was under the budget, and when that was asked.
    room: Mutex<Option<(Instant, bool)>>,
}

impl TableBlocks {
    pub fn new(tables: Arc<dyn MetaBackend>, budget: u64) -> Self {
        TableBlocks {
            tables,
            budget,
            room: Mutex::new(None),
        }
    }

    fn has_room(&self) -> bool {
        let mut room = locks::lock(&self.room);
        if let Some((at, answer)) = *room {
            if at.elapsed() < SIZE_KEPT {
                return answer;
            }
        }
        let answer = match self.tables.stored_bytes() {
            Ok(Some(bytes)) => bytes < self.budget,
            Ok(None) => true,
            Err(e) => {
                // The object store takes the block; the next question is asked again soon.
                tracing::warn!(error = %e, "the metadata's size is unknown: small blocks go to the object store");
                false
            }
        };
        *room = Some((Instant::now(), answer));
        answer
    }
}

fn table_error(e: BackendError) -> BlockError {
    BlockError::InMeta {
        no_space: refusal(&e) == Some(Refusal::NoSpace),
        source: Box::new(e),
    }
}

impl BlockTable for TableBlocks {
    fn get(&self, hash: &BlockHash) -> Result<Option<Bytes>, BlockError> {
        let got = self
            .tables
            .get(Table::Blocks, hash.as_bytes())
            .map_err(table_error)?;
        Ok(got.map(Bytes::from))
    }

    fn put(&self, hash: &BlockHash, data: &[u8]) -> Result<(), BlockError> {
        let op = Op::Put(Table::Blocks, hash.as_bytes().to_vec(), data.to_vec());
        self.tables.write_shared(vec![op]).map_err(table_error)
    }

    fn takes(&self, len: usize) -> bool {
        len <= META_BLOCK_MAX && self.budget > 0 && self.has_room()
    }

    fn remove(&self, hash: &BlockHash) -> Result<(), BlockError> {
        let op = Op::Delete(Table::Blocks, hash.as_bytes().to_vec());
        self.tables.commit(vec![vec![op]]).map_err(table_error)
    }

    fn for_each(&self, f: &mut dyn FnMut(BlockHash, usize)) -> Result<(), BlockError> {
        self.tables
            .for_each(Table::Blocks, &mut |k, v| {
                if let Some(h) = BlockHash::from_slice(k) {
                    f(h, v.len());
                }
                Ok(())
            })
            .map_err(table_error)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::blocks::store::{StoreBlocks, CF_BLOCKS, FAMILIES};
    use crate::blocks::Served;
    use crate::db::Db;
    use crate::meta::engine::counted::Counted;
    use crate::meta::engine::{EngineTables, RocksEngine};
    use crate::meta::TableRefs;
    use crate::objects::{ObjectUrl, Objects};

    /// A store's blocks on objects in `dir`, its small ones in tables whose engine says it
    /// takes `size` bytes, with `budget`.
    fn store(dir: &Path, size: u64, budget: u64) -> (StoreBlocks, Arc<Objects>) {
        let (blocks, objects, _, _) = store_counted(dir, size, budget);
        (blocks, objects)
    }

    /// As [`store`], with the tables (its references in them too) and the count of their
    /// transactions.
    pub(super) fn store_counted(
        dir: &Path,
        size: u64,
        budget: u64,
    ) -> (
        StoreBlocks,
        Arc<Objects>,
        Arc<EngineTables>,
        Arc<AtomicUsize>,
    ) {
        let engine =
            Counted::new(Arc::new(RocksEngine::open(&dir.join("engine")).unwrap())).with_size(size);
        let txns = engine.txns.clone();
        let tables = EngineTables::connect(move || async move { Ok(engine) }).unwrap();
        let tables = Arc::new(tables);
        let objects = Arc::new(Objects::open(&ObjectUrl::Dir(dir.join("objects"))).unwrap());
        let db = Db::open(&dir.join("db"), &FAMILIES, &[CF_BLOCKS]).unwrap();
        let blocks = StoreBlocks::on_objects(db, objects.clone())
            .with_references(Arc::new(TableRefs(tables.clone())))
            .with_small_blocks(Arc::new(TableBlocks::new(tables.clone(), budget)));
        (blocks, objects, tables, txns)
    }

    pub(super) fn object(objects: &Objects, h: &BlockHash) -> Option<u64> {
        objects.len(&format!("blocks/{}", h.hex())).unwrap()
    }

    pub(super) fn bytes(served: Option<Served>) -> Vec<u8> {
        match served {
            Some(Served::Bytes(b)) => b.to_vec(),
            Some(Served::File(..)) => panic!("a block on objects is served from memory"),
            None => panic!("the block is not served"),
        }
    }

    /// A small block goes into the metadata and no object is written for it; a large one is
    /// an object; both are held, served, read by range, listed and collected alike.
    #[test]
    fn small_blocks_of_an_object_store_live_in_the_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let (blocks, objects) = store(dir.path(), 1 << 20, DEFAULT_BUDGET);
        let small = b"a small file's block".to_vec();
        let large = vec![7u8; META_BLOCK_MAX + 1];
        let (hs, hl) = (BlockHash::of(&small), BlockHash::of(&large));
        blocks.put(&hs, &small).unwrap();
        blocks.put(&hl, &large).unwrap();
        assert_eq!(
            object(&objects, &hs),
            None,
            "a small block became an object"
        );
        assert_eq!(object(&objects, &hl), Some(large.len() as u64));
        assert_eq!(blocks.stored_len(&hs).unwrap(), Some(small.len() as u32));
        assert_eq!(blocks.missing(&[hs, hl]).unwrap(), []);
        assert_eq!(bytes(blocks.get(&hs).unwrap()), small);
        assert_eq!(bytes(blocks.get(&hl).unwrap()), large);
        let piece = crate::blocks::BlockServe::read_range(&blocks, &hs, 2, 5).unwrap();
        assert_eq!(piece.as_deref(), Some(&small[2..7]));
        let mut listed = Vec::new();
        blocks.for_each_block(|h| listed.push(h)).unwrap();
        listed.sort();
        let mut both = vec![hs, hl];
        both.sort();
        assert_eq!(listed, both);
        assert_eq!(blocks.remove(&hs).unwrap(), small.len() as u64);
        assert_eq!(blocks.remove(&hl).unwrap(), large.len() as u64);
        assert!(!blocks.contains(&hs).unwrap() && !blocks.contains(&hl).unwrap());
    }

    /// Past its budget (or with none) the metadata takes no more blocks: they are objects, and
    /// the blocks it took before are still served.
    #[test]
    fn a_metadata_over_its_budget_leaves_small_blocks_to_the_object_store() {
        let dir = tempfile::tempdir().unwrap();
        let before = b"put while there was room".to_vec();
        let hb = BlockHash::of(&before);
        {
            let (blocks, objects) = store(dir.path(), 100, 1_000);
            blocks.put(&hb, &before).unwrap();
            assert_eq!(object(&objects, &hb), None);
        }
        for (size, budget) in [(1_000, 1_000), (0, 0)] {
            let (blocks, objects) = store(dir.path(), size, budget);
            let small = format!("a small block, {size} {budget}").into_bytes();
            let h = BlockHash::of(&small);
            blocks.put(&h, &small).unwrap();
            assert_eq!(object(&objects, &h), Some(small.len() as u64));
            assert_eq!(bytes(blocks.get(&h).unwrap()), small);
            assert_eq!(bytes(blocks.get(&hb).unwrap()), before);
        }
    }
}

/// A small file's publish writes its block in its own change: one transaction of the engine
/// for the block, the namespace's reference to it and the key; a refused publish leaves no
/// block behind.
#[cfg(test)]
#[test]
fn a_publish_carries_its_small_blocks_in_its_own_transaction() {
    use std::sync::atomic::Ordering;

    use super::{MetaStore, Publish};
    use crate::clock::ManualClock;
    use crate::key::{KeyPath, Namespace};
    use tests::{bytes, object, store_counted};

    let dir = tempfile::tempdir().unwrap();
    let (blocks, objects, tables, txns) = store_counted(dir.path(), 0, DEFAULT_BUDGET);
    let meta = MetaStore::new(
        tables,
        Arc::new(blocks),
        Duration::from_secs(15),
        ManualClock::default().shared(),
    );
    meta.separate_namespaces(true).unwrap();
    let ns = Namespace::parse("team").unwrap();
    let scope = meta.scope_of(&ns);
    let key = KeyPath::parse("f").unwrap();
    let data = b"a small file".to_vec();
    let h = BlockHash::of(&data);
    let inline = vec![(h, data.clone())];
    let before = txns.load(Ordering::SeqCst);
    meta.publish(Publish {
        inline: &inline,
        ..Publish::new(&ns, &key, &super::tests::one_block(&data))
    })
    .unwrap();
    assert_eq!(txns.load(Ordering::SeqCst) - before, 1);
    assert_eq!(object(&objects, &h), None);
    assert_eq!(bytes(meta.blocks().get(&h).unwrap()), data);
    assert!(meta
        .blocks()
        .missing_for(scope.as_ref(), &[h])
        .unwrap()
        .is_empty());

    let other = b"another small file".to_vec();
    let h2 = BlockHash::of(&other);
    let refused = meta.publish(Publish {
        inline: &[(h2, other.clone())],
        ..Publish::new(&ns, &key, &super::tests::one_block(&other))
    });
    assert!(
        refused.is_err(),
        "a publish over another version without force"
    );
    assert!(meta.blocks().get(&h2).unwrap().is_none());
}
