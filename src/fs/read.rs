//! The read side of the mount: a published file opened for reading is one version, resolved at
//! `open` (close-to-open), and read block by block through the [`Loader`](super::loader).
//!
//! A file of more than one block is read through the version's implicit broadcast window, as
//! `kt get` reads: the reader joins at open, fetches from the source the window assigns (and is
//! given another when that one fails), and leaves when the file is closed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::loader::Route;
use super::{FsCore, FsError, FsResult, Handle};
use crate::blocks::pins::Pin;
use crate::broadcast::member::membership::{JoinSpec, Membership};
use crate::dataplane::fetch::BlockJob;
use crate::dataplane::sources::{order_sources, NodeRef};
use crate::hash::{BlockHash, Version};
use crate::locks::lock;
use crate::manifest::{self, EntryKind, FileEntry};
use crate::proto::{
    AddLocationRequest, InlineBlock, Locale, ResolveManyRequest, ResolveRequest, ResolveResponse,
    ResolveResult, WindowSpec,
};
use crate::rpc::{implicit_group, ClientError, MAX_INLINE_FILE};

/// Small files of a directory resolved with the one being opened, at most, and their bytes.
const RESOLVE_AHEAD: usize = 63;
const RESOLVE_AHEAD_BYTES: u64 = 768 << 10;
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
    /// Go straight to the filesystem for every read and write, whatever the file's size says:
    /// a GPU control file, whose contents are made when read.
    Direct,
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

/// A published file opened for reading: one version, fixed at open.
pub struct ReadFile {
    pub entry: FileEntry,
    pub version: Version,
    /// Where its blocks come from.
    pub(super) route: Route,
    pub(super) offsets: Vec<u64>,
    next_offset: AtomicU64,
    /// Keeps the version from garbage collection while the file is open, though its key be
    /// removed or replaced meanwhile.
    _pin: Pin,
}

impl ReadFile {
    pub(super) fn job(&self, i: usize) -> FsResult<BlockJob> {
        let b = self
            .entry
            .blocks
            .get(i)
            .ok_or_else(|| FsError::BadManifest(format!("no block {i}")))?;
        let hash = BlockHash::from_slice(&b.hash)
            .ok_or_else(|| FsError::BadManifest(format!("block {i} has a malformed hash")))?;
        Ok(BlockJob {
            hash,
            len: b.len,
            targets: Vec::new(),
            piece: None,
        })
    }

    /// The part of block `i` (`data`, of the manifest's length) that `offset..end` covers; a
    /// slice out of range would panic, so it is an error instead.
    fn slice(&self, i: usize, data: Bytes, offset: u64, end: u64) -> FsResult<Bytes> {
        let start = self
            .offsets
            .get(i)
            .copied()
            .ok_or_else(|| FsError::BadManifest(format!("no block {i}")))?;
        let lo = offset.max(start) - start;
        let hi = end.min(start + data.len() as u64).saturating_sub(start);
        if lo > hi || hi > data.len() as u64 {
            return Err(FsError::BadManifest(format!(
                "block {i} ({} bytes) does not cover {offset}..{end}",
                data.len()
            )));
        }
        Ok(data.slice(lo as usize..hi as usize))
    }

    /// The reader's place in the version's window, if it joined one.
    pub fn membership(&self) -> Option<&Membership> {
        self.route.member.as_deref()
    }
}

