//! Watches: the store server's half of the mounts' metadata leases.
//!
//! A mount opens one `Watch` stream per namespace. Every change of the namespace (a publish,
//! removal, rename, exchange, link or attribute change) is sent down the stream of each watcher
//! that holds something it changes (see [`Holds`]: what the server answered that watcher's
//! listings and resolves), and the change's caller is answered only when each of them
//! acknowledged it, or when the lease that watcher held as the change was sent ran out; a watcher that let it run out is
//! dropped (its stream ends, and its mount trusts nothing cached until it watches again). So a
//! reader on node B that opens after a writer's close on node A returned meets no entry B
//! cached before the change. A lease is renewed only while everything sent was acknowledged.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tonic::Status;

use crate::locks::lock;
use crate::metrics;
use crate::proto::WatchDown;

/// How long a watcher's renewal holds.
pub const LEASE: Duration = Duration::from_secs(3);

/// Changes queued for one watcher before it counts as stuck and is dropped.
const QUEUE: usize = 1024;
/// Paths one watcher holds at most. An answer that would take it past this is told to the
/// watcher as a change of everything (it forgets all it cached, that answer included), and
/// the watcher holds nothing from then on: a mount forgets what it cached past its own bounds
/// without saying so (`fs::names`), so what the server records of it only grows, and a watcher
/// counted as holding everything for the rest of its stream was told every change of its
/// namespace.
const MAX_HELD: usize = 1 << 16;
/// Changes remembered after they were told, for answers that crossed them (see
/// [`Watchers::hold`]).
const RECENT: usize = 4096;

pub type Sink = mpsc::Receiver<Result<WatchDown, Status>>;

/// Every watcher of every namespace.
pub struct Watchers {
    lease: Duration,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
}

impl Default for Watchers {
    fn default() -> Self {
        Self::with_lease(LEASE)
    }
}

#[derive(Default)]
struct Inner {
    /// Set when the server shuts down: every stream ends, so the shutdown does not wait on
    /// streams that never end by themselves, and no new watch starts.
    closed: bool,
    /// Numbers the changes, in the order they are sent (under this lock).
    seq: u64,
    list: HashMap<u64, Arc<Watcher>>,
    /// What each watcher was answered (under this lock, so that a change and a registration
    /// are ordered).
    holds: HashMap<u64, Holds>,
    /// The last changes told: `(seq, namespace, paths)`.
    recent: VecDeque<(u64, String, Vec<String>)>,
    /// The highest seq no longer in `recent`.
    forgotten: u64,
}

/// The paths a watcher was answered about: directories it listed (or whose own entry it
/// asked for) and files it resolved. A change concerns it if it changed one of them, a
/// directory's child or grandchild (the listing shows the child directory's times and link
/// count), or something above one (a removal or rename of a tree).
#[derive(Default)]
struct Holds {
    paths: BTreeSet<String>,
}

/// The directory of `path` (`""`: the namespace's root).
pub fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

impl Holds {
    /// Adds `paths`; false where that took it past [`MAX_HELD`], and then it holds nothing.
    fn add(&mut self, paths: impl IntoIterator<Item = String>) -> bool {
        self.paths.extend(paths);
        if self.paths.len() > MAX_HELD {
            self.paths.clear();
            return false;
        }
        true
    }

    fn concerned(&self, changed: &str) -> bool {
        if changed.is_empty() {
            return true;
        }
        let parent = dir_of(changed);
        let grandparent = dir_of(parent);
        if self.paths.contains(changed)
            || self.paths.contains(parent)
            || (!parent.is_empty() && self.paths.contains(grandparent))
        {
            return true;
        }
        let below = format!("{changed}/");
        self.paths
            .range(below.clone()..)
            .next()
            .is_some_and(|p| p.starts_with(&below))
    }

    fn concerned_by(&self, paths: &[String]) -> bool {
        paths.iter().any(|p| self.concerned(p))
    }
}

struct Watcher {
    ns: String,
    /// Taken when the watcher is dropped, which ends its stream.
    tx: Mutex<Option<mpsc::Sender<Result<WatchDown, Status>>>>,
    state: Mutex<State>,
    moved: Notify,
}

