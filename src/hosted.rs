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
use tonic::Status;

use crate::agent::{AgentBlocks, AgentConfig};
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

impl From<HostError> for Status {
    fn from(e: HostError) -> Status {
        match e {
            HostError::Conflict { .. } => Status::already_exists(e.to_string()),
            HostError::BadRequest(_) => Status::invalid_argument(e.to_string()),
            HostError::Mount { .. } => Status::internal(e.to_string()),
            HostError::NotMounted(_) => Status::not_found(e.to_string()),
        }
    }
}

struct Hosted {
    namespace: String,
    read_only: bool,
    stop: oneshot::Sender<()>,
    /// Ends when the mount is gone: stopped here, or unmounted from outside.
    done: JoinHandle<()>,
}

pub struct HostedMounts {
    cfg: AgentConfig,
    blocks: Arc<AgentBlocks>,
    table: Mutex<HashMap<PathBuf, Hosted>>,
}

impl HostedMounts {
    pub fn new(cfg: AgentConfig, blocks: Arc<AgentBlocks>) -> Self {
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
        let fs = self
            .cfg
            .fs_config(ns.clone(), locale, req.read_only, req.fanout);
        let (blocks, at) = (self.blocks.clone(), mp.clone());
        let mounted = tokio::task::spawn_blocking(move || crate::mount::mount(blocks, fs, &at))
            .await
            .map_err(|e| HostError::Mount {
                path: req.mountpoint.clone(),
                reason: e.to_string(),
            })?
            .map_err(|e| HostError::Mount {
                path: req.mountpoint.clone(),
                reason: format!("{e:#}"),
            })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            mounted
                .serve_until(async {
                    let _ = stopped.await;
                })
                .await;
        });
        tracing::info!(namespace = %ns, mountpoint = %mp.display(), read_only = req.read_only, "mounted");
        table.insert(
            mp,
            Hosted {
                namespace: ns.to_string(),
                read_only: req.read_only,
                stop,
                done,
            },
        );
        Ok(false)
    }

    /// Unmounts a hosted mount, publishing what is still open for writing first.
    pub async fn unmount(&self, mountpoint: &str) -> Result<(), HostError> {
        let h = self
            .table
            .lock()
            .await
            .remove(&PathBuf::from(mountpoint))
            .ok_or_else(|| HostError::NotMounted(mountpoint.to_string()))?;
        finish(h).await;
        tracing::info!(mountpoint, "unmounted");
        Ok(())
    }

    /// Unmounts everything (the agent is stopping).
    pub async fn stop_all(&self) {
        let all: Vec<Hosted> = self.table.lock().await.drain().map(|(_, h)| h).collect();
        for h in all {
            finish(h).await;
        }
    }
}

async fn finish(h: Hosted) {
    let _ = h.stop.send(());
    let _ = h.done.await;
}
