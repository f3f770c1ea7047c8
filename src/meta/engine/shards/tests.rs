use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::*;

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("replica-{i:02}")).collect()
}

#[test]
fn shards_are_shared_fairly_the_same_everywhere_and_a_departure_moves_few() {
    for (count, n) in [(8u32, 2usize), (64, 3), (64, 5), (64, 16), (16, 16), (4, 7)] {
        let live = ids(n);
        let a = assign(count, &live);
        assert_eq!(a, assign(count, &live), "not the same twice");
        let mut load = vec![0; n];
        for r in &a {
            load[r.expect("a shard with no replica")] += 1;
        }
        let fair = (count as usize).div_ceil(n);
        assert!(
            load.iter().all(|&l| l <= fair),
            "{count} over {n}: {load:?}"
        );

        // The last replica leaves: its shards move, and at most two fair shares of others
        // (where there are several shards a replica, as a store has: with as many replicas
        // as shards, each fair share is one shard and grows to two, which moves anything).
        if n > 1 && count as usize >= 4 * n {
            let fewer = assign(count, &live[..n - 1]);
            let moved = (0..count as usize)
                .filter(|&s| a[s] != Some(n - 1) && fewer[s] != a[s])
                .count();
            assert!(
                moved <= 2 * (count as usize).div_ceil(n - 1),
                "{count} over {n}: {moved} shards of the staying replicas moved"
            );
        }
    }
    assert!(assign(8, &[]).iter().all(Option::is_none));
}

#[test]
fn a_namespace_keeps_its_shard() {
    assert_eq!(shard_of("team-a", 64), shard_of("team-a", 64));
    assert_eq!(shard_of("anything", 1), 0);
    let spread: BTreeSet<u32> = (0..200).map(|i| shard_of(format!("ns-{i}"), 8)).collect();
    assert_eq!(spread.len(), 8, "200 namespaces on 8 shards: {spread:?}");
}

/// A replica's election running in the background: what it last saw, and the shards it
/// drained before handing them over.
struct Running {
    view: watch::Receiver<ShardView>,
    drained: Arc<Mutex<Vec<u32>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn start(url: &EtcdUrl, id: &str) -> Running {
    let e = ShardElector::new(url, &format!("{id}:1"), id, Duration::from_secs(2), 8);
    let (tx, view) = watch::channel(ShardView::default());
    let drained = Arc::new(Mutex::new(Vec::new()));
    let d = drained.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(e.run(
        tx,
        move |s| {
            d.lock().unwrap().push(s);
            async {}
        },
        async move {
            let _ = stopped.await;
        },
    ));
    Running {
        view,
        drained,
        stop: Some(stop),
        task,
    }
}

fn held(r: &Running) -> BTreeSet<u32> {
    r.view.borrow().held.keys().copied().collect()
}

/// Waits until the replicas' claims cover every shard once, each holding what `expect` says
/// it should (a count), looking again at each replica's next view; panics after 20 s.
async fn settled(rs: &[&Running], expect: &[usize]) {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut views: Vec<watch::Receiver<ShardView>> = rs.iter().map(|r| r.view.clone()).collect();
    loop {
        let sets: Vec<BTreeSet<u32>> = views
            .iter_mut()
            .map(|v| v.borrow_and_update().held.keys().copied().collect())
            .collect();
        let all: BTreeSet<u32> = sets.iter().flatten().copied().collect();
        let total: usize = sets.iter().map(BTreeSet::len).sum();
        let counts: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        if all.len() == 8 && total == 8 && counts == expect {
            return;
        }
        let next =
            futures_util::future::select_all(views.iter_mut().map(|v| Box::pin(v.changed())));
        let waited = tokio::time::timeout_at(until, next).await;
        assert!(waited.is_ok(), "never settled: {sets:?}, not {expect:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_take_a_dead_ones_and_hand_some_to_a_newcomer() {
    let etcd = test_support::etcd::Etcd::start("127.0.0.118");
    let url: EtcdUrl = etcd.url("kt-shards").parse().unwrap();
    let a = start(&url, "a");
    let b = start(&url, "b");
    let mut c = start(&url, "c");
    // Fair shares of 8 over three: 3, 3 and 2 in some order.
    let expect = |r: &[String]| -> Vec<usize> {
        let a = assign(8, r);
        (0..r.len())
            .map(|i| a.iter().filter(|x| **x == Some(i)).count())
            .collect()
    };
    let three: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    settled(&[&a, &b, &c], &expect(&three)).await;
    // The fence of each claim is its key's revision in etcd.
    let client = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    let mut kv = client.kv_client();
    for (shard, rev) in a.view.borrow().held.clone() {
        let got = kv
            .get(format!("kt-shards/owner/{shard}"), None)
            .await
            .unwrap();
        assert_eq!(got.kvs()[0].mod_revision(), rev);
    }

    // c stops and gives its shards up at once; a and b take them.
    let _ = c.stop.take().unwrap().send(());
    c.task.await.unwrap();
    let two: Vec<String> = ["a", "b"].map(String::from).to_vec();
    settled(&[&a, &b], &expect(&two)).await;

    // b dies without a word: its lease runs out (2 s) and a takes every shard.
    b.task.abort();
    settled(&[&a], &[8]).await;

    // A newcomer gets its share: a drains each shard it hands over before letting it go.
    a.drained.lock().unwrap().clear();
    let d = start(&url, "d");
    let ad: Vec<String> = ["a", "d"].map(String::from).to_vec();
    settled(&[&a, &d], &expect(&ad)).await;
    let drained: BTreeSet<u32> = a.drained.lock().unwrap().iter().copied().collect();
    assert_eq!(
        drained,
        held(&d),
        "a handed over shards it did not drain first"
    );
}
