//! What a control file's calls fail with, and the errno the caller sees for each (from the
//! ioctl, or in its STATUS).

use crate::gpu::abi;
use crate::gpu::table::TableError;
use crate::gpu::window::WindowError;
use crate::gpu::worker::WorkerError;
use crate::rpc::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Abi(#[from] abi::AbiError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("{0}")]
    Buffers(String),
    #[error("this control file has a registration already: open the key again for another")]
    Busy,
    #[error("no transfer {0} on this control file")]
    NoTransfer(u64),
    #[error("GPU key {0} is not published")]
    NotFound(String),
    #[error("the tensor table does not match the publisher's: {0}")]
    Mismatch(String),
    #[error("a window needs a quorum: world_size, timeout_ms or ips")]
    NoQuorum,
    #[error(transparent)]
    Window(#[from] WindowError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Rpc(#[from] ClientError),
    #[error("the process that opened this control file is gone: its descriptor acts for no one")]
    OpenerGone,
}

impl GpuError {
    /// The errno the caller sees, from the ioctl or in its STATUS.
    pub fn errno(&self) -> i32 {
        match self {
            GpuError::Abi(abi::AbiError::Foreign(_)) => libc::ENOTTY,
            GpuError::Abi(_) | GpuError::Table(_) | GpuError::Buffers(_) | GpuError::NoQuorum => {
                libc::EINVAL
            }
            GpuError::Busy => libc::EBUSY,
            GpuError::NoTransfer(_) | GpuError::NotFound(_) => libc::ENOENT,
            GpuError::Mismatch(_) => libc::EBADMSG,
            GpuError::Window(w) => w.errno(),
            GpuError::Worker(w) => w.errno(),
            GpuError::Rpc(e) => e.fault().errno(),
            GpuError::OpenerGone => libc::ESRCH,
        }
    }
}
