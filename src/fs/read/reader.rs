//! The reading side of the core: it resolves a path to the version a reader opens (asking the
//! store server, or answered under the watch's lease; a directory's next small files come with
//! it, their bytes inline), joins the version's window when the file has more than one block,
//! and registers this node as a source of what it fetched.
//!
//! A file of more than one block is read through the version's implicit broadcast window, as
//! `kt get` reads: the reader joins at open, fetches from the source the window assigns (and is
//! given another when that one fails), and leaves when the file is closed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::ahead::{Ahead, RESOLVE_AHEAD, RESOLVE_AHEAD_BYTES};
use super::file::{file_entry, joined, ReadFile, Span, READAHEAD_BLOCKS};
use super::loader::{Loader, Route};
use crate::blocks::node::NodeBlocks;
use crate::broadcast::member::membership::{JoinSpec, Membership};
use crate::dataplane::fetch::BlockJob;
use crate::dataplane::peers::Peers;
use crate::dataplane::sources::{order_sources, NodeRef};
use crate::fs::config::FsConfig;
use crate::fs::error::{FsError, FsResult};
use crate::fs::names::listings::Listings;
use crate::hash::Version;
use crate::locks::lock;
use crate::proto::{
    AddLocationRequest, InlineBlock, ResolveManyRequest, ResolveRequest, ResolveResponse,
    ResolveResult, WindowSpec,
};
use crate::rpc::client::Store;
use crate::rpc::{implicit_group, ClientError, Fault, MAX_INLINE_FILE};

/// What reading holds: the loader of blocks, the version each inode showed when last opened,
/// and the versions this node registered as a source of.
pub struct Reader {
    cfg: Arc<FsConfig>,
    store: Store,
    /// How this mount reaches the peers it fetches from (its own pool of connections).
    peers: Peers,
    listings: Arc<Listings>,
    blocks: Arc<NodeBlocks>,
    pub(crate) loader: Arc<Loader>,
    /// Versions resolved ahead of the opens, with a batch asked in the background.
    ahead: Arc<Ahead>,
    /// The version each inode showed when last opened, to keep the kernel's page cache only
    /// while it is still right.
    opened: Mutex<HashMap<u64, Version>>,
    /// Versions this node has registered as a location of.
    seeded: Arc<Mutex<HashSet<Version>>>,
}

impl Reader {
    pub fn new(
        cfg: Arc<FsConfig>,
        remotes: (Store, Peers),
        listings: Arc<Listings>,
        blocks: Arc<NodeBlocks>,
        rt: tokio::runtime::Handle,
    ) -> Self {
        let (store, peers) = remotes;
        let loader = Arc::new(Loader::new(blocks.clone(), rt));
        Reader {
            peers,
            ahead: Arc::new(Ahead::new(
                cfg.clone(),
                store.clone(),
                listings.clone(),
                loader.clone(),
            )),
            loader,
            cfg,
            store,
            listings,
            blocks,
            opened: Mutex::default(),
            seeded: Arc::default(),
        }
    }

    /// Inode `ino` was opened on `version`: whether it showed that version at its last open
    /// here too (the kernel's cached pages of it are still right).
    pub fn opened(&self, ino: u64, version: Version) -> bool {
        lock(&self.opened).insert(ino, version) == Some(version)
    }

    pub async fn resolve(&self, path: &str) -> FsResult<ReadFile> {
        // Under the watch's lease an unchanged file opens with no request: a change of it is
        // told (and forgets this) before its writer is answered.
        let since = self.listings.epoch();
        let mut kept = self.listings.resolved(path);
        if kept.is_none() && self.ahead.wait_for(path).await {
            kept = self.listings.resolved(path);
        }
        let (r, inline) = match kept {
            Some(r) => {
                self.ahead.read_on(path);
                (r, Vec::new())
            }
            None => {
                let asked = self.ask_resolve(path, since).await;
                self.listings
                    .called(asked.as_ref().err().and_then(FsError::fault));
                match asked {
                    Ok(asked) => asked,
                    Err(e) => (self.last_resolved(path).ok_or(e)?, Vec::new()),
                }
            }
        };
        let entry = file_entry(&r)?;
        let version = Version::from_slice(&r.version)
            .ok_or_else(|| FsError::BadManifest("malformed version".into()))?;
        self.ahead.take_inline(&entry, inline);
        if self.ahead.may_keep(&r) {
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
                peers: self.peers.clone(),
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
            peers: self.peers.clone(),
        };
        Membership::join(&self.store, &self.cfg.server, spec)
            .await
            .map_err(|e| tracing::debug!(error = %e, "no window for this read"))
            .ok()
    }

