//! Fetching: `kt get`, shared by every caller that copies a published entry to disk.
//!
//! The manifest is resolved and checked, the destination laid out (rsync semantics: a directory
//! lands as `DEST/NAME`, or its contents straight in `DEST` with `--contents`), and every unique
//! block fetched once from the nearest source that has it. Files are written to temporary names
//! beside their destination and renamed only when complete, so a failed get leaves no
//! half-written file. Afterwards the files are handed to this node's agent, which serves them in
//! place: the getter becomes a source.

mod error;
mod plan;
mod reuse;

pub use error::GetError;
pub use plan::Preserve;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::ProgressBar;
use serde::Serialize;

use super::put::chunk::Chunking;
use super::remotes::Remotes;
use crate::auth::Credential;
use crate::broadcast::member::membership::{self, JoinSpec, TreeReport};
use crate::broadcast::member::offer::{Announcing, Offer, RateLimit};
use crate::dataplane::fetch::{self, BlockSink, FetchReport, Sinks};
use crate::dataplane::peers::Peers;
use crate::dataplane::sources::{local_agent, order_sources, LocalAgent, NodeRef, SourceAddr};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, FileEntry, Manifest, ManifestError};
use crate::proto::{
    AddSourceRequest, ListRequest, LocalFile, ResolveRequest, ResolveResponse, WindowSpec,
};
use crate::rpc::client::Store;
use crate::rpc::{implicit_group, STORE};
use error::io;
use plan::{Filter, Layout, TempGuard};

pub struct GetOptions {
    pub server: String,
    /// What this caller presents to the store server.
    pub credential: Credential,
    pub namespace: Namespace,
    pub key: KeyPath,
    /// As typed: a trailing `/` means "a directory".
    pub dest: String,
    pub contents: bool,
    pub force: bool,
    pub excludes: Vec<String>,
    pub includes: Vec<String>,
    pub seed: bool,
    pub agent_socket: PathBuf,
    /// The broadcast window to join; without a group id or quorum criteria, the implicit
    /// window of the version (only its fanout counts).
    pub window: WindowSpec,
    /// Bytes per second to write at most.
    pub bwlimit: Option<u64>,
    /// Fetch from the store server alone, without a broadcast tree: the getter is outside the
    /// cluster (a port-forward) and cannot reach the nodes.
    pub store_only: bool,
    /// Who it talks to (by default the store at `server`, and peers over TCP).
    pub remotes: Remotes,
    /// Devices, owners and set-ID bits given back (none by default).
    pub preserve: Preserve,
}

#[derive(Debug, Serialize, Default)]
pub struct SourceReport {
    pub source: String,
    pub addr: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize, Default)]
pub struct GetReport {
    pub key: String,
    pub namespace: String,
    pub versions: Vec<String>,
    pub dest: String,
    pub files: u64,
    pub bytes: u64,
    pub bytes_transferred: u64,
    pub sources: Vec<SourceReport>,
    pub seeded: bool,
    /// Bytes taken from older copies at the destination (`--force` onto modified files).
    pub bytes_reused: u64,
    /// Blocks that came as rsync deltas against an older copy.
    pub delta_blocks: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub broadcast: Vec<TreeReport>,
}

