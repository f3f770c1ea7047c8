//! The host transport: buffer bytes between workers over TCP, for CPU-only clusters, host
//! buffers and the tests. A connection opens with `KTGH` and a version byte, then carries
//! pipelined requests `[registration u64][offset u64][len u32]` (little-endian) for bytes of a
//! registration's run (its buffers in table order, see [`Buffers`]), each answered in order by
//! `[errno u32][len u32]` and then the bytes, or, for an errno, a message saying why. A request
//! for bytes a receiving registration does not hold yet waits until they arrive: that is what
//! lets a chain or tree of workers forward a transfer while it is still coming in. A
//! registration id is a random 64-bit number only the agent and the workers it told know.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::memory::Buffers;
use super::WorkerError;
use crate::locks::lock;

const MAGIC: &[u8; 5] = b"KTGH\x02";
/// Bytes per request.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight on one connection.
const PIPELINE: usize = 8;
/// A source that sends nothing for this long is taken for dead.
pub const STALL: Duration = Duration::from_secs(60);

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
        return Err(WorkerError::Bad(
            "not this version of the ktfs host transport".into(),
        ));
    }
    let mut req = [0u8; 20];
    loop {
        match rd.read_exact(&mut req).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let (registration, offset, len) = decode_request(&req);
        let answer = answer(&served, registration, offset, len).await;
        let (errno, body) = match answer {
            Ok(d) => (0u32, d),
            Err((e, why)) => (e as u32, why.into_bytes()),
        };
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&errno.to_le_bytes());
        head[4..].copy_from_slice(&(body.len() as u32).to_le_bytes());
        wr.write_all(&head).await?;
        wr.write_all(&body).await?;
    }
}

fn decode_request(req: &[u8; 20]) -> (u64, u64, u32) {
    let mut w8 = [0u8; 8];
    let mut w4 = [0u8; 4];
    w8.copy_from_slice(&req[0..8]);
    let registration = u64::from_le_bytes(w8);
    w8.copy_from_slice(&req[8..16]);
    let offset = u64::from_le_bytes(w8);
    w4.copy_from_slice(&req[16..20]);
    (registration, offset, u32::from_le_bytes(w4))
}

fn encode_request(registration: u64, offset: u64, len: u32) -> [u8; 20] {
    let mut req = [0u8; 20];
    req[0..8].copy_from_slice(&registration.to_le_bytes());
    req[8..16].copy_from_slice(&offset.to_le_bytes());
    req[16..20].copy_from_slice(&len.to_le_bytes());
    req
}

/// The bytes a request asks for, once they are there.
async fn answer(
    served: &Served,
    registration: u64,
    offset: u64,
    len: u32,
) -> Result<Vec<u8>, (i32, String)> {
    let b = lock(served)
        .get(&registration)
        .cloned()
        .ok_or((libc::ENOENT, format!("no registration {registration} here")))?;
    let end = offset
        .checked_add(u64::from(len))
        .filter(|&e| u64::from(len) <= CHUNK && e <= b.nbytes())
        .ok_or((
            libc::EINVAL,
            format!("{len} bytes at {offset} are not within the registration"),
        ))?;
    b.wait_filled(end).await?;
    tokio::task::spawn_blocking(move || b.read(offset, len as usize))
        .await
        .map_err(|e| (libc::EIO, e.to_string()))?
        .map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))
}

/// Fills `dst` from `src_registration` at the worker at `addr` (`source` names it in messages),
/// several requests in flight, chunks cut as [`Buffers::chunks`] says for `pack`. Returns the
/// bytes moved. On failure `dst` fails too, so that whoever receives from it learns why.
pub async fn fetch(
    addr: &str,
    src_registration: u64,
    source: &str,
    dst: Arc<Buffers>,
    pack: bool,
) -> Result<u64, WorkerError> {
    let r = fetch_into(addr, src_registration, source, &dst, pack).await;
    if let Err(e) = &r {
        dst.fail(e.errno(), e.to_string());
    }
    r
}

async fn fetch_into(
    addr: &str,
    src_registration: u64,
    source: &str,
    dst: &Arc<Buffers>,
    pack: bool,
) -> Result<u64, WorkerError> {
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let stream = TcpStream::connect(addr).await.map_err(peer)?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(1 << 20, rd);
    let chunks = dst.chunks(pack);
    let window = Arc::new(Semaphore::new(PIPELINE));
    let send = {
        let (window, chunks) = (window.clone(), chunks.clone());
        async move {
            wr.write_all(MAGIC).await?;
            for (at, len) in chunks {
                let Ok(permit) = window.acquire().await else {
                    break;
                };
                permit.forget();
                wr.write_all(&encode_request(src_registration, at, len))
                    .await?;
            }
            Ok::<_, std::io::Error>(wr)
        }
    };
    let receive = async {
        let mut moved = 0u64;
        for &(at, len) in &chunks {
            let got = tokio::time::timeout(STALL, receive_chunk(&mut rd, source, addr, len))
                .await
                .unwrap_or_else(|_| {
                    Err(WorkerError::Remote(
                        libc::ETIMEDOUT,
                        format!("{source} ({addr}) sent nothing for {} s", STALL.as_secs()),
                    ))
                });
            window.add_permits(1);
            let data = match got {
                Ok(d) => d,
                Err(e) => {
                    window.close();
                    return Err(e);
                }
            };
            let d = dst.clone();
            tokio::task::spawn_blocking(move || d.write(at, &data))
                .await
                .map_err(|e| WorkerError::Bad(e.to_string()))??;
            dst.filled(at + u64::from(len));
            moved += u64::from(len);
        }
        Ok::<u64, WorkerError>(moved)
    };
    let (sent, moved) = tokio::join!(send, receive);
    let moved = moved?;
    sent.map_err(peer)?;
    Ok(moved)
}

/// A connection to a peer worker that failed: one that ended mid-transfer is a member gone
/// (closed, or dead before its buffers' failure reached us), as ECONNABORTED says.
fn peer_failed(source: &str, addr: &str, e: std::io::Error) -> WorkerError {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => WorkerError::Remote(
            libc::ECONNABORTED,
            format!("{source} ({addr}) went away mid-transfer: {e}"),
        ),
        _ => WorkerError::Peer(format!("{source} ({addr}): {e}")),
    }
}

async fn receive_chunk<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    source: &str,
    addr: &str,
    len: u32,
) -> Result<Vec<u8>, WorkerError> {
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let mut head = [0u8; 8];
    rd.read_exact(&mut head).await.map_err(peer)?;
    let errno = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let got = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if errno != 0 {
        // The body is the reason: short text, but bounded all the same.
        let mut why = vec![0u8; got.min(4096) as usize];
        rd.read_exact(&mut why).await.map_err(peer)?;
        return Err(WorkerError::Remote(
            errno as i32,
            format!("{source}: {}", String::from_utf8_lossy(&why)),
        ));
    }
    if got != len {
        return Err(WorkerError::Peer(format!(
            "{source} ({addr}) sent {got} bytes, {len} were asked for"
        )));
    }
    let mut data = vec![0u8; got as usize];
    rd.read_exact(&mut data).await.map_err(peer)?;
    Ok(data)
}
