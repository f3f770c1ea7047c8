//! The server half of the protocol: [`serve_connection`] reads a connection's requests, works on
//! up to [`SERVER_PIPELINE`] of them at once (one function per op, each checked against the
//! tickets the connection presented) and writes the answers back in request order; a block
//! stored as a file goes out with sendfile(2). [`refuse_plaintext`] answers a client that
//! connects without TLS to a server that speaks TLS only.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::admission::{Admission, Unticketed};
use super::frame::{
    read_request, split_hash, write_frame, write_head, Response, WireError, CONNECT_TIMEOUT, MAGIC,
    MAX_FRAME, OP_BLOCK, OP_BUSY, OP_DELTA, OP_ERROR, OP_GET, OP_GET_DELTA, OP_GET_NOW,
    OP_GET_PIECE, OP_GET_SWARM, OP_NOT_FOUND, OP_NO_SPACE, OP_PIECE, OP_PUT, OP_PUT_DELTA, OP_SIG,
    OP_SIGNATURE, OP_STORED, OP_TICKET, PROTO_VERSION, SERVER_IDLE, UNTICKETED_FRAME,
};
use crate::auth::ticket::{Grant, Op, SharedGate};
use crate::auth::tls::{self, Conn, ConnRead, ConnWrite};
use crate::blocks::{BlockError, BlockServe, Served};
use crate::dataplane::piece::{self, PieceError};
use crate::hash::{BlockHash, Scope};
use crate::manifest::MAX_BLOCK_SIZE;
use crate::metrics;

/// Requests a server works on at once for one connection (bounds its memory per connection).
pub const SERVER_PIPELINE: usize = 8;
/// Tickets one connection may present; a client presents one per source it fetches from.
const MAX_TICKETS: usize = 64;

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

/// Serves one accepted connection until the peer closes it, breaks the protocol or idles. Until
/// it shows a ticket the gate admits, the connection counts against `admission`'s caps (a
/// connection over them is closed at once) and may send only small frames.
pub async fn serve_connection(
    stream: Conn,
    svc: Arc<dyn BlockServe>,
    gate: SharedGate,
    admission: Arc<Admission>,
) {
    let peer = stream.peer_addr().ok();
    let Some(slot) = admission.enter(peer.map(|p| p.ip())) else {
        metrics::REFUSED_CONNECTIONS.inc();
        tracing::debug!(
            ?peer,
            "data-plane connection refused: too many without a ticket"
        );
        return;
    };
    if let Err(e) = serve_inner(stream, svc, gate, slot).await {
        tracing::debug!(?peer, error = %e, "data-plane connection ended");
    }
}

/// The hello, then requests read and answers written at once, until the peer closes the
/// connection or breaks the protocol.
async fn serve_inner(
    stream: Conn,
    svc: Arc<dyn BlockServe>,
    gate: SharedGate,
    slot: Unticketed,
) -> Result<(), WireError> {
    if let Conn::Plain(s) = &stream {
        s.set_nodelay(true)?;
    }
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(256 << 10, rd);
    let mut hello = [0u8; 5];
    tokio::time::timeout(CONNECT_TIMEOUT, rd.read_exact(&mut hello))
        .await
        .map_err(|_| WireError::Timeout)??;
    if hello[..4] != MAGIC || hello[4] != PROTO_VERSION {
        return Err(WireError::BadMagic);
    }
    let (tx, rx) = mpsc::channel(SERVER_PIPELINE);
    let outstanding = Arc::new(AtomicUsize::new(0));
    let reading = read_requests(rd, svc, gate, slot, (tx, outstanding.clone()));
    let (r, w) = tokio::join!(reading, write_answers(wr, rx, &outstanding));
    r.and(w)
}

/// The work on one request, whose answer the writer awaits in request order.
type Job = tokio::task::JoinHandle<Answer>;

