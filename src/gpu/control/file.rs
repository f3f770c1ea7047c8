//! An open control file: `/kt/.gpu/<key>` as one open file description holds it (its table,
//! its buffers, its window, its transfers, its registration), with what its write and poll do.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use super::error::GpuError;
use super::transfer::{Transfer, Waker};
use super::workers::Registration;
use crate::gpu::abi::KtGpuBuffer;
use crate::gpu::table::{Table, TableError, MAX_TABLE_BYTES};
use crate::gpu::window::Asked;
use crate::key::KeyPath;
use crate::locks::lock;
use crate::proto::WorkerBuffer;

/// An open control file: `/kt/.gpu/<key>` as one open file description holds it.
pub struct ControlFile {
    pub key: KeyPath,
    pub(super) caller: u32,
    /// A pidfd of the process that opened the file, taken at the open (while that process
    /// waits in the call, so the pid is surely its): the worker acts as that process only
    /// while it lives, not as whatever process has its pid later. `None` where the kernel has
    /// no pidfds (before 5.3).
    pub(super) opener: Option<Arc<Opener>>,
    pub(super) table: Mutex<Vec<u8>>,
    pub(super) buffers: Mutex<Vec<KtGpuBuffer>>,
    pub(super) window: Mutex<Option<Asked>>,
    pub(super) transfers: Mutex<Vec<Arc<Transfer>>>,
    pub(super) next_transfer: AtomicU64,
    pub(super) registration: Arc<Mutex<Option<Registration>>>,
    /// Set by the last close: a commit still running lets go of what it registers.
    pub(super) closed: Arc<AtomicBool>,
    /// What a read returns: the key's description, taken at the first read.
    pub(super) description: Mutex<Option<Vec<u8>>>,
}

impl ControlFile {
    /// A control file `caller` opened at `key`, with nothing written or handed over yet.
    pub(super) fn new(key: KeyPath, caller: u32) -> ControlFile {
        ControlFile {
            key,
            caller,
            opener: Opener::of(caller).map(Arc::new),
            table: Mutex::default(),
            buffers: Mutex::default(),
            window: Mutex::default(),
            transfers: Mutex::default(),
            next_transfer: AtomicU64::new(1),
            registration: Arc::default(),
            closed: Arc::default(),
            description: Mutex::default(),
        }
    }

    /// Bytes the caller writes: its tensor table.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<u32, GpuError> {
        let mut t = lock(&self.table);
        let end = offset as usize + data.len();
        if end > MAX_TABLE_BYTES {
            return Err(TableError::TooLarge.into());
        }
        if t.len() < end {
            t.resize(end, 0);
        }
        t[offset as usize..end].copy_from_slice(data);
        Ok(data.len() as u32)
    }

    /// Whether the latest transfer has finished; if not, `waker` is called when it does.
    pub fn poll(&self, waker: Option<Waker>) -> bool {
        let Some(t) = lock(&self.transfers).last().cloned() else {
            return false;
        };
        if t.finished() {
            return true;
        }
        if let Some(w) = waker {
            lock(&t.wakers).push(w);
            // It may have finished between the look and the push.
            if t.finished() {
                for w in std::mem::take(&mut *lock(&t.wakers)) {
                    w();
                }
            }
        }
        false
    }

    pub(super) fn table(&self) -> Result<Table, GpuError> {
        Ok(Table::parse(&lock(&self.table))?)
    }

    /// The buffers handed over, checked against `table`: each entry once, each its size.
    pub(super) fn checked_buffers(&self, table: &Table) -> Result<Vec<WorkerBuffer>, GpuError> {
        let buffers = lock(&self.buffers).clone();
        let mut seen = vec![false; table.entries.len()];
        let mut out = Vec::with_capacity(buffers.len());
        for b in buffers {
            let i = b.entry as usize;
            let e = table.entries.get(i).ok_or_else(|| {
                GpuError::Buffers(format!(
                    "a buffer names entry {i}; the table has {}",
                    seen.len()
                ))
            })?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(GpuError::Buffers(format!(
                    "entry {:?} has two buffers",
                    e.name
                )));
            }
            if b.nbytes != e.nbytes() {
                return Err(GpuError::Buffers(format!(
                    "entry {:?} is {} bytes, its buffer {}",
                    e.name,
                    e.nbytes(),
                    b.nbytes
                )));
            }
            out.push(WorkerBuffer {
                entry: b.entry,
                kind: b.kind,
                device: b.device,
                offset: b.offset,
                nbytes: b.nbytes,
                handle: b.handle.to_vec(),
            });
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(GpuError::Buffers(format!(
                "entry {:?} has no buffer",
                table.entries[i].name
            )));
        }
        Ok(out)
    }
}

/// The process that opened a control file, by a pidfd.
#[derive(Debug)]
pub struct Opener(std::os::fd::OwnedFd);

impl Opener {
    /// A pidfd of `pid`; `None` where the kernel has none, or `pid` is gone.
    pub fn of(pid: u32) -> Option<Opener> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) with no flags returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: a descriptor just returned to this process and owned from here on.
        Some(Opener(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process still runs (a signal 0 through the pidfd reaches it): its pid then
    /// names it, not a process that took the pid over.
    pub fn alive(&self) -> Result<(), GpuError> {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) with signal 0 only checks; the descriptor is ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        match r {
            0 => Ok(()),
            _ => Err(GpuError::OpenerGone),
        }
    }
}

/// Fails where `opener` is known and gone.
pub(super) fn opener_alive(opener: &Option<Arc<Opener>>) -> Result<(), GpuError> {
    opener.as_ref().map_or(Ok(()), |o| o.alive())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pidfd taken while a process lives says when it is gone, whatever takes its pid next.
    #[test]
    fn an_opener_is_known_gone_once_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let opener = Opener::of(child.id()).expect("pidfds (Linux 5.3 and later)");
        assert!(opener.alive().is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        let err = opener.alive().unwrap_err();
        assert_eq!(err.errno(), libc::ESRCH);
        assert!(err.to_string().contains("opened"), "{err}");
    }
}
