//! What the store server listed of the namespace, as this mount keeps it.
//!
//! Listings of directories are cached for [`LISTING_TTL`] on the core's clock, or for as
//! long as the mount's watch of its namespace holds a lease (see `fs::watch`: the store
//! server then tells it of every change before the change's writer is answered), and forgotten
//! at once when this mount changes them or is told of a change; files being written here show
//! before they are published.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bound::bound;
use super::last_seen::LastSeen;
use crate::clock::SharedClock;
use crate::fs::paths::{join, split};
use crate::locks::lock;
use crate::manifest::EntryKind;
use crate::proto::ListEntry;

/// How long a directory listing from the store server is trusted.
pub const LISTING_TTL: Duration = Duration::from_secs(1);

/// Entries of the listings a reader of a directory asks for beside its own, under the lease:
/// those a walk of the tree (ls -R, find, cp -r) reads next. A first look at a tree of 100
/// directories of 100 files then asks 3 times, not 101; a lone `ls` pays for a few thousand
/// entries it may not need (about a millisecond of the server's time).
pub const LIST_AHEAD: u32 = 4096;

pub(crate) type Entries = Arc<BTreeMap<String, ListEntry>>;

pub use super::bound::{MAX_ENTRIES, MAX_LISTINGS};

/// Directory listings fetched from the store server, by path.
pub struct Listings {
    clock: SharedClock,
    /// With the earliest expiry of a key among the entries (unix ms; `i64::MAX`: none).
    cached: Mutex<BTreeMap<String, (Instant, Entries, i64)>>,
    /// Directories' link counts, kept apart from the listings (see `dir_links`).
    links: Mutex<BTreeMap<String, (Instant, u32)>>,
    /// The namespace root's own entry (no parent lists it).
    root: Mutex<Option<(Instant, ListEntry)>>,
    /// Paths this mount changed (or changed inside), with when: their parents' cached listings
    /// show what they were, so their own entries are asked for alone until those listings
    /// have expired. A change in a directory thus costs one small request, not a listing of
    /// the directory above it.
    changed: Mutex<HashMap<String, Instant>>,
    /// Entries asked for alone (`None`: nothing there).
    own: Mutex<BTreeMap<String, (Instant, Option<ListEntry>)>>,
    /// Moves on every change the watch tells of: an answer asked for before it may predate
    /// the change, and is not kept.
    epoch: AtomicU64,
    /// Files' resolved versions, kept only while the lease holds (an open asks for its
    /// version otherwise: close-to-open).
    resolved: Mutex<BTreeMap<String, (Instant, Arc<crate::proto::ResolveResponse>)>>,
    /// Until when the watch's lease holds (real time: the server counts it so). Locked last
    /// and alone: the caches read it under their own locks.
    lease: Mutex<Option<std::time::Instant>>,
    /// The number the server gave this mount's watch (0: none yet): a publish that names it
    /// is not told back to this mount, which takes the change from the publish's answer.
    watcher: AtomicU64,
    /// Whether the last call to the store server found none reachable (see `stale_reads`).
    unreachable: std::sync::atomic::AtomicBool,
    /// The watch's lease was lost and no new one holds yet: nothing cached is trusted on its
    /// age alone (see [`Listings::valid`]).
    lapsed: std::sync::atomic::AtomicBool,
    /// What was last seen, kept past forgetting: a mount with stale reads alone.
    last: Option<Mutex<LastSeen>>,
}

impl Listings {
    pub fn new(clock: SharedClock) -> Self {
        Listings {
            clock,
            cached: Mutex::default(),
            links: Mutex::default(),
            root: Mutex::default(),
            changed: Mutex::default(),
            own: Mutex::default(),
            epoch: AtomicU64::new(0),
            resolved: Mutex::default(),
            lease: Mutex::default(),
            watcher: AtomicU64::new(0),
            unreachable: std::sync::atomic::AtomicBool::new(false),
            lapsed: std::sync::atomic::AtomicBool::new(false),
            last: None,
        }
    }

    /// The same, keeping what it last saw past forgetting it, for stale reads (see
    /// `last_seen`).
    pub fn keeping_last_seen(mut self) -> Self {
        self.last = Some(Mutex::default());
        self
    }

