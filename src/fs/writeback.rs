//! Write-back (`kt mount --writeback`): the last close of a written file returns once the file
//! is journaled on this node, and its publish follows in the background, a few at once, so a
//! tree of many small files is written at the speed of the local disk and published as fast as
//! the store server takes it.
//!
//! Weaker than close-to-open, and only on request: another node sees a file once its publish
//! lands (within a second while the server keeps up), not when the writer's `close` returns.
//! This node sees its own files at once (they stay staged until published). `fsync` of a file
//! publishes it before it returns, as without write-back; `fsync` of a directory waits for
//! every queued publish below it. A namespace change that involves a queued file (a rename, a
//! link, an `rmdir` of its directory) publishes it first, so the server never moves a name it
//! has not seen.
//!
//! The journal: one small record per queued file (its key, the staged bytes' file, mode,
//! owner, mtime) in the node's RocksDB (column family [`CF_WRITEBACK`], under the mount's
//! tag), removed once a publish took in every change. A small file staged in memory (see
//! [`super::body`]) has its bytes journaled beside its record, in the same write. A record and
//! the staged bytes outlive a `kill -9` of the agent (the write-ahead log and the file are in
//! the kernel's hands), not a crash of the machine: a file must be `fsync`ed for that. An agent
//! that starts on the same mount again, with or without `--writeback`, publishes what its
//! journal holds. A publish the server refuses for good (the directory was removed by another
//! node, a name became a directory) keeps its bytes in the staging directory's `failed/` and
//! its record under the tag's failed prefix, and says where in the log.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::body::Body;
use super::staged::Staged;
use super::{time_of, to_unix, FsCore, FsError, FsResult};
use crate::db::{BatchOp, Db};
use crate::locks::lock;
use crate::rpc::Fault;

/// Flushers, each with one request in flight: enough to keep the server's group commit
/// batching while one batch is being prepared.
const FLUSHERS: usize = 4;
/// Small files one flusher sends in one `PublishBatch`, at most (the server's limit is 256
/// and 8 MiB; a file sent inline is at most 64 KiB).
const BATCH: usize = 64;
/// How long a queued file may wait for others to fill its batch: a `cp -r` closes a file every
/// few hundred microseconds, so a batch fills in a few milliseconds.
const GATHER: Duration = Duration::from_millis(20);
/// Queued files at most: a close past this waits for the queue to drain (the staged bytes are
/// on local disk, and a queue without bound would put off the publishes without bound).
pub const MAX_QUEUED: usize = 16_384;
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The node database's column family of write-back records.
pub const CF_WRITEBACK: &str = "writeback";

/// One queued publish as journaled.
#[derive(Serialize, Deserialize)]
struct Record {
    key: String,
    /// The staged bytes: a file name in the staging directory (or, with `inline`, the name
    /// the bytes are journaled under).
    data: String,
    /// The bytes are in the journal (a body in memory), not in a file.
    #[serde(default)]
    inline: bool,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime_sec: i64,
    mtime_nsec: u32,
    /// Orders records of one key (the later wins at replay).
    seq: u64,
}

#[derive(Default)]
struct State {
    /// Queued files, with when each was queued.
    queue: VecDeque<(Arc<Staged>, Instant)>,
    /// Callers waiting for the queue to drain: no batch waits to fill meanwhile.
    draining: usize,
    /// Files a flusher is publishing now.
    in_flight: Vec<Arc<Staged>>,
    /// Keys whose publish the server refused for good, with why: `fsync` of their directory
    /// reports them once.
    failed: Vec<(String, String)>,
    flushers: usize,
}

/// Where a mount's records are: the node's database and the mount's tag.
struct Journal {
    db: Db,
    /// Key prefix of this mount's records (its namespace and mountpoint, hashed; then NUL).
    tag: Vec<u8>,
}

impl Journal {
    fn key(&self, data: &str) -> Vec<u8> {
        let mut k = self.tag.clone();
        k.extend_from_slice(data.as_bytes());
        k
    }

