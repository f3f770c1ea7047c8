//! What planning a new name reads of an engine: one request, and nothing it remembers of an
//! empty prefix outlives a key written below it.

use std::sync::atomic::{AtomicUsize, Ordering};
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
use crate::meta::engine::counted::Counted;
use crate::meta::engine::{EngineTables, RocksEngine};

/// A store on a counted engine (its blocks on disk), and the count of its reads.
fn counted_store(dir: &std::path::Path) -> (MetaStore, Arc<AtomicUsize>, ManualClock) {
    let engine = Counted::new(Arc::new(RocksEngine::open(&dir.join("engine")).unwrap()));
    let reads = engine.reads.clone();
    let tables = EngineTables::connect(move || async move { Ok(engine) }).unwrap();
    let db = Db::open(&dir.join("db"), &store::FAMILIES, &[CF_BLOCKS]).unwrap();
    let files = BlockFiles::open(&dir.join("blocks")).unwrap();
    let blocks = Arc::new(StoreBlocks::new(db, files));
    let clock = ManualClock::default();
    let meta = MetaStore::new(tables, blocks, Duration::from_secs(15), clock.shared());
    (meta, reads, clock)
}

fn publish(meta: &MetaStore, ns: &Namespace, key: &str, data: &[u8]) -> Result<(), MetaError> {
    publish_for(meta, ns, key, data, 0)
}

fn publish_for(
    meta: &MetaStore,
    ns: &Namespace,
    key: &str,
    data: &[u8],
    ttl_secs: u64,
) -> Result<(), MetaError> {
    meta.blocks().put(&BlockHash::of(data), data).unwrap();
    let key = KeyPath::parse(key).unwrap();
    meta.publish(Publish {
        ttl_secs,
        ..Publish::new(ns, &key, &one_block(data))
    })
    .map(|_| ())
}

fn remove(meta: &MetaStore, ns: &Namespace, key: &str) {
    meta.remove(ns, &KeyPath::parse(key).unwrap(), false, false)
        .unwrap();
}

/// A file written into a directory the store planned in before costs one read of the
/// engine: its record, its attributes and whether any key lies below it, asked together.
#[test]
fn a_new_name_is_planned_with_one_read_of_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, reads, _) = counted_store(dir.path());
    let ns = Namespace::parse("team").unwrap();
    // The first two find the directory: its record, its attributes, a key stored below it.
    publish(&meta, &ns, "d/f0", b"first").unwrap();
    publish(&meta, &ns, "d/f1", b"second").unwrap();
    for i in 2..8 {
        let before = reads.load(Ordering::SeqCst);
        publish(
            &meta,
            &ns,
            &format!("d/f{i}"),
            format!("file {i}").as_bytes(),
        )
        .unwrap();
        assert_eq!(reads.load(Ordering::SeqCst) - before, 1, "file {i}");
    }
}

/// What the planner remembered of the keys below a name holds only until a key is stored
/// there: a file published at a name that has since become a directory of keys is refused.
#[test]
fn a_prefix_read_empty_is_forgotten_once_a_key_lands_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _, _) = counted_store(dir.path());
    let ns = Namespace::parse("team").unwrap();
    // Planning "p" read "p/" empty.
    publish(&meta, &ns, "p", b"a file").unwrap();
    remove(&meta, &ns, "p");
    publish(&meta, &ns, "p/q", b"below").unwrap();
    let err = publish(&meta, &ns, "p", b"a file again").unwrap_err();
    assert!(matches!(err, MetaError::Exists(_)), "{err}");
    // And on a store that only reads: a listing shows the directory.
    let below = meta
        .list_dir_only(&ns, Some(&KeyPath::parse("p").unwrap()))
        .unwrap();
    assert!(below.dir.is_some(), "p is a directory of keys");
}

/// A key the planner found below a name stops counting once a batch removes it, or once it
/// expires: a file may then be published at the name.
#[test]
fn a_key_found_below_a_name_counts_until_it_is_removed_or_expires() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _, clock) = counted_store(dir.path());
    let ns = Namespace::parse("team").unwrap();
    for f in ["d/f0", "d/f1", "d/f2"] {
        publish(&meta, &ns, f, f.as_bytes()).unwrap();
    }
    for f in ["d/f0", "d/f1", "d/f2"] {
        remove(&meta, &ns, f);
    }
    publish(&meta, &ns, "d", b"a file where a directory was").unwrap();

    publish_for(&meta, &ns, "e/short", b"lives ten seconds", 10).unwrap();
    publish(&meta, &ns, "e/x", b"x").unwrap();
    publish(&meta, &ns, "e/y", b"y").unwrap();
    remove(&meta, &ns, "e/x");
    remove(&meta, &ns, "e/y");
    let err = publish(&meta, &ns, "e", b"too soon").unwrap_err();
    assert!(matches!(err, MetaError::Exists(_)), "{err}");
    clock.advance(Duration::from_secs(11));
    publish(&meta, &ns, "e", b"a file where a key expired").unwrap();
}
