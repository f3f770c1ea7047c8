//! The buffers of a registration, as the worker reaches them: host memory is a file in the
//! caller's `/dev/shm` (the worker shares the caller's IPC and mount namespaces), read and
//! written with pread/pwrite at the buffer's offset. CUDA buffers (IPC handles) need the NCCL
//! transport and a GPU; a worker without them refuses them clearly.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::WorkerError;
use crate::gpu::abi::{self, BUF_CUDA_IPC, BUF_HOST_SHM};
use crate::proto::WorkerBuffer;

/// Where host buffers live: the caller's shared memory.
pub const SHM_DIR: &str = "/dev/shm";

/// One buffer, open.
pub struct Buffer {
    file: File,
    offset: u64,
    pub nbytes: u64,
}

impl Buffer {
    fn open(dir: &Path, b: &WorkerBuffer) -> Result<Buffer, WorkerError> {
        match b.kind {
            BUF_HOST_SHM => {}
            BUF_CUDA_IPC => return Err(WorkerError::NoCuda),
            k => return Err(WorkerError::Bad(format!("unknown buffer kind {k}"))),
        }
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
        Ok(Buffer {
            file,
            offset: b.offset,
            nbytes: b.nbytes,
        })
    }

    /// `len` bytes at `at` within the buffer.
    pub fn read(&self, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.file.read_exact_at(&mut out, self.offset + at)?;
        Ok(out)
    }

    pub fn write(&self, at: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, self.offset + at)
    }
}

/// A registration's buffers, by table entry.
pub struct Buffers {
    pub by_entry: BTreeMap<u32, Buffer>,
}

impl Buffers {
    pub fn open(dir: &Path, buffers: &[WorkerBuffer]) -> Result<Buffers, WorkerError> {
        let mut by_entry = BTreeMap::new();
        for b in buffers {
            if by_entry.insert(b.entry, Buffer::open(dir, b)?).is_some() {
                return Err(WorkerError::Bad(format!(
                    "entry {} has two buffers",
                    b.entry
                )));
            }
        }
        Ok(Buffers { by_entry })
    }

    pub fn nbytes(&self) -> u64 {
        self.by_entry.values().map(|b| b.nbytes).sum()
    }
}
