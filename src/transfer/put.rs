//! Publishing: `kt put`, shared by every caller that publishes files from disk.
//!
//! For `locale=store`, the store is asked which blocks it lacks, only those are uploaded, and
//! then the manifest is published; the key switches to the new version in one step, so a put
//! that fails midway leaves the old version in place. For `locale=local`, this node's agent
//! registers the files as in-place sources and publishes with itself as the origin: no bytes move.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::ProgressBar;
use serde::Serialize;

use super::publish::{self, Payload, PublishError};
use super::scan::{self, ScanError, ScanOptions, Scanned};
use super::sources::local_agent;
use super::tree;
use super::upload::{self, UploadJob};
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind};
use crate::proto::{LocalFile, Locale, PublishLocalRequest, PublishRequest, Window, WindowSpec};
use crate::rpc::client::{self, ClientError};
use crate::rpc::{Credential, Fault};

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
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "tree::serialize_window"
    )]
    pub broadcast: Option<Window>,
}

/// Scans, uploads what the store lacks, and publishes.
pub async fn put(opts: PutOptions, progress: &ProgressBar) -> Result<PutReport, PutError> {
    let scan_opts = opts.scan.clone();
    let srcs = opts.srcs.clone();
    let scanned = tokio::task::spawn_blocking(move || scan::scan(&srcs, &scan_opts))
        .await
        .map_err(|e| ScanError::Io {
            path: String::new(),
            source: std::io::Error::other(e.to_string()),
        })??;
    let m = &scanned.manifest;
    let publish = PublishRequest {
        namespace: opts.namespace.to_string(),
        key: opts.key.to_string(),
        manifest: Some(m.clone()),
        locale: opts.locale as i32,
        origin_node: String::new(),
        ttl_secs: opts.ttl_secs,
        force: opts.force,
        // Blocks go on the data plane, after asking which the store lacks: a put of what the
        // store holds sends nothing.
        inline_blocks: Vec::new(),
    };
    let (version, transferred) = match opts.locale {
        Locale::Store => {
            let mut store = client::connect_store(&opts.server, &opts.credential).await?;
            let jobs = upload_jobs(&scanned);
            let done = publish::publish(
                &mut store,
                &opts.server,
                publish,
                Payload::Upload(jobs),
                progress,
            )
            .await?;
            (done.version, done.bytes_sent)
        }
        Locale::Local => {
            let mut agent = client::connect_agent(&opts.agent_socket)
                .await
                .map_err(PutError::NoAgent)?;
            let files = local_files(&scanned)?;
            let resp = agent
                .publish_local(PublishLocalRequest {
                    publish: Some(publish),
                    files,
                })
                .await
                .map_err(ClientError::from)?;
            let v = resp.into_inner().version;
            (Version::from_slice(&v).ok_or(PutError::BadVersion)?, 0)
        }
    };
    let broadcast = match opts.window {
        Some(spec) => {
            // The origin of a local publication is this node; a store one has no node.
            let node = match opts.locale {
                Locale::Local => local_agent(&opts.agent_socket).await.map(|a| a.node()),
                Locale::Store => None,
            };
            let mut store = client::connect_store(&opts.server, &opts.credential).await?;
            Some(
                tree::join_as_putter(
                    &mut store,
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
        key: opts.key.to_string(),
        namespace: opts.namespace.to_string(),
        version: version.hex(),
        locale: locale_name(opts.locale),
        files: manifest::file_count(m),
        bytes: manifest::total_size(m),
        bytes_transferred: transferred,
        broadcast,
    })
}

pub fn locale_name(l: Locale) -> &'static str {
    match l {
        Locale::Store => "store",
        Locale::Local => "local",
    }
}

/// One upload job per unique block, read from the first file that holds it.
fn upload_jobs(s: &Scanned) -> Vec<UploadJob> {
    upload::jobs_of(
        s.manifest
            .entries
            .iter()
            .filter(|e| e.kind() == EntryKind::File)
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