    /// With stale reads while no store server answers, the version `path` showed when last
    /// resolved here.
    fn last_resolved(&self, path: &str) -> Option<Arc<ResolveResponse>> {
        (self.cfg.stale_reads && self.listings.unreachable())
            .then(|| self.listings.last_resolved(path))
            .flatten()
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
        crate::metrics::MOUNT_OPEN_RESOLVES.inc();
        let store = self.store.clone();
        let next = self
            .listings
            .next_small_files(path, RESOLVE_AHEAD, RESOLVE_AHEAD_BYTES);
        if !next.is_empty() {
            let mut keys = Vec::with_capacity(next.len() + 1);
            keys.push(path.to_string());
            keys.extend(next);
            self.ahead.asked(&keys);
            let asked = store
                .resolve_many(ResolveManyRequest {
                    watcher: self.listings.watcher(),
                    namespace: self.cfg.namespace.to_string(),
                    keys: keys.clone(),
                    inline_up_to: MAX_INLINE_FILE,
                })
                .await;
            match asked {
                Ok(resp) => return self.took_many(&keys, resp.results, since),
                // A server older than the call: one at a time, as before it.
                Err(e) if e.fault() == Fault::Unimplemented => {}
                Err(s) => return Err(s.into()),
            }
        }
        let mut r = store
            .resolve(ResolveRequest {
                watcher: self.listings.watcher(),
                namespace: self.cfg.namespace.to_string(),
                key: path.to_string(),
                inline_up_to: MAX_INLINE_FILE,
            })
            .await?;
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
                self.ahead.keep(key, r, since);
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

    /// Registers this node as a location of `version` once, in the background: a reader
    /// becomes a source.
    pub fn seed_hook(&self, version: Version) -> impl FnOnce() + Send + 'static {
        let seeded = self.seeded.clone();
        let store = self.store.clone();
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
                        // The mount's own read: the node's word, as a node's.
                        ..Default::default()
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e.to_string(), "could not register as a source");
                }
            });
        }
    }

    /// Starts a read of `f`: the reads ahead of a sequential reader are set going, and each
    /// block of the read is looked for here, once. The bytes when every block was here, else
    /// what [`Reader::read_rest`] must fetch.
    pub fn read_start(
        &self,
        f: &Arc<ReadFile>,
        offset: u64,
        size: u32,
    ) -> FsResult<Result<Bytes, Pending>> {
        let Some(span) = f.span(offset, size)? else {
            return Ok(Ok(Bytes::new()));
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
        let parts: Vec<Option<Bytes>> = (span.first..=span.last)
            .map(|i| self.loader.held(&f.job(i)?))
            .collect::<FsResult<_>>()?;
        if parts.iter().all(Option::is_some) {
            let parts = (span.first..).zip(parts.into_iter().flatten());
            return Ok(Ok(joined(
                parts.map(|(i, b)| f.slice(i, b, offset, span.end)),
                span.end - offset,
            )?));
        }
        Ok(Err(Pending {
            file: f.clone(),
            offset,
            span,
            parts,
        }))
    }

    /// The rest of a read: the blocks [`Reader::read_start`] did not find here, fetched (or
    /// waited for, when a fetch of them is under way), their bytes handed back by the fetch.
    pub async fn read_rest(&self, p: Pending) -> FsResult<Bytes> {
        let f = &p.file;
        let mut out = Vec::with_capacity(p.parts.len());
        for (i, held) in (p.span.first..).zip(p.parts) {
            let data = match held {
                Some(b) => b,
                None => {
                    self.loader
                        .fetch(&f.job(i)?, &f.route, self.seed_hook(f.version))
                        .await?
                }
            };
            out.push(f.slice(i, data, p.offset, p.span.end));
        }
        joined(out.into_iter(), p.span.end - p.offset)
    }
}

/// A read that must wait: its file, its span, and the blocks of the span this node held
/// (`None` for those to fetch).
pub struct Pending {
    file: Arc<ReadFile>,
    offset: u64,
    span: Span,
    parts: Vec<Option<Bytes>>,
}
