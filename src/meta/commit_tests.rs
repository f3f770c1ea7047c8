//! Tests of group commit: on RocksDB in a temporary directory, behind a backend whose synced
//! writes the test holds back (to queue changes behind a batch) and can make fail.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::backend::{KeyValue, Op, Step, Table, Visit};
use super::*;
use crate::blocks::files::BlockFiles;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::locks;
use crate::manifest::{BlockRef, EntryKind, FileEntry, Manifest};

/// Where synced writes wait until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    /// Synced writes that arrived, held or not.
    arrived: AtomicU64,
    fail: AtomicBool,
    /// Stored entries the scans read.
    rows: AtomicU64,
}

impl Gate {
    fn set_open(&self, open: bool) {
        *locks::lock(&self.open) = open;
        self.opened.notify_all();
    }
}

struct GatedDb {
    db: Db,
    gate: Arc<Gate>,
}

impl MetaBackend for GatedDb {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        MetaBackend::get(&self.db, table, key)
    }
    fn scan_prefix(&self, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, BackendError> {
        let rows = MetaBackend::scan_prefix(&self.db, table, prefix)?;
        self.gate
            .rows
            .fetch_add(rows.len() as u64, Ordering::SeqCst);
        Ok(rows)
    }
    fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError> {
        MetaBackend::for_each(&self.db, table, f)
    }
    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError> {
        MetaBackend::walk_from(&self.db, table, prefix, span, &mut |k, v| {
            self.gate.rows.fetch_add(1, Ordering::SeqCst);
            f(k, v)
        })
    }
    fn write(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        MetaBackend::write(&self.db, ops)
    }
    fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        self.gate.arrived.fetch_add(1, Ordering::SeqCst);
        let mut open = locks::lock(&self.gate.open);
        while !*open {
            open = self.gate.opened.wait(open).unwrap();
        }
        drop(open);
        if self.gate.fail.load(Ordering::SeqCst) {
            return Err(BackendError("injected write failure".into()));
        }
        MetaBackend::write_synced(&self.db, ops)
    }
    fn flush(&self) -> Result<(), BackendError> {
        MetaBackend::flush(&self.db)
    }
}

fn open_db(dir: &std::path::Path) -> Db {
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    Db::open(&dir.join("db"), &families, &[CF_BLOCKS]).unwrap()
}

/// A store over the database in `dir`, its synced writes behind `gate` (none: straight).
fn open_store(dir: &std::path::Path, gate: Option<Arc<Gate>>) -> MetaStore {
    open_store_at(dir, gate, &ManualClock::default())
}

fn open_store_at(dir: &std::path::Path, gate: Option<Arc<Gate>>, clock: &ManualClock) -> MetaStore {
    let db = open_db(dir);
    let files = BlockFiles::open(&dir.join("blocks")).unwrap();
    let blocks = Arc::new(StoreBlocks::new(db.clone(), files));
    let clock = clock.shared();
    let lease = Duration::from_secs(60);
    match gate {
        Some(gate) => MetaStore::new(GatedDb { db, gate }, blocks, lease, clock),
        None => MetaStore::new(db, blocks, lease, clock),
    }
}

/// A one-block file of `data`, its block stored.
fn stored_file(meta: &MetaStore, data: &[u8]) -> Manifest {
    meta.blocks().put(&BlockHash::of(data), data).unwrap();
    Manifest {
        block_size: 1024,
        entries: vec![FileEntry {
            kind: EntryKind::File as i32,
            size: data.len() as u64,
            blocks: vec![BlockRef {
                hash: BlockHash::of(data).0.to_vec(),
                len: data.len() as u32,
            }],
            ..Default::default()
        }],
    }
}

fn publish(meta: &MetaStore, key: &str, m: &Manifest) -> Result<Version, MetaError> {
    let key = KeyPath::parse(key).unwrap();
    meta.publish(Publish::new(&Namespace::default(), &key, m))
}

