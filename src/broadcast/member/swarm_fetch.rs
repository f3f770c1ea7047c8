//! A member's fetch through its version's swarm: the [`Schedule`] of the swarm module says
//! which piece to fetch from whom; one task per membership syncs with the server, runs the
//! fetches (each one block from one source, over the pooled connections of `fetch.rs`, verified
//! as every fetch is) and tells the schedule how each ended. Every fetch of the membership goes
//! through that task: `kt get` asks for all its blocks at once, a mount's reader for the blocks
//! it reads as it reads them (the rest are skipped until then, so it is a source of what it
//! read and asks the swarm for nothing else). What the swarm could not give is left pending for
//! the caller's fallback (every source it knows).
//!
//! The task knows of its membership only what [`SwarmSetup`] gives it; the membership holds the
//! task's handle ([`SwarmTask`]) and hands it each fetch.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::{mpsc, oneshot};

use crate::dataplane::peers::Peers;
use crate::rpc::ClientError;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::rejoin::{Moved, Rejoin};
use crate::broadcast::swarm::{
    Failure, From, Pace, Plan, Request, Schedule, ScheduleConfig, KEEPALIVE,
};
use crate::dataplane::fetch::{self, Ask, BlockJob, BlockSink, Partial};
use crate::dataplane::sources::{source_addr, SourceAddr};
use crate::dataplane::TransferError;
use crate::hash::BlockHash;
use crate::proto::{JoinRequest, SwarmSyncReply, SwarmSyncRequest};
use crate::rpc::Store;

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
/// Failed syncs in a row after which the swarm is given up, if they went on failing for
/// [`FAILING_FOR`] at least: the death of the window's owner cuts the syncs under way at once,
/// and the swarm goes on at the next owner (a transport error, then a sync that waits for it).
const SYNC_FAILURES: u32 = 3;
const FAILING_FOR: Duration = Duration::from_secs(5);

type Fetched = (Request, Result<Partial, TransferError>);
/// A sync's answer, with the request it carried (its news is sent again if it failed) and how
/// long it took.
type Synced = (
    Result<SwarmSyncReply, ClientError>,
    SwarmSyncRequest,
    Duration,
);
type Reply = oneshot::Sender<Result<Partial, TransferError>>;
/// Where a fetch handed to the task is answered.
pub(super) type Answer = oneshot::Receiver<Result<Partial, TransferError>>;

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

/// What a swarm task needs of its membership.
pub(super) struct SwarmSetup<'a> {
    pub(super) store: Store,
    pub(super) server: &'a str,
    pub(super) ticket: Bytes,
    pub(super) group_id: String,
    pub(super) generation: u64,
    /// This member's id in the window (and on the board).
    pub(super) member: u64,
    /// The version's unique blocks, in the order the server numbers them.
    pub(super) pieces: &'a [BlockHash],
    pub(super) plan: Plan,
    pub(super) reads: bool,
    /// This getter's node (empty without an agent).
    pub(super) node_id: &'a str,
    pub(super) peers: Peers,
    /// The join that made this member, sent again where the window's owner changed.
    pub(super) join: JoinRequest,
    /// Where the membership finds the member's seat once it joined again.
    pub(super) moved: Moved,
}

/// The membership's swarm task, started by its first fetch.
pub(super) struct SwarmTask {
    wants: mpsc::UnboundedSender<Want>,
    /// Every piece was fetched: the member leaves with a copy.
    complete: Arc<AtomicBool>,
}

impl SwarmTask {
    /// Starts the task of the membership `setup` describes.
    pub(super) fn start(setup: SwarmSetup<'_>) -> SwarmTask {
        let (tx, rx) = mpsc::unbounded_channel();
        let complete = Arc::new(AtomicBool::new(false));
        tokio::spawn(Ctx::new(setup, complete.clone()).run(rx));
        SwarmTask {
            wants: tx,
            complete,
        }
    }

    /// Whether the task still takes fetches (it was not given up).
    pub(super) fn live(&self) -> bool {
        !self.wants.is_closed()
    }

    /// Whether every piece was fetched.
    pub(super) fn complete(&self) -> bool {
        self.complete.load(Ordering::Relaxed)
    }

