//! How a transfer fails, for every caller of the data plane and the jobs above it.

use crate::rpc::{ClientError, Fault};

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
