//! One suite, run on both engines: RocksDB in a temporary directory and a real etcd server
//! (Debian's, started on a loopback address). What one engine answers, the other must.

use std::sync::Arc;

use super::seam::OP_OVERHEAD;
use super::*;

/// Each case gets its own part of the keyspace, so that the cases share one engine.
async fn suite(engine: Arc<dyn MetaEngine>) {
    reads_see_what_a_transaction_wrote_at_its_revision(&*engine, b"a/").await;
    a_failed_compare_writes_nothing(&*engine, b"b/").await;
    ranges_come_in_pages_in_key_order(&*engine, b"c/").await;
    delete_range_takes_the_prefix_and_nothing_beside(&*engine, b"d/").await;
    the_limits_are_etcds_and_a_transaction_at_them_passes(&*engine, b"e/").await;
    keys_are_bytes(&*engine, &[b'f', 0xff, 0x00]).await;
    compare_and_swap_loses_no_update(engine.clone(), b"g/").await;
    several_reads_answer_as_each_would(&*engine, b"h/").await;
}

fn k(prefix: &[u8], rest: &str) -> Vec<u8> {
    [prefix, rest.as_bytes()].concat()
}

async fn reads_see_what_a_transaction_wrote_at_its_revision(e: &dyn MetaEngine, p: &[u8]) {
    assert_eq!(e.get(&k(p, "x")).await.unwrap(), None);
    let before = e.revision().await.unwrap();
    let rev = e
        .txn(Txn::new().put(k(p, "x"), "one").put(k(p, "y"), "two"))
        .await
        .unwrap();
    assert!(rev > before, "{rev} after {before}");
    let x = e.get(&k(p, "x")).await.unwrap().unwrap();
    assert_eq!((x.value.as_slice(), x.modified), (&b"one"[..], rev));
    assert_eq!(e.get(&k(p, "y")).await.unwrap().unwrap().modified, rev);
    assert!(e.revision().await.unwrap() >= rev);

    let rev2 = e
        .txn(Txn::new().put(k(p, "x"), "uno").delete(k(p, "y")))
        .await
        .unwrap();
    assert!(rev2 > rev);
    let x = e.get(&k(p, "x")).await.unwrap().unwrap();
    assert_eq!((x.value.as_slice(), x.modified), (&b"uno"[..], rev2));
    assert_eq!(e.get(&k(p, "y")).await.unwrap(), None);
}

async fn a_failed_compare_writes_nothing(e: &dyn MetaEngine, p: &[u8]) {
    // Absent compares as 0: a create that happens once.
    let created = e
        .txn(
            Txn::new()
                .when_modified_at(k(p, "lock"), 0)
                .put(k(p, "lock"), "me"),
        )
        .await
        .unwrap();
    let again = e
        .txn(
            Txn::new()
                .when_modified_at(k(p, "lock"), 0)
                .put(k(p, "lock"), "you")
                .put(k(p, "other"), "x"),
        )
        .await;
    assert!(matches!(again, Err(EngineError::Conflict)), "{again:?}");
    assert_eq!(e.get(&k(p, "lock")).await.unwrap().unwrap().value, b"me");
    assert_eq!(e.get(&k(p, "other")).await.unwrap(), None);

    // The revision read is the one to compare: a stale one fails, the current one passes.
    let stale = e
        .txn(
            Txn::new()
                .when_modified_at(k(p, "lock"), created - 1)
                .put(k(p, "lock"), "x"),
        )
        .await;
    assert!(matches!(stale, Err(EngineError::Conflict)), "{stale:?}");
    e.txn(
        Txn::new()
            .when_modified_at(k(p, "lock"), created)
            .delete(k(p, "lock")),
    )
    .await
    .unwrap();
    assert_eq!(e.get(&k(p, "lock")).await.unwrap(), None);
}

