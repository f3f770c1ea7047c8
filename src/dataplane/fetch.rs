//! Fetching a set of blocks from an ordered list of sources into files (or any [`BlockSink`]).
//!
//! Each source is tried in order. Per source, a couple of connections each keep a byte budget of
//! requests in flight; a block is verified against its hash off the async threads and written
//! straight to every place it belongs (identical blocks are fetched once). What one source cannot
//! give — it lacks a block, it dies mid-transfer, it sends bytes that do not match — moves on to
//! the next source. A source that sends one corrupt block is not asked again.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use indicatif::ProgressBar;
use tokio::sync::Semaphore;

use super::budget::{permits, CONNS_PER_SOURCE, UNIT, WINDOW_BYTES};
use super::error::TransferError;
use super::sources::SourceAddr;
use super::wire::{self, Response, WireError};
use crate::hash::subtree::Cv;
use crate::hash::BlockHash;

/// Requests in flight on one connection, whatever their size.
const WINDOW_REQUESTS: usize = 256;

/// One unique block to fetch and every place it goes: `(file index, offset)`.
#[derive(Clone, Debug)]
pub struct BlockJob {
    pub hash: BlockHash,
    pub len: u32,
    pub targets: Vec<(usize, u64)>,
    /// A piece of the block rather than the whole (a swarm's sub-block piece): `len` is then
    /// the piece's length and `targets` where the piece's bytes go.
    pub piece: Option<PieceOf>,
}

/// Which piece of its block a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceOf {
    pub log2: u8,
    pub index: u32,
    /// The whole block's length.
    pub block_len: u64,
}

impl BlockJob {
    /// Piece `index` of this (whole-block) job, cut in pieces of `2^log2` bytes; `None` past
    /// the block's pieces or for a cut the data plane does not serve.
    pub fn piece(&self, log2: u8, index: u32) -> Option<BlockJob> {
        let block_len = u64::from(self.len);
        let r = super::piece::cut(block_len, log2)?.range(index)?;
        Some(BlockJob {
            hash: self.hash,
            len: (r.end - r.start) as u32,
            targets: self
                .targets
                .iter()
                .map(|&(f, off)| (f, off + r.start))
                .collect(),
            piece: Some(PieceOf {
                log2,
                index,
                block_len,
            }),
        })
    }
}

/// Where verified blocks go.
pub trait BlockSink: Send + Sync + 'static {
    /// Stores a block that matched its hash. Runs on a blocking thread. The block comes as the
    /// buffer it was received into, so a sink that keeps it in memory need not copy it.
    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError>;
    /// Stores a piece (a piece job, where [`BlockSink::takes_pieces`]) that matched its
    /// block's values `cvs`, which were checked against the block's hash.
    fn put_piece(&self, job: &BlockJob, data: &Bytes, _cvs: &[Cv]) -> Result<(), TransferError> {
        self.put(job, data)
    }
    /// Whether pieces of a block may be put one by one (the sink writes them where they go);
    /// otherwise they are gathered and put as the whole block.
    fn takes_pieces(&self) -> bool {
        false
    }
    /// Every piece of `job` (a whole-block job) was put: the block is whole and verified.
    fn pieces_done(&self, _job: &BlockJob) -> Result<(), TransferError> {
        Ok(())
    }
}

/// Files that blocks are written into, at the `(file index, offset)` targets of each job. A
/// file is opened at its first write and closed once every byte it expects has come (or at
/// once while [`KEEP_OPEN`] others are open): a tree of more files than the process may open
/// is fetched all the same.
pub struct Sinks {
    files: Vec<Sink>,
    open: AtomicUsize,
}

/// How many files [`Sinks`] keeps open between writes.
const KEEP_OPEN: usize = 256;

struct Sink {
    path: PathBuf,
    state: std::sync::Mutex<SinkState>,
}

struct SinkState {
    file: Option<File>,
    /// Bytes still to be written into it.
    left: u64,
}

