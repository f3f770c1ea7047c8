//! The store server's RPC edge: its errors as faults (the one table of `rpc::status` makes
//! them statuses), and the checks every request's fields pass before they reach the metadata.

use tonic::Status;

use crate::broadcast::windows::BroadcastError;
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::meta::{MetaError, Refusal};
use crate::rpc::status::{to_status, Fault};

fn meta_fault(e: &MetaError) -> Fault {
    match e {
        MetaError::NotFound(_) => Fault::NotFound,
        MetaError::Exists(_) => Fault::Exists,
        MetaError::NotEmpty(_) => Fault::NotEmpty,
        MetaError::NotDir(_) => Fault::NotDir,
        MetaError::IsDir(_) => Fault::IsDir,
        MetaError::Conflict(_) | MetaError::MissingBlocks(_) => Fault::Conflict,
        MetaError::BadRequest(_) | MetaError::Manifest(_) => Fault::Invalid,
        MetaError::Blocks(b) if b.is_no_space() => Fault::NoSpace,
        MetaError::Backend(e) => match crate::meta::refusal(e) {
            Some(Refusal::NoSpace) => Fault::NoSpace,
            Some(Refusal::NotOwner) => Fault::Unreachable,
            Some(Refusal::TooLarge) => Fault::TooLarge,
            None => Fault::Internal,
        },
        MetaError::Corrupt(_) | MetaError::Blocks(_) => Fault::Internal,
    }
}

impl From<MetaError> for Status {
    fn from(e: MetaError) -> Self {
        if let MetaError::Backend(b) = &e {
            if crate::meta::refusal(b) == Some(Refusal::NotOwner) {
                return super::role::not_owner(e.to_string(), "");
            }
        }
        let fault = meta_fault(&e);
        if matches!(fault, Fault::Internal | Fault::NoSpace) {
            tracing::error!(error = %e, "store failure");
        }
        to_status(fault, e.to_string())
    }
}

impl From<BroadcastError> for Status {
    fn from(e: BroadcastError) -> Self {
        let fault = match e {
            BroadcastError::NoWindow(_) | BroadcastError::NoMember(..) => Fault::NotFound,
            BroadcastError::Bad(_) => Fault::Invalid,
            BroadcastError::Busy(_) => Fault::Conflict,
            BroadcastError::Exists(_) => Fault::Exists,
        };
        to_status(fault, e.to_string())
    }
}

pub(super) fn invalid(msg: impl Into<String>) -> Status {
    to_status(Fault::Invalid, msg)
}

pub(super) fn parse_ns(ns: &str) -> Result<Namespace, Status> {
    if ns.is_empty() {
        return Ok(Namespace::default());
    }
    Namespace::parse(ns).map_err(|e| invalid(e.to_string()))
}

pub(super) fn parse_key(key: &str) -> Result<KeyPath, Status> {
    KeyPath::parse(key).map_err(|e| invalid(e.to_string()))
}

pub(super) fn parse_version(v: &[u8]) -> Result<Version, Status> {
    Version::from_slice(v).ok_or_else(|| invalid("version must be 32 bytes"))
}

/// Runs blocking store work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MetaError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| to_status(Fault::Internal, e.to_string()))?
        .map_err(Status::from)
}
