use super::*;
use crate::meta::engine::counted::Counted;
use crate::meta::engine::{RocksEngine, OWNER_KEY};

fn tables() -> (tempfile::TempDir, EngineTables) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let t = EngineTables::connect(move || async move { RocksEngine::open(&path) }).unwrap();
    (dir, t)
}

#[test]
fn the_tables_keep_apart_and_walk_as_the_core_expects() {
    let (_d, t) = tables();
    let mut ops: Vec<Op> = (0..600)
        .map(|i| Op::Put(Table::Keys, format!("ns\0d/{i:03}").into_bytes(), vec![1]))
        .collect();
    ops.push(Op::Put(Table::Attrs, b"ns\0d/000".to_vec(), vec![2]));
    // 601 writes: more than one transaction holds, in one change, is refused whole.
    assert!(t.commit(vec![ops.clone()]).is_err());
    assert!(t.get(Table::Keys, b"ns\0d/000").unwrap().is_none());
    // As many changes of one write each, they pack into a few transactions.
    t.commit(ops.into_iter().map(|o| vec![o]).collect())
        .unwrap();
    assert_eq!(t.scan_prefix(Table::Keys, b"ns\0d/").unwrap().len(), 600);
    assert_eq!(t.scan_prefix(Table::Attrs, b"").unwrap().len(), 1);
    let mut n = 0;
    t.for_each(Table::Keys, &mut |_, _| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 600);
    // Past the first 7 bytes ("ns\0d/0N"): one key per ten.
    let mut seen = Vec::new();
    t.walk_prefix(Table::Keys, b"ns\0d/", &mut |k, _| {
        seen.push(k.to_vec());
        Step::Past(7)
    })
    .unwrap();
    assert_eq!(seen.len(), 60);
    assert_eq!(seen[1], b"ns\0d/010");
    // From a key within the prefix: a page of a listing begins there.
    let mut from = Vec::new();
    t.walk_from(Table::Keys, b"ns\0d/", (b"ns\0d/5\0", None), &mut |k, _| {
        from.push(k.to_vec());
        Step::Next
    })
    .unwrap();
    assert_eq!((from.len(), from[0].as_slice()), (100, &b"ns\0d/500"[..]));
    let mut one = 0;
    t.walk_prefix(Table::Keys, b"", &mut |_, _| {
        one += 1;
        Step::Stop
    })
    .unwrap();
    assert_eq!(one, 1);
}

/// A batch of publishes into one directory touches the directory in each: the later
/// writes of it join the transaction the earlier ones are in, so 256 changes make three
/// transactions (128 writes each at most), not 256, and the directory keeps the last.
#[test]
fn changes_that_write_one_key_again_pack_into_few_transactions() {
    let (_d, t) = tables();
    let changes: Vec<Vec<Op>> = (0..256u32)
        .map(|i| {
            vec![
                Op::Put(Table::Keys, format!("ns\0d/{i:03}").into_bytes(), vec![1]),
                Op::Put(Table::Attrs, b"ns\0d".to_vec(), i.to_be_bytes().to_vec()),
            ]
        })
        .collect();
    let txns = t.pack(changes.clone(), None).unwrap();
    assert_eq!(
        txns.len(),
        3,
        "{:?}",
        txns.iter().map(|t| t.writes.len()).collect::<Vec<_>>()
    );
    for txn in &txns {
        txn.check().unwrap();
    }
    t.commit(changes).unwrap();
    assert_eq!(
        t.get(Table::Attrs, b"ns\0d").unwrap().unwrap(),
        255u32.to_be_bytes()
    );
    assert_eq!(t.scan_prefix(Table::Keys, b"ns\0d/").unwrap().len(), 256);
}