    /// Hands the task a fetch of `jobs`: the store's grants come from `seed`, and no source
    /// labelled `exclude` (this node) is used. `None` if the task is gone.
    pub(super) fn ask(
        &self,
        jobs: Vec<BlockJob>,
        sinks: Arc<dyn BlockSink>,
        seed: Option<SourceAddr>,
        exclude: &str,
        progress: &ProgressBar,
    ) -> Option<Answer> {
        let (reply, answer) = oneshot::channel();
        let want = Want {
            jobs,
            sinks,
            seed,
            exclude: exclude.to_string(),
            progress: progress.clone(),
            reply,
        };
        self.wants.send(want).is_ok().then_some(answer)
    }
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

/// The task's syncs with the server: one at a time.
struct Syncs {
    running: Option<JoinHandle<Synced>>,
    /// A member with a slot free syncs again by then.
    next: Instant,
    last: Instant,
    /// Failed in a row.
    failures: u32,
    /// Since the first of those.
    failing_since: Option<Instant>,
}

impl Syncs {
    fn succeeded(&mut self) {
        self.failures = 0;
        self.failing_since = None;
    }

    /// The next sync waits, longer after each failure in a row (up to twice the interval),
    /// news or not: retried at once, syncs on a connection the owner's death cut fail in a
    /// few milliseconds each.
    fn failed(&mut self) {
        let now = Instant::now();
        self.failures += 1;
        self.failing_since.get_or_insert(now);
        let backoff = (SYNC_INTERVAL / 4) * 2u32.pow(self.failures.clamp(1, 4) - 1);
        self.next = now + backoff.min(SYNC_INTERVAL * 2);
    }
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
    /// The membership's fetches waiting for their pieces, by id.
    opens: HashMap<u64, Open>,
    next_open: u64,
    /// Each piece wanted, and for which fetch.
    by_piece: HashMap<u32, Wanted>,
    /// Verified, and not yet told to the server: a fetch is answered only once its pieces
    /// were told (the board counts its sources' uploads until then).
    untold: HashSet<u32>,
    pace: Pace,
    /// Where to reach the members the board named as sources.
    addrs: HashMap<u64, SourceAddr>,
    /// How this member reaches them.
    peers: Peers,
    /// The piece fetches running, polled by this task itself: a mount reader's fetch goes from
    /// its read task to this one and on to the socket, with no task of its own between (the
    /// verifying and writing are off the async threads already).
    tasks: FuturesUnordered<BoxFuture<'static, Fetched>>,
    syncs: Syncs,
    /// Joining the window again, where its owner changed.
    rejoin: Rejoin,
    /// When a piece last arrived (or a fetch came with none waiting): the stall's clock.
    last_progress: Instant,
}

impl Ctx {
    fn new(setup: SwarmSetup<'_>, complete: Arc<AtomicBool>) -> Self {
        let cfg = match setup.reads {
            true => ScheduleConfig::reader(),
            false => ScheduleConfig::default(),
        };
        let now = Instant::now();
        let rejoin = Rejoin::new(setup.store.clone(), setup.join, setup.moved);
        Ctx {
            rejoin,
            store: setup.store,
            server: setup.server.to_string(),
            ticket: setup.ticket,
            group_id: setup.group_id,
            generation: setup.generation,
            index: setup
                .pieces
                .iter()
                .enumerate()
                .map(|(i, h)| (h.0, i))
                .collect(),
            sched: Schedule::new(setup.member, setup.plan.pieces(), cfg),
            plan: setup.plan,
            gathering: HashMap::new(),
            whole: HashSet::new(),
            reads: setup.reads,
            own: setup.node_id.to_string(),
            complete,
            opens: HashMap::new(),
            next_open: 0,
            by_piece: HashMap::new(),
            untold: HashSet::new(),
            pace: Pace::default(),
            addrs: HashMap::new(),
            peers: setup.peers,
            tasks: FuturesUnordered::new(),
            syncs: Syncs {
                running: None,
                next: now,
                last: now,
                failures: 0,
                failing_since: None,
            },
            last_progress: now,
        }
    }

