//! The frame both halves of the protocol share: the hello, the ops, the limits, how a frame is
//! read and written, the errors of a connection and the answers a client receives.
//!
//! A frame is `[op: u8][len: u32 big-endian][payload]`; every payload but a ticket's starts
//! with a 32-byte block hash.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::hash::subtree::Piece;
use crate::hash::BlockHash;
use crate::manifest::MAX_BLOCK_SIZE;

pub const MAGIC: [u8; 4] = *b"KTDP";
pub(super) const PROTO_VERSION: u8 = 1;

pub(super) const OP_GET: u8 = 1;
pub(super) const OP_PUT: u8 = 2;
pub(super) const OP_TICKET: u8 = 3;
pub(super) const OP_SIGNATURE: u8 = 4;
pub(super) const OP_PUT_DELTA: u8 = 5;
/// A GET from a swarm member: served within the server's upload slots, else answered busy.
pub(super) const OP_GET_SWARM: u8 = 6;
/// A GET of a block as a delta against the getter's bytes, whose signature the frame carries.
pub(super) const OP_GET_DELTA: u8 = 7;
/// A GET answered from what the server holds now: a block it expects (one a getter on its node
/// is receiving) is not waited for. A getter asks its own node so: it may be the one receiving.
pub(super) const OP_GET_NOW: u8 = 8;
/// A swarm member's GET of one piece of a block (`piece.rs`): the hash, then the piece size's
/// log2 (u8) and the piece's index (u32). Served within the upload slots, as `OP_GET_SWARM`.
pub(super) const OP_GET_PIECE: u8 = 9;
pub(super) const OP_BLOCK: u8 = 0x81;
pub(super) const OP_NOT_FOUND: u8 = 0x82;
pub(super) const OP_STORED: u8 = 0x83;
pub(super) const OP_ERROR: u8 = 0x84;
/// A refusal because the server's disk is full: the client says so, and retrying elsewhere or
/// later is what helps.
pub(super) const OP_NO_SPACE: u8 = 0x85;
pub(super) const OP_SIG: u8 = 0x86;
/// Every upload slot is taken: ask another holder.
pub(super) const OP_BUSY: u8 = 0x87;
/// A block as an rsync delta against the bytes an `OP_GET_DELTA` described.
pub(super) const OP_DELTA: u8 = 0x88;
/// A piece of a block with the block's chaining values (`piece.rs`).
pub(super) const OP_PIECE: u8 = 0x89;

/// Largest payload: a hash and the largest block.
pub const MAX_FRAME: usize = MAX_BLOCK_SIZE as usize + 32;
/// Connect timeout: a dead peer is an error in seconds, never a hang.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer that sends nothing for this long while requests are outstanding is taken for dead.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection that says nothing for this long between requests is closed by the server; a
/// client keeps an idle connection for less ([`POOL_IDLE`]).
pub const SERVER_IDLE: Duration = Duration::from_secs(120);
/// How long a client keeps a connection idle for its next fetch.
pub const POOL_IDLE: Duration = Duration::from_secs(60);
/// Largest frame a server reads from a connection that has shown no ticket its gate admits: a
/// ticket, or a request that names a hash. The length a frame announces is read (and held)
/// before what it asks is checked, so a caller with no ticket must not make the server hold
/// much: measured, 8 connections each sending most of a 64 MiB frame took a store from 33 to
/// 545 MiB.
pub(super) const UNTICKETED_FRAME: usize = 4096;
/// A server reads a frame into a buffer that grows from this size as the bytes arrive, never
/// into one of the announced length: a frame sent slowly, or not at all, costs what came.
const FIRST_READ: usize = 256 << 10;

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

/// A frame's op and announced length; `None` where the peer closed the connection between
/// frames. A length over `limit` is refused before any of the payload is read.
async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Option<(u8, usize)>, WireError> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > limit.min(MAX_FRAME) {
        return Err(WireError::FrameTooLarge(len));
    }
    Ok(Some((head[0], len)))
}

/// The next answer's op and payload (a client's read), of at most `limit` bytes: what the
/// request it answers can take, so a peer that announces more than the block asked for is
/// refused at the frame's head.
pub(super) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Option<(u8, Bytes)>, WireError> {
    let Some((op, len)) = read_head(r, limit).await? else {
        return Ok(None);
    };
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
    Ok(Some((op, Bytes::from(buf).slice(pad..))))
}

/// The next request's op and payload (a server's read), of at most `limit` bytes, into a
/// buffer that grows as its bytes arrive; each read must come within [`IDLE_TIMEOUT`].
pub(super) async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Option<(u8, Bytes)>, WireError> {
    let head = tokio::time::timeout(IDLE_TIMEOUT, read_head(r, limit))
        .await
        .map_err(|_| WireError::Timeout)??;
    let Some((op, len)) = head else {
        return Ok(None);
    };
    let mut buf = Vec::with_capacity(len.min(FIRST_READ));
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            buf.reserve((len - buf.len()).min(buf.capacity()));
        }
        let mut limited = (&mut *r).take((len - buf.len()) as u64);
        let read = tokio::time::timeout(IDLE_TIMEOUT, limited.read_buf(&mut buf))
            .await
            .map_err(|_| WireError::Timeout)??;
        if read == 0 {
            return Err(WireError::Closed);
        }
    }
    Ok(Some((op, Bytes::from(buf))))
}

/// Where a block's bytes start in a received frame's buffer.
pub(super) const BODY_ALIGN: usize = 4096;

pub(super) async fn write_frame<W: AsyncWrite + Unpin>(
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
pub(super) async fn write_head<W: AsyncWrite + Unpin>(
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

/// A payload's leading block hash and what follows it.
pub(super) fn split_hash(mut payload: Bytes) -> Result<(BlockHash, Bytes), WireError> {
    if payload.len() < 32 {
        return Err(WireError::BadFrame("short payload"));
    }
    let rest = payload.split_off(32);
    let hash = BlockHash::from_slice(&payload).ok_or(WireError::BadFrame("hash"))?;
    Ok((hash, rest))
}
