//! The host transport: buffer bytes between workers over TCP, for CPU-only clusters, host
//! buffers and the tests.
//!
//! A connection is for one registration. It opens with a hello, `KTGH` and a version byte, the
//! registration (u64), whether the connection is sealed (u8) and the client's fresh value (32
//! bytes), answered by a verdict `[errno u32][len u32]` and, for an errno, a message saying
//! why; a sealed connection's server then sends its own fresh value. Then it carries pipelined
//! requests `[offset u64][len u32]` for bytes of the registration's run (its buffers in table
//! order, see [`Buffers`]), each answered in order by `[errno u32][len u32]` and then the
//! bytes, or, for an errno, the message. All integers are little-endian. A request for bytes a
//! receiving registration does not hold yet waits until they arrive: that is what lets a chain
//! or tree of workers forward a transfer while it is still coming in.
//!
//! Where the cluster issues secrets (a store server with authentication, see
//! `rpc::gpu_secret`), a registration is served only on sealed connections: every request and
//! answer travels as a frame sealed under keys drawn from the registration's secret and both
//! fresh values ([`sealed`](super::sealed)), so only a worker its agent gave the secret (from
//! an answer of the store server that checked the caller's namespace) is served, and what
//! crosses the network is ciphertext. Elsewhere a registration id is a random 64-bit number
//! that only the agent and the workers it told know.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use super::collective;
use super::memory::Buffers;
use super::p2p::{self, Lane};
use crate::auth::sealed::{self, Direction, TAG};
use super::WorkerError;
use crate::locks::lock;
use crate::auth::gpu_secret::Secret;

const MAGIC: &[u8; 5] = b"KTGH\x03";
const HELLO: usize = 5 + 8 + 1 + 32;
const REQUEST: usize = 12;
const HEAD: usize = 8;
/// The longest message a refusal or a failed request carries.
const MAX_WHY: u32 = 4096;
/// Bytes per request.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight on one connection.
const PIPELINE: usize = 8;
/// Chunks being made ready at once on either side of a connection (read and sealed, opened and
/// written), beyond the one on the wire: enough to keep two cores busy, few enough that a
/// connection holds little memory.
const OVERLAP: usize = 2;
/// A source that sends nothing for this long is taken for dead.
pub const STALL: Duration = Duration::from_secs(60);

/// Registrations this worker serves, by id.
pub type Served = Arc<Mutex<HashMap<u64, Arc<Buffers>>>>;

/// Serves `served` on `listener` until the process ends; `lane`, where this worker can move
/// CUDA bytes over NCCL, answers a getter's offer to take them that way ([`p2p`]).
pub async fn serve(listener: TcpListener, served: Served, lane: Option<Arc<dyn Lane>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (served, lane) = (served.clone(), lane.clone());
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, served, lane).await {
                tracing::debug!(error = %e, "host transport connection ended");
            }
        });
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

