//! The filesystem core behind the mount: what `/kt` shows and does, driven by the FUSE adapter
//! ([`fuse`]) and by tests alike, without a mount.
//!
//! Paths are keys of one namespace (the mount's root is the namespace). Directories, files and
//! symlinks come from the store server's listings ([`names`], cached for [`LISTING_TTL`], so keys
//! published elsewhere appear within a second or two); a read resolves the version at `open`
//! (close-to-open consistency) and fetches only the blocks it touches ([`read`], [`loader`]); a
//! write is staged on local disk ([`staged`]) and published when closed or fsynced
//! ([`publish`]); directory operations are metadata changes on the store server ([`dir_ops`]);
//! the one extended attribute is the locale of a directory ([`xattr`]). Every operation returns
//! plain structs or an [`FsError`], whose errno [`error`] decides. [`session`] mounts, resumes
//! and unmounts; it and [`fuse`] are the only files that name fuser.

pub mod body;
pub mod dir_ops;
pub mod error;
pub mod fuse;
pub mod gpu_tree;
pub mod inode;
pub mod loader;
pub mod names;
pub mod publish;
pub mod read;
pub mod session;
pub mod staged;
mod watch;
pub mod writeback;
pub mod xattr;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::auth::gpu_secret::HostKey;
use crate::auth::ticket::TicketHolder;
use crate::auth::Credential;
use crate::blocks::node::NodeBlocks;
use crate::clock::SharedClock;
use crate::gpu::control::{ControlFile, GpuControl};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::locks::lock;
use crate::proto::Locale;
use crate::rpc::client::{self, Store};

pub use error::{FsError, FsResult};
use inode::Inodes;
use loader::Loader;
use names::Listings;
use read::ReadFile;
use staged::Staged;

pub use names::LISTING_TTL;
pub use read::{PageCache, BYPASS_MIN};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Special files: the kernel does their I/O (a fifo's pipe, a socket's bind); the mount is
    /// nodev, so device nodes never open.
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What `stat` shows.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub mtime: SystemTime,
    /// When it was last read on this node (relatime), or set by utimens here: node-local,
    /// never published; the mtime until then.
    pub atime: SystemTime,
    /// When the metadata or content last changed (shared, as the store server stamped it).
    pub ctime: SystemTime,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A device node's number.
    pub rdev: u32,
}

#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
}

/// An open file.
pub enum Handle {
    Read(Arc<ReadFile>),
    Write(Arc<Staged>),
    Dir(Arc<Vec<DirEntry>>),
    /// A GPU control file, `/.gpu/<key>`.
    Gpu(Arc<ControlFile>),
}

impl Handle {
    fn share(&self) -> Handle {
        match self {
            Handle::Read(r) => Handle::Read(r.clone()),
            Handle::Write(w) => Handle::Write(w.clone()),
            Handle::Dir(d) => Handle::Dir(d.clone()),
            Handle::Gpu(g) => Handle::Gpu(g.clone()),
        }
    }

    fn is_write(&self) -> bool {
        matches!(self, Handle::Write(_))
    }
}

/// The mount's settings.
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub server: String,
    /// What the mount presents to the store server: its node's credential.
    pub credential: Credential,
    /// What it presents to peers on the data plane: its node's ticket, renewed by heartbeats.
    pub node_ticket: TicketHolder,
    pub namespace: Namespace,
    pub locale: Locale,
    pub read_only: bool,
    pub node_id: String,
    pub zone: String,
    /// Children per source for readers of one version (0: the server's default).
    pub fanout: u32,
    /// Where writes are staged until published (and where files published in place stay).
    pub staging: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// What listing lifetimes are measured with.
    pub clock: SharedClock,
    /// The `kt` binary, which GPU transfer workers run as (`kt gpu-worker`).
    pub worker_exe: PathBuf,
    /// The address this node's GPU transfer workers listen on.
    pub worker_host: String,
    /// Where this node's GPU registrations' secrets come from (see `rpc::gpu_secret`).
    pub gpu_host_key: HostKey,
    /// Closes return once journaled; publishes follow (see [`writeback`]).
    pub writeback: bool,
}

