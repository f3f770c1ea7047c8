//! Publishing: `kt put`, shared by every caller that publishes files from disk.
//!
//! For `locale=store`, the store is asked which blocks it lacks, only those are uploaded, and
//! then the manifest is published; the key switches to the new version in one step, so a put
//! that fails midway leaves the old version in place. For `locale=local`, this node's agent
//! registers the files as in-place sources and publishes with itself as the origin: no bytes move.

pub mod chunk;
pub mod early;
pub mod index;
pub mod scan;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::ProgressBar;
use serde::Serialize;

use self::early::EarlyUpload;
use self::index::{Index, Known};
use self::scan::{ScanError, ScanOptions, Scanned};
use super::publish::{self, Payload, PublishError};
use super::remotes::Remotes;
use crate::auth::Credential;
use crate::broadcast::member::membership;
use crate::dataplane::sources::local_agent;
use crate::dataplane::upload::{self, UploadJob};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, Manifest};
use crate::proto::{
    InlineBlock, LocalFile, Locale, PublishLocalRequest, PublishRequest, ResolveRequest, Window,
    WindowSpec,
};
use crate::rpc::client::{self, ClientError, Store};
use crate::rpc::{Fault, MAX_INLINE_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("--locale local needs this node's agent: {0}")]
    NoAgent(ClientError),
    #[error("server returned a malformed version")]
    BadVersion,
}

impl PutError {
    pub fn fault(&self) -> Fault {
        match self {
            PutError::Scan(e) => e.fault(),
            PutError::Client(e) => e.fault(),
            PutError::Publish(e) => e.fault(),
            PutError::NoAgent(_) => Fault::Unreachable,
            PutError::BadVersion => Fault::Internal,
        }
    }
}

pub struct PutOptions {
    pub server: String,
    /// What this caller presents to the store server.
    pub credential: Credential,
    pub namespace: Namespace,
    pub key: KeyPath,
    pub srcs: Vec<String>,
    pub scan: ScanOptions,
    pub locale: Locale,
    pub force: bool,
    pub ttl_secs: u64,
    pub agent_socket: PathBuf,
    /// A broadcast window to join as the putter once published; with quorum criteria, the put
    /// waits for the quorum.
    pub window: Option<WindowSpec>,
    /// Who it talks to (by default the store at `server`).
    pub remotes: Remotes,
}

#[derive(Debug, Serialize)]
pub struct PutReport {
    pub key: String,
    pub namespace: String,
    pub version: String,
    pub locale: &'static str,
    pub files: u64,
    pub bytes: u64,
    pub bytes_transferred: u64,
    /// Files read and hashed; the others were known unchanged.
    pub files_hashed: u64,
    /// How the manifest went to the store: whole (`manifest`) or as a `patch`.
    pub sent_as: &'static str,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "membership::serialize_window"
    )]
    pub broadcast: Option<Window>,
}

