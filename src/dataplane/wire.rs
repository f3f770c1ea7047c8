//! The data plane: blocks by hash over a lean framed TCP protocol.
//!
//! Bulk data does not ride gRPC: framing costs, HTTP/2 flow control and per-message copies halve
//! what a socket can move. A connection opens with `KTDP` and a protocol version, then carries
//! frames `[op: u8][len: u32 big-endian][payload]`. Requests are pipelined: a client keeps many
//! in flight and the server answers them in order, working on several at once. Every frame has a
//! size limit, and a malformed frame ends that connection only. A client presents its tickets
//! (`ticket.rs`) as `OP_TICKET` frames, which are not answered; each later request is checked
//! against the connection's tickets by the server's [`Gate`].
//!
//! A swarm member asks with `OP_GET_SWARM`: the server sends the block within its upload slots
//! ([`BlockServe::upload_slots`]: two on a node) and answers `OP_BUSY` at once when they are all
//! taken, so that the member asks another holder instead of sharing an uplink it would finish
//! nothing on. Plain `OP_GET`s (the store's grants, tree children, the mount) are not limited.
//!
//! A block that replaces one the server holds can travel as an rsync delta (`delta.rs`):
//! `OP_SIGNATURE` asks for the old block's signature, `OP_PUT_DELTA` sends the new block's hash,
//! the old block's hash and the delta. The server rebuilds the block and checks it against its
//! hash before storing it, so a lying delta stores nothing. Both need leave to read the old
//! block (a read ticket of a version that holds it): a signature tells much about the bytes it
//! describes, and a delta that copies from a block is a way to test guesses of it.
//!
//! The other way round, a getter that holds an older copy of a file (a `kt get` onto a locally
//! modified file) sends `OP_GET_DELTA`: the hash of the block it wants and the rsync signature of
//! the bytes of its copy that the block replaces. The server answers `OP_DELTA` (a delta against
//! those bytes), or the block whole where a delta would not be smaller; the getter rebuilds the
//! block and checks it against its hash, so a lying delta costs a plain fetch, never a wrong
//! byte. It needs leave to read the block only: the signature describes the getter's own bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::piece::{self, PieceError};
use crate::auth::ticket::{Grant, Op, SharedGate};
use crate::blocks::{BlockError, BlockServe, Served};
use crate::hash::subtree::Piece;
use crate::hash::BlockHash;
use crate::manifest::MAX_BLOCK_SIZE;
use crate::metrics;
pub use crate::auth::tls::Peer;
use crate::auth::tls::{self, Conn, ConnRead, ConnWrite, Plane};

pub const MAGIC: [u8; 4] = *b"KTDP";
const PROTO_VERSION: u8 = 1;

const OP_GET: u8 = 1;
const OP_PUT: u8 = 2;
const OP_TICKET: u8 = 3;
const OP_SIGNATURE: u8 = 4;
const OP_PUT_DELTA: u8 = 5;
/// A GET from a swarm member: served within the server's upload slots, else answered busy.
const OP_GET_SWARM: u8 = 6;
/// A GET of a block as a delta against the getter's bytes, whose signature the frame carries.
const OP_GET_DELTA: u8 = 7;
/// A GET answered from what the server holds now: a block it expects (one a getter on its node
/// is receiving) is not waited for. A getter asks its own node so: it may be the one receiving.
const OP_GET_NOW: u8 = 8;
/// A swarm member's GET of one piece of a block (`piece.rs`): the hash, then the piece size's
/// log2 (u8) and the piece's index (u32). Served within the upload slots, as `OP_GET_SWARM`.
const OP_GET_PIECE: u8 = 9;
const OP_BLOCK: u8 = 0x81;
const OP_NOT_FOUND: u8 = 0x82;
const OP_STORED: u8 = 0x83;
const OP_ERROR: u8 = 0x84;
/// A refusal because the server's disk is full: the client says so, and retrying elsewhere or
/// later is what helps.
const OP_NO_SPACE: u8 = 0x85;
const OP_SIG: u8 = 0x86;
/// Every upload slot is taken: ask another holder.
const OP_BUSY: u8 = 0x87;
/// A block as an rsync delta against the bytes an `OP_GET_DELTA` described.
const OP_DELTA: u8 = 0x88;
/// A piece of a block with the block's chaining values (`piece.rs`).
const OP_PIECE: u8 = 0x89;

