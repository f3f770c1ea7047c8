//! A device, its memory and a stream, over the CUDA driver API.
//!
//! A [`Device`] holds a reference on the device's primary context, the one context every
//! library in the process (the CUDA runtime, torch, NCCL) shares, so pointers from any of them
//! are valid in it. The driver's current context is per thread, so every call here makes it
//! current first: a device, its buffers and its streams may be used from any thread.
//!
//! Everything on a device goes through one [`Stream`] (non-blocking, so it never waits for the
//! legacy default stream other libraries use): host copies are enqueued on it and waited for
//! before they return (the host slice is borrowed only for the call), device copies and fills
//! are only enqueued, and [`Stream::synchronize`] or [`Stream::query`] tells when they are done.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;

use super::error::{check, CudaError};
use super::probe::require_cuda;

/// A CUDA device's primary context, retained.
#[derive(Debug)]
pub struct Device {
    ordinal: i32,
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a primary context may be current on any number of threads at once and the driver API
// is thread-safe; the handle is only ever passed to the driver, never dereferenced here.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only reads the handles.
unsafe impl Sync for Device {}

impl Device {
    /// The device numbered `ordinal` (as `CUDA_VISIBLE_DEVICES` numbers them).
    pub fn open(ordinal: i32) -> Result<Arc<Device>, CudaError> {
        let info = require_cuda()?;
        if ordinal < 0 || ordinal as u32 >= info.devices {
            return Err(CudaError::Invalid(format!(
                "no CUDA device {ordinal}: this process sees {}",
                info.devices
            )));
        }
        let mut device = 0;
        // SAFETY: the probe initialised the driver and found its symbols; `device` outlives
        // the call.
        check(
            unsafe { sys::cuDeviceGet(&mut device, ordinal) },
            "cuDeviceGet",
        )?;
        let mut context = std::ptr::null_mut();
        // SAFETY: as above; `context` outlives the call.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let d = Arc::new(Device {
            ordinal,
            device,
            context,
        });
        d.bind()?;
        Ok(d)
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes this device's context current on the calling thread (as NCCL, which picks its
    /// device from the current context, needs before a communicator is made).
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained for as long as `self` lives.
        check(
            unsafe { sys::cuCtxSetCurrent(self.context) },
            "cuCtxSetCurrent",
        )
    }

    /// `bytes` of device memory from `cuMemAlloc`, the kind CUDA IPC can export (memory from a
    /// stream-ordered pool cannot be).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        if bytes == 0 {
            return Err(CudaError::Invalid("an empty device allocation".into()));
        }
        self.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is current; `ptr` outlives the call.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) },
            "cuMemAlloc_v2",
        )?;
        Ok(DeviceBuffer {
            device: self.clone(),
            ptr,
            len: bytes,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the reference `open` took, once.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
        if let Err(e) = check(r, "cuDevicePrimaryCtxRelease_v2") {
            tracing::warn!(device = self.ordinal, "{e}");
        }
    }
}

/// Memory allocated with `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    device: Arc<Device>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer.
    pub fn range(&self) -> DeviceRange<'_> {
        DeviceRange {
            device: self.device.ordinal,
            ptr: self.ptr,
            len: self.len,
            _memory: PhantomData,
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc in this context and is freed once. Work
        // still queued on it is the device's concern, not the host's memory.
        let r = self
            .device
            .bind()
            .and_then(|()| check(unsafe { sys::cuMemFree_v2(self.ptr) }, "cuMemFree_v2"));
        if let Err(e) = r {
            tracing::warn!(device = self.device.ordinal, "freeing device memory: {e}");
        }
    }
}

/// `len` bytes of device memory at `ptr` on device `device`, borrowed from what owns them (a
/// [`DeviceBuffer`], an [`IpcMapping`](super::IpcMapping)).
#[derive(Clone, Copy, Debug)]
pub struct DeviceRange<'a> {
    device: i32,
    ptr: sys::CUdeviceptr,
    len: usize,
    _memory: PhantomData<&'a ()>,
}

impl<'a> DeviceRange<'a> {
    /// A range of device memory that something else owns (a tensor's storage).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be device memory on `device` (not host memory reachable through
    /// unified addressing: the driver would write it) that stays allocated for `'a` and for as
    /// long as work queued on it runs.
    pub unsafe fn from_raw(device: i32, ptr: u64, len: usize) -> DeviceRange<'a> {
        DeviceRange {
            device,
            ptr,
            len,
            _memory: PhantomData,
        }
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `at` within this range.
    pub fn slice(&self, at: usize, len: usize) -> Result<DeviceRange<'a>, CudaError> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(CudaError::Invalid(format!(
                "{len} bytes at {at} are outside a range of {}",
                self.len
            )));
        }
        Ok(DeviceRange {
            ptr: self.ptr + at as u64,
            len,
            ..*self
        })
    }
}

/// A non-blocking stream on one device, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    device: Arc<Device>,
    raw: sys::CUstream,
}

