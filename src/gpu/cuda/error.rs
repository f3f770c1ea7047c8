//! What a CUDA call can fail with, and the one check that turns a driver result into it; every
//! file of this module reports its failures this way.

use cudarc::driver::sys;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A driver call failed; `name` is the `CUresult`'s (`CUDA_ERROR_INVALID_VALUE`).
    #[error("{call}: {name} ({code})")]
    Driver {
        call: &'static str,
        name: String,
        code: u32,
    },
    #[error("{0}")]
    Invalid(String),
}

impl CudaError {
    /// Whether the driver answered `result`.
    pub fn is(&self, result: sys::CUresult) -> bool {
        matches!(self, CudaError::Driver { code, .. } if *code == result as u32)
    }
}

/// `Ok` for `CUDA_SUCCESS`, the call's name and the result's otherwise.
pub(crate) fn check(result: sys::CUresult, call: &'static str) -> Result<(), CudaError> {
    if result == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError::Driver {
        call,
        // The bindings' enum names the result exactly as CUDA's headers do.
        name: format!("{result:?}"),
        code: result as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_name_the_call_and_the_result() {
        assert_eq!(check(sys::CUresult::CUDA_SUCCESS, "cuInit"), Ok(()));
        let e = check(sys::CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc_v2").unwrap_err();
        assert_eq!(e.to_string(), "cuMemAlloc_v2: CUDA_ERROR_INVALID_VALUE (1)");
        assert!(e.is(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(!e.is(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!CudaError::Unavailable("x".into()).is(sys::CUresult::CUDA_SUCCESS));
    }
}
