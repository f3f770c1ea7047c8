//! A published file opened for reading: one version, fixed at `open` (close-to-open), with
//! where its blocks lie and where they come from; what the kernel should do with its cached
//! pages; and which blocks a read covers.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::loader::Route;
use crate::blocks::pins::Pin;
use crate::broadcast::member::membership::Membership;
use crate::dataplane::fetch::BlockJob;
use crate::fs::error::{FsError, FsResult};
use crate::hash::{BlockHash, Version};
use crate::manifest::{self, EntryKind, FileEntry};
use crate::proto::ResolveResponse;

/// Blocks fetched ahead of a sequential reader.
pub(crate) const READAHEAD_BLOCKS: usize = 8;
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
    pub(crate) route: Route,
    pub(crate) offsets: Vec<u64>,
    pub(crate) next_offset: AtomicU64,
    /// Keeps the version from garbage collection while the file is open, though its key be
    /// removed or replaced meanwhile.
    pub(crate) _pin: Pin,
}

impl ReadFile {
    pub(crate) fn job(&self, i: usize) -> FsResult<BlockJob> {
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
    pub(crate) fn slice(&self, i: usize, data: Bytes, offset: u64, end: u64) -> FsResult<Bytes> {
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

/// The blocks a read covers, `first..=last`, up to `end` (the read's end within the file), and
/// whether the blocks after them are to be fetched ahead.
pub(crate) struct Span {
    pub(crate) first: usize,
    pub(crate) last: usize,
    pub(crate) end: u64,
    pub(crate) read_ahead: bool,
}

impl ReadFile {
    /// The span of a read of `size` bytes at `offset` (`None`: past the end, or empty).
    pub(crate) fn span(&self, offset: u64, size: u32) -> FsResult<Option<Span>> {
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
    pub(crate) fn read_to(&self, end: u64) {
        self.next_offset.store(end, Ordering::Relaxed);
    }
}

/// The parts of a read, in order, as one buffer: a read within one block (the common case: 1 MiB
/// requests, 4 MiB blocks) is a slice of that block, not a copy.
pub(crate) fn joined(parts: impl Iterator<Item = FsResult<Bytes>>, len: u64) -> FsResult<Bytes> {
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
pub(crate) fn file_entry(r: &ResolveResponse) -> FsResult<FileEntry> {
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
