//! The buffers of a registration, as the worker reaches them: host memory is a file in the
//! caller's `/dev/shm` (the worker shares the caller's IPC and mount namespaces), read and
//! written with pread/pwrite at the buffer's offset. CUDA buffers (IPC handles) are the
//! caller's device memory, mapped ([`CudaBuffer`]); a worker with no GPU refuses them clearly.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::cuda_buffer::CudaBuffer;
use super::error::WorkerError;
use super::host::frames::CHUNK;
use crate::auth::gpu_secret::Secret;
use crate::gpu::abi::{self, BUF_CUDA_IPC, BUF_HOST_SHM};
use crate::gpu::cuda::{Device, DeviceRange};
use crate::locks::lock;
use crate::proto::WorkerBuffer;

/// Where host buffers live: the caller's shared memory.
pub const SHM_DIR: &str = "/dev/shm";

/// One buffer, open.
enum Buffer {
    Shm(ShmBuffer),
    Cuda(CudaBuffer),
}

impl Buffer {
    fn open(dir: &Path, b: &WorkerBuffer) -> Result<Buffer, WorkerError> {
        match b.kind {
            BUF_HOST_SHM => ShmBuffer::open(dir, b).map(Buffer::Shm),
            BUF_CUDA_IPC => {
                let handle: &[u8; 64] = b.handle.as_slice().try_into().map_err(|_| {
                    WorkerError::Bad(format!("an IPC handle is 64 bytes, not {}", b.handle.len()))
                })?;
                CudaBuffer::open(b.device, handle, b.offset, b.nbytes).map(Buffer::Cuda)
            }
            k => Err(WorkerError::Bad(format!("unknown buffer kind {k}"))),
        }
    }

    fn nbytes(&self) -> u64 {
        match self {
            Buffer::Shm(b) => b.nbytes,
            Buffer::Cuda(b) => b.nbytes(),
        }
    }

    fn read(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        match self {
            Buffer::Shm(b) => b.read(at, len),
            Buffer::Cuda(b) => b.read(at, len),
        }
    }

    fn write(&self, at: u64, data: &[u8]) -> io::Result<()> {
        match self {
            Buffer::Shm(b) => b.write(at, data),
            Buffer::Cuda(b) => b.write(at, data),
        }
    }
}

/// A host buffer: a file in the caller's `/dev/shm`, at an offset.
struct ShmBuffer {
    file: File,
    offset: u64,
    nbytes: u64,
}

impl ShmBuffer {
    fn open(dir: &Path, b: &WorkerBuffer) -> Result<ShmBuffer, WorkerError> {
        let name =
            abi::text(&b.handle, "a shm name").map_err(|e| WorkerError::Bad(e.to_string()))?;
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(WorkerError::Bad(format!(
                "{name:?} is not the name of a file in {}",
                dir.display()
            )));
        }
        let path: PathBuf = dir.join(name);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| WorkerError::Buffer {
                path: path.display().to_string(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| WorkerError::Buffer {
                path: path.display().to_string(),
                source,
            })?
            .len();
        if b.offset.checked_add(b.nbytes).is_none_or(|end| end > len) {
            return Err(WorkerError::Bad(format!(
                "{} holds {len} bytes, the buffer wants {} at {}",
                path.display(),
                b.nbytes,
                b.offset
            )));
        }
        Ok(ShmBuffer {
            file,
            offset: b.offset,
            nbytes: b.nbytes,
        })
    }

    /// `len` bytes at `at` within the buffer.
    fn read(&self, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.file.read_exact_at(&mut out, self.offset + at)?;
        Ok(out)
    }

    fn write(&self, at: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, self.offset + at)
    }
}

/// A registration's buffers, in table order, seen as one run of bytes (each entry's after the
/// one before: the same run on every participant, since their tables match), with how much of
/// that run is filled: a receiving registration serves its bytes onwards as they arrive, which
/// is what pipelines a chain or tree of workers.
pub struct Buffers {
    /// `(entry, where it starts in the run, buffer)`, by entry.
    entries: Vec<(u32, u64, Buffer)>,
    total: u64,
    filled: AtomicU64,
    failure: Mutex<Option<(i32, String)>>,
    changed: Notify,
    /// What a worker must prove it holds to be served these bytes, which travel sealed under
    /// it (`host`); none where the cluster issues no secrets.
    secret: Option<Secret>,
}

