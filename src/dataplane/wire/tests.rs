//! The two halves of the protocol against each other: tickets, upload slots, pipelining,
//! blocks sent from files, pieces.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::frame::BODY_ALIGN;
use super::*;
use crate::auth::ticket::{
    shared, Gate, Grant, SharedGate, TicketKey, TicketVerifiers, VersionBlocks, NODE_TTL, READ_TTL,
    WRITE_TTL,
};
use crate::auth::tls::Conn;
use crate::blocks::{BlockError, BlockServe, Served};
use crate::dataplane::piece;
use crate::hash::{BlockHash, Version};
use crate::manifest::MAX_BLOCK_SIZE;

#[derive(Default)]
struct Mem(Mutex<HashMap<BlockHash, Bytes>>);
impl BlockServe for Mem {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        Ok(self.0.lock().unwrap().get(hash).cloned().map(Served::Bytes))
    }
    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), BlockError> {
        self.0.lock().unwrap().insert(*hash, data);
        Ok(())
    }
}

struct Holds(BlockHash);
impl VersionBlocks for Holds {
    fn holds(&self, _v: &Version, hash: &BlockHash) -> bool {
        *hash == self.0
    }
}

#[tokio::test]
async fn a_gated_server_serves_what_the_tickets_presented_allow() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mem = Arc::new(Mem::default());
    let (mine, theirs) = (b"mine".to_vec(), b"theirs".to_vec());
    for b in [&mine, &theirs] {
        mem.put(&BlockHash::of(b), Bytes::from(b.clone())).unwrap();
    }
    let key = TicketKey::from_bytes(&[5; 32]).unwrap();
    let gate = shared(Gate::Tickets {
        key: TicketVerifiers::new(vec![key.verifier()]),
        versions: Some(Arc::new(Holds(BlockHash::of(&mine)))),
    });
    let svc: Arc<dyn BlockServe> = mem;
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve_connection(
                Conn::Plain(s),
                svc.clone(),
                gate.clone(),
                Arc::default(),
            ));
        }
    });
    let refused = |r: Response, why: &str| match r {
        Response::Error(m) => assert!(m.contains(why), "{m}"),
        other => panic!("{other:?}"),
    };
    // No ticket, a forged one: nothing.
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get(&BlockHash::of(&mine)).await.unwrap();
    refused(rx.recv().await.unwrap(), "no ticket");
    tx.get_piece(&BlockHash::of(&mine), 16, 0).await.unwrap();
    refused(rx.recv().await.unwrap(), "no ticket");
    let forged = TicketKey::from_bytes(&[6; 32])
        .unwrap()
        .issue(&Grant::Node, NODE_TTL);
    tx.ticket(&forged).await.unwrap();
    tx.get(&BlockHash::of(&mine)).await.unwrap();
    refused(rx.recv().await.unwrap(), "not issued by this cluster");
    // A read ticket: its version's blocks, not another's, and no uploads.
    let read = key.issue(&Grant::Read(Version([1; 32])), READ_TTL);
    tx.ticket(&read).await.unwrap();
    tx.get(&BlockHash::of(&mine)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
    tx.get(&BlockHash::of(&theirs)).await.unwrap();
    refused(rx.recv().await.unwrap(), "in no version");
    tx.put(&BlockHash::of(b"new"), b"new").await.unwrap();
    refused(rx.recv().await.unwrap(), "no ticket to upload");
    // An upload ticket takes blocks; a node's reaches every block.
    tx.ticket(&key.issue(&Grant::Write(crate::hash::Scope([3; 32])), WRITE_TTL))
        .await
        .unwrap();
    tx.put(&BlockHash::of(b"new"), b"new").await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Stored(_)));
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.ticket(&key.issue(&Grant::Node, NODE_TTL)).await.unwrap();
    tx.get(&BlockHash::of(&theirs)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
}

/// A data-plane server of `svc` on a free loopback port; its address.
async fn serving(svc: Arc<dyn BlockServe>, gate: SharedGate) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve_connection(
                Conn::Plain(s),
                svc.clone(),
                gate.clone(),
                Arc::default(),
            ));
        }
    });
    addr
}

/// Blocks in memory behind a given number of upload slots.
struct Slotted(Mem, Arc<tokio::sync::Semaphore>);
impl BlockServe for Slotted {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        self.0.get(hash)
    }
    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), BlockError> {
        self.0.put(hash, data)
    }
    fn upload_slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        Some(self.1.clone())
    }
}