pub(super) fn head(errno: u32, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEAD + TAG);
    h.extend_from_slice(&errno.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// The registration a hello asks for, if this connection may have its bytes.
fn admit(
    served: &Served,
    registration: u64,
    sealed: bool,
) -> Result<(Arc<Buffers>, Option<Secret>), (i32, String)> {
    let b = lock(served)
        .get(&registration)
        .cloned()
        .ok_or((libc::ENOENT, format!("no registration {registration} here")))?;
    let secret = b.secret().copied();
    match (secret.is_some(), sealed) {
        (true, false) => Err((
            libc::EACCES,
            format!(
                "registration {registration} is served sealed, to workers given its secret by \
                 the store server; this one has none"
            ),
        )),
        (false, true) => Err((
            libc::EPROTO,
            format!(
                "registration {registration} has no secret here: its node's agent has no key \
                 from the store server"
            ),
        )),
        _ => Ok((b, secret)),
    }
}

async fn serve_connection(
    stream: TcpStream,
    served: Served,
    lane: Option<Arc<dyn Lane>>,
) -> Result<(), WorkerError> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut hello = [0u8; HELLO];
    rd.read_exact(&mut hello).await?;
    if &hello[..5] != MAGIC {
        return Err(WorkerError::Bad(
            "not this version of the ktfs host transport".into(),
        ));
    }
    let registration = u64_at(&hello, 5);
    let (b, secret) = match admit(&served, registration, hello[13] != 0) {
        Ok(x) => x,
        Err((errno, why)) => {
            let mut refusal = head(errno as u32, why.len() as u32);
            refusal.extend_from_slice(why.as_bytes());
            wr.write_all(&refusal).await?;
            return Ok(());
        }
    };
    wr.write_all(&head(0, 0)).await?;
    let mut keys = match secret {
        Some(secret) => {
            let mut client = [0u8; 32];
            client.copy_from_slice(&hello[14..]);
            let server = sealed::hello()?;
            wr.write_all(&server).await?;
            let k = sealed::keys(&secret, &client, &server);
            Some((k.to_server, k.to_client))
        }
        None => None,
    };
    let frame = REQUEST + if keys.is_some() { TAG } else { 0 };
    // Answers are made (read, and sealed) OVERLAP at a time on tasks of their own, so that one
    // chunk's sealing overlaps the next one's read, and written in the order asked.
    let (tx, mut rx) = mpsc::channel::<Answer>(OVERLAP);
    let writer = async move {
        while let Some(answer) = rx.recv().await {
            let made = answer
                .await
                .map_err(|e| WorkerError::Bad(e.to_string()))??;
            if let Some((h, body)) = made {
                wr.write_all(&h).await?;
                wr.write_all(&body).await?;
            }
        }
        Ok::<_, WorkerError>(())
    };
    let reader = async move {
        loop {
            let mut req = vec![0u8; frame];
            match rd.read_exact(&mut req).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(WorkerError::from(e)),
            }
            let sealer = match keys.as_mut() {
                Some((opener, sealer)) => {
                    let frames = (sealer.take(), sealer.take());
                    if !opener.open(&mut req) {
                        // Answered under this side's keys, which the caller's do not open: it
                        // learns that the secrets differ, not that the connection broke.
                        let why = format!(
                            "a request that registration {registration}'s secret does not open"
                        );
                        let refusal = seal(
                            Some((sealer.clone(), frames)),
                            head(libc::EACCES as u32, why.len() as u32),
                            why.clone().into_bytes(),
                        );
                        let _ = tx
                            .send(tokio::spawn(async move { Ok(Some(refusal)) }))
                            .await;
                        return Err(WorkerError::Bad(why));
                    }
                    Some((sealer.clone(), frames))
                }
                None => None,
            };
            let (offset, len) = (u64_at(&req, 0), u32_at(&req, 8));
            if len == p2p::OFFER {
                // The last request on this connection: the NCCL transfer that may follow ends
                // it, and the connection's end (the getter done, or gone) stops that transfer.
                let body = read_offer(&mut rd, keys.as_mut().map(|k| &mut k.0), offset).await?;
                // The answer goes out as the frames taken for this request; the verdict after
                // it.
                let answer_frames = sealer;
                let verdict_frames = keys
                    .as_mut()
                    .map(|(_, d)| (d.clone(), (d.take(), d.take())));
                let stop = Arc::new(collective::Stop::default());
                let (answer, verdict) =
                    p2p::answer_offer(b.clone(), body, lane.clone(), stop.clone());
                let answer = tokio::spawn(async move {
                    Ok(answer
                        .await
                        .ok()
                        .map(|(h, body)| seal(answer_frames, h, body)))
                });
                let verdict = tokio::spawn(async move {
                    let made = verdict.await.ok().flatten();
                    Ok(made.map(|(h, body)| seal(verdict_frames, h, body)))
                });
                if tx.send(answer).await.is_err() || tx.send(verdict).await.is_err() {
                    stop.stop_in_background();
                    return Ok(());
                }
                drop(tx);
                let mut rest = [0u8; 64];
                while let Ok(1..) = rd.read(&mut rest).await {}
                stop.stop_in_background();
                return Ok(());
            }
            let b = b.clone();
            let made = tokio::spawn(async move {
                let (errno, body) = match answer(&b, offset, len).await {
                    Ok(d) => (0u32, d),
                    Err((e, why)) => (e as u32, why.into_bytes()),
                };
                let h = head(errno, body.len() as u32);
                match sealer {
                    None => Ok(Some((h, body))),
                    // Off the runtime's threads: a chunk's sealing takes a millisecond or so.
                    sealer => tokio::task::spawn_blocking(move || Some(seal(sealer, h, body)))
                        .await
                        .map_err(|e| WorkerError::Bad(e.to_string())),
                }
            });
            if tx.send(made).await.is_err() {
                return Ok(());
            }
        }
    };
    let (read, written) = tokio::join!(reader, writer);
    written?;
    read
}

