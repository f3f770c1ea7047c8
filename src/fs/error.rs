//! The filesystem's errors and the one table that turns them into errnos at the FUSE edge.
//!
//! POSIX conditions of the filesystem itself are variants of their own; failures of the parts
//! below (the store server, transfers, the node's blocks, the disk) keep their own types, and
//! [`FsError::errno`] is the only place that decides what a reader sees.

use crate::blocks::in_place::InPlaceError;
use crate::blocks::BlockError;
use crate::db::DbError;
use crate::gpu::control::GpuError;
use crate::hash::BlockHash;
use crate::key::KeyError;
use crate::rpc::ClientError;
use crate::transfer::publish::PublishError;
use crate::transfer::put::scan::ScanError;
use crate::transfer::TransferError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("is a directory")]
    IsDir,
    #[error("not a directory")]
    NotDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("is a symbolic link")]
    IsSymlink,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("read-only file system")]
    ReadOnly,
    #[error("this inode is no longer known")]
    Stale,
    #[error("bad file handle")]
    BadHandle,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("the change cannot be made atomically here")]
    CrossDevice,
    #[error("{0}")]
    Invalid(String),
    #[error("{0} is not supported")]
    NotSupported(&'static str),
    #[error("no such attribute")]
    NoAttr,
    #[error(transparent)]
    Name(#[from] KeyError),
    #[error("the file was open for writing in an agent that has since restarted")]
    LostWriter,
    #[error("block {0} is unavailable from every source")]
    Unavailable(BlockHash),
    #[error("the store server sent a bad manifest: {0}")]
    BadManifest(String),
    #[error("inline block {0} does not match its hash")]
    BadInline(BlockHash),
    #[error(transparent)]
    Remote(#[from] ClientError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Blocks(#[from] BlockError),
    #[error(transparent)]
    InPlace(#[from] InPlaceError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("no ioctls on this file")]
    NoIoctl,
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

pub type FsResult<T> = Result<T, FsError>;

fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl FsError {
    /// The errno the kernel is told.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::IsDir => libc::EISDIR,
            FsError::NotDir => libc::ENOTDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::IsSymlink => libc::ELOOP,
            FsError::NotSymlink | FsError::Invalid(_) => libc::EINVAL,
            FsError::ReadOnly => libc::EROFS,
            FsError::Stale => libc::ESTALE,
            FsError::BadHandle => libc::EBADF,
            FsError::NotPermitted => libc::EPERM,
            FsError::CrossDevice => libc::EXDEV,
            FsError::NotSupported(_) => libc::ENOTSUP,
            FsError::NoAttr => libc::ENODATA,
            FsError::Name(KeyError::SegmentTooLong(_) | KeyError::TooLong | KeyError::TooDeep) => {
                libc::ENAMETOOLONG
            }
            FsError::Name(_) => libc::EINVAL,
            FsError::Remote(e) => e.fault().errno(),
            FsError::NoIoctl => libc::ENOTTY,
            FsError::Gpu(g) => g.errno(),
            FsError::Io(e) => io_errno(e),
            FsError::Transfer(t) => transfer_errno(t),
            FsError::Publish(PublishError::Transfer(t)) => transfer_errno(t),
            FsError::Publish(PublishError::Client(e)) => e.fault().errno(),
            FsError::Blocks(b) => b.io().map_or(libc::EIO, io_errno),
            FsError::Scan(ScanError::Io { source, .. }) => io_errno(source),
            FsError::LostWriter
            | FsError::Unavailable(_)
            | FsError::BadManifest(_)
            | FsError::BadInline(_)
            | FsError::Publish(PublishError::BadVersion)
            | FsError::InPlace(_)
            | FsError::Db(_)
            | FsError::Scan(_)
            | FsError::Task(_) => libc::EIO,
        }
    }

    /// The fault of a call to the store server this failed with, where it is one.
    pub(crate) fn fault(&self) -> Option<crate::rpc::Fault> {
        match self {
            FsError::Remote(e) => Some(e.fault()),
            _ => None,
        }
    }

    /// Whether this is ENOENT, the one error some callers expect and handle.
    pub fn is_not_found(&self) -> bool {
        self.errno() == libc::ENOENT
    }
}

fn transfer_errno(t: &TransferError) -> i32 {
    match t {
        TransferError::Write { source, .. } | TransferError::Read { source, .. } => {
            io_errno(source)
        }
        TransferError::Rpc(e) => e.fault().errno(),
        _ => libc::EIO,
    }
}

/// Whether a fault is the want of a store server to answer (rather than an answer): what a
/// mount with stale reads answers from what it last saw.
pub(crate) fn unreachable_fault(f: crate::rpc::Fault) -> bool {
    matches!(
        f,
        crate::rpc::Fault::Unreachable | crate::rpc::Fault::Timeout
    )
}