async fn ranges_come_in_pages_in_key_order(e: &dyn MetaEngine, p: &[u8]) {
    let mut txn = Txn::new();
    for i in (0..10).rev() {
        txn = txn.put(k(p, &format!("in/{i:02}")), format!("v{i}"));
    }
    // Beside the prefix: the key that is the prefix less its slash, and the next one.
    txn = txn.put(k(p, "in"), "no").put(k(p, "in0"), "no");
    e.txn(txn).await.unwrap();

    let prefix = k(p, "in/");
    let mut seen = Vec::new();
    let mut start: Option<Vec<u8>> = None;
    let mut pages = 0;
    loop {
        let page = e.range(&prefix, start.as_deref(), 3).await.unwrap();
        pages += 1;
        assert!(page.entries.len() <= 3);
        assert!(page.revision > 0);
        seen.extend(page.entries.iter().map(|en| en.value.clone()));
        match page.next_start() {
            Some(s) => start = Some(s),
            None => break,
        }
    }
    let want: Vec<Vec<u8>> = (0..10).map(|i| format!("v{i}").into_bytes()).collect();
    assert_eq!(seen, want);
    assert_eq!(pages, 4);

    let all = e.range(&prefix, None, 100).await.unwrap();
    assert_eq!((all.entries.len(), all.more), (10, false));
    let tail = e.range(&prefix, Some(&k(p, "in/08")), 100).await.unwrap();
    let keys: Vec<&[u8]> = tail.entries.iter().map(|en| &en.key[..]).collect();
    assert_eq!(keys, [&k(p, "in/08")[..], &k(p, "in/09")[..]]);
    let past = e
        .range(&prefix, Some(&just_after(&k(p, "in/08"))), 100)
        .await
        .unwrap();
    assert_eq!(past.entries.len(), 1);
    // A span: from in/03 and before in/06, whatever the limit; no more after its end.
    let span = e
        .range_before(&prefix, Some(&k(p, "in/03")), &k(p, "in/06"), 100)
        .await
        .unwrap();
    let values: Vec<&[u8]> = span.entries.iter().map(|en| &en.value[..]).collect();
    assert_eq!((values, span.more), (vec![&b"v3"[..], b"v4", b"v5"], false));
    let cut = e
        .range_before(&prefix, None, &k(p, "in/06"), 2)
        .await
        .unwrap();
    assert_eq!((cut.entries.len(), cut.more), (2, true));
    // A start before the prefix starts at its first key.
    let from_before = e.range(&prefix, Some(p), 2).await.unwrap();
    assert_eq!(from_before.entries[0].key, k(p, "in/00"));
    assert!(e
        .range(&k(p, "none/"), None, 5)
        .await
        .unwrap()
        .entries
        .is_empty());
}

async fn delete_range_takes_the_prefix_and_nothing_beside(e: &dyn MetaEngine, p: &[u8]) {
    e.txn(
        Txn::new()
            .put(k(p, "t/1"), "a")
            .put(k(p, "t/2/deep"), "b")
            .put(k(p, "t"), "c")
            .put(k(p, "u/1"), "d"),
    )
    .await
    .unwrap();
    let before = e.revision().await.unwrap();
    let rev = e.delete_range(&k(p, "t/")).await.unwrap();
    assert!(rev > before);
    assert!(e
        .range(&k(p, "t/"), None, 10)
        .await
        .unwrap()
        .entries
        .is_empty());
    assert!(e.get(&k(p, "t")).await.unwrap().is_some());
    assert!(e.get(&k(p, "u/1")).await.unwrap().is_some());
}

/// `read_many` answers what each `get` would, in order, and whether a prefix holds any key
/// (the key itself is not below it).
async fn several_reads_answer_as_each_would(e: &dyn MetaEngine, p: &[u8]) {
    e.txn(Txn::new().put(k(p, "x"), "1").put(k(p, "y/z"), "2"))
        .await
        .unwrap();
    let keys = [k(p, "y"), k(p, "x"), k(p, "none")];
    let (found, below) = e.read_many(&keys, Some(&k(p, "y/"))).await.unwrap();
    let values: Vec<Option<Vec<u8>>> = found.into_iter().map(|f| f.map(|e| e.value)).collect();
    assert_eq!(values, [None, Some(b"1".to_vec()), None]);
    assert!(below);
    let (found, below) = e.read_many(&keys[1..2], Some(&k(p, "x/"))).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].as_ref().map(|e| e.key.clone()), Some(k(p, "x")));
    assert!(!below, "x itself is no key below x/");
    let (found, below) = e.read_many(&[], None).await.unwrap();
    assert!(found.is_empty() && !below);
}