impl Sinks {
    /// Files already made, each with the number of bytes the jobs will write into it.
    pub fn new(files: Vec<(PathBuf, u64)>) -> Self {
        Sinks {
            files: files
                .into_iter()
                .map(|(path, left)| Sink {
                    path,
                    state: std::sync::Mutex::new(SinkState { file: None, left }),
                })
                .collect(),
            open: AtomicUsize::new(0),
        }
    }
}

impl BlockSink for Sinks {
    fn takes_pieces(&self) -> bool {
        true
    }

    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        for &(idx, off) in &job.targets {
            let Some(sink) = self.files.get(idx) else {
                continue;
            };
            let failed = |source| TransferError::Write {
                path: sink.path.display().to_string(),
                source,
            };
            // Writes to one file are serialised by the kernel anyway (the inode lock), where
            // the waiting threads spin: measured, a tenth of a `kt get`'s CPU. Here they sleep.
            let mut state = crate::locks::lock(&sink.state);
            let file = match state.file.take() {
                Some(f) => f,
                None => {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&sink.path)
                        .map_err(failed)?;
                    self.open.fetch_add(1, Ordering::SeqCst);
                    f
                }
            };
            let written = crate::blocks::pieces::write_all_at(&file, data, off);
            state.left = state.left.saturating_sub(data.len() as u64);
            if written.is_ok() && state.left > 0 && self.open.load(Ordering::SeqCst) <= KEEP_OPEN {
                state.file = Some(file);
            } else {
                drop(file);
                self.open.fetch_sub(1, Ordering::SeqCst);
            }
            written.map_err(failed)?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub struct FetchReport {
    /// Bytes received from each source that gave any, in source order.
    pub by_source: Vec<(SourceAddr, u64)>,
}

impl FetchReport {
    pub fn bytes(&self) -> u64 {
        self.by_source.iter().map(|(_, b)| b).sum()
    }

    /// Adds another fetch's bytes, by source.
    pub fn add(&mut self, other: FetchReport) {
        for (src, bytes) in other.by_source {
            match self
                .by_source
                .iter_mut()
                .find(|(s, _)| s.label == src.label && s.addr == src.addr)
            {
                Some((_, b)) => *b += bytes,
                None => self.by_source.push((src, bytes)),
            }
        }
    }
}

/// Fetches every job from the sources, nearest first.
pub async fn fetch(
    peers: &Peers,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    sources: &[SourceAddr],
    progress: &ProgressBar,
) -> Result<FetchReport, TransferError> {
    let part = fetch_partial(peers, jobs, sinks, sources, progress).await?;
    part.complete(sources.is_empty())
}

/// What one pass over some sources gave.
#[derive(Debug, Default)]
pub struct Partial {
    pub report: FetchReport,
    /// Jobs no source gave.
    pub pending: Vec<BlockJob>,
    /// Sources that failed, and whether their connection broke (the peer is gone) rather than
    /// the peer answering that it lacks blocks.
    pub failures: Vec<SourceFailure>,
}

#[derive(Debug, Clone)]
pub struct SourceFailure {
    pub source: SourceAddr,
    pub broken: bool,
    /// It answered busy (a swarm request found its upload slots taken).
    pub busy: bool,
    /// It answered, but not with everything: it lacks blocks (rather than lying or failing).
    pub lacked: bool,
    pub reason: String,
}

impl Partial {
    /// The report if nothing is pending, else why not.
    pub fn complete(self, no_sources: bool) -> Result<FetchReport, TransferError> {
        if self.pending.is_empty() {
            return Ok(self.report);
        }
        if no_sources {
            return Err(TransferError::NoSource);
        }
        let mut reasons: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("{}: {}", f.source.label, f.reason))
            .collect();
        reasons.dedup();
        Err(TransferError::Unavailable {
            missing: self.pending.len(),
            reasons: if reasons.is_empty() {
                "no source has them".into()
            } else {
                reasons.join("; ")
            },
        })
    }

    /// Adds another pass's results to this one.
    pub fn absorb(&mut self, other: Partial) {
        self.report.add(other.report);
        self.pending = other.pending;
        self.failures.extend(other.failures);
    }
}