#[tokio::test]
async fn swarm_requests_are_served_within_the_upload_slots_and_answered_busy_beyond() {
    let slots = Arc::new(tokio::sync::Semaphore::new(1));
    let svc = Arc::new(Slotted(Mem::default(), slots.clone()));
    let b = b"a block".to_vec();
    svc.put(&BlockHash::of(&b), Bytes::from(b.clone())).unwrap();
    let svc: Arc<dyn BlockServe> = svc;
    let addr = serving(svc, shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get_swarm(&BlockHash::of(&b)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
    // Every slot taken (by another downloader): busy at once; a plain GET is served.
    let taken = slots.clone().try_acquire_owned().unwrap();
    tx.get_swarm(&BlockHash::of(&b)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Busy(h) if h == BlockHash::of(&b)));
    tx.get(&BlockHash::of(&b)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
    drop(taken);
    tx.get_swarm(&BlockHash::of(&b)).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
    // The server gives the slot back once the block is written, which may be just after
    // the client read it.
    let back = tokio::time::timeout(Duration::from_secs(5), async {
        while slots.available_permits() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert!(back.await.is_ok(), "the slot is given back once sent");
}

#[tokio::test]
async fn pipelined_puts_and_gets_answer_in_order() {
    let svc: Arc<dyn BlockServe> = Arc::new(Mem::default());
    let addr = serving(svc, shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    let blocks: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1000 + i as usize]).collect();
    for b in &blocks {
        tx.put(&BlockHash::of(b), b).await.unwrap();
    }
    tx.put(&BlockHash::of(b"other"), b"lie").await.unwrap();
    for b in &blocks {
        assert!(matches!(rx.recv().await.unwrap(), Response::Stored(h) if h == BlockHash::of(b)));
    }
    assert!(matches!(rx.recv().await.unwrap(), Response::Error(_)));
    for b in blocks.iter().rev() {
        tx.get(&BlockHash::of(b)).await.unwrap();
    }
    tx.get(&BlockHash::of(b"missing")).await.unwrap();
    for b in blocks.iter().rev() {
        match rx.recv().await.unwrap() {
            Response::Block(h, d) => {
                assert_eq!(h, BlockHash::of(b));
                assert_eq!(&d[..], &b[..]);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(rx.recv().await.unwrap(), Response::NotFound(_)));

    // A frame over the limit ends that connection only.
    let mut raw = TcpStream::connect(&addr).await.unwrap();
    raw.write_all(b"KTDP\x01\x01\xff\xff\xff\xff")
        .await
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(raw.read(&mut buf).await.unwrap(), 0);
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get(&BlockHash::of(&blocks[0])).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(..)));
}

/// Serves every block from one file, whatever the hash: the file's length as it is now.
struct OneFile(std::path::PathBuf);
impl BlockServe for OneFile {
    fn get(&self, _hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        let err = |source| BlockError::Files {
            dir: self.0.display().to_string(),
            source,
        };
        let f = std::fs::File::open(&self.0).map_err(err)?;
        let len = f.metadata().map_err(err)?.len();
        Ok(Some(Served::File(f, len)))
    }
    fn put(&self, _hash: &BlockHash, _data: Bytes) -> Result<(), BlockError> {
        Err(BlockError::NoUploads)
    }
}

#[tokio::test]
async fn file_blocks_go_out_whole_with_sendfile_and_oversized_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("block");
    // Larger than a socket buffer, so sendfile returns short and waits for the reader.
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let svc: Arc<dyn BlockServe> = Arc::new(OneFile(path.clone()));
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve_connection(
                Conn::Plain(s),
                svc.clone(),
                shared(Gate::Open),
                Arc::default(),
            ));
        }
    });
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    for i in 0..3u8 {
        tx.get(&BlockHash::of(&[i])).await.unwrap();
    }
    for i in 0..3u8 {
        match rx.recv().await.unwrap() {
            Response::Block(h, d) => {
                assert_eq!(h, BlockHash::of(&[i]));
                assert!(d[..] == data[..], "block {i} came back different");
                // What a block cache writes with O_DIRECT must start on a page.
                assert_eq!(d.as_ptr() as usize % BODY_ALIGN, 0);
            }
            other => panic!("{other:?}"),
        }
    }
    // A file over the frame limit is an error answer, and the connection goes on.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(MAX_BLOCK_SIZE as u64 + 1)
        .unwrap();
    tx.get(&BlockHash::of(b"big")).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Error(_)));
    std::fs::write(&path, b"small again").unwrap();
    tx.get(&BlockHash::of(b"small")).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Block(_, d) if &d[..] == b"small again"));
}