    /// Runs the membership's swarm until its membership is gone (or the swarm is given up).
    async fn run(mut self, mut wants: mpsc::UnboundedReceiver<Want>) {
        // Nothing is needed until a fetch asks for it.
        for p in 0..self.plan.pieces() {
            self.sched.skip(p);
        }
        let mut closed = false;
        loop {
            let now = Instant::now();
            let quiet = self.tasks.is_empty() && !self.sched.news() && self.syncs.running.is_none();
            if closed && self.opens.is_empty() && quiet {
                return;
            }
            let stalled = !self.opens.is_empty() && now.duration_since(self.last_progress) > STALL;
            let failed = self.syncs.failures >= SYNC_FAILURES
                && self
                    .syncs
                    .failing_since
                    .is_some_and(|t| now.duration_since(t) >= FAILING_FOR);
            if failed || stalled {
                break;
            }
            self.dispatch();
            for p in self.pace.due(std::time::Instant::now()) {
                self.sched.ending(p);
            }
            let idle = self.sched.idle() > 0;
            self.sync_if_due(now, idle);
            // Woken for the next sync that time alone can make due (none while nothing is
            // wanted: news wakes it then).
            let sleeping = self.syncs.running.is_none() && !self.opens.is_empty();
            let wait = self.until_due(idle);
            let running = &mut self.syncs.running;
            let sync_done = async move {
                match running.as_mut() {
                    Some(h) => h.await,
                    None => std::future::pending().await,
                }
            };
            let rejoined = self.rejoin.answered();
            tokio::select! {
                joined = rejoined => self.rejoined(joined),
                want = wants.recv(), if !closed => match want {
                    Some(w) => self.take_in(w),
                    None => closed = true,
                },
                synced = sync_done => self.synced(synced),
                Some(done) = self.tasks.next() => {
                    if self.fetched(done).await.is_break() {
                        break;
                    }
                }
                _ = tokio::time::sleep(wait), if sleeping => {}
            }
            self.answer_finished();
        }
        self.give_up(wants).await;
    }

    /// Starts the fetches the schedule says, each from the source the board named; one whose
    /// piece is no longer wanted, or whose source is unknown or this node, fails at once.
    fn dispatch(&mut self) {
        for r in self.sched.start() {
            let Some(w) = self.by_piece.get(&r.piece) else {
                self.sched.failed(r.piece, r.from, Failure::Broken);
                continue;
            };
            let Some((job, sinks)) = self.piece_job(w) else {
                self.sched.failed(r.piece, r.from, Failure::Broken);
                continue;
            };
            let src = match r.from {
                From::Seed => w.seed.clone(),
                From::Peer(m) => self
                    .addrs
                    .get(&m)
                    .filter(|s| self.own.is_empty() || s.label != self.own)
                    .cloned(),
            };
            let Some(src) = src.filter(|s| s.label != w.exclude) else {
                self.sched.failed(r.piece, r.from, Failure::Broken);
                continue;
            };
            let progress = w.progress.clone();
            self.pace
                .started(r.piece, u64::from(job.len), std::time::Instant::now());
            // The store's grants are few already; a peer serves swarm requests in its slots.
            let ask = match r.from {
                From::Seed => Ask::Plain,
                From::Peer(_) => Ask::Swarm,
            };
            let peers = self.peers.clone();
            self.tasks.push(
                async move {
                    let got =
                        fetch::fetch_partial_as(&peers, vec![job], sinks, &[src], &progress, ask)
                            .await;
                    (r, got)
                }
                .boxed(),
            );
        }
    }

    /// One sync at a time: at once with news, else with a slot free, else to say it is alive
    /// while it fetches (the board takes a silent member for dead). It waits at the server for
    /// a fetch only while nothing runs here, so no news can wait behind it.
    fn sync_if_due(&mut self, now: Instant, idle: bool) {
        let keepalive = self.syncs.last + KEEPALIVE;
        let due = self.sched.news()
            || (idle && (self.tasks.is_empty() || now >= self.syncs.next))
            || (!self.opens.is_empty() && now >= keepalive);
        let waiting_out_a_failure = self.syncs.failures > 0 && now < self.syncs.next;
        if self.syncs.running.is_some() || self.rejoin.running() || waiting_out_a_failure || !due {
            return;
        }
        let mut req = self.sched.sync_request();
        req.group_id = self.group_id.clone();
        req.generation = self.generation;
        if self.tasks.is_empty() && req.idle > 0 {
            req.wait_ms = match self.reads {
                true => READER_WAIT,
                false => WAIT,
            }
            .as_millis() as u32;
        }
        let store = self.store.clone();
        self.syncs.running = Some(tokio::spawn(async move {
            let t0 = Instant::now();
            let got = store.swarm_sync(req.clone()).await;
            (got, req, t0.elapsed())
        }));
        self.syncs.next = now + SYNC_INTERVAL;
        self.syncs.last = now;
    }