/// How blocks are asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Served whatever the peer's load.
    Plain,
    /// A swarm member's request: served within the peer's upload slots, else answered busy.
    Swarm,
    /// Served from what the peer holds now, without waiting for a block it expects: how a
    /// fetch asks its own node (see [`SourceAddr::own`]).
    Now,
}

/// Fetches what it can from the sources, nearest first, and says what is left.
pub async fn fetch_partial(
    peers: &Peers,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    sources: &[SourceAddr],
    progress: &ProgressBar,
) -> Result<Partial, TransferError> {
    fetch_partial_as(peers, jobs, sinks, sources, progress, Ask::Plain).await
}

/// [`fetch_partial`], asking as `ask` says.
pub async fn fetch_partial_as(
    peers: &Peers,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    sources: &[SourceAddr],
    progress: &ProgressBar,
    ask: Ask,
) -> Result<Partial, TransferError> {
    let _t = crate::metrics::Timer::start(&crate::metrics::FETCH_SECONDS);
    let mut part = Partial::default();
    let mut pending = jobs;
    for source in sources {
        if pending.is_empty() {
            break;
        }
        let mut lanes: Vec<Vec<BlockJob>> = vec![Vec::new(); CONNS_PER_SOURCE.min(pending.len())];
        for (i, j) in pending.drain(..).enumerate() {
            let n = lanes.len();
            lanes[i % n].push(j);
        }
        let poisoned = Arc::new(AtomicBool::new(false));
        let got = Arc::new(AtomicU64::new(0));
        let pass = Pass {
            peers: peers.clone(),
            sinks: sinks.clone(),
            poisoned,
            got: got.clone(),
            progress: progress.clone(),
            ask,
        };
        let lane = |jobs| fetch_lane(pass.clone(), source.clone(), jobs);
        let mut outcomes = Vec::with_capacity(lanes.len());
        if lanes.len() == 1 {
            // One lane (a mount's read of a block): it runs in the caller's task, which then
            // writes the request itself rather than handing it to another.
            for jobs in lanes {
                outcomes.push(lane(jobs).await);
            }
        } else {
            let tasks: Vec<_> = lanes.into_iter().map(|l| tokio::spawn(lane(l))).collect();
            for t in tasks {
                outcomes.push(t.await.map_err(|e| TransferError::Unavailable {
                    missing: 0,
                    reasons: e.to_string(),
                })?);
            }
        }
        let mut failure: Option<SourceFailure> = None;
        for outcome in outcomes {
            let LaneOutcome {
                failed,
                error,
                broken,
                busy,
            } = outcome?;
            let lacks = !failed.is_empty();
            if error.is_some() || lacks {
                let f = failure.get_or_insert_with(|| SourceFailure {
                    source: source.clone(),
                    broken: false,
                    busy: false,
                    lacked: true,
                    reason: String::new(),
                });
                f.broken |= broken;
                f.busy |= busy;
                f.lacked &= error.is_none();
                if let Some(e) = error {
                    tracing::warn!(source = %source.label, addr = %source.addr, error = %e, "source failed");
                    f.reason = e;
                } else if f.reason.is_empty() {
                    f.reason = "does not have every block".into();
                }
            }
            pending.extend(failed);
        }
        part.failures.extend(failure);
        let bytes = got.load(Ordering::Relaxed);
        match source.label == crate::rpc::STORE {
            true => crate::metrics::FETCHED_STORE_BYTES.add(bytes),
            false => crate::metrics::FETCHED_PEER_BYTES.add(bytes),
        }
        if bytes > 0 {
            part.report.by_source.push((source.clone(), bytes));
        }
    }
    part.pending = pending;
    Ok(part)
}

struct LaneOutcome {
    failed: Vec<BlockJob>,
    /// Why this source stopped being used, if it did.
    error: Option<String>,
    /// The connection could not be made or broke.
    broken: bool,
    /// The peer answered busy.
    busy: bool,
}

enum Written {
    Ok,
    Corrupt(BlockJob),
}

use super::peers::{Conn, Peers};

