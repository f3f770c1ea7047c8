//! A member's fetch through its version's swarm: the [`Schedule`] of the swarm module says
//! which piece to fetch from whom; one task per membership syncs with the server, runs the
//! fetches (each one block from one source, over the pooled connections of `fetch.rs`, verified
//! as every fetch is) and tells the schedule how each ended. Every fetch of the membership goes
//! through that task: `kt get` asks for all its blocks at once, a mount's reader for the blocks
//! it reads as it reads them (the rest are skipped until then, so it is a source of what it
//! read and asks the swarm for nothing else). What the swarm could not give is left pending for
//! the caller's fallback (every source it knows).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::dataplane::fetch::{self, Ask, BlockJob, BlockSink, Partial};
use crate::dataplane::sources::{source_addr, SourceAddr};
use super::membership::Membership;
use crate::dataplane::TransferError;
use crate::proto::{SwarmSyncReply, SwarmSyncRequest};
use crate::rpc::Store;
use crate::broadcast::swarm::{Failure, From, Pace, Plan, Request, Schedule, ScheduleConfig, KEEPALIVE};

/// How long a member with nothing to fetch lets the server hold its sync until something is
/// chosen for it.
const WAIT: Duration = Duration::from_millis(1_000);
/// The same for a mount's reader: what it reads next is told in its next sync, which waits
/// for this one, so a read never waits long behind it.
const READER_WAIT: Duration = Duration::from_millis(200);
/// A member with a slot free syncs at least this often while its other fetches run.
const SYNC_INTERVAL: Duration = Duration::from_millis(1_000);
/// With nothing arriving for this long, the swarm is given up for what is left.
const STALL: Duration = Duration::from_secs(30);
/// Failed syncs in a row after which the swarm is given up.
const SYNC_FAILURES: u32 = 3;

type Fetched = (Request, Result<Partial, TransferError>);
/// A sync's answer, with the request it carried (its news is sent again if it failed) and how
/// long it took.
type Synced = (
    Result<SwarmSyncReply, tonic::Status>,
    SwarmSyncRequest,
    Duration,
);
type Reply = oneshot::Sender<Result<Partial, TransferError>>;

/// Blocks asked of the swarm by one fetch of the membership.
struct Want {
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    /// Where the store's grants are fetched from (the origin or the store).
    seed: Option<SourceAddr>,
    /// This node: never a source of its own fetches.
    exclude: String,
    progress: ProgressBar,
    reply: Reply,
}

/// The membership's swarm task, started by its first fetch.
pub(super) struct SwarmTask {
    wants: mpsc::UnboundedSender<Want>,
    /// Every piece was fetched: the member leaves with a copy.
    pub(super) complete: Arc<AtomicBool>,
}

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
    let (reply, answer) = oneshot::channel();
    let want = Want {
        jobs: jobs.clone(),
        sinks,
        seed: fallback.last().cloned(),
        exclude: exclude.to_string(),
        progress: progress.clone(),
        reply,
    };
    let given_up = || Partial {
        pending: jobs.clone(),
        ..Default::default()
    };
    let sent = {
        let place = member.report().await;
        let mut task = crate::locks::lock(&member.swarm);
        let live = task.as_ref().is_some_and(|t| !t.wants.is_closed());
        if task.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            let complete = Arc::new(AtomicBool::new(false));
            let cfg = match member.reads {
                true => ScheduleConfig::reader(),
                false => ScheduleConfig::default(),
            };
            let ctx = Ctx {
                store: member.store.clone(),
                server: member.server.clone(),
                ticket: member.ticket.clone(),
                group_id: place.group_id,
                generation: place.generation,
                index: member
                    .pieces
                    .iter()
                    .enumerate()
                    .map(|(i, h)| (h.0, i))
                    .collect(),
                plan: member.plan.clone(),
                gathering: HashMap::new(),
                whole: HashSet::new(),
                reads: member.reads,
                own: member.node_id.clone(),
                complete: complete.clone(),
                sched: Schedule::new(place.member, member.plan.pieces(), cfg),
            };
            tokio::spawn(ctx.run(rx));
            *task = Some(SwarmTask {
                wants: tx,
                complete,
            });
        } else if !live {
            // The swarm was given up: everything goes to the fallback.
            return Ok(given_up());
        }
        task.as_ref().map(|t| t.wants.send(want).is_ok())
    };
    if sent != Some(true) {
        return Ok(given_up());
    }
    let part = answer.await.unwrap_or_else(|_| Ok(given_up()))?;
    for (src, _) in &part.report.by_source {
        member.used(&src.label).await;
    }
    Ok(part)
}

