//! The host transport: buffer bytes between workers over TCP, for CPU-only clusters, host
//! buffers and the tests. A connection opens with `KTGH` and a version byte, then carries
//! pipelined requests `[registration u64][entry u32][offset u64][len u32]` (little-endian),
//! each answered in order by `[errno u32][len u32][bytes]`. A registration id is a random
//! 64-bit number only the agent and the workers it told know.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::memory::Buffers;
use super::WorkerError;
use crate::locks::lock;

const MAGIC: &[u8; 5] = b"KTGH\x01";
/// Bytes per request.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight on one connection.
const PIPELINE: usize = 8;

/// Registrations this worker serves, by id.
pub type Served = Arc<Mutex<HashMap<u64, Arc<Buffers>>>>;

/// Serves `served` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, served: Served) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let served = served.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, served).await {
                tracing::debug!(error = %e, "host transport connection ended");
            }
        });
    }
}

async fn serve_connection(stream: TcpStream, served: Served) -> Result<(), WorkerError> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut hello = [0u8; 5];
    rd.read_exact(&mut hello).await?;
    if &hello != MAGIC {
        return Err(WorkerError::Bad("not the ktfs host transport".into()));
    }
    let mut req = [0u8; 24];
    loop {
        match rd.read_exact(&mut req).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut w8 = [0u8; 8];
        let mut w4 = [0u8; 4];
        w8.copy_from_slice(&req[0..8]);
        let registration = u64::from_le_bytes(w8);
        w4.copy_from_slice(&req[8..12]);
        let entry = u32::from_le_bytes(w4);
        w8.copy_from_slice(&req[12..20]);
        let offset = u64::from_le_bytes(w8);
        w4.copy_from_slice(&req[20..24]);
        let len = u32::from_le_bytes(w4);
        let buffers = lock(&served).get(&registration).cloned();
        let answer = match buffers {
            None => Err(libc::ENOENT),
            Some(b) => tokio::task::spawn_blocking(move || {
                let buf = b.by_entry.get(&entry).ok_or(libc::ENOENT)?;
                if u64::from(len) > CHUNK
                    || offset
                        .checked_add(u64::from(len))
                        .is_none_or(|e| e > buf.nbytes)
                {
                    return Err(libc::EINVAL);
                }
                buf.read(offset, len as usize)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
            })
            .await
            .unwrap_or(Err(libc::EIO)),
        };
        let (errno, data) = match answer {
            Ok(d) => (0u32, d),
            Err(e) => (e as u32, Vec::new()),
        };
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&errno.to_le_bytes());
        head[4..].copy_from_slice(&(data.len() as u32).to_le_bytes());
        wr.write_all(&head).await?;
        wr.write_all(&data).await?;
    }
}

/// Fills every buffer of `dst` from `src_registration` at the worker at `addr`, entry by entry
/// and chunk by chunk, several requests in flight. Returns the bytes moved.
pub async fn fetch(
    addr: &str,
    src_registration: u64,
    dst: Arc<Buffers>,
) -> Result<u64, WorkerError> {
    let peer = |e: std::io::Error| WorkerError::Peer(format!("{addr}: {e}"));
    let stream = TcpStream::connect(addr).await.map_err(peer)?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(1 << 20, rd);
    let mut chunks = Vec::new();
    for (&entry, b) in &dst.by_entry {
        let mut at = 0;
        while at < b.nbytes {
            let len = CHUNK.min(b.nbytes - at);
            chunks.push((entry, at, len as u32));
            at += len;
        }
    }
    let window = Arc::new(Semaphore::new(PIPELINE));
    let send = {
        let (window, chunks) = (window.clone(), chunks.clone());
        async move {
            wr.write_all(MAGIC).await?;
            for (entry, at, len) in chunks {
                let Ok(permit) = window.acquire().await else {
                    break;
                };
                permit.forget();
                let mut req = [0u8; 24];
                req[0..8].copy_from_slice(&src_registration.to_le_bytes());
                req[8..12].copy_from_slice(&entry.to_le_bytes());
                req[12..20].copy_from_slice(&at.to_le_bytes());
                req[20..24].copy_from_slice(&len.to_le_bytes());
                wr.write_all(&req).await?;
            }
            Ok::<_, std::io::Error>(wr)
        }
    };
    let receive = async {
        let mut moved = 0u64;
        for &(entry, at, len) in &chunks {
            let got = receive_chunk(&mut rd, addr, entry, len).await;
            window.add_permits(1);
            let data = match got {
                Ok(d) => d,
                Err(e) => {
                    window.close();
                    return Err(e);
                }
            };
            let dst = dst.clone();
            tokio::task::spawn_blocking(move || match dst.by_entry.get(&entry) {
                Some(b) => b.write(at, &data),
                None => Ok(()),
            })
            .await
            .map_err(|e| WorkerError::Bad(e.to_string()))??;
            moved += u64::from(len);
        }
        Ok::<u64, WorkerError>(moved)
    };
    let (sent, moved) = tokio::join!(send, receive);
    let moved = moved?;
    sent.map_err(peer)?;
    Ok(moved)
}

async fn receive_chunk<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    addr: &str,
    entry: u32,
    len: u32,
) -> Result<Vec<u8>, WorkerError> {
    let peer = |e: std::io::Error| WorkerError::Peer(format!("{addr}: {e}"));
    let mut head = [0u8; 8];
    rd.read_exact(&mut head).await.map_err(peer)?;
    let errno = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let got = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if errno != 0 {
        return Err(WorkerError::Remote(
            errno as i32,
            format!("{addr} refused entry {entry}"),
        ));
    }
    if got != len {
        return Err(WorkerError::Peer(format!(
            "{addr} sent {got} bytes of entry {entry}, {len} were asked for"
        )));
    }
    let mut data = vec![0u8; got as usize];
    rd.read_exact(&mut data).await.map_err(peer)?;
    Ok(data)
}
