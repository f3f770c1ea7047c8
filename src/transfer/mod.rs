//! Moving data: the block protocol on the wire ([`wire`], and [`port`], one port for both
//! planes), fetching from ordered sources with failover ([`fetch`]), uploading what the store
//! lacks ([`upload`]), the one publish path ([`publish`]), where sources are and how near
//! ([`sources`]), membership of a broadcast window ([`tree`]) and pipelining to peers
//! ([`offer`]); and on top of them the two jobs every caller shares: [`put`] (with [`scan`],
//! building a manifest from local files cut into blocks by [`chunk`]) and [`get`]. What the data plane asks of its callers
//! is in [`ticket`].
//!
//! Everything here is client-side (it compiles without RocksDB or FUSE), but the server half of
//! the wire protocol, which the store and the agents run over [`crate::blocks`].

pub mod chunk;
pub mod delta;
pub mod fetch;
pub mod get;
pub mod index;
pub mod offer;
pub mod piece;
pub mod port;
pub mod publish;
pub mod put;
pub mod read;
pub mod scan;
pub mod sources;
mod swarm;
pub mod ticket;
pub mod tree;
pub mod upload;
pub mod wire;

pub use fetch::{BlockJob, BlockSink, FetchReport};
pub use sources::SourceAddr;

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::rpc::{ClientError, Fault};

/// A progress bar on stderr for a transfer someone watches (`verbose` and a terminal), else one
/// that draws nothing.
pub fn progress_bar(verbose: bool) -> ProgressBar {
    if !verbose || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Connections opened to one source at a time.
const CONNS_PER_SOURCE: usize = 2;
/// Bytes in flight on one connection: requested and not yet written to disk.
const WINDOW_BYTES: u32 = 16 << 20;
/// Semaphore unit for the byte budget.
const UNIT: u32 = 64 << 10;

fn permits(len: u32) -> u32 {
    len.div_ceil(UNIT).clamp(1, WINDOW_BYTES / UNIT)
}

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("could not fetch {missing} blocks from any source ({reasons})")]
    Unavailable { missing: usize, reasons: String },
    #[error("no source holds this version")]
    NoSource,
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} changed while it was being published; run the put again")]
    Changed(String),
    #[error("upload to {addr} failed: {reason}")]
    Upload { addr: String, reason: String },
    #[error("the store at {addr} is out of space: {reason}")]
    NoSpace { addr: String, reason: String },
    #[error(transparent)]
    Rpc(#[from] ClientError),
}

impl TransferError {
    pub fn fault(&self) -> Fault {
        match self {
            TransferError::Unavailable { .. } | TransferError::NoSource => Fault::Unavailable,
            TransferError::Write { source, .. } | TransferError::Read { source, .. }
                if source.raw_os_error() == Some(libc::ENOSPC) =>
            {
                Fault::NoSpace
            }
            TransferError::Changed(_) => Fault::Conflict,
            TransferError::Upload { .. } => Fault::Unreachable,
            TransferError::NoSpace { .. } => Fault::NoSpace,
            TransferError::Rpc(e) => e.fault(),
            TransferError::Write { .. } | TransferError::Read { .. } => Fault::Internal,
        }
    }
}