/// A fetch waiting for its pieces.
struct Open {
    pieces: Vec<u32>,
    part: Partial,
    reply: Reply,
}

/// A block fetched in pieces: its pieces not here yet.
struct Gathering {
    left: u32,
}

/// A piece wanted, and by whom.
struct Wanted {
    /// Its block's job (the whole block).
    job: BlockJob,
    /// Its block, and its place among the block's pieces.
    block: usize,
    sub: u32,
    open: u64,
    sinks: Arc<dyn BlockSink>,
    seed: Option<SourceAddr>,
    exclude: String,
    progress: ProgressBar,
}

struct Ctx {
    store: Store,
    server: String,
    ticket: Bytes,
    group_id: String,
    generation: u64,
    /// Each unique block's place in the version.
    index: HashMap<[u8; 32], usize>,
    plan: Plan,
    /// Blocks fetched in pieces, not yet whole.
    gathering: HashMap<usize, Gathering>,
    /// Blocks whole and verified here (all their pieces).
    whole: HashSet<usize>,
    reads: bool,
    /// This member's node: never its peer source. Its agent takes what this member receives,
    /// and a request for a block it is receiving waits for it (the chaos run: a final get
    /// asked its own node, registered as a holder from an earlier get, and waited 10 s per
    /// block for itself).
    own: String,
    complete: Arc<AtomicBool>,
    sched: Schedule,
}