struct State {
    sent: u64,
    acked: u64,
    lease_until: Instant,
    gone: bool,
}

/// One watcher's registration, held by its stream's task: dropped, it unregisters.
pub struct Registration {
    id: u64,
    watchers: Arc<Watchers>,
}

impl Watchers {
    pub fn with_lease(lease: Duration) -> Self {
        Watchers {
            lease,
            next_id: AtomicU64::new(0),
            inner: Mutex::default(),
        }
    }

    /// Registers a watcher of `ns` with a first lease; `None` once the server is shutting down.
    pub fn register(self: &Arc<Self>, ns: &str) -> Option<(Registration, Sink)> {
        let (tx, rx) = mpsc::channel(QUEUE);
        // Unguessable: a publish that names a watcher keeps its change from it.
        let id = random_id() ^ self.next_id.fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(Watcher {
            ns: ns.to_string(),
            tx: Mutex::new(Some(tx)),
            state: Mutex::new(State {
                sent: 0,
                acked: 0,
                lease_until: Instant::now() + self.lease,
                gone: false,
            }),
            moved: Notify::new(),
        });
        let mut inner = lock(&self.inner);
        if inner.closed || inner.list.contains_key(&id) {
            return None;
        }
        // Everything numbered before this watcher began counts as acknowledged by it.
        {
            let mut st = lock(&w.state);
            st.sent = inner.seq;
            st.acked = inner.seq;
        }
        inner.list.insert(id, w);
        inner.holds.insert(id, Holds::default());
        Some((
            Registration {
                id,
                watchers: self.clone(),
            },
            rx,
        ))
    }

    /// Whether a watcher of `ns` other than `except` is registered.
    pub fn watched_besides(&self, ns: &str, except: u64) -> bool {
        lock(&self.inner)
            .list
            .iter()
            .any(|(id, w)| w.ns == ns && *id != except)
    }

    /// Watchers now registered (all namespaces).
    pub fn count(&self) -> usize {
        lock(&self.inner).list.len()
    }

    /// Ends every stream and refuses new ones.
    pub fn close(&self) {
        let gone: Vec<_> = {
            let mut inner = lock(&self.inner);
            inner.closed = true;
            inner.holds.clear();
            inner.list.drain().map(|(_, w)| w).collect()
        };
        for w in gone {
            w.leave();
        }
    }