pub struct FsCore {
    cfg: FsConfig,
    rt: tokio::runtime::Handle,
    store: Store,
    blocks: Arc<NodeBlocks>,
    loader: Loader,
    inodes: Mutex<Inodes>,
    listings: Listings,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    staged: Mutex<HashMap<String, Arc<Staged>>>,
    /// What staged bodies hold in memory (see [`body`]).
    staging_memory: Arc<body::MemoryBudget>,
    /// The queue and journal of closed files still to publish (`--writeback`).
    writeback: Arc<writeback::Writeback>,
    /// The version each inode showed when last opened, to keep the kernel's page cache only
    /// while it is still right.
    opened_versions: Mutex<HashMap<u64, Version>>,
    /// Versions this node has registered as a location of.
    seeded: Arc<Mutex<HashSet<Version>>>,
    started: SystemTime,
    gpu: GpuControl,
    /// GPU control files open here, by key: they exist before they are published.
    gpu_files: Mutex<HashMap<String, usize>>,
    /// Directories made below `/.gpu` on this mount, for keys to come.
    gpu_dirs: Mutex<HashSet<String>>,
    /// Files unlinked here while the kernel still knew their inodes (open, or just named): what
    /// `fstat` of a descriptor still open on one shows, until the kernel forgets the inode.
    orphans: Mutex<HashMap<u64, Orphan>>,
    /// Access times of this node's inodes, as `relatime` keeps them (see [`Attr::atime`]).
    atimes: Mutex<HashMap<u64, SystemTime>>,
    /// Tells the kernel to forget what it cached (set by the mount's session).
    kernel: std::sync::OnceLock<Box<dyn KernelCache>>,
}

/// What the kernel cached of the mount, which the mount can make it forget.
pub trait KernelCache: Send + Sync {
    /// The attributes of inode `ino` (its size, times, link count).
    fn forget_attrs(&self, ino: u64);
    /// The name `name` in directory `parent`, and below it: the next use looks it up again.
    /// Returns at once: the kernel takes the directory's lock to forget it, which a request in
    /// flight may hold while it waits for the change being told.
    fn forget_name(&self, parent: u64, name: &str);
    /// Waits until the names asked to be forgotten so far are, or `within` passed (a request
    /// holding a directory's lock may be waiting for the teller: it must go on).
    fn settle(&self, within: Duration);
}

/// How long the watch waits for the kernel to forget the names a change touched before it
/// acknowledges the change (see [`KernelCache::settle`]).
pub const SETTLE_NAMES: Duration = Duration::from_millis(50);

/// How long the kernel may trust names and attributes while the watch's lease holds: every
/// change another node makes is told (and forgotten in the kernel) before its writer is
/// answered, and a lease about to lapse makes the kernel forget everything first.
pub const LEASED_TTL: Duration = Duration::from_secs(30);
/// How long before the lease ends the kernel is made to forget, unless it was renewed: no reply
/// carries [`LEASED_TTL`] from then on.
pub const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// Without a lease (no watch, or it broke), and for the GPU control tree (whose keys come and
/// go with their publishers, untold): short, so that changes elsewhere show up soon.
pub const UNLEASED_TTL: Duration = Duration::from_secs(1);

/// Who asks: the process, and the ids a new file of its is owned by.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl FsCore {
    /// The owner of a new entry in directory `parent` made by `caller`, and whether the
    /// directory is set-group-ID (its gid, and for a directory the bit too, are inherited).
    pub(crate) async fn owner_for(
        &self,
        parent: u64,
        caller: Caller,
    ) -> FsResult<((u32, u32), bool)> {
        let dir = self.getattr(parent).await?;
        if dir.perm & 0o2000 != 0 {
            return Ok(((caller.uid, dir.gid), true));
        }
        Ok(((caller.uid, caller.gid), false))
    }
}

impl FsCore {
    /// `relatime`: a read moves the access time when it is not after the last change, or is
    /// a day old; otherwise a read writes nothing, here or anywhere.
    pub(crate) fn accessed(&self, ino: u64, a: &Attr) {
        let now = SystemTime::now();
        let mut atimes = lock(&self.atimes);
        let at = atimes.get(&ino).copied().unwrap_or(a.mtime);
        let stale = at <= a.mtime
            || at <= a.ctime
            || now
                .duration_since(at)
                .is_ok_and(|d| d >= Duration::from_secs(86_400));
        if stale {
            atimes.insert(ino, now);
        }
    }

    pub(crate) fn set_atime(&self, ino: u64, t: SystemTime) {
        lock(&self.atimes).insert(ino, t);
    }

    fn with_atime(&self, mut a: Attr) -> Attr {
        a.atime = lock(&self.atimes).get(&a.ino).copied().unwrap_or(a.mtime);
        a
    }
}

/// A file unlinked while the kernel still holds its inode.
enum Orphan {
    Staged(Arc<Staged>),
    Published(Attr),
}

impl FsCore {
    /// The path of `name` in directory `parent`. Every call that takes a name checks it here:
    /// the kernel leaves NAME_MAX to the filesystem.
    pub(crate) async fn child(&self, parent: u64, name: &str) -> FsResult<String> {
        if name.len() > crate::key::MAX_SEGMENT {
            return Err(FsError::Name(crate::key::KeyError::SegmentTooLong(
                name.chars().take(32).collect::<String>() + "...",
            )));
        }
        Ok(join(&self.path_of(parent).await?, name))
    }
}

pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

