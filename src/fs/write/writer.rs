//! The writing side of the core: the files staged on this node, by path, what their bodies may
//! hold in memory, and the write-back queue of files closed and not yet published.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::body::{Body, MemoryBudget, MEMORY_BUDGET};
use super::journal::{Journal, Journaled, Record, CF_WRITEBACK};
use super::staged::Staged;
use super::writeback::Writeback;
use crate::fs::attr::time_of;
use crate::fs::error::{FsError, FsResult};
use crate::fs::paths::{check_key, under};
use crate::locks::lock;

/// The files staged here, and how they are published.
pub struct Writer {
    pub(crate) staged: Mutex<HashMap<String, Arc<Staged>>>,
    /// What staged bodies hold in memory (see `body`).
    pub(crate) memory: Arc<MemoryBudget>,
    /// The queue and journal of closed files still to publish (`--writeback`).
    pub(crate) writeback: Arc<Writeback>,
}

impl Writer {
    pub fn new(staging: &Path) -> Self {
        Writer {
            staged: Mutex::default(),
            memory: MemoryBudget::new(MEMORY_BUDGET),
            writeback: Arc::new(Writeback::new(staging)),
        }
    }

    pub fn staged_at(&self, path: &str) -> Option<Arc<Staged>> {
        let s = lock(&self.staged).get(path).cloned()?;
        (!s.unlinked.load(Ordering::SeqCst)).then_some(s)
    }

    pub fn paths(&self) -> Vec<String> {
        lock(&self.staged).keys().cloned().collect()
    }

    /// The staged files at or below `prefix`.
    pub fn below(&self, prefix: &str) -> Vec<Arc<Staged>> {
        lock(&self.staged)
            .iter()
            .filter(|(p, _)| under(p, prefix))
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// The staged files some descriptor holds open.
    pub fn open_ones(&self) -> Vec<Arc<Staged>> {
        lock(&self.staged)
            .values()
            .filter(|s| s.opens.load(Ordering::SeqCst) > 0)
            .cloned()
            .collect()
    }

    /// The file staged at `path`, opened once more, if there is one. Counted under the map's
    /// lock: a flusher retires only what no one opened.
    pub fn open_existing(&self, path: &str) -> Option<Arc<Staged>> {
        let m = lock(&self.staged);
        let s = m.get(path).filter(|s| !s.unlinked.load(Ordering::SeqCst))?;
        s.opens.fetch_add(1, Ordering::SeqCst);
        Some(s.clone())
    }

    /// Takes `s` out of the map, if it is still the file staged at its path.
    pub fn remove(&self, path: &str) {
        lock(&self.staged).remove(path);
    }

    pub fn new_staged(
        &self,
        path: &str,
        mode: u32,
        owner: (u32, u32),
        (mtime, ctime): (SystemTime, SystemTime),
        dirty: bool,
        filled: bool,
    ) -> FsResult<Arc<Staged>> {
        let body = Body::new(&self.writeback.staging, &self.memory)?;
        let s = Staged::new(path, body, mode, owner, (mtime, ctime));
        s.changes.store(u64::from(dirty), Ordering::SeqCst);
        s.filled.send_replace(filled);
        let s = Arc::new(s);
        lock(&self.staged).insert(path.to_string(), s.clone());
        Ok(s)
    }

    pub async fn drop_staged(&self, s: &Arc<Staged>) {
        let path = s.path();
        {
            let mut m = lock(&self.staged);
            if m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                m.remove(&path);
            }
        }
        self.discard(s).await;
    }

    /// Removes the staged bytes (unless served in place) and the journal record of `s`, gone
    /// from the map. Under its publish lock: a publish in flight reads them.
    pub async fn discard(&self, s: &Staged) {
        let _guard = s.publish_lock.lock().await;
        s.forget_record();
        lock(&s.body).remove();
    }

    /// Forgets `s` from the map whatever holds it (its bytes were moved away).
    pub fn forget(&self, s: &Arc<Staged>) {
        let path = s.path();
        let mut m = lock(&self.staged);
        if m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
            m.remove(&path);
        }
    }

    pub(crate) fn replay(&self, j: &Journal) -> FsResult<usize> {
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
            let disk = self.writeback.staging.join(&r.data);
            let stale = !seen.insert(r.key.clone())
                || r.data.contains('/')
                || r.data.is_empty()
                || check_key(&r.key).is_err();
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
                            b.map(|b| Body::of_bytes(b, r.data.clone(), &self.memory))
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
            let s = Staged::new(
                &r.key,
                body,
                r.mode,
                (r.uid, r.gid),
                (time_of(r.mtime_sec, r.mtime_nsec), SystemTime::now()),
            );
            // Closed, changed and journaled: as its agent left it.
            s.opens.store(0, Ordering::SeqCst);
            s.changes.store(1, Ordering::SeqCst);
            s.journaled.store(1, Ordering::SeqCst);
            *lock(&s.record) = Some(record);
            let s = Arc::new(s);
            lock(&self.staged).insert(r.key.clone(), s.clone());
            // No flusher runs yet to make room.
            self.writeback.push_again(&s);
            n += 1;
        }
        if n > 0 {
            tracing::info!(files = n, "publishing what an earlier agent journaled");
        }
        Ok(n)
    }
}