/// The layout's number is written at the first start; an engine a newer build wrote is
/// refused at the start, before anything is read or written as this build's layout.
/// A replica writes only while the owner key is still at its claim: once another claim
/// replaced it, a batch writes nothing, and the fence stays broken.
#[test]
fn a_fenced_replica_writes_only_while_its_claim_stands() {
    let (_dir, t) = tables();
    let fence = Arc::new(Fence::default());
    let t = t.fenced(fence.clone());
    let put = |k: &str| vec![vec![Op::Put(Table::Keys, k.into(), b"v".to_vec())]];
    let err = t.commit(put("standing-by")).unwrap_err();
    assert!(err.to_string().contains("stands by"), "{err}");
    let claim = |who: &'static str| {
        t.call(move |e| Box::pin(async move { e.txn(Txn::new().put(OWNER_KEY, who)).await }))
            .unwrap()
    };
    fence.hold(claim("me"));
    t.commit(put("owned")).unwrap();
    assert!(t.get(Table::Keys, b"owned").unwrap().is_some());
    claim("another replica");
    let err = t.commit(put("deposed")).unwrap_err();
    assert!(err.to_string().contains("took the store over"), "{err}");
    assert!(t.get(Table::Keys, b"deposed").unwrap().is_none());
    assert!(fence.is_broken());
    assert!(t.commit(put("after")).is_err());
}

/// A namespace of its own shard, other than those of `others`.
fn namespace_of_a_shard(shards: u32, others: &[u32]) -> (String, u32) {
    (0..)
        .map(|i| format!("ns{i}"))
        .map(|ns| {
            let s = shard_of(&ns, shards);
            (ns, s)
        })
        .find(|(_, s)| !others.contains(s))
        .unwrap()
}

/// Of a store in shards, a replica writes the rows of the namespaces whose shards it
/// holds, each transaction comparing the claim of each shard it writes; another
/// shard's write refuses the batch before anything is sent; what names no namespace
/// goes unfenced; a shard another replica claimed is lost alone, and the rest written on.
#[test]
fn a_replica_of_a_sharded_store_writes_the_rows_of_its_shards_alone() {
    let (_dir, t) = tables();
    let fence = Arc::new(Fence::default());
    let t = t.with_shards(4).unwrap().fenced(fence.clone());
    assert_eq!(fence.shards(), 4);
    let (a, sa) = namespace_of_a_shard(4, &[]);
    let (b, sb) = namespace_of_a_shard(4, &[sa]);
    let (c, sc) = namespace_of_a_shard(4, &[sa, sb]);
    let claim = |s: u32, who: &'static str| {
        let key = claim_key(s, 4);
        t.call(move |e| Box::pin(async move { e.txn(Txn::new().put(key, who)).await }))
            .unwrap()
    };
    let (ra, rc) = (claim(sa, "me"), claim(sc, "me"));
    fence.hold_shards(&[(sa, ra), (sc, rc)].into_iter().collect());
    let put = |ns: &str, k: &str| Op::Put(Table::Keys, format!("{ns}\0{k}").into(), vec![1]);
    // One transaction, both held shards' claims compared.
    let batch = vec![vec![put(&a, "x")], vec![put(&c, "y")]];
    let txns = t.pack(batch.clone(), Some(&fence)).unwrap();
    assert_eq!(txns.len(), 1);
    let mut compared: Vec<_> = txns[0].compares.iter().map(|c| c.key.clone()).collect();
    compared.sort();
    let mut want = vec![claim_key(sa, 4), claim_key(sc, 4)];
    want.sort();
    assert_eq!(compared, want);
    t.commit(batch).unwrap();
    assert!(t
        .get(Table::Keys, format!("{a}\0x").as_bytes())
        .unwrap()
        .is_some());
    // A shard not held: the whole batch refused, nothing sent.
    let err = t
        .commit(vec![vec![put(&a, "z")], vec![put(&b, "z")]])
        .unwrap_err();
    assert_eq!(
        crate::meta::commit::refusal(&err),
        Some(crate::meta::commit::Refusal::NotOwner)
    );
    assert!(err.to_string().contains(&format!("shard {sb}")), "{err}");
    assert!(t
        .get(Table::Keys, format!("{a}\0z").as_bytes())
        .unwrap()
        .is_none());
    // A manifest names no namespace: no claim compared.
    let m = vec![vec![Op::Put(Table::Manifests, b"v1".to_vec(), vec![2])]];
    assert!(t.pack(m.clone(), Some(&fence)).unwrap()[0]
        .compares
        .is_empty());
    t.commit(m).unwrap();
    // Another replica claims a's shard: a's write is refused and the shard lost, alone.
    let lost = fence.lost();
    claim(sa, "another replica");
    let err = t.commit(vec![vec![put(&a, "w")]]).unwrap_err();
    assert!(err.to_string().contains("claimed a shard"), "{err}");
    assert!(!fence.held().contains_key(&sa) && fence.held().contains_key(&sc));
    assert_eq!(*lost.borrow(), 1);
    assert!(!fence.is_broken());
    t.commit(vec![vec![put(&c, "after")]]).unwrap();
}