    /// Refused records sort apart: the tag with 0x01 for its NUL.
    fn failed_key(&self, data: &str) -> Vec<u8> {
        self.key_marked(data, 1)
    }

    /// Journaled bytes sort apart from the records too: the tag with 0x02 for its NUL.
    fn bytes_key(&self, data: &str) -> Vec<u8> {
        self.key_marked(data, 2)
    }

    fn key_marked(&self, data: &str, mark: u8) -> Vec<u8> {
        let mut k = self.key(data);
        if let Some(last) = k.get_mut(self.tag.len() - 1) {
            *last = mark;
        }
        k
    }
}

/// A staged file's record in the journal: the database, its key, and the key of its bytes
/// when they are journaled too.
pub struct Journaled(Db, Vec<u8>, Option<Vec<u8>>);

impl Journaled {
    fn remove(self) {
        let mut ops = vec![BatchOp::Delete(CF_WRITEBACK, self.1)];
        ops.extend(self.2.map(|k| BatchOp::Delete(CF_WRITEBACK, k)));
        if let Err(e) = self.0.write(ops) {
            tracing::warn!(error = %e, "could not remove a write-back record");
        }
    }
}

/// The queue and journal of a mount's write-back.
pub struct Writeback {
    /// This mount's journal, once write-back started.
    journal: std::sync::OnceLock<Journal>,
    staging: PathBuf,
    state: Mutex<State>,
    /// Wakes whoever waits for the queue to change: flushers for files, closes for room,
    /// drains for an empty queue.
    changed: Notify,
    seq: AtomicU64,
}

impl Writeback {
    pub(super) fn new(staging: &Path) -> Self {
        Writeback {
            journal: std::sync::OnceLock::new(),
            staging: staging.to_path_buf(),
            state: Mutex::default(),
            changed: Notify::new(),
            seq: AtomicU64::new(0),
        }
    }

    /// Whether closes are journaled and queued here (the journal is open).
    pub(super) fn on(&self) -> bool {
        self.journal.get().is_some()
    }

    /// Journals `s` as it is now (after the change it records was counted: see
    /// [`Writeback::forget_if_clean`]).
    fn journal(&self, s: &Staged) -> FsResult<()> {
        let j = self
            .journal
            .get()
            .ok_or_else(|| FsError::Invalid("write-back is off".into()))?;
        // First: what is read below is at least this new.
        let changes = s.changes.load(Ordering::SeqCst);
        let (data, bytes) = {
            let b = lock(&s.body);
            (b.name(), b.bytes().map(<[u8]>::to_vec))
        };
        let (mtime_sec, mtime_nsec) = to_unix(*lock(&s.mtime));
        let (uid, gid) = *lock(&s.owner);
        let record = Record {
            key: s.path(),
            data,
            inline: bytes.is_some(),
            mode: s.mode.load(Ordering::Relaxed),
            uid,
            gid,
            mtime_sec,
            mtime_nsec,
            seq: self.next_seq(),
        };
        let json = serde_json::to_vec(&record)
            .map_err(|e| FsError::Invalid(format!("journal record: {e}")))?;
        let key = j.key(&record.data);
        let mut rec = lock(&s.record);
        if rec.is_some() && s.journaled.load(Ordering::SeqCst) == changes {
            // Journaled as it is (at its close, and now its last release).
            return Ok(());
        }
        let bytes_key = bytes.as_ref().map(|_| j.bytes_key(&record.data));
        let mut ops = vec![BatchOp::Put(CF_WRITEBACK, key.clone(), json)];
        if let (Some(k), Some(b)) = (&bytes_key, bytes) {
            ops.push(BatchOp::Put(CF_WRITEBACK, k.clone(), b));
        }
        j.db.write(ops)?;
        s.journaled.store(changes, Ordering::SeqCst);
        if let Some(old) = rec.replace(Journaled(j.db.clone(), key.clone(), bytes_key)) {
            if old.1 != key {
                old.remove();
            }
        }
        Ok(())
    }