async fn the_limits_are_etcds_and_a_transaction_at_them_passes(e: &dyn MetaEngine, p: &[u8]) {
    let mut most = Txn::new();
    for i in 0..MAX_TXN_OPS {
        most = most.put(k(p, &format!("{i}")), "v");
    }
    e.txn(most.clone()).await.unwrap();
    let over = e.txn(most.put(k(p, "one-more"), "v")).await;
    assert!(
        matches!(over, Err(EngineError::TooLarge { writes: 129, .. })),
        "{over:?}"
    );
    assert_eq!(e.get(&k(p, "one-more")).await.unwrap(), None);

    // The largest value one transaction takes, and a byte more.
    let key = k(p, "big");
    let fits = MAX_TXN_BYTES - key.len() - OP_OVERHEAD;
    e.txn(Txn::new().put(key.clone(), vec![7u8; fits]))
        .await
        .unwrap();
    assert_eq!(e.get(&key).await.unwrap().unwrap().value.len(), fits);
    let too_big = e
        .txn(Txn::new().put(key.clone(), vec![7u8; fits + 1]))
        .await;
    assert!(
        matches!(too_big, Err(EngineError::TooLarge { .. })),
        "{too_big:?}"
    );

    let twice = e
        .txn(Txn::new().put(k(p, "dup"), "a").delete(k(p, "dup")))
        .await;
    assert!(
        matches!(twice, Err(EngineError::DuplicateKey(_))),
        "{twice:?}"
    );
}

async fn keys_are_bytes(e: &dyn MetaEngine, p: &[u8]) {
    let inside = [p, &[0xff, 0xff, 0x01][..]].concat();
    let beside = {
        let mut b = p.to_vec();
        *b.last_mut().unwrap() += 1;
        b
    };
    e.txn(
        Txn::new()
            .put(inside.clone(), [0u8, 1])
            .put(beside.clone(), "x"),
    )
    .await
    .unwrap();
    let page = e.range(p, None, 10).await.unwrap();
    let keys: Vec<&[u8]> = page.entries.iter().map(|en| &en.key[..]).collect();
    assert_eq!(keys, [&inside[..]]);
    assert_eq!(page.entries[0].value, [0u8, 1]);
    e.delete_range(p).await.unwrap();
    assert_eq!(e.get(&inside).await.unwrap(), None);
    assert!(e.get(&beside).await.unwrap().is_some());
}

