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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

use super::journal::{Journal, Journaled, Record, CF_WRITEBACK};
use super::staged::Staged;
use crate::db::BatchOp;
use crate::fs::attr::to_unix;
use crate::fs::error::{FsError, FsResult};
use crate::fs::paths::under;
use crate::locks::lock;

/// Flushers, each with one request in flight: enough to keep the server's group commit
/// batching while one batch is being prepared.
pub(crate) const FLUSHERS: usize = 4;
/// Small files one flusher sends in one `PublishBatch`, at most (the server's limit is 256
/// and 8 MiB; a file sent inline is at most 64 KiB).
pub(crate) const BATCH: usize = 64;
/// How long a queued file may wait for others to fill its batch: a `cp -r` closes a file every
/// few hundred microseconds, so a batch fills in a few milliseconds.
const GATHER: Duration = Duration::from_millis(20);
/// Queued files at most: a close past this waits for the queue to drain (the staged bytes are
/// on local disk, and a queue without bound would put off the publishes without bound).
pub const MAX_QUEUED: usize = 16_384;
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(100);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct State {
    /// Queued files, with when each was queued.
    queue: VecDeque<(Arc<Staged>, Instant)>,
    /// Callers waiting for the queue to drain: no batch waits to fill meanwhile.
    draining: usize,
    /// Files a flusher is publishing now.
    in_flight: Vec<Arc<Staged>>,
    /// Keys whose publish the server refused for good, with why: `fsync` of their directory
    /// reports them once.
    failed: Vec<(String, String)>,
    pub(crate) flushers: usize,
}

/// The queue and journal of a mount's write-back.
pub struct Writeback {
    /// This mount's journal, once write-back started.
    pub(crate) journal: std::sync::OnceLock<Journal>,
    pub(crate) staging: PathBuf,
    pub(crate) state: Mutex<State>,
    /// Wakes whoever waits for the queue to change: flushers for files, closes for room,
    /// drains for an empty queue.
    changed: Notify,
    seq: AtomicU64,
}

impl Writeback {
    pub(crate) fn new(staging: &Path) -> Self {
        Writeback {
            journal: std::sync::OnceLock::new(),
            staging: staging.to_path_buf(),
            state: Mutex::default(),
            changed: Notify::new(),
            seq: AtomicU64::new(0),
        }
    }
    /// Whether closes are journaled and queued here (the journal is open).
    pub(crate) fn on(&self) -> bool {
        self.journal.get().is_some()
    }
    /// Journals `s` as it is now (after the change it records was counted: see
    /// [`Writeback::forget_if_clean`]).
    pub(crate) fn journal(&self, s: &Staged) -> FsResult<()> {
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
    /// Queues `s` unless it is queued or being published, waiting while the queue is full.
    pub(crate) async fn push(&self, s: &Arc<Staged>) {
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
    pub(crate) fn push_again(&self, s: &Arc<Staged>) {
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
    /// The next files to publish (at most `max`), or `None` once `owner` (the core) is gone.
    pub(crate) async fn pop<T>(&self, owner: &Weak<T>, max: usize) -> Option<Vec<Arc<Staged>>> {
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
            if owner.strong_count() == 0 {
                return None;
            }
            // Woken by a push; the timeout fills a batch, or notices a core that went away.
            let wait = gathered.unwrap_or(Duration::from_secs(1));
            let _ = tokio::time::timeout(wait, changed).await;
        }
    }
    pub(crate) fn finished(&self, s: &Arc<Staged>, failed: Option<String>) {
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
    pub(crate) async fn drain(
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

    /// Moves a refused file's bytes to the staging directory's `failed/` and its record under
    /// the journal's failed prefix, where an operator finds them.
    pub(crate) async fn keep_failed(&self, s: &Staged) -> String {
        let _guard = s.publish_lock.lock().await;
        let failed = self.staging.join("failed");
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
        if let (Some(rec), Some(j)) = (lock(&s.record).take(), self.journal.get()) {
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
}
