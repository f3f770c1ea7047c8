//! Mount sessions: mounting the filesystem core, taking a kept mount over from an agent that
//! died ([`resume`]), and unmounting. With [`fuse`](super::fuse), the only file that names fuser.
//!
//! The agent (peer server, unix socket, heartbeat, block cache) runs on the tokio runtime; the
//! FUSE session runs on its own threads and calls into the filesystem core, which uses the same
//! runtime for its RPCs and transfers. A mount ends when it is told to (it unmounts, or hands
//! the mount over to the next agent) or when someone unmounts it; either way, files still open
//! for writing are published first.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};

use super::config::FsConfig;
use super::error::FsError;
use super::filesystem::FsCore;
use super::fuse::FuseAdapter;
use super::names::inode::{Inodes, Journal};
use crate::blocks::node::NodeBlocks;
use crate::keeper::KeeperClient;
use crate::locks::lock;
use crate::proto::{FuseInit, KeptMount, MountRequest};

/// FUSE worker threads: reads of different files, or of different blocks, proceed in parallel.
const FUSE_THREADS: usize = 8;
/// Kernel readahead for the mount, in KiB: large sequential reads become 1 MiB requests, several
/// in flight.
const READ_AHEAD_KB: u32 = 4096;
/// How long a signalled mount waits for its FUSE session to end after unmounting.
const UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Mounted {
    unmounter: Unmounter,
    done: tokio::sync::oneshot::Receiver<()>,
    core: Arc<FsCore>,
    pub mountpoint: PathBuf,
    /// The keeper that holds this mount's device, told when the mount ends on purpose.
    keeper: Option<KeeperClient>,
}

enum Unmounter {
    /// The session mounted it.
    Session(fuser::SessionUnmounter),
    /// The session took over a kept device: unmount(2) by path.
    Path,
}

/// How a mount's service ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Publish what is open for writing and unmount.
    Unmount,
    /// Publish what is open for writing and leave the mount to the keeper and the next agent.
    Handover,
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("the keeper's record of {0} lacks the kernel's FUSE_INIT")]
    NoInit(String),
    #[error("taking over the FUSE device of {path}: {source}")]
    Resume {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("mounting {path}: {source}")]
    Mount {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the FUSE session: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Core(#[from] FsError),
}

fn mount_err(path: &Path) -> impl FnOnce(std::io::Error) -> MountError + '_ {
    move |source| MountError::Mount {
        path: path.display().to_string(),
        source,
    }
}