impl Buffers {
    /// Opens `buffers`; `receiving`: they are to be filled, so nothing of them is there yet.
    pub fn open(
        dir: &Path,
        buffers: &[WorkerBuffer],
        receiving: bool,
    ) -> Result<Buffers, WorkerError> {
        let mut by_entry = BTreeMap::new();
        for b in buffers {
            if by_entry.insert(b.entry, Buffer::open(dir, b)?).is_some() {
                return Err(WorkerError::Bad(format!(
                    "entry {} has two buffers",
                    b.entry
                )));
            }
        }
        let mut total = 0u64;
        let mut entries = Vec::with_capacity(by_entry.len());
        for (entry, b) in by_entry {
            let start = total;
            total = total
                .checked_add(b.nbytes())
                .ok_or_else(|| WorkerError::Bad("buffers larger than 2^64 bytes".into()))?;
            entries.push((entry, start, b));
        }
        Ok(Buffers {
            entries,
            total,
            filled: AtomicU64::new(if receiving { 0 } else { total }),
            failure: Mutex::new(None),
            changed: Notify::new(),
            secret: None,
        })
    }

    /// These buffers, served only to workers that hold `secret` (see [`Buffers::secret`]).
    pub fn sealed_by(mut self, secret: Option<Secret>) -> Self {
        self.secret = secret;
        self
    }

    pub fn secret(&self) -> Option<&Secret> {
        self.secret.as_ref()
    }

    pub fn nbytes(&self) -> u64 {
        self.total
    }

    /// Every entry's device memory, in table order, with their one device: `None` unless every
    /// buffer is a CUDA buffer and all are on one device (what an NCCL broadcast needs).
    pub fn device_ranges(&self) -> Option<(Arc<Device>, Vec<DeviceRange<'_>>)> {
        let mut device: Option<&Arc<Device>> = None;
        let mut ranges = Vec::with_capacity(self.entries.len());
        for (_, _, b) in &self.entries {
            let Buffer::Cuda(c) = b else { return None };
            if device.is_some_and(|d| d.ordinal() != c.device().ordinal()) {
                return None;
            }
            device = Some(c.device());
            ranges.push(c.whole().ok()?);
        }
        Some((device?.clone(), ranges))
    }