/// A received chunk being opened and written: whether it opened, and how the write went.
type Landing = tokio::task::JoinHandle<Result<bool, std::io::Error>>;

/// An answer being made: its head and body, sealed where the connection is (none: nothing to
/// send after all).
type Answer = tokio::task::JoinHandle<Result<Option<(Vec<u8>, Vec<u8>)>, WorkerError>>;

/// An offer's body of `len` bytes, opened where the connection is sealed.
async fn read_offer<R: AsyncRead + Unpin>(
    rd: &mut R,
    opener: Option<&mut Direction>,
    len: u64,
) -> Result<Vec<u8>, WorkerError> {
    if len > p2p::MAX_OFFER {
        return Err(WorkerError::Bad(format!("an NCCL offer of {len} bytes")));
    }
    let tag = if opener.is_some() { TAG } else { 0 };
    let mut body = vec![0u8; len as usize + tag];
    rd.read_exact(&mut body).await?;
    if let Some(o) = opener {
        if !o.open(&mut body) {
            return Err(WorkerError::Bad(
                "an NCCL offer that the registration's secret does not open".into(),
            ));
        }
    }
    Ok(body)
}

/// `head` and `body` sealed as the frames given (the head's, the body's), or as they are.
fn seal(
    sealer: Option<(Direction, (u64, u64))>,
    mut h: Vec<u8>,
    mut body: Vec<u8>,
) -> (Vec<u8>, Vec<u8>) {
    if let Some((d, (hf, bf))) = sealer {
        d.seal_at(hf, &mut h);
        d.seal_at(bf, &mut body);
    }
    (h, body)
}

/// The bytes a request asks for, once they are there.
async fn answer(b: &Arc<Buffers>, offset: u64, len: u32) -> Result<Vec<u8>, (i32, String)> {
    let end = offset
        .checked_add(u64::from(len))
        .filter(|&e| u64::from(len) <= CHUNK && e <= b.nbytes())
        .ok_or((
            libc::EINVAL,
            format!("{len} bytes at {offset} are not within the registration"),
        ))?;
    b.wait_filled(end).await?;
    let b = b.clone();
    tokio::task::spawn_blocking(move || b.read(offset, len as usize))
        .await
        .map_err(|e| (libc::EIO, e.to_string()))?
        .map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))
}

/// The registration a GET pulls from.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    /// Its worker's data address.
    pub addr: &'a str,
    pub registration: u64,
    /// Its secret, where the cluster issues them.
    pub secret: Option<Secret>,
    /// Who that is, for messages.
    pub name: &'a str,
}

/// Fills `dst` from `src`, several requests in flight, chunks cut as [`Buffers::chunks`] says
/// for `pack`; sealed where the cluster issued a secret. Returns the bytes moved. On failure
/// `dst` fails too, so that whoever receives from it learns why.
pub async fn fetch(src: Source<'_>, dst: Arc<Buffers>, pack: bool) -> Result<u64, WorkerError> {
    let r = fetch_into(src, &dst, pack).await;
    if let Err(e) = &r {
        dst.fail(e.errno(), e.to_string());
    }
    r
}

