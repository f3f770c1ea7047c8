//! A member's fetch through its version's swarm: the [`Schedule`] of the swarm module says
//! which piece to fetch from whom; this loop syncs with the server, runs the fetches (each one
//! block from one source, over the pooled connections of `fetch.rs`, verified as every fetch
//! is) and tells the schedule how each ended. What the swarm could not give is left pending
//! for the caller's fallback (every source it knows).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::fetch::{self, Ask, BlockJob, BlockSink, Partial};
use super::sources::{source_addr, SourceAddr};
use super::tree::Membership;
use super::TransferError;
use crate::proto::{SwarmSyncReply, SwarmSyncRequest};
use crate::swarm::{Failure, From, Request, Schedule, ScheduleConfig};

/// How long a member with nothing to fetch lets the server hold its sync until something is
/// chosen for it.
const WAIT: Duration = Duration::from_millis(1_000);
/// A member with a slot free syncs at least this often while its other fetches run.
const SYNC_INTERVAL: Duration = Duration::from_millis(1_000);
/// With nothing arriving for this long, the swarm is given up for what is left.
const STALL: Duration = Duration::from_secs(30);
/// Failed syncs in a row after which the swarm is given up.
const SYNC_FAILURES: u32 = 3;

type Fetched = (Request, Result<Partial, TransferError>);
/// A sync's answer, or why it failed with the request it carried (its news is sent again).
type Synced = Result<SwarmSyncReply, (tonic::Status, SwarmSyncRequest)>;

