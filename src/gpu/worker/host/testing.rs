//! What the tests of the host transport, and of NCCL offers on it, share: host buffers in a
//! folder, and a worker serving them through a relay that keeps every byte the worker sent.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::conn::Source;
use super::frames::CHUNK;
use super::serve::{serve, Served};
use crate::auth::gpu_secret::Secret;
use crate::gpu::abi::BUF_HOST_SHM;
use crate::gpu::worker::memory::Buffers;
use crate::gpu::worker::p2p::Lane;
use crate::locks::lock;
use crate::proto::WorkerBuffer;

pub fn buffers(dir: &Path, name: &str, data: &[u8], receiving: bool) -> Arc<Buffers> {
    std::fs::write(dir.join(name), data).unwrap();
    let mut handle = vec![0u8; 64];
    handle[..name.len()].copy_from_slice(name.as_bytes());
    let b = WorkerBuffer {
        kind: BUF_HOST_SHM,
        nbytes: data.len() as u64,
        handle,
        ..Default::default()
    };
    Arc::new(Buffers::open(dir, &[b], receiving).unwrap())
}

/// What a relay saw the worker send, over all the connections through it.
pub type Seen = Arc<Mutex<Vec<u8>>>;

/// A worker serving `b` as registration 7, reached through a relay that keeps every byte
/// the worker sent (a byte is kept before it is passed on).
pub async fn served_through_relay(b: Arc<Buffers>, lane: Option<Arc<dyn Lane>>) -> (String, Seen) {
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to: SocketAddr = worker.local_addr().unwrap();
    let served: Served = Arc::default();
    lock(&served).insert(7, b);
    tokio::spawn(serve(worker, served, lane));
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = relay.local_addr().unwrap().to_string();
    let seen = Seen::default();
    let all = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut a, _)) = relay.accept().await {
            let seen = all.clone();
            tokio::spawn(async move {
                let mut b = TcpStream::connect(to).await.unwrap();
                let (mut ar, mut aw) = a.split();
                let (mut br, mut bw) = b.split();
                let up = async {
                    let _ = tokio::io::copy(&mut ar, &mut bw).await;
                    let _ = bw.shutdown().await;
                };
                let down = async {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = br.read(&mut buf).await {
                        lock(&seen).extend_from_slice(&buf[..n]);
                        if aw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = aw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (addr, seen)
}

/// Registration 7 at `addr`, as [`served_through_relay`] serves it.
pub fn at(addr: &str, secret: Option<Secret>) -> Source<'_> {
    Source {
        addr,
        registration: 7,
        secret,
        name: "the source",
    }
}

/// Whether any 64 bytes of `data` at a chunk's start appear in `wire`.
pub fn shows(wire: &[u8], data: &[u8]) -> bool {
    (0..data.len())
        .step_by(CHUNK as usize)
        .any(|at| wire.windows(64).any(|w| w == &data[at..at + 64]))
}