/// Waits for a state the threads of a test reach on their own (never a fixed delay).
fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn concurrent_publishes_are_acknowledged_with_fewer_syncs_than_publishes() {
    const N: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let meta = Arc::new(open_store(dir.path(), Some(gate.clone())));
    let files: Vec<Manifest> = (0..N)
        .map(|i| stored_file(&meta, format!("file {i}").as_bytes()))
        .collect();
    // The first publish leads a batch and is held in its sync; the others queue behind it.
    let (m, f) = (meta.clone(), files[0].clone());
    let first = std::thread::spawn(move || publish(&m, "d/f0", &f));
    until("the first sync", || {
        gate.arrived.load(Ordering::SeqCst) == 1
    });
    let rest: Vec<_> = (1..N)
        .map(|i| {
            let (m, f) = (meta.clone(), files[i].clone());
            std::thread::spawn(move || publish(&m, &format!("d/f{i}"), &f))
        })
        .collect();
    until("every publish queued", || {
        meta.commit_stats().waiting == N as u64
    });
    assert_eq!(
        meta.commit_stats().committed,
        0,
        "acknowledged before its sync"
    );
    gate.set_open(true);
    let mut versions = vec![first.join().unwrap().unwrap()];
    versions.extend(rest.into_iter().map(|t| t.join().unwrap().unwrap()));
    let stats = meta.commit_stats();
    assert_eq!(stats.committed, N as u64);
    assert_eq!(stats.syncs, 2, "{N} publishes took {} syncs", stats.syncs);
    assert_eq!(gate.arrived.load(Ordering::SeqCst), 2);
    // Every acknowledged publish is in the database, opened afresh.
    drop(meta);
    let meta = open_store(dir.path(), None);
    for (i, v) in versions.iter().enumerate() {
        let key = KeyPath::parse(&format!("d/f{i}")).unwrap();
        let found = meta.resolve(&Namespace::default(), &key).unwrap();
        assert_eq!(found.record.version, v.0.to_vec(), "d/f{i}");
    }
}

#[test]
fn a_change_checks_against_queued_changes_and_readers_see_only_durable_ones() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let meta = Arc::new(open_store(dir.path(), Some(gate.clone())));
    let (one, two) = (stored_file(&meta, b"one"), stored_file(&meta, b"two"));
    let (m, f) = (meta.clone(), one.clone());
    let held = std::thread::spawn(move || publish(&m, "k", &f));
    until("the held sync", || gate.arrived.load(Ordering::SeqCst) == 1);
    let ns = Namespace::default();
    // Not durable: readers do not see it.
    assert!(matches!(
        meta.resolve(&ns, &KeyPath::parse("k").unwrap()),
        Err(MetaError::NotFound(_))
    ));
    // But the next change is checked against it.
    assert!(matches!(
        publish(&meta, "k", &two),
        Err(MetaError::Exists(_))
    ));
    assert!(matches!(
        publish(&meta, "k/below", &two),
        Err(MetaError::NotDir(_))
    ));
    gate.set_open(true);
    let v = held.join().unwrap().unwrap();
    let found = meta.resolve(&ns, &KeyPath::parse("k").unwrap()).unwrap();
    assert_eq!(found.record.version, v.0.to_vec());
}

#[test]
fn a_failed_batch_fails_its_changes_and_those_queued_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let meta = Arc::new(open_store(dir.path(), Some(gate.clone())));
    let file = stored_file(&meta, b"data");
    let spawn = |key: &'static str| {
        let (m, f) = (meta.clone(), file.clone());
        std::thread::spawn(move || publish(&m, key, &f))
    };
    let a = spawn("a");
    until("the held sync", || gate.arrived.load(Ordering::SeqCst) == 1);
    // Queued behind the held batch, planned on its effects.
    let (b, c) = (spawn("b"), spawn("c"));
    until("three queued", || meta.commit_stats().waiting == 3);
    gate.fail.store(true, Ordering::SeqCst);
    gate.set_open(true);
    for (key, t) in [("a", a), ("b", b), ("c", c)] {
        let r = t.join().unwrap();
        assert!(
            matches!(r, Err(MetaError::Backend(_))),
            "{key} was {:?}",
            r.map(|v| v.hex())
        );
    }
    assert_eq!(meta.commit_stats().committed, 0);
    // Nothing of them stayed, stored or planned: the same publishes go through now.
    gate.fail.store(false, Ordering::SeqCst);
    let ns = Namespace::default();
    for key in ["a", "b", "c"] {
        assert!(matches!(
            meta.resolve(&ns, &KeyPath::parse(key).unwrap()),
            Err(MetaError::NotFound(_))
        ));
    }
    publish(&meta, "a", &file).unwrap();
    publish(&meta, "b", &file).unwrap();
    assert_eq!(meta.commit_stats().committed, 2);
}

