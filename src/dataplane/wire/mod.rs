//! The data plane: blocks by hash over a lean framed TCP protocol.
//!
//! Bulk data does not ride gRPC: framing costs, HTTP/2 flow control and per-message copies halve
//! what a socket can move. A connection opens with `KTDP` and a protocol version, then carries
//! frames `[op: u8][len: u32 big-endian][payload]`. Requests are pipelined: a client keeps many
//! in flight and the server answers them in order, working on several at once. Every frame has a
//! size limit, and a malformed frame ends that connection only. A client presents its tickets
//! ([`crate::auth::ticket`]) as `OP_TICKET` frames, which are not answered; each later request
//! is checked against the connection's tickets by the server's
//! [`Gate`](crate::auth::ticket::Gate).
//!
//! A swarm member asks with `OP_GET_SWARM`: the server sends the block within its upload slots
//! ([`BlockServe::upload_slots`](crate::blocks::BlockServe::upload_slots): two on a node) and
//! answers `OP_BUSY` at once when they are all taken, so that the member asks another holder
//! instead of sharing an uplink it would finish nothing on. Plain `OP_GET`s (the store's grants,
//! tree children, the mount) are not limited.
//!
//! A block that replaces one the server holds can travel as an rsync delta
//! ([`delta`](crate::dataplane::delta)): `OP_SIGNATURE` asks for the old block's signature,
//! `OP_PUT_DELTA` sends the new block's hash, the old block's hash and the delta. The server
//! rebuilds the block and checks it against its hash before storing it, so a lying delta stores
//! nothing. Both need leave to read the old block (a read ticket of a version that holds it): a
//! signature tells much about the bytes it describes, and a delta that copies from a block is a
//! way to test guesses of it.
//!
//! The other way round, a getter that holds an older copy of a file (a `kt get` onto a locally
//! modified file) sends `OP_GET_DELTA`: the hash of the block it wants and the rsync signature of
//! the bytes of its copy that the block replaces. The server answers `OP_DELTA` (a delta against
//! those bytes), or the block whole where a delta would not be smaller; the getter rebuilds the
//! block and checks it against its hash, so a lying delta costs a plain fetch, never a wrong
//! byte. It needs leave to read the block only: the signature describes the getter's own bytes.
//!
//! `frame.rs` holds what both halves share (the ops, the framing, the limits, the errors); the
//! client half ([`connect`], [`DataSender`], [`DataReceiver`]) is in `client.rs`, the server
//! half ([`serve_connection`]) in `server.rs`. Neither half names the other.

pub mod admission;
mod client;
mod frame;
mod server;
#[cfg(test)]
mod tests;

pub use crate::auth::tls::Peer;
pub use client::{connect, open, DataReceiver, DataSender, Duplex, PeerStream};
pub use frame::{
    Response, WireError, CONNECT_TIMEOUT, IDLE_TIMEOUT, MAGIC, MAX_FRAME, POOL_IDLE, SERVER_IDLE,
};
pub use server::{refuse_plaintext, serve_connection, SERVER_PIPELINE};