async fn fetch_into(src: Source<'_>, dst: &Arc<Buffers>, pack: bool) -> Result<u64, WorkerError> {
    let Conn {
        mut rd,
        mut wr,
        mut sealer,
        mut opener,
    } = connect(src).await?;
    let Source {
        addr, name: source, ..
    } = src;
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let chunks = dst.chunks(pack);
    let window = Arc::new(Semaphore::new(PIPELINE));
    let send = {
        let (window, chunks) = (window.clone(), chunks.clone());
        async move {
            for (at, len) in chunks {
                let Ok(permit) = window.acquire().await else {
                    break;
                };
                permit.forget();
                let mut req = Vec::with_capacity(REQUEST + TAG);
                req.extend_from_slice(&at.to_le_bytes());
                req.extend_from_slice(&len.to_le_bytes());
                if let Some(s) = sealer.as_mut() {
                    s.seal(&mut req);
                }
                wr.write_all(&req).await?;
            }
            Ok::<_, std::io::Error>(wr)
        }
    };
    let receive = async {
        let mut moved = 0u64;
        // Chunks being opened and written, OVERLAP at most, in order: the buffers count as
        // filled up to the end of each only once every chunk before it is written.
        let mut landing: VecDeque<(u64, u32, Landing)> = VecDeque::new();
        let settle = |(at, len, task): (u64, u32, Landing)| async move {
            match task.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    return Err(WorkerError::Peer(format!(
                        "{source} ({addr}) sent bytes that the registration's secret does not \
                         open"
                    )))
                }
                Ok(Err(e)) => return Err(WorkerError::from(e)),
                Err(e) => return Err(WorkerError::Bad(e.to_string())),
            }
            dst.filled(at + u64::from(len));
            Ok(u64::from(len))
        };
        for &(at, len) in &chunks {
            let got = tokio::time::timeout(
                STALL,
                receive_chunk(&mut rd, opener.as_mut(), source, addr, Want::Exactly(len)),
            )
            .await
            .unwrap_or_else(|_| {
                Err(WorkerError::Remote(
                    libc::ETIMEDOUT,
                    format!("{source} ({addr}) sent nothing for {} s", STALL.as_secs()),
                ))
            });
            window.add_permits(1);
            let mut data = match got {
                Ok(d) => d,
                Err(e) => {
                    window.close();
                    return Err(e);
                }
            };
            // Opened (when sealed) and written off the runtime's threads.
            let o = opener.as_mut().map(|o| (o.take(), o.clone()));
            let d = dst.clone();
            landing.push_back((
                at,
                len,
                tokio::task::spawn_blocking(move || {
                    if let Some((frame, o)) = o {
                        if !o.open_at(frame, &mut data) {
                            return Ok(false);
                        }
                    }
                    d.write(at, &data).map(|()| true)
                }),
            ));
            while landing.len() > OVERLAP {
                let Some(front) = landing.pop_front() else {
                    break;
                };
                match settle(front).await {
                    Ok(n) => moved += n,
                    Err(e) => {
                        window.close();
                        return Err(e);
                    }
                }
            }
        }
        while let Some(front) = landing.pop_front() {
            moved += settle(front).await?;
        }
        Ok::<u64, WorkerError>(moved)
    };
    let (sent, moved) = tokio::join!(send, receive);
    let moved = moved?;
    sent.map_err(peer)?;
    Ok(moved)
}

/// A connection to a peer worker for one registration, past its hello: sealed, where there is a
/// secret, under keys for each direction.
pub struct Conn {
    pub rd: BufReader<OwnedReadHalf>,
    pub wr: OwnedWriteHalf,
    pub sealer: Option<Direction>,
    pub opener: Option<Direction>,
}

