//! Tests of the namespaces' block references on an engine that several replicas share.

use std::sync::Arc;
use std::time::Duration;

use super::tests::one_block;
use super::*;
use crate::blocks::files::MIN_FILE_BLOCK;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};
use crate::meta::engine::counted::Counted;
use crate::meta::engine::{EngineTables, Fence, MetaEngine, RocksEngine, Txn, OWNER_KEY};
use crate::objects::{ObjectUrl, Objects};

/// A replica of the store on `engine` and the objects at `objects`, with a data directory of
/// its own (`dir`): it writes while `fence` holds.
fn replica(
    engine: &Arc<RocksEngine>,
    objects: &ObjectUrl,
    dir: &std::path::Path,
    fence: &Arc<Fence>,
) -> MetaStore {
    let engine = engine.clone();
    // One engine, which each replica's tables reach as they would one etcd.
    let tables = EngineTables::connect(move || async move { Ok(Counted::new(engine)) })
        .unwrap()
        .fenced(fence.clone());
    let tables = Arc::new(tables);
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.join("db"), &families, &[CF_BLOCKS]).unwrap();
    let blocks = StoreBlocks::on_objects(db, Arc::new(Objects::open(objects).unwrap()))
        .with_references(Arc::new(TableRefs(tables.clone())));
    let clock = ManualClock::default();
    MetaStore::new(
        tables,
        Arc::new(blocks),
        Duration::from_secs(15),
        clock.shared(),
    )
}

/// Claims the store for `fence`'s replica, as its election would.
fn claim(engine: &Arc<RocksEngine>, fence: &Fence, who: &str) {
    let engine = engine.clone();
    let put = Txn::new().put(OWNER_KEY, who);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    fence.hold(rt.block_on(async move { engine.txn(put).await }).unwrap());
}

/// The references live in the engine: a block uploaded to a replica that stands by counts at
/// the owner's publish, and a replica that takes the store over finds them complete (nothing
/// rebuilt from the keys) with those of uploads whose publish has not come yet; another
/// namespace still uploads the block itself. Before, each replica kept its own in its data
/// directory: the owner's publish found the standby's upload missing, and a new owner rebuilt
/// them from every key and lost the unpublished uploads'.
#[test]
fn replicas_share_the_namespaces_references_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(RocksEngine::open(&dir.path().join("engine")).unwrap());
    let objects = ObjectUrl::Dir(dir.path().join("objects"));
    let (fence_a, fence_b) = (Arc::new(Fence::default()), Arc::new(Fence::default()));
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let a = replica(&engine, &objects, &dir.path().join("a"), &fence_a);
    let b = replica(&engine, &objects, &dir.path().join("b"), &fence_b);
    claim(&engine, &fence_a, "a");
    assert!(a.separate_namespaces(true).unwrap().is_some());
    let (ns, other) = (
        Namespace::parse("team-a").unwrap(),
        Namespace::parse("team-b").unwrap(),
    );
    let scope = a.scope_of(&ns).unwrap();
    let k = |s: &str| KeyPath::parse(s).unwrap();
    let block = |b: u8| vec![b; MIN_FILE_BLOCK + 1];
    let (one, two) = (block(1), block(2));

    // Uploaded to b, which stands by; published at a, the owner.
    b.blocks()
        .put_for(&[scope], &BlockHash::of(&one), &one)
        .unwrap();
    a.publish(Publish::new(&ns, &k("w"), &one_block(&one)))
        .unwrap();
    // Uploaded to b; a dies before the publish.
    b.blocks()
        .put_for(&[scope], &BlockHash::of(&two), &two)
        .unwrap();
    claim(&engine, &fence_b, "b");
    assert_eq!(b.separate_namespaces(true).unwrap(), None, "rebuilt");
    b.publish(Publish::new(&ns, &k("w2"), &one_block(&two)))
        .unwrap();
    let other_scope = b.scope_of(&other).unwrap();
    let h = BlockHash::of(&one);
    assert_eq!(
        b.blocks().missing_for(Some(&other_scope), &[h]).unwrap(),
        [h]
    );
    assert!(matches!(
        b.publish(Publish::new(&other, &k("w"), &one_block(&one))),
        Err(MetaError::MissingBlocks(1))
    ));
    // The deposed owner changes no reference (a standby adds them, it removes none).
    assert!(a.blocks().remove_references(&[(scope, h)]).is_err());
    assert!(b
        .blocks()
        .missing_for(Some(&scope), &[h])
        .unwrap()
        .is_empty());
}