impl Ctx {
    /// Runs the membership's swarm until its membership is gone (or the swarm is given up).
    async fn run(mut self, mut wants: mpsc::UnboundedReceiver<Want>) {
        // Nothing is needed until a fetch asks for it.
        for p in 0..self.plan.pieces() {
            self.sched.skip(p);
        }
        let mut opens: HashMap<u64, Open> = HashMap::new();
        let mut next_open = 0u64;
        let mut by_piece: HashMap<u32, Wanted> = HashMap::new();
        // Verified, and not yet told to the server: a fetch is answered only once its pieces
        // were told (the board counts its sources' uploads until then).
        let mut untold: HashSet<u32> = HashSet::new();
        let mut pace = Pace::default();
        let mut peers: HashMap<u64, SourceAddr> = HashMap::new();
        let mut tasks: JoinSet<Fetched> = JoinSet::new();
        let mut syncing: Option<JoinHandle<Synced>> = None;
        let mut next_sync = Instant::now();
        let mut last_sync = Instant::now();
        let mut last_progress = Instant::now();
        let mut sync_failures = 0;
        let mut closed = false;
        loop {
            let now = Instant::now();
            let quiet = tasks.is_empty() && !self.sched.news() && syncing.is_none();
            if closed && opens.is_empty() && quiet {
                return;
            }
            let stalled = !opens.is_empty() && now.duration_since(last_progress) > STALL;
            if sync_failures >= SYNC_FAILURES || stalled {
                break;
            }
            for r in self.sched.start() {
                let Some(w) = by_piece.get(&r.piece) else {
                    self.sched.failed(r.piece, r.from, Failure::Broken);
                    continue;
                };
                let Some((job, sinks)) = self.piece_job(w) else {
                    self.sched.failed(r.piece, r.from, Failure::Broken);
                    continue;
                };
                let src = match r.from {
                    From::Seed => w.seed.clone(),
                    From::Peer(m) => peers
                        .get(&m)
                        .filter(|s| self.own.is_empty() || s.label != self.own)
                        .cloned(),
                };
                let Some(src) = src.filter(|s| s.label != w.exclude) else {
                    self.sched.failed(r.piece, r.from, Failure::Broken);
                    continue;
                };
                let progress = w.progress.clone();
                pace.started(r.piece, u64::from(job.len), std::time::Instant::now());
                // The store's grants are few already; a peer serves swarm requests in its slots.
                let ask = match r.from {
                    From::Seed => Ask::Plain,
                    From::Peer(_) => Ask::Swarm,
                };
                tasks.spawn(async move {
                    let got =
                        fetch::fetch_partial_as(vec![job], sinks, &[src], &progress, ask).await;
                    (r, got)
                });
            }
            for p in pace.due(std::time::Instant::now()) {
                self.sched.ending(p);
            }
            // One sync at a time: at once with news, else with a slot free, else to say it is
            // alive while it fetches (the board takes a silent member for dead). It waits at the
            // server for a fetch only while nothing runs here, so no news can wait behind it.
            let idle = self.sched.idle() > 0;
            let keepalive = last_sync + KEEPALIVE;
            let due = self.sched.news()
                || (idle && (tasks.is_empty() || now >= next_sync))
                || (!opens.is_empty() && now >= keepalive);
            if syncing.is_none() && due {
                let mut req = self.sched.sync_request();
                req.group_id = self.group_id.clone();
                req.generation = self.generation;
                if tasks.is_empty() && req.idle > 0 {
                    req.wait_ms = match self.reads {
                        true => READER_WAIT,
                        false => WAIT,
                    }
                    .as_millis() as u32;
                }
                let mut store = self.store.clone();
                syncing = Some(tokio::spawn(async move {
                    let t0 = Instant::now();
                    let got = store.swarm_sync(req.clone()).await;
                    (got.map(|r| r.into_inner()), req, t0.elapsed())
                }));
                next_sync = now + SYNC_INTERVAL;
                last_sync = now;
            }
            // Woken for the next sync that time alone can make due (none while nothing is
            // wanted: news wakes it then).
            let sleeping = syncing.is_none() && !opens.is_empty();
            let sync_done = async {
                match syncing.as_mut() {
                    Some(h) => h.await,
                    None => std::future::pending().await,
                }
            };
            let mut wake = match idle {
                true => next_sync.min(last_sync + KEEPALIVE),
                false => last_sync + KEEPALIVE,
            };
            if let Some(due) = pace.next_due() {
                wake = wake.min(Instant::from_std(due));
            }
            let wait = wake.saturating_duration_since(Instant::now());
            tokio::select! {
                want = wants.recv(), if !closed => match want {
                    Some(w) => {
                        if opens.is_empty() {
                            last_progress = Instant::now();
                        }
                        let id = next_open;
                        next_open += 1;
                        if let Some(open) = self.take_want(w, id, &mut by_piece) {
                            opens.insert(id, open);
                        }
                    }
                    None => closed = true,
                },
                synced = sync_done => {
                    syncing = None;
                    match synced {
                        Ok((Ok(reply), req, took)) => {
                            // A held sync's time is the server's wait, not the network's.
                            if req.wait_ms == 0 {
                                pace.round_trip(took);
                            }
                            for p in &reply.peers {
                                if let Some(s) = &p.source {
                                    peers.insert(p.member, source_addr(s, &self.server, &self.ticket, &self.own));
                                }
                            }
                            self.sched.apply(&reply);
                            for p in &req.verified {
                                untold.remove(p);
                            }
                            sync_failures = 0;
                        }
                        Ok((Err(e), req, _)) => {
                            // What it reported must reach the server: its sources' uploads are
                            // counted until it does.
                            self.sched.unsent(req);
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
                    let Ok((r, got)) = done else {
                        tracing::warn!("a swarm fetch panicked; giving the swarm up");
                        break;
                    };
                    let open = by_piece.get(&r.piece).map(|w| w.open);
                    let whole = matches!(&got, Ok(g) if g.pending.is_empty());
                    pace.ended(r.piece, whole, std::time::Instant::now());
                    match got {
                        Err(e) => {
                            // The sink failed (the disk, say): that fetch fails with it, and
                            // the swarm is given up (every piece in it was wanted by someone).
                            if let Some(o) = open.and_then(|id| opens.remove(&id)) {
                                for p in &o.pieces {
                                    by_piece.remove(p);
                                }
                                let _ = o.reply.send(Err(e));
                            }
                            break;
                        }
                        Ok(got) if got.pending.is_empty() => {
                            if let Err(e) = self.landed(r.piece, &by_piece).await {
                                if let Some(o) = open.and_then(|id| opens.remove(&id)) {
                                    for p in &o.pieces {
                                        by_piece.remove(p);
                                    }
                                    let _ = o.reply.send(Err(e));
                                }
                                break;
                            }
                            self.sched.verified(r.piece);
                            untold.insert(r.piece);
                            last_progress = Instant::now();
                            if let Some(o) = open.and_then(|id| opens.get_mut(&id)) {
                                o.part.report.add(got.report);
                            }
                            if self.sched.complete() {
                                self.complete.store(true, Ordering::Relaxed);
                            }
                        }
                        Ok(got) => {
                            let why = match got.failures.first() {
                                Some(f) if f.busy && !f.broken => Failure::Busy,
                                Some(f) if f.lacked && !f.broken => Failure::Missing,
                                _ => Failure::Broken,
                            };
                            self.sched.failed(r.piece, r.from, why);
                            if why != Failure::Busy {
                                if let Some(o) = open.and_then(|id| opens.get_mut(&id)) {
                                    o.part.failures.extend(got.failures);
                                }
                            }
                        }
                    }
                }
                _ = tokio::time::sleep(wait), if sleeping => {}
            }
            // Fetches whose pieces all arrived and were told are answered.
            let finished: Vec<u64> = opens
                .iter()
                .filter(|(_, o)| {
                    o.pieces
                        .iter()
                        .all(|p| self.sched.has(*p) && !untold.contains(p))
                })
                .map(|(&id, _)| id)
                .collect();
            for id in finished {
                if let Some(o) = opens.remove(&id) {
                    for p in &o.pieces {
                        by_piece.remove(p);
                    }
                    let _ = o.reply.send(Ok(o.part));
                }
            }
        }
        // Given up: fetches still running end with it, and what is left goes to the fallback.
        if let Some(h) = syncing.take() {
            h.abort();
        }
        tasks.abort_all();
        while let Some(done) = tasks.join_next().await {
            if let Ok((r, Ok(got))) = done {
                if got.pending.is_empty() && self.landed(r.piece, &by_piece).await.is_ok() {
                    self.sched.verified(r.piece);
                    let open = by_piece.get(&r.piece).map(|w| w.open);
                    if let Some(o) = open.and_then(|id| opens.get_mut(&id)) {
                        o.part.report.add(got.report);
                    }
                }
            }
        }
        wants.close();
        for (_, mut o) in opens {
            let mut left = HashSet::new();
            for p in &o.pieces {
                if let Some(w) = by_piece.remove(p) {
                    // A block is fetched whole by the fallback unless all its pieces came.
                    if !self.whole.contains(&w.block) && left.insert(w.block) {
                        o.part.pending.push(w.job);
                    }
                }
            }
            let _ = o.reply.send(Ok(o.part));
        }
        while let Ok(w) = wants.try_recv() {
            let _ = w.reply.send(Ok(Partial {
                pending: w.jobs,
                ..Default::default()
            }));
        }
    }

    /// Whether `job`'s block cuts into `count` pieces as the plan says (the server's lengths
    /// and the manifest's agree).
    fn cut_fits(&self, job: &BlockJob, count: usize) -> bool {
        match self.plan.log2() {
            0 => count == 1,
            log2 => crate::dataplane::piece::cut(u64::from(job.len), log2)
                .is_some_and(|c| c.count() as usize == count),
        }
    }

    /// What to fetch for a wanted piece: the whole block for a block of one piece, else the
    /// piece (its sinks take pieces one by one: see [`Ctx::take_want`]).
    fn piece_job(&self, w: &Wanted) -> Option<(BlockJob, Arc<dyn BlockSink>)> {
        if !self.gathering.contains_key(&w.block) {
            return Some((w.job.clone(), w.sinks.clone()));
        }
        Some((w.job.piece(self.plan.log2(), w.sub)?, w.sinks.clone()))
    }

    /// Piece `p` arrived and matched: once every piece of its block is here, the block is
    /// whole, and its sinks are told.
    async fn landed(
        &mut self,
        p: u32,
        by_piece: &HashMap<u32, Wanted>,
    ) -> Result<(), TransferError> {
        let Some(w) = by_piece.get(&p) else {
            return Ok(());
        };
        let Some(g) = self.gathering.get_mut(&w.block) else {
            self.whole.insert(w.block);
            return Ok(());
        };
        g.left = g.left.saturating_sub(1);
        if g.left > 0 {
            return Ok(());
        }
        self.gathering.remove(&w.block);
        let (job, sinks) = (w.job.clone(), w.sinks.clone());
        tokio::task::spawn_blocking(move || sinks.pieces_done(&job))
            .await
            .map_err(|e| TransferError::Write {
                path: String::new(),
                source: std::io::Error::other(e.to_string()),
            })??;
        self.whole.insert(w.block);
        Ok(())
    }

    /// Takes in a fetch: its pieces are wanted; a block that is not one of the version's
    /// pieces, or that another fetch waits for or this member fetched already, is left to the
    /// caller's fallback. Returns the fetch to wait for, or `None` when it was answered at once.
    fn take_want(&mut self, w: Want, id: u64, by_piece: &mut HashMap<u32, Wanted>) -> Option<Open> {
        let mut open = Open {
            pieces: Vec::new(),
            part: Partial::default(),
            reply: w.reply,
        };
        for job in w.jobs {
            let block = self.index.get(&job.hash.0).copied();
            // Pieces smaller than blocks go only to sinks that write them where they go (a
            // getter's files, which its agent serves piece by piece); anyone else fetches such
            // a block whole from the caller's sources, as without a swarm.
            let pieces = block
                .and_then(|b| self.plan.pieces_of(b))
                .filter(|r| self.cut_fits(&job, r.len()))
                .filter(|r| r.len() == 1 || w.sinks.takes_pieces());
            let (Some(b), Some(pieces)) = (block, pieces) else {
                open.part.pending.push(job);
                continue;
            };
            let free = pieces
                .clone()
                .all(|p| !by_piece.contains_key(&p) && !self.sched.has(p));
            if !free || self.whole.contains(&b) {
                open.part.pending.push(job);
                continue;
            }
            if pieces.len() > 1 {
                self.gathering.insert(
                    b,
                    Gathering {
                        left: pieces.len() as u32,
                    },
                );
            }
            for p in pieces.clone() {
                self.sched.want(p);
                open.pieces.push(p);
                by_piece.insert(
                    p,
                    Wanted {
                        job: job.clone(),
                        block: b,
                        sub: p - pieces.start,
                        open: id,
                        sinks: w.sinks.clone(),
                        seed: w.seed.clone(),
                        exclude: w.exclude.clone(),
                        progress: w.progress.clone(),
                    },
                );
            }
        }
        if open.pieces.is_empty() {
            let _ = open.reply.send(Ok(open.part));
            return None;
        }
        Some(open)
    }
}

#[cfg(all(test, feature = "daemons"))]
mod tests {
    #[test]
    fn a_node_serves_at_least_as_many_swarm_requests_at_once_as_the_board_asks_of_it() {
        assert!(crate::blocks::node::UPLOAD_SLOTS >= crate::broadcast::swarm::DEFAULT_UPLOADS as usize);
        assert!(crate::blocks::node::UPLOAD_SLOTS >= crate::broadcast::swarm::READER_UPLOADS as usize);
    }
}