fn session_config(cfg: &FsConfig, clone_fd: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ktfs:{}", cfg.namespace)),
        MountOption::Subtype("kt".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if cfg.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config.acl = SessionACL::All;
    config.n_threads = Some(FUSE_THREADS);
    // Cloned descriptors are per-thread devices; the kernel fails the requests a closing one
    // holds. A kept mount's threads share the one device the keeper holds, so the requests of
    // a dead agent stay queued for the next.
    config.clone_fd = clone_fd;
    config
}

/// Mounts the filesystem over an agent's `blocks` at `mountpoint`, ready when this returns.
/// Runs inside the agent's tokio runtime (a blocking thread of it will do).
pub fn mount(
    blocks: Arc<NodeBlocks>,
    cfg: FsConfig,
    mountpoint: &Path,
) -> Result<Mounted, MountError> {
    mount_fresh(blocks, cfg, mountpoint, None)
}

/// Like [`mount`], and hands the mount's device to `keeper` (see `crate::keeper`), with what
/// it takes to serve the mount again after this agent dies: `req` and the kernel's FUSE_INIT.
pub fn mount_kept(
    blocks: Arc<NodeBlocks>,
    cfg: FsConfig,
    keeper: KeeperClient,
    req: MountRequest,
) -> Result<Mounted, MountError> {
    let mp = PathBuf::from(&req.mountpoint);
    mount_fresh(blocks, cfg, &mp, Some((keeper, req)))
}

fn mount_fresh(
    blocks: Arc<NodeBlocks>,
    cfg: FsConfig,
    mountpoint: &Path,
    keep: Option<(KeeperClient, MountRequest)>,
) -> Result<Mounted, MountError> {
    std::fs::create_dir_all(mountpoint).map_err(mount_err(mountpoint))?;
    let inodes = match &keep {
        Some((_, req)) => {
            Inodes::journaled(Journal::new(blocks.db().clone(), &req.mountpoint), false)
        }
        None => Inodes::default(),
    };
    let core = new_core(blocks, &cfg, inodes, mountpoint)?;
    let config = session_config(&cfg, keep.is_none());
    let adapter = FuseAdapter::new(core.clone());
    let init = adapter.init_record();
    let mut session =
        fuser::Session::new(adapter, mountpoint, &config).map_err(mount_err(mountpoint))?;
    core.set_kernel_cache(kernel_cache(&session));
    let keeper = match keep {
        Some((keeper, req)) => {
            let kept = KeptMount {
                mount: Some(req),
                init: *lock(&init),
            };
            match keeper.keep(kept, session.as_fd()) {
                Ok(()) => Some(keeper),
                Err(e) => {
                    tracing::warn!(error = %e, mountpoint = %mountpoint.display(),
                        "the keeper does not hold this mount; it ends with this agent");
                    None
                }
            }
        }
        None => None,
    };
    let unmounter = Unmounter::Session(session.unmount_callable());
    let done = run_session(session)?;
    raise_read_ahead(mountpoint);
    Ok(Mounted {
        unmounter,
        done,
        core,
        mountpoint: mountpoint.to_path_buf(),
        keeper,
    })
}

fn new_core(
    blocks: Arc<NodeBlocks>,
    cfg: &FsConfig,
    inodes: Inodes,
    mountpoint: &Path,
) -> Result<Arc<FsCore>, MountError> {
    let rt = tokio::runtime::Handle::current();
    let db = blocks.db().clone();
    let core = Arc::new(FsCore::with_inodes(cfg.clone(), rt, blocks, inodes)?);
    // Ends by itself once the core is gone.
    drop(core.watch());
    core.start_writeback(db, journal_tag(cfg, mountpoint))?;
    Ok(core)
}

/// The tag of the write-back records of the mount of `cfg`'s namespace at `mountpoint`: the
/// next agent on the same mount finds them (two mounts of one namespace on a node keep their
/// own).
fn journal_tag(cfg: &FsConfig, mountpoint: &Path) -> Vec<u8> {
    let mp = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mut h = blake3::Hasher::new();
    h.update(cfg.namespace.as_str().as_bytes());
    h.update(&[0]);
    h.update(mp.as_os_str().as_encoded_bytes());
    let mut tag = h.finalize().as_bytes()[..16].to_vec();
    tag.push(0);
    tag
}

/// The kernel's caches of a session, through its notifications. Names are forgotten by a
/// thread of their own: the kernel takes the directory's lock to forget a name, and a request
/// that holds that lock (a create in it, say) may be waiting on the very change being told, so
/// the teller waits for it a moment only ([`crate::fs::KernelCache::settle`]).
struct Kernel {
    notifier: fuser::Notifier,
    names: std::sync::mpsc::Sender<(u64, String)>,
    queued: std::sync::atomic::AtomicU64,
    /// Names forgotten so far, and a wake-up for whoever waits for them.
    forgotten: Arc<(std::sync::Mutex<u64>, std::sync::Condvar)>,
}

impl Kernel {
    fn new(notifier: fuser::Notifier, device: Option<OwnedFd>) -> Kernel {
        let (names, rx) = std::sync::mpsc::channel::<(u64, String)>();
        let forgotten: Arc<(std::sync::Mutex<u64>, std::sync::Condvar)> = Arc::default();
        let (n, done) = (notifier.clone(), forgotten.clone());
        let spawned = std::thread::Builder::new()
            .name("kt-forget".into())
            .spawn(move || {
                // Ends when the session's core (and so this sender) is gone.
                for (parent, name) in rx {
                    let expired = device
                        .as_ref()
                        .is_some_and(|d| expire_entry(d.as_fd(), parent, &name).is_ok());
                    if !expired {
                        let name = std::ffi::OsStr::new(&name);
                        if let Err(e) = n.inval_entry(fuser::INodeNo(parent), name) {
                            tracing::trace!(parent, ?name, error = %e, "the kernel kept no such name");
                        }
                    }
                    *lock(&done.0) += 1;
                    done.1.notify_all();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to forget names in the kernel: {e}");
        }
        Kernel {
            notifier,
            names,
            queued: Default::default(),
            forgotten,
        }
    }
}

impl crate::fs::KernelCache for Kernel {
    /// Attributes only (offset -1): pages stay (an open of a new version drops them), and the
    /// call takes no lock a request in flight may hold.
    fn forget_attrs(&self, ino: u64) {
        if let Err(e) = self.notifier.inval_inode(fuser::INodeNo(ino), -1, 0) {
            // ENOENT: the kernel holds no such inode now.
            tracing::trace!(ino, error = %e, "the kernel kept no attributes to forget");
        }
    }

    fn forget_name(&self, parent: u64, name: &str) {
        if self.names.send((parent, name.to_string())).is_ok() {
            self.queued
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn settle(&self, within: std::time::Duration) {
        let target = self.queued.load(std::sync::atomic::Ordering::SeqCst);
        let (done, woken) = &*self.forgotten;
        let guard = lock(done);
        let waited = woken.wait_timeout_while(guard, within, |n| *n < target);
        if waited.is_ok_and(|(_, r)| r.timed_out()) {
            crate::metrics::KERNEL_SETTLE_WAITS.inc();
        }
    }
}

fn kernel_cache(session: &fuser::Session<FuseAdapter>) -> Box<dyn crate::fs::KernelCache> {
    let device = session.as_fd().try_clone_to_owned().ok();
    Box::new(Kernel::new(session.notifier(), device))
}

/// `FUSE_NOTIFY_INVAL_ENTRY` with `FUSE_EXPIRE_ONLY` (Linux 6.2): the name's lifetime ends, so
/// its next use looks it up again and replaces it only if it changed. A plain invalidation
/// (what fuser sends) unhashes it at once, and a process whose working directory it is can no
/// longer find that directory's path (`getcwd` fails: git does not survive it).
fn expire_entry(dev: BorrowedFd<'_>, parent: u64, name: &str) -> std::io::Result<()> {
    const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;
    const FUSE_EXPIRE_ONLY: u32 = 1;
    let len = 16 + 16 + name.len() + 1;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(
        &u32::try_from(len)
            .map_err(std::io::Error::other)?
            .to_ne_bytes(),
    );
    m.extend_from_slice(&FUSE_NOTIFY_INVAL_ENTRY.to_ne_bytes());
    m.extend_from_slice(&0u64.to_ne_bytes()); // unique: a notification
    m.extend_from_slice(&parent.to_ne_bytes());
    m.extend_from_slice(
        &u32::try_from(name.len())
            .map_err(std::io::Error::other)?
            .to_ne_bytes(),
    );
    m.extend_from_slice(&FUSE_EXPIRE_ONLY.to_ne_bytes());
    m.extend_from_slice(name.as_bytes());
    m.push(0);
    // SAFETY: `dev` is an open descriptor and `m` a valid buffer of its length.
    let n = unsafe { libc::write(dev.as_raw_fd(), m.as_ptr().cast(), m.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        // ENOENT: the kernel holds no such name, which is what was asked.
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

fn run_session(
    session: fuser::Session<FuseAdapter>,
) -> Result<tokio::sync::oneshot::Receiver<()>, MountError> {
    let (tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kt-fuse".into())
        .spawn(move || {
            if let Err(e) = session.run() {
                tracing::error!(error = %e, "FUSE session ended with an error");
            }
            let _ = tx.send(());
        })
        .map_err(MountError::Thread)?;
    Ok(done)
}

/// Serves a kept mount again, on the device `fd` that `keeper` held while no agent served it.
///
/// The kernel greets a device once: fuser's session wants a FUSE_INIT, so it gets the recorded
/// one over a socket pair, and then the device takes the socket's place under the same
/// descriptor number. The kernel is then asked to resend the requests the dead agent had read
/// but not answered (FUSE_NOTIFY_RESEND, Linux 6.9); the inode table comes back from its
/// journal, and the handles the kernel still holds are reopened when used.
pub fn resume(
    blocks: Arc<NodeBlocks>,
    cfg: FsConfig,
    keeper: KeeperClient,
    kept: KeptMount,
    fd: OwnedFd,
) -> Result<Mounted, MountError> {
    let req = kept.mount.clone().unwrap_or_default();
    let mountpoint = PathBuf::from(&req.mountpoint);
    let init = kept
        .init
        .ok_or_else(|| MountError::NoInit(req.mountpoint.clone()))?;
    let io = |source: std::io::Error| MountError::Resume {
        path: req.mountpoint.clone(),
        source,
    };
    let inodes = Inodes::journaled(Journal::new(blocks.db().clone(), &req.mountpoint), true);
    let core = new_core(blocks, &cfg, inodes, &mountpoint)?;
    let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().map_err(io)?;
    ours.send(&synthetic_init(&init)).map_err(io)?;
    let session = fuser::Session::from_fd(
        FuseAdapter::new(core.clone()),
        OwnedFd::from(theirs),
        SessionACL::All,
        session_config(&cfg, false),
    )
    .map_err(io)?;
    // SAFETY: both are open descriptors; dup3 atomically makes the session's descriptor number
    // refer to the kept device (closing the socket it named), and `fd` is closed after.
    if unsafe { libc::dup3(fd.as_raw_fd(), session.as_fd().as_raw_fd(), libc::O_CLOEXEC) } < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    core.set_kernel_cache(kernel_cache(&session));
    drop(fd);
    drop(ours);
    if let Err(e) = resend_pending(session.as_fd()) {
        tracing::warn!(error = %e, mountpoint = %mountpoint.display(),
            "the kernel cannot resend requests (Linux 6.9 can); those in flight when the agent died stay unanswered");
    }
    let done = run_session(session)?;
    tracing::info!(mountpoint = %mountpoint.display(), "serving a kept mount again");
    Ok(Mounted {
        unmounter: Unmounter::Path,
        done,
        core,
        mountpoint,
        keeper: Some(keeper),
    })
}

/// FUSE_INIT as the kernel sent it: `fuse_in_header` then `fuse_init_in` (ABI 7.36 layout).
fn synthetic_init(init: &FuseInit) -> Vec<u8> {
    const FUSE_INIT: u32 = 26;
    const FUSE_INIT_EXT: u64 = 1 << 30;
    const HEADER: usize = 40;
    const BODY: usize = 64;
    let flags = init.flags | FUSE_INIT_EXT;
    let mut m = Vec::with_capacity(HEADER + BODY);
    m.extend_from_slice(&((HEADER + BODY) as u32).to_ne_bytes()); // len
    m.extend_from_slice(&FUSE_INIT.to_ne_bytes()); // opcode
    m.extend_from_slice(&1u64.to_ne_bytes()); // unique
    m.extend_from_slice(&0u64.to_ne_bytes()); // nodeid
    m.extend_from_slice(&[0u8; 16]); // uid, gid, pid, padding
    m.extend_from_slice(&init.major.to_ne_bytes());
    m.extend_from_slice(&init.minor.to_ne_bytes());
    m.extend_from_slice(&init.max_readahead.to_ne_bytes());
    m.extend_from_slice(&(flags as u32).to_ne_bytes());
    m.extend_from_slice(&((flags >> 32) as u32).to_ne_bytes());
    m.extend_from_slice(&[0u8; 44]); // unused
    m
}

/// Asks the kernel to queue again every request that was read from the device but not
/// answered (FUSE_NOTIFY_RESEND): those of the agent that died.
fn resend_pending(dev: BorrowedFd<'_>) -> std::io::Result<()> {
    const FUSE_NOTIFY_RESEND: i32 = 7;
    let mut m = Vec::with_capacity(16);
    m.extend_from_slice(&16u32.to_ne_bytes());
    m.extend_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    m.extend_from_slice(&0u64.to_ne_bytes());
    // SAFETY: `dev` is an open descriptor and `m` a valid buffer of its length.
    let n = unsafe { libc::write(dev.as_raw_fd(), m.as_ptr().cast(), m.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the mount's kernel readahead; the default 128 KiB caps sequential reads well below
/// what the mount can serve.
fn raise_read_ahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
        tracing::debug!(error = %e, %knob, "could not raise readahead");
    }
}

impl Mounted {
    /// Waits until `shutdown` completes (then unmounts, or leaves the mount to the next agent)
    /// or the filesystem is unmounted from outside; publishes what is still open for writing.
    pub async fn serve_until(mut self, shutdown: impl std::future::Future<Output = Stop>) {
        tokio::select! {
            stop = shutdown => {
                // Publish first: a process may keep a file open past the unmount, and the data
                // it wrote must not wait for it.
                self.core.flush_all().await;
                if stop == Stop::Handover {
                    return;
                }
                if let Some(k) = &self.keeper {
                    if let Err(e) = k.release(&self.mountpoint.to_string_lossy()) {
                        tracing::warn!(error = %e, "could not tell the keeper");
                    }
                }
                let unmounted = match &mut self.unmounter {
                    Unmounter::Session(u) => u.unmount(),
                    Unmounter::Path => unmount(&self.mountpoint),
                };
                if let Err(e) = unmounted {
                    tracing::warn!(error = %e, "unmount failed; detaching the mount");
                    lazy_unmount(&self.mountpoint);
                }
                // A detached mount lives until its last open file closes; do not wait for that.
                if tokio::time::timeout(UNMOUNT_WAIT, &mut self.done).await.is_err() {
                    tracing::warn!("files are still open on the detached mount; exiting anyway");
                }
            }
            _ = &mut self.done => {
                self.core.flush_all().await;
                if let Some(k) = &self.keeper {
                    let _ = k.release(&self.mountpoint.to_string_lossy());
                }
            }
        }
    }
}

fn unmount(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn lazy_unmount(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid C string; MNT_DETACH detaches even while files are open.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
