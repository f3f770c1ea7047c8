//! A put's blocks reach the store while its scan still hashes later ones: the queue from the
//! scan's hashing threads (`EarlyUpload`) against a real store server in this process.

use std::path::Path;
use std::time::Duration;

use indicatif::ProgressBar;
use ktfs::auth::Credential;
use ktfs::hash::BlockHash;
use ktfs::manifest::BlockRef;
use ktfs::proto::MissingBlocksRequest;
use ktfs::rpc::Store;
use ktfs::server::StoreServerProcess;
use ktfs::transfer::put::early::EarlyUpload;

/// A store server in this process, on a data directory of its own.
struct Server {
    addr: String,
    store: Store,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), ktfs::server::ServerError>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let srv = StoreServerProcess::bind("127.0.0.116:0", dir.path(), Duration::from_secs(30))
            .await
            .unwrap();
        let addr = srv.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(srv.run(async move {
            let _ = stopped.await;
        }));
        let store = ktfs::rpc::client::connect_store(&addr, &Credential::none())
            .await
            .unwrap();
        Server {
            addr,
            store,
            stop,
            served,
            _dir: dir,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.served.await.unwrap().unwrap();
    }
}

async fn lacks(store: &Store, hash: &BlockHash) -> bool {
    let resp = store
        .missing_blocks(MissingBlocksRequest {
            hashes: vec![hash.0.to_vec()],
            namespace: "default".into(),
        })
        .await
        .unwrap();
    !resp.hashes.is_empty()
}

/// A block handed over is in the store before the queue is closed: sent while the scan
/// goes on, not after it. A block the store holds is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_reach_the_store_while_the_scan_goes_on() {
    let server = Server::start().await;
    let (addr, store) = (server.addr.clone(), server.store.clone());
    let early = EarlyUpload::start(
        store.clone(),
        addr.clone(),
        "default".into(),
        ProgressBar::hidden(),
    );
    let sink = early.sink();
    let blocks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 3 << 20]).collect();
    let refs: Vec<BlockRef> = blocks
        .iter()
        .map(|b| BlockRef {
            hash: BlockHash::of(b).0.to_vec(),
            len: b.len() as u32,
        })
        .collect();
    let first = BlockHash::of(&blocks[0]);
    assert!(lacks(&store, &first).await);
    // The scan's threads are blocking ones.
    let (b0, r0) = (blocks[0].clone(), refs[0].clone());
    let sink = tokio::task::spawn_blocking(move || {
        sink(Path::new("a"), 0, &r0, &b0);
        sink
    })
    .await
    .unwrap();
    let mut waited = 0;
    while lacks(&store, &first).await {
        assert!(
            waited < 200,
            "the block did not arrive before the scan ended"
        );
        waited += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The rest, one of them a block the store already holds.
    let rest: Vec<(BlockRef, Vec<u8>)> = vec![
        (refs[1].clone(), blocks[1].clone()),
        (refs[0].clone(), blocks[0].clone()),
        (refs[2].clone(), blocks[2].clone()),
    ];
    tokio::task::spawn_blocking(move || {
        for (r, b) in rest {
            sink(Path::new("a"), 0, &r, &b);
        }
    })
    .await
    .unwrap();
    let sent = early.finish().await;
    assert_eq!(sent, 3 * (3 << 20));
    for b in &blocks {
        assert!(!lacks(&store, &BlockHash::of(b)).await);
    }
    server.stop().await;
}

/// Two identical files hashed at once hand over the same block twice before the queue is
/// drained (here: both before the task runs, on this one-thread runtime): it is sent once.
#[tokio::test(flavor = "current_thread")]
async fn a_block_handed_over_twice_in_one_batch_is_sent_once() {
    let server = Server::start().await;
    let (addr, store) = (server.addr.clone(), server.store.clone());
    let early = EarlyUpload::start(store.clone(), addr, "default".into(), ProgressBar::hidden());
    let sink = early.sink();
    let block = vec![7u8; 1 << 20];
    let r = BlockRef {
        hash: BlockHash::of(&block).0.to_vec(),
        len: block.len() as u32,
    };
    sink(Path::new("a"), 0, &r, &block);
    sink(Path::new("b"), 0, &r, &block);
    drop(sink);
    assert_eq!(early.finish().await, block.len() as u64);
    assert!(!lacks(&store, &BlockHash::of(&block)).await);
    server.stop().await;
}
