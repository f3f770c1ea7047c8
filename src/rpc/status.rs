//! The one table of failures between processes: what kind of failure an error is ([`Fault`]),
//! and how each edge says it. On the wire a fault is a gRPC code plus an errno in the
//! `kt-errno` metadata (the code alone cannot tell ENOTEMPTY from ENOTDIR); the FUSE edge turns
//! it back into that errno, the CLI into its exit code (`crate::cli::output`), the Python package
//! into an exception class.
//!
//! Library errors do not carry `tonic::Status`: a handler maps its error to a fault here, and a
//! client turns the status it receives into a [`RemoteError`] at once.

use tonic::{Code, Status};

/// gRPC metadata key carrying the errno a filesystem should report for a failed call.
pub const ERRNO_KEY: &str = "kt-errno";

/// gRPC metadata key by which a store server that stands by names the replica that owns the
/// store (cluster mode): its client goes there.
pub const OWNER_HEADER: &str = "kt-owner";

/// gRPC metadata key by which a replica of a store in shards says how many there are, with
/// the owner of the shard of the namespace it refused: its client keeps a route per shard.
pub const SHARDS_HEADER: &str = "kt-shards";

/// What kind of failure an error is, as every edge understands it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The key (or path, window, version) does not exist.
    NotFound,
    /// It exists already (a put without `--force`, a create with `O_EXCL`).
    Exists,
    /// A bad key, namespace or argument, refused before anything changed.
    Invalid,
    /// The state changed under the request, or does not allow it (missing blocks, a key that
    /// now names another version, a destination that differs).
    Conflict,
    NotEmpty,
    NotDir,
    IsDir,
    NoSpace,
    /// The store server or an agent could not be reached.
    Unreachable,
    Timeout,
    /// No source could give the data (every source lacked it, died or lied).
    Unavailable,
    /// The caller is not allowed to do this.
    Denied,
    /// The caller presented no credential the server accepts.
    Unauthenticated,
    /// The peer does not know the call (a server older than the caller).
    Unimplemented,
    /// One change larger than the metadata engine commits at once (etcd: 128 operations),
    /// refused whole: a rename of a directory of many keys, say.
    TooLarge,
    /// Anything else: a bug, a corrupt record, a failed disk.
    Internal,
}

impl Fault {
    /// The gRPC code a fault travels as.
    pub fn code(self) -> Code {
        match self {
            Fault::NotFound => Code::NotFound,
            Fault::Exists => Code::AlreadyExists,
            Fault::Invalid => Code::InvalidArgument,
            Fault::Conflict | Fault::NotEmpty | Fault::NotDir | Fault::IsDir => {
                Code::FailedPrecondition
            }
            Fault::NoSpace => Code::ResourceExhausted,
            Fault::Unreachable | Fault::Unavailable => Code::Unavailable,
            Fault::Timeout => Code::DeadlineExceeded,
            Fault::Denied => Code::PermissionDenied,
            Fault::Unauthenticated => Code::Unauthenticated,
            Fault::Unimplemented => Code::Unimplemented,
            Fault::TooLarge => Code::OutOfRange,
            Fault::Internal => Code::Internal,
        }
    }

    /// The errno a filesystem reports for a fault.
    pub fn errno(self) -> i32 {
        match self {
            Fault::NotFound => libc::ENOENT,
            Fault::Exists => libc::EEXIST,
            Fault::Invalid => libc::EINVAL,
            Fault::NotEmpty => libc::ENOTEMPTY,
            Fault::NotDir => libc::ENOTDIR,
            Fault::IsDir => libc::EISDIR,
            Fault::NoSpace => libc::ENOSPC,
            Fault::Timeout => libc::ETIMEDOUT,
            Fault::Denied | Fault::Unauthenticated => libc::EACCES,
            Fault::Unimplemented => libc::ENOTSUP,
            Fault::TooLarge => libc::E2BIG,
            Fault::Conflict | Fault::Unreachable | Fault::Unavailable | Fault::Internal => {
                libc::EIO
            }
        }
    }