    /// Notes what was seen of the namespace, where a mount keeps it for stale reads.
    fn seen(&self, note: impl FnOnce(&mut LastSeen, Instant)) {
        if let Some(last) = &self.last {
            note(&mut lock(last), self.clock.now().at);
        }
    }

    /// Whether the last call to the store server found none reachable.
    pub(crate) fn unreachable(&self) -> bool {
        self.unreachable.load(Ordering::SeqCst)
    }

    /// A call to the store server reached one (`true`), or found none reachable.
    pub(crate) fn reached(&self, reached: bool) {
        self.unreachable.store(!reached, Ordering::SeqCst);
    }

    /// Notes how a call to the store server ended: answered (`None`), or failed with `fault`,
    /// which says no server was reachable or is an answer of one. Whether the store stays
    /// unreachable is then what [`Listings::unreachable`] answers.
    pub(crate) fn called(&self, fault: Option<crate::rpc::Fault>) {
        match fault {
            None => self.reached(true),
            Some(f) if crate::fs::error::unreachable_fault(f) => self.reached(false),
            Some(_) => self.reached(true),
        }
    }

    /// `path`'s listing as last seen, however old, for a mount with stale reads while no store
    /// server answers.
    pub(crate) fn last_listing(&self, path: &str) -> Option<Entries> {
        if let Some((_, e, _)) = lock(&self.cached).get(path) {
            return Some(e.clone());
        }
        lock(self.last.as_ref()?).last_listing(path)
    }

    /// `path`'s own entry as last seen, however old (`Some(None)`: seen as nothing there).
    pub(crate) fn last_own(&self, path: &str) -> Option<Option<ListEntry>> {
        if let Some((_, e)) = lock(&self.own).get(path) {
            return Some(e.clone());
        }
        let (dir, name) = split(path);
        if let Some((_, entries, _)) = lock(&self.cached).get(dir) {
            return Some(entries.get(name).cloned());
        }
        let last = lock(self.last.as_ref()?);
        last.last_own(path)
            .or_else(|| last.last_listing(dir).map(|e| e.get(name).cloned()))
    }

    /// `path`'s resolved version as last seen, lease or not (see [`Listings::last_listing`]).
    pub(crate) fn last_resolved(&self, path: &str) -> Option<Arc<crate::proto::ResolveResponse>> {
        if let Some((_, r)) = lock(&self.resolved).get(path) {
            return Some(r.clone());
        }
        lock(self.last.as_ref()?).last_resolved(path)
    }

    /// Whether what was cached at `at` still holds: within the TTL, or while the lease does
    /// and no key in it expired (an expiry is not told to watchers; `expires` in unix ms).
    pub(crate) fn valid(&self, now: Instant, at: Instant, expires: i64) -> bool {
        (now.duration_since(at) < LISTING_TTL && !self.lapsed())
            || (self.leased() && unix_ms() < expires)
    }

    /// Whether the watch's lease was lost and no new one holds yet. A mount that watches
    /// caches on the lease's word; between a lost lease and the next (a store replica's death,
    /// a broken stream) it trusts no answer on its age alone, as a mount that never watched
    /// does for [`LISTING_TTL`], so that a file another node published a moment ago is not
    /// missing from a listing taken just before (measured: `bench/failover.sh`'s mount read
    /// keys put after the owner's death as absent for up to a second).
    pub(crate) fn lapsed(&self) -> bool {
        self.lapsed.load(Ordering::SeqCst)
    }

    /// Whether the watch's lease holds now.
    pub(crate) fn leased(&self) -> bool {
        self.leased_beyond(std::time::Duration::ZERO)
    }

    /// Whether the watch's lease holds for `margin` more at least.
    pub(crate) fn leased_beyond(&self, margin: std::time::Duration) -> bool {
        lock(&self.lease).is_some_and(|until| std::time::Instant::now() + margin < until)
    }

    /// The epoch to hand back with an answer asked for now (see [`Listings::keep`]).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether an answer asked for at `since` may be kept: no change was told of meanwhile.
    pub(crate) fn keep(&self, since: u64) -> bool {
        self.epoch() == since
    }