/// Connects to `src`'s worker for its registration.
pub async fn connect(src: Source<'_>) -> Result<Conn, WorkerError> {
    let Source {
        addr,
        registration,
        secret,
        name: source,
    } = src;
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let stream = TcpStream::connect(addr).await.map_err(peer)?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(1 << 20, rd);
    let client = sealed::hello()?;
    let mut hello = Vec::with_capacity(HELLO);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&registration.to_le_bytes());
    hello.push(u8::from(secret.is_some()));
    hello.extend_from_slice(&client);
    wr.write_all(&hello).await.map_err(peer)?;
    let mut verdict = [0u8; HEAD];
    rd.read_exact(&mut verdict).await.map_err(peer)?;
    let (errno, len) = (u32_at(&verdict, 0), u32_at(&verdict, 4));
    if errno != 0 {
        return Err(refusal(&mut rd, errno, len, source, addr).await);
    }
    let keys = match secret {
        Some(secret) => {
            let mut server = [0u8; 32];
            rd.read_exact(&mut server).await.map_err(peer)?;
            let k = sealed::keys(&secret, &client, &server);
            Some((k.to_server, k.to_client))
        }
        None => None,
    };
    let (sealer, opener) = keys.unzip();
    Ok(Conn {
        rd,
        wr,
        sealer,
        opener,
    })
}

impl Conn {
    /// Sends an NCCL offer ([`p2p`]): a request of [`p2p::OFFER`] bytes whose offset says the
    /// body's length, then the body.
    pub async fn send_offer(&mut self, body: Vec<u8>) -> std::io::Result<()> {
        let mut req = Vec::with_capacity(REQUEST + TAG);
        req.extend_from_slice(&(body.len() as u64).to_le_bytes());
        req.extend_from_slice(&p2p::OFFER.to_le_bytes());
        let mut body = body;
        if let Some(s) = self.sealer.as_mut() {
            s.seal(&mut req);
            s.seal(&mut body);
        }
        self.wr.write_all(&req).await?;
        self.wr.write_all(&body).await
    }

    /// The next answer, of at most `max` bytes, opened: an errno it carries is an error.
    pub async fn receive(
        &mut self,
        max: u32,
        source: &str,
        addr: &str,
    ) -> Result<Vec<u8>, WorkerError> {
        let mut data = receive_chunk(
            &mut self.rd,
            self.opener.as_mut(),
            source,
            addr,
            Want::AtMost(max),
        )
        .await?;
        if let Some(o) = self.opener.as_mut() {
            if !o.open(&mut data) {
                return Err(WorkerError::Peer(format!(
                    "{source} ({addr}) answered under keys the registration's secret does not \
                     open"
                )));
            }
        }
        Ok(data)
    }
}

/// How long an answer must be.
#[derive(Clone, Copy)]
enum Want {
    /// The bytes a request asked for.
    Exactly(u32),
    AtMost(u32),
}