    /// Ends the streams of the watchers of namespaces `keep` refuses (their shard went to
    /// another replica, which their mounts watch next).
    pub fn end_unless(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<u64> = lock(&self.inner)
            .list
            .iter()
            .filter(|(_, w)| !keep(&w.ns))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.drop_watcher(id);
        }
    }

    fn drop_watcher(&self, id: u64) {
        let w = {
            let mut inner = lock(&self.inner);
            inner.holds.remove(&id);
            inner.list.remove(&id)
        };
        if let Some(w) = w {
            w.leave();
        }
    }

    /// Sends the change of `paths` in `ns` to its watchers but `except` (the one that made it,
    /// which learns of it from its answer), and returns once each acknowledged it or was dropped.
    pub async fn changed(&self, ns: &str, paths: Vec<String>, except: u64) {
        let waits = {
            let mut inner = lock(&self.inner);
            let told: Vec<u64> = inner
                .list
                .iter()
                .filter(|(id, w)| {
                    w.ns == ns
                        && **id != except
                        && inner.holds.get(id).is_some_and(|h| h.concerned_by(&paths))
                })
                .map(|(id, _)| *id)
                .collect();
            let watched = inner.list.values().any(|w| w.ns == ns);
            if !watched {
                return;
            }
            inner.seq += 1;
            let seq = inner.seq;
            // Remembered even when nobody is told: an answer given meanwhile may cross it.
            inner.recent.push_back((seq, ns.to_string(), paths.clone()));
            while inner.recent.len() > RECENT {
                if let Some((s, _, _)) = inner.recent.pop_front() {
                    inner.forgotten = s;
                }
            }
            self.send_locked(&mut inner, &told, seq, paths)
        };
        self.wait_for(waits).await;
    }

    /// Sends change `seq` of `paths` to the watchers `ids` (under the lock, so that each meets
    /// the changes in the order of their numbers and "everything up to N" is an
    /// acknowledgement it can give); what to wait for. Stuck watchers are dropped.
    fn send_locked(
        &self,
        inner: &mut Inner,
        ids: &[u64],
        seq: u64,
        paths: Vec<String>,
    ) -> Vec<(u64, Arc<Watcher>, u64, Instant)> {
        let msg = WatchDown {
            seq,
            paths,
            ..Default::default()
        };
        let mut waits = Vec::new();
        for id in ids {
            let Some(w) = inner.list.get(id).cloned() else {
                continue;
            };
            if !w.send(msg.clone()) {
                tracing::warn!(watcher = id, "a watcher's queue is full: dropped");
                inner.holds.remove(id);
                inner.list.remove(id);
                w.leave();
                continue;
            }
            metrics::WATCH_RECALLS.inc();
            let deadline = {
                let mut st = lock(&w.state);
                st.sent = seq;
                st.lease_until
            };
            waits.push((*id, w, seq, deadline));
        }
        waits
    }

    /// Returns once each watcher acknowledged what it was sent, or let its lease run out (then
    /// it is dropped).
    async fn wait_for(&self, waits: Vec<(u64, Arc<Watcher>, u64, Instant)>) {
        // One after another: every watcher has the change already and acknowledges it at its
        // own pace, and each deadline is a time, so the wait is the slowest one's, not a sum.
        for (id, w, seq, deadline) in waits {
            if !w.acknowledged(seq, deadline).await {
                tracing::warn!(
                    watcher = id,
                    "a watcher let its lease run out without acknowledging a change: dropped"
                );
                metrics::WATCH_LAPSED.inc();
                self.drop_watcher(id);
            }
        }
    }

    /// The number of the last change told: what an answer about to be read is at least as new
    /// as (for [`Watchers::hold`]).
    pub fn now(&self) -> u64 {
        lock(&self.inner).seq
    }

    /// Watcher `id` of `ns` was answered about `paths`, from a read begun when [`Watchers::now`]
    /// said `since`: from now on the changes that concern them are told to it. A change told
    /// since then that concerns them may have crossed the answer without reaching the watcher:
    /// it is told to it now (everything, where it is no longer remembered), and this returns
    /// once the watcher acknowledged, before the answer is sent.
    pub async fn hold(&self, ns: &str, id: u64, since: u64, paths: Vec<String>) {
        if id == 0 || paths.is_empty() {
            return;
        }
        let waits = {
            let mut inner = lock(&self.inner);
            if inner.list.get(&id).is_none_or(|w| w.ns != ns) {
                return;
            }
            let fresh = Holds {
                paths: paths.iter().cloned().collect(),
            };
            let crossed: Vec<String> = if since < inner.forgotten {
                vec![String::new()]
            } else {
                // Newest first, as far back as `since` only: most answers crossed nothing.
                let mut crossed: Vec<String> = inner
                    .recent
                    .iter()
                    .rev()
                    .take_while(|(seq, _, _)| *seq > since)
                    .filter(|(_, n, _)| n == ns)
                    .flat_map(|(_, _, ps)| ps.iter().filter(|p| fresh.concerned(p)).cloned())
                    .collect();
                crossed.sort();
                crossed.dedup();
                crossed
            };
            let crossed = match inner.holds.get_mut(&id).map(|h| h.add(paths)) {
                // Past its bound: told everything, it forgets what it cached and this answer,
                // and holds nothing.
                Some(false) => vec![String::new()],
                _ => crossed,
            };
            if crossed.is_empty() {
                return;
            }
            inner.seq += 1;
            let seq = inner.seq;
            self.send_locked(&mut inner, &[id], seq, crossed)
        };
        self.wait_for(waits).await;
    }
}

impl Watcher {
    /// Whether the watcher acknowledged `seq` (or left) before `deadline`.
    async fn acknowledged(&self, seq: u64, deadline: Instant) -> bool {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            {
                let st = lock(&self.state);
                if st.acked >= seq || st.gone {
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return false;
            }
        }
    }

