//! Mounts hosted by an agent (`kt agent --host-mounts`): each namespace's filesystem mounted in
//! the agent's own process, over its one block cache and under its one node id, on request over
//! its unix socket (`kt attach` / `kt detach`). This is how every volume on a node can share one
//! agent: a mount of another namespace is one more FUSE session here, not one more agent.
//! Whoever can connect to the agent's socket can mount anywhere as the agent's user, so the flag
//! is for agents whose socket only root reaches (kt-csi's state directory).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{oneshot, Mutex};
use tokio::task::JoinHandle;

use super::config::AgentConfig;
use crate::blocks::node::NodeBlocks;
use crate::fs::session::{self, MountError, Mounted, Stop};
use crate::keeper::{KeeperClient, KeeperError};
use crate::key::Namespace;
use crate::proto::{Locale, MountRequest};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path} is already the mount of namespace {namespace}{ro}")]
    Conflict {
        path: String,
        namespace: String,
        ro: &'static str,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("mounting {path}: {reason}")]
    Mount { path: String, reason: String },
    #[error("{0} is not mounted by this agent")]
    NotMounted(String),
}

struct Hosted {
    namespace: String,
    read_only: bool,
    stop: oneshot::Sender<Stop>,
    /// Ends when the mount is gone: stopped here, or unmounted from outside.
    done: JoinHandle<()>,
}

pub struct HostedMounts {
    cfg: AgentConfig,
    blocks: Arc<NodeBlocks>,
    table: Mutex<HashMap<PathBuf, Hosted>>,
}

impl HostedMounts {
    pub fn new(cfg: AgentConfig, blocks: Arc<NodeBlocks>) -> Self {
        HostedMounts {
            cfg,
            blocks,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// Mounts `req.namespace` at `req.mountpoint`; `true` when that very mount is already
    /// here (asking twice is success, as CSI publishes are).
    pub async fn mount(&self, req: MountRequest) -> Result<bool, HostError> {
        let ns =
            Namespace::parse(&req.namespace).map_err(|e| HostError::BadRequest(e.to_string()))?;
        let mp = PathBuf::from(&req.mountpoint);
        if !mp.is_absolute() {
            return Err(HostError::BadRequest(format!(
                "mountpoint {} is not an absolute path",
                req.mountpoint
            )));
        }
        let locale = Locale::try_from(req.locale)
            .map_err(|_| HostError::BadRequest(format!("unknown locale {}", req.locale)))?;
        let mut table = self.table.lock().await;
        if let Some(h) = table.get(&mp) {
            if !h.done.is_finished() {
                if h.namespace == ns.as_str() && h.read_only == req.read_only {
                    return Ok(true);
                }
                return Err(HostError::Conflict {
                    path: req.mountpoint,
                    namespace: h.namespace.clone(),
                    ro: if h.read_only { " (read-only)" } else { "" },
                });
            }
            table.remove(&mp);
        }
        let mut fs = self
            .cfg
            .fs_config(ns.clone(), locale, req.read_only, req.fanout);
        fs.writeback = req.writeback;
        fs.stale_reads = req.stale_reads;
        let (blocks, at) = (self.blocks.clone(), mp.clone());
        let keeper = self.cfg.fd_keeper.clone().map(KeeperClient::new);
        let (path, read_only) = (req.mountpoint.clone(), req.read_only);
        let mounted = tokio::task::spawn_blocking(move || match keeper {
            Some(k) => session::mount_kept(blocks, fs, k, req),
            None => session::mount(blocks, fs, &at),
        })
        .await;
        let mounted = flatten(&path, mounted)?;
        tracing::info!(namespace = %ns, mountpoint = %mp.display(), read_only, "mounted");
        table.insert(mp, host(ns.to_string(), read_only, mounted));
        Ok(false)
    }

    /// Serves again every mount the keeper held for an agent that died (see `crate::keeper`).
    /// A mount that cannot be taken over is logged and left to the keeper.
    pub async fn resume_kept(&self, keeper: KeeperClient) -> Result<usize, KeeperError> {
        let kept = {
            let k = keeper.clone();
            tokio::task::spawn_blocking(move || k.list())
                .await
                .map_err(|e| KeeperError::Protocol(e.to_string()))??
        };
        let mut table = self.table.lock().await;
        let mut resumed = 0;
        for (record, fd) in kept {
            let req = record.mount.clone().unwrap_or_default();
            let (path, read_only) = (req.mountpoint.clone(), req.read_only);
            let ns = match Namespace::parse(&req.namespace) {
                Ok(ns) => ns,
                Err(e) => {
                    tracing::warn!(mountpoint = %path, error = %e, "a kept mount with a bad namespace");
                    continue;
                }
            };
            let locale = Locale::try_from(req.locale).unwrap_or(Locale::Store);
            let mut fs = self
                .cfg
                .fs_config(ns.clone(), locale, req.read_only, req.fanout);
            fs.writeback = req.writeback;
            fs.stale_reads = req.stale_reads;
            let (blocks, k) = (self.blocks.clone(), keeper.clone());
            let mounted =
                tokio::task::spawn_blocking(move || session::resume(blocks, fs, k, record, fd))
                    .await;
            match flatten(&path, mounted) {
                Ok(m) => {
                    tracing::info!(namespace = %ns, mountpoint = %path, "took over a kept mount");
                    table.insert(PathBuf::from(&path), host(ns.to_string(), read_only, m));
                    resumed += 1;
                }
                Err(e) => tracing::error!(error = %e, "could not take over a kept mount"),
            }
        }
        Ok(resumed)
    }

    /// Unmounts a hosted mount, publishing what is still open for writing first.
    pub async fn unmount(&self, mountpoint: &str) -> Result<(), HostError> {
        let h = self
            .table
            .lock()
            .await
            .remove(&PathBuf::from(mountpoint))
            .ok_or_else(|| HostError::NotMounted(mountpoint.to_string()))?;
        finish(h, Stop::Unmount).await;
        tracing::info!(mountpoint, "unmounted");
        Ok(())
    }

    /// Ends every mount (the agent is stopping): unmounts it, or leaves it to the keeper for
    /// the next agent.
    pub async fn stop_all(&self, how: Stop) {
        let all: Vec<Hosted> = self.table.lock().await.drain().map(|(_, h)| h).collect();
        for h in all {
            finish(h, how).await;
        }
    }
}

fn flatten(
    path: &str,
    r: Result<Result<Mounted, MountError>, tokio::task::JoinError>,
) -> Result<Mounted, HostError> {
    let err = |reason: String| HostError::Mount {
        path: path.to_string(),
        reason,
    };
    r.map_err(|e| err(e.to_string()))?
        .map_err(|e| err(e.to_string()))
}

fn host(namespace: String, read_only: bool, mounted: Mounted) -> Hosted {
    let (stop, stopped) = oneshot::channel::<Stop>();
    let done = tokio::spawn(async move {
        mounted
            .serve_until(async { stopped.await.unwrap_or(Stop::Unmount) })
            .await;
    });
    Hosted {
        namespace,
        read_only,
        stop,
        done,
    }
}

async fn finish(h: Hosted, how: Stop) {
    let _ = h.stop.send(how);
    let _ = h.done.await;
}
