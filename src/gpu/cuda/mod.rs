//! CUDA and NCCL for the transfer worker, as a thin safe layer over `cudarc`'s raw bindings.
//!
//! Both libraries are loaded at run time, so ktfs builds and its tests run on machines with no
//! CUDA toolkit, driver, GPU or NCCL. `cudarc` panics at the first call into a library it
//! cannot load (and at the first call of a symbol the library lacks), so nothing here calls
//! either before [`probe::probe`] said yes: every entry point asks it first and answers
//! [`CudaError::Unavailable`] otherwise. The probe also checks that every symbol this module
//! calls is there.
//!
//! - [`probe`]: whether CUDA and NCCL are usable here, found once (`KT_GPU_TRANSPORT=host`
//!   forces the host transport);
//! - [`device`]: a device's primary context, memory allocated with `cuMemAlloc`, a stream with
//!   its copies;
//! - [`ipc`]: CUDA IPC, exporting an allocation to another process and mapping a peer's;
//! - [`nccl`]: a communicator with init deadlines, completion deadlines and an abort that
//!   another thread may call (its waits are [`deadline`]'s one polling loop);
//! - [`nccl_lib`]: finding pip's `libnccl.so.2` (or another NCCL) and the `LD_LIBRARY_PATH`
//!   that makes it loadable by a process about to start.
//!
//! Device memory is never host memory: the host never reads or writes through a device
//! pointer, so what races on the device cannot break the host's memory safety. What must hold
//! is that a pointer handed to the driver as device memory is device memory (under unified
//! addressing a host pointer would be accepted and written): memory allocated or mapped here
//! is, and [`device::DeviceRange::from_raw`] is `unsafe` for that reason.

mod deadline;
pub mod device;
pub mod ipc;
pub mod nccl;
pub mod nccl_lib;
pub mod probe;

use cudarc::driver::sys;

pub use device::{Device, DeviceBuffer, DeviceRange, Event, Stream};
pub use ipc::{IpcExport, IpcMapping};
pub use nccl::{AbortHandle, Comm, Grouped, NcclError, UniqueId};
pub use nccl_lib::{
    find_nccl_library, loaded_nccl, loader_path_for, loader_path_for_nccl, nccl_named_in,
};
pub use probe::{probe, Availability};

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

/// Fails unless the probe found a usable CUDA driver and device.
pub(crate) fn require_cuda() -> Result<&'static probe::CudaInfo, CudaError> {
    probe()
        .cuda
        .as_ref()
        .map_err(|e| CudaError::Unavailable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine may lack libcuda, libnccl or a GPU, or have all three; whatever is missing
    /// must show as `Unavailable` from every entry point, never as a panic.
    #[test]
    fn without_cuda_every_entry_point_is_unavailable_not_a_panic() {
        let found = probe();
        if found.cuda.is_err() {
            for ordinal in [0, 1, -1] {
                let e = Device::open(ordinal).unwrap_err();
                assert!(matches!(e, CudaError::Unavailable(_)), "{e}");
                assert!(e.to_string().starts_with("CUDA is not available: "), "{e}");
            }
            assert!(require_cuda().is_err());
        }
        if found.nccl.is_err() {
            let e = UniqueId::new().unwrap_err();
            assert!(matches!(e, NcclError::Unavailable(_)), "{e}");
        }
        if found.cuda.is_err() || found.nccl.is_err() {
            assert!(!found.nccl_transfers());
        }
    }

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