    /// A stable name for machine-readable output (`kt --json`, Python exceptions).
    pub fn name(self) -> &'static str {
        match self {
            Fault::NotFound => "not_found",
            Fault::Exists => "exists",
            Fault::Invalid => "invalid",
            Fault::Conflict => "conflict",
            Fault::NotEmpty => "not_empty",
            Fault::NotDir => "not_dir",
            Fault::IsDir => "is_dir",
            Fault::NoSpace => "no_space",
            Fault::Unreachable => "unreachable",
            Fault::Timeout => "timeout",
            Fault::Unavailable => "unavailable",
            Fault::Denied => "denied",
            Fault::Unauthenticated => "unauthenticated",
            Fault::Unimplemented => "unimplemented",
            Fault::TooLarge => "too_large",
            Fault::Internal => "internal",
        }
    }

    fn from_errno(errno: i32) -> Option<Fault> {
        Some(match errno {
            libc::ENOENT => Fault::NotFound,
            libc::EEXIST => Fault::Exists,
            libc::EINVAL => Fault::Invalid,
            libc::ENOTEMPTY => Fault::NotEmpty,
            libc::ENOTDIR => Fault::NotDir,
            libc::EISDIR => Fault::IsDir,
            libc::ENOSPC => Fault::NoSpace,
            libc::ETIMEDOUT => Fault::Timeout,
            libc::EACCES => Fault::Denied,
            libc::E2BIG => Fault::TooLarge,
            _ => return None,
        })
    }

    fn from_code(code: Code) -> Fault {
        match code {
            Code::NotFound => Fault::NotFound,
            Code::AlreadyExists => Fault::Exists,
            Code::InvalidArgument | Code::OutOfRange => Fault::Invalid,
            Code::FailedPrecondition | Code::Aborted => Fault::Conflict,
            Code::ResourceExhausted => Fault::NoSpace,
            Code::Unavailable => Fault::Unreachable,
            Code::DeadlineExceeded | Code::Cancelled => Fault::Timeout,
            Code::PermissionDenied => Fault::Denied,
            Code::Unauthenticated => Fault::Unauthenticated,
            Code::Unimplemented => Fault::Unimplemented,
            _ => Fault::Internal,
        }
    }
}

/// The status a handler answers for a fault.
pub fn to_status(fault: Fault, message: impl Into<String>) -> Status {
    let mut status = Status::new(fault.code(), message);
    if let Ok(v) = fault.errno().to_string().parse() {
        status.metadata_mut().insert(ERRNO_KEY, v);
    }
    status
}

/// A failure a peer answered (a store server or an agent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    pub fault: Fault,
    pub message: String,
    /// Where the store's owner is, when a replica that stands by answered.
    pub owner: Option<String>,
    /// How many shards the store has, when a replica refused a namespace of another's shard.
    pub shards: Option<u32>,
}

impl RemoteError {
    pub fn new(fault: Fault, message: impl Into<String>) -> Self {
        RemoteError {
            fault,
            message: message.into(),
            owner: None,
            shards: None,
        }
    }
}

impl From<Status> for RemoteError {
    fn from(s: Status) -> Self {
        let by_errno = s
            .metadata()
            .get(ERRNO_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .and_then(Fault::from_errno);
        // A failed connection comes as a bare code; so do faults whose errno is EIO. A missing
        // credential shares its errno with a refusal, and only the code tells them apart.
        let fault = match s.code() {
            Code::Unauthenticated => Fault::Unauthenticated,
            code => by_errno.unwrap_or_else(|| Fault::from_code(code)),
        };
        let owner = s
            .metadata()
            .get(OWNER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let shards = s
            .metadata()
            .get(SHARDS_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        RemoteError {
            fault,
            message: s.message().to_string(),
            owner,
            shards,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_survives_the_wire() {
        let all = [
            Fault::NotFound,
            Fault::Exists,
            Fault::Invalid,
            Fault::Conflict,
            Fault::NotEmpty,
            Fault::NotDir,
            Fault::IsDir,
            Fault::NoSpace,
            Fault::Unreachable,
            Fault::Timeout,
            Fault::Denied,
            Fault::Unauthenticated,
            Fault::Unimplemented,
            Fault::Internal,
        ];
        for f in all {
            let back = RemoteError::from(to_status(f, "m"));
            assert_eq!(back.fault, f, "{f:?}");
            assert_eq!(back.message, "m");
        }
        // Data unavailability travels as the code of an unreachable peer.
        assert_eq!(
            RemoteError::from(to_status(Fault::Unavailable, "m")).fault,
            Fault::Unreachable
        );
        // A status without our metadata (a transport failure) is read by its code.
        assert_eq!(
            RemoteError::from(Status::unavailable("connection refused")).fault,
            Fault::Unreachable
        );
    }
}