/// Largest payload: a hash and the largest block.
pub const MAX_FRAME: usize = MAX_BLOCK_SIZE as usize + 32;
/// Requests a server works on at once for one connection (bounds its memory per connection).
pub const SERVER_PIPELINE: usize = 8;
/// Tickets one connection may present; a client presents one per source it fetches from.
const MAX_TICKETS: usize = 64;
/// Connect timeout: a dead peer is an error in seconds, never a hang.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer that sends nothing for this long while requests are outstanding is taken for dead.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer does not speak the ktfs data plane")]
    BadMagic,
    #[error("frame of {0} bytes exceeds the limit")]
    FrameTooLarge(usize),
    #[error("malformed frame: {0}")]
    BadFrame(&'static str),
    #[error("peer closed the connection")]
    Closed,
    #[error("peer timed out")]
    Timeout,
    #[error("peer reported: {0}")]
    Remote(String),
}

/// A peer's answer to one request.
#[derive(Debug)]
pub enum Response {
    Block(BlockHash, Bytes),
    NotFound(BlockHash),
    Stored(BlockHash),
    Error(String),
    NoSpace(String),
    /// The rsync signature of the block the server holds under this hash.
    Signature(BlockHash, Bytes),
    /// A swarm request found every upload slot taken.
    Busy(BlockHash),
    /// Block `hash` as an rsync delta against the bytes an `OP_GET_DELTA` described.
    Delta(BlockHash, Bytes),
    /// A piece of block `hash`, as the peer sent it (unchecked).
    Piece(BlockHash, Piece),
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<(u8, Bytes)>, WireError> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(WireError::FrameTooLarge(len));
    }
    // A block's bytes start on a page boundary, so that a block cache can hand them to an
    // O_DIRECT write as they are (see `blockfiles`). Frames shorter than a page (requests are
    // a 32-byte hash) get no room for that.
    let room = if len >= BODY_ALIGN { BODY_ALIGN } else { 0 };
    let mut buf = Vec::with_capacity(len + room);
    let pad = if room == 0 {
        0
    } else {
        (buf.as_ptr() as usize + 32).wrapping_neg() % BODY_ALIGN
    };
    buf.resize(pad, 0);
    // Filled by the reads themselves, never zeroed first: 4 MiB a frame adds up.
    while buf.len() - pad < len {
        let mut limited = (&mut *r).take((len - (buf.len() - pad)) as u64);
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(WireError::Closed);
        }
    }
    Ok(Some((head[0], Bytes::from(buf).slice(pad..))))
}

/// Where a block's bytes start in a received frame's buffer.
const BODY_ALIGN: usize = 4096;

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    op: u8,
    head: &[u8],
    body: &[u8],
) -> Result<(), WireError> {
    write_head(w, op, head, body.len()).await?;
    if !body.is_empty() {
        w.write_all(body).await?;
    }
    Ok(())
}

/// A frame's op, length and `head`, for a body of `body_len` bytes that the caller sends next.
async fn write_head<W: AsyncWrite + Unpin>(
    w: &mut W,
    op: u8,
    head: &[u8],
    body_len: usize,
) -> Result<(), WireError> {
    let len = head.len() + body_len;
    let mut h = Vec::with_capacity(5 + head.len());
    h.push(op);
    h.extend_from_slice(&(len as u32).to_be_bytes());
    h.extend_from_slice(head);
    w.write_all(&h).await?;
    Ok(())
}