pub(crate) fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// Seconds and nanoseconds since the epoch (before it too, as 64-bit time allows) as a time.
pub(crate) fn time_of(sec: i64, nsec: u32) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    let t = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

/// A time as seconds and nanoseconds since the epoch, the nanoseconds always forward.
pub(crate) fn to_unix(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    }
}

impl FsCore {
    /// A core over `blocks` (this node's), running its RPCs and transfers on `rt`. Its calls
    /// block: make them from threads outside the runtime (the FUSE threads, a test's).
    pub fn new(
        cfg: FsConfig,
        rt: tokio::runtime::Handle,
        blocks: Arc<NodeBlocks>,
    ) -> FsResult<Self> {
        Self::with_inodes(cfg, rt, blocks, Inodes::default())
    }

    /// A core over a given inode table (a journaled one, for a mount the keeper holds).
    pub fn with_inodes(
        cfg: FsConfig,
        rt: tokio::runtime::Handle,
        blocks: Arc<NodeBlocks>,
        inodes: Inodes,
    ) -> FsResult<Self> {
        std::fs::create_dir_all(&cfg.staging)?;
        // Handles of an agent that ran before on this mount may still be in the kernel's
        // hands; numbers drawn from the clock (one per nanosecond at most) never meet them.
        let first_fh = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(2, |d| d.as_nanos() as u64 & !1 & (u64::MAX >> 2));
        let store = {
            let _guard = rt.enter();
            client::store_lazy(&cfg.server, &cfg.credential)?
        };
        let gpu = GpuControl::new(
            rt.clone(),
            store.clone(),
            cfg.namespace.clone(),
            cfg.node_id.clone(),
            cfg.worker_exe.clone(),
            cfg.worker_host.clone(),
            cfg.gpu_host_key.clone(),
        );
        let writeback = Arc::new(writeback::Writeback::new(&cfg.staging));
        Ok(FsCore {
            gpu,
            gpu_files: Mutex::default(),
            gpu_dirs: Mutex::default(),
            orphans: Mutex::default(),
            atimes: Mutex::default(),
            loader: Loader::new(blocks.clone()),
            listings: Listings::new(cfg.clock.clone()),
            cfg,
            rt,
            store,
            blocks,
            inodes: Mutex::new(inodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(first_fh),
            staged: Mutex::new(HashMap::new()),
            staging_memory: body::MemoryBudget::new(body::MEMORY_BUDGET),
            writeback,
            opened_versions: Mutex::new(HashMap::new()),
            seeded: Arc::new(Mutex::new(HashSet::new())),
            started: SystemTime::now(),
            kernel: std::sync::OnceLock::new(),
        })
    }

    /// The runtime the core's calls run on (the FUSE adapter waits for them there).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    /// How the kernel is told to forget what it cached when another node changed it.
    pub fn set_kernel_cache(&self, k: Box<dyn KernelCache>) {
        let _ = self.kernel.set(k);
    }

    /// How long the kernel may trust the name and attributes of `ino`: [`LEASED_TTL`] while
    /// the watch's lease holds, outside the GPU control tree.
    pub fn kernel_ttl(&self, ino: u64) -> Duration {
        if !self.listings.leased_beyond(LEASE_MARGIN) {
            return UNLEASED_TTL;
        }
        // Every reply asks: the path is looked at in place, not copied.
        match self.inodes().path_ref(ino) {
            Some(p) if gpu_tree::gpu_rest(p).is_none() => LEASED_TTL,
            _ => UNLEASED_TTL,
        }
    }

    /// The store server told of a change at or below `path` (`""`: anywhere): what this mount
    /// cached is forgotten, and the kernel forgets the name (and what is below it) and the
    /// attributes of the path and of its directory (their sizes, times and link counts moved).
    /// Called from the watch, never while serving a kernel request.
    pub(crate) fn recall(&self, path: &str) {
        self.listings.recall(path);
        match path {
            "" => self.kernel_forget_all(),
            p => {
                self.kernel_forget_paths(&[p, split(p).0]);
                let parent = self.inodes().known(split(p).0);
                if let (Some(k), Some(parent)) = (self.kernel.get(), parent) {
                    k.forget_name(parent, split(p).1);
                }
            }
        }
    }

    /// Waits (a moment at most) until the kernel forgot the names recalls asked it to.
    pub(crate) fn kernel_settle(&self) {
        if let Some(k) = self.kernel.get() {
            k.settle(SETTLE_NAMES);
        }
    }

    /// Makes the kernel forget every name and attribute of this mount it may hold: the watch
    /// broke, or its lease is about to lapse, so changes may go untold.
    pub(crate) fn kernel_forget_all(&self) {
        let Some(k) = self.kernel.get() else {
            return;
        };
        let (inos, names): (Vec<u64>, Vec<(u64, String)>) = {
            let inodes = self.inodes();
            let names = inodes
                .known_paths()
                .into_iter()
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let parent = inodes.known(split(&p).0)?;
                    Some((parent, split(&p).1.to_string()))
                })
                .collect();
            (inodes.known_inodes(), names)
        };
        for (parent, name) in names {
            k.forget_name(parent, &name);
        }
        for ino in inos {
            k.forget_attrs(ino);
        }
    }

    /// Tells the kernel to forget the attributes of the inodes of `paths` it knows.
    pub(crate) fn kernel_forget_paths(&self, paths: &[&str]) {
        let Some(k) = self.kernel.get() else {
            return;
        };
        let inos: Vec<u64> = {
            let inodes = self.inodes();
            paths.iter().filter_map(|p| inodes.known(p)).collect()
        };
        for ino in inos {
            k.forget_attrs(ino);
        }
    }

    /// Watches the namespace for changes (see [`watch`]) while the core lives; a mount
    /// starts this, an in-process core used alone need not.
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        self.rt.spawn(watch::run(Arc::downgrade(self)))
    }

    /// Whether the watch of the namespace holds a lease now.
    pub fn watching(&self) -> bool {
        self.listings.leased()
    }

    fn store(&self) -> Store {
        self.store.clone()
    }

    fn ns(&self) -> String {
        self.cfg.namespace.to_string()
    }

    fn inodes(&self) -> MutexGuard<'_, Inodes> {
        lock(&self.inodes)
    }

    /// Checks a path that is about to become a key.
    fn check_key(path: &str) -> FsResult<()> {
        KeyPath::parse(path).map(|_| ()).map_err(FsError::Name)
    }

    pub(crate) async fn path_of(&self, ino: u64) -> FsResult<String> {
        let (path, names) = {
            let t = self.inodes();
            (t.path(ino).ok_or(FsError::Stale)?, t.names(ino))
        };
        // A file of several names whose name here went away on another node goes on under a
        // name it still has, as a local unlink of the name passes it on.
        if let Some(names) = names {
            if self.staged_at(&path).is_none()
                && matches!(self.entry(&path).await, Err(FsError::NotFound))
            {
                for other in names.iter().filter(|n| **n != path) {
                    if self.entry(other).await.is_ok() {
                        self.inodes().pass_on(ino, &path, other);
                        return Ok(other.clone());
                    }
                }
            }
        }
        Ok(path)
    }

    fn ino_of(&self, path: &str) -> u64 {
        self.inodes().ino(path)
    }

    /// Handles are even for reading and odd for writing, so that a handle this process did not
    /// make (one the kernel kept across an agent restart) still tells what it was.
    fn insert_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(2, Ordering::Relaxed) | u64::from(h.is_write());
        lock(&self.handles).insert(fh, h);
        fh
    }

    /// Whether a close of handle `fh` must reach the core (FLUSH): a writer's close publishes,
    /// a reader's does nothing, so the kernel can be told to skip it (one request less per
    /// file read).
    pub fn flushes(fh: u64) -> bool {
        fh & 1 == 1
    }

    fn handle(&self, fh: u64) -> FsResult<Handle> {
        match lock(&self.handles).get(&fh) {
            Some(h) => Ok(h.share()),
            None if fh & 1 == 1 => Err(FsError::LostWriter),
            None => Err(FsError::BadHandle),
        }
    }

    /// A handle from an agent that ran before on this mount (a kept mount, see
    /// `crate::keeper`). A reader's is opened again, on the version the key has now; a
    /// writer's staged bytes died with that agent.
    async fn reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        let h = if dir {
            Handle::Dir(self.snapshot_dir(ino).await?)
        } else {
            Handle::Read(Arc::new(
                self.resolve_file(&self.path_of(ino).await?).await?,
            ))
        };
        lock(&self.handles).insert(fh, h.share());
        tracing::debug!(ino, fh, "reopened a handle of an earlier agent");
        Ok(h)
    }

    async fn handle_or_reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        match self.handle(fh) {
            Err(FsError::BadHandle) => self.reopen(ino, fh, dir).await,
            other => other,
        }
    }

    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_RELEASE_SECONDS);
        let h = lock(&self.handles).remove(&fh);
        match h {
            Some(Handle::Write(s)) => self.release_staged(&s).await,
            Some(Handle::Gpu(cf)) => {
                self.gpu_release(&cf);
                Ok(())
            }
            // Nothing to release for a handle of an earlier agent either.
            _ => Ok(()),
        }
    }

    pub fn statfs(&self) -> FsResult<libc::statvfs> {
        let path = std::ffi::CString::new(self.cfg.staging.as_os_str().as_encoded_bytes())
            .map_err(|_| FsError::Invalid("the staging path holds a NUL byte".into()))?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a valid C string and `st` a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(st)
    }
}
