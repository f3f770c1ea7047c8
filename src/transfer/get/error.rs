//! How a get fails.

use std::path::Path;

use crate::dataplane::TransferError;
use crate::manifest::ManifestError;
use crate::rpc::{ClientError, Fault};

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error("{0} exists and differs (use --force to overwrite)")]
    Exists(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("bad filter pattern: {0}")]
    Pattern(String),
    #[error("server returned a malformed version")]
    BadVersion,
    #[error(
        "{0} is a GPU key: it is received into buffers through the mount's /kt/.gpu control files"
    )]
    GpuKey(String),
    #[error("{0} is held only by nodes inside the cluster (locale local), which a getter outside it cannot reach")]
    OutsideCluster(String),
}

impl GetError {
    pub fn fault(&self) -> Fault {
        match self {
            GetError::NotFound(_) => Fault::NotFound,
            GetError::Client(e) => e.fault(),
            GetError::Transfer(t) => t.fault(),
            GetError::Exists(_) => Fault::Conflict,
            GetError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                Fault::NoSpace
            }
            GetError::Pattern(_) | GetError::GpuKey(_) => Fault::Invalid,
            GetError::OutsideCluster(_) => Fault::Unavailable,
            GetError::Manifest(_) | GetError::Io { .. } | GetError::BadVersion => Fault::Internal,
        }
    }
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GetError + '_ {
    move |source| GetError::Io {
        path: path.display().to_string(),
        source,
    }
}
