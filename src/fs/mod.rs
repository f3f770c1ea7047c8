//! The filesystem core behind the mount: what `/kt` shows and does, testable without a mount.
//!
//! Paths are keys of one namespace (the mount's root is the namespace). Directories, files and
//! symlinks come from the store server's listings (cached for [`LISTING_TTL`], so keys published
//! elsewhere appear within a second or two); a read resolves the version at `open`
//! (close-to-open consistency) and fetches only the blocks it touches ([`read`]); a write is
//! staged on local disk and published when closed or fsynced ([`write`]). Every operation
//! returns plain structs or an [`FsError`] that carries its errno; the fuser adapter
//! ([`fuse`]) only translates.

pub mod fuse;
pub mod inode;
pub mod read;
pub mod write;

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::agent::AgentBlocks;
use crate::client::{ClientError, Store};
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, FileEntry};
use crate::proto::{
    AddLocationRequest, InlineBlock, JoinRequest, LeaveRequest, ListEntry, ListRequest, Locale,
    ResolveRequest, Role, WindowSpec,
};
use crate::server::ERRNO_KEY;
use crate::transfer::{BlockJob, SourceAddr};

use inode::Inodes;
use read::Loader;
use write::Staged;

/// How long a directory listing from the store server is trusted.
pub const LISTING_TTL: Duration = Duration::from_secs(1);
/// Blocks fetched ahead of a sequential reader.
const READAHEAD_BLOCKS: usize = 8;
/// How far from the previous read's end a read may start and still count as sequential.
const SEQUENTIAL_SLACK: u64 = 16 << 20;
/// Files at least this large bypass the kernel's page cache on their first open on this node
/// (see [`PageCache::Bypass`]).
pub const BYPASS_MIN: u64 = 64 << 20;

/// What the kernel should do with its cached pages of a file being opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageCache {
    /// Keep them: the same version was opened here before.
    Keep,
    /// Drop them: the version may have changed.
    Fresh,
    /// Read past them. A large file read for the first time on this node streams from the
    /// block cache or a peer straight into the reader's buffer: through the page cache it was
    /// copied twice (into the FUSE file's pages, then out to the reader) and held twice in
    /// memory (there and under the block cache), charged to the reading pod. Measured on a
    /// cold 1 GiB read from a peer, alternated run by run: the mount's time 2.8 -> 1.7 s
    /// (0.82x of `kt get` from the same peer) and its CPU 2.05 -> 1.4 s. Later opens of the
    /// same version go through the page cache, where repeated reads are cheapest; mmap goes
    /// through it always.
    Bypass,
}

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{1}")]
    Io(i32, String),
    #[error("{0}")]
    Other(String),
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Io(e, _) => *e,
            FsError::Other(_) => libc::EIO,
        }
    }

    pub fn new(errno: i32) -> Self {
        FsError::Io(errno, std::io::Error::from_raw_os_error(errno).to_string())
    }
}

impl From<tonic::Status> for FsError {
    fn from(s: tonic::Status) -> Self {
        let errno = s
            .metadata()
            .get(ERRNO_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(match s.code() {
                tonic::Code::NotFound => libc::ENOENT,
                tonic::Code::AlreadyExists => libc::EEXIST,
                tonic::Code::InvalidArgument => libc::EINVAL,
                tonic::Code::PermissionDenied => libc::EACCES,
                _ => libc::EIO,
            });
        FsError::Io(errno, s.message().to_string())
    }
}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        FsError::Io(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
    }
}

impl From<ClientError> for FsError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Rpc(s) => s.into(),
            other => FsError::Io(libc::EIO, other.to_string()),
        }
    }
}