// SAFETY: a stream may be used from any thread (the driver API is thread-safe); the handle is
// only passed to the driver.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(device: &Arc<Device>) -> Result<Stream, CudaError> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; `raw` outlives the call.
        check(
            unsafe { sys::cuStreamCreate(&mut raw, flags) },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            device: device.clone(),
            raw,
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The raw handle, for libraries that enqueue work on it (NCCL).
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Copies `src` into `dst` on the device and waits for it.
    pub fn upload(&self, dst: DeviceRange<'_>, src: &[u8]) -> Result<(), CudaError> {
        same_len(dst.len, src.len())?;
        self.device.bind()?;
        // SAFETY: `dst` is device memory of `src.len()` bytes (its constructors promise it);
        // `src` is borrowed until the stream is synchronised below, so the driver never reads
        // it after this call returns.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst.ptr, src.as_ptr().cast(), src.len(), self.raw) },
            "cuMemcpyHtoDAsync_v2",
        )?;
        self.synchronize()
    }

    /// Copies `src` from the device into `dst` and waits for it.
    pub fn download(&self, src: DeviceRange<'_>, dst: &mut [u8]) -> Result<(), CudaError> {
        same_len(src.len, dst.len())?;
        self.device.bind()?;
        // SAFETY: `src` is device memory of `dst.len()` bytes; `dst` is borrowed mutably until
        // the stream is synchronised below, so the driver writes it only during this call and
        // only within its length.
        check(
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src.ptr, dst.len(), self.raw)
            },
            "cuMemcpyDtoHAsync_v2",
        )?;
        self.synchronize()
    }

    /// Enqueues a device-to-device copy (either may be another device's or a peer's mapping).
    pub fn copy(&self, dst: DeviceRange<'_>, src: DeviceRange<'_>) -> Result<(), CudaError> {
        same_len(dst.len, src.len)?;
        self.device.bind()?;
        // SAFETY: both ranges are device memory of this length (their constructors promise
        // it); the host's memory is not touched.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, src.len, self.raw) },
            "cuMemcpyDtoDAsync_v2",
        )
    }

    /// Enqueues setting every byte of `dst` to `byte`.
    pub fn fill(&self, dst: DeviceRange<'_>, byte: u8) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: `dst` is device memory of this length.
        check(
            unsafe { sys::cuMemsetD8Async(dst.ptr, byte, dst.len, self.raw) },
            "cuMemsetD8Async",
        )
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream lives as long as `self`.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }

    /// Marks `e` at this point of the work enqueued on this stream.
    pub fn record(&self, e: &Event) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both handles live as long as their owners, borrowed here.
        check(
            unsafe { sys::cuEventRecord(e.raw, self.raw) },
            "cuEventRecord",
        )
    }

    /// Makes the work enqueued on this stream from now on wait until the work before `e`'s
    /// latest mark (on whichever stream) is done; the host does not wait.
    pub fn wait_for(&self, e: &Event) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both handles live as long as their owners, borrowed here.
        check(
            unsafe { sys::cuStreamWaitEvent(self.raw, e.raw, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Whether everything enqueued so far is done, without waiting.
    pub fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: the stream lives as long as `self`.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuStreamQuery").map(|()| true),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream was made by cuStreamCreate and is destroyed once; the driver lets
        // work still queued on it finish.
        let r = self.device.bind().and_then(|()| {
            check(
                unsafe { sys::cuStreamDestroy_v2(self.raw) },
                "cuStreamDestroy_v2",
            )
        });
        if let Err(e) = r {
            tracing::warn!(device = self.device.ordinal, "destroying a stream: {e}");
        }
    }
}

/// A mark in a stream's work that another stream can wait for ([`Stream::record`],
/// [`Stream::wait_for`]): how two streams hand a buffer to each other without the host waiting.
pub struct Event {
    device: Arc<Device>,
    raw: sys::CUevent,
}

// SAFETY: an event may be used from any thread (the driver API is thread-safe); the handle is
// only passed to the driver.
unsafe impl Send for Event {}

impl Event {
    pub fn new(device: &Arc<Device>) -> Result<Event, CudaError> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current; `raw` outlives the call.
        check(
            unsafe { sys::cuEventCreate(&mut raw, flags) },
            "cuEventCreate",
        )?;
        Ok(Event {
            device: device.clone(),
            raw,
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: made by cuEventCreate and destroyed once; the driver keeps what still waits
        // on it valid.
        let r = self.device.bind().and_then(|()| {
            check(
                unsafe { sys::cuEventDestroy_v2(self.raw) },
                "cuEventDestroy_v2",
            )
        });
        if let Err(e) = r {
            tracing::warn!(device = self.device.ordinal, "destroying an event: {e}");
        }
    }
}

fn same_len(a: usize, b: usize) -> Result<(), CudaError> {
    if a != b {
        return Err(CudaError::Invalid(format!(
            "a copy between {a} and {b} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_a_device_is_an_error_not_a_panic() {
        if crate::gpu::cuda::probe().cuda.is_ok() {
            return;
        }
        let e = Device::open(0).unwrap_err();
        assert!(matches!(e, CudaError::Unavailable(_)), "{e}");
    }

    #[test]
    fn slices_stay_inside_their_range() {
        // SAFETY: never handed to the driver.
        let r = unsafe { DeviceRange::from_raw(0, 0x1000, 100) };
        let s = r.slice(10, 90).unwrap();
        assert_eq!((s.ptr(), s.len(), s.device()), (0x1000 + 10, 90, 0));
        assert_eq!(s.slice(0, 90).unwrap().len(), 90);
        assert!(r.slice(10, 91).is_err());
        assert!(r.slice(usize::MAX, 2).is_err());
    }
}