/// Eight writers add one to a counter 25 times each, by read then compare-and-swap, retrying
/// on conflict: every increment lands once.
async fn compare_and_swap_loses_no_update(e: Arc<dyn MetaEngine>, p: &[u8]) {
    let key = k(p, "counter");
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let (e, key) = (e.clone(), key.clone());
            tokio::spawn(async move {
                let mut conflicts = 0u32;
                for _ in 0..25 {
                    loop {
                        let now = e.get(&key).await.unwrap();
                        let (n, at) = now.map_or((0u64, 0), |en| {
                            let bytes: [u8; 8] = en.value[..].try_into().unwrap();
                            (u64::from_be_bytes(bytes), en.modified)
                        });
                        let txn = Txn::new()
                            .when_modified_at(key.clone(), at)
                            .put(key.clone(), (n + 1).to_be_bytes());
                        match e.txn(txn).await {
                            Ok(_) => break,
                            Err(EngineError::Conflict) => conflicts += 1,
                            Err(other) => panic!("{other}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let end = e.get(&key).await.unwrap().unwrap();
    assert_eq!(end.value, 200u64.to_be_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_answers_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    suite(Arc::new(RocksEngine::open(dir.path()).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_keeps_entries_and_revisions_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let e = RocksEngine::open(dir.path()).unwrap();
    let rev = e.txn(Txn::new().put("k", "v")).await.unwrap();
    drop(e);
    let e = RocksEngine::open(dir.path()).unwrap();
    assert_eq!(e.revision().await.unwrap(), rev);
    assert_eq!(e.get(b"k").await.unwrap().unwrap().modified, rev);
    assert!(e.txn(Txn::new().put("k", "w")).await.unwrap() > rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_answers_the_suite() {
    let etcd = test_support::etcd::Etcd::start("127.0.0.79");
    let url: EtcdUrl = etcd.url("kt-test").parse().unwrap();
    let engine = EtcdEngine::connect(&url).await.unwrap();
    suite(Arc::new(engine.clone())).await;

    // The store's keys stay under its prefix: another prefix of the same etcd sees none.
    let other: EtcdUrl = etcd.url("another").parse().unwrap();
    let other = EtcdEngine::connect(&other).await.unwrap();
    assert!(other.range(b"", None, 10).await.unwrap().entries.is_empty());
    assert!(!engine
        .range(b"", None, 10)
        .await
        .unwrap()
        .entries
        .is_empty());

    // A member down (listed first here: nothing listens there) is passed over, at the start
    // and after: any member answers for the cluster.
    let mut with_one_down = url.clone();
    with_one_down
        .endpoints
        .insert(0, "http://127.0.0.79:1".to_string());
    let both = EtcdEngine::connect(&with_one_down).await.unwrap();
    both.txn(Txn::new().put("a/members", "any")).await.unwrap();
    assert_eq!(
        both.get(b"a/members").await.unwrap().map(|e| e.value),
        Some(b"any".to_vec())
    );

    // A member that is gone is an engine that cannot be reached, not a hang.
    drop(etcd);
    let gone = engine.get(b"a/x").await;
    assert!(matches!(gone, Err(EngineError::Unavailable(_))), "{gone:?}");
}

#[test]
fn etcd_addresses() {
    let u: EtcdUrl = "etcd://h1:2379,h2:2379/kt/prod/".parse().unwrap();
    assert_eq!(u.endpoints, ["http://h1:2379", "http://h2:2379"]);
    assert_eq!(u.prefix, "kt/prod/");
    assert_eq!(u.user, None);
    let u: EtcdUrl =
        "etcd://h1:2379/kt?ca=/c/ca.pem&cert=/c/me.pem&key=/c/me-key.pem&server_name=etcd"
            .parse()
            .unwrap();
    assert_eq!(u.endpoints, ["https://h1:2379"]);
    let tls = u.tls.unwrap();
    assert_eq!(tls.ca, std::path::Path::new("/c/ca.pem"));
    assert_eq!(
        tls.key.as_deref(),
        Some(std::path::Path::new("/c/me-key.pem"))
    );
    assert_eq!(tls.server_name.as_deref(), Some("etcd"));
    let u: EtcdUrl = "etcd://root:s3cret@h1:2379/kt".parse().unwrap();
    assert_eq!(u.user, Some(("root".into(), "s3cret".into())));
    assert!(!format!("{u:?}").contains("s3cret"));
    for bad in [
        "http://h1:2379/kt",
        "etcd://h1:2379",
        "etcd://h1:2379/",
        "etcd:///kt",
        "etcd://h1/kt",
        "etcd://root@h1:2379/kt",
        "etcd://h1:2379/kt?cert=/a&key=/b",
        "etcd://h1:2379/kt?ca=/a&cert=/b",
        "etcd://h1:2379/kt?ca=/a&insecure=1",
    ] {
        let e = bad.parse::<EtcdUrl>().unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }
    let e = "etcd://root:s3cret@h1/kt".parse::<EtcdUrl>().unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
}