pub async fn get(opts: GetOptions, progress: &ProgressBar) -> Result<GetReport, GetError> {
    let store = opts.remotes.store(&opts.server, &opts.credential).await?;
    let mut agent = local_agent(&opts.agent_socket).await;
    let filter = Filter::new(&opts.excludes, &opts.includes)?;
    let mut report = GetReport {
        key: opts.key.to_string(),
        namespace: opts.namespace.to_string(),
        ..Default::default()
    };
    let resolved = resolve(&store, &opts.namespace, &opts.key).await?;
    tracing::debug!("get: resolved");
    let dest_dir_like = opts.dest.ends_with('/') || Path::new(&opts.dest).is_dir();
    // A prefix is a directory whatever made it: a `kt put` directory, a directory made in a
    // mount, or nothing but keys below it. Its tree is the union of its own manifest (if any)
    // and every key below, each at its place.
    let base = match resolved {
        Some((r, m)) => {
            let name = opts.key.name();
            let is_dir = manifest::is_directory(&m);
            let root = if is_dir {
                if opts.contents {
                    PathBuf::from(&opts.dest)
                } else {
                    Path::new(&opts.dest).join(name)
                }
            } else if dest_dir_like {
                Path::new(&opts.dest).join(name)
            } else {
                PathBuf::from(&opts.dest)
            };
            report.dest = root.display().to_string();
            let at = Place {
                root: &root,
                rel: "",
            };
            fetch_one(
                &store,
                agent.as_mut(),
                &opts,
                &r,
                m,
                at,
                &filter,
                progress,
                &mut report,
            )
            .await?;
            if !is_dir {
                return Ok(report);
            }
            Some(root)
        }
        None => None,
    };
    let keys = keys_below(&store, &opts).await?;
    let base = match base {
        Some(root) => root,
        None if keys.is_empty() => return Err(GetError::NotFound(opts.key.to_string())),
        None if opts.contents => PathBuf::from(&opts.dest),
        None => Path::new(&opts.dest).join(opts.key.name()),
    };
    report.dest = base.display().to_string();
    // Names of one hard-linked file land as hard links of the first one fetched, as `rsync -H`
    // and tar make them: the bytes come once, and the tree keeps its shape.
    let mut landed: HashMap<u64, PathBuf> = HashMap::new();
    for (rel, inode) in keys {
        let root = base.join(&rel);
        if let Some(first) = landed.get(&inode) {
            if !filter.skips(&rel, false) && link_name(first, &root)? {
                report.files += 1;
                continue;
            }
        }
        let key = opts
            .key
            .join(&rel)
            .map_err(|e| GetError::NotFound(e.to_string()))?;
        // None: removed since it was listed; the tree is what is there now.
        let Some((r, m)) = resolve(&store, &opts.namespace, &key).await? else {
            continue;
        };
        let at = Place {
            root: &root,
            rel: &rel,
        };
        fetch_one(
            &store,
            agent.as_mut(),
            &opts,
            &r,
            m,
            at,
            &filter,
            progress,
            &mut report,
        )
        .await?;
        if inode != 0 && root.is_file() {
            landed.entry(inode).or_insert(root);
        }
    }
    Ok(report)
}

/// Makes `to` a hard link of `first`, another name of its file landed by this get: `false`
/// where it cannot be one (a file of other bytes already there, a file system without hard
/// links), and the name is then fetched as a file of its own.
fn link_name(first: &Path, to: &Path) -> Result<bool, GetError> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(there) = std::fs::symlink_metadata(to) {
        let first = std::fs::metadata(first).map_err(io(first))?;
        return Ok(there.dev() == first.dev() && there.ino() == first.ino());
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    match std::fs::hard_link(first, to) {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::debug!(error = %e, to = %to.display(), "no hard link; fetching the name as a file");
            Ok(false)
        }
    }
}

/// The keys strictly below the get's key, relative to it, in order, each with its inode record
/// (0: a file of one name); those a filter excludes are left out by [`fetch_one`], which sees
/// each entry's path from the get's root.
async fn keys_below(store: &Store, opts: &GetOptions) -> Result<Vec<(String, u64)>, GetError> {
    let list = store
        .list_all(ListRequest {
            namespace: opts.namespace.to_string(),
            prefix: opts.key.to_string(),
            recursive: true,
            ..Default::default()
        })
        .await;
    let list = match list {
        Ok(l) => l,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(list
        .entries
        .into_iter()
        .filter(|e| e.is_key)
        .map(|e| (e.name.trim_end_matches('/').to_string(), e.inode))
        .filter(|(rel, _)| !rel.is_empty())
        .collect())
}

/// Where one version lands: its directory (or file) on disk, and its path from the get's root,
/// which filters match against.
#[derive(Clone, Copy)]
struct Place<'a> {
    root: &'a Path,
    rel: &'a str,
}

