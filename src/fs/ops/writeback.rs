//! Write-back as the core runs it (see `write::writeback`): closes that journal and queue, the
//! flushers that publish what is queued, a few at once, and the drains that wait for them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::FsCore;
use crate::locks::lock;
use std::sync::Weak;

use crate::db::Db;
use crate::fs::write::journal::Journal;
use crate::fs::write::publish::Settle;
use crate::fs::write::staged::Staged;
use crate::fs::write::writeback::{Writeback, BATCH, FLUSHERS, RETRY_FIRST, RETRY_MAX};
use crate::rpc::Fault;

/// How long an unmount waits for queued publishes; what is left is published by the next
/// agent on the mount, from the journal.
const UNMOUNT_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

impl FsCore {
    pub(crate) fn wb(&self) -> &Writeback {
        &self.writer.writeback
    }
    /// The last close of a written file: under write-back, journaled and queued (`true`); a
    /// file with nothing to publish is dropped unless a queued publish still holds it.
    /// Without the journal (`false`), the caller publishes.
    pub(crate) async fn queue_publish(&self, s: &Arc<Staged>) -> FsResult<bool> {
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
    pub(crate) async fn requeue(&self, s: &Arc<Staged>) -> FsResult<()> {
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
        let replayed = self.writer.replay(&journal)?;
        if !self.cfg.writeback && replayed == 0 {
            return Ok(());
        }
        if self.cfg.writeback {
            let _ = self.wb().journal.set(journal);
        }
        let mut st = lock(&self.wb().state);
        while st.flushers < FLUSHERS {
            st.flushers += 1;
            let (wb, core) = (self.writer.writeback.clone(), Arc::downgrade(self));
            self.rt.spawn(async move { flusher(&wb, &core).await });
        }
        Ok(())
    }
    /// Publishes queued files: the small ones in one `PublishBatch`, others each on its own.
    /// Whether to wait before the next (the server is away).
    pub(crate) async fn flush_queued(&self, batch: &[Arc<Staged>]) -> bool {
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
    pub(crate) async fn send_batch(
        &self,
        batch: &[Arc<Staged>],
        items: Vec<(usize, crate::proto::PublishRequest, Settle)>,
    ) -> Vec<(usize, FsError)> {
        // One watcher for all (each item named the one it saw when prepared).
        let watcher = items.first().map_or(0, |(_, _, s)| s.watcher);
        let (reqs, settles): (Vec<_>, Vec<_>) =
            items.into_iter().map(|(i, r, s)| (r, (i, s))).unzip();
        let store = self.store();
        let sent = store
            .publish_batch(crate::proto::PublishBatchRequest {
                namespace: self.ns(),
                items: reqs,
                watcher,
            })
            .await;
        let results = match sent {
            Ok(r) => r.results,
            Err(e) => {
                let (fault, why) = (e.fault(), e.to_string());
                return settles
                    .into_iter()
                    .map(|(i, _)| {
                        let e = crate::rpc::RemoteError::new(fault, why.clone());
                        (i, FsError::Remote(e.into()))
                    })
                    .collect();
            }
        };
        let remote = |st: tonic::Status| FsError::Remote(crate::rpc::ClientError::from(st));
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
    pub(crate) async fn flushed(&self, s: &Arc<Staged>, error: Option<FsError>) -> bool {
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
                let kept = self.wb().keep_failed(s).await;
                tracing::error!(path = %s.path(), error = %e, kept = %kept,
                    "the store server refused a queued publish; its bytes are kept");
                self.wb().finished(s, Some(e.to_string()));
                self.writer.forget(s);
                false
            }
        }
    }
    /// Drops `s` once nothing holds it: no descriptor, and (unless unlinked, when nothing is
    /// left to publish) no change to publish and no queued publish.
    pub(crate) async fn retire(&self, s: &Arc<Staged>) {
        if s.opens.load(Ordering::SeqCst) > 0 {
            return;
        }
        if !s.unlinked.load(Ordering::SeqCst) {
            let path = s.path();
            let mut m = lock(&self.writer.staged);
            let idle = s.opens.load(Ordering::SeqCst) == 0
                && !s.dirty()
                && !s.queued.load(Ordering::SeqCst);
            if !idle || !m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                return;
            }
            m.remove(&path);
        }
        self.writer.discard(s).await;
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
    pub(crate) async fn drain_writeback(&self, wait: Duration) {
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
    pub(crate) async fn publish_below(&self, prefix: &str) -> FsResult<()> {
        let below = self.writer.below(prefix);
        for s in below {
            self.publish_staged(&s).await?;
        }
        Ok(())
    }
    /// Publishes every file still open for writing, and lets the write-back queue drain
    /// (at unmount).
    pub async fn flush_all(&self) {
        let all = self.writer.open_ones();
        self.drain_writeback(UNMOUNT_DRAIN).await;
        for s in all {
            if let Err(e) = self.publish_staged(&s).await {
                tracing::error!(path = %s.path(), error = %e, "could not publish a file open at unmount");
            }
        }
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
