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
//!   another thread may call (its waits are [`deadline`]'s one polling loop), the ranks of
//!   one sharing a [`unique_id`];
//! - [`error`] and [`nccl_error`]: what the driver's and NCCL's calls fail with;
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
pub mod error;
pub mod ipc;
pub mod nccl;
pub mod nccl_error;
pub mod nccl_lib;
pub mod probe;
pub mod unique_id;

pub use device::{Device, DeviceBuffer, DeviceRange, Event, Stream};
pub use error::CudaError;
pub use ipc::{IpcExport, IpcMapping};
pub use nccl::{AbortHandle, Comm, Grouped};
pub use nccl_error::NcclError;
pub use nccl_lib::{
    find_nccl_library, loaded_nccl, loader_path_for, loader_path_for_nccl, nccl_named_in,
};
pub use probe::{probe, Availability};
pub use unique_id::UniqueId;

#[cfg(test)]
mod tests {
    use super::probe::require_cuda;
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
}
