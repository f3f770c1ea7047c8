//! What the transfer worker's requests fail with, and the errno each reports to its agent (and
//! through it to the caller's STATUS); CUDA's and NCCL's failures become these here.

use crate::gpu::cuda::{CudaError, NcclError};
use crate::gpu::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("worker: {0}")]
    Io(#[from] std::io::Error),
    #[error("buffer {path}: {source}")]
    Buffer {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Bad(String),
    #[error("CUDA buffers need a GPU, and this worker has none (host buffers work): {0}")]
    NoCuda(String),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("the peer worker {0}")]
    Peer(String),
    #[error("{1}")]
    Remote(i32, String),
    #[error("no registration {0} in this worker")]
    NoRegistration(u64),
    #[error("starting the transfer worker: {0}")]
    Spawn(String),
}

impl WorkerError {
    /// The errno a caller's STATUS reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            WorkerError::Bad(_) => libc::EINVAL,
            WorkerError::NoCuda(_) => libc::ENODEV,
            WorkerError::Remote(e, _) => *e,
            WorkerError::NoRegistration(_) => libc::ENOENT,
            WorkerError::Buffer { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
}

impl From<CudaError> for WorkerError {
    fn from(e: CudaError) -> WorkerError {
        match e {
            CudaError::Unavailable(why) => WorkerError::NoCuda(why),
            CudaError::Invalid(why) => WorkerError::Bad(why),
            e => WorkerError::Cuda(e.to_string()),
        }
    }
}

impl From<NcclError> for WorkerError {
    fn from(e: NcclError) -> WorkerError {
        match e {
            NcclError::Unavailable(why) => WorkerError::NoCuda(why),
            NcclError::Cuda(e) => e.into(),
            NcclError::Timeout { .. } => WorkerError::Remote(libc::ETIMEDOUT, e.to_string()),
            NcclError::Aborted => WorkerError::Remote(libc::ECONNABORTED, e.to_string()),
            e => WorkerError::Cuda(e.to_string()),
        }
    }
}