impl From<crate::transfer::TransferError> for FsError {
    fn from(e: crate::transfer::TransferError) -> Self {
        use crate::transfer::TransferError as T;
        match &e {
            T::Write { source, .. } | T::Read { source, .. } => {
                FsError::Io(source.raw_os_error().unwrap_or(libc::EIO), e.to_string())
            }
            _ => FsError::Io(libc::EIO, e.to_string()),
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// What `stat` shows.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub mtime: SystemTime,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
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
}

/// A published file opened for reading: one version, fixed at open.
pub struct ReadFile {
    pub entry: FileEntry,
    pub version: Version,
    pub sources: Vec<SourceAddr>,
    offsets: Vec<u64>,
    next_offset: AtomicU64,
    /// This reader's place in the version's implicit window, left when the file is closed.
    _member: Option<TreeMember>,
}

/// A mount reader's membership of a version's implicit broadcast window: it takes a parent
/// within the fanout like any getter, and gives its slot back when dropped.
struct TreeMember {
    store: Store,
    rt: tokio::runtime::Handle,
    group_id: String,
    generation: u64,
    member: u64,
}

impl Drop for TreeMember {
    fn drop(&mut self) {
        let mut store = self.store.clone();
        let req = LeaveRequest {
            group_id: std::mem::take(&mut self.group_id),
            generation: self.generation,
            member: self.member,
            done: false,
        };
        self.rt.spawn(async move {
            if let Err(e) = store.leave_broadcast(req).await {
                tracing::debug!(error = %e.message(), "could not leave the window");
            }
        });
    }
}

/// The mount's settings.
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub server: String,
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
}

struct Listing {
    at: Instant,
    entries: Arc<BTreeMap<String, ListEntry>>,
}

pub struct FsCore {
    cfg: FsConfig,
    rt: tokio::runtime::Handle,
    store: Store,
    blocks: Arc<AgentBlocks>,
    loader: Loader,
    inodes: Mutex<Inodes>,
    listings: Mutex<HashMap<String, Listing>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    staged: Mutex<HashMap<String, Arc<Staged>>>,
    /// The version each inode showed when last opened, to keep the kernel's page cache only
    /// while it is still right.
    opened_versions: Mutex<HashMap<u64, Version>>,
    /// Versions this node has registered as a location of.
    seeded: Arc<Mutex<HashSet<Version>>>,
    started: SystemTime,
}

fn is_write(h: &Handle) -> bool {
    matches!(h, Handle::Write(_))
}

fn lost_writer() -> FsError {
    FsError::Io(
        libc::EIO,
        "the file was open for writing in an agent that has since restarted".into(),
    )
}

impl Handle {
    fn share(&self) -> Handle {
        match self {
            Handle::Read(r) => Handle::Read(r.clone()),
            Handle::Write(w) => Handle::Write(w.clone()),
            Handle::Dir(d) => Handle::Dir(d.clone()),
        }
    }
}

pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

fn kind_of(k: EntryKind) -> Kind {
    match k {
        EntryKind::File => Kind::File,
        EntryKind::Directory => Kind::Dir,
        EntryKind::Symlink => Kind::Symlink,
    }
}

pub(crate) fn time_of(sec: i64, nsec: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec.min(999_999_999))
    } else {
        UNIX_EPOCH
    }
}

impl FsCore {
    pub fn new(
        cfg: FsConfig,
        rt: tokio::runtime::Handle,
        blocks: Arc<AgentBlocks>,
    ) -> FsResult<Self> {
        Self::with_inodes(cfg, rt, blocks, Inodes::default())
    }

    /// A core over a given inode table (a journaled one, for a mount the keeper holds).
    pub fn with_inodes(
        cfg: FsConfig,
        rt: tokio::runtime::Handle,
        blocks: Arc<AgentBlocks>,
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
            crate::client::store_lazy(&cfg.server)?
        };
        Ok(FsCore {
            loader: Loader::new(blocks.clone()),
            cfg,
            rt,
            store,
            blocks,
            inodes: Mutex::new(inodes),
            listings: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(first_fh),
            staged: Mutex::new(HashMap::new()),
            opened_versions: Mutex::new(HashMap::new()),
            seeded: Arc::new(Mutex::new(HashSet::new())),
            started: SystemTime::now(),
        })
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn store(&self) -> Store {
        self.store.clone()
    }

    fn ns(&self) -> String {
        self.cfg.namespace.to_string()
    }

    /// Checks a path that is about to become a key.
    fn check_key(path: &str) -> FsResult<()> {
        KeyPath::parse(path).map(|_| ()).map_err(|e| {
            let errno = match e {
                crate::key::KeyError::SegmentTooLong(_) | crate::key::KeyError::TooLong => {
                    libc::ENAMETOOLONG
                }
                _ => libc::EINVAL,
            };
            FsError::Io(errno, e.to_string())
        })
    }

    pub(crate) fn path_of(&self, ino: u64) -> FsResult<String> {
        self.inodes
            .lock()
            .ok()
            .and_then(|t| t.path(ino))
            .ok_or_else(|| FsError::new(libc::ESTALE))
    }

