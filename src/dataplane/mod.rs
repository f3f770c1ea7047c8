//! The data plane: blocks by hash between nodes and the store, over a lean framed protocol
//! rather than gRPC ([`wire`]; [`port`] shares one port between both planes). A caller fetches
//! a set of blocks from ordered sources with failover ([`fetch`]), nearest first
//! ([`sources`]), in whole blocks or in pieces checked on their own ([`piece`]), or as rsync
//! deltas against bytes it holds ([`delta`]); a putter uploads what the store lacks
//! ([`upload`]). What a connection may have in flight is in [`budget`], how a transfer fails in
//! [`error`].
//!
//! Client and server halves both live here; the server half serves what [`crate::blocks`]
//! holds, under the tickets of [`crate::auth::ticket`].

pub mod budget;
pub mod delta;
pub mod error;
pub mod faulty;
pub mod fetch;
pub mod peers;
pub mod piece;
pub mod port;
pub mod sources;
pub mod upload;
pub mod wire;

pub use error::TransferError;
pub use fetch::{BlockJob, BlockSink, FetchReport};
pub use peers::Peers;
pub use sources::SourceAddr;