/// Fetches `jobs` through the swarm of `member`'s version. The store's grants go to the last
/// of `fallback` (the origin or the store); sources labelled `exclude` (this node) are never
/// used. Returns what was fetched, from whom, and what is left.
pub(super) async fn fetch(
    member: &Membership,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    fallback: &[SourceAddr],
    exclude: &str,
    progress: &ProgressBar,
) -> Result<Partial, TransferError> {
    let index: HashMap<[u8; 32], u32> = member
        .pieces
        .iter()
        .enumerate()
        .map(|(i, h)| (h.0, i as u32))
        .collect();
    let mut by_piece: HashMap<u32, BlockJob> = HashMap::new();
    let mut outside = Vec::new();
    for j in jobs {
        match index.get(&j.hash.0) {
            Some(&p) => {
                by_piece.insert(p, j);
            }
            None => outside.push(j),
        }
    }
    let place = member.report().await;
    let mut sched = Schedule::new(
        place.member,
        member.pieces.len() as u32,
        ScheduleConfig::default(),
    );
    for p in 0..member.pieces.len() as u32 {
        if !by_piece.contains_key(&p) {
            sched.skip(p);
        }
    }
    let seed = fallback.last().cloned();
    let mut peers: HashMap<u64, SourceAddr> = HashMap::new();
    let mut tasks: JoinSet<Fetched> = JoinSet::new();
    let mut syncing: Option<JoinHandle<Synced>> = None;
    let mut part = Partial::default();
    let mut next_sync = Instant::now();
    let mut last_progress = Instant::now();
    let mut sync_failures = 0;
    loop {
        let now = Instant::now();
        let settled = sched.done() && tasks.is_empty() && !sched.news() && syncing.is_none();
        if settled || sync_failures >= SYNC_FAILURES || now.duration_since(last_progress) > STALL {
            break;
        }
        for r in sched.start() {
            let src = match r.from {
                From::Seed => seed.clone(),
                From::Peer(m) => peers.get(&m).cloned(),
            };
            let (Some(src), Some(job)) = (src, by_piece.get(&r.piece)) else {
                sched.failed(r.piece, r.from, Failure::Broken);
                continue;
            };
            if src.label == exclude {
                sched.failed(r.piece, r.from, Failure::Broken);
                continue;
            }
            let (job, sinks, progress) = (job.clone(), sinks.clone(), progress.clone());
            // The store's grants are few already; a peer serves swarm requests in its slots.
            let ask = match r.from {
                From::Seed => Ask::Plain,
                From::Peer(_) => Ask::Swarm,
            };
            tasks.spawn(async move {
                let got = fetch::fetch_partial_as(vec![job], sinks, &[src], &progress, ask).await;
                (r, got)
            });
        }
        // One sync at a time: at once with news, else with a slot free. It waits at the server
        // for a fetch only while nothing runs here, so no news can wait behind it.
        let due = sched.news() || (sched.idle() > 0 && (tasks.is_empty() || now >= next_sync));
        if syncing.is_none() && due {
            let mut req = sched.sync_request();
            req.group_id = place.group_id.clone();
            req.generation = place.generation;
            if tasks.is_empty() && req.idle > 0 {
                req.wait_ms = WAIT.as_millis() as u32;
            }
            let mut store = member.store.clone();
            syncing = Some(tokio::spawn(async move {
                match store.swarm_sync(req.clone()).await {
                    Ok(r) => Ok(r.into_inner()),
                    Err(e) => Err((e, req)),
                }
            }));
            next_sync = now + SYNC_INTERVAL;
        }
        let sleeping = syncing.is_none();
        let sync_done = async {
            match syncing.as_mut() {
                Some(h) => h.await,
                None => std::future::pending().await,
            }
        };
        let wait = next_sync.saturating_duration_since(Instant::now());
        tokio::select! {
            synced = sync_done => {
                syncing = None;
                match synced {
                    Ok(Ok(reply)) => {
                        for p in &reply.peers {
                            if let Some(s) = &p.source {
                                peers.insert(
                                    p.member,
                                    source_addr(s, &member.server, &member.ticket),
                                );
                            }
                        }
                        sched.apply(&reply);
                        sync_failures = 0;
                    }
                    Ok(Err((e, req))) => {
                        // What it reported must reach the server: its sources' uploads are
                        // counted until it does.
                        sched.unsent(req);
                        sync_failures += 1;
                        tracing::warn!(error = %e.message(), "swarm sync failed");
                        next_sync = Instant::now() + SYNC_INTERVAL / 4;
                    }
                    Err(e) => {
                        sync_failures += 1;
                        tracing::warn!(error = %e, "swarm sync failed");
                    }
                }
            }
            Some(done) = tasks.join_next() => {
                let (r, got) = done.map_err(|e| TransferError::Unavailable {
                    missing: 0,
                    reasons: e.to_string(),
                })?;
                let got = got?;
                let now = Instant::now();
                if got.pending.is_empty() {
                    sched.verified(r.piece);
                    last_progress = now;
                    for (src, _) in &got.report.by_source {
                        member.used(&src.label).await;
                    }
                    part.report.add(got.report);
                } else {
                    let why = match got.failures.first() {
                        Some(f) if f.busy && !f.broken => Failure::Busy,
                        Some(f) if f.lacked && !f.broken => Failure::Missing,
                        _ => Failure::Broken,
                    };
                    sched.failed(r.piece, r.from, why);
                    if why != Failure::Busy {
                        part.failures.extend(got.failures);
                    }
                }
            }
            _ = tokio::time::sleep(wait), if sleeping => {}
        }
    }
    if let Some(h) = syncing.take() {
        h.abort();
    }
    // Fetches still running when the swarm was given up end with it.
    tasks.abort_all();
    while let Some(done) = tasks.join_next().await {
        if let Ok((r, Ok(got))) = done {
            if got.pending.is_empty() {
                sched.verified(r.piece);
                part.report.add(got.report);
            }
        }
    }
    part.pending = by_piece
        .into_iter()
        .filter(|(p, _)| !sched.has(*p))
        .map(|(_, j)| j)
        .chain(outside)
        .collect();
    Ok(part)
}

#[cfg(all(test, feature = "daemons"))]
mod tests {
    #[test]
    fn a_node_serves_at_least_as_many_swarm_requests_at_once_as_the_board_asks_of_it() {
        assert!(crate::blocks::node::UPLOAD_SLOTS >= crate::swarm::DEFAULT_UPLOADS as usize);
    }
}