/// The reason a refused hello or a failed request carries, as the error it is.
async fn refusal<R: AsyncRead + Unpin>(
    rd: &mut R,
    errno: u32,
    len: u32,
    source: &str,
    addr: &str,
) -> WorkerError {
    let mut why = vec![0u8; len.min(MAX_WHY) as usize];
    if let Err(e) = rd.read_exact(&mut why).await {
        return peer_failed(source, addr, e);
    }
    WorkerError::Remote(
        errno as i32,
        format!("{source}: {}", String::from_utf8_lossy(&why)),
    )
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

/// The next answer: its bytes as they came (still sealed on a sealed connection), once its
/// head said it carries as many bytes as `want`.
async fn receive_chunk<R: AsyncRead + Unpin>(
    rd: &mut R,
    opener: Option<&mut Direction>,
    source: &str,
    addr: &str,
    want: Want,
) -> Result<Vec<u8>, WorkerError> {
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let tag = if opener.is_some() { TAG } else { 0 };
    let mut h = vec![0u8; HEAD + tag];
    rd.read_exact(&mut h).await.map_err(peer)?;
    let mut opener = opener;
    if let Some(o) = opener.as_mut() {
        if !o.open(&mut h) {
            return Err(WorkerError::Remote(
                libc::EACCES,
                format!(
                    "{source} ({addr}) answered under keys that the registration's secret does \
                     not open: the secrets differ"
                ),
            ));
        }
    }
    let errno = u32_at(&h, 0);
    let got = u32_at(&h, 4);
    if errno != 0 {
        if got > MAX_WHY {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) gave a reason of {got} bytes"
            )));
        }
        let mut why = vec![0u8; got as usize + tag];
        rd.read_exact(&mut why).await.map_err(peer)?;
        if let Some(o) = opener {
            if !o.open(&mut why) {
                why = b"(a reason the registration's secret does not open)".to_vec();
            }
        }
        return Err(WorkerError::Remote(
            errno as i32,
            format!("{source}: {}", String::from_utf8_lossy(&why)),
        ));
    }
    match want {
        Want::Exactly(len) if got != len => {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) sent {got} bytes, {len} were asked for"
            )))
        }
        Want::AtMost(max) if got > max => {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) sent an answer of {got} bytes, more than {max}"
            )))
        }
        _ => {}
    }
    let mut data = vec![0u8; got as usize + tag];
    rd.read_exact(&mut data).await.map_err(peer)?;
    Ok(data)
}

/// What the tests of the host transport, and of NCCL offers on it, share.
#[cfg(test)]
pub(super) mod testing {
    use std::net::SocketAddr;
    use std::path::Path;

    use super::*;
    use crate::gpu::abi::BUF_HOST_SHM;
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
    pub async fn served_through_relay(
        b: Arc<Buffers>,
        lane: Option<Arc<dyn Lane>>,
    ) -> (String, Seen) {
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
}

#[cfg(test)]
mod tests {
    use test_support::pseudo_random;

    use super::testing::*;
    use super::*;

    #[tokio::test]
    async fn a_sealed_registration_goes_only_to_its_secrets_holder_and_as_ciphertext() {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(2 * CHUNK as usize + 12345, 1);
        let secret = [3u8; 32];
        let src = buffers(dir.path(), "src", &data, false);
        let src = Arc::new(Arc::into_inner(src).unwrap().sealed_by(Some(secret)));

        let (addr, seen) = served_through_relay(src.clone(), None).await;
        let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
        let moved = fetch(at(&addr, Some(secret)), dst.clone(), true).await;
        assert_eq!(moved.unwrap(), data.len() as u64);
        assert!(dst.read(0, data.len()).unwrap() == data, "the bytes differ");
        let wire = lock(&seen).clone();
        assert!(wire.len() > data.len(), "{} bytes relayed", wire.len());
        assert!(!shows(&wire, &data), "plaintext crossed the wire");

        // Another secret is not served a byte, nor is a worker without one.
        for (given, says) in [(Some([4u8; 32]), "does not open"), (None, "served sealed")] {
            let (addr, _) = served_through_relay(src.clone(), None).await;
            let dst = buffers(dir.path(), "dst2", &vec![0; data.len()], true);
            let e = fetch(at(&addr, given), dst.clone(), true)
                .await
                .unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
            assert!(dst.read(0, 64).unwrap().iter().all(|&b| b == 0));
        }
    }

    #[tokio::test]
    async fn without_secrets_the_registration_id_reaches_the_bytes_in_the_clear() {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(CHUNK as usize + 999, 2);
        let (addr, seen) =
            served_through_relay(buffers(dir.path(), "src", &data, false), None).await;
        let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
        fetch(at(&addr, None), dst.clone(), false).await.unwrap();
        assert!(dst.read(0, data.len()).unwrap() == data);
        // What the sealed test's check would have caught.
        assert!(shows(&lock(&seen), &data));
        // A secret for a registration that has none is refused, not ignored.
        let (addr, _) = served_through_relay(buffers(dir.path(), "src2", &data, false), None).await;
        let e = fetch(at(&addr, Some([1; 32])), dst, false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("has no secret"), "{e}");
    }
}