impl FsCore {
    /// Opens a file. Reads resolve the version now (close-to-open); writes stage.
    /// Returns the handle and what the kernel should do with its cached pages of the file.
    pub async fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, PageCache)> {
        self.open_by(ino, flags, std::process::id()).await
    }

    /// [`FsCore::open`] for the process `caller` (whose GPU buffers a control file reaches).
    pub async fn open_by(&self, ino: u64, flags: i32, caller: u32) -> FsResult<(u64, PageCache)> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_OPEN_SECONDS);
        let path = self.path_of(ino).await?;
        if let Some(rest) = super::gpu_tree::gpu_rest(&path) {
            if rest.is_empty() {
                return Err(FsError::IsDir);
            }
            self.writable()?;
            return self.gpu_open(rest, caller, false).await;
        }
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.writable()?;
            let s = self.open_staged(&path, flags & libc::O_TRUNC != 0).await?;
            return Ok((self.insert_handle(Handle::Write(s)), PageCache::Fresh));
        }
        if let Some(s) = self.staged_at(&path) {
            s.opens.fetch_add(1, Ordering::SeqCst);
            return Ok((self.insert_handle(Handle::Write(s)), PageCache::Fresh));
        }
        let file = self.resolve_file(&path).await?;
        if let Ok(a) = self.stat_path(&path).await {
            self.accessed(ino, &a);
        }
        let keep = lock(&self.opened_versions).insert(ino, file.version) == Some(file.version);
        let cache = if keep {
            PageCache::Keep
        } else if file.entry.size >= BYPASS_MIN {
            PageCache::Bypass
        } else {
            PageCache::Fresh
        };
        Ok((self.insert_handle(Handle::Read(Arc::new(file))), cache))
    }

    /// The handle of an open file (for tests and tools: a reader's window, say).
    pub fn read_file(&self, fh: u64) -> FsResult<Arc<ReadFile>> {
        match self.handle(fh)? {
            Handle::Read(f) => Ok(f),
            _ => Err(FsError::BadHandle),
        }
    }

    pub(super) async fn resolve_file(&self, path: &str) -> FsResult<ReadFile> {
        // Under the watch's lease an unchanged file opens with no request: a change of it is
        // told (and forgets this) before its writer is answered.
        let since = self.listings.epoch();
        let (r, inline) = match self.listings.resolved(path) {
            Some(r) => (r, Vec::new()),
            None => self.ask_resolve(path, since).await?,
        };
        let entry = file_entry(&r)?;
        let version = Version::from_slice(&r.version)
            .ok_or_else(|| FsError::BadManifest("malformed version".into()))?;
        self.take_inline(&entry, inline);
        if self.may_keep(&r) {
            self.listings.put_resolved(path, r.clone(), since);
        }
        let node_ticket = self.cfg.node_ticket.get();
        let ticket = match node_ticket {
            t if t.is_empty() => bytes::Bytes::copy_from_slice(&r.ticket),
            t => t,
        };
        let fallback = order_sources(
            &r.sources,
            &self.cfg.node_id,
            &self.cfg.zone,
            &self.cfg.server,
            &ticket,
        )
        .into_iter()
        .filter(|s| s.label != self.cfg.node_id)
        .collect();
        // A one-block file is one request, not worth joining a window for.
        let member = if entry.blocks.len() > 1 {
            self.join_window(&r.key, version, ticket)
                .await
                .map(Arc::new)
        } else {
            None
        };
        let mut offsets = Vec::with_capacity(entry.blocks.len());
        let mut off = 0u64;
        for b in &entry.blocks {
            offsets.push(off);
            off += u64::from(b.len);
        }
        Ok(ReadFile {
            entry,
            version,
            route: Route {
                member,
                fallback,
                own: self.cfg.node_id.clone(),
            },
            offsets,
            next_offset: AtomicU64::new(0),
            _pin: self.blocks.pins().pin(version),
        })
    }

    /// Joins the implicit window of `version` as a reader: in the version's swarm it fetches
    /// the blocks it reads (lowest first, from any member that holds them) and serves what it
    /// read; a failure to join only loses the spreading.
    async fn join_window(
        &self,
        key: &str,
        version: Version,
        ticket: bytes::Bytes,
    ) -> Option<Membership> {
        let spec = JoinSpec {
            namespace: self.cfg.namespace.as_str(),
            key,
            version,
            window: WindowSpec {
                group_id: implicit_group(&version),
                fanout: self.cfg.fanout,
                ..Default::default()
            },
            node: Some(NodeRef {
                node_id: self.cfg.node_id.clone(),
                ip: String::new(),
            }),
            // The agent serves its block cache: what this reader fetched, others may fetch
            // from it.
            serves: true,
            reads: true,
            ticket,
        };
        Membership::join(&self.store, &self.cfg.server, spec)
            .await
            .map_err(|e| tracing::debug!(error = %e, "no window for this read"))
            .ok()
    }

    /// Asks the store server for `path`'s version. Under the lease, the small files that
    /// follow it in its directory are asked for with it (one `ResolveMany`), their bytes
    /// inline: a reader going through a directory of small files then opens most of them with
    /// no request of its own. Measured in bench/fuse.sh (c), first read of 10,000 files on
    /// another node.
    async fn ask_resolve(
        &self,
        path: &str,
        since: u64,
    ) -> FsResult<(Arc<ResolveResponse>, Vec<InlineBlock>)> {
        crate::metrics::MOUNT_METADATA_REQUESTS.inc();
        let mut store = self.store();
        let next = self
            .listings
            .next_small_files(path, RESOLVE_AHEAD, RESOLVE_AHEAD_BYTES);
        if !next.is_empty() {
            let mut keys = Vec::with_capacity(next.len() + 1);
            keys.push(path.to_string());
            keys.extend(next);
            let asked = store
                .resolve_many(ResolveManyRequest {
                    watcher: self.listings.watcher(),
                    namespace: self.ns(),
                    keys: keys.clone(),
                    inline_up_to: MAX_INLINE_FILE,
                })
                .await;
            match asked {
                Ok(resp) => return self.took_many(&keys, resp.into_inner().results, since),
                // A server older than the call: one at a time, as before it.
                Err(s) if s.code() == tonic::Code::Unimplemented => {}
                Err(s) => return Err(ClientError::from(s).into()),
            }
        }
        let mut r = store
            .resolve(ResolveRequest {
                watcher: self.listings.watcher(),
                namespace: self.ns(),
                key: path.to_string(),
                inline_up_to: MAX_INLINE_FILE,
            })
            .await
            .map_err(ClientError::from)?
            .into_inner();
        let inline = std::mem::take(&mut r.inline_blocks);
        Ok((Arc::new(r), inline))
    }

    /// The first of a `ResolveMany`'s answers, for the caller to open; the others are kept
    /// (with their bytes in the block cache) for the opens that follow.
    fn took_many(
        &self,
        keys: &[String],
        results: Vec<ResolveResult>,
        since: u64,
    ) -> FsResult<(Arc<ResolveResponse>, Vec<InlineBlock>)> {
        if results.len() != keys.len() {
            return Err(FsError::BadManifest(format!(
                "{} answers to {} keys",
                results.len(),
                keys.len()
            )));
        }
        let mut results = results.into_iter();
        let first = results.next().ok_or(FsError::NotFound)?;
        for (key, res) in keys[1..].iter().zip(results) {
            if let Some(r) = res.resolved {
                self.keep_ahead(key, r, since);
            }
        }
        match first.resolved {
            Some(mut r) => {
                let inline = std::mem::take(&mut r.inline_blocks);
                Ok((Arc::new(r), inline))
            }
            None => {
                let status = tonic::Status::new(tonic::Code::from(first.code), first.message);
                Err(ClientError::from(status).into())
            }
        }
    }

    /// Keeps a version resolved ahead of its open, once its bytes are here: a kept version
    /// whose bytes are not would cost its reader a fetch, where a resolve of its own would
    /// have brought them inline. Anything odd in it is left for its own open to find.
    fn keep_ahead(&self, path: &str, mut r: ResolveResponse, since: u64) {
        let Ok(entry) = file_entry(&r) else {
            return;
        };
        let inline = std::mem::take(&mut r.inline_blocks);
        self.take_inline(&entry, inline);
        let cache = self.blocks.cache();
        let here = entry
            .blocks
            .iter()
            .all(|b| BlockHash::from_slice(&b.hash).is_some_and(|h| cache.contains(&h)));
        if (here || r.locale() != Locale::Store) && self.may_keep(&r) {
            self.listings.put_resolved(path, Arc::new(r), since);
        }
    }

    /// Whether a resolved version may be kept under the lease: an expiry is not told to
    /// watchers, and a read ticket runs out (the node's own ticket lasts as long as the node),
    /// so such answers are asked for at every open.
    fn may_keep(&self, r: &ResolveResponse) -> bool {
        r.expires_unix_ms == 0 && (!self.cfg.node_ticket.get().is_empty() || r.ticket.is_empty())
    }

    /// Keeps the blocks a resolve sent inline (a small file), so its reads need no fetch. Only
    /// blocks of the entry are taken; one that fails its hash is dropped (the read fetches it).
    /// The node does not register as a source of them: the store sends a small file's bytes
    /// inline to every reader, so no one would ask this node, and the registration cost the
    /// server a write per file read.
    fn take_inline(&self, entry: &FileEntry, blocks: Vec<InlineBlock>) {
        for b in blocks {
            let Some(hash) = BlockHash::from_slice(&b.hash) else {
                continue;
            };
            if !entry.blocks.iter().any(|e| e.hash == b.hash) || self.blocks.cache().contains(&hash)
            {
                continue;
            }
            if let Err(e) = self.loader.accept(hash, Bytes::from(b.data)) {
                tracing::warn!(error = %e, "inline block dropped");
            }
        }
    }

    /// Registers this node as a location of `version` once, in the background: a reader
    /// becomes a source.
    pub(super) fn seed_hook(&self, version: Version) -> impl FnOnce() + Send + 'static {
        let seeded = self.seeded.clone();
        let mut store = self.store();
        let node = self.cfg.node_id.clone();
        move || {
            if !lock(&seeded).insert(version) {
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

    /// A read answered at once, on the caller's thread, where it needs no wait: a file being
    /// written here, or blocks this node holds (a cached small file's read is one lookup,
    /// without a hop to the runtime and back). `None`: it needs [`FsCore::read`].
    pub fn read_ready(
        &self,
        _ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Option<FsResult<Bytes>> {
        let f = match self.handle(fh) {
            Ok(Handle::Read(f)) => f,
            Ok(Handle::Write(s)) => return Some(s.read(offset, size).map(Bytes::from)),
            Ok(Handle::Dir(_)) => return Some(Err(FsError::IsDir)),
            // A control file's contents, and a handle of an earlier agent, are made anew.
            Ok(Handle::Gpu(_)) | Err(FsError::BadHandle) => return None,
            Err(e) => return Some(Err(e)),
        };
        let span = match f.span(offset, size) {
            Ok(Some(span)) if !span.read_ahead => span,
            Ok(Some(_)) => return None,
            Ok(None) => return Some(Ok(Bytes::new())),
            Err(e) => return Some(Err(e)),
        };
        let held: Option<Vec<Bytes>> = match (span.first..=span.last)
            .map(|i| self.loader.held(&f.job(i)?))
            .collect::<FsResult<_>>()
        {
            Ok(held) => held,
            Err(e) => return Some(Err(e)),
        };
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_READ_SECONDS);
        f.read_to(span.end);
        let parts = (span.first..=span.last)
            .zip(held?)
            .map(|(i, b)| f.slice(i, b, offset, span.end));
        Some(joined(parts, span.end - offset))
    }

    pub async fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_READ_SECONDS);
        let f = match self.handle_or_reopen(ino, fh, false).await? {
            Handle::Read(f) => f,
            Handle::Write(s) => return s.read(offset, size).map(Bytes::from),
            Handle::Dir(_) => return Err(FsError::IsDir),
            Handle::Gpu(cf) => return Ok(Bytes::from(self.gpu.read(&cf, offset, size).await?)),
        };
        let Some(span) = f.span(offset, size)? else {
            return Ok(Bytes::new());
        };
        f.read_to(span.end);
        if span.read_ahead {
            let ahead: Vec<BlockJob> = (span.last + 1
                ..(span.last + 1 + READAHEAD_BLOCKS).min(f.offsets.len()))
                .map(|i| f.job(i))
                .collect::<FsResult<_>>()?;
            self.loader
                .prefetch(ahead, &f.route, self.seed_hook(f.version));
        }
        let mut parts = Vec::with_capacity(span.last - span.first + 1);
        for i in span.first..=span.last {
            let data = self
                .loader
                .block(&f.job(i)?, &f.route, self.seed_hook(f.version))
                .await?;
            parts.push(f.slice(i, data, offset, span.end));
        }
        joined(parts.into_iter(), span.end - offset)
    }
}

