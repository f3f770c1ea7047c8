//! What only the store's owner does beside answering calls: rebuild the namespaces' block
//! references where none were kept, collect garbage, rotate the ticket keys. A single server
//! owns its store from its start; a replica of a store on etcd does these once it is elected,
//! and stops when it loses its claim (`owner`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::tickets;
use crate::meta::engine::{Claim, Elector, Fence, Standing};
use crate::meta::gc::GcReport;
use crate::meta::gc_peers::Replicas;
use crate::meta::{MetaError, MetaStore};

/// The owner's work, and what it needs.
pub(super) struct Duties {
    pub meta: Arc<MetaStore>,
    /// Whether callers are tenants of their namespaces (authentication is on).
    pub tenants: bool,
    pub gc_every: Option<Duration>,
    /// Where the store's replicas share collection (a store in shards): how it asks them.
    pub shared_gc: Option<Arc<dyn Replicas>>,
    pub keys: Option<Arc<tickets::TicketKeys>>,
}

/// The owner's running work, stopped when dropped.
pub(super) struct Running(Vec<JoinHandle<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Duties {
    /// Takes up the work: first what must be done before the store is served.
    pub async fn start(&self) -> Result<Running, MetaError> {
        // With tenants, a namespace names only the blocks it references; a store that kept
        // no references has them rebuilt from its keys before it serves.
        let meta = self.meta.clone();
        let tenants = self.tenants;
        tokio::task::spawn_blocking(move || meta.separate_namespaces(tenants))
            .await
            .map_err(|e| MetaError::Corrupt(e.to_string()))??;
        let mut tasks = Vec::new();
        if let Some(every) = self.gc_every {
            let pass = match self.shared_gc.clone() {
                None => Pass::Alone(self.meta.clone()),
                Some(replicas) => Pass::Shared(self.meta.clone(), replicas),
            };
            tasks.push(tokio::spawn(collect_every(pass, every)));
        }
        if let Some(keys) = &self.keys {
            tasks.push(tokio::spawn(rotate_every(keys.clone())));
        }
        Ok(Running(tasks))
    }
}

/// A replica's part in its store's election, until `stop`: unless it owns the store already
/// (`owned`: its claim, and the duties it took up), it stands by until elected, then holds
/// `fence` to its claim and takes up `duties`; it serves as the owner until it stops (and
/// gives the claim up) or loses the claim. Returns why it was lost, if it was (the fence is
/// broken then, which stops the server).
pub(super) async fn elected(
    mut elector: Elector,
    owned: Option<(Claim, Running)>,
    fence: Arc<Fence>,
    standing: watch::Sender<Standing>,
    duties: Duties,
    stop: impl std::future::Future<Output = ()>,
) -> Option<String> {
    tokio::pin!(stop);
    let taken = match owned {
        Some(owned) => Ok(owned),
        None => {
            let claim = tokio::select! {
                claim = elector.campaign(&standing) => claim,
                _ = &mut stop => return None,
            };
            take_over(claim, &fence, &duties, &standing).await
        }
    };
    let lost = match taken {
        Ok((claim, running)) => {
            let kept = elector.keep(claim, &standing, stop).await;
            drop(running);
            kept.err()
        }
        Err(e) => Some(e),
    };
    if let Some(why) = &lost {
        tracing::error!(error = %why, "this replica no longer owns the store");
        standing.send_replace(Standing::Unsure);
        fence.broke();
    }
    lost
}

/// Becomes the owner on `claim`: writes are fenced by it, the duties are taken up, and then
/// calls are answered.
pub(super) async fn take_over(
    claim: Claim,
    fence: &Fence,
    duties: &Duties,
    standing: &watch::Sender<Standing>,
) -> Result<(Claim, Running), String> {
    fence.hold(claim.revision);
    let running = duties
        .start()
        .await
        .map_err(|e| format!("taking the store over failed: {e}"))?;
    standing.send_replace(Standing::Owner);
    Ok((claim, running))
}

/// Who this server is across its restarts, as a replica of a store on etcd: an id kept in its
/// data directory (which one process at a time holds), made at its first start.
pub(super) fn replica_id(data_dir: &Path) -> std::io::Result<String> {
    let path = data_dir.join("replica.id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        Ok(_) => Err(std::io::Error::other(format!(
            "{} is empty",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let seed = tickets::random_seed()?;
            let id: String = seed[..16].iter().map(|b| format!("{b:02x}")).collect();
            tickets::write_secret(&path, id.as_bytes())?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// One pass of collection: a store's own, or one its replicas share.
#[derive(Clone)]
enum Pass {
    Alone(Arc<MetaStore>),
    Shared(Arc<MetaStore>, Arc<dyn Replicas>),
}

impl Pass {
    fn run(&self) -> Result<GcReport, MetaError> {
        match self {
            Pass::Alone(meta) => meta.collect_garbage(),
            Pass::Shared(meta, replicas) => meta.collect_shared(replicas.as_ref()),
        }
    }
}

/// Collects garbage every `every`, off the async threads; a failed pass is logged and the next
/// one tries again.
async fn collect_every(pass: Pass, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let p = pass.clone();
        let done = tokio::task::spawn_blocking(move || p.run()).await;
        if matches!(done, Ok(Ok(_))) {
            crate::metrics::GC_PASSES.inc();
        }
        match done {
            Ok(Ok(r)) if r == Default::default() => tracing::debug!("nothing to collect"),
            Ok(Ok(r)) => tracing::info!(
                blocks = r.blocks,
                bytes = r.block_bytes,
                manifests = r.manifests,
                expired_keys = r.expired_keys,
                orphan_files = r.orphan_files,
                "collected garbage"
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "garbage collection failed"),
            Err(e) => tracing::warn!(error = %e, "garbage collection panicked"),
        }
    }
}

/// Rotates the ticket keys when due, looking every minute (well within the time a new epoch is
/// announced before it signs). A key that cannot be kept on disk is not used: the one in force
/// goes on signing, and the next look tries again.
async fn rotate_every(keys: Arc<tickets::TicketKeys>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let k = keys.clone();
        match tokio::task::spawn_blocking(move || k.rotate()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "rotating the ticket keys"),
            Err(e) => tracing::warn!(error = %e, "rotating the ticket keys"),
        }
    }
}