/// One connection's share of a source. A pooled connection that turns out dead before it
/// answered anything is replaced by a fresh one, so a peer is never blamed for a stale socket.
async fn fetch_lane(
    pass: Pass,
    source: SourceAddr,
    jobs: Vec<BlockJob>,
) -> Result<LaneOutcome, TransferError> {
    let Pass {
        peers,
        sinks,
        poisoned,
        got,
        progress,
        ask,
    } = pass;
    let ask = match ask {
        Ask::Plain if source.own => Ask::Now,
        ask => ask,
    };
    let peer = source.peer();
    let SourceAddr { addr, ticket, .. } = source;
    if let Some(conn) = peers.checkout(&addr) {
        let lane = run_lane(
            conn,
            &ticket,
            jobs.clone(),
            sinks.clone(),
            poisoned.clone(),
            ask,
        )
        .await?;
        if lane.answered > 0 || lane.outcome.error.is_none() {
            return Ok(finish_lane(&peers, &addr, lane, &jobs, &got, &progress));
        }
    }
    let conn = match peers.connect(&addr, peer).await {
        Ok(c) => c,
        Err(e) => {
            return Ok(LaneOutcome {
                failed: jobs,
                error: Some(e.to_string()),
                broken: true,
                busy: false,
            })
        }
    };
    let lane = run_lane(conn, &ticket, jobs.clone(), sinks, poisoned, ask).await?;
    Ok(finish_lane(&peers, &addr, lane, &jobs, &got, &progress))
}

/// What the lanes of one pass over a source share.
#[derive(Clone)]
struct Pass {
    peers: Peers,
    sinks: Arc<dyn BlockSink>,
    /// The source sent a block that did not match: its other lanes stop.
    poisoned: Arc<AtomicBool>,
    /// Bytes the source gave.
    got: Arc<AtomicU64>,
    progress: ProgressBar,
    ask: Ask,
}

fn finish_lane(
    peers: &Peers,
    addr: &str,
    lane: Lane,
    jobs: &[BlockJob],
    got: &AtomicU64,
    progress: &ProgressBar,
) -> LaneOutcome {
    if let Some(conn) = lane.reusable {
        peers.checkin(addr, conn);
    }
    let failed_bytes: u64 = lane.outcome.failed.iter().map(|j| u64::from(j.len)).sum();
    let done = jobs.iter().map(|j| u64::from(j.len)).sum::<u64>() - failed_bytes;
    got.fetch_add(done, Ordering::Relaxed);
    progress.inc(done);
    lane.outcome
}

struct Lane {
    outcome: LaneOutcome,
    /// Responses read; 0 with an error means the connection never worked.
    answered: usize,
    /// The connection, when every response was read and it can serve again.
    reusable: Option<Conn>,
}

/// What a connection may have in flight: request bytes not yet written to disk, and requests.
/// A request takes its share as it is sent and gives it back once its answer is dealt with;
/// closing it stops the sender.
struct Window {
    bytes: Arc<Semaphore>,
    requests: Arc<Semaphore>,
}

impl Window {
    fn new() -> Self {
        Window {
            bytes: Arc::new(Semaphore::new((WINDOW_BYTES / UNIT) as usize)),
            requests: Arc::new(Semaphore::new(WINDOW_REQUESTS)),
        }
    }

    /// Waits for room for a request of `len` bytes and takes it; `false` once the window is
    /// closed.
    async fn take(&self, len: u32) -> bool {
        let (Ok(w), Ok(r)) = (
            self.bytes.acquire_many(permits(len)).await,
            self.requests.acquire().await,
        ) else {
            return false;
        };
        w.forget();
        r.forget();
        true
    }

    /// Gives back what a request of `len` bytes took.
    fn give_back(&self, len: u32) {
        self.bytes.add_permits(permits(len) as usize);
        self.requests.add_permits(1);
    }

    fn close(&self) {
        self.bytes.close();
        self.requests.close();
    }
}

