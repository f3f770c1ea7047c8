//! Fetching: `kt get`, shared by every caller that copies a published entry to disk.
//!
//! The manifest is resolved and checked, the destination laid out (rsync semantics: a directory
//! lands as `DEST/NAME`, or its contents straight in `DEST` with `--contents`), and every unique
//! block fetched once from the nearest source that has it. Files are written to temporary names
//! beside their destination and renamed only when complete, so a failed get leaves no
//! half-written file. Afterwards the files are handed to this node's agent, which serves them in
//! place: the getter becomes a source.

use std::collections::HashMap;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::broadcast;
use crate::client::{self, Agent, ClientError, Store};
use crate::fanout::{self, Announcing, Offer, RateLimit, TreeFetch, TreeReport};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, FileEntry, Manifest, ManifestError};
use crate::proto::{
    AddSourceRequest, AgentStatusRequest, ListRequest, LocalFile, ResolveRequest, ResolveResponse,
    Source, WindowSpec,
};
use crate::transfer::{self, BlockJob, FetchReport, Sinks, SourceAddr, TransferError};

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error("{0} exists and differs (use --force to overwrite)")]
    Exists(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("bad filter pattern: {0}")]
    Pattern(String),
    #[error("server returned a malformed version")]
    BadVersion,
    #[error("{0} is held only by nodes inside the cluster (locale local), which a getter outside it cannot reach")]
    OutsideCluster(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GetError + '_ {
    move |source| GetError::Io {
        path: path.display().to_string(),
        source,
    }
}

pub struct GetOptions {
    pub server: String,
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub broadcast: Vec<TreeReport>,
}

/// This node's agent, when one answers.
pub(crate) struct LocalAgent {
    client: Agent,
    node_id: String,
    zone: String,
    data_addr: String,
}

impl LocalAgent {
    /// Who this node is in a broadcast window: its node id and the address peers reach it on.
    pub(crate) fn tree_node(&self) -> (String, String) {
        (self.node_id.clone(), fanout::host_of(&self.data_addr))
    }
}

pub(crate) async fn local_agent(path: &Path) -> Option<LocalAgent> {
    let mut client = client::connect_agent(path).await.ok()?;
    let st = client
        .status(AgentStatusRequest {})
        .await
        .ok()?
        .into_inner();
    Some(LocalAgent {
        client,
        node_id: st.node_id,
        zone: st.zone,
        data_addr: st.data_addr,
    })
}