/// `key`'s version and its manifest, checked before anything is written from it; `None` where
/// no key or path inside one is there.
async fn resolve(
    store: &Store,
    ns: &Namespace,
    key: &KeyPath,
) -> Result<Option<(ResolveResponse, Manifest)>, GetError> {
    let resolved = store
        .resolve(ResolveRequest {
            watcher: 0,
            inline_up_to: 0,
            namespace: ns.to_string(),
            key: key.to_string(),
        })
        .await;
    match resolved {
        Ok(r) => checked(r).map(Some),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The manifest of a resolve answer, checked before anything is written from it.
fn checked(r: ResolveResponse) -> Result<(ResolveResponse, Manifest), GetError> {
    let m = r.manifest.clone().ok_or(ManifestError::Empty)?;
    manifest::validate(&m)?;
    Ok((r, m))
}

/// Fetches one version into `root`: plan the destination, lay out temporary files, fetch
/// every block through the version's window (offering each to peers as it is verified), give
/// the files their names, and seed them.
#[allow(clippy::too_many_arguments)]
async fn fetch_one(
    store: &Store,
    mut agent: Option<&mut LocalAgent>,
    opts: &GetOptions,
    r: &ResolveResponse,
    m: Manifest,
    at: Place<'_>,
    filter: &Filter,
    progress: &ProgressBar,
    report: &mut GetReport,
) -> Result<(), GetError> {
    let version = Version::from_slice(&r.version).ok_or(GetError::BadVersion)?;
    // Where a get's time goes, at debug level (RUST_LOG=ktfs::transfer=debug).
    let began = std::time::Instant::now();
    let stage =
        |what: &str| tracing::debug!(ms = began.elapsed().as_millis() as u64, "get: {what}");
    let entries = entries_in(&m, at, filter);
    if entries.is_empty() {
        return Ok(());
    }
    let root = at.root;
    let layout = Layout::plan(entries, root, opts.force, opts.preserve)?;
    let mut guard = TempGuard::default();
    let laid = layout.lay_out(&mut guard)?;
    let copies = if opts.force {
        older_copies(laid.dests, Chunking::of_manifest(m.block_size)).await
    } else {
        HashMap::new()
    };
    let (node, zone) = agent
        .as_deref()
        .map_or((String::new(), String::new()), |a| {
            (a.node_id.clone(), a.zone.clone())
        });
    let ticket = bytes::Bytes::from(r.ticket.clone());
    let mut sources = order_sources(&r.sources, &node, &zone, &opts.server, &ticket);
    if opts.store_only {
        sources.retain(|s| s.label == STORE);
    }
    let mut jobs = laid.jobs;
    progress.inc_length(jobs.iter().map(|j| u64::from(j.len)).sum());

    // While it fetches, the agent serves what has arrived: children in a tree need not wait.
    let mut offer = None;
    if let (true, false, Some(a)) = (opts.seed, jobs.is_empty(), agent.as_deref_mut()) {
        offer = Offer::open(&mut a.client, version, &m, layout.receiving()?).await;
    }
    stage("offered");
    let sink = Arc::new(Announcing {
        inner: Arc::new(Sinks::new(laid.files)),
        tx: offer.as_ref().map(Offer::announcer),
        limit: opts.bwlimit.map(RateLimit::new),
    });
    // What came as deltas, reported with the rest by source.
    let mut by_delta = FetchReport::default();
    if !copies.is_empty() {
        let peers = &opts.remotes.peers;
        let (sink, sources) = (sink.clone(), &sources);
        let taken =
            take_from_copies(peers, jobs, copies, sink, sources, &node, root, progress).await?;
        report.bytes_reused += taken.bytes_reused;
        report.delta_blocks += taken.delta_blocks;
        by_delta = taken.by_delta;
        jobs = taken.left;
    }
    let (mut fetched, member) = if jobs.is_empty() {
        (FetchReport::default(), None)
    } else if opts.store_only {
        if sources.is_empty() {
            return Err(GetError::OutsideCluster(r.key.clone()));
        }
        let peers = &opts.remotes.peers;
        (
            fetch::fetch(peers, jobs, sink, &sources, progress).await?,
            None,
        )
    } else {
        let node = agent.as_deref().map(LocalAgent::node);
        let spec = join_spec(opts, r, version, node, offer.is_some(), ticket);
        membership::fetch_in_window(store, &opts.server, spec, jobs, sink, &sources, progress)
            .await?
    };
    stage("fetched");
    fetched.add(by_delta);
    layout.finish(&mut guard)?;
    stage("laid out");

    let files = layout.seeded()?;
    record(report, &fetched, &layout, files.len(), version);
    if opts.seed {
        if let Some(a) = agent {
            let got = (opts.namespace.as_str(), r.key.as_str(), &opts.credential);
            if seed(a, version, &m, files, got).await {
                report.seeded = true;
            }
            stage("seeded");
        }
    }
    // A member whose agent did not take the files over holds nothing others may fetch: it
    // leaves without a copy, so that the window sends no later getter to it.
    if let Some(m) = member {
        m.leave(offer.is_none() || report.seeded).await;
        report.broadcast.push(m.report().await);
    }
    stage("left the window");
    if let Some(o) = offer {
        o.close().await;
    }
    stage("done");
    Ok(())
}

/// The entries of `m` the filter keeps, matched by their path from the get's root; the entry
/// of the version's own root is always kept.
fn entries_in<'m>(m: &'m Manifest, at: Place<'_>, filter: &Filter) -> Vec<&'m FileEntry> {
    let from_root = |p: &str| match (at.rel, p) {
        (r, "") => r.to_string(),
        ("", p) => p.to_string(),
        (r, p) => format!("{r}/{p}"),
    };
    m.entries
        .iter()
        .filter(|e| {
            let rel = from_root(&e.path);
            rel.is_empty() || !filter.skips(&rel, e.kind() == EntryKind::Directory)
        })
        .collect()
}

/// The older copies at the destinations (`--force` onto files that are there), each cut into
/// blocks as the version's were; none where they cannot be read.
async fn older_copies(dests: Vec<PathBuf>, chunking: Chunking) -> HashMap<usize, reuse::OldCopy> {
    tokio::task::spawn_blocking(move || reuse::old_copies(&dests, chunking))
        .await
        .unwrap_or_default()
}

/// What a get took from older copies at its destination.
struct FromCopies {
    /// The jobs left for a plain fetch.
    left: Vec<fetch::BlockJob>,
    bytes_reused: u64,
    delta_blocks: u64,
    /// What came as deltas, by source.
    by_delta: FetchReport,
}

/// Writes the blocks the older copies hold from them, then asks for blocks that replace
/// bytes of a copy as deltas against those bytes; what neither gives is left.
#[allow(clippy::too_many_arguments)]
async fn take_from_copies(
    peers: &Peers,
    jobs: Vec<fetch::BlockJob>,
    copies: HashMap<usize, reuse::OldCopy>,
    sink: Arc<dyn BlockSink>,
    sources: &[SourceAddr],
    node: &str,
    root: &Path,
    progress: &ProgressBar,
) -> Result<FromCopies, GetError> {
    let copies = Arc::new(copies);
    let (c, s) = (copies.clone(), sink.clone());
    let r = tokio::task::spawn_blocking(move || reuse::reuse(jobs, &c, &*s))
        .await
        .map_err(|e| io(root)(std::io::Error::other(e.to_string())))??;
    progress.inc(r.bytes);
    let d = reuse::fetch_deltas(peers, r.deltas, copies, sources, node, sink).await;
    for (src, n) in &d.report.by_source {
        tracing::debug!(source = %src.label, bytes = n, blocks = d.blocks, "blocks as deltas");
    }
    progress.inc(d.block_bytes);
    let mut left = r.jobs;
    left.extend(d.left);
    Ok(FromCopies {
        left,
        bytes_reused: r.bytes,
        delta_blocks: d.blocks,
        by_delta: d.report,
    })
}

/// How this getter joins the version's broadcast window: the window asked for, or without a
/// group id or quorum criteria the implicit window of the version (only its fanout counts).
fn join_spec<'a>(
    opts: &'a GetOptions,
    r: &'a ResolveResponse,
    version: Version,
    node: Option<NodeRef>,
    serves: bool,
    ticket: bytes::Bytes,
) -> JoinSpec<'a> {
    let mut window = opts.window.clone();
    if window.group_id.is_empty()
        && window.world_size == 0
        && window.timeout_ms == 0
        && window.ips.is_empty()
    {
        window.group_id = implicit_group(&version);
    }
    JoinSpec {
        namespace: opts.namespace.as_str(),
        key: &r.key,
        version,
        window,
        node,
        serves,
        reads: false,
        ticket,
        peers: opts.remotes.peers.clone(),
    }
}

