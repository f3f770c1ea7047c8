//! CUDA IPC: one process's device memory mapped into another's, on the same machine.
//!
//! A handle names a whole allocation (`cuMemAlloc`'s, or the CUDA runtime's `cudaMalloc` that
//! torch's caching allocator uses), never a pointer inside one: the exporter finds the base of
//! its pointer's allocation (`cuMemGetAddressRange`) and sends the base's handle with the
//! pointer's offset from it, as `KT_GPU_BUF_CUDA_IPC` buffers do (`doc/gpu-abi.md`). Memory
//! from a stream-ordered pool (`cuMemAllocAsync`) or expandable segments cannot be exported
//! this way and the driver refuses it.
//!
//! The importer maps the allocation (`cuIpcOpenMemHandle`, with peer access enabled lazily so
//! a handle from another GPU works too) and unmaps it on drop (`cuIpcCloseMemHandle`); an
//! imported pointer is never freed, the exporter owns it. Handles do not cross PID namespaces:
//! both processes must see each other's PIDs (the same pod, or `hostPID`).

use std::sync::Arc;

use cudarc::driver::sys;

use super::device::{Device, DeviceRange};
use super::error::{check, CudaError};

/// What another process needs to map a range of this one's device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcExport {
    /// The `CUipcMemHandle` of the allocation holding the range.
    pub handle: [u8; 64],
    /// Where the range starts within that allocation.
    pub offset: u64,
    /// The range's length.
    pub len: u64,
}

/// The handle of the allocation that holds `range`, and where `range` is in it.
pub fn export(device: &Device, range: DeviceRange<'_>) -> Result<IpcExport, CudaError> {
    device.bind()?;
    let (base, size) = allocation_of(range.ptr())?;
    let offset = range.ptr() - base;
    if offset + range.len() as u64 > size as u64 {
        return Err(CudaError::Invalid(format!(
            "{} bytes at offset {offset} run past their allocation of {size}",
            range.len()
        )));
    }
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `base` is the start of a live allocation (the driver just said so); `handle`
    // outlives the call.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut handle, base) },
        "cuIpcGetMemHandle",
    )?;
    Ok(IpcExport {
        handle: handle.reserved.map(|b| b as u8),
        offset,
        len: range.len() as u64,
    })
}

/// The base and size of the allocation that holds `ptr`.
fn allocation_of(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize), CudaError> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: only asks the driver about an address (it answers an error for one it did not
    // allocate); both outputs outlive the call.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange_v2",
    )?;
    Ok((base, size))
}

/// A peer process's allocation, mapped into this one; unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    device: Arc<Device>,
    base: sys::CUdeviceptr,
    size: usize,
    offset: u64,
    len: usize,
}

impl IpcMapping {
    /// Maps the allocation `handle` names on `device`, and checks that `len` bytes at `offset`
    /// lie inside it. A handle exported by this same process is refused by the driver.
    pub fn open(
        device: &Arc<Device>,
        handle: &[u8; 64],
        offset: u64,
        len: u64,
    ) -> Result<IpcMapping, CudaError> {
        device.bind()?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut base = 0;
        let flags = sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; the handle is passed by value; `base` outlives the
        // call.
        check(
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, raw, flags) },
            "cuIpcOpenMemHandle_v2",
        )?;
        let mut mapping = IpcMapping {
            device: device.clone(),
            base,
            size: 0,
            offset,
            len: 0,
        };
        // From here on, drop unmaps: an early return closes the handle.
        let (_, size) = allocation_of(base)?;
        let len = usize::try_from(len).map_err(|_| CudaError::Invalid("a huge length".into()))?;
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > size as u64)
        {
            return Err(CudaError::Invalid(format!(
                "{len} bytes at offset {offset} run past the peer's allocation of {size}"
            )));
        }
        mapping.size = size;
        mapping.len = len;
        Ok(mapping)
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The size of the whole mapped allocation.
    pub fn allocation_size(&self) -> usize {
        self.size
    }

    /// The whole mapped allocation: tensors carved from one allocation (as torch's caching
    /// allocator carves them) are ranges of it, and the driver maps a handle once per process.
    pub fn allocation(&self) -> DeviceRange<'_> {
        // SAFETY: `base..base + size` is the mapped allocation, device memory on this device
        // that stays mapped while `self` (which the range borrows) lives.
        unsafe { DeviceRange::from_raw(self.device.ordinal(), self.base, self.size) }
    }

    /// The range the peer exported.
    pub fn range(&self) -> DeviceRange<'_> {
        // SAFETY: `open` checked that the range lies inside the mapped allocation, which is
        // device memory on this device and stays mapped while `self` (which the range borrows)
        // lives.
        unsafe { DeviceRange::from_raw(self.device.ordinal(), self.base + self.offset, self.len) }
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: `base` came from cuIpcOpenMemHandle and is closed once; never freed (the
        // exporter owns the memory).
        let r = self.device.bind().and_then(|()| {
            check(
                unsafe { sys::cuIpcCloseMemHandle(self.base) },
                "cuIpcCloseMemHandle",
            )
        });
        if let Err(e) = r {
            tracing::warn!(
                device = self.device.ordinal(),
                "closing an IPC mapping: {e}"
            );
        }
    }
}