/// What the tickets a connection presented grant, for the requests that follow them.
#[derive(Default)]
struct Tickets {
    grants: Arc<Vec<Grant>>,
    /// Why the last ticket refused was refused: a request denied after it says so, since the
    /// ticket was most likely meant to allow it.
    refused: Option<String>,
}

impl Tickets {
    /// Takes in a ticket the client presented; a connection keeps its last [`MAX_TICKETS`].
    fn present(&mut self, gate: &SharedGate, ticket: &[u8]) {
        match crate::locks::read(gate).admit(ticket) {
            Ok(Some(g)) if !self.grants.contains(&g) => {
                let all = Arc::make_mut(&mut self.grants);
                if all.len() == MAX_TICKETS {
                    all.remove(0);
                }
                all.push(g);
            }
            Ok(_) => {}
            Err(e) => self.refused = Some(e.to_string()),
        }
    }
}

/// Reads requests until the peer closes the connection (or says nothing for
/// [`SERVER_IDLE`]), starts the work on each and hands it to the writer; the channel's bound
/// is how many are worked on at once.
async fn read_requests(
    mut rd: BufReader<ConnRead>,
    svc: Arc<dyn BlockServe>,
    gate: SharedGate,
    slot: Unticketed,
    (jobs, outstanding): (mpsc::Sender<Job>, Arc<AtomicUsize>),
) -> Result<(), WireError> {
    let mut tickets = Tickets::default();
    // A server that asks for no ticket has no one to tell from anyone else.
    let mut slot = (!crate::locks::read(&gate).is_open()).then_some(slot);
    loop {
        let limit = if slot.is_some() {
            UNTICKETED_FRAME
        } else {
            MAX_FRAME
        };
        // Waiting for the next frame, not reading one (a buffered wait loses nothing when it
        // ends): a connection silent with nothing left to answer is let go.
        match tokio::time::timeout(SERVER_IDLE, rd.fill_buf()).await {
            Err(_) if outstanding.load(Ordering::Acquire) > 0 => continue,
            Err(_) => return Err(WireError::Timeout),
            Ok(buffered) => {
                if buffered?.is_empty() {
                    break;
                }
            }
        }
        let Some((op, payload)) = read_request(&mut rd, limit).await? else {
            break;
        };
        if op == OP_TICKET {
            tickets.present(&gate, &payload);
            if !tickets.grants.is_empty() {
                slot = None;
            }
            continue;
        }
        let (hash, data) = split_hash(payload)?;
        let req = Request {
            svc: svc.clone(),
            gate: gate.clone(),
            grants: tickets.grants.clone(),
            refused_ticket: tickets.refused.clone(),
            hash,
        };
        let job = start(op, req, data)?;
        outstanding.fetch_add(1, Ordering::AcqRel);
        if jobs.send(job).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// Starts the work on a request by its op. An unknown op, or a payload its op does not take,
/// breaks the protocol: the connection ends.
fn start(op: u8, req: Request, data: Bytes) -> Result<Job, WireError> {
    Ok(match op {
        OP_GET if data.is_empty() => tokio::spawn(on_get(req)),
        OP_GET_NOW if data.is_empty() => tokio::spawn(on_get_now(req)),
        OP_GET_SWARM if data.is_empty() => tokio::spawn(on_get_swarm(req)),
        OP_GET_PIECE if data.len() == 5 => tokio::spawn(on_get_piece(req, data)),
        OP_PUT => tokio::spawn(on_put(req, data)),
        OP_SIGNATURE if data.is_empty() => tokio::spawn(on_signature(req)),
        OP_GET_DELTA => tokio::spawn(on_get_delta(req, data)),
        OP_PUT_DELTA if data.len() >= 32 => tokio::spawn(on_put_delta(req, data)),
        _ => return Err(WireError::BadFrame("unknown op")),
    })
}

/// One request: the block it names, and what the connection presented before it.
struct Request {
    svc: Arc<dyn BlockServe>,
    gate: SharedGate,
    grants: Arc<Vec<Grant>>,
    refused_ticket: Option<String>,
    hash: BlockHash,
}

impl Request {
    /// Whether the connection's tickets allow `op` on `hash`; where not, the answer that says
    /// why.
    async fn allowed(&self, op: Op, hash: BlockHash) -> Result<(), Answer> {
        permitted(&self.gate, &self.grants, op, hash)
            .await
            .map_err(|why| self.denied(why))
    }

    /// The namespaces an upload on this connection is for: those of its upload tickets.
    fn scopes(&self) -> Vec<Scope> {
        self.grants
            .iter()
            .filter_map(|g| match g {
                Grant::Write(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    fn denied(&self, why: String) -> Answer {
        metrics::DENIED_REQUESTS.inc();
        let why = match &self.refused_ticket {
            Some(r) => format!("{why} ({r})"),
            None => why,
        };
        Answer::Frame(Response::Error(format!("not allowed: {why}")))
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

/// `OP_GET`: the block, once it is here if the server expects it.
async fn on_get(req: Request) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    serve_get(req.svc, req.hash).await
}

/// `OP_GET_NOW`: the block if the server holds it now.
async fn on_get_now(req: Request) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    serve_get_waiting(req.svc, req.hash, false).await
}

/// `OP_GET_SWARM`: the block within the upload slots, else busy.
async fn on_get_swarm(req: Request) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    let Request { svc, hash, .. } = req;
    within_slots(&svc.clone(), hash, serve_get(svc, hash)).await
}

/// `OP_GET_PIECE`: the piece `data` names (its size's log2, its index), within the upload
/// slots, else busy.
async fn on_get_piece(req: Request, data: Bytes) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    let size_log2 = data[0];
    let index = u32::from_be_bytes([data[1], data[2], data[3], data[4]]);
    let Request { svc, hash, .. } = req;
    within_slots(&svc.clone(), hash, serve_piece(svc, hash, size_log2, index)).await
}

/// `OP_PUT`: stores the block if it is what its hash says.
async fn on_put(req: Request, data: Bytes) -> Answer {
    if let Err(no) = req.allowed(Op::Put, req.hash).await {
        return no;
    }
    let scopes = req.scopes();
    let Request { svc, hash, .. } = req;
    tokio::task::spawn_blocking(move || {
        Answer::Frame(if BlockHash::of(&data) != hash {
            Response::Error(format!("block {hash} does not match its hash"))
        } else {
            match svc.put_for(&hash, data, &scopes) {
                Ok(()) => Response::Stored(hash),
                Err(e) if e.is_no_space() => Response::NoSpace(e.to_string()),
                Err(e) => Response::Error(e.to_string()),
            }
        })
    })
    .await
    .unwrap_or_else(failed)
}

/// `OP_SIGNATURE`: the rsync signature of the block.
async fn on_signature(req: Request) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    let Request { svc, hash, .. } = req;
    tokio::task::spawn_blocking(move || Answer::Frame(serve_signature(svc.as_ref(), hash)))
        .await
        .unwrap_or_else(failed)
}

/// `OP_GET_DELTA`: the block as a delta against the bytes the signature `sig` describes.
async fn on_get_delta(req: Request, sig: Bytes) -> Answer {
    if let Err(no) = req.allowed(Op::Get, req.hash).await {
        return no;
    }
    let Request { svc, hash, .. } = req;
    tokio::task::spawn_blocking(move || Answer::Frame(serve_get_delta(svc.as_ref(), hash, &sig)))
        .await
        .unwrap_or_else(failed)
}

/// `OP_PUT_DELTA`: `data` is the base block's hash, then the delta against it. Needs leave to
/// store the block and to read the base.
async fn on_put_delta(req: Request, data: Bytes) -> Answer {
    let mut delta = data;
    let head = delta.split_to(32);
    let Some(base) = BlockHash::from_slice(&head) else {
        return Answer::Frame(Response::Error("malformed base hash".into()));
    };
    for (op, h) in [(Op::Put, req.hash), (Op::Get, base)] {
        if let Err(no) = req.allowed(op, h).await {
            return no;
        }
    }
    let scopes = req.scopes();
    let Request { svc, hash, .. } = req;
    tokio::task::spawn_blocking(move || {
        Answer::Frame(serve_put_delta(svc.as_ref(), hash, base, &delta, &scopes))
    })
    .await
    .unwrap_or_else(failed)
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
        Ok(Some(b)) => {
            Response::Signature(hash, Bytes::from(crate::dataplane::delta::signature(&b)))
        }
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
    match crate::dataplane::delta::diff(sig, &block) {
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
    scopes: &[Scope],
) -> Response {
    let old = match block_bytes(svc, &base) {
        Ok(Some(b)) => b,
        Ok(None) => return Response::NotFound(base),
        Err(e) => return Response::Error(e),
    };
    let new = match crate::dataplane::delta::apply(&old, delta, MAX_BLOCK_SIZE as usize) {
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
    match svc.put_for(&hash, Bytes::from(new), scopes) {
        Ok(()) => Response::Stored(hash),
        Err(e) if e.is_no_space() => Response::NoSpace(e.to_string()),
        Err(e) => Response::Error(e.to_string()),
    }
}

/// Writes the answers in request order, each once its work is done; a block stored as a file
/// goes out from the file.
async fn write_answers(
    mut wr: ConnWrite,
    mut jobs: mpsc::Receiver<Job>,
    outstanding: &AtomicUsize,
) -> Result<(), WireError> {
    while let Some(job) = jobs.recv().await {
        let _answered = Answered(outstanding);
        // An upload slot is held until its answer is written.
        let (answer, _slot) = match job.await.unwrap_or_else(failed) {
            Answer::Slotted(a, slot) => (*a, Some(slot)),
            a => (a, None),
        };
        match answer {
            Answer::Frame(resp) => write_response(&mut wr, resp).await?,
            Answer::Slotted(..) => {
                write_response(&mut wr, Response::Error("an answer in two slots".into())).await?
            }
            Answer::File(h, file, len) => {
                write_head(&mut wr, OP_BLOCK, h.as_bytes(), len as usize).await?;
                send_file(&mut wr, file, len).await?;
                metrics::SERVED_BLOCKS.inc();
                metrics::SERVED_BYTES.add(len);
            }
        }
    }
    wr.shutdown().await.ok();
    Ok(())
}

/// Counts an answer written (or given up) when dropped.
struct Answered<'a>(&'a AtomicUsize);

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One answer as its frame.
async fn write_response(wr: &mut ConnWrite, resp: Response) -> Result<(), WireError> {
    match resp {
        Response::Block(h, b) => {
            write_frame(wr, OP_BLOCK, h.as_bytes(), &b).await?;
            metrics::SERVED_BLOCKS.inc();
            metrics::SERVED_BYTES.add(b.len() as u64);
        }
        Response::NotFound(h) => write_frame(wr, OP_NOT_FOUND, h.as_bytes(), &[]).await?,
        Response::Stored(h) => write_frame(wr, OP_STORED, h.as_bytes(), &[]).await?,
        Response::Error(m) => write_frame(wr, OP_ERROR, &[0u8; 32], m.as_bytes()).await?,
        Response::NoSpace(m) => write_frame(wr, OP_NO_SPACE, &[0u8; 32], m.as_bytes()).await?,
        Response::Signature(h, sig) => write_frame(wr, OP_SIG, h.as_bytes(), &sig).await?,
        Response::Busy(h) => write_frame(wr, OP_BUSY, h.as_bytes(), &[]).await?,
        Response::Delta(h, d) => {
            write_frame(wr, OP_DELTA, h.as_bytes(), &d).await?;
            metrics::SERVED_BLOCKS.inc();
            metrics::SERVED_BYTES.add(d.len() as u64);
        }
        Response::Piece(h, p) => {
            write_frame(wr, OP_PIECE, h.as_bytes(), &p.encode()).await?;
            metrics::SERVED_BYTES.add(p.data.len() as u64);
        }
    }
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