    fn next_seq(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Above every earlier one of this process, and of an earlier process (the clock).
        let mut cur = self.seq.load(Ordering::Relaxed);
        loop {
            let next = now.max(cur + 1);
            match self
                .seq
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(c) => cur = c,
            }
        }
    }

    /// Forgets the record of `s` (gone from every map: nothing journals it again).
    pub(super) fn forget(s: &Staged) {
        if let Some(r) = lock(&s.record).take() {
            r.remove();
        }
    }

    /// Forgets the record of `s` if every change of it is published. Under the record's lock,
    /// as [`Writeback::journal`] writes it: a change counted after the check journals anew.
    pub(super) fn forget_if_clean(s: &Staged) {
        let mut rec = lock(&s.record);
        if !s.dirty() {
            if let Some(r) = rec.take() {
                r.remove();
            }
        }
    }

    /// Queues `s` unless it is queued or being published, waiting while the queue is full.
    async fn push(&self, s: &Arc<Staged>) {
        if s.queued.swap(true, Ordering::SeqCst) {
            return;
        }
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if lock(&self.state).queue.len() < MAX_QUEUED {
                break;
            }
            changed.await;
        }
        self.push_now(s);
    }

    /// Queues `s` without waiting for room: a flusher putting back what failed (only flushers
    /// make room).
    fn push_again(&self, s: &Arc<Staged>) {
        if !s.queued.swap(true, Ordering::SeqCst) {
            self.push_now(s);
        }
    }

    fn push_now(&self, s: &Arc<Staged>) {
        let n = {
            let mut st = lock(&self.state);
            st.queue.push_back((s.clone(), Instant::now()));
            st.queue.len()
        };
        crate::metrics::WRITEBACK_QUEUED.inc();
        // Flushers need waking only for a first file (to start gathering) or a full batch: a
        // flusher gathering wakes by itself when the front file's time is up. (Woken at every
        // file, the four of them cost a `cp -r` of small files more CPU than its publishes.)
        if n == 1 || n.is_multiple_of(BATCH) {
            self.changed.notify_waiters();
        }
    }

    /// The next files to publish (at most `max`), or `None` once the core is gone.
    async fn pop(&self, core: &Weak<FsCore>, max: usize) -> Option<Vec<Arc<Staged>>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let gathered = {
                let mut st = lock(&self.state);
                let gathered = match st.queue.front() {
                    None => None,
                    Some(_) if st.queue.len() >= max || st.draining > 0 => Some(Duration::ZERO),
                    Some((_, at)) => Some(GATHER.saturating_sub(at.elapsed())),
                };
                if gathered == Some(Duration::ZERO) {
                    let n = st.queue.len().min(max);
                    let batch: Vec<Arc<Staged>> = st.queue.drain(..n).map(|(s, _)| s).collect();
                    for s in &batch {
                        // A change from now on queues it again.
                        s.queued.store(false, Ordering::SeqCst);
                    }
                    st.in_flight.extend(batch.iter().cloned());
                    drop(st);
                    self.changed.notify_waiters();
                    return Some(batch);
                }
                gathered
            };
            if core.strong_count() == 0 {
                return None;
            }
            // Woken by a push; the timeout fills a batch, or notices a core that went away.
            let wait = gathered.unwrap_or(Duration::from_secs(1));
            let _ = tokio::time::timeout(wait, changed).await;
        }
    }

    fn finished(&self, s: &Arc<Staged>, failed: Option<String>) {
        {
            let mut st = lock(&self.state);
            st.in_flight.retain(|x| !Arc::ptr_eq(x, s));
            let path = s.path();
            st.failed.retain(|(p, _)| *p != path);
            if let Some(why) = failed {
                st.failed.push((path, why));
            }
        }
        self.changed.notify_waiters();
    }

    /// Waits until nothing at or below `prefix` (`""`: anything) is queued or in flight, and
    /// says which of them the server refused since the last time this was asked.
    pub(super) async fn drain(
        &self,
        prefix: &str,
        until: Option<tokio::time::Instant>,
    ) -> Vec<(String, String)> {
        let below = |s: &Arc<Staged>| under(&s.path(), prefix);
        lock(&self.state).draining += 1;
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let busy = {
                let st = lock(&self.state);
                st.queue
                    .iter()
                    .map(|(s, _)| s)
                    .chain(&st.in_flight)
                    .any(below)
            };
            if !busy {
                break;
            }
            match until {
                None => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
                }
                Some(t) if t <= tokio::time::Instant::now() => break,
                Some(t) => {
                    let _ = tokio::time::timeout_at(t, changed).await;
                }
            }
        }
        let mut st = lock(&self.state);
        st.draining -= 1;
        let (hit, kept) = std::mem::take(&mut st.failed)
            .into_iter()
            .partition(|(p, _)| under(p, prefix));
        st.failed = kept;
        hit
    }
}

