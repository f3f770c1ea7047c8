//! The filesystem core: what `/kt` shows and does, for the FUSE adapter and for tests alike.
//!
//! `FsCore` composes the owners of its parts: the namespace as this mount sees it (its inodes
//! and the store server's listings, cached under the watch's lease), the open files
//! ([`Handles`]), reading ([`Reader`]: opened versions, the blocks they read, seeding), writing
//! ([`Writer`]: files staged here, write-back) and the GPU control tree ([`GpuTree`]). The
//! kernel's operations, which use several of them, are the core's own (in `ops`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::attr::Attr;
use super::config::FsConfig;
use super::error::{FsError, FsResult};
use super::gpu_tree::GpuTree;
use super::handles::Handles;
use super::kernel::{KernelCache, LEASED_TTL, LEASE_MARGIN, SETTLE_NAMES, UNLEASED_TTL};
use super::names::inode::Inodes;
use super::names::listings::Listings;
use super::paths::{gpu_rest, split};
use super::read::reader::Reader;
use super::write::staged::Staged;
use super::write::writer::Writer;
use crate::blocks::files::private_dir;
use crate::blocks::node::NodeBlocks;
use crate::gpu::control::GpuControl;
use crate::locks::lock;
use crate::rpc::client::Store;
use crate::transfer::Remotes;

pub struct FsCore {
    pub(super) cfg: Arc<FsConfig>,
    pub(super) rt: tokio::runtime::Handle,
    pub(super) store: Store,
    pub(super) blocks: Arc<NodeBlocks>,
    pub(super) inodes: Mutex<Inodes>,
    pub(super) listings: Arc<Listings>,
    pub(super) handles: Handles,
    pub(super) reader: Reader,
    pub(super) writer: Writer,
    pub(super) gpu: GpuTree,
    pub(super) started: SystemTime,
    /// Files unlinked here while the kernel still knew their inodes (open, or just named): what
    /// `fstat` of a descriptor still open on one shows, until the kernel forgets the inode.
    pub(super) orphans: Mutex<HashMap<u64, Orphan>>,
    /// Access times of this node's inodes, as `relatime` keeps them (see [`Attr::atime`]).
    pub(super) atimes: Mutex<HashMap<u64, SystemTime>>,
    /// Tells the kernel to forget what it cached (set by the mount's session).
    kernel: std::sync::OnceLock<Box<dyn KernelCache>>,
}

/// A file unlinked while the kernel still holds its inode.
pub(crate) enum Orphan {
    Staged(Arc<Staged>),
    Published(Attr),
}

impl FsCore {
    /// A core over `blocks` (this node's), running its RPCs and transfers on `rt`.
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
        Self::with_remotes(cfg, rt, blocks, inodes, Remotes::default())
    }

    /// A core that reaches the store server and its peers through `remotes` (a test's stand-in
    /// for either, say); by default it connects to `cfg.server` and reaches peers over TCP.
    pub fn with_remotes(
        cfg: FsConfig,
        rt: tokio::runtime::Handle,
        blocks: Arc<NodeBlocks>,
        inodes: Inodes,
        remotes: Remotes,
    ) -> FsResult<Self> {
        private_dir(&cfg.staging)?;
        let cfg = Arc::new(cfg);
        let store = {
            let _guard = rt.enter();
            remotes.store_lazy(&cfg.server, &cfg.credential)?
        };
        let started = SystemTime::now();
        let control = GpuControl::new(
            rt.clone(),
            store.clone(),
            cfg.namespace.clone(),
            cfg.node_id.clone(),
            cfg.worker_exe.clone(),
            cfg.worker_host.clone(),
        );
        let listings = match cfg.stale_reads {
            true => Listings::new(cfg.clock.clone()).keeping_last_seen(),
            false => Listings::new(cfg.clock.clone()),
        };
        let listings = Arc::new(listings);
        Ok(FsCore {
            gpu: GpuTree::new(control, started, cfg.uid, cfg.gid),
            reader: Reader::new(
                cfg.clone(),
                (store.clone(), remotes.peers),
                listings.clone(),
                blocks.clone(),
                rt.clone(),
            ),
            writer: Writer::new(&cfg.staging),
            handles: Handles::default(),
            listings,
            cfg,
            rt,
            store,
            blocks,
            inodes: Mutex::new(inodes),
            started,
            orphans: Mutex::default(),
            atimes: Mutex::default(),
            kernel: std::sync::OnceLock::new(),
        })
    }

    /// How many times this mount's reads looked for a block in what its node holds (see
    /// `read::loader`: once per block read, fetched or not).
    pub fn block_lookups(&self) -> u64 {
        self.reader.loader.lookups()
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
            // Between a lost lease and the next, the kernel keeps nothing either.
            return match self.listings.lapsed() {
                true => Duration::ZERO,
                false => UNLEASED_TTL,
            };
        }
        // Every reply asks: the path is looked at in place, not copied.
        match self.inodes().path_ref(ino) {
            Some(p) if gpu_rest(p).is_none() => LEASED_TTL,
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

    /// Whether the watch of the namespace holds a lease now.
    pub fn watching(&self) -> bool {
        self.listings.leased()
    }

    pub(crate) fn store(&self) -> Store {
        self.store.clone()
    }

    pub(crate) fn ns(&self) -> String {
        self.cfg.namespace.to_string()
    }

    pub(crate) fn inodes(&self) -> MutexGuard<'_, Inodes> {
        lock(&self.inodes)
    }

    pub(super) fn writable(&self) -> FsResult<()> {
        // With stale reads, a mount cut off from every store server is read-only until one
        // answers (a write could not be published, and would pass for one that was).
        if self.cfg.read_only || (self.cfg.stale_reads && self.listings.unreachable()) {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
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