/// The blocks a read covers, `first..=last`, up to `end` (the read's end within the file), and
/// whether the blocks after them are to be fetched ahead.
struct Span {
    first: usize,
    last: usize,
    end: u64,
    read_ahead: bool,
}

impl ReadFile {
    /// The span of a read of `size` bytes at `offset` (`None`: past the end, or empty).
    fn span(&self, offset: u64, size: u32) -> FsResult<Option<Span>> {
        let file_size = self.entry.size;
        if offset >= file_size || size == 0 {
            return Ok(None);
        }
        let end = offset.saturating_add(u64::from(size)).min(file_size);
        // The manifest was validated (its blocks add up to its size), so some block covers
        // every offset below the size; checked all the same, since the manifest came from afar.
        let uncovered = || FsError::BadManifest(format!("no block covers offset {offset}"));
        let first = self
            .offsets
            .partition_point(|&o| o <= offset)
            .checked_sub(1)
            .ok_or_else(uncovered)?;
        let last = self
            .offsets
            .partition_point(|&o| o < end)
            .checked_sub(1)
            .ok_or_else(uncovered)?;
        // The kernel's readahead sends neighbouring requests on several threads, so they arrive
        // slightly out of order: near the previous end still counts as sequential.
        let prev_end = self.next_offset.load(Ordering::Relaxed);
        let sequential = offset.abs_diff(prev_end) <= SEQUENTIAL_SLACK;
        let read_ahead = (sequential || offset == 0) && last + 1 < self.offsets.len();
        Ok(Some(Span {
            first,
            last,
            end,
            read_ahead,
        }))
    }