/// Pipelined requests on one connection, in-order responses.
async fn run_lane(
    conn: Conn,
    ticket: &Bytes,
    jobs: Vec<BlockJob>,
    sinks: Arc<dyn BlockSink>,
    poisoned: Arc<AtomicBool>,
    ask: Ask,
) -> Result<Lane, TransferError> {
    let (mut tx, mut rx) = conn;
    // A pooled connection may have shown it before; the server keeps one copy.
    let presented = tx.ticket(ticket).await.is_ok();
    let window = Arc::new(Window::new());
    let (tx, (got, fatal)) = tokio::join!(
        send_requests(tx, presented, &jobs, &window, &poisoned, ask),
        receive_answers(&mut rx, &jobs, &sinks, &window, &poisoned),
    );
    if let Some(e) = fatal {
        return Err(e);
    }
    let clean = got.answered == jobs.len() && got.error.is_none();
    Ok(Lane {
        answered: got.answered,
        outcome: LaneOutcome {
            failed: got.failed,
            error: got.error,
            broken: got.broken,
            busy: got.busy,
        },
        reusable: clean.then_some((tx, rx)),
    })
}

/// Sends a request for each job as the window makes room for it, until the jobs are all asked
/// for, the source is poisoned or the connection fails; hands the sending half back.
async fn send_requests(
    mut tx: wire::DataSender,
    presented: bool,
    jobs: &[BlockJob],
    window: &Window,
    poisoned: &AtomicBool,
    ask: Ask,
) -> wire::DataSender {
    if !presented {
        return tx;
    }
    for j in jobs {
        if !window.take(j.len).await {
            break;
        }
        let sent = match (j.piece, ask) {
            (Some(p), _) => tx.get_piece(&j.hash, p.log2, p.index).await,
            (None, Ask::Now) => tx.get_now(&j.hash).await,
            (None, Ask::Plain) => tx.get(&j.hash).await,
            (None, Ask::Swarm) => tx.get_swarm(&j.hash).await,
        };
        if poisoned.load(Ordering::Relaxed) || sent.is_err() {
            break;
        }
    }
    tx
}

/// What the answers on one connection came to.
#[derive(Default)]
struct Answers {
    /// Responses read.
    answered: usize,
    failed: Vec<BlockJob>,
    /// Why the source stopped being used, if it did.
    error: Option<String>,
    broken: bool,
    busy: bool,
    /// Blocks being verified and written.
    writes: Vec<tokio::task::JoinHandle<Result<Written, TransferError>>>,
}

/// Reads an answer for each job in request order and deals with it; once the source is
/// poisoned, what is left is not waited for. Then closes the window, which stops the sender,
/// and waits for the writes: an error of theirs is the fetch's.
async fn receive_answers(
    rx: &mut wire::DataReceiver,
    jobs: &[BlockJob],
    sinks: &Arc<dyn BlockSink>,
    window: &Arc<Window>,
    poisoned: &AtomicBool,
) -> (Answers, Option<TransferError>) {
    let mut got = Answers::default();
    let mut queue: VecDeque<BlockJob> = jobs.iter().cloned().collect();
    while let Some(job) = queue.pop_front() {
        if poisoned.load(Ordering::Relaxed) {
            got.failed.push(job);
            continue;
        }
        match rx.recv_at_most(job.len as usize).await {
            Ok(resp) => {
                got.answered += 1;
                got.take(resp, job, &mut queue, sinks, window, poisoned);
            }
            Err(e) => {
                got.error = Some(e.to_string());
                got.broken = true;
                got.failed.push(job);
                got.failed.extend(queue.drain(..));
            }
        }
    }
    window.close();
    let fatal = got.settle_writes(poisoned).await;
    (got, fatal)
}