/// A store's shard count is written once: a replica asking another is refused, one asking
/// none follows the store, and a store a replica owns whole is not divided under it.
#[test]
fn a_stores_shard_count_is_fixed_while_it_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(RocksEngine::open(dir.path()).unwrap());
    let open = |e: &Arc<RocksEngine>| {
        let e = Counted::new(e.clone());
        EngineTables::connect(move || async move { Ok(e) }).unwrap()
    };
    let t = open(&engine);
    assert_eq!(t.shards(), 1);
    // Owned whole: not divided.
    t.call(|e| Box::pin(async move { e.txn(Txn::new().put(OWNER_KEY, "r1")).await }))
        .unwrap();
    let err = open(&engine).with_shards(8).err().unwrap();
    assert!(err.to_string().contains("owns the store whole"), "{err}");
    t.call(|e| Box::pin(async move { e.txn(Txn::new().delete(OWNER_KEY)).await }))
        .unwrap();
    assert_eq!(open(&engine).with_shards(8).unwrap().shards(), 8);
    assert_eq!(
        open(&engine).shards(),
        8,
        "a replica asking none follows the store"
    );
    let err = open(&engine).with_shards(4).err().unwrap();
    assert!(err.to_string().contains("8 shards"), "{err}");
    assert!(open(&engine).with_shards(MAX_SHARDS + 1).is_err());
}

/// The owner keeps in memory what it writes of its tables, but not the block references,
/// which other replicas write too: one deleted behind its back (a standby's table, here
/// the engine itself) is read again, and its own writes of them take no memory.
#[test]
fn an_owner_keeps_no_block_reference_in_memory() {
    let (_dir, t) = tables();
    let fence = Arc::new(Fence::default());
    let t = t.fenced(fence.clone());
    let claim = t
        .call(|e| Box::pin(async move { e.txn(Txn::new().put(OWNER_KEY, "me")).await }))
        .unwrap();
    fence.hold(claim);
    let write = |table: Table, k: &[u8]| {
        t.commit(vec![vec![Op::Put(table, k.to_vec(), Vec::new())]])
            .unwrap()
    };
    write(Table::Keys, b"key");
    write(Table::BlockRefs, b"ref");
    let known = |table: Table, k: &[u8]| {
        matches!(
            t.owned.get((0, claim), &engine_key(table, k)),
            Lookup::Known(_)
        )
    };
    assert!(known(Table::Keys, b"key"), "the owner's memory is on");
    assert!(!known(Table::BlockRefs, b"ref"));
    let gone = engine_key(Table::BlockRefs, b"ref");
    t.call(move |e| Box::pin(async move { e.txn(Txn::new().delete(gone)).await }))
        .unwrap();
    assert!(t.get(Table::BlockRefs, b"ref").unwrap().is_none());
}

#[test]
fn a_walk_of_small_manifests_grows_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    // A walk reads nothing but pages: each read the engine counts is one.
    let engine = Counted::new(Arc::new(RocksEngine::open(dir.path()).unwrap()));
    let pages = engine.reads.clone();
    let t = EngineTables::connect(move || async move { Ok(engine) }).unwrap();
    let manifest = |i: u32, len: usize| {
        let mut k = [0u8; 32];
        k[..4].copy_from_slice(&i.to_be_bytes());
        Op::Put(Table::Manifests, k.to_vec(), vec![7; len])
    };
    t.commit((0..1000).map(|i| vec![manifest(i, 200)]).collect())
        .unwrap();
    let walk = |t: &EngineTables| {
        let before = pages.load(Ordering::Relaxed);
        let mut n = 0;
        t.walk_prefix(Table::Manifests, b"", &mut |_, _| {
            n += 1;
            Step::Next
        })
        .unwrap();
        (n, pages.load(Ordering::Relaxed) - before)
    };
    let (n, asked) = walk(&t);
    assert_eq!(n, 1000);
    // 4, 8, 16, 32, then 64 a page: 19 pages (250 at 4 a page).
    assert!(asked <= 20, "{asked} pages");
    // Large ones after them: the walk is whole (the page that meets them halves the next).
    t.commit((1000..1040).map(|i| vec![manifest(i, 1 << 20)]).collect())
        .unwrap();
    let (n, _) = walk(&t);
    assert_eq!(n, 1040);
}