/// Adds one fetched version to the report: its sources, files and bytes.
fn record(
    report: &mut GetReport,
    fetched: &FetchReport,
    layout: &Layout<'_>,
    files: usize,
    version: Version,
) {
    for (src, bytes) in fetched.by_source.iter() {
        report.sources.push(SourceReport {
            source: src.label.clone(),
            addr: src.addr.clone(),
            bytes: *bytes,
        });
    }
    report.bytes_transferred += fetched.bytes();
    report.files += files as u64;
    report.bytes += layout
        .entries
        .iter()
        .filter(|e| e.kind() == EntryKind::File)
        .map(|e| e.size)
        .sum::<u64>();
    report.versions.push(version.hex());
}

/// Hands the fetched files to the node's agent, which serves them in place from now on;
/// whether it took them.
async fn seed(
    agent: &mut LocalAgent,
    version: Version,
    m: &Manifest,
    files: Vec<LocalFile>,
    (namespace, key, credential): (&str, &str, &Credential),
) -> bool {
    // The agent seeds with its node's credential and this caller's, which it presents beside
    // it: the store checks that the caller may read the key, and that it is at this version.
    let mut call = tonic::Request::new(AddSourceRequest {
        version: version.0.to_vec(),
        manifest: Some(m.clone()),
        files,
        namespace: namespace.to_string(),
        key: key.to_string(),
    });
    if let Some(v) = credential.value() {
        call.metadata_mut()
            .insert(crate::auth::credential::AUTHORIZATION, v);
    }
    let seeded = agent.client.add_source(call).await;
    match seeded {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e.message(), "could not seed through the local agent");
            false
        }
    }
}