    pub(crate) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        lock(&self.cached).clear();
        lock(&self.links).clear();
        lock(&self.own).clear();
        lock(&self.resolved).clear();
        *lock(&self.root) = None;
    }

    /// `path`'s resolved version, while the lease holds.
    pub(crate) fn resolved(&self, path: &str) -> Option<Arc<crate::proto::ResolveResponse>> {
        let r = lock(&self.resolved).get(path).map(|(_, r)| r.clone())?;
        self.leased().then_some(r)
    }

    pub(crate) fn put_resolved(
        &self,
        path: &str,
        r: Arc<crate::proto::ResolveResponse>,
        since: u64,
    ) {
        let leased = self.leased();
        let now = self.clock.now().at;
        let mut resolved = lock(&self.resolved);
        if leased && self.keep(since) {
            self.seen(|l, at| l.resolved(path, &r, at));
            resolved.insert(path.to_string(), (now, r));
            bound(&mut resolved, MAX_ENTRIES, |v| v.0);
        }
    }

    /// Small files (their bytes fit in a resolve) that follow `path` in its directory's cached listing and whose versions
    /// are not kept yet, at most `max` of them and `budget` bytes in all: what a reader going
    /// through the directory (cat, cp -r, tar: in name order, as listed) opens next. None
    /// without the lease, under which alone resolved versions are kept.
    pub(crate) fn next_small_files(&self, path: &str, max: usize, budget: u64) -> Vec<String> {
        if max == 0 || !self.leased() {
            return Vec::new();
        }
        let (dir, name) = split(path);
        let Some(entries) = self.fresh(dir) else {
            return Vec::new();
        };
        let resolved = lock(&self.resolved);
        let mut left = budget;
        let mut out = Vec::new();
        for (n, e) in entries.range::<str, _>((Excluded(name), Unbounded)) {
            if out.len() >= max {
                break;
            }
            let small = e.size <= u64::from(crate::rpc::MAX_INLINE_FILE);
            if e.is_directory || e.kind() != EntryKind::File || e.expires_unix_ms != 0 || !small {
                continue;
            }
            let Some(rest) = left.checked_sub(e.size) else {
                break;
            };
            let p = join(dir, n);
            if !resolved.contains_key(&p) {
                left = rest;
                out.push(p);
            }
        }
        out
    }

    /// The store server told of a change at or below `path` (`""`: anywhere): what this mount
    /// cached of it, below it, and of its directory is forgotten, as after a change made here.
    pub(crate) fn recall(&self, path: &str) {
        if path.is_empty() {
            return self.clear();
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let parent = split(path).0;
        // `path` and what is below it go whole; its directory's listing, own entry and link
        // count with it, as after a change made here.
        self.forget_below(path);
        self.forget(&[parent, path]);
        self.forget_links(&[parent]);
    }

    /// The watch's lease was renewed until `until`. A lease that begins anew (the watch was
    /// down, and changes may have gone untold) begins with nothing cached.
    pub(crate) fn lease_until(&self, until: std::time::Instant) {
        // (`lease` is locked last, and alone: the caches check it under their own locks.)
        if !self.leased() {
            self.clear();
        }
        self.reached(true);
        *lock(&self.lease) = Some(until);
        self.lapsed.store(false, Ordering::SeqCst);
    }

    pub(crate) fn set_watcher(&self, id: u64) {
        self.watcher.store(id, Ordering::SeqCst);
    }

    /// The number of this mount's watch, for its own publishes to name (0 without a lease:
    /// nothing is cached on the watch's word then, and being told costs nothing).
    pub(crate) fn watcher(&self) -> u64 {
        match self.leased() {
            true => self.watcher.load(Ordering::SeqCst),
            false => 0,
        }
    }

    /// This mount published a file at `path`, not told back to it by the watch (see
    /// [`Listings::watcher`]): as a recall would, answers asked for before are not kept, but
    /// its directory's cached listing takes the file's new entry in place of being forgotten,
    /// so the next name looked up in the directory (the next file of a `cp -r`) needs no
    /// listing of it.
    pub(crate) fn own_publish(&self, path: &str, mut entry: ListEntry) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let (dir, name) = split(path);
        entry.name = name.to_string();
        let now = self.clock.now().at;
        let was_dir = {
            // In the order `forget` takes them.
            let mut cached = lock(&self.cached);
            let mut changed = lock(&self.changed);
            let mut own = lock(&self.own);
            let was_dir = match cached.get_mut(dir) {
                Some((_, entries, expires)) => {
                    *expires = (*expires).min(expiry(&entry));
                    let old = Arc::make_mut(entries).insert(name.to_string(), entry.clone());
                    self.seen(|l, at| l.listing(dir, entries, at));
                    old.is_some_and(|e| e.is_directory)
                }
                // Not cached: the next look asks anyway.
                None => true,
            };
            changed.remove(path);
            self.seen(|l, at| l.own(path, &Some(entry.clone()), at));
            own.insert(path.to_string(), (now, Some(entry)));
            lock(&self.resolved).remove(path);
            was_dir
        };
        if was_dir {
            // A directory it replaced took what was below it, and a link of its directory.
            self.forget_below_except(path);
            self.forget_links(&[dir]);
        }
    }

    /// [`Listings::forget_below`] of what is below `path`, keeping `path`'s own entry.
    pub(crate) fn forget_below_except(&self, path: &str) {
        let own = lock(&self.own).get(path).cloned();
        self.forget_below(path);
        if let Some(e) = own {
            lock(&self.own).insert(path.to_string(), e);
        }
    }

    /// The lease is about to lapse unrenewed: until a renewal holds it again, nothing is
    /// trusted on its age alone, as after a lost lease.
    pub(crate) fn lapse(&self) {
        self.lapsed.store(true, Ordering::SeqCst);
    }

    /// The watch broke: what was cached may have missed changes, and until a lease holds
    /// again nothing is trusted on its age alone ([`Listings::lapsed`]; a watch that never
    /// held a lease leaves the mount as one that does not watch).
    pub(crate) fn lease_lost(&self, keep_last: bool) {
        self.watcher.store(0, Ordering::SeqCst);
        if lock(&self.lease).take().is_some() {
            self.lapsed.store(true, Ordering::SeqCst);
        }
        if keep_last {
            // Kept for stale reads alone (`last_listing`, `last_resolved`), and a new lease
            // begins with nothing cached.
            self.epoch.fetch_add(1, Ordering::SeqCst);
        } else {
            self.clear();
        }
    }

    /// `path`'s cached listing while the lease holds: every change to it since it was taken
    /// was told (and forgot it), so it is as fresh as a new one.
    pub(crate) fn leased_listing(&self, path: &str) -> Option<Entries> {
        self.leased().then(|| self.fresh(path)).flatten()
    }

    pub(crate) fn fresh(&self, path: &str) -> Option<Entries> {
        let now = self.clock.now().at;
        let cached = lock(&self.cached);
        let (at, entries, expires) = cached.get(path)?;
        self.valid(now, *at, *expires).then(|| entries.clone())
    }

    pub(crate) fn put(&self, path: &str, entries: Entries, since: u64) {
        let now = self.clock.now().at;
        let expires = entries.values().map(expiry).min().unwrap_or(i64::MAX);
        let mut cached = lock(&self.cached);
        if self.keep(since) {
            self.seen(|l, at| l.listing(path, &entries, at));
            cached.insert(path.to_string(), (now, entries, expires));
            bound(&mut cached, MAX_LISTINGS, |v| v.0);
        }
    }

    /// Forgets the listings of `paths`, and their own entries (a directory's mtime and ctime
    /// among them) as the listings of their parents show them.
    pub(crate) fn forget(&self, paths: &[&str]) {
        let now = self.clock.now().at;
        let mut cached = lock(&self.cached);
        let mut changed = lock(&self.changed);
        let mut own = lock(&self.own);
        if changed.len() > 4096 {
            changed.retain(|_, at| now.duration_since(*at) < LISTING_TTL);
            own.retain(|_, (at, _)| now.duration_since(*at) < LISTING_TTL);
        }
        let mut resolved = lock(&self.resolved);
        for p in paths {
            cached.remove(*p);
            own.remove(*p);
            resolved.remove(*p);
            if p.is_empty() {
                *lock(&self.root) = None;
            } else {
                changed.insert(p.to_string(), now);
            }
        }
    }

    /// The entry of `path` as asked for alone, while that is fresher than its parent's listing:
    /// `Some(None)` for nothing there, `None` when the listing is to be used.
    pub(crate) fn own(&self, path: &str) -> Option<Option<ListEntry>> {
        let now = self.clock.now().at;
        if let Some((at, e)) = lock(&self.own).get(path) {
            if self.valid(now, *at, e.as_ref().map_or(i64::MAX, expiry)) {
                return Some(e.clone());
            }
        }
        None
    }

    /// When this mount last changed `path`, if a cached listing may still predate it.
    pub(crate) fn changed_at(&self, path: &str) -> Option<Instant> {
        let now = self.clock.now().at;
        lock(&self.changed)
            .get(path)
            .copied()
            .filter(|at| now.duration_since(*at) < LISTING_TTL)
    }

    /// A cached listing of `path` that has not expired, and when it was taken.
    pub(crate) fn fresh_at(&self, path: &str) -> Option<(Instant, Entries)> {
        let now = self.clock.now().at;
        let cached = lock(&self.cached);
        let (at, entries, expires) = cached.get(path)?;
        self.valid(now, *at, *expires)
            .then(|| (*at, entries.clone()))
    }

    /// Keeps `path`'s own entry, asked for at `since` (`None`: an answer to this mount's own
    /// change, which it keeps whatever else changed).
    pub(crate) fn put_own(&self, path: &str, e: Option<ListEntry>, since: Option<u64>) {
        let now = self.clock.now().at;
        // In the order `forget` takes them.
        let mut changed = lock(&self.changed);
        let mut own = lock(&self.own);
        if since.is_none_or(|s| self.keep(s)) {
            self.seen(|l, at| l.own(path, &e, at));
            changed.remove(path);
            own.insert(path.to_string(), (now, e));
            bound(&mut own, MAX_ENTRIES, |v| v.0);
        }
    }

    pub(crate) fn root(&self) -> Option<ListEntry> {
        let now = self.clock.now().at;
        let root = lock(&self.root);
        let (at, e) = root.as_ref()?;
        self.valid(now, *at, expiry(e)).then(|| e.clone())
    }

    pub(crate) fn put_root(&self, e: ListEntry, since: Option<u64>) {
        let now = self.clock.now().at;
        let mut root = lock(&self.root);
        if since.is_none_or(|s| self.keep(s)) {
            *root = Some((now, e));
        }
    }

    /// Forgets every listing at or below `path` (a moved directory's insides are elsewhere now).
    pub(crate) fn forget_below(&self, path: &str) {
        // A range, not a scan: every change told by the watch comes here, and a mount that
        // read many files holds many entries.
        remove_tree(&mut lock(&self.cached), path);
        remove_tree(&mut lock(&self.own), path);
        remove_tree(&mut lock(&self.links), path);
        remove_tree(&mut lock(&self.resolved), path);
    }

    pub(crate) fn forget_links(&self, paths: &[&str]) {
        let mut links = lock(&self.links);
        for p in paths {
            links.remove(*p);
        }
    }

    pub(crate) fn links(&self, path: &str) -> Option<u32> {
        let now = self.clock.now().at;
        let links = lock(&self.links);
        let (at, n) = links.get(path)?;
        self.valid(now, *at, i64::MAX).then_some(*n)
    }

    pub(crate) fn put_links(&self, path: &str, n: u32, since: u64) {
        let now = self.clock.now().at;
        let mut links = lock(&self.links);
        if self.keep(since) {
            links.insert(path.to_string(), (now, n));
            bound(&mut links, MAX_ENTRIES, |v| v.0);
        }
    }
}

