//! What an NCCL call can fail with, and the reading of NCCL's results into it: shared by the
//! unique ids ([`super::unique_id`]) and the communicators ([`super::nccl`]).

use std::ffi::{c_char, CStr};
use std::time::Duration;

use cudarc::nccl::sys;

use super::error::CudaError;
use super::probe::probe;

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("NCCL is not available: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// `name` is the `ncclResult_t`'s, `message` NCCL's own words (its last error, or the
    /// result's description).
    #[error("{call}: {name}: {message}")]
    Nccl {
        call: &'static str,
        name: String,
        message: String,
    },
    #[error("{what} did not finish within {waited:?}; the communicator was aborted")]
    Timeout {
        what: &'static str,
        waited: Duration,
    },
    #[error("the communicator was aborted")]
    Aborted,
    #[error("{0}")]
    Invalid(String),
}

/// Fails unless the probe found a usable NCCL.
pub(super) fn require_nccl() -> Result<(), NcclError> {
    probe()
        .nccl
        .as_ref()
        .map(|_| ())
        .map_err(|e| NcclError::Unavailable(e.to_string()))
}

/// `Ok(true)` for `ncclSuccess`, `Ok(false)` for `ncclInProgress`, the error otherwise, in
/// NCCL's words (`comm`'s last error where there is one).
pub(super) fn status(
    r: sys::ncclResult_t,
    call: &'static str,
    comm: sys::ncclComm_t,
) -> Result<bool, NcclError> {
    match r {
        sys::ncclResult_t::ncclSuccess => return Ok(true),
        sys::ncclResult_t::ncclInProgress => return Ok(false),
        _ => {}
    }
    let text = |p: *const c_char| {
        // SAFETY: NCCL returns a NUL-terminated string it owns (static, or the thread's last
        // error), or null; it is copied at once.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: the probe found both symbols; a null communicator asks for the thread's last
    // error.
    let last = text(unsafe { sys::ncclGetLastError(comm) }).filter(|s| !s.trim().is_empty());
    // SAFETY: as above.
    let described = text(unsafe { sys::ncclGetErrorString(r) });
    Err(NcclError::Nccl {
        call,
        name: format!("{r:?}"),
        message: last.or(described).unwrap_or_default().trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_nccl_said() {
        let e = NcclError::Nccl {
            call: "ncclCommInitRankConfig",
            name: "ncclInvalidUsage".into(),
            message: "Duplicate GPU detected".into(),
        };
        assert_eq!(
            e.to_string(),
            "ncclCommInitRankConfig: ncclInvalidUsage: Duplicate GPU detected"
        );
    }
}