    /// The requests that move the run, in order: `pack` cuts the run into chunks that may span
    /// entries (many small tensors in one request), otherwise each entry is cut on its own.
    pub fn chunks(&self, pack: bool) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let mut cut = |mut at: u64, end: u64| {
            while at < end {
                let len = CHUNK.min(end - at);
                out.push((at, len as u32));
                at += len;
            }
        };
        if pack {
            cut(0, self.total);
        } else {
            for (_, start, b) in &self.entries {
                cut(*start, start + b.nbytes());
            }
        }
        out
    }

    /// The pieces of `[at, at + len)` of the run: `(buffer, offset within it, length)`.
    fn pieces(&self, at: u64, len: u64) -> io::Result<Vec<(&Buffer, u64, usize)>> {
        let end = at
            .checked_add(len)
            .filter(|&e| e <= self.total)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let first = self.entries.partition_point(|(_, start, _)| *start <= at);
        let mut out = Vec::new();
        let mut pos = at;
        for (_, start, b) in self.entries[first.saturating_sub(1)..].iter() {
            if pos >= end {
                break;
            }
            let (s, e) = (*start, start + b.nbytes());
            if e <= pos {
                continue;
            }
            let take = e.min(end) - pos;
            out.push((b, pos - s, take as usize));
            pos += take;
        }
        Ok(out)
    }

    /// `len` bytes at `at` of the run.
    pub fn read(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        // Room for a sealed answer's tag (`host`), so that sealing does not copy it again.
        let mut out = Vec::with_capacity(len + crate::auth::sealed::TAG);
        for (b, off, n) in self.pieces(at, len as u64)? {
            out.extend_from_slice(&b.read(off, n)?);
        }
        Ok(out)
    }

    /// Writes `data` at `at` of the run.
    pub fn write(&self, at: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0;
        for (b, off, n) in self.pieces(at, data.len() as u64)? {
            b.write(off, &data[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// How much of the run is filled.
    pub fn filled_up_to(&self) -> u64 {
        self.filled.load(Ordering::SeqCst)
    }

    /// The run is filled up to `end`: whoever waits for those bytes gets them.
    pub fn filled(&self, end: u64) {
        self.filled.fetch_max(end, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// These buffers will not be filled: whoever waits for their bytes fails with `why`.
    pub fn fail(&self, errno: i32, why: String) {
        lock(&self.failure).get_or_insert((errno, why));
        self.changed.notify_waiters();
    }

    /// Waits until the run is filled up to `end`, or fails as the filling did.
    pub async fn wait_filled(&self, end: u64) -> Result<(), (i32, String)> {
        loop {
            // Created before the look: a notification between the look and the wait counts.
            let changed = self.changed.notified();
            if self.filled.load(Ordering::SeqCst) >= end {
                return Ok(());
            }
            if let Some(f) = lock(&self.failure).clone() {
                return Err(f);
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers of `sizes` bytes, out of table order in one file of `dir`, each at an offset.
    fn open(dir: &Path, sizes: &[u64], receiving: bool) -> Buffers {
        let total: u64 = sizes.iter().sum::<u64>() + 7 * sizes.len() as u64;
        std::fs::write(dir.join("run"), vec![0u8; total as usize]).unwrap();
        let mut handle = vec![0u8; 64];
        handle[..3].copy_from_slice(b"run");
        let mut at = 0;
        let mut bufs: Vec<WorkerBuffer> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                at += 7;
                let b = WorkerBuffer {
                    kind: BUF_HOST_SHM,
                    entry: i as u32,
                    offset: at,
                    nbytes: n,
                    handle: handle.clone(),
                    ..Default::default()
                };
                at += n;
                b
            })
            .collect();
        bufs.reverse();
        Buffers::open(dir, &bufs, receiving).unwrap()
    }

    #[test]
    fn the_run_spans_entries_in_table_order_whatever_the_order_given() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), &[5, 0, 3, 10], true);
        assert_eq!(b.nbytes(), 18);
        let data: Vec<u8> = (1..=18).collect();
        // Written in pieces that straddle entries (and the empty one).
        b.write(0, &data[..4]).unwrap();
        b.write(4, &data[4..9]).unwrap();
        b.write(9, &data[9..]).unwrap();
        assert_eq!(b.read(0, 18).unwrap(), data);
        assert_eq!(b.read(3, 4).unwrap(), [4, 5, 6, 7]);
        // Each entry's bytes are where its buffer is, and the gaps between them untouched.
        let file = std::fs::read(dir.path().join("run")).unwrap();
        assert_eq!(&file[7..12], &data[..5]);
        assert_eq!(&file[12..26], &[0u8; 14][..]);
        assert_eq!(&file[26..29], &data[5..8]);
        assert_eq!(&file[36..46], &data[8..]);
        // Past the run is refused, not wrapped or clipped.
        assert!(b.read(10, 9).is_err());
        assert!(b.write(u64::MAX, b"x").is_err());
    }

    #[test]
    fn packed_chunks_cross_entries_and_unpacked_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), &[3, CHUNK + 1, 2], false);
        let total = CHUNK + 6;
        assert_eq!(
            b.chunks(true),
            [(0, CHUNK as u32), (CHUNK, 6)],
            "packed: the run cut evenly"
        );
        assert_eq!(
            b.chunks(false),
            [(0, 3), (3, CHUNK as u32), (CHUNK + 3, 1), (CHUNK + 4, 2)],
            "unpacked: each entry on its own"
        );
        assert_eq!(
            b.chunks(false).iter().map(|c| c.1 as u64).sum::<u64>(),
            total
        );
    }

    #[tokio::test]
    async fn a_wait_ends_when_the_bytes_are_there_or_the_filling_failed() {
        let dir = tempfile::tempdir().unwrap();
        let b = std::sync::Arc::new(open(dir.path(), &[4, 4], true));
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_filled(6).await }
        });
        b.filled(4);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        b.filled(6);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        // A publisher's buffers are filled from the start.
        let dir2 = tempfile::tempdir().unwrap();
        assert_eq!(open(dir2.path(), &[4], false).wait_filled(4).await, Ok(()));
        b.fail(libc::ECONNABORTED, "closed".into());
        assert_eq!(
            b.wait_filled(8).await,
            Err((libc::ECONNABORTED, "closed".to_string()))
        );
    }
}