/// Sends `len` bytes of `file` from its start: with sendfile(2) on a plain socket, page cache
/// to socket through no buffer of ours; through the TLS stream, which must encrypt them, by
/// reads of the file.
async fn send_file(wr: &mut ConnWrite, file: std::fs::File, len: u64) -> Result<(), WireError> {
    match wr {
        ConnWrite::Plain(w) => sendfile(w.as_ref(), &file, len).await,
        ConnWrite::Tls(w) => {
            // Reads as large as a block's share of the pipeline, so records stay full.
            let file = tokio::fs::File::from_std(file).take(len);
            let mut from = BufReader::with_capacity(256 << 10, file);
            let sent = tokio::io::copy_buf(&mut from, w).await?;
            if sent < len {
                return Err(WireError::BadFrame("block file shrank while being sent"));
            }
            Ok(())
        }
    }
}

async fn sendfile(stream: &TcpStream, file: &std::fs::File, len: u64) -> Result<(), WireError> {
    let mut offset: libc::off_t = 0;
    while (offset as u64) < len {
        stream.writable().await?;
        let left = (len - offset as u64) as usize;
        match stream.try_io(tokio::io::Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile(stream, file, Some(&mut offset), left)
                .map_err(std::io::Error::from)
        }) {
            // The file is shorter than it was when the frame's length was written: the frame
            // cannot be finished, so the connection ends.
            Ok(0) => return Err(WireError::BadFrame("block file shrank while being sent")),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A server's answer to one request, before it is written.
enum Answer {
    Frame(Response),
    File(BlockHash, std::fs::File, u64),
    /// An answer that holds an upload slot until it is written.
    Slotted(Box<Answer>, tokio::sync::OwnedSemaphorePermit),
}

fn answer(got: Result<Option<Served>, BlockError>, hash: BlockHash) -> Answer {
    Answer::Frame(match got {
        Ok(Some(Served::Bytes(b))) => Response::Block(hash, b),
        Ok(Some(Served::File(f, len))) if len <= MAX_BLOCK_SIZE as u64 => {
            return Answer::File(hash, f, len)
        }
        Ok(Some(Served::File(_, len))) => Response::Error(format!(
            "block {hash} is stored with {len} bytes, over the limit"
        )),
        Ok(None) => Response::NotFound(hash),
        Err(e) => Response::Error(e.to_string()),
    })
}

fn failed(e: tokio::task::JoinError) -> Answer {
    Answer::Frame(Response::Error(format!("server task failed: {e}")))
}

async fn serve_get(svc: Arc<dyn BlockServe>, hash: BlockHash) -> Answer {
    serve_get_waiting(svc, hash, true).await
}

/// A GET; with `wait`, a block the server expects is waited for (up to its bound) before it
/// is answered "not here".
async fn serve_get_waiting(svc: Arc<dyn BlockServe>, hash: BlockHash, wait: bool) -> Answer {
    let get = |svc: Arc<dyn BlockServe>| async move {
        tokio::task::spawn_blocking(move || answer(svc.get(&hash), hash))
            .await
            .unwrap_or_else(failed)
    };
    let first = get(svc.clone()).await;
    if let (true, Answer::Frame(Response::NotFound(_))) = (wait, &first) {
        if let Some(wait) = svc.pending(&hash) {
            wait.await;
            return get(svc).await;
        }
    }
    first
}

/// Piece `index` of block `hash`, cut in pieces of `2^size_log2`; a piece the server expects
/// (of a block it is receiving) is waited for as a GET waits for a block.
async fn serve_piece(
    svc: Arc<dyn BlockServe>,
    hash: BlockHash,
    size_log2: u8,
    index: u32,
) -> Answer {
    let get = |svc: Arc<dyn BlockServe>| async move {
        tokio::task::spawn_blocking(move || {
            Answer::Frame(match piece::serve(svc.as_ref(), &hash, size_log2, index) {
                Ok(p) => Response::Piece(hash, p),
                Err(PieceError::NotHere) => Response::NotFound(hash),
                Err(PieceError::Bad(m)) => Response::Error(m),
            })
        })
        .await
        .unwrap_or_else(failed)
    };
    let first = get(svc.clone()).await;
    if let Answer::Frame(Response::NotFound(_)) = &first {
        if let Some(wait) = svc.piece_pending(&hash, size_log2, index) {
            wait.await;
            return get(svc).await;
        }
    }
    first
}

/// A swarm member's request: answered within the server's upload slots, or busy at once.
async fn within_slots<F>(svc: &Arc<dyn BlockServe>, hash: BlockHash, serve: F) -> Answer
where
    F: std::future::Future<Output = Answer>,
{
    match svc.upload_slots() {
        None => serve.await,
        Some(slots) => match slots.try_acquire_owned() {
            Ok(slot) => Answer::Slotted(Box::new(serve.await), slot),
            Err(_) => Answer::Frame(Response::Busy(hash)),
        },
    }
}

/// A block's bytes in memory, for a signature or as the base of a delta.
fn block_bytes(svc: &dyn BlockServe, hash: &BlockHash) -> Result<Option<Bytes>, String> {
    match svc.get(hash).map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(Served::Bytes(b)) => Ok(Some(b)),
        Some(Served::File(f, len)) if len <= MAX_BLOCK_SIZE as u64 => {
            let mut v = Vec::with_capacity(len as usize);
            std::io::Read::read_to_end(&mut std::io::Read::take(f, len), &mut v)
                .map_err(|e| format!("reading block {hash}: {e}"))?;
            Ok(Some(Bytes::from(v)))
        }
        Some(Served::File(_, len)) => Err(format!(
            "block {hash} is stored with {len} bytes, over the limit"
        )),
    }
}

fn serve_signature(svc: &dyn BlockServe, hash: BlockHash) -> Response {
    match block_bytes(svc, &hash) {
        Ok(Some(b)) => Response::Signature(hash, Bytes::from(super::delta::signature(&b))),
        Ok(None) => Response::NotFound(hash),
        Err(e) => Response::Error(e),
    }
}

/// Block `hash` as a delta against the bytes `sig` describes, or whole where the delta would not
/// be smaller (the getter's bytes have little in common with it).
fn serve_get_delta(svc: &dyn BlockServe, hash: BlockHash, sig: &[u8]) -> Response {
    let block = match block_bytes(svc, &hash) {
        Ok(Some(b)) => b,
        Ok(None) => return Response::NotFound(hash),
        Err(e) => return Response::Error(e),
    };
    match super::delta::diff(sig, &block) {
        Ok(d) if d.len() < block.len() => {
            metrics::DELTA_BLOCKS.inc();
            metrics::DELTA_BYTES.add(d.len() as u64);
            Response::Delta(hash, Bytes::from(d))
        }
        Ok(_) => Response::Block(hash, block),
        Err(e) => Response::Error(format!("delta for block {hash}: {e}")),
    }
}

/// Rebuilds block `hash` from block `base` and `delta`, and stores it if it is what its hash
/// says. A missing base is `NotFound(base)`: the client sends the block whole instead.
fn serve_put_delta(
    svc: &dyn BlockServe,
    hash: BlockHash,
    base: BlockHash,
    delta: &[u8],
) -> Response {
    let old = match block_bytes(svc, &base) {
        Ok(Some(b)) => b,
        Ok(None) => return Response::NotFound(base),
        Err(e) => return Response::Error(e),
    };
    let new = match super::delta::apply(&old, delta, MAX_BLOCK_SIZE as usize) {
        Ok(new) => new,
        Err(e) => return Response::Error(format!("delta for block {hash}: {e}")),
    };
    if BlockHash::of(&new) != hash {
        return Response::Error(format!(
            "delta for block {hash} against {base} rebuilds other bytes"
        ));
    }
    metrics::DELTA_BLOCKS.inc();
    metrics::DELTA_BYTES.add(delta.len() as u64);
    match svc.put(&hash, Bytes::from(new)) {
        Ok(()) => Response::Stored(hash),
        Err(e) if e.is_no_space() => Response::NoSpace(e.to_string()),
        Err(e) => Response::Error(e.to_string()),
    }
}

/// Answers a plaintext connection to a server that speaks TLS only with an error saying so,
/// which the client's first request receives.
pub async fn refuse_plaintext(stream: TcpStream) {
    let mut stream = stream;
    let mut hello = [0u8; 5];
    let answer = async {
        stream.read_exact(&mut hello).await?;
        let why = format!(
            "this server speaks TLS only: trust its CA with {}",
            tls::ENV_CA
        );
        write_frame(&mut stream, OP_ERROR, &[0u8; 32], why.as_bytes()).await?;
        stream.shutdown().await?;
        Ok::<(), WireError>(())
    };
    let _ = tokio::time::timeout(CONNECT_TIMEOUT, answer).await;
}

/// Serves one accepted connection until the peer closes it or breaks the protocol.
pub async fn serve_connection(stream: Conn, svc: Arc<dyn BlockServe>, gate: SharedGate) {
    let peer = stream.peer_addr().ok();
    if let Err(e) = serve_inner(stream, svc, gate).await {
        tracing::debug!(?peer, error = %e, "data-plane connection ended");
    }
}

/// Whether the connection's tickets allow `op` on `hash`; a check against a version's manifest
/// may read the database, so it runs off the async threads.
async fn permitted(
    gate: &SharedGate,
    grants: &Arc<Vec<Grant>>,
    op: Op,
    hash: BlockHash,
) -> Result<(), String> {
    let quick = crate::locks::read(gate).allows_now(grants, op, &hash);
    if let Some(answer) = quick {
        return answer;
    }
    // A copy, not the lock: the check may wait on the store server, and a new registration
    // must not wait for it to replace the gate.
    let (gate, grants) = (crate::locks::read(gate).clone(), grants.clone());
    tokio::task::spawn_blocking(move || gate.allows(&grants, op, &hash))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

async fn serve_inner(
    stream: Conn,
    svc: Arc<dyn BlockServe>,
    gate: SharedGate,
) -> Result<(), WireError> {
    if let Conn::Plain(s) = &stream {
        s.set_nodelay(true)?;
    }
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(256 << 10, rd);
    let mut hello = [0u8; 5];
    rd.read_exact(&mut hello).await?;
    if hello[..4] != MAGIC || hello[4] != PROTO_VERSION {
        return Err(WireError::BadMagic);
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(SERVER_PIPELINE);
    let reader = async move {
        let mut grants: Arc<Vec<Grant>> = Arc::new(Vec::new());
        let mut refused_ticket: Option<String> = None;
        while let Some((op, mut payload)) = read_frame(&mut rd).await? {
            if op == OP_TICKET {
                match crate::locks::read(&gate).admit(&payload) {
                    Ok(Some(g)) if !grants.contains(&g) => {
                        let all = Arc::make_mut(&mut grants);
                        if all.len() == MAX_TICKETS {
                            all.remove(0);
                        }
                        all.push(g);
                    }
                    Ok(_) => {}
                    Err(e) => refused_ticket = Some(e.to_string()),
                }
                continue;
            }
            if payload.len() < 32 {
                return Err(WireError::BadFrame("short payload"));
            }
            let data = payload.split_off(32);
            let hash = BlockHash::from_slice(&payload).ok_or(WireError::BadFrame("hash"))?;
            let svc = svc.clone();
            let (gate, grants, refused) = (gate.clone(), grants.clone(), refused_ticket.clone());
            let denied = move |why: String| {
                metrics::DENIED_REQUESTS.inc();
                let why = match refused {
                    Some(r) => format!("{why} ({r})"),
                    None => why,
                };
                Answer::Frame(Response::Error(format!("not allowed: {why}")))
            };
            let job = match op {
                OP_GET if data.is_empty() => tokio::spawn(async move {
                    match permitted(&gate, &grants, Op::Get, hash).await {
                        Ok(()) => serve_get(svc, hash).await,
                        Err(why) => denied(why),
                    }
                }),
                OP_GET_NOW if data.is_empty() => tokio::spawn(async move {
                    match permitted(&gate, &grants, Op::Get, hash).await {
                        Ok(()) => serve_get_waiting(svc, hash, false).await,
                        Err(why) => denied(why),
                    }
                }),
                OP_GET_SWARM if data.is_empty() => tokio::spawn(async move {
                    if let Err(why) = permitted(&gate, &grants, Op::Get, hash).await {
                        return denied(why);
                    }
                    within_slots(&svc.clone(), hash, serve_get(svc, hash)).await
                }),
                OP_GET_PIECE if data.len() == 5 => tokio::spawn(async move {
                    if let Err(why) = permitted(&gate, &grants, Op::Get, hash).await {
                        return denied(why);
                    }
                    let size_log2 = data[0];
                    let index = u32::from_be_bytes([data[1], data[2], data[3], data[4]]);
                    within_slots(&svc.clone(), hash, serve_piece(svc, hash, size_log2, index)).await
                }),
                OP_PUT => tokio::spawn(async move {
                    if let Err(why) = permitted(&gate, &grants, Op::Put, hash).await {
                        return denied(why);
                    }
                    tokio::task::spawn_blocking(move || {
                        Answer::Frame(if BlockHash::of(&data) != hash {
                            Response::Error(format!("block {hash} does not match its hash"))
                        } else {
                            match svc.put(&hash, data) {
                                Ok(()) => Response::Stored(hash),
                                Err(e) if e.is_no_space() => Response::NoSpace(e.to_string()),
                                Err(e) => Response::Error(e.to_string()),
                            }
                        })
                    })
                    .await
                    .unwrap_or_else(failed)
                }),
                OP_SIGNATURE if data.is_empty() => tokio::spawn(async move {
                    if let Err(why) = permitted(&gate, &grants, Op::Get, hash).await {
                        return denied(why);
                    }
                    tokio::task::spawn_blocking(move || {
                        Answer::Frame(serve_signature(svc.as_ref(), hash))
                    })
                    .await
                    .unwrap_or_else(failed)
                }),
                OP_GET_DELTA => tokio::spawn(async move {
                    if let Err(why) = permitted(&gate, &grants, Op::Get, hash).await {
                        return denied(why);
                    }
                    tokio::task::spawn_blocking(move || {
                        Answer::Frame(serve_get_delta(svc.as_ref(), hash, &data))
                    })
                    .await
                    .unwrap_or_else(failed)
                }),
                OP_PUT_DELTA if data.len() >= 32 => tokio::spawn(async move {
                    let mut delta = data;
                    let head = delta.split_to(32);
                    let Some(base) = BlockHash::from_slice(&head) else {
                        return Answer::Frame(Response::Error("malformed base hash".into()));
                    };
                    for (op, h) in [(Op::Put, hash), (Op::Get, base)] {
                        if let Err(why) = permitted(&gate, &grants, op, h).await {
                            return denied(why);
                        }
                    }
                    tokio::task::spawn_blocking(move || {
                        Answer::Frame(serve_put_delta(svc.as_ref(), hash, base, &delta))
                    })
                    .await
                    .unwrap_or_else(failed)
                }),
                _ => return Err(WireError::BadFrame("unknown op")),
            };
            if tx.send(job).await.is_err() {
                break;
            }
        }
        Ok::<(), WireError>(())
    };
    let writer = async move {
        while let Some(job) = rx.recv().await {
            let (answer, _slot) = match job.await.unwrap_or_else(failed) {
                Answer::Slotted(a, slot) => (*a, Some(slot)),
                a => (a, None),
            };
            let resp = match answer {
                Answer::Frame(resp) => resp,
                Answer::Slotted(..) => Response::Error("an answer in two slots".into()),
                Answer::File(h, file, len) => {
                    write_head(&mut wr, OP_BLOCK, h.as_bytes(), len as usize).await?;
                    send_file(&mut wr, file, len).await?;
                    metrics::SERVED_BLOCKS.inc();
                    metrics::SERVED_BYTES.add(len);
                    continue;
                }
            };
            match resp {
                Response::Block(h, b) => {
                    write_frame(&mut wr, OP_BLOCK, h.as_bytes(), &b).await?;
                    metrics::SERVED_BLOCKS.inc();
                    metrics::SERVED_BYTES.add(b.len() as u64);
                }
                Response::NotFound(h) => {
                    write_frame(&mut wr, OP_NOT_FOUND, h.as_bytes(), &[]).await?
                }
                Response::Stored(h) => write_frame(&mut wr, OP_STORED, h.as_bytes(), &[]).await?,
                Response::Error(m) => {
                    write_frame(&mut wr, OP_ERROR, &[0u8; 32], m.as_bytes()).await?
                }
                Response::NoSpace(m) => {
                    write_frame(&mut wr, OP_NO_SPACE, &[0u8; 32], m.as_bytes()).await?
                }
                Response::Signature(h, sig) => {
                    write_frame(&mut wr, OP_SIG, h.as_bytes(), &sig).await?
                }
                Response::Busy(h) => write_frame(&mut wr, OP_BUSY, h.as_bytes(), &[]).await?,
                Response::Delta(h, d) => {
                    write_frame(&mut wr, OP_DELTA, h.as_bytes(), &d).await?;
                    metrics::SERVED_BLOCKS.inc();
                    metrics::SERVED_BYTES.add(d.len() as u64);
                }
                Response::Piece(h, p) => {
                    write_frame(&mut wr, OP_PIECE, h.as_bytes(), &p.encode()).await?;
                    metrics::SERVED_BYTES.add(p.data.len() as u64);
                }
            }
        }
        wr.shutdown().await.ok();
        Ok::<(), WireError>(())
    };
    let (r, w) = tokio::join!(reader, writer);
    r.and(w)
}

/// The sending half of a client connection.
pub struct DataSender {
    wr: ConnWrite,
}

/// The receiving half of a client connection.
pub struct DataReceiver {
    rd: BufReader<ConnRead>,
}

/// Opens a client connection to the data plane of `peer` at `addr` (over TLS where this process
/// trusts a CA).
pub async fn connect(addr: &str, peer: Peer) -> Result<(DataSender, DataReceiver), WireError> {
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT + tls::HANDSHAKE_TIMEOUT,
        tls::connect(addr, Plane::Data, peer),
    )
    .await
    .map_err(|_| WireError::Timeout)??;
    let (rd, mut wr) = stream.into_split();
    let mut hello = MAGIC.to_vec();
    hello.push(PROTO_VERSION);
    wr.write_all(&hello).await?;
    Ok((
        DataSender { wr },
        DataReceiver {
            rd: BufReader::with_capacity(256 << 10, rd),
        },
    ))
}

impl DataSender {
    pub async fn get(&mut self, hash: &BlockHash) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_GET, hash.as_bytes(), &[]).await
    }

    /// A request answered from what the peer holds now, without waiting for a block it
    /// expects (see `OP_GET_NOW`).
    pub async fn get_now(&mut self, hash: &BlockHash) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_GET_NOW, hash.as_bytes(), &[]).await
    }

    /// A swarm member's request: the peer answers it within its upload slots, or busy.
    pub async fn get_swarm(&mut self, hash: &BlockHash) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_GET_SWARM, hash.as_bytes(), &[]).await
    }

    /// A swarm member's request for piece `index` of block `hash` cut in pieces of
    /// `2^size_log2` bytes: answered with a [`Response::Piece`] within the peer's upload slots,
    /// or busy.
    pub async fn get_piece(
        &mut self,
        hash: &BlockHash,
        size_log2: u8,
        index: u32,
    ) -> Result<(), WireError> {
        let mut body = [0u8; 5];
        body[0] = size_log2;
        body[1..].copy_from_slice(&index.to_be_bytes());
        write_frame(&mut self.wr, OP_GET_PIECE, hash.as_bytes(), &body).await
    }

    pub async fn put(&mut self, hash: &BlockHash, data: &[u8]) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_PUT, hash.as_bytes(), data).await
    }

    /// Asks for the rsync signature of a block the peer holds.
    pub async fn signature(&mut self, hash: &BlockHash) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_SIGNATURE, hash.as_bytes(), &[]).await
    }

    /// Asks for block `hash` as a delta against the bytes `sig` (their rsync signature)
    /// describes; the answer is a [`Response::Delta`] or the block whole.
    pub async fn get_delta(&mut self, hash: &BlockHash, sig: &[u8]) -> Result<(), WireError> {
        write_frame(&mut self.wr, OP_GET_DELTA, hash.as_bytes(), sig).await
    }

    /// Sends block `hash` as `delta` against block `base`, which the peer holds.
    pub async fn put_delta(
        &mut self,
        hash: &BlockHash,
        base: &BlockHash,
        delta: &[u8],
    ) -> Result<(), WireError> {
        let mut head = [0u8; 64];
        head[..32].copy_from_slice(hash.as_bytes());
        head[32..].copy_from_slice(base.as_bytes());
        write_frame(&mut self.wr, OP_PUT_DELTA, &head, delta).await
    }

    /// Presents a ticket for the requests that follow (none for an empty one).
    pub async fn ticket(&mut self, ticket: &[u8]) -> Result<(), WireError> {
        if ticket.is_empty() {
            return Ok(());
        }
        write_frame(&mut self.wr, OP_TICKET, ticket, &[]).await
    }
}