/// Scans, uploads what the store lacks, and publishes. A key that exists is updated to what the
/// sources hold now, as rsync updates a tree: files this machine's index (or, without one, the
/// key's manifest) shows unchanged by size and mtime are not read again, and the store gets a
/// patch against the key's version rather than the whole manifest. `force` trusts neither and
/// hashes every file.
pub async fn put(opts: PutOptions, progress: &ProgressBar) -> Result<PutReport, PutError> {
    let (ns, key) = (opts.namespace.to_string(), opts.key.to_string());
    let index_dir = index::dir();
    let index = match (&index_dir, opts.force) {
        (Some(d), false) => Index::load(d, &opts.server, &ns, &key),
        _ => None,
    };
    let mut store = None;
    // The version a patch is made against, and its manifest.
    let mut base: Option<(Version, Manifest)> = None;
    let base_from_index = index.is_some();
    let known: Box<dyn Known + Send> = match index {
        Some(ix) => {
            base = Some((ix.version, ix.manifest.clone()));
            Box::new(ix)
        }
        None if opts.locale == Locale::Store => {
            let s = store.insert(opts.remotes.store(&opts.server, &opts.credential).await?);
            base = current(s, &ns, &key).await?;
            match (&base, opts.force) {
                (Some((_, m)), false) => Box::new(index::Published(m.clone())),
                _ => Box::new(index::Nothing),
            }
        }
        None => Box::new(index::Nothing),
    };
    // A new key: its blocks go to the store while later ones are hashed. With a version to
    // patch, they wait for the scan, to go as deltas against the blocks they replace.
    let early = match (opts.locale, &base) {
        (Locale::Store, None) => Some(match store.as_ref() {
            Some(s) => s.clone(),
            None => store
                .insert(opts.remotes.store(&opts.server, &opts.credential).await?)
                .clone(),
        }),
        _ => None,
    };
    let (scanned, sent_early) = scan_sending(&opts, known, early, progress).await?;
    let m = &scanned.manifest;
    let publish = PublishRequest {
        namespace: ns.clone(),
        key: key.clone(),
        manifest: Some(m.clone()),
        locale: opts.locale as i32,
        origin_node: String::new(),
        ttl_secs: opts.ttl_secs,
        // A put updates the key to what its sources hold now.
        force: true,
        // Blocks go on the data plane, after asking which the store lacks: a put of what the
        // store holds sends nothing.
        ..Default::default()
    };
    let mut sent_as = "manifest";
    let (version, transferred) = match opts.locale {
        Locale::Store => {
            let store = match store.as_mut() {
                Some(s) => s,
                None => store.insert(opts.remotes.store(&opts.server, &opts.credential).await?),
            };
            let patched = match &base {
                Some((bv, bm)) => {
                    publish_patch(store, &opts.server, &publish, &scanned, *bv, bm, progress)
                        .await?
                }
                None => Patched::Refused { uploaded: 0 },
            };
            match patched {
                Patched::Done(done) => {
                    sent_as = "patch";
                    (done.version, done.bytes_sent)
                }
                Patched::Refused { uploaded } => {
                    let jobs = upload_jobs(&scanned, |_| true);
                    let done = publish::publish(
                        store,
                        &opts.server,
                        publish,
                        Payload::Upload(jobs),
                        progress,
                    )
                    .await?;
                    (done.version, sent_early + uploaded + done.bytes_sent)
                }
            }
        }
        Locale::Local => {
            let mut agent = client::connect_agent(&opts.agent_socket)
                .await
                .map_err(PutError::NoAgent)?;
            let files = local_files(&scanned)?;
            // The agent publishes with its node's credential and this caller's, which it
            // presents beside it: the namespace must be this caller's.
            let mut call = tonic::Request::new(PublishLocalRequest {
                publish: Some(publish),
                files,
            });
            if let Some(v) = opts.credential.value() {
                call.metadata_mut()
                    .insert(crate::auth::credential::AUTHORIZATION, v);
            }
            let resp = agent.publish_local(call).await.map_err(ClientError::from)?;
            let v = resp.into_inner().version;
            (Version::from_slice(&v).ok_or(PutError::BadVersion)?, 0)
        }
    };
    // An index that already says all this (the same version, every file known from it)
    // is left as it is.
    let current = base_from_index && base.as_ref().is_some_and(|(v, _)| *v == version);
    if let (Some(d), false) = (&index_dir, current && scanned.hashed == 0) {
        let saved = Index::save(
            d,
            &opts.server,
            &ns,
            &key,
            version,
            m,
            scanned.stats.clone(),
        );
        // The put is done; without an index the next one only hashes again.
        if let Err(e) = saved {
            tracing::warn!(error = %e, dir = %d.display(), "could not write the put index");
        }
    }
    let broadcast = match opts.window {
        Some(spec) => {
            // The origin of a local publication is this node; a store one has no node.
            let node = match opts.locale {
                Locale::Local => local_agent(&opts.agent_socket).await.map(|a| a.node()),
                Locale::Store => None,
            };
            let store = opts.remotes.store(&opts.server, &opts.credential).await?;
            Some(
                membership::join_as_putter(
                    &store,
                    opts.namespace.as_str(),
                    opts.key.as_str(),
                    version,
                    spec,
                    node,
                )
                .await?,
            )
        }
        None => None,
    };
    Ok(PutReport {
        key,
        namespace: ns,
        version: version.hex(),
        locale: locale_name(opts.locale),
        files: manifest::file_count(m),
        bytes: manifest::total_size(m),
        bytes_transferred: transferred,
        files_hashed: scanned.hashed as u64,
        sent_as,
        broadcast,
    })
}