#[test]
fn a_publish_into_a_directory_of_many_keys_reads_few_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    gate.set_open(true);
    let meta = open_store(dir.path(), Some(gate.clone()));
    let file = stored_file(&meta, b"data");
    for i in 0..500 {
        publish(&meta, &format!("d/f{i}"), &file).unwrap();
    }
    let before = gate.rows.load(Ordering::SeqCst);
    publish(&meta, "d/one-more", &file).unwrap();
    // What the server does after each publish: the entry of the file's directory.
    let d = KeyPath::parse("d").unwrap();
    let dir_entry = meta.list_dir_only(&Namespace::default(), Some(&d)).unwrap();
    assert!(dir_entry.exists);
    let read = gate.rows.load(Ordering::SeqCst) - before;
    assert!(read <= 8, "a publish beside 500 keys read {read} of them");
}

#[test]
fn a_listing_of_one_level_reads_one_live_key_per_directory_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    gate.set_open(true);
    let clock = ManualClock::default();
    let meta = open_store_at(dir.path(), Some(gate.clone()), &clock);
    let ns = Namespace::default();
    let file = stored_file(&meta, b"data");
    for d in ["a", "b", "c"] {
        for i in 0..300 {
            publish(&meta, &format!("top/{d}/f{i:03}"), &file).unwrap();
        }
    }
    publish(&meta, "top/file", &file).unwrap();
    // A directory whose first keys expired still shows; one whose every key expired does not.
    let key = |k: &str| KeyPath::parse(k).unwrap();
    for k in ["top/b/0-gone", "top/gone/x", "top/gone/y/z"] {
        meta.publish(Publish {
            ttl_secs: 1,
            ..Publish::new(&ns, &key(k), &file)
        })
        .unwrap();
    }
    meta.set_attr(&ns, &key("top/file"), Some(0o600), None, (None, None))
        .unwrap();
    meta.set_attr(&ns, &key("top/a/f001"), Some(0o600), None, (None, None))
        .unwrap();
    clock.advance(Duration::from_secs(2));

    let before = gate.rows.load(Ordering::SeqCst);
    let listing = meta.list(&ns, Some(&key("top")), false).unwrap();
    let read = gate.rows.load(Ordering::SeqCst) - before;
    let names: Vec<_> = listing.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a/", "b/", "c/", "file"]);
    assert_eq!(listing.entries[3].mode & 0o777, 0o600);
    assert!(read <= 24, "a listing of 4 names read {read} rows");

    // Everything below, for a recursive listing, with the attributes of deeper paths.
    let all = meta.list(&ns, Some(&key("top")), true).unwrap();
    assert_eq!(all.entries.len(), 901);
    let deep = all.entries.iter().find(|e| e.name == "a/f001").unwrap();
    assert_eq!(deep.mode & 0o777, 0o600);
}

#[test]
fn listings_ahead_follow_a_walk_in_name_order_and_stop_at_whole_listings() {
    let dir = tempfile::tempdir().unwrap();
    let meta = open_store(dir.path(), None);
    let ns = Namespace::default();
    let file = stored_file(&meta, b"data");
    for k in [
        "r/a/1", "r/b/x/1", "r/b/x/2", "r/b/y/1", "r/b/f", "r/c/1", "r/c/2", "r/d/1", "s/1",
    ] {
        publish(&meta, k, &file).unwrap();
    }
    let ahead = |prefix: &str, budget: usize| {
        let key = KeyPath::parse(prefix).unwrap();
        let first = meta.list(&ns, Some(&key), false).unwrap();
        meta.listings_ahead(&ns, Some(&key), &first, budget, 1 << 20)
            .unwrap()
            .into_iter()
            .map(|l| {
                let names: Vec<String> = l.entries.into_iter().map(|e| e.name).collect();
                (l.path, names.join(" "))
            })
            .collect::<Vec<_>>()
    };
    // Below r/b first, then what follows b in r; not what follows r at the top.
    assert_eq!(
        ahead("r/b", 100),
        [
            ("r/b/x".to_string(), "1 2".to_string()),
            ("r/b/y".into(), "1".into()),
            ("r/c".into(), "1 2".into()),
            ("r/d".into(), "1".into()),
        ]
    );
    // Whole listings only: the one that would pass the budget is left to be asked for.
    assert_eq!(ahead("r/b", 4).len(), 2);
    assert_eq!(ahead("r/b", 5).len(), 3);
    assert!(ahead("s", 100).is_empty());
}