    fn ino_of(&self, path: &str) -> u64 {
        self.inodes.lock().map_or(0, |mut t| t.ino(path))
    }

    /// Handles are even for reading and odd for writing, so that a handle this process did not
    /// make (one the kernel kept across an agent restart) still tells what it was.
    fn insert_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(2, Ordering::Relaxed) | u64::from(is_write(&h));
        if let Ok(mut hs) = self.handles.lock() {
            hs.insert(fh, h);
        }
        fh
    }

    fn handle(&self, fh: u64) -> FsResult<Handle> {
        let hs = self.handles.lock().map_err(|_| FsError::new(libc::EIO))?;
        match hs.get(&fh) {
            Some(h) => Ok(h.share()),
            None if fh & 1 == 1 => Err(lost_writer()),
            None => Err(FsError::new(libc::EBADF)),
        }
    }

    /// A handle from an agent that ran before on this mount (a kept mount, see
    /// `crate::keeper`). A reader's is opened again, on the version the key has now; a
    /// writer's staged bytes died with that agent.
    fn reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        let h = if dir {
            Handle::Dir(self.snapshot_dir(ino)?)
        } else {
            Handle::Read(Arc::new(self.resolve_file(&self.path_of(ino)?)?))
        };
        if let Ok(mut hs) = self.handles.lock() {
            hs.insert(fh, h.share());
        }
        tracing::debug!(ino, fh, "reopened a handle of an earlier agent");
        Ok(h)
    }

    fn handle_or_reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        match self.handle(fh) {
            Err(e) if e.errno() == libc::EBADF => self.reopen(ino, fh, dir),
            other => other,
        }
    }

    /// Forgets cached listings of `paths`, after this mount changed them.
    pub(crate) fn invalidate(&self, paths: &[&str]) {
        if let Ok(mut l) = self.listings.lock() {
            for p in paths {
                l.remove(*p);
            }
        }
    }

    fn fetch_listing(&self, path: &str) -> FsResult<Arc<BTreeMap<String, ListEntry>>> {
        let mut store = self.store();
        let resp = self
            .block_on(store.list(ListRequest {
                namespace: self.ns(),
                prefix: path.to_string(),
                recursive: false,
            }))?
            .into_inner();
        if !resp.exists && !path.is_empty() {
            return Err(FsError::new(libc::ENOENT));
        }
        let entries: BTreeMap<String, ListEntry> = resp
            .entries
            .into_iter()
            .map(|e| (e.name.trim_end_matches('/').to_string(), e))
            .collect();
        let entries = Arc::new(entries);
        if let Ok(mut l) = self.listings.lock() {
            l.insert(
                path.to_string(),
                Listing {
                    at: Instant::now(),
                    entries: entries.clone(),
                },
            );
        }
        Ok(entries)
    }

    fn listing(&self, path: &str) -> FsResult<Arc<BTreeMap<String, ListEntry>>> {
        if let Ok(l) = self.listings.lock() {
            if let Some(x) = l.get(path) {
                if x.at.elapsed() < LISTING_TTL {
                    return Ok(x.entries.clone());
                }
            }
        }
        self.fetch_listing(path)
    }

    fn root_attr(&self) -> Attr {
        Attr {
            ino: inode::ROOT,
            kind: Kind::Dir,
            size: 0,
            perm: 0o755,
            mtime: self.started,
            nlink: 2,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
        }
    }

    fn attr_from_entry(&self, ino: u64, e: &ListEntry) -> Attr {
        let kind = kind_of(e.kind());
        let perm = if e.mode == 0 {
            if kind == Kind::Dir {
                0o755
            } else {
                0o644
            }
        } else {
            (e.mode & 0o7777) as u16
        };
        Attr {
            ino,
            kind,
            size: match kind {
                Kind::File => e.size,
                Kind::Symlink => e.symlink_target.len() as u64,
                Kind::Dir => 0,
            },
            perm,
            mtime: if e.mtime_sec == 0 && e.mtime_nsec == 0 {
                self.started
            } else {
                time_of(e.mtime_sec, e.mtime_nsec)
            },
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid: self.cfg.uid,
            gid: self.cfg.gid,
        }
    }

    /// The listing entry of `path`, from its parent's listing.
    fn entry(&self, path: &str) -> FsResult<ListEntry> {
        let (parent, name) = split(path);
        self.listing(parent)?
            .get(name)
            .cloned()
            .ok_or_else(|| FsError::new(libc::ENOENT))
    }

    /// The attributes of `path`: an open staged write if there is one, else what the store shows.
    pub fn stat_path(&self, path: &str) -> FsResult<Attr> {
        if path.is_empty() {
            return Ok(self.root_attr());
        }
        if let Some(s) = self.staged_at(path) {
            return s.attr(self.ino_of(path), self.cfg.uid, self.cfg.gid);
        }
        let e = self.entry(path)?;
        Ok(self.attr_from_entry(self.ino_of(path), &e))
    }

    pub fn lookup(&self, parent: u64, name: &str) -> FsResult<Attr> {
        let path = join(&self.path_of(parent)?, name);
        let mut attr = self.stat_path(&path)?;
        attr.ino = self
            .inodes
            .lock()
            .map_err(|_| FsError::new(libc::EIO))?
            .lookup(&path);
        Ok(attr)
    }

    pub fn forget(&self, ino: u64, n: u64) {
        if let Ok(mut t) = self.inodes.lock() {
            t.forget(ino, n);
        }
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let path = self.path_of(ino)?;
        let mut a = self.stat_path(&path)?;
        a.ino = ino;
        Ok(a)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<String> {
        let e = self.entry(&self.path_of(ino)?)?;
        if e.kind() != EntryKind::Symlink {
            return Err(FsError::new(libc::EINVAL));
        }
        Ok(e.symlink_target)
    }

    /// Snapshots a directory for a sequence of `readdir` calls.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let entries = self.snapshot_dir(ino)?;
        Ok(self.insert_handle(Handle::Dir(entries)))
    }

    fn snapshot_dir(&self, ino: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        let path = self.path_of(ino)?;
        if !path.is_empty() && self.stat_path(&path)?.kind != Kind::Dir {
            return Err(FsError::new(libc::ENOTDIR));
        }
        let listing = self.fetch_listing(&path)?;
        let mut entries: BTreeMap<String, DirEntry> = listing
            .iter()
            .map(|(name, e)| {
                let p = join(&path, name);
                (
                    name.clone(),
                    DirEntry {
                        ino: self.ino_of(&p),
                        kind: kind_of(e.kind()),
                        name: name.clone(),
                    },
                )
            })
            .collect();
        // Files being written here show before they are published.
        for p in self.staged_paths() {
            let (parent, name) = split(&p);
            if parent == path {
                entries.entry(name.to_string()).or_insert_with(|| DirEntry {
                    ino: self.ino_of(&p),
                    kind: Kind::File,
                    name: name.to_string(),
                });
            }
        }
        Ok(Arc::new(entries.into_values().collect()))
    }

    /// Entries of an open directory from `offset` on (`.` and `..` first).
    pub fn readdir(&self, ino: u64, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        let Handle::Dir(entries) = self.handle_or_reopen(ino, fh, true)? else {
            return Err(FsError::new(libc::EBADF));
        };
        let path = self.path_of(ino)?;
        let parent_ino = if path.is_empty() {
            inode::ROOT
        } else {
            self.ino_of(split(&path).0)
        };
        let dots = [
            DirEntry {
                ino,
                kind: Kind::Dir,
                name: ".".into(),
            },
            DirEntry {
                ino: parent_ino,
                kind: Kind::Dir,
                name: "..".into(),
            },
        ];
        Ok(dots
            .into_iter()
            .chain(entries.iter().cloned())
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e))
            .collect())
    }

    pub fn release(&self, fh: u64) -> FsResult<()> {
        let h = self.handles.lock().ok().and_then(|mut hs| hs.remove(&fh));
        match h {
            Some(Handle::Write(s)) => self.release_staged(&s),
            // Nothing to release for a handle of an earlier agent either.
            _ => Ok(()),
        }
    }

    /// Opens a file. Reads resolve the version now (close-to-open); writes stage.
    /// Returns the handle and what the kernel should do with its cached pages of the file.
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, PageCache)> {
        let path = self.path_of(ino)?;
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            if self.cfg.read_only {
                return Err(FsError::new(libc::EROFS));
            }
            let s = self.open_staged(&path, flags & libc::O_TRUNC != 0)?;
            return Ok((self.insert_handle(Handle::Write(s)), PageCache::Fresh));
        }
        if let Some(s) = self.staged_at(&path) {
            s.opens.fetch_add(1, Ordering::SeqCst);
            return Ok((self.insert_handle(Handle::Write(s)), PageCache::Fresh));
        }
        let file = self.resolve_file(&path)?;
        let keep = self
            .opened_versions
            .lock()
            .map(|mut v| v.insert(ino, file.version) == Some(file.version))
            .unwrap_or(false);
        let cache = if keep {
            PageCache::Keep
        } else if file.entry.size >= BYPASS_MIN {
            PageCache::Bypass
        } else {
            PageCache::Fresh
        };
        Ok((self.insert_handle(Handle::Read(Arc::new(file))), cache))
    }

    fn resolve_file(&self, path: &str) -> FsResult<ReadFile> {
        let mut store = self.store();
        let r = self
            .block_on(store.resolve(ResolveRequest {
                namespace: self.ns(),
                key: path.to_string(),
                inline_up_to: crate::server::MAX_INLINE_FILE,
            }))?
            .into_inner();
        let m = r.manifest.clone().ok_or_else(|| FsError::new(libc::EIO))?;
        manifest::validate(&m).map_err(|e| FsError::Io(libc::EIO, e.to_string()))?;
        let entry = m
            .entries
            .into_iter()
            .next()
            .ok_or_else(|| FsError::new(libc::EIO))?;
        match entry.kind() {
            EntryKind::File => {}
            EntryKind::Directory => return Err(FsError::new(libc::EISDIR)),
            EntryKind::Symlink => return Err(FsError::new(libc::ELOOP)),
        }
        let version = Version::from_slice(&r.version).ok_or_else(|| FsError::new(libc::EIO))?;
        self.take_inline(&entry, version, r.inline_blocks);
        let mut sources: Vec<SourceAddr> = crate::get::order_sources(
            &r.sources,
            &self.cfg.node_id,
            &self.cfg.zone,
            &self.cfg.server,
        )
        .into_iter()
        .filter(|s| s.label != self.cfg.node_id)
        .collect();
        // Files of more than one block are read through the version's window, like `kt get`:
        // the parent it assigns goes first, so readers spread over the sources within the
        // fanout; the other sources stay behind it for failover. A one-block file is one
        // request, not worth two more.
        let member = if entry.blocks.len() > 1 {
            self.join_tree(&r.key, version)
        } else {
            None
        };
        if let Some((_, parent)) = member.as_ref().filter(|(_, p)| p.label != self.cfg.node_id) {
            sources.retain(|s| s.label != parent.label || s.addr != parent.addr);
            sources.insert(0, parent.clone());
        }
        let mut offsets = Vec::with_capacity(entry.blocks.len());
        let mut off = 0u64;
        for b in &entry.blocks {
            offsets.push(off);
            off += u64::from(b.len);
        }
        Ok(ReadFile {
            entry,
            version,
            sources,
            offsets,
            next_offset: AtomicU64::new(0),
            _member: member.map(|(m, _)| m),
        })
    }

    /// Joins the implicit window of `version` as a reader that serves no children of its own
    /// (it holds only what it read); a failure to join only loses the spreading.
    fn join_tree(&self, key: &str, version: Version) -> Option<(TreeMember, SourceAddr)> {
        let mut store = self.store();
        let joined = self
            .block_on(store.join_broadcast(JoinRequest {
                namespace: self.ns(),
                key: key.to_string(),
                version: version.0.to_vec(),
                window: Some(WindowSpec {
                    group_id: crate::broadcast::implicit_group(&version),
                    fanout: self.cfg.fanout,
                    ..Default::default()
                }),
                role: Role::Getter as i32,
                node_id: self.cfg.node_id.clone(),
                serves: false,
                ip: String::new(),
                wait_quorum: false,
            }))
            .map_err(|e| tracing::debug!(error = %e.message(), "no window for this read"))
            .ok()?
            .into_inner();
        let window = joined.window.unwrap_or_default();
        let member = TreeMember {
            store: self.store(),
            rt: self.rt.clone(),
            group_id: window.group_id,
            generation: window.generation,
            member: joined.member,
        };
        let parent = crate::get::source_addr(&joined.parent?, &self.cfg.server);
        Some((member, parent))
    }

    /// Keeps the blocks a resolve sent inline (a small file), so its reads need no fetch. Only
    /// blocks of the entry are taken; one that fails its hash is dropped (the read fetches it).
    fn take_inline(&self, entry: &FileEntry, version: Version, blocks: Vec<InlineBlock>) {
        let mut took = false;
        for b in blocks {
            let Some(hash) = BlockHash::from_slice(&b.hash) else {
                continue;
            };
            if !entry.blocks.iter().any(|e| e.hash == b.hash) || self.blocks.cache().contains(&hash)
            {
                continue;
            }
            match self.loader.accept(hash, Bytes::from(b.data)) {
                Ok(()) => took = true,
                Err(e) => tracing::warn!(error = %e, "inline block dropped"),
            }
        }
        if took {
            // The hook spawns its registration: it needs the runtime's context, which a FUSE
            // thread has only inside `block_on`.
            let _in_runtime = self.rt.enter();
            self.seed_hook(version)();
        }
    }

    fn job(f: &ReadFile, i: usize) -> FsResult<BlockJob> {
        let b = &f.entry.blocks[i];
        let hash = BlockHash::from_slice(&b.hash).ok_or_else(|| FsError::new(libc::EIO))?;
        Ok(BlockJob {
            hash,
            len: b.len,
            targets: Vec::new(),
        })
    }

    /// Registers this node as a location of `version` once, in the background: a reader
    /// becomes a source.
    fn seed_hook(&self, version: Version) -> impl FnOnce() + Send + 'static {
        let seeded = self.seeded.clone();
        let mut store = self.store();
        let node = self.cfg.node_id.clone();
        move || {
            if !seeded.lock().is_ok_and(|mut s| s.insert(version)) {
                return;
            }
            tokio::spawn(async move {
                let r = store
                    .add_location(AddLocationRequest {
                        version: version.0.to_vec(),
                        node_id: node,
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e.message(), "could not register as a source");
                }
            });
        }
    }

    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let f = match self.handle_or_reopen(ino, fh, false)? {
            Handle::Read(f) => f,
            Handle::Write(s) => return s.read(offset, size).map(Bytes::from),
            Handle::Dir(_) => return Err(FsError::new(libc::EISDIR)),
        };
        let file_size = f.entry.size;
        if offset >= file_size || size == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + u64::from(size)).min(file_size);
        let first = f.offsets.partition_point(|&o| o <= offset) - 1;
        let last = f.offsets.partition_point(|&o| o < end) - 1;
        // The kernel's readahead sends neighbouring requests on several threads, so they arrive
        // slightly out of order: near the previous end still counts as sequential.
        let prev_end = f.next_offset.swap(end, Ordering::Relaxed);
        let sequential = offset.abs_diff(prev_end) <= SEQUENTIAL_SLACK;
        self.block_on(async {
            if sequential || offset == 0 {
                let ahead: Vec<BlockJob> = (last + 1
                    ..(last + 1 + READAHEAD_BLOCKS).min(f.offsets.len()))
                    .map(|i| Self::job(&f, i))
                    .collect::<FsResult<_>>()?;
                self.loader
                    .prefetch(ahead, &f.sources, self.seed_hook(f.version));
            }
            // A read within one block (the common case: 1 MiB requests, 4 MiB blocks) is a
            // slice of that block, not a copy.
            let mut parts = Vec::with_capacity(last - first + 1);
            for i in first..=last {
                let data = self
                    .loader
                    .block(&Self::job(&f, i)?, &f.sources, self.seed_hook(f.version))
                    .await?;
                let start = f.offsets[i];
                let lo = offset.max(start) - start;
                let hi = end.min(start + data.len() as u64) - start;
                parts.push(data.slice(lo as usize..hi as usize));
            }
            if parts.len() == 1 {
                return Ok(parts.swap_remove(0));
            }
            let mut out = bytes::BytesMut::with_capacity((end - offset) as usize);
            for p in parts {
                out.extend_from_slice(&p);
            }
            Ok::<Bytes, FsError>(out.freeze())
        })
    }

    pub fn statfs(&self) -> FsResult<libc::statvfs> {
        let path = std::ffi::CString::new(self.cfg.staging.as_os_str().as_encoded_bytes())
            .map_err(|_| FsError::new(libc::EINVAL))?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a valid C string and `st` a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(st)
    }
}