impl DataReceiver {
    /// The next response, in request order. A peer silent for [`IDLE_TIMEOUT`] is an error.
    pub async fn recv(&mut self) -> Result<Response, WireError> {
        let frame = tokio::time::timeout(IDLE_TIMEOUT, read_frame(&mut self.rd))
            .await
            .map_err(|_| WireError::Timeout)??;
        let (op, mut payload) = frame.ok_or(WireError::Closed)?;
        if payload.len() < 32 {
            return Err(WireError::BadFrame("short payload"));
        }
        let body = payload.split_off(32);
        let hash = BlockHash::from_slice(&payload).ok_or(WireError::BadFrame("hash"))?;
        Ok(match op {
            OP_BLOCK => Response::Block(hash, body),
            OP_NOT_FOUND => Response::NotFound(hash),
            OP_STORED => Response::Stored(hash),
            OP_ERROR => Response::Error(String::from_utf8_lossy(&body).into_owned()),
            OP_NO_SPACE => Response::NoSpace(String::from_utf8_lossy(&body).into_owned()),
            OP_SIG => Response::Signature(hash, body),
            OP_BUSY => Response::Busy(hash),
            OP_DELTA => Response::Delta(hash, body),
            OP_PIECE => Response::Piece(
                hash,
                Piece::decode(body).ok_or(WireError::BadFrame("piece"))?,
            ),
            _ => return Err(WireError::BadFrame("unknown op")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Version;
    use crate::auth::ticket::{
        shared, Gate, TicketKey, VersionBlocks, NODE_TTL, READ_TTL, WRITE_TTL,
    };
    use std::collections::HashMap;
    use std::sync::Mutex;

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
            key: key.clone(),
            versions: Some(Arc::new(Holds(BlockHash::of(&mine)))),
        });
        let svc: Arc<dyn BlockServe> = mem;
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                tokio::spawn(serve_connection(Conn::Plain(s), svc.clone(), gate.clone()));
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
        tx.ticket(&key.issue(&Grant::Write, WRITE_TTL))
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
                tokio::spawn(serve_connection(Conn::Plain(s), svc.clone(), gate.clone()));
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
            assert!(
                matches!(rx.recv().await.unwrap(), Response::Stored(h) if h == BlockHash::of(b))
            );
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
        assert!(
            matches!(rx.recv().await.unwrap(), Response::Block(_, d) if &d[..] == b"small again")
        );
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
        let sinks = Arc::new(Sinks::new(vec![(path.clone(), file)]));
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
        let got = fetch_partial_as(vec![job], sinks, &sources, &progress, Ask::Swarm)
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
}