    /// A read up to `end` was answered: where the next sequential one starts.
    fn read_to(&self, end: u64) {
        self.next_offset.store(end, Ordering::Relaxed);
    }
}

/// The parts of a read, in order, as one buffer: a read within one block (the common case: 1 MiB
/// requests, 4 MiB blocks) is a slice of that block, not a copy.
fn joined(parts: impl Iterator<Item = FsResult<Bytes>>, len: u64) -> FsResult<Bytes> {
    let mut parts = parts.peekable();
    let first = parts.next().transpose()?.unwrap_or_default();
    if parts.peek().is_none() {
        return Ok(first);
    }
    let mut out = bytes::BytesMut::with_capacity(len as usize);
    out.extend_from_slice(&first);
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out.freeze())
}

/// The one file a resolve's manifest describes, checked.
fn file_entry(r: &ResolveResponse) -> FsResult<FileEntry> {
    let m = r
        .manifest
        .clone()
        .ok_or_else(|| FsError::BadManifest("the resolve carried none".into()))?;
    manifest::validate(&m).map_err(|e| FsError::BadManifest(e.to_string()))?;
    let entry = m
        .entries
        .into_iter()
        .next()
        .ok_or_else(|| FsError::BadManifest("it has no entries".into()))?;
    match entry.kind() {
        EntryKind::File => Ok(entry),
        EntryKind::Directory => Err(FsError::IsDir),
        EntryKind::Symlink => Err(FsError::IsSymlink),
        EntryKind::Gpu => Err(FsError::NotFound),
        _ => Err(FsError::Invalid("not a regular file".into())),
    }
}
