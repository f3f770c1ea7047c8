//! A caller's device memory as the worker reaches it: the allocation that holds the tensor,
//! mapped by CUDA IPC, its bytes staged through the host a chunk at a time on a stream of the
//! worker's own, so CUDA buffers ride the host transport between workers (NCCL is the faster
//! path where both ends have it).
//!
//! An allocation is mapped once per worker however many buffers and registrations it holds:
//! torch's caching allocator carves many tensors out of one `cudaMalloc`, and a state dict's
//! entries then share one IPC handle, which the driver maps once per process.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use crate::gpu::cuda::{CudaError, Device, DeviceRange, IpcMapping, Stream};
use crate::locks::lock;

use super::error::WorkerError;

type Key = (i32, [u8; 64]);

/// The allocations mapped in this process, by device and handle, while a buffer holds them.
static MAPPED: LazyLock<Mutex<HashMap<Key, Weak<IpcMapping>>>> = LazyLock::new(Mutex::default);

/// `nbytes` at `offset` of a caller's allocation on `device`.
pub struct CudaBuffer {
    mapping: Arc<IpcMapping>,
    offset: u64,
    nbytes: u64,
    /// Copies on one buffer are serialised: the stream is not shared between threads.
    stream: Mutex<Stream>,
}

impl CudaBuffer {
    pub fn open(
        device: i32,
        handle: &[u8; 64],
        offset: u64,
        nbytes: u64,
    ) -> Result<CudaBuffer, WorkerError> {
        let mapping = map(device, handle)?;
        let size = mapping.allocation_size() as u64;
        if offset.checked_add(nbytes).is_none_or(|end| end > size) {
            return Err(WorkerError::Bad(format!(
                "the caller's allocation holds {size} bytes, the buffer wants {nbytes} at {offset}"
            )));
        }
        let stream = Stream::new(mapping.device())?;
        Ok(CudaBuffer {
            mapping,
            offset,
            nbytes,
            stream: Mutex::new(stream),
        })
    }

    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// `len` bytes at `at` within the buffer.
    pub fn read(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        let range = self.range(at, len)?;
        lock(&self.stream)
            .download(range, &mut out)
            .map_err(to_io)?;
        Ok(out)
    }

    pub fn write(&self, at: u64, data: &[u8]) -> io::Result<()> {
        let range = self.range(at, data.len())?;
        lock(&self.stream).upload(range, data).map_err(to_io)
    }

    /// The device the buffer is on (as this worker numbers it).
    pub fn device(&self) -> &Arc<Device> {
        self.mapping.device()
    }

    /// The whole buffer, for the device's own copies and NCCL.
    pub fn whole(&self) -> Result<DeviceRange<'_>, CudaError> {
        let start = usize::try_from(self.offset)
            .map_err(|_| CudaError::Invalid("an offset past the address space".into()))?;
        let len = usize::try_from(self.nbytes)
            .map_err(|_| CudaError::Invalid("a length past the address space".into()))?;
        self.mapping.allocation().slice(start, len)
    }

    fn range(&self, at: u64, len: usize) -> io::Result<DeviceRange<'_>> {
        if at
            .checked_add(len as u64)
            .is_none_or(|end| end > self.nbytes)
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let start = usize::try_from(self.offset + at).map_err(|_| io::Error::other("offset"))?;
        self.mapping.allocation().slice(start, len).map_err(to_io)
    }
}

/// The mapping of `handle` on `device`: the one this process holds already, or a new one.
fn map(device: i32, handle: &[u8; 64]) -> Result<Arc<IpcMapping>, WorkerError> {
    let mut mapped = lock(&MAPPED);
    mapped.retain(|_, m| m.strong_count() > 0);
    let key = (device, *handle);
    if let Some(m) = mapped.get(&key).and_then(Weak::upgrade) {
        return Ok(m);
    }
    let dev = Device::open(device)?;
    let m = Arc::new(IpcMapping::open(&dev, handle, 0, 0)?);
    mapped.insert(key, Arc::downgrade(&m));
    Ok(m)
}

fn to_io(e: CudaError) -> io::Error {
    io::Error::other(e.to_string())
}