/// Whether `path` is `prefix` or below it.
pub(super) fn under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Errors worth trying again: the server or the network, not the request.
fn transient(e: &FsError) -> bool {
    let fault = match e {
        FsError::Remote(c) => c.fault(),
        FsError::Publish(crate::transfer::publish::PublishError::Client(c)) => c.fault(),
        FsError::Publish(crate::transfer::publish::PublishError::Transfer(
            crate::transfer::TransferError::Rpc(c),
        )) => c.fault(),
        // The staged bytes themselves gone: no try brings them back.
        FsError::Io(e) => return e.kind() != std::io::ErrorKind::NotFound,
        FsError::Publish(_) | FsError::Transfer(_) | FsError::Task(_) => return true,
        _ => return false,
    };
    matches!(
        fault,
        Fault::Unreachable
            | Fault::Timeout
            | Fault::Unavailable
            | Fault::NoSpace
            | Fault::Internal
            | Fault::Unauthenticated
    )
}

impl FsCore {
    fn wb(&self) -> &Writeback {
        &self.writeback
    }

    /// The last close of a written file: under write-back, journaled and queued (`true`); a
    /// file with nothing to publish is dropped unless a queued publish still holds it.
    /// Without the journal (`false`), the caller publishes.
    pub(super) async fn queue_publish(&self, s: &Arc<Staged>) -> FsResult<bool> {
        if !self.wb().on() {
            return Ok(false);
        }
        // Not under the publish lock: a publish in flight holds it while the server answers.
        if s.unlinked.load(Ordering::SeqCst) || !s.dirty() {
            self.retire(s).await;
            return Ok(true);
        }
        self.wb().journal(s)?;
        self.wb().push(s).await;
        Ok(true)
    }

    /// A change to a file closed and queued (a chmod, `cp -p`'s utimens after its close):
    /// journaled again and queued again.
    pub(super) async fn requeue(&self, s: &Arc<Staged>) -> FsResult<()> {
        if s.opens.load(Ordering::SeqCst) == 0 && !self.queue_publish(s).await? {
            self.publish_staged(s).await?;
            self.retire(s).await;
        }
        Ok(())
    }

    /// Opens this mount's journal (records under `tag` in `db`), queues what an earlier agent
    /// journaled there, and starts the flushers. With `--writeback` closes are queued from now
    /// on; without, only what the journal held is published.
    pub fn start_writeback(self: &Arc<Self>, db: Db, tag: Vec<u8>) -> FsResult<()> {
        let journal = Journal { db, tag };
        let replayed = self.replay_journal(&journal)?;
        if !self.cfg.writeback && replayed == 0 {
            return Ok(());
        }
        if self.cfg.writeback {
            let _ = self.wb().journal.set(journal);
        }
        let mut st = lock(&self.wb().state);
        while st.flushers < FLUSHERS {
            st.flushers += 1;
            let (wb, core) = (self.writeback.clone(), Arc::downgrade(self));
            self.rt.spawn(async move { flusher(&wb, &core).await });
        }
        Ok(())
    }