#[tokio::test]
async fn pieces_come_with_the_values_that_check_them_from_memory_and_from_files() {
    // 1 MiB and 5 bytes in 64 KiB pieces: 17, the last of 5 bytes.
    let data: Vec<u8> = (0..(1u32 << 20) + 5)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let hash = BlockHash::of(&data);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("block");
    std::fs::write(&path, &data).unwrap();
    let mem = Mem::default();
    mem.put(&hash, Bytes::from(data.clone())).unwrap();
    let none = Arc::new(tokio::sync::Semaphore::new(0));
    for svc in [
        Arc::new(mem) as Arc<dyn BlockServe>,
        Arc::new(OneFile(path.clone())),
        Arc::new(OneFile(path)),
    ] {
        let addr = serving(svc, shared(Gate::Open)).await;
        let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
        for i in [16, 0, 7] {
            tx.get_piece(&hash, 16, i).await.unwrap();
        }
        for i in [16u32, 0, 7] {
            let Response::Piece(h, p) = rx.recv().await.unwrap() else {
                panic!("not a piece");
            };
            assert_eq!(h, hash);
            assert!(
                piece::check(&p, &hash, data.len() as u64, 16, i),
                "piece {i}"
            );
            assert!(!piece::check(
                &p,
                &hash,
                data.len() as u64,
                16,
                (i + 1) % 17
            ));
            let start = i as usize * 65536;
            assert_eq!(&p.data[..], &data[start..(start + 65536).min(data.len())]);
            let mut bad = p.clone();
            let last = bad.data.len() - 1;
            let mut bytes = bad.data.to_vec();
            bytes[last] ^= 1;
            bad.data = Bytes::from(bytes);
            assert!(
                !piece::check(&bad, &hash, data.len() as u64, 16, i),
                "a changed byte"
            );
        }
        let refused = |r: Response, why: &str| match r {
            Response::Error(m) => assert!(m.contains(why), "{m}"),
            other => panic!("{other:?}"),
        };
        tx.get_piece(&hash, 16, 17).await.unwrap();
        refused(rx.recv().await.unwrap(), "has 17 pieces");
        tx.get_piece(&hash, 8, 0).await.unwrap();
        refused(rx.recv().await.unwrap(), "no pieces of 2^8 bytes");
    }
    // Not held; and within the upload slots, as a swarm request is.
    let addr = serving(Arc::new(Mem::default()), shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get_piece(&hash, 16, 0).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::NotFound(_)));
    let addr = serving(Arc::new(Slotted(Mem::default(), none)), shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get_piece(&hash, 16, 0).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Busy(_)));
    // A block whose bytes here do not match its hash gives no piece (nor values to keep).
    let bad = Mem::default();
    let other = BlockHash::of(b"another block");
    bad.0
        .lock()
        .unwrap()
        .insert(other, Bytes::from(data.clone()));
    let addr = serving(Arc::new(bad), shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get_piece(&other, 16, 0).await.unwrap();
    match rx.recv().await.unwrap() {
        Response::Error(m) => assert!(m.contains("does not match its hash"), "{m}"),
        r => panic!("{r:?}"),
    }
}