/// The key's version and manifest as the store holds them, if the key is one (not a path
/// inside a directory, not a GPU key).
async fn current(
    store: &Store,
    ns: &str,
    key: &str,
) -> Result<Option<(Version, Manifest)>, PutError> {
    let r = store
        .resolve(ResolveRequest {
            watcher: 0,
            namespace: ns.to_string(),
            key: key.to_string(),
            inline_up_to: 0,
        })
        .await;
    let r = match r {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (Some(v), Some(m)) = (Version::from_slice(&r.version), r.manifest) else {
        return Ok(None);
    };
    let usable = r.key == key
        && manifest::validate(&m).is_ok()
        && m.entries.iter().all(|e| e.kind() != EntryKind::Gpu);
    Ok(usable.then_some((v, m)))
}

/// Scans the sources; with `early`, sends each block the scan hashes to that store as it
/// goes. Returns the scan and the bytes sent meanwhile.
async fn scan_sending(
    opts: &PutOptions,
    known: Box<dyn Known + Send>,
    early: Option<Store>,
    progress: &ProgressBar,
) -> Result<(Scanned, u64), PutError> {
    let early = early.map(|s| {
        EarlyUpload::start(
            s,
            opts.server.clone(),
            opts.namespace.to_string(),
            progress.clone(),
        )
    });
    let sink = early.as_ref().map(EarlyUpload::sink);
    let scan_opts = opts.scan.clone();
    let srcs = opts.srcs.clone();
    let scanned = tokio::task::spawn_blocking(move || match sink {
        Some(sink) => scan::scan_streaming(&srcs, &scan_opts, &*known, &sink),
        None => scan::scan_known(&srcs, &scan_opts, &*known),
    })
    .await
    .map_err(|e| ScanError::Io {
        path: String::new(),
        source: std::io::Error::other(e.to_string()),
    });
    // Whatever the scan came to, the blocks queued are sent (or given up) first.
    let sent = match early {
        Some(e) => e.finish().await,
        None => 0,
    };
    Ok((scanned??, sent))
}

/// What a patch publish came to.
enum Patched {
    Done(Box<publish::Published>),
    Refused { uploaded: u64 },
}

/// Publishes `scanned` as a patch against `base`, sending only the blocks of changed files
/// (inside the publish when they are few and small). `Refused` when the store would not take it
/// (the key moved on since `base`, the store never held `base`, or it lacks a block it was
/// thought to hold): the caller sends the whole manifest, and counts what the refused attempt
/// uploaded, which the store keeps and the whole publish then finds present.
async fn publish_patch(
    store: &Store,
    server: &str,
    whole: &PublishRequest,
    scanned: &Scanned,
    base: Version,
    base_manifest: &Manifest,
    progress: &ProgressBar,
) -> Result<Patched, PutError> {
    let patch = manifest::diff(base_manifest, &scanned.manifest);
    let changed: HashSet<&str> = patch.upserts.iter().map(|e| e.path.as_str()).collect();
    let jobs = upload_jobs(scanned, |p| changed.contains(p));
    let req = PublishRequest {
        namespace: whole.namespace.clone(),
        key: whole.key.clone(),
        locale: whole.locale,
        ttl_secs: whole.ttl_secs,
        force: whole.force,
        base_version: base.0.to_vec(),
        patch: Some(patch),
        ..Default::default()
    };
    // A few small blocks go inside the publish; larger ones on the data plane first, as
    // deltas against the blocks they replace where that is smaller (the whole request names
    // the new manifest they are matched against).
    let (payload, uploaded) = match inline_blocks(&jobs)? {
        // Sent inside the publish: they cross the network whether or not it is taken.
        Some(blocks) => {
            let len = blocks.iter().map(|b| b.data.len() as u64).sum();
            (Payload::Inline(blocks), len)
        }
        None => {
            let sent = upload::upload_missing_for(store, server, whole, jobs, progress)
                .await
                .map_err(|e| PutError::Publish(PublishError::Transfer(e)))?;
            (Payload::InPlace, sent)
        }
    };
    match publish::publish(store, server, req, payload, progress).await {
        Ok(mut done) => {
            // The inline bytes the publish counted, or the blocks uploaded before it.
            done.bytes_sent = uploaded;
            Ok(Patched::Done(Box::new(done)))
        }
        Err(e) if e.fault() == Fault::Conflict => {
            tracing::debug!(error = %e, "the store refused the patch; sending the whole manifest");
            Ok(Patched::Refused { uploaded })
        }
        Err(e) => Err(e.into()),
    }
}

/// Changed bytes sent inside a patch publish at most: above it, deltas against the blocks
/// they replace cost less than the bytes themselves.
const PATCH_INLINE_BYTES: u64 = 256 << 10;

/// The blocks of `jobs` read whole, when they are few and small: a small edit is then one
/// round trip, with no question about which blocks the store lacks and no data-plane upload.
fn inline_blocks(jobs: &[UploadJob]) -> Result<Option<Vec<InlineBlock>>, PutError> {
    let total: u64 = jobs.iter().map(|j| u64::from(j.len)).sum();
    if jobs.is_empty() || total > PATCH_INLINE_BYTES.min(MAX_INLINE_BYTES as u64) {
        return Ok(None);
    }
    jobs.iter()
        .map(|j| {
            // Checked against its hash: a file changed since its scan fails the put.
            let data =
                upload::read_block(j).map_err(|e| PutError::Publish(PublishError::Transfer(e)))?;
            Ok(InlineBlock {
                hash: j.hash.0.to_vec(),
                data,
            })
        })
        .collect::<Result<Vec<_>, PutError>>()
        .map(Some)
}

pub fn locale_name(l: Locale) -> &'static str {
    match l {
        Locale::Store => "store",
        Locale::Local => "local",
    }
}

/// One upload job per unique block of the files `wanted` names, read from the first file that
/// holds it.
fn upload_jobs(s: &Scanned, wanted: impl Fn(&str) -> bool) -> Vec<UploadJob> {
    upload::jobs_of(
        s.manifest
            .entries
            .iter()
            .filter(|e| e.kind() == EntryKind::File && wanted(&e.path))
            .filter_map(|e| {
                let path = s.disk_path(&e.path)?;
                Some((Arc::new(path.to_path_buf()), &e.blocks[..]))
            }),
    )
}

fn local_files(s: &Scanned) -> Result<Vec<LocalFile>, PutError> {
    s.files
        .iter()
        .map(|(entry, disk)| {
            let abs = absolute(disk)?;
            Ok(LocalFile {
                entry_path: entry.clone(),
                disk_path: abs.display().to_string(),
            })
        })
        .collect()
}

pub(crate) fn absolute(p: &Path) -> Result<PathBuf, ScanError> {
    std::path::absolute(p).map_err(|source| ScanError::Io {
        path: p.display().to_string(),
        source,
    })
}
