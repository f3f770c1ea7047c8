//! The mount's watch of its namespace: the store server sends every change of what it answered
//! this mount about (see `crate::server::watch`; the mount's listings and resolves name its
//! watcher for that, while the lease holds), the mount forgets what it cached of the changed paths and then
//! acknowledges, and the writer's call returns only after that. So a lookup or listing on this
//! node after another node's close returned shows the change, even within the time a listing
//! is cached. A broken stream is opened again (everything cached is forgotten then: changes
//! may have been missed while it was down).

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::filesystem::FsCore;
use crate::proto::{WatchDown, WatchUp};

/// How often the lease is renewed (a third of the server's lease: two renewals may be lost).
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The longest wait before watching again after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl FsCore {
    /// Watches the namespace for changes (see this module) while the core lives; a mount
    /// starts this, an in-process core used alone need not.
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        self.rt.spawn(run(Arc::downgrade(self)))
    }
}

/// Watches `core`'s namespace until the core is gone.
pub(crate) async fn run(core: Weak<FsCore>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(c) = core.upgrade() else { return };
        let (store, ns) = (c.store(), c.ns());
        drop(c);
        let began = Instant::now();
        let ended = watch_once(&core, store, ns).await;
        // A watch that held a while broke on its own: the next try waits little.
        if began.elapsed() > MAX_BACKOFF * 5 {
            backoff = Duration::from_millis(100);
        }
        match ended {
            Ended::CoreGone => return,
            Ended::Broken(why) => {
                tracing::debug!(%why, "the watch of the namespace broke; watching again");
                if let Some(c) = core.upgrade() {
                    c.listings.lease_lost(c.cfg.stale_reads);
                    c.kernel_forget_all();
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

enum Ended {
    CoreGone,
    Broken(String),
}

async fn watch_once(core: &Weak<FsCore>, store: crate::rpc::client::Store, ns: String) -> Ended {
    let (up, up_rx) = mpsc::channel::<WatchUp>(16);
    let mut renewals: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut next_renewal = 1u64;
    let first = WatchUp {
        namespace: ns,
        acked: 0,
        renew: next_renewal,
    };
    renewals.push_back((next_renewal, Instant::now()));
    next_renewal += 1;
    if up.send(first).await.is_err() {
        return Ended::Broken("its request stream closed".into());
    }
    let mut down = match store.watch(up_rx).await {
        Ok(r) => r,
        Err(e) => {
            // The watch asks again and again: with no store server there, the mount knows
            // it before a reader's call does (stale reads, writes refused).
            if crate::fs::error::unreachable_fault(e.fault()) {
                if let Some(c) = core.upgrade() {
                    c.listings.reached(false);
                }
            }
            return Ended::Broken(e.to_string().to_string());
        }
    };
    let mut acked = 0u64;
    // When the kernel must have forgotten what it holds on the lease's word, unless the lease
    // is renewed first.
    let mut lapse_at: Option<Instant> = None;
    // The first tick is at once: the opening message's renewal was asked when the watch was
    // first tried, and counts from then, which is long past where the call waited for a
    // replica to take the store over (measured: a lease that lapsed 1 s after it was granted,
    // unrenewed, in bench/failover.sh).
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = down.next() => {
                let msg: WatchDown = match msg {
                    Some(Ok(m)) => m,
                    None => return Ended::Broken("the server ended it".into()),
                    Some(Err(e)) => return Ended::Broken(e.to_string()),
                };
                let Some(c) = core.upgrade() else { return Ended::CoreGone };
                if msg.watcher != 0 {
                    c.listings.set_watcher(msg.watcher);
                }
                if msg.seq > 0 {
                    for p in &msg.paths {
                        c.recall(p);
                    }
                    acked = acked.max(msg.seq);
                    // The kernel forgets the names before the writer is answered, unless one of
                    // this mount's own requests holds their directory waiting for it. A change
                    // of everything (a hard link's, told to its own maker too) is not waited
                    // for: it may be this mount's own, whose request holds a directory until
                    // this acknowledges.
                    if !msg.paths.iter().any(String::is_empty) {
                        let settled = tokio::task::spawn_blocking(move || c.kernel_settle()).await;
                        if settled.is_err() {
                            return Ended::CoreGone;
                        }
                    }
                    let ack = WatchUp { acked, ..Default::default() };
                    if up.send(ack).await.is_err() {
                        return Ended::Broken("its request stream closed".into());
                    }
                    continue;
                }
                if msg.renewed > 0 {
                    // The lease runs from when the renewal was asked for: never later than
                    // the server counts it from.
                    while let Some(&(n, sent)) = renewals.front() {
                        renewals.pop_front();
                        if n == msg.renewed {
                            let lease = Duration::from_millis(u64::from(msg.lease_ms));
                            c.listings.lease_until((sent + lease).into_std());
                            lapse_at = Some(sent + lease.saturating_sub(super::LEASE_MARGIN));
                            break;
                        }
                    }
                }
            }
            _ = async {
                match lapse_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                lapse_at = None;
                let Some(c) = core.upgrade() else { return Ended::CoreGone };
                tracing::debug!("the watch's lease is about to lapse unrenewed; the kernel forgets what it held on its word");
                c.listings.lapse();
                c.kernel_forget_all();
            }
            _ = tick.tick() => {
                if core.strong_count() == 0 {
                    return Ended::CoreGone;
                }
                renewals.push_back((next_renewal, Instant::now()));
                if renewals.len() > 8 {
                    renewals.pop_front();
                }
                let renew = WatchUp { acked, renew: next_renewal, ..Default::default() };
                next_renewal += 1;
                if up.send(renew).await.is_err() {
                    return Ended::Broken("its request stream closed".into());
                }
            }
        }
    }
}