    /// Queues `msg` on the stream; false where it is full or gone.
    fn send(&self, msg: WatchDown) -> bool {
        lock(&self.tx)
            .as_ref()
            .is_some_and(|tx| tx.try_send(Ok(msg)).is_ok())
    }

    fn leave(&self) {
        lock(&self.tx).take();
        lock(&self.state).gone = true;
        self.moved.notify_waiters();
    }
}

/// 64 random bits from the kernel (the clock's nanoseconds, where that fails).
fn random_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a valid buffer of its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_ne_bytes(b);
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Registration {
    /// The number the watcher is told, which its own publishes name.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn watcher(&self) -> Option<Arc<Watcher>> {
        lock(&self.watchers.inner).list.get(&self.id).cloned()
    }

    /// Takes a message of the watcher's: its acknowledgement, and a renewal asked for. Returns
    /// the answer to send (a renewal granted), if any.
    pub fn up(&self, acked: u64, renew: u64) -> Option<WatchDown> {
        let w = self.watcher()?;
        let granted = {
            let mut st = lock(&w.state);
            // An acknowledgement of more than was sent acknowledges what was sent.
            st.acked = st.acked.max(acked.min(st.sent));
            let granted = renew != 0 && st.acked == st.sent;
            if granted {
                st.lease_until = Instant::now() + self.watchers.lease;
            }
            granted
        };
        w.moved.notify_waiters();
        granted.then(|| WatchDown {
            renewed: renew,
            lease_ms: self.watchers.lease.as_millis() as u32,
            ..Default::default()
        })
    }

    /// Returns once the watcher is dropped (it lapsed, or the server is shutting down).
    pub async fn ended(&self) {
        let Some(w) = self.watcher() else { return };
        loop {
            let moved = w.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if lock(&w.state).gone {
                return;
            }
            moved.await;
        }
    }

    /// Queues an answer on the watcher's stream.
    pub fn send(&self, msg: WatchDown) {
        if let Some(w) = self.watcher() {
            w.send(msg);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watchers.drop_watcher(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next(rx: &mut Sink) -> WatchDown {
        rx.recv().await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn a_change_waits_for_every_watcher_of_its_namespace_and_no_other() {
        let ws = Arc::new(Watchers::default());
        let (a, mut a_rx) = ws.register("team").unwrap();
        let (b, mut b_rx) = ws.register("other").unwrap();
        ws.hold("team", a.id(), ws.now(), vec!["x".into()]).await;
        // A watcher of another namespace holds nothing of this one, whatever it names.
        ws.hold("team", b.id(), ws.now(), vec!["x".into()]).await;
        let changed = tokio::spawn({
            let ws = ws.clone();
            async move { ws.changed("team", vec!["x/y".into()], 0).await }
        });
        let got = next(&mut a_rx).await;
        assert_eq!(
            (got.seq, got.paths.as_slice()),
            (1, &["x/y".to_string()][..])
        );
        assert!(!changed.is_finished());
        // A renewal while a change is unacknowledged is not granted.
        assert!(a.up(0, 7).is_none());
        assert!(a.up(1, 8).is_some_and(|d| d.renewed == 8));
        changed.await.unwrap();
        assert!(b_rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_watcher_that_does_not_acknowledge_is_dropped_when_its_lease_runs_out() {
        let lease = Duration::from_millis(200);
        let ws = Arc::new(Watchers::with_lease(lease));
        let (a, mut a_rx) = ws.register("team").unwrap();
        ws.hold("team", a.id(), ws.now(), vec!["".into()]).await;
        let started = Instant::now();
        ws.changed("team", vec!["k".into()], 0).await;
        assert!(started.elapsed() >= lease - Duration::from_millis(20));
        assert_eq!(ws.count(), 0);
        assert_eq!(next(&mut a_rx).await.seq, 1);
        // Its stream ends: the mount knows its lease is gone.
        assert!(a_rx.recv().await.is_none());
        // With nobody watching, a change waits for nobody.
        ws.changed("team", vec!["k".into()], 0).await;
    }

    #[tokio::test]
    async fn a_change_is_not_told_to_the_watcher_that_made_it() {
        let ws = Arc::new(Watchers::default());
        let (a, mut a_rx) = ws.register("team").unwrap();
        let (b, mut b_rx) = ws.register("team").unwrap();
        assert_ne!(a.id(), b.id());
        for w in [&a, &b] {
            ws.hold("team", w.id(), ws.now(), vec!["".into()]).await;
        }
        let changed = tokio::spawn({
            let (ws, except) = (ws.clone(), a.id());
            async move { ws.changed("team", vec!["k".into()], except).await }
        });
        assert_eq!(next(&mut b_rx).await.seq, 1);
        assert!(b.up(1, 0).is_none());
        // Answered once B acknowledged: A was never waited for.
        changed.await.unwrap();
        assert!(a_rx.try_recv().is_err());
        // A's acknowledgement of everything sent to it still renews its lease.
        assert!(a.up(0, 3).is_some_and(|d| d.renewed == 3));
    }

    #[tokio::test]
    async fn a_change_is_told_only_to_the_watchers_that_hold_what_it_changes() {
        let ws = Arc::new(Watchers::default());
        let (a, mut a_rx) = ws.register("team").unwrap();
        let (b, mut b_rx) = ws.register("team").unwrap();
        let (c, mut c_rx) = ws.register("team").unwrap();
        // A listed x; B resolved y/f; C was answered nothing.
        ws.hold("team", a.id(), ws.now(), vec!["x".into()]).await;
        ws.hold("team", b.id(), ws.now(), vec!["y/f".into()]).await;
        let cases: [(&str, bool, bool); 6] = [
            ("x/new", true, false),    // a name in A's listing
            ("x/d/f", true, false),    // x/d's times and link count, in A's listing
            ("x/d/e/f", false, false), // deeper: nobody's
            ("y/f", false, true),      // B's file
            ("y", false, true),        // a tree above B's file (removed, renamed)
            ("z", false, false),       // nobody's
        ];
        for (path, to_a, to_b) in cases {
            let changed = tokio::spawn({
                let ws = ws.clone();
                let path = path.to_string();
                async move { ws.changed("team", vec![path], 0).await }
            });
            for (w, rx, told) in [(&a, &mut a_rx, to_a), (&b, &mut b_rx, to_b)] {
                if told {
                    let m = next(rx).await;
                    assert_eq!(m.paths, [path]);
                    w.up(m.seq, 0);
                }
            }
            changed.await.unwrap();
            assert!(
                a_rx.try_recv().is_err() && b_rx.try_recv().is_err(),
                "{path}"
            );
        }
        // Everything concerns everyone; C, who holds nothing, was told nothing else.
        let changed = tokio::spawn({
            let ws = ws.clone();
            async move { ws.changed("team", vec![String::new()], 0).await }
        });
        for (w, rx) in [(&a, &mut a_rx), (&b, &mut b_rx), (&c, &mut c_rx)] {
            let m = next(rx).await;
            assert_eq!(m.paths, [""]);
            w.up(m.seq, 0);
        }
        changed.await.unwrap();
        assert_eq!(ws.count(), 3, "nobody let a lease run out");
    }

    #[tokio::test]
    async fn an_answer_that_crossed_a_change_is_followed_by_it_before_it_is_sent() {
        let ws = Arc::new(Watchers::default());
        let (a, mut a_rx) = ws.register("team").unwrap();
        // A's listing of x is read (before the change), then the change is made and told to
        // nobody (A did not hold x yet), then A's answer registers x: A is told now, and the
        // answer waits for A's acknowledgement.
        let since = ws.now();
        ws.changed("team", vec!["x/new".into(), "q".into()], 0)
            .await;
        assert!(a_rx.try_recv().is_err());
        let held = tokio::spawn({
            let (ws, id) = (ws.clone(), a.id());
            async move { ws.hold("team", id, since, vec!["x".into()]).await }
        });
        let got = next(&mut a_rx).await;
        assert_eq!(got.paths, ["x/new"]);
        assert!(!held.is_finished());
        a.up(got.seq, 0);
        held.await.unwrap();
        // An answer read after the change registers without a word.
        ws.hold("team", a.id(), ws.now(), vec!["q".into()]).await;
        assert!(a_rx.try_recv().is_err());
        // One read from before what the server still remembers is told everything.
        for i in 0..RECENT + 1 {
            ws.changed("team", vec![format!("n{i}")], 0).await;
        }
        let held = tokio::spawn({
            let (ws, id) = (ws.clone(), a.id());
            async move { ws.hold("team", id, since, vec!["w".into()]).await }
        });
        let got = loop {
            let m = next(&mut a_rx).await;
            a.up(m.seq, 0);
            if m.paths == [""] {
                break m;
            }
        };
        assert_eq!(got.paths, [""]);
        held.await.unwrap();
    }

    #[tokio::test]
    async fn a_watcher_past_its_bound_is_told_everything_once_and_then_holds_nothing() {
        let ws = Arc::new(Watchers::default());
        let (a, mut a_rx) = ws.register("team").unwrap();
        let (b, mut b_rx) = ws.register("team").unwrap();
        ws.hold("team", b.id(), ws.now(), vec!["".into()]).await;
        let many: Vec<String> = (0..MAX_HELD).map(|i| format!("d/{i}")).collect();
        ws.hold("team", a.id(), ws.now(), many).await;
        assert!(a_rx.try_recv().is_err(), "at its bound: nothing told");
        let held = tokio::spawn({
            let (ws, id) = (ws.clone(), a.id());
            async move { ws.hold("team", id, ws.now(), vec!["one/more".into()]).await }
        });
        let got = tokio::time::timeout(Duration::from_secs(5), next(&mut a_rx))
            .await
            .expect("told nothing past its bound");
        assert_eq!(got.paths, [""], "told everything");
        assert!(
            !held.is_finished(),
            "the answer waits for the acknowledgement"
        );
        a.up(got.seq, 0);
        held.await.unwrap();
        // It holds nothing now: a change of what it held before is not told to it.
        let changed = tokio::spawn({
            let ws = ws.clone();
            async move { ws.changed("team", vec!["d/7".into()], 0).await }
        });
        let told_b = next(&mut b_rx).await;
        b.up(told_b.seq, 0);
        changed.await.unwrap();
        assert!(a_rx.try_recv().is_err(), "told of what it no longer holds");
        // What it is answered from now on is held again.
        ws.hold("team", a.id(), ws.now(), vec!["e".into()]).await;
        let changed = tokio::spawn({
            let ws = ws.clone();
            async move { ws.changed("team", vec!["e/f".into()], 0).await }
        });
        let told_b = next(&mut b_rx).await;
        b.up(told_b.seq, 0);
        let got = next(&mut a_rx).await;
        assert_eq!(got.paths, ["e/f"]);
        a.up(got.seq, 0);
        changed.await.unwrap();
    }

    #[tokio::test]
    async fn closing_ends_every_stream_and_refuses_new_watches() {
        let ws = Arc::new(Watchers::default());
        let (_a, mut a_rx) = ws.register("team").unwrap();
        ws.close();
        assert!(a_rx.recv().await.is_none());
        assert!(ws.register("team").is_none());
    }

    /// A shard that went ends its namespaces' streams alone; those watchers' mounts watch
    /// again at the shard's next owner, and this replica still takes new watches.
    #[tokio::test]
    async fn a_namespace_let_go_ends_its_streams_alone() {
        let ws = Arc::new(Watchers::default());
        let (_a, mut a_rx) = ws.register("moved").unwrap();
        let (_b, mut b_rx) = ws.register("kept").unwrap();
        ws.end_unless(|ns| ns == "kept");
        assert!(a_rx.recv().await.is_none());
        assert_eq!(ws.count(), 1);
        assert!(b_rx
            .try_recv()
            .is_err_and(|e| e == mpsc::error::TryRecvError::Empty));
        assert!(ws.register("moved").is_some());
    }
}