    fn replay_journal(&self, j: &Journal) -> FsResult<usize> {
        let mut records = Vec::new();
        for (key, value) in j.db.scan_prefix(CF_WRITEBACK, &j.tag)? {
            match serde_json::from_slice::<Record>(&value) {
                Ok(r) => records.push((r, key)),
                Err(e) => {
                    tracing::warn!(error = %e, "an unreadable write-back record is left as it is")
                }
            }
        }
        // The latest record of each key wins; an older one's publish was overtaken.
        records.sort_by_key(|(r, _)| std::cmp::Reverse(r.seq));
        let mut seen = std::collections::HashSet::new();
        let mut n = 0;
        for (r, key) in records {
            let bytes_key = r.inline.then(|| j.bytes_key(&r.data));
            let record = Journaled(j.db.clone(), key, bytes_key.clone());
            let disk = self.wb().staging.join(&r.data);
            let stale = !seen.insert(r.key.clone())
                || r.data.contains('/')
                || r.data.is_empty()
                || Self::check_key(&r.key).is_err();
            if stale {
                if !r.inline {
                    let _ = std::fs::remove_file(&disk);
                }
                record.remove();
                continue;
            }
            let body = match bytes_key {
                Some(k) => {
                    j.db.get(CF_WRITEBACK, &k)
                        .map_err(FsError::from)
                        .and_then(|b| {
                            b.map(|b| Body::of_bytes(b, r.data.clone(), &self.staging_memory))
                                .ok_or_else(|| FsError::NotFound)
                        })
                }
                None => std::fs::File::options()
                    .read(true)
                    .write(true)
                    .open(&disk)
                    .map(|f| Body::of_file(f, disk))
                    .map_err(FsError::from),
            };
            let body = match body {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(key = %r.key, error = %e, "a journaled file's bytes are gone");
                    record.remove();
                    continue;
                }
            };
            let s = Arc::new(Staged {
                path: Mutex::new(r.key.clone()),
                body: Mutex::new(body),
                opens: AtomicUsize::new(0),
                changes: AtomicU64::new(1),
                published: AtomicU64::new(0),
                unlinked: AtomicBool::new(false),
                mode: AtomicU32::new(r.mode & 0o7777),
                owner: Mutex::new((r.uid, r.gid)),
                mtime: Mutex::new(time_of(r.mtime_sec, r.mtime_nsec)),
                ctime: Mutex::new(SystemTime::now()),
                publish_lock: tokio::sync::Mutex::new(()),
                filled: tokio::sync::watch::Sender::new(true),
                queued: AtomicBool::new(false),
                record: Mutex::new(Some(record)),
                journaled: AtomicU64::new(1),
            });
            lock(&self.staged).insert(r.key.clone(), s.clone());
            // No flusher runs yet to make room.
            self.wb().push_again(&s);
            n += 1;
        }
        if n > 0 {
            tracing::info!(files = n, "publishing what an earlier agent journaled");
        }
        Ok(n)
    }

    /// Publishes queued files: the small ones in one `PublishBatch`, others each on its own.
    /// Whether to wait before the next (the server is away).
    async fn flush_queued(&self, batch: &[Arc<Staged>]) -> bool {
        let mut errors: Vec<Option<FsError>> = (0..batch.len()).map(|_| None).collect();
        {
            let mut _guards = Vec::with_capacity(batch.len());
            for s in batch {
                _guards.push(s.publish_lock.lock().await);
            }
            let mut items = Vec::new();
            for (i, s) in batch.iter().enumerate() {
                match self.prepare_publish(s) {
                    Ok(None) => {}
                    Ok(Some(p)) => match p.into_batch_item() {
                        Ok((req, settle)) => items.push((i, req, settle)),
                        Err(p) => errors[i] = self.send_publish(s, *p).await.err(),
                    },
                    Err(e) => errors[i] = Some(e),
                }
            }
            if !items.is_empty() {
                for (i, e) in self.send_batch(batch, items).await {
                    errors[i] = Some(e);
                }
            }
        }
        let mut wait = false;
        for (s, e) in batch.iter().zip(errors) {
            wait |= self.flushed(s, e).await;
        }
        wait
    }

    /// One `PublishBatch` of prepared items (`(index in batch, request, settle)`); the errors
    /// of those that failed, by index.
    async fn send_batch(
        &self,
        batch: &[Arc<Staged>],
        items: Vec<(usize, crate::proto::PublishRequest, super::publish::Settle)>,
    ) -> Vec<(usize, FsError)> {
        // One watcher for all (each item named the one it saw when prepared).
        let watcher = items.first().map_or(0, |(_, _, s)| s.watcher);
        let (reqs, settles): (Vec<_>, Vec<_>) =
            items.into_iter().map(|(i, r, s)| (r, (i, s))).unzip();
        let mut store = self.store();
        let sent = store
            .publish_batch(crate::proto::PublishBatchRequest {
                namespace: self.ns(),
                items: reqs,
                watcher,
            })
            .await;
        let remote = |st: tonic::Status| FsError::Remote(crate::rpc::ClientError::from(st));
        let results = match sent {
            Ok(r) => r.into_inner().results,
            Err(st) => {
                let why = st.message().to_string();
                return settles
                    .into_iter()
                    .map(|(i, _)| (i, remote(tonic::Status::new(st.code(), why.clone()))))
                    .collect();
            }
        };
        let mut failed = Vec::new();
        let mut results = results.into_iter();
        for (i, mut settle) in settles {
            settle.watcher = watcher;
            match results.next() {
                Some(crate::proto::PublishResult {
                    published: Some(p), ..
                }) => self.settle_publish(&batch[i], &settle, p.entry, p.parent),
                Some(r) => failed.push((
                    i,
                    remote(tonic::Status::new(tonic::Code::from(r.code), r.message)),
                )),
                None => failed.push((
                    i,
                    remote(tonic::Status::internal(
                        "the server answered fewer items than sent",
                    )),
                )),
            }
        }
        failed
    }

    /// What a publish of queued `s` came to: published, tried again later, or refused for
    /// good. Whether to wait before the next.
    async fn flushed(&self, s: &Arc<Staged>, error: Option<FsError>) -> bool {
        match error.map_or(Ok(()), Err) {
            Ok(()) => {
                crate::metrics::WRITEBACK_PUBLISHED.inc();
                self.wb().finished(s, None);
                self.retire(s).await;
                false
            }
            Err(e) if transient(&e) => {
                crate::metrics::WRITEBACK_RETRIES.inc();
                tracing::warn!(path = %s.path(), error = %e, "a queued publish failed; trying again");
                self.wb().push_again(s);
                self.wb().finished(s, None);
                true
            }
            Err(e) => {
                crate::metrics::WRITEBACK_FAILED.inc();
                let kept = self.keep_failed(s).await;
                tracing::error!(path = %s.path(), error = %e, kept = %kept,
                    "the store server refused a queued publish; its bytes are kept");
                self.wb().finished(s, Some(e.to_string()));
                self.forget_staged(s);
                false
            }
        }
    }

    /// Moves a refused file's bytes to the staging directory's `failed/` and its record under
    /// the journal's failed prefix, where an operator finds them.
    async fn keep_failed(&self, s: &Staged) -> String {
        let _guard = s.publish_lock.lock().await;
        let failed = self.wb().staging.join("failed");
        let _ = std::fs::create_dir_all(&failed);
        let (name, moved) = {
            let b = lock(&s.body);
            let name = b.name();
            let kept = failed.join(&name);
            let moved = match (b.bytes(), b.disk()) {
                (Some(bytes), _) => std::fs::write(&kept, bytes)
                    .map_err(|e| format!("the write-back journal (a file failed: {e})")),
                (None, Some(d)) => {
                    std::fs::rename(&d.disk, &kept).map_err(|_| d.disk.display().to_string())
                }
                (None, None) => Ok(()),
            };
            (name, moved.map(|()| kept.display().to_string()))
        };
        let kept = match moved {
            Ok(kept) => kept,
            // Where the bytes stay; so does their record.
            Err(left) => return left,
        };
        if let (Some(rec), Some(j)) = (lock(&s.record).take(), self.wb().journal.get()) {
            let moved = j.db.get(CF_WRITEBACK, &rec.1).ok().flatten().map(|v| {
                // Its bytes are in the file now, wherever they were journaled.
                let v = match serde_json::from_slice::<Record>(&v) {
                    Ok(r) if r.inline => {
                        serde_json::to_vec(&Record { inline: false, ..r }).unwrap_or(v)
                    }
                    _ => v,
                };
                j.db.put(CF_WRITEBACK, &j.failed_key(&name), &v)
            });
            if let Some(Err(e)) = moved {
                tracing::warn!(error = %e, "could not keep a refused write-back record");
            }
            rec.remove();
        }
        kept
    }

    /// Drops `s` once nothing holds it: no descriptor, and (unless unlinked, when nothing is
    /// left to publish) no change to publish and no queued publish.
    pub(super) async fn retire(&self, s: &Arc<Staged>) {
        if s.opens.load(Ordering::SeqCst) > 0 {
            return;
        }
        if !s.unlinked.load(Ordering::SeqCst) {
            let path = s.path();
            let mut m = lock(&self.staged);
            let idle = s.opens.load(Ordering::SeqCst) == 0
                && !s.dirty()
                && !s.queued.load(Ordering::SeqCst);
            if !idle || !m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                return;
            }
            m.remove(&path);
        }
        self.discard(s).await;
    }

    /// Forgets `s` from the map whatever holds it (its bytes were moved away).
    fn forget_staged(&self, s: &Arc<Staged>) {
        let path = s.path();
        let mut m = lock(&self.staged);
        if m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
            m.remove(&path);
        }
    }

    /// `fsync` of a directory: every queued publish at or below it has landed, or the error
    /// of one the server refused.
    pub async fn fsyncdir(&self, ino: u64) -> FsResult<()> {
        let path = self.path_of(ino).await?;
        match self.wb().drain(&path, None).await.into_iter().next() {
            None => Ok(()),
            Some((p, why)) => Err(FsError::Io(std::io::Error::other(format!(
                "the store server refused the publish of {p}: {why}"
            )))),
        }
    }

    /// At unmount: the queued publishes land, for `wait` at most (what is left stays in the
    /// journal for the next agent).
    pub(super) async fn drain_writeback(&self, wait: Duration) {
        let left = self
            .wb()
            .drain("", Some(tokio::time::Instant::now() + wait))
            .await;
        for (p, why) in left {
            tracing::error!(path = %p, error = %why, "a queued publish was refused");
        }
    }

    /// Publishes now, in this thread, every staged file at or below `prefix` (a namespace
    /// change is about to involve them).
    pub(super) async fn publish_below(&self, prefix: &str) -> FsResult<()> {
        let below: Vec<Arc<Staged>> = lock(&self.staged)
            .iter()
            .filter(|(p, _)| under(p, prefix))
            .map(|(_, s)| s.clone())
            .collect();
        for s in below {
            self.publish_staged(&s).await?;
        }
        Ok(())
    }
}

async fn flusher(wb: &Writeback, core: &Weak<FsCore>) {
    let mut backoff = RETRY_FIRST;
    while let Some(batch) = wb.pop(core, BATCH).await {
        let Some(c) = core.upgrade() else { return };
        let wait = c.flush_queued(&batch).await;
        drop(c);
        if wait {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
        } else {
            backoff = RETRY_FIRST;
        }
    }
}
