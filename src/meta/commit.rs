//! Group commit: concurrent changes are made durable together, one batch and one sync of the
//! write-ahead log for all of them, and each returns only once its batch is on stable storage.
//!
//! A change is planned under the metadata write lock, as before, against the stored state with
//! every earlier change that is not yet durable laid over it (the overlay): its checks see what
//! the changes queued ahead of it will leave. Planned, its writes join the queue and the overlay,
//! and the lock is released, so the next change plans while this one waits. Whoever waits when
//! no batch is being written leads: it takes everything queued, writes it in one synced batch
//! (on an engine with limits to a transaction, in as few as hold them: `MetaBackend::commit`)
//! and tells the others (the followers) how it went; changes queued meanwhile make the next batch.
//!
//! A failed batch fails every change in it and every change queued behind it (they were planned
//! on its effects), and empties the overlay; a change being planned at that moment belongs to an
//! older epoch and is refused when it is submitted. Nothing of a failed batch is acknowledged.
//!
//! Readers outside the write lock see only the stored state: never a change that is not yet
//! durable, which a crash or a failed batch could still take back.
//!
//! The planner's reads of keys, attributes and inodes are remembered: nothing changes them but
//! the changes queued here (this server is their one writer; a collection pass, which writes
//! around the queue under the write lock, forgets them), so a batch of publishes into one
//! directory asks the engine for the directory once, not once each (on etcd each read is a
//! round trip). A stored batch forgets the reads of what it wrote; a failed one, all of them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Condvar, Mutex};

use super::backend::{BackendError, MetaBackend, Op, Table};
use crate::locks;

/// Why the backend refused a write, where its writers are told more than an internal error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// For want of space: a full disk under RocksDB, etcd's NOSPACE alarm. Writers are told
    /// ENOSPC.
    NoSpace,
    /// This replica does not own the store (cluster mode): the caller is told to go to the
    /// one that does.
    NotOwner,
    /// One change larger than the engine commits at once (etcd's 128 operations): refused
    /// whole, since split it would be no longer one change. A rename's caller is told EXDEV.
    TooLarge,
}

