//! Reading part of a published file into memory, with no mount and no destination file: only
//! the blocks that cover the range are fetched (nearest source first, verified like every
//! block), then sliced. What the Python package's fsspec files read with; and `stat`, what a
//! path is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use indicatif::ProgressBar;

use super::TransferError;
use crate::dataplane::fetch::{self, BlockJob, BlockSink};
use crate::dataplane::peers::Peers;
use crate::dataplane::sources::order_sources;
use crate::key::KeyPath;
use crate::locks::lock;
use crate::manifest::{self, EntryKind, ManifestError};
use crate::proto::{ListRequest, ResolveRequest};
use crate::rpc::{ClientError, Fault, Store};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDir(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

impl ReadError {
    pub fn fault(&self) -> Fault {
        match self {
            ReadError::NotFound(_) => Fault::NotFound,
            ReadError::IsDir(_) => Fault::IsDir,
            ReadError::Client(e) => e.fault(),
            ReadError::Manifest(_) => Fault::Internal,
            ReadError::Transfer(t) => t.fault(),
        }
    }
}

/// What a read gave.
#[derive(Debug, Clone)]
pub struct RangeRead {
    pub data: Bytes,
    /// Blocks that crossed the network for it.
    pub blocks_fetched: usize,
}

/// What is at a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stat {
    File { size: u64, mtime_sec: i64 },
    Directory,
    Symlink { target: String },
}

/// Verified blocks, kept by hash.
#[derive(Default)]
struct Collected(Mutex<HashMap<[u8; 32], Bytes>>);

impl BlockSink for Collected {
    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        lock(&self.0).insert(job.hash.0, data.clone());
        Ok(())
    }
}

fn not_found(e: ClientError, key: &KeyPath) -> ReadError {
    if e.is_not_found() {
        ReadError::NotFound(key.to_string())
    } else {
        e.into()
    }
}

/// `len` bytes of the file at `key` from `offset` (fewer at its end; none past it).
pub async fn read_range(
    peers: &Peers,
    store: &Store,
    server: &str,
    namespace: &str,
    key: &KeyPath,
    offset: u64,
    len: u64,
) -> Result<RangeRead, ReadError> {
    let r = store
        .resolve(ResolveRequest {
            watcher: 0,
            namespace: namespace.to_string(),
            key: key.to_string(),
            inline_up_to: 0,
        })
        .await
        .map_err(|s| not_found(s, key))?;
    let m = r.manifest.clone().ok_or(ManifestError::Empty)?;
    manifest::validate(&m)?;
    let entry = match &m.entries[..] {
        [e] if e.kind() == EntryKind::File => e,
        _ => return Err(ReadError::IsDir(key.to_string())),
    };
    let end = offset.saturating_add(len).min(entry.size);
    if offset >= end {
        return Ok(RangeRead {
            data: Bytes::new(),
            blocks_fetched: 0,
        });
    }
    // The blocks that cover [offset, end), with where each starts.
    let mut covering = Vec::new();
    let mut at = 0u64;
    for b in &entry.blocks {
        let next = at + u64::from(b.len);
        if next > offset && at < end {
            let hash = manifest::block_hash(b)
                .ok_or_else(|| ManifestError::BadBlock(entry.path.clone()))?;
            covering.push((at, hash, b.len));
        }
        at = next;
    }
    let mut unique: Vec<BlockJob> = Vec::new();
    for (_, hash, len) in &covering {
        if !unique.iter().any(|j| j.hash == *hash) {
            unique.push(BlockJob {
                hash: *hash,
                len: *len,
                targets: Vec::new(),
                piece: None,
            });
        }
    }
    let blocks_fetched = unique.len();
    let sources = order_sources(&r.sources, "", "", server, &r.ticket.clone().into());
    let got = Arc::new(Collected::default());
    fetch::fetch(peers, unique, got.clone(), &sources, &ProgressBar::hidden()).await?;
    let got = lock(&got.0);
    let mut out = BytesMut::with_capacity((end - offset) as usize);
    for (start, hash, len) in covering {
        let block = got.get(&hash.0).ok_or(TransferError::Unavailable {
            missing: 1,
            reasons: "a fetched block went missing".into(),
        })?;
        // The fetch gave each block the manifest's length, and the manifest has one length
        // per hash; a range outside the block is still an error, never a panic.
        let lo = offset.max(start) - start;
        let hi = end.min(start + u64::from(len)) - start;
        let part = usize::try_from(lo)
            .ok()
            .zip(usize::try_from(hi).ok())
            .and_then(|(lo, hi)| block.get(lo..hi))
            .ok_or_else(|| TransferError::Unavailable {
                missing: 1,
                reasons: format!(
                    "block {hash} is {} bytes, the manifest says {len}",
                    block.len()
                ),
            })?;
        out.extend_from_slice(part);
    }
    Ok(RangeRead {
        data: out.freeze(),
        blocks_fetched,
    })
}

/// What `key` is: a file, a directory (a published one, or a prefix of keys), or a symlink.
pub async fn stat(store: &Store, namespace: &str, key: &KeyPath) -> Result<Stat, ReadError> {
    let resolved = store
        .resolve(ResolveRequest {
            watcher: 0,
            namespace: namespace.to_string(),
            key: key.to_string(),
            inline_up_to: 0,
        })
        .await;
    match resolved {
        Ok(r) => {
            let m = r.manifest.ok_or(ManifestError::Empty)?;
            manifest::validate(&m)?;
            if manifest::is_directory(&m) {
                return Ok(Stat::Directory);
            }
            let root = m.entries.first().ok_or(ManifestError::Empty)?;
            Ok(match root.kind() {
                EntryKind::Symlink => Stat::Symlink {
                    target: root.symlink_target.clone(),
                },
                _ => Stat::File {
                    size: root.size,
                    mtime_sec: root.mtime_sec,
                },
            })
        }
        Err(e) if e.is_not_found() => {
            let listed = store
                .list(ListRequest {
                    namespace: namespace.to_string(),
                    prefix: key.to_string(),
                    // Whether it is a directory is the question: its own entry answers it.
                    dir_only: true,
                    ..Default::default()
                })
                .await
                .map_err(|s| not_found(s, key))?;
            if listed.exists {
                Ok(Stat::Directory)
            } else {
                Err(ReadError::NotFound(key.to_string()))
            }
        }
        Err(e) => Err(e.into()),
    }
}
