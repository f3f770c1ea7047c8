//! The bytes of a file staged for writing: in memory while the file is small (a file of at
//! most [`MEMORY_MAX`] is published inline, so its bytes never need a file of their own) and
//! the mount's memory budget has room, else in a file of the staging directory.
//!
//! Creating a file costs more than anything else a small file's write does on the local disk
//! (about 150-200 µs each on an ext4 of the machines measured, against a few µs for its write);
//! a `cp -r` of small files through the mount paid it once for the copy and once for the
//! staging file. A body moves to a file ("spills") when it grows past [`MEMORY_MAX`], when the
//! budget runs out, or when it must be served in place.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::rpc::MAX_INLINE_FILE;

/// The largest body kept in memory: what a publish sends inline.
pub const MEMORY_MAX: u64 = MAX_INLINE_FILE as u64;
/// Bytes of staged bodies one mount keeps in memory at most (the write-back queue holds up to
/// 16,384 closed files, which would otherwise all be in memory).
pub const MEMORY_BUDGET: usize = 64 << 20;

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// The bytes that a mount's bodies hold in memory, against a limit.
#[derive(Debug)]
pub struct MemoryBudget {
    used: AtomicUsize,
    limit: usize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(MemoryBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    /// Takes `n` bytes if they fit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    /// Takes `n` bytes whether they fit or not (bytes already in memory, e.g. replayed).
    fn force(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Bytes in memory, counted in their budget while they live.
#[derive(Debug)]
pub struct MemBytes {
    data: Vec<u8>,
    budget: Arc<MemoryBudget>,
    /// What the write-back journal files them under, as a staging file's name would be.
    name: String,
}

impl MemBytes {
    /// Grows to `len` (zeros) if the budget allows.
    fn grow(&mut self, len: usize) -> bool {
        let more = len.saturating_sub(self.data.len());
        if more > 0 {
            if !self.budget.take(more) {
                return false;
            }
            self.data.resize(len, 0);
        }
        true
    }

    fn shrink(&mut self, len: usize) {
        if len < self.data.len() {
            self.budget.give(self.data.len() - len);
            self.data.truncate(len);
        }
    }
}

impl Drop for MemBytes {
    fn drop(&mut self) {
        self.budget.give(self.data.len());
    }
}

/// A body in a file of the staging directory.
#[derive(Debug)]
pub struct DiskBytes {
    pub file: File,
    pub disk: PathBuf,
    /// Published in place: its bytes are being served and must not change.
    pub in_place: bool,
}

#[derive(Debug)]
pub enum Body {
    Memory(MemBytes),
    Disk(DiskBytes),
}

impl Body {
    /// An empty body: in memory if the budget is not spent.
    pub fn new(staging: &Path, budget: &Arc<MemoryBudget>) -> io::Result<Body> {
        if budget.used() < budget.limit {
            return Ok(Body::Memory(MemBytes {
                data: Vec::new(),
                budget: budget.clone(),
                name: staging_name(),
            }));
        }
        new_disk(staging).map(Body::Disk)
    }

    /// A body of `data` in memory (a journaled file's bytes, filed under `name`), counted
    /// whatever the budget says.
    pub fn of_bytes(data: Vec<u8>, name: String, budget: &Arc<MemoryBudget>) -> Body {
        budget.force(data.len());
        Body::Memory(MemBytes {
            data,
            budget: budget.clone(),
            name,
        })
    }

    /// A body in an existing staging file.
    pub fn of_file(file: File, disk: PathBuf) -> Body {
        Body::Disk(DiskBytes {
            file,
            disk,
            in_place: false,
        })
    }

    pub fn size(&self) -> io::Result<u64> {
        match self {
            Body::Memory(m) => Ok(m.data.len() as u64),
            Body::Disk(d) => Ok(d.file.metadata()?.len()),
        }
    }

    /// Its name in the staging directory: its file's, or the one it would have.
    pub fn name(&self) -> String {
        match self {
            Body::Memory(m) => m.name.clone(),
            Body::Disk(d) => d
                .disk
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// The bytes, when in memory.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Body::Memory(m) => Some(&m.data),
            Body::Disk(_) => None,
        }
    }

    /// The file, when on disk.
    pub fn disk(&self) -> Option<&DiskBytes> {
        match self {
            Body::Memory(_) => None,
            Body::Disk(d) => Some(d),
        }
    }

    /// Up to `size` bytes at `offset` (fewer at the end).
    pub fn read_at(&self, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        match self {
            Body::Memory(m) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(m.data.len());
                let end = start.saturating_add(size as usize).min(m.data.len());
                Ok(m.data[start..end].to_vec())
            }
            Body::Disk(d) => {
                let mut buf = vec![0u8; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    let k = d.file.read_at(&mut buf[n..], offset + n as u64)?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                buf.truncate(n);
                Ok(buf)
            }
        }
    }

    pub fn write_at(&mut self, offset: u64, data: &[u8], staging: &Path) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        if let Body::Memory(m) = self {
            if end <= MEMORY_MAX && m.grow((end as usize).max(m.data.len())) {
                m.data[offset as usize..end as usize].copy_from_slice(data);
                return Ok(());
            }
        }
        let d = self.on_disk(staging)?;
        crate::blocks::pieces::write_all_at(&d.file, data, offset)
    }

    pub fn set_len(&mut self, len: u64, staging: &Path) -> io::Result<()> {
        if let Body::Memory(m) = self {
            if len <= MEMORY_MAX && m.grow(len as usize) {
                m.shrink(len as usize);
                return Ok(());
            }
        }
        self.on_disk(staging)?.file.set_len(len)
    }

    /// The body in a file (moved there if it was in memory), writable (copied first if it was
    /// published in place).
    pub fn on_disk(&mut self, staging: &Path) -> io::Result<&mut DiskBytes> {
        let fresh = match self {
            Body::Memory(m) => {
                let d = new_disk(staging)?;
                if let Err(e) = crate::blocks::pieces::write_all_at(&d.file, &m.data, 0) {
                    let _ = std::fs::remove_file(&d.disk);
                    return Err(e);
                }
                Some(d)
            }
            Body::Disk(d) if d.in_place => {
                let mut copy = new_disk(staging)?;
                let mut src = File::open(&d.disk)?;
                if let Err(e) = io::copy(&mut src, &mut copy.file) {
                    let _ = std::fs::remove_file(&copy.disk);
                    return Err(e);
                }
                Some(copy)
            }
            Body::Disk(_) => None,
        };
        if let Some(d) = fresh {
            *self = Body::Disk(d);
        }
        match self {
            Body::Disk(d) => Ok(d),
            Body::Memory(_) => unreachable!("a body was just moved to disk"),
        }
    }

    /// Removes the staging file, unless it is served in place (then it stays).
    pub fn remove(&self) {
        if let Body::Disk(d) = self {
            if !d.in_place {
                let _ = std::fs::remove_file(&d.disk);
            }
        }
    }
}

/// A name no other staged body of this node has: process, clock and a count.
fn staging_name() -> String {
    let n = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{t}-{n}", std::process::id())
}

fn new_disk(staging: &Path) -> io::Result<DiskBytes> {
    let disk = staging.join(staging_name());
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&disk)?;
    Ok(DiskBytes {
        file,
        disk,
        in_place: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_body_stays_in_memory_and_spills_when_it_grows_or_the_budget_is_spent() {
        let t = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(10_000);
        let mut a = Body::new(t.path(), &budget).unwrap();
        a.write_at(0, &[1; 3000], t.path()).unwrap();
        a.write_at(5000, &[2; 10], t.path()).unwrap();
        assert!(a.bytes().is_some());
        assert_eq!(a.size().unwrap(), 5010);
        assert_eq!(budget.used(), 5010);
        assert_eq!(a.read_at(2998, 4).unwrap(), [1, 1, 0, 0]);
        assert_eq!(a.read_at(5008, 100).unwrap(), [2, 2]);
        assert!(a.read_at(u64::MAX, 10).unwrap().is_empty());
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);

        // A second body does not fit beside the first: it spills, with what it held.
        let mut b = Body::new(t.path(), &budget).unwrap();
        b.write_at(0, &[3; 4000], t.path()).unwrap();
        b.write_at(4000, &[4; 2000], t.path()).unwrap();
        let d = b.disk().expect("spilled to a file");
        assert_eq!(std::fs::read(&d.disk).unwrap().len(), 6000);
        assert_eq!(b.read_at(3999, 2).unwrap(), [3, 4]);
        assert_eq!(budget.used(), 5010);

        // Shrinking gives back; past the inline size a body goes to disk.
        a.set_len(10, t.path()).unwrap();
        assert_eq!(budget.used(), 10);
        a.write_at(MEMORY_MAX, b"x", t.path()).unwrap();
        assert!(a.disk().is_some());
        assert_eq!(a.size().unwrap(), MEMORY_MAX + 1);
        assert_eq!(budget.used(), 0);
        a.remove();
        b.remove();
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
        drop((a, b));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_body_served_in_place_is_copied_before_it_changes() {
        let t = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(0);
        let mut a = Body::new(t.path(), &budget).unwrap();
        a.write_at(0, b"hello", t.path()).unwrap();
        let Body::Disk(d) = &mut a else {
            panic!("no budget: on disk")
        };
        d.in_place = true;
        let served = d.disk.clone();
        a.write_at(0, b"J", t.path()).unwrap();
        assert_eq!(std::fs::read(&served).unwrap(), b"hello");
        assert_eq!(a.read_at(0, 5).unwrap(), b"Jello");
        a.remove();
        assert!(served.exists());
    }
}