impl Answers {
    /// Deals with the answer to `job`: what matches it is verified and written off the async
    /// threads; what the source lacks fails over to the next; a wrong answer poisons the
    /// source; one that makes no sense for a GET ends the connection's use (what is `left` with
    /// it).
    fn take(
        &mut self,
        resp: Response,
        job: BlockJob,
        left: &mut VecDeque<BlockJob>,
        sinks: &Arc<dyn BlockSink>,
        window: &Arc<Window>,
        poisoned: &AtomicBool,
    ) {
        match resp {
            Response::Piece(h, p)
                if h == job.hash && job.piece.is_some() && p.data.len() == job.len as usize =>
            {
                let write = spawn_write(sinks, window, job, Body::Piece(p));
                self.writes.push(write);
            }
            Response::Piece(..) => {
                let why = format!("sent the wrong piece for {}", job.hash);
                self.lied(job, why, poisoned);
            }
            Response::Block(..) if job.piece.is_some() => {
                let why = format!("sent a block for a piece of {}", job.hash);
                self.lied(job, why, poisoned);
            }
            Response::Block(h, data) if h == job.hash && data.len() == job.len as usize => {
                let write = spawn_write(sinks, window, job, Body::Block(data));
                self.writes.push(write);
            }
            // A block of the right hash but another length than the manifest's is as bad as
            // bytes that fail their hash: whichever side lies, the bytes cannot fill the place
            // the manifest gives them.
            Response::Block(h, data) if h == job.hash => {
                let why = format!(
                    "sent {} bytes for block {}, which the manifest says is {} bytes",
                    data.len(),
                    job.hash,
                    job.len
                );
                self.lied(job, why, poisoned);
            }
            Response::Block(..) => {
                let why = format!("sent the wrong block for {}", job.hash);
                self.lied(job, why, poisoned);
            }
            Response::NotFound(_) => {
                window.give_back(job.len);
                self.failed.push(job);
            }
            Response::Busy(_) => {
                window.give_back(job.len);
                self.busy = true;
                self.failed.push(job);
            }
            Response::Error(m) | Response::NoSpace(m) => {
                window.give_back(job.len);
                self.error.get_or_insert(m);
                self.failed.push(job);
            }
            Response::Stored(_) | Response::Signature(..) | Response::Delta(..) => {
                self.error = Some(WireError::BadFrame("unexpected reply").to_string());
                self.failed.push(job);
                self.failed.extend(left.drain(..));
            }
        }
    }

    /// The source answered `job` with what it was not asked for: it is not asked again.
    fn lied(&mut self, job: BlockJob, why: String, poisoned: &AtomicBool) {
        self.error = Some(why);
        poisoned.store(true, Ordering::Relaxed);
        self.failed.push(job);
    }

    /// Waits for the writes: a block that failed verification poisons the source and fails
    /// over; a write that failed is the fetch's error.
    async fn settle_writes(&mut self, poisoned: &AtomicBool) -> Option<TransferError> {
        let mut fatal = None;
        for w in std::mem::take(&mut self.writes) {
            match w.await {
                Ok(Ok(Written::Ok)) => {}
                Ok(Ok(Written::Corrupt(job))) => {
                    poisoned.store(true, Ordering::Relaxed);
                    self.error = Some(format!("block {} failed verification", job.hash));
                    self.failed.push(job);
                }
                Ok(Err(e)) => fatal = Some(e),
                Err(e) => {
                    fatal = Some(TransferError::Write {
                        path: String::new(),
                        source: std::io::Error::other(e.to_string()),
                    })
                }
            }
        }
        fatal
    }
}

/// What a peer sent for a job: a block, or a piece of one with its block's values.
enum Body {
    Block(Bytes),
    Piece(crate::hash::subtree::Piece),
}

/// Verifies and writes `body` off the async threads, then gives back the job's share of the
/// connection's window.
fn spawn_write(
    sinks: &Arc<dyn BlockSink>,
    window: &Arc<Window>,
    job: BlockJob,
    body: Body,
) -> tokio::task::JoinHandle<Result<Written, TransferError>> {
    let (sinks, window) = (sinks.clone(), window.clone());
    let len = job.len;
    tokio::task::spawn_blocking(move || {
        let r = verify_and_write(sinks.as_ref(), job, &body);
        window.give_back(len);
        r
    })
}

fn verify_and_write(
    sinks: &dyn BlockSink,
    job: BlockJob,
    body: &Body,
) -> Result<Written, TransferError> {
    match (body, job.piece) {
        (Body::Block(data), None) if BlockHash::of(data) == job.hash => sinks.put(&job, data)?,
        (Body::Piece(p), Some(of))
            if super::piece::check(p, &job.hash, of.block_len, of.log2, of.index) =>
        {
            sinks.put_piece(&job, &p.data, &p.cvs)?
        }
        _ => return Ok(Written::Corrupt(job)),
    }
    Ok(Written::Ok)
}