pub async fn get(opts: GetOptions, progress: &ProgressBar) -> Result<GetReport, GetError> {
    let mut store = client::connect_store(&opts.server).await?;
    let mut agent = local_agent(&opts.agent_socket).await;
    let filter = Filter::new(&opts.excludes, &opts.includes)?;
    let mut report = GetReport {
        key: opts.key.to_string(),
        namespace: opts.namespace.to_string(),
        ..Default::default()
    };
    let resolved = store
        .resolve(ResolveRequest {
            inline_up_to: 0,
            namespace: opts.namespace.to_string(),
            key: opts.key.to_string(),
        })
        .await;
    let dest_dir_like = opts.dest.ends_with('/') || Path::new(&opts.dest).is_dir();
    match resolved {
        Ok(r) => {
            let (r, m) = checked(r.into_inner())?;
            let name = opts.key.name();
            let root = if manifest::is_directory(&m) {
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
            fetch_one(
                &mut store,
                agent.as_mut(),
                &opts,
                &r,
                m,
                &root,
                &filter,
                progress,
                &mut report,
            )
            .await?;
        }
        Err(s) if s.code() == tonic::Code::NotFound => {
            // Not a key: perhaps a prefix with keys below it, fetched as one directory.
            let list = store
                .list(ListRequest {
                    namespace: opts.namespace.to_string(),
                    prefix: opts.key.to_string(),
                    recursive: true,
                })
                .await
                .map_err(ClientError::from)?
                .into_inner();
            let keys: Vec<_> = list.entries.into_iter().filter(|e| e.is_key).collect();
            if keys.is_empty() {
                return Err(GetError::NotFound(opts.key.to_string()));
            }
            let base = if opts.contents {
                PathBuf::from(&opts.dest)
            } else {
                Path::new(&opts.dest).join(opts.key.name())
            };
            report.dest = base.display().to_string();
            for e in keys {
                let rel = e.name.trim_end_matches('/');
                let key = opts
                    .key
                    .join(rel)
                    .map_err(|e| GetError::NotFound(e.to_string()))?;
                let (r, m) = checked(
                    store
                        .resolve(ResolveRequest {
                            inline_up_to: 0,
                            namespace: opts.namespace.to_string(),
                            key: key.to_string(),
                        })
                        .await
                        .map_err(ClientError::from)?
                        .into_inner(),
                )?;
                fetch_one(
                    &mut store,
                    agent.as_mut(),
                    &opts,
                    &r,
                    m,
                    &base.join(rel),
                    &filter,
                    progress,
                    &mut report,
                )
                .await?;
            }
        }
        Err(s) => return Err(ClientError::from(s).into()),
    }
    Ok(report)
}

/// The manifest of a resolve answer, checked before anything is written from it.
fn checked(r: ResolveResponse) -> Result<(ResolveResponse, Manifest), GetError> {
    let m = r.manifest.clone().ok_or(ManifestError::Empty)?;
    manifest::validate(&m)?;
    Ok((r, m))
}

/// What to do with one manifest entry at the destination.
enum Plan {
    Dir,
    Symlink,
    /// Already there with the same size and mtime (rsync's quick check).
    UpToDate,
    /// Fetch into this temporary file, then rename.
    Fetch(PathBuf),
}

#[allow(clippy::too_many_arguments)]
async fn fetch_one(
    store: &mut Store,
    mut agent: Option<&mut LocalAgent>,
    opts: &GetOptions,
    r: &ResolveResponse,
    m: Manifest,
    root: &Path,
    filter: &Filter,
    progress: &ProgressBar,
    report: &mut GetReport,
) -> Result<(), GetError> {
    let version = Version::from_slice(&r.version).ok_or(GetError::BadVersion)?;
    let entries: Vec<&FileEntry> = m
        .entries
        .iter()
        .filter(|e| e.path.is_empty() || !filter.skips(&e.path, e.kind() == EntryKind::Directory))
        .collect();

    // Check the whole destination before writing anything.
    let mut plans = Vec::with_capacity(entries.len());
    for e in &entries {
        let path = if e.path.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&e.path)
        };
        let existing = fs::symlink_metadata(&path).ok();
        let plan = match e.kind() {
            EntryKind::Directory => {
                if existing.as_ref().is_some_and(|x| !x.is_dir()) && !opts.force {
                    return Err(GetError::Exists(path.display().to_string()));
                }
                Plan::Dir
            }
            EntryKind::Symlink => {
                if let Some(x) = &existing {
                    let same = x.file_type().is_symlink()
                        && fs::read_link(&path)
                            .is_ok_and(|t| t.as_os_str() == e.symlink_target.as_str());
                    if !same && !opts.force {
                        return Err(GetError::Exists(path.display().to_string()));
                    }
                }
                Plan::Symlink
            }
            EntryKind::File => match &existing {
                Some(x)
                    if x.is_file()
                        && x.len() == e.size
                        && mtime_of(x) == (e.mtime_sec, e.mtime_nsec) =>
                {
                    Plan::UpToDate
                }
                Some(x) if x.is_dir() => return Err(GetError::Exists(path.display().to_string())),
                Some(_) if !opts.force => return Err(GetError::Exists(path.display().to_string())),
                _ => Plan::Fetch(temp_name(&path)),
            },
        };
        plans.push((path, plan));
    }

    // Lay out directories and temporary files, and the blocks each needs.
    let mut sinks = Vec::new();
    let mut jobs: HashMap<[u8; 32], BlockJob> = HashMap::new();
    let mut order = Vec::new();
    let guard = TempGuard::default();
    let mut guard = guard;
    for (e, (path, plan)) in entries.iter().zip(&plans) {
        match plan {
            Plan::Dir => fs::create_dir_all(path).map_err(io(path))?,
            Plan::Fetch(tmp) => {
                if let Some(parent) = tmp.parent() {
                    fs::create_dir_all(parent).map_err(io(parent))?;
                }
                let f = File::create(tmp).map_err(io(tmp))?;
                guard.0.push(tmp.clone());
                f.set_len(e.size).map_err(io(tmp))?;
                let idx = sinks.len();
                sinks.push((tmp.clone(), f));
                let mut off = 0u64;
                for b in &e.blocks {
                    let h = manifest::block_hash(b)
                        .ok_or_else(|| ManifestError::BadBlock(e.path.clone()))?;
                    jobs.entry(h.0)
                        .or_insert_with(|| {
                            order.push(h.0);
                            BlockJob {
                                hash: h,
                                len: b.len,
                                targets: Vec::new(),
                            }
                        })
                        .targets
                        .push((idx, off));
                    off += u64::from(b.len);
                }
            }
            _ => {}
        }
    }
    let jobs: Vec<BlockJob> = order.iter().filter_map(|h| jobs.remove(h)).collect();
    let (node, zone) = agent
        .as_deref()
        .map_or(("", ""), |a| (a.node_id.as_str(), a.zone.as_str()));
    let mut sources = order_sources(&r.sources, node, zone, &opts.server);
    if opts.store_only {
        sources.retain(|s| s.label == broadcast::STORE);
    }
    progress.inc_length(jobs.iter().map(|j| u64::from(j.len)).sum());

    // While it fetches, the agent serves what has arrived: children in a tree need not wait.
    let mut offer = None;
    if let (true, false, Some(a)) = (opts.seed, jobs.is_empty(), agent.as_deref_mut()) {
        let mut files = Vec::new();
        for (e, (_, plan)) in entries.iter().zip(&plans) {
            if let Plan::Fetch(tmp) = plan {
                files.push(LocalFile {
                    entry_path: e.path.clone(),
                    disk_path: std::path::absolute(tmp)
                        .map_err(io(tmp))?
                        .display()
                        .to_string(),
                });
            }
        }
        offer = Offer::open(&mut a.client, version, &m, files).await;
    }
    let sink = Arc::new(Announcing {
        inner: Arc::new(Sinks::new(sinks)),
        tx: offer.as_ref().map(Offer::announcer),
        limit: opts.bwlimit.map(RateLimit::new),
    });
    let fetched = if jobs.is_empty() {
        FetchReport::default()
    } else if opts.store_only {
        if sources.is_empty() {
            return Err(GetError::OutsideCluster(r.key.clone()));
        }
        transfer::fetch(jobs, sink, &sources, progress).await?
    } else {
        let mut spec = opts.window.clone();
        if spec.group_id.is_empty()
            && spec.world_size == 0
            && spec.timeout_ms == 0
            && spec.ips.is_empty()
        {
            spec.group_id = broadcast::implicit_group(&version);
        }
        let tree = TreeFetch {
            store,
            server: &opts.server,
            namespace: opts.namespace.as_str(),
            key: &r.key,
            version,
            spec,
            node: agent.as_deref().map(LocalAgent::tree_node),
            serves: offer.is_some(),
        };
        let (fetched, tree) = tree.run(jobs, sink, &sources, progress).await?;
        report.broadcast.extend(tree);
        fetched
    };

    // Everything arrived and was verified: give files their metadata and their names.
    for (e, (path, plan)) in entries.iter().zip(&plans) {
        match plan {
            Plan::Fetch(tmp) => {
                finish_file(tmp, e)?;
                if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                    fs::remove_file(path).map_err(io(path))?;
                }
                fs::rename(tmp, path).map_err(io(path))?;
            }
            Plan::Symlink => {
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent).map_err(io(parent))?;
                }
                if fs::symlink_metadata(path).is_ok() {
                    if fs::read_link(path).is_ok_and(|t| t.as_os_str() == e.symlink_target.as_str())
                    {
                        continue;
                    }
                    fs::remove_file(path).map_err(io(path))?;
                }
                std::os::unix::fs::symlink(&e.symlink_target, path).map_err(io(path))?;
            }
            _ => {}
        }
    }
    guard.0.clear();
    // Directories last and deepest first, so a read-only directory is filled before it closes.
    for (e, (path, plan)) in entries.iter().zip(&plans).rev() {
        if let Plan::Dir = plan {
            fs::set_permissions(path, fs::Permissions::from_mode(e.mode)).map_err(io(path))?;
        }
    }

    let files: Vec<LocalFile> = entries
        .iter()
        .zip(&plans)
        .filter(|(_, (_, p))| matches!(p, Plan::Fetch(_) | Plan::UpToDate))
        .map(|(e, (path, _))| {
            Ok(LocalFile {
                entry_path: e.path.clone(),
                disk_path: crate::put::absolute(path)
                    .map_err(|_| GetError::BadVersion)?
                    .display()
                    .to_string(),
            })
        })
        .collect::<Result<_, GetError>>()?;
    for (src, bytes) in fetched.by_source.iter() {
        report.sources.push(SourceReport {
            source: src.label.clone(),
            addr: src.addr.clone(),
            bytes: *bytes,
        });
    }
    report.bytes_transferred += fetched.bytes();
    report.files += files.len() as u64;
    report.bytes += entries
        .iter()
        .filter(|e| e.kind() == EntryKind::File)
        .map(|e| e.size)
        .sum::<u64>();
    report.versions.push(version.hex());

    if opts.seed {
        if let Some(a) = agent {
            match a
                .client
                .add_source(AddSourceRequest {
                    version: version.0.to_vec(),
                    manifest: Some(m.clone()),
                    files,
                })
                .await
            {
                Ok(_) => report.seeded = true,
                Err(e) => {
                    tracing::warn!(error = %e.message(), "could not seed through the local agent")
                }
            }
        }
    }
    if let Some(o) = offer {
        o.close().await;
    }
    Ok(())
}

