//! The client half of the protocol: [`connect`] opens a connection and says hello, a
//! [`DataSender`] pipelines requests on it and a [`DataReceiver`] reads the answers, in request
//! order, as [`Response`]s.

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};

use super::frame::{
    read_frame, split_hash, write_frame, Response, WireError, CONNECT_TIMEOUT, IDLE_TIMEOUT, MAGIC,
    MAX_FRAME, OP_BLOCK, OP_BUSY, OP_DELTA, OP_ERROR, OP_GET, OP_GET_DELTA, OP_GET_NOW,
    OP_GET_PIECE, OP_GET_SWARM, OP_NOT_FOUND, OP_NO_SPACE, OP_PIECE, OP_PUT, OP_PUT_DELTA, OP_SIG,
    OP_SIGNATURE, OP_STORED, OP_TICKET, PROTO_VERSION,
};
use crate::auth::tls::{self, Peer, Plane};
use crate::hash::subtree::Piece;
use crate::hash::BlockHash;

/// A byte stream to a peer's data port, either way: a socket, or a test's stand-in for one.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

pub type PeerStream = Box<dyn Duplex>;

/// The sending half of a client connection.
pub struct DataSender {
    wr: WriteHalf<PeerStream>,
}

/// The receiving half of a client connection.
pub struct DataReceiver {
    rd: BufReader<ReadHalf<PeerStream>>,
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
    open(Box::new(stream)).await
}

/// Opens the protocol on `stream` (a connection [`connect`] or a [`Dial`](crate::dataplane::peers::Dial)
/// made): its halves, the hello sent.
pub async fn open(stream: PeerStream) -> Result<(DataSender, DataReceiver), WireError> {
    let (rd, mut wr) = tokio::io::split(stream);
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

/// What an answer carries beyond the bytes of its block: the hash, a piece's chaining values,
/// an error's words.
const ANSWER_OVERHEAD: usize = 64 << 10;

impl DataReceiver {
    /// The next response, in request order. A peer silent for [`IDLE_TIMEOUT`] is an error.
    pub async fn recv(&mut self) -> Result<Response, WireError> {
        self.recv_at_most(MAX_FRAME).await
    }

    /// [`DataReceiver::recv`] of an answer that can carry at most `len` bytes of a block (or of
    /// a piece, or of a delta): a frame that announces more is refused at its head, before the
    /// peer can make this side read and hold it.
    pub async fn recv_at_most(&mut self, len: usize) -> Result<Response, WireError> {
        let limit = len.saturating_add(ANSWER_OVERHEAD);
        let frame = tokio::time::timeout(IDLE_TIMEOUT, read_frame(&mut self.rd, limit))
            .await
            .map_err(|_| WireError::Timeout)??;
        let (op, payload) = frame.ok_or(WireError::Closed)?;
        let (hash, body) = split_hash(payload)?;
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
