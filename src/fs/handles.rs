//! The mount's open files: what each handle the kernel holds stands for.
//!
//! Handles are even for reading and odd for writing, so that a handle this process did not
//! make (one the kernel kept across an agent restart) still tells what it was; numbers drawn
//! from the clock at start (one per nanosecond at most) never meet an earlier agent's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::attr::DirEntry;
use super::error::{FsError, FsResult};
use super::read::file::ReadFile;
use super::write::staged::Staged;
use crate::gpu::control::ControlFile;
use crate::locks::lock;

/// An open file.
pub enum Handle {
    Read(Arc<ReadFile>),
    Write(Arc<Staged>),
    Dir(Arc<Vec<DirEntry>>),
    /// A GPU control file, `/.gpu/<key>`.
    Gpu(Arc<ControlFile>),
}

impl Handle {
    pub(crate) fn share(&self) -> Handle {
        match self {
            Handle::Read(r) => Handle::Read(r.clone()),
            Handle::Write(w) => Handle::Write(w.clone()),
            Handle::Dir(d) => Handle::Dir(d.clone()),
            Handle::Gpu(g) => Handle::Gpu(g.clone()),
        }
    }

    pub(crate) fn is_write(&self) -> bool {
        matches!(self, Handle::Write(_))
    }
}

/// The open files of a mount, by handle.
pub struct Handles {
    open: Mutex<HashMap<u64, Handle>>,
    next: AtomicU64,
}

impl Default for Handles {
    fn default() -> Self {
        let first = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(2, |d| d.as_nanos() as u64 & !1 & (u64::MAX >> 2));
        Handles {
            open: Mutex::default(),
            next: AtomicU64::new(first),
        }
    }
}

impl Handles {
    /// A new handle for `h`.
    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(2, Ordering::Relaxed) | u64::from(h.is_write());
        lock(&self.open).insert(fh, h);
        fh
    }

    /// `h` under a handle an earlier agent made (see `crate::keeper`).
    pub fn put(&self, fh: u64, h: Handle) {
        lock(&self.open).insert(fh, h);
    }

    /// What `fh` stands for. An odd handle no one here made was a writer's in an agent that
    /// died: its bytes are lost.
    pub fn get(&self, fh: u64) -> FsResult<Handle> {
        match lock(&self.open).get(&fh) {
            Some(h) => Ok(h.share()),
            None if Self::flushes(fh) => Err(FsError::LostWriter),
            None => Err(FsError::BadHandle),
        }
    }

    pub fn remove(&self, fh: u64) -> Option<Handle> {
        lock(&self.open).remove(&fh)
    }

    /// Whether a close of handle `fh` must reach the core (FLUSH): a writer's close publishes,
    /// a reader's does nothing, so the kernel can be told to skip it (one request less per
    /// file read).
    pub fn flushes(fh: u64) -> bool {
        fh & 1 == 1
    }
}