/// Sources nearest first: this node's agent, then peers in its zone, then other peers, then the
/// origin or the store.
pub(crate) fn order_sources(
    sources: &[Source],
    node_id: &str,
    zone: &str,
    server: &str,
) -> Vec<SourceAddr> {
    let rank = |s: &Source| -> u8 {
        let own = !node_id.is_empty() && node_id == s.node_id;
        let same_zone = !zone.is_empty() && zone == s.zone;
        match (own, s.origin, same_zone) {
            (true, _, _) => 0,
            (false, false, true) => 1,
            (false, false, false) => 2,
            (false, true, _) if !s.node_id.is_empty() => 3,
            _ => 4,
        }
    };
    let mut v: Vec<&Source> = sources.iter().collect();
    v.sort_by_key(|s| rank(s));
    v.into_iter().map(|s| source_addr(s, server)).collect()
}

/// Where to reach a source: the store server (no node id) at `server`, a node at its address.
pub(crate) fn source_addr(s: &Source, server: &str) -> SourceAddr {
    if s.node_id.is_empty() {
        SourceAddr {
            label: crate::broadcast::STORE.into(),
            addr: server.to_string(),
        }
    } else {
        SourceAddr {
            label: s.node_id.clone(),
            addr: s.data_addr.clone(),
        }
    }
}