    /// How long until a sync that time alone can make due, or a fetch's end is to be told.
    fn until_due(&self, idle: bool) -> Duration {
        let mut wake = match idle {
            true => self.syncs.next.min(self.syncs.last + KEEPALIVE),
            false => self.syncs.last + KEEPALIVE,
        };
        if let Some(due) = self.pace.next_due() {
            wake = wake.min(Instant::from_std(due));
        }
        if self.syncs.failures > 0 {
            wake = wake.min(self.syncs.next);
        }
        wake.saturating_duration_since(Instant::now())
    }

    /// A fetch of the membership comes in: its pieces are wanted from now.
    fn take_in(&mut self, w: Want) {
        if self.opens.is_empty() {
            self.last_progress = Instant::now();
        }
        let id = self.next_open;
        self.next_open += 1;
        if let Some(open) = self.take_want(w, id) {
            self.opens.insert(id, open);
        }
    }

    /// A sync ended: the board's answer goes to the schedule, and where to reach the sources it
    /// names is kept; a failed one's news is sent again.
    fn synced(&mut self, synced: Result<Synced, JoinError>) {
        self.syncs.running = None;
        match synced {
            Ok((Ok(reply), req, took)) => {
                // A held sync's time is the server's wait, not the network's.
                if req.wait_ms == 0 {
                    self.pace.round_trip(took);
                }
                for p in &reply.peers {
                    if let Some(s) = &p.source {
                        let addr = source_addr(s, &self.server, &self.ticket, &self.own);
                        self.addrs.insert(p.member, addr);
                    }
                }
                self.sched.apply(&reply);
                for p in &req.verified {
                    self.untold.remove(p);
                }
                self.syncs.succeeded();
                self.rejoin.settled();
            }
            // The owner changed and the new one knows no such window: join it there.
            Ok((Err(e), req, _)) if e.is_not_found() && self.rejoin.start() => {
                tracing::info!(group = %self.group_id, error = %e, "joining the window again");
                self.sched.unsent(req);
            }
            Ok((Err(e), req, _)) => {
                // What it reported must reach the server: its sources' uploads are counted
                // until it does.
                self.sched.unsent(req);
                self.syncs.failed();
                tracing::warn!(error = %e, "swarm sync failed");
            }
            Err(e) => {
                self.syncs.failed();
                tracing::warn!(error = %e, "swarm sync failed");
            }
        }
    }

    /// The window was joined again (or not): the member goes on from its new seat, telling
    /// the new board what it holds; where the new owner describes the swarm otherwise, the
    /// swarm is given up.
    fn rejoined(
        &mut self,
        joined: Result<Result<crate::proto::JoinResponse, ClientError>, JoinError>,
    ) {
        match self.rejoin.take(joined, &self.index, self.plan.log2()) {
            Ok(seat) => {
                tracing::info!(group = %seat.group_id, generation = seat.generation, member = seat.member, "joined the window again");
                self.group_id = seat.group_id;
                self.generation = seat.generation;
                self.sched.rejoined(seat.member);
                // The old board's member ids name no one now.
                self.addrs.clear();
                self.syncs.succeeded();
                self.syncs.next = Instant::now();
            }
            Err(why) => {
                tracing::warn!(error = %why, "could not join the window again");
                self.syncs.failed();
            }
        }
    }