#[tokio::test]
async fn a_piece_from_a_source_whose_block_lies_is_refused_and_taken_from_the_next() {
    use crate::dataplane::fetch::{fetch_partial_as, Ask, BlockJob, Sinks};
    use crate::dataplane::sources::SourceAddr;
    let data: Vec<u8> = (0..(300u32 << 10)).map(|i| (i * 13 % 251) as u8).collect();
    let hash = BlockHash::of(&data);
    // A liar whose bytes under the block's hash change once it served a piece: the values
    // it keeps are the block's, the bytes of its next piece are not.
    let (liar, honest) = (Arc::new(Mem::default()), Mem::default());
    liar.put(&hash, Bytes::from(data.clone())).unwrap();
    honest.put(&hash, Bytes::from(data.clone())).unwrap();
    let source = |label: &str, addr: String| SourceAddr {
        label: label.into(),
        addr,
        ticket: Bytes::new(),
        own: false,
    };
    let liar_addr = serving(liar.clone(), shared(Gate::Open)).await;
    let (mut tx, mut rx) = connect(&liar_addr, Peer::Store).await.unwrap();
    tx.get_piece(&hash, 16, 0).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Piece(..)));
    let mut other = data.clone();
    other[70_000] ^= 1;
    liar.0.lock().unwrap().insert(hash, Bytes::from(other));
    let sources = [
        source("liar", liar_addr),
        source(
            "honest",
            serving(Arc::new(honest), shared(Gate::Open)).await,
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(data.len() as u64 + 10).unwrap();
    let sinks = Arc::new(Sinks::new(vec![(path.clone(), data.len() as u64)]));
    let whole = BlockJob {
        hash,
        len: data.len() as u32,
        targets: vec![(0, 10)],
        piece: None,
    };
    // Piece 1 of 64 KiB pieces: the one the liar's change falls in.
    let job = whole.piece(16, 1).unwrap();
    assert_eq!(
        (job.len, job.targets.clone()),
        (65536, vec![(0, 10 + 65536)])
    );
    let progress = indicatif::ProgressBar::hidden();
    let peers = crate::dataplane::peers::Peers::default();
    let got = fetch_partial_as(&peers, vec![job], sinks, &sources, &progress, Ask::Swarm)
        .await
        .unwrap();
    assert!(got.pending.is_empty(), "{:?}", got.failures);
    assert!(
        got.failures
            .iter()
            .any(|f| f.source.label == "liar" && f.reason.contains("failed verification")),
        "{:?}",
        got.failures
    );
    assert_eq!(got.report.by_source.len(), 1);
    assert_eq!(got.report.by_source[0].0.label, "honest");
    let written = std::fs::read(&path).unwrap();
    assert_eq!(&written[10 + 65536..10 + 131072], &data[65536..131072]);
    assert!(
        written[..10 + 65536].iter().all(|&b| b == 0),
        "only the piece was written"
    );
    // A piece past the block's end, or of a cut the wire does not serve, is no job.
    assert!(whole.piece(16, 5).is_none());
    assert!(whole.piece(12, 0).is_none());
}

/// A peer that announces an answer far longer than the block asked for (64 MiB for 2 MiB) is
/// refused at the frame's head: the client reads none of it, rather than all of it before the
/// hash check refused it.
#[tokio::test]
async fn an_answer_longer_than_its_block_is_refused_at_its_head() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let liar = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut hello_and_get = [0u8; 5 + 5 + 32];
        s.read_exact(&mut hello_and_get).await.unwrap();
        let mut head = vec![super::frame::OP_BLOCK];
        head.extend_from_slice(&(64u32 << 20).to_be_bytes());
        head.extend_from_slice(&hello_and_get[10..]);
        s.write_all(&head).await.unwrap();
        // Open, with nothing more sent.
        s
    });
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.get(&BlockHash::of(b"two mebibytes")).await.unwrap();
    match rx.recv_at_most(2 << 20).await {
        Err(WireError::FrameTooLarge(n)) => assert_eq!(n, 64 << 20),
        other => panic!("{other:?}"),
    }
    drop(liar);
}

/// A server reads no frame over the small limit from a connection that presented no ticket
/// its gate admits, and closes it; one that presented a ticket may upload blocks.
#[tokio::test]
async fn a_connection_without_a_ticket_sends_only_small_frames() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let key = TicketKey::from_bytes(&[6; 32]).unwrap();
    let gate = shared(Gate::Tickets {
        key: TicketVerifiers::new(vec![key.verifier()]),
        versions: None,
    });
    let svc: Arc<dyn BlockServe> = Arc::new(Mem::default());
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let (svc, gate) = (svc.clone(), gate.clone());
            tokio::spawn(serve_connection(Conn::Plain(s), svc, gate, Arc::default()));
        }
    });
    let block = vec![5u8; 100_000];
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    // The server may close before the whole frame is written.
    let _ = tx.put(&BlockHash::of(&block), &block).await;
    assert!(
        matches!(rx.recv().await, Err(WireError::Closed | WireError::Io(_))),
        "a large frame without a ticket was read"
    );
    let (mut tx, mut rx) = connect(&addr, Peer::Store).await.unwrap();
    tx.ticket(&key.issue(&Grant::Write(crate::hash::Scope([3; 32])), WRITE_TTL))
        .await
        .unwrap();
    tx.put(&BlockHash::of(&block), &block).await.unwrap();
    assert!(matches!(rx.recv().await.unwrap(), Response::Stored(_)));
}