/// Why the backend refused `e`'s write, as the engine said or as the batch of group commit it
/// was part of failed.
pub fn refusal(e: &BackendError) -> Option<Refusal> {
    let e = e.0.as_ref();
    if let Some(e) = e.downcast_ref::<crate::db::DbError>() {
        return e.is_no_space().then_some(Refusal::NoSpace);
    }
    if let Some(e) = e.downcast_ref::<super::engine::EngineError>() {
        return match e {
            super::engine::EngineError::NoSpace(_) => Some(Refusal::NoSpace),
            super::engine::EngineError::NotOwner(_) => Some(Refusal::NotOwner),
            super::engine::EngineError::TooLarge { .. } => Some(Refusal::TooLarge),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<CommitFailed>() {
        return e.refusal;
    }
    if let Some(e) = e.downcast_ref::<BackendError>() {
        return refusal(e);
    }
    None
}

/// The most reads remembered; past it they are forgotten and read again.
const MAX_READS: usize = 16_384;

/// Why a change failed that was not the first of its batch to learn it.
#[derive(Debug, thiserror::Error)]
#[error("committing the metadata failed: {message}")]
pub struct CommitFailed {
    message: String,
    /// Why the backend refused the batch, where it said (every change in it is told so).
    refusal: Option<Refusal>,
}

/// A change queued for commit: its number, which [`Commits::wait`] takes.
#[must_use = "a queued change is durable only once waited for"]
pub struct Ticket(u64);

/// What the queue has done, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Changes acknowledged as durable.
    pub committed: u64,
    /// Synced batches written (each one sync of the write-ahead log).
    pub syncs: u64,
    /// Changes queued or being written, not yet decided.
    pub waiting: u64,
}

/// What the last change not yet durable to write a key left there.
struct Planned {
    /// That change's number.
    by: u64,
    /// `None`: deleted.
    value: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    /// Each key a change not yet durable wrote.
    overlay: BTreeMap<(Table, Vec<u8>), Planned>,
    /// What the planner read from the stored state, where no queued change wrote.
    reads: HashMap<(Table, Vec<u8>), Option<Vec<u8>>>,
    /// Prefixes of a table (each ending in '/': the keys below a name) under which the
    /// planner found the stored state holding nothing, where no queued change wrote.
    empty: HashSet<(Table, Vec<u8>)>,
    /// Prefixes of a table under which the planner found a live key stored, where no queued
    /// change wrote it: `(table, prefix)` -> that key, and when its record expires (0: never).
    witnesses: Witnesses,
    /// The writes of changes no leader has taken yet, change by change, in the order they were
    /// planned.
    queued: Vec<Vec<Op>>,
    /// The number of the last change submitted.
    last: u64,
    /// Every change numbered up to this one is decided: durable or failed.
    decided: u64,
    /// A batch is being written.
    leading: bool,
    /// Bumped by each failed batch.
    epoch: u64,
    /// Failed ranges of changes, with the error and how many of their waiters have yet to
    /// learn it.
    failures: Vec<Failure>,
    stats: CommitStats,
}

struct Failure {
    first: u64,
    last: u64,
    error: String,
    refusal: Option<Refusal>,
    unseen: u64,
}

impl State {
    /// The outcome of decided change `n`, learnt once.
    fn outcome(&mut self, n: u64) -> Result<(), BackendError> {
        let Some(i) = self
            .failures
            .iter()
            .position(|f| (f.first..=f.last).contains(&n))
        else {
            self.stats.committed += 1;
            return Ok(());
        };
        let f = &mut self.failures[i];
        f.unseen -= 1;
        let error = CommitFailed {
            message: f.error.clone(),
            refusal: f.refusal,
        };
        if f.unseen == 0 {
            self.failures.swap_remove(i);
        }
        Err(BackendError(Box::new(error)))
    }
}

/// The queue and its overlay.
#[derive(Default)]
pub struct Commits {
    state: Mutex<State>,
    decided: Condvar,
}

impl Commits {
    /// The current epoch: a change planned from now on is submitted with it.
    pub fn epoch(&self) -> u64 {
        locks::lock(&self.state).epoch
    }

    /// What a change being planned sees at `key` without asking the stored state: what
    /// changes not yet durable leave there, or what was read there since it last changed.
    pub fn planned_or_read(&self, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let st = locks::lock(&self.state);
        let at = (table, key.to_vec());
        match st.overlay.get(&at) {
            Some(p) => Some(p.value.clone()),
            None => st.reads.get(&at).cloned(),
        }
    }

    /// Remembers what the planner (holding the write lock) read at `key` from the stored
    /// state, where the overlay had nothing: only a change it queues can change it now.
    pub fn remember(&self, table: Table, key: &[u8], value: Option<Vec<u8>>) {
        if !remembered(table) {
            return;
        }
        let mut st = locks::lock(&self.state);
        if st.reads.len() >= MAX_READS {
            st.reads.clear();
        }
        st.reads.insert((table, key.to_vec()), value);
    }

    /// Whether the planner may read `prefix` of `table` as the stored state holding nothing:
    /// without asking it, where it has said so before and nothing queued since wrote below.
    pub fn known_empty(&self, table: Table, prefix: &[u8]) -> bool {
        let st = locks::lock(&self.state);
        !st.empty.is_empty() && st.empty.contains(&(table, prefix.to_vec()))
    }

    /// Whether the queue writes nothing below `prefix` of `table`: then only a change the
    /// planner (holding the write lock) queues can, and what it reads of the stored state
    /// there holds until then.
    pub fn quiet_below(&self, table: Table, prefix: &[u8]) -> bool {
        let st = locks::lock(&self.state);
        st.overlay
            .range((table, prefix.to_vec())..)
            .next()
            .is_none_or(|((t, k), _)| *t != table || !k.starts_with(prefix))
    }

    /// Remembers that the stored state holds nothing below `prefix` (ending in '/') of
    /// `table`, as the planner (holding the write lock) read it where [`Commits::quiet_below`]
    /// said the queue wrote nothing there.
    pub fn remember_empty(&self, table: Table, prefix: &[u8]) {
        let mut st = locks::lock(&self.state);
        if st.empty.len() >= MAX_READS {
            st.empty.clear();
        }
        st.empty.insert((table, prefix.to_vec()));
    }

    /// Whether a change not yet durable writes `key`.
    pub fn queued(&self, table: Table, key: &[u8]) -> bool {
        let st = locks::lock(&self.state);
        st.overlay.contains_key(&(table, key.to_vec()))
    }

    /// The key the planner found stored and live below `prefix` of `table`, if it is still so
    /// at `now_ms` and no batch wrote it since.
    pub fn witness(&self, table: Table, prefix: &[u8], now_ms: i64) -> Option<Vec<u8>> {
        let st = locks::lock(&self.state);
        if st.witnesses.is_empty() {
            return None;
        }
        let (key, expires) = st.witnesses.get(&(table, prefix.to_vec()))?;
        (*expires == 0 || *expires > now_ms).then(|| key.clone())
    }

    /// Remembers `key`, stored and live until `expires` (0: ever), below `prefix` of `table`,
    /// as the planner (holding the write lock) read it where no queued change wrote it.
    pub fn remember_witness(&self, table: Table, prefix: &[u8], key: &[u8], expires: i64) {
        let mut st = locks::lock(&self.state);
        if st.witnesses.len() >= MAX_READS {
            st.witnesses.clear();
        }
        st.witnesses
            .insert((table, prefix.to_vec()), (key.to_vec(), expires));
    }

    /// Forgets every read remembered: the stored state was written around the queue.
    pub fn forget_reads(&self) {
        let mut st = locks::lock(&self.state);
        st.reads.clear();
        st.empty.clear();
        st.witnesses.clear();
    }

    /// What changes not yet durable leave at the keys that start with `prefix`, in key order.
    pub fn planned_below(&self, table: Table, prefix: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let st = locks::lock(&self.state);
        if st.overlay.is_empty() {
            return Vec::new();
        }
        st.overlay
            .range((table, prefix.to_vec())..)
            .take_while(|((t, k), _)| *t == table && k.starts_with(prefix))
            .map(|((_, k), p)| (k.clone(), p.value.clone()))
            .collect()
    }

    /// Queues the writes of a change planned in `epoch` (the caller holds the write lock, so
    /// changes are queued in the order they were planned).
    pub fn submit(&self, ops: Vec<Op>, epoch: u64) -> Result<Ticket, BackendError> {
        let mut st = locks::lock(&self.state);
        if st.epoch != epoch {
            return Err(BackendError(Box::new(CommitFailed {
                message: "an earlier change this one was planned on failed to commit".into(),
                refusal: None,
            })));
        }
        st.last += 1;
        let n = st.last;
        for op in &ops {
            let (table, key, value) = match op {
                Op::Put(t, k, v) => (*t, k, Some(v.clone())),
                Op::Delete(t, k) => (*t, k, None),
            };
            st.overlay
                .insert((table, key.clone()), Planned { by: n, value });
        }
        st.queued.push(ops);
        Ok(Ticket(n))
    }

    /// Returns once change `ticket` is durable (or failed), writing batches meanwhile whenever
    /// no one else is.
    pub fn wait(&self, ticket: Ticket, backend: &dyn MetaBackend) -> Result<(), BackendError> {
        let mut st = locks::lock(&self.state);
        loop {
            if ticket.0 <= st.decided {
                return st.outcome(ticket.0);
            }
            if st.leading {
                st = self
                    .decided
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            st = self.lead(st, backend);
        }
    }

    /// Returns once every change submitted so far is decided: the stored state is then the
    /// planned one (the caller holds the write lock, so nothing new is queued meanwhile).
    pub fn drain(&self, backend: &dyn MetaBackend) {
        let mut st = locks::lock(&self.state);
        while st.decided < st.last {
            if st.leading {
                st = self
                    .decided
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            } else {
                st = self.lead(st, backend);
            }
        }
    }

    pub fn stats(&self) -> CommitStats {
        let st = locks::lock(&self.state);
        CommitStats {
            waiting: st.last - st.decided,
            ..st.stats
        }
    }

    /// Writes everything queued as one synced batch, and decides its changes.
    fn lead<'a>(
        &'a self,
        mut st: std::sync::MutexGuard<'a, State>,
        backend: &dyn MetaBackend,
    ) -> std::sync::MutexGuard<'a, State> {
        st.leading = true;
        let changes = std::mem::take(&mut st.queued);
        let (first, last) = (st.decided + 1, st.last);
        drop(st);
        let written = backend.commit(changes);
        let mut st = locks::lock(&self.state);
        st.stats.syncs += 1;
        match written {
            Ok(()) => {
                st.decided = last;
                // Now stored: a later change's value of the same key stays until its own batch,
                // and a read remembered from before the batch is no longer what is stored.
                let State {
                    overlay,
                    reads,
                    empty,
                    witnesses,
                    ..
                } = &mut *st;
                overlay.retain(|k, p| {
                    if p.by > last {
                        return true;
                    }
                    if p.value.is_some() && !empty.is_empty() {
                        forget_empty_above(empty, k);
                    }
                    if !witnesses.is_empty() {
                        forget_witnessed(witnesses, k);
                    }
                    // What the change wrote is what is stored now, and no later change writes
                    // it: the planner's next read of it needs no request.
                    match remembered(k.0) && reads.len() < MAX_READS {
                        true => reads.insert(k.clone(), p.value.take()),
                        false => reads.remove(k),
                    };
                    false
                });
            }
            Err(e) => {
                // Changes queued behind the batch were planned on it: they fail with it.
                let through = st.last;
                tracing::error!(error = %e, changes = through - first + 1, "a metadata commit failed");
                st.failures.push(Failure {
                    first,
                    last: through,
                    error: e.to_string(),
                    refusal: refusal(&e),
                    unseen: through - first + 1,
                });
                st.decided = through;
                st.queued.clear();
                st.overlay.clear();
                st.reads.clear();
                st.empty.clear();
                st.witnesses.clear();
                st.epoch += 1;
            }
        }
        st.leading = false;
        self.decided.notify_all();
        st
    }
}

/// A key now stored is below every prefix of it that ends in '/': none of them is empty.
fn forget_empty_above(empty: &mut HashSet<(Table, Vec<u8>)>, (table, key): &(Table, Vec<u8>)) {
    for (i, b) in key.iter().enumerate() {
        if *b == b'/' {
            empty.remove(&(*table, key[..=i].to_vec()));
        }
    }
}

/// A stored key is no witness of its prefixes once a batch wrote it (a deletion, or a record
/// that may expire otherwise).
fn forget_witnessed(witnesses: &mut Witnesses, (table, key): &(Table, Vec<u8>)) {
    for (i, b) in key.iter().enumerate() {
        if *b == b'/' {
            let at = (*table, key[..=i].to_vec());
            if witnesses.get(&at).is_some_and(|(w, _)| w == key) {
                witnesses.remove(&at);
            }
        }
    }
}

/// `(table, prefix)` -> a key stored and live below it, and when its record expires.
type Witnesses = HashMap<(Table, Vec<u8>), (Vec<u8>, i64)>;

/// The tables whose entries the planner remembers reading: the small records it plans on.
fn remembered(table: Table) -> bool {
    matches!(table, Table::Keys | Table::Attrs | Table::Inodes)
}