    /// A piece's fetch ended: a piece that came lands (its block made whole once all its pieces
    /// are here), a failure goes to the schedule. Breaks when the swarm is to be given up: a
    /// sink failed (the disk, say; that fetch fails with it, and every piece in the swarm was
    /// wanted by someone), or a fetch panicked.
    async fn fetched(&mut self, (r, got): Fetched) -> ControlFlow<()> {
        let open = self.by_piece.get(&r.piece).map(|w| w.open);
        let whole = matches!(&got, Ok(g) if g.pending.is_empty());
        self.pace.ended(r.piece, whole, std::time::Instant::now());
        match got {
            Err(e) => {
                self.fail_open(open, e);
                ControlFlow::Break(())
            }
            Ok(got) if got.pending.is_empty() => {
                if let Err(e) = self.landed(r.piece).await {
                    self.fail_open(open, e);
                    return ControlFlow::Break(());
                }
                self.sched.verified(r.piece);
                self.untold.insert(r.piece);
                self.last_progress = Instant::now();
                if let Some(o) = open.and_then(|id| self.opens.get_mut(&id)) {
                    o.part.report.add(got.report);
                }
                if self.sched.complete() {
                    self.complete.store(true, Ordering::Relaxed);
                }
                ControlFlow::Continue(())
            }
            Ok(got) => {
                let why = match got.failures.first() {
                    Some(f) if f.busy && !f.broken => Failure::Busy,
                    Some(f) if f.lacked && !f.broken => Failure::Missing,
                    _ => Failure::Broken,
                };
                self.sched.failed(r.piece, r.from, why);
                if why != Failure::Busy {
                    if let Some(o) = open.and_then(|id| self.opens.get_mut(&id)) {
                        o.part.failures.extend(got.failures);
                    }
                }
                ControlFlow::Continue(())
            }
        }
    }

    /// Fetch `open` fails with `e`: its pieces are wanted no more.
    fn fail_open(&mut self, open: Option<u64>, e: TransferError) {
        if let Some(o) = open.and_then(|id| self.opens.remove(&id)) {
            for p in &o.pieces {
                self.by_piece.remove(p);
            }
            let _ = o.reply.send(Err(e));
        }
    }

    /// Fetches whose pieces all arrived and were told are answered.
    fn answer_finished(&mut self) {
        let finished: Vec<u64> = self
            .opens
            .iter()
            .filter(|(_, o)| {
                o.pieces
                    .iter()
                    .all(|p| self.sched.has(*p) && !self.untold.contains(p))
            })
            .map(|(&id, _)| id)
            .collect();
        for id in finished {
            if let Some(o) = self.opens.remove(&id) {
                for p in &o.pieces {
                    self.by_piece.remove(p);
                }
                let _ = o.reply.send(Ok(o.part));
            }
        }
    }

    /// Given up: fetches still running end with it, and what is left goes to the fallback.
    async fn give_up(mut self, mut wants: mpsc::UnboundedReceiver<Want>) {
        if let Some(h) = self.syncs.running.take() {
            h.abort();
        }
        // What finished is kept; what is still under way is dropped.
        let mut running = std::mem::take(&mut self.tasks);
        while let Some(Some(done)) = running.next().now_or_never() {
            if let (r, Ok(got)) = done {
                if got.pending.is_empty() && self.landed(r.piece).await.is_ok() {
                    self.sched.verified(r.piece);
                    let open = self.by_piece.get(&r.piece).map(|w| w.open);
                    if let Some(o) = open.and_then(|id| self.opens.get_mut(&id)) {
                        o.part.report.add(got.report);
                    }
                }
            }
        }
        wants.close();
        for (_, mut o) in std::mem::take(&mut self.opens) {
            let mut left = HashSet::new();
            for p in &o.pieces {
                if let Some(w) = self.by_piece.remove(p) {
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
    async fn landed(&mut self, p: u32) -> Result<(), TransferError> {
        let Some(w) = self.by_piece.get(&p) else {
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
    fn take_want(&mut self, w: Want, id: u64) -> Option<Open> {
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
                .all(|p| !self.by_piece.contains_key(&p) && !self.sched.has(p));
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
                self.by_piece.insert(
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
        assert!(
            crate::blocks::node::UPLOAD_SLOTS >= crate::broadcast::swarm::DEFAULT_UPLOADS as usize
        );
        assert!(
            crate::blocks::node::UPLOAD_SLOTS >= crate::broadcast::swarm::READER_UPLOADS as usize
        );
    }
}
