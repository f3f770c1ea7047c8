//! Tests of garbage collection's grace (the graveyard) and of a pass larger than one of etcd's
//! transactions, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use super::tests::one_block;
use super::*;
use crate::blocks::files::BlockFiles;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};
use crate::meta::engine::{EngineTables, RocksEngine};

/// The blocks of a store in `dir`.
fn blocks_in(dir: &std::path::Path) -> (Db, Arc<StoreBlocks>) {
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.join("db"), &families, &[CF_BLOCKS]).unwrap();
    let files = BlockFiles::open(&dir.join("blocks")).unwrap();
    (db.clone(), Arc::new(StoreBlocks::new(db, files)))
}

fn k(s: &str) -> KeyPath {
    KeyPath::parse(s).unwrap()
}

/// Publishes `data` under `key`, its block uploaded first.
fn publish(meta: &MetaStore, key: &str, data: &[u8]) {
    meta.blocks().put(&BlockHash::of(data), data).unwrap();
    meta.publish(Publish::new(
        &Namespace::default(),
        &k(key),
        &one_block(data),
    ))
    .unwrap();
}

fn remove(meta: &MetaStore, key: &str) {
    meta.remove(&Namespace::default(), &k(key), false, false)
        .unwrap();
}

/// With a grace, what a pass finds dead stays until a pass after the grace finds it dead
/// still; what a key names again meanwhile is taken out of the graveyard and stays.
#[test]
fn collection_keeps_what_died_for_its_grace_and_then_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let (db, blocks) = blocks_in(dir.path());
    let meta = MetaStore::new(db, blocks, Duration::from_secs(15), clock.shared());
    meta.set_gc_grace(Duration::from_secs(10));
    let (gone, back) = (b"gone for good".to_vec(), b"named again".to_vec());
    meta.collect_garbage().unwrap();
    publish(&meta, "gone", &gone);
    publish(&meta, "back", &back);
    remove(&meta, "gone");
    remove(&meta, "back");
    clock.advance(Duration::from_secs(1));
    // Touched lately, then dead: buried, not deleted.
    for _ in 0..3 {
        let r = meta.collect_garbage().unwrap();
        assert_eq!((r.manifests, r.blocks), (0, 0), "{r:?}");
    }
    // (`get`, as asking whether the store holds a block counts as touching it.)
    let held = |d: &[u8]| meta.blocks().get(&BlockHash::of(d)).unwrap().is_some();
    assert!(held(&gone) && held(&back));
    // Named again within the grace: it lives, and leaves the graveyard.
    publish(&meta, "back", &back);
    clock.advance(Duration::from_secs(5));
    let r = meta.collect_garbage().unwrap();
    assert_eq!((r.manifests, r.blocks), (0, 0), "{r:?}");
    remove(&meta, "back");
    // The grace of the first burial is over: what died then goes; what died again since is
    // buried anew, for a grace of its own.
    clock.advance(Duration::from_secs(6));
    let r = meta.collect_garbage().unwrap();
    assert_eq!((r.manifests, r.blocks), (1, 1), "{r:?}");
    assert!(!held(&gone) && held(&back));
    for _ in 0..2 {
        let r = meta.collect_garbage().unwrap();
        assert_eq!((r.manifests, r.blocks), (0, 0), "{r:?}");
    }
    assert!(held(&back));
    clock.advance(Duration::from_secs(11));
    let r = meta.collect_garbage().unwrap();
    assert_eq!((r.manifests, r.blocks), (1, 1), "{r:?}");
    assert!(!held(&back));
}

/// On an engine with etcd's limits (128 operations a transaction), a pass that deletes more
/// than one transaction holds still deletes it all, with or without a grace.
#[test]
fn a_pass_larger_than_one_transaction_of_the_engine_takes_it_all() {
    for grace in [Duration::ZERO, Duration::from_secs(1)] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::default();
        let (_, blocks) = blocks_in(dir.path());
        let engine = dir.path().join("engine");
        let tables =
            EngineTables::connect(move || async move { RocksEngine::open(&engine) }).unwrap();
        let meta = MetaStore::new(tables, blocks, Duration::from_secs(15), clock.shared());
        meta.set_gc_grace(grace);
        meta.collect_garbage().unwrap();
        for i in 0..300 {
            publish(
                &meta,
                &format!("many/k{i}"),
                format!("block {i}").as_bytes(),
            );
        }
        for i in 0..300 {
            remove(&meta, &format!("many/k{i}"));
        }
        let (mut manifests, mut blocks) = (0, 0);
        for _ in 0..4 {
            clock.advance(Duration::from_secs(2));
            let r = meta.collect_garbage().unwrap();
            manifests += r.manifests;
            blocks += r.blocks;
        }
        assert_eq!((manifests, blocks), (300, 300), "grace {grace:?}");
    }
}