fn mtime_of(m: &fs::Metadata) -> (i64, u32) {
    use std::os::unix::fs::MetadataExt;
    (m.mtime(), m.mtime_nsec() as u32)
}

fn temp_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.ktpart-{}", std::process::id()))
}

fn finish_file(tmp: &Path, e: &FileEntry) -> Result<(), GetError> {
    let f = File::options().write(true).open(tmp).map_err(io(tmp))?;
    if e.mtime_sec >= 0 {
        let t = UNIX_EPOCH + Duration::new(e.mtime_sec as u64, e.mtime_nsec);
        f.set_times(
            FileTimes::new()
                .set_modified(t)
                .set_accessed(SystemTime::now()),
        )
        .map_err(io(tmp))?;
    }
    f.set_permissions(fs::Permissions::from_mode(e.mode))
        .map_err(io(tmp))?;
    Ok(())
}

/// Removes temporary files left by a get that did not finish.
#[derive(Default)]
struct TempGuard(Vec<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

/// `--exclude`/`--include` on the paths of a manifest, rsync style.
struct Filter {
    excludes: Gitignore,
    includes: Gitignore,
}

impl Filter {
    fn new(excludes: &[String], includes: &[String]) -> Result<Self, GetError> {
        let build = |pats: &[String]| {
            let mut b = GitignoreBuilder::new("/");
            for p in pats {
                b.add_line(None, p)
                    .map_err(|e| GetError::Pattern(format!("{p}: {e}")))?;
            }
            b.build().map_err(|e| GetError::Pattern(e.to_string()))
        };
        Ok(Filter {
            excludes: build(excludes)?,
            includes: build(includes)?,
        })
    }

    fn skips(&self, rel: &str, is_dir: bool) -> bool {
        let p = Path::new("/").join(rel);
        if self
            .includes
            .matched_path_or_any_parents(&p, is_dir)
            .is_ignore()
        {
            return false;
        }
        self.excludes
            .matched_path_or_any_parents(&p, is_dir)
            .is_ignore()
    }
}