#[test]
fn an_engine_a_newer_build_wrote_is_refused_and_an_older_layout_upgraded_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let open =
        |p: std::path::PathBuf| EngineTables::connect(move || async move { RocksEngine::open(&p) });
    let t = open(dir.path().to_path_buf()).unwrap();
    let read = |t: &EngineTables| {
        t.call(|e| Box::pin(async move { e.get(SCHEMA_KEY).await }))
            .unwrap()
            .map(|en| en.value)
    };
    assert_eq!(read(&t), Some(SCHEMA.to_string().into_bytes()));
    // An older layout is brought up to this one at the start.
    t.call(|e| Box::pin(async move { e.txn(Txn::new().put(SCHEMA_KEY, "1")).await }))
        .unwrap();
    drop(t);
    let t = open(dir.path().to_path_buf()).unwrap();
    assert_eq!(read(&t), Some(SCHEMA.to_string().into_bytes()));
    drop(t);
    // Started again, the same build serves it.
    let t = open(dir.path().to_path_buf()).unwrap();
    t.call(|e| Box::pin(async move { e.txn(Txn::new().put(SCHEMA_KEY, "999")).await }))
        .unwrap();
    drop(t);
    match open(dir.path().to_path_buf()) {
        Err(EngineError::Schema(m)) => assert!(m.contains("newer ktfs"), "{m}"),
        other => panic!("a newer layout was served: {:?}", other.err()),
    }
}

#[test]
fn a_change_that_writes_a_key_twice_keeps_the_last_write() {
    let (_d, t) = tables();
    t.write_synced(vec![
        Op::Put(Table::Keys, b"k".to_vec(), b"1".to_vec()),
        Op::Delete(Table::Keys, b"k".to_vec()),
        Op::Put(Table::Keys, b"k".to_vec(), b"2".to_vec()),
    ])
    .unwrap();
    assert_eq!(t.get(Table::Keys, b"k").unwrap().unwrap(), b"2");
    // Two changes of one batch that write the same key: the later one wins.
    t.commit(vec![
        vec![Op::Put(Table::Keys, b"k".to_vec(), b"3".to_vec())],
        vec![Op::Put(Table::Keys, b"k".to_vec(), b"4".to_vec())],
    ])
    .unwrap();
    assert_eq!(t.get(Table::Keys, b"k").unwrap().unwrap(), b"4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn called_from_an_async_thread_it_answers_and_drops_without_a_panic() {
    let (_d, t) = tables();
    t.write(vec![Op::Put(Table::Manifests, b"v".to_vec(), vec![9; 10])])
        .unwrap();
    assert_eq!(t.get(Table::Manifests, b"v").unwrap().unwrap().len(), 10);
    drop(t);
}

/// What the engine keeps beside the tables (the layout, the claims, the replicas' and the
/// nodes' keys) begins with no table's tag: a table's walk, a rebuild of the references or a
/// collection would read it as the table's, and delete it.
#[test]
fn the_keys_beside_the_tables_lie_outside_every_table() {
    let tables = [
        Table::Keys,
        Table::Manifests,
        Table::Locations,
        Table::Attrs,
        Table::Inodes,
        Table::Graveyard,
        Table::BlockRefs,
        Table::Blocks,
    ];
    let beside = [
        SCHEMA_KEY,
        SHARDS_KEY,
        OWNER_KEY,
        super::super::shards::REPLICAS,
        super::super::shards::CLAIMS,
        super::super::nodes::NODES,
        super::super::gc_board::BOARD.as_bytes(),
    ];
    for key in beside {
        for table in tables {
            assert_ne!(
                key.first(),
                Some(&tag(table)),
                "{:?} lies in {table:?}",
                String::from_utf8_lossy(key)
            );
        }
    }
}