/// Removes `path` and every path below it from `m`.
fn remove_tree<V>(m: &mut BTreeMap<String, V>, path: &str) {
    m.remove(path);
    // Paths below sort between `path/` and `path0` ('0' follows '/').
    let below: Vec<String> = m
        .range(format!("{path}/")..format!("{path}0"))
        .map(|(k, _)| k.clone())
        .collect();
    for k in below {
        m.remove(&k);
    }
}

/// A listing as the mount keeps it: by name, GPU keys left out (they show under /kt/.gpu only).
pub(crate) fn entries_of(entries: Vec<ListEntry>) -> Entries {
    Arc::new(
        entries
            .into_iter()
            .filter(|e| e.kind() != EntryKind::Gpu)
            .map(|e| (e.name.trim_end_matches('/').to_string(), e))
            .collect(),
    )
}

/// When the key of `e` expires, in unix ms (`i64::MAX`: never).
fn expiry(e: &ListEntry) -> i64 {
    match e.expires_unix_ms {
        0 => i64::MAX,
        ms => ms,
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_removed_whole_and_names_that_only_begin_alike_stay() {
        let mut m: BTreeMap<String, ()> =
            ["a", "a/b", "a/b/c", "a-b", "a.b", "a0", "ab", "b", "a/"]
                .iter()
                .map(|k| (k.to_string(), ()))
                .collect();
        remove_tree(&mut m, "a");
        let left: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(left, ["a-b", "a.b", "a0", "ab", "b"]);
    }

    #[test]
    fn a_cache_past_its_bound_forgets_its_oldest_quarter() {
        let t0 = Instant::now();
        let mut m: BTreeMap<String, Instant> = (0..10u64)
            .map(|i| (format!("p{i}"), t0 + Duration::from_millis(10 - i)))
            .collect();
        bound(&mut m, 10, |t| *t);
        assert_eq!(m.len(), 10, "at its bound: kept");
        m.insert("new".into(), t0 + Duration::from_secs(1));
        bound(&mut m, 10, |t| *t);
        let mut left: Vec<&str> = m.keys().map(String::as_str).collect();
        left.sort();
        // p9 was taken first, then p8 ..., the new one last: p9 .. p6 go.
        assert_eq!(left, ["new", "p0", "p1", "p2", "p3", "p4", "p5"]);
        // One instant for all: still bounded.
        let mut same: BTreeMap<String, Instant> = (0..100).map(|i| (format!("q{i}"), t0)).collect();
        bound(&mut same, 40, |t| *t);
        assert_eq!(same.len(), 30);
    }

    #[test]
    fn a_mount_keeps_a_bounded_number_of_listings_entries_and_versions() {
        let l = Listings::new(crate::clock::system());
        l.lease_until(std::time::Instant::now() + Duration::from_secs(60));
        for i in 0..=MAX_LISTINGS {
            l.put(&format!("d{i}"), Arc::new(BTreeMap::new()), l.epoch());
        }
        for i in 0..=MAX_ENTRIES {
            let p = format!("f{i}");
            l.put_own(&p, None, Some(l.epoch()));
            l.put_links(&p, 2, l.epoch());
            l.put_resolved(&p, Arc::default(), l.epoch());
        }
        assert!(lock(&l.cached).len() <= MAX_LISTINGS);
        assert!(lock(&l.own).len() <= MAX_ENTRIES);
        assert!(lock(&l.links).len() <= MAX_ENTRIES);
        assert!(lock(&l.resolved).len() <= MAX_ENTRIES);
        // The newest stay.
        assert!(l.fresh(&format!("d{MAX_LISTINGS}")).is_some());
        assert!(l.resolved(&format!("f{MAX_ENTRIES}")).is_some());
    }

    /// A listing is trusted for LISTING_TTL on a mount that never held a lease; between a lost
    /// lease and the next, not at all (a file put meanwhile elsewhere must not be missing from
    /// a listing taken a moment before); with a lease again, as ever.
    #[test]
    fn between_a_lost_lease_and_the_next_no_listing_is_trusted_on_its_age() {
        let l = Listings::new(crate::clock::system());
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        assert!(l.fresh("d").is_some(), "never leased: kept for its TTL");
        l.lease_lost(false);
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        assert!(
            l.fresh("d").is_some(),
            "a watch that never held a lease changes nothing"
        );

        l.lease_until(std::time::Instant::now() + Duration::from_secs(60));
        l.lease_lost(false);
        assert!(l.lapsed());
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        l.put_own("d/f", None, Some(l.epoch()));
        assert!(l.fresh("d").is_none() && l.own("d/f").is_none());

        l.lease_until(std::time::Instant::now() + Duration::from_secs(60));
        assert!(!l.lapsed());
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        assert!(l.fresh("d").is_some());

        // A lease about to lapse unrenewed (the stream still up): the same until renewed.
        l.lease_until(std::time::Instant::now());
        l.lapse();
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        assert!(l.fresh("d").is_none());
        l.lease_until(std::time::Instant::now() + Duration::from_secs(60));
        l.put("d", Arc::new(BTreeMap::new()), l.epoch());
        assert!(l.fresh("d").is_some());
    }

    /// With stale reads, what a change told by the watch makes the caches forget (the root's
    /// listing as another node makes a directory in it; a file changed) is still what the
    /// mount last saw, past the lease's end; without them it is gone.
    #[test]
    fn a_mount_with_stale_reads_keeps_what_it_last_saw_past_a_told_change() {
        for keep in [false, true] {
            let l = match keep {
                true => Listings::new(crate::clock::system()).keeping_last_seen(),
                false => Listings::new(crate::clock::system()),
            };
            l.lease_until(Instant::now() + Duration::from_secs(60));
            let dir = ListEntry {
                is_directory: true,
                kind: EntryKind::Directory as i32,
                ..Default::default()
            };
            l.put(
                "",
                Arc::new(BTreeMap::from([("pvc".into(), dir)])),
                l.epoch(),
            );
            l.put_own("pvc/f", Some(file(3)), Some(l.epoch()));
            l.put_resolved("pvc/f", Arc::default(), l.epoch());
            l.recall("plain");
            l.recall("pvc/f");
            l.lease_lost(keep);
            assert_eq!(l.last_listing("").is_some(), keep);
            assert_eq!(l.last_own("pvc/f").is_some_and(|e| e.is_some()), keep);
            assert_eq!(l.last_resolved("pvc/f").is_some(), keep);
            assert!(l.fresh("").is_none() && l.resolved("pvc/f").is_none());
        }
    }

    fn file(size: u64) -> ListEntry {
        ListEntry {
            kind: EntryKind::File as i32,
            size,
            ..Default::default()
        }
    }

    #[test]
    fn the_small_files_after_an_open_one_are_its_directory_s_next_under_the_lease_only() {
        let l = Listings::new(crate::clock::system());
        let mut entries: BTreeMap<String, ListEntry> = BTreeMap::new();
        for (name, e) in [
            ("a", file(10)),
            ("b", file(10)),
            ("c", file(100 << 10)), // too big to come inline
            (
                "d",
                ListEntry {
                    is_directory: true,
                    kind: EntryKind::Directory as i32,
                    ..Default::default()
                },
            ),
            (
                "e",
                ListEntry {
                    expires_unix_ms: 1,
                    ..file(10)
                },
            ),
            ("f", file(10)),
            ("g", file(10)),
            ("h", file(30)),
        ] {
            entries.insert(name.into(), e);
        }
        let entries = Arc::new(entries);
        l.put("dir", entries.clone(), l.epoch());
        assert!(l.next_small_files("dir/a", 8, 1000).is_empty(), "no lease");
        // (A lease that begins forgets what was cached before it.)
        l.lease_until(Instant::now() + Duration::from_secs(60));
        l.put("dir", entries, l.epoch());
        assert_eq!(
            l.next_small_files("dir/a", 8, 1000),
            ["dir/b", "dir/f", "dir/g", "dir/h"]
        );
        assert_eq!(l.next_small_files("dir/a", 2, 1000), ["dir/b", "dir/f"]);
        // The budget stops it at the first file that does not fit.
        assert_eq!(
            l.next_small_files("dir/a", 8, 35),
            ["dir/b", "dir/f", "dir/g"]
        );
        // What is kept already is not asked for again.
        let kept = Arc::new(crate::proto::ResolveResponse::default());
        l.put_resolved("dir/f", kept, l.epoch());
        assert_eq!(l.next_small_files("dir/b", 8, 1000), ["dir/g", "dir/h"]);
        assert!(l.next_small_files("other/a", 8, 1000).is_empty());
    }
}
