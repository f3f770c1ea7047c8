//! The peers a node fetches blocks from, as a value the node owns: how a connection to a peer's
//! data port is made ([`Dial`]: over TCP, and TLS where this process trusts a CA, or through a
//! test's stand-in) and the connections kept idle between fetches, by address.
//!
//! A mount fetches a few blocks at a time, and a fresh TCP connection (and a thread's worth of
//! setup) per block would cost more than the block: a connection that answered every request
//! goes back to the pool, up to [`IDLE_PER_PEER`] per address. Each owner (a mount, a `kt get`,
//! the Python client) has its pool; nothing is shared across them through the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::wire::{self, DataReceiver, DataSender, Peer, PeerStream, WireError};
use crate::auth::tls::{self, Plane};
use crate::locks::lock;

/// Idle connections kept per peer.
pub const IDLE_PER_PEER: usize = 8;

/// How a connection to a peer's data port is made.
#[async_trait::async_trait]
pub trait Dial: Send + Sync {
    /// A stream to the data port at `addr` of `peer` (a node, or the store server).
    async fn dial(&self, addr: &str, peer: Peer) -> Result<PeerStream, WireError>;
}

/// Over TCP, and TLS where this process trusts a CA.
pub struct Tcp;

#[async_trait::async_trait]
impl Dial for Tcp {
    async fn dial(&self, addr: &str, peer: Peer) -> Result<PeerStream, WireError> {
        let stream = tokio::time::timeout(
            wire::CONNECT_TIMEOUT + tls::HANDSHAKE_TIMEOUT,
            tls::connect(addr, Plane::Data, peer),
        )
        .await
        .map_err(|_| WireError::Timeout)??;
        Ok(Box::new(stream))
    }
}

/// A connection to a peer: its sending and receiving halves.
pub type Conn = (DataSender, DataReceiver);

/// The peers of one owner: how it reaches them, and its idle connections. Cheap to clone (a
/// clone shares the pool).
#[derive(Clone)]
pub struct Peers {
    dial: Arc<dyn Dial>,
    /// Idle connections by address, each with when it went idle.
    idle: Arc<Mutex<HashMap<String, Vec<Idle>>>>,
}

/// A connection kept idle, and since when.
type Idle = (Instant, Conn);

impl Default for Peers {
    fn default() -> Self {
        Peers::over(Arc::new(Tcp))
    }
}

impl Peers {
    /// Peers reached through `dial`.
    pub fn over(dial: Arc<dyn Dial>) -> Peers {
        Peers {
            dial,
            idle: Arc::default(),
        }
    }

    /// A new connection to `addr`, its protocol opened.
    pub async fn connect(&self, addr: &str, peer: Peer) -> Result<Conn, WireError> {
        let stream = self.dial.dial(addr, peer).await?;
        wire::open(stream).await
    }

    /// An idle connection to `addr`, if one is kept and fresh: one idle for [`wire::POOL_IDLE`]
    /// is dropped, well before the server lets it go ([`wire::SERVER_IDLE`]), so a fetch never
    /// takes a connection the peer is closing.
    pub fn checkout(&self, addr: &str) -> Option<Conn> {
        let mut idle = lock(&self.idle);
        let kept = idle.get_mut(addr)?;
        kept.retain(|(since, _)| since.elapsed() < wire::POOL_IDLE);
        kept.pop().map(|(_, conn)| conn)
    }

    /// Keeps `conn`, which answered everything asked of it, for the next fetch from `addr`.
    pub fn checkin(&self, addr: &str, conn: Conn) {
        let mut idle = lock(&self.idle);
        let kept = idle.entry(addr.to_string()).or_default();
        if kept.len() < IDLE_PER_PEER {
            kept.push((Instant::now(), conn));
        }
    }
}
