//! Tests of collection shared by replicas (`gc_shared`): replicas in one process over one
//! database, each with its own record of what it touched, spoken to by a stand-in of the board
//! (the board itself, on etcd, is `tests/cluster.rs`'s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::gc_peers::{Doomed, Replicas, Touches};
use super::tests::one_block;
use super::*;
use crate::blocks::files::BlockFiles;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};

type Hook = Box<dyn FnOnce() + Send>;
/// Whether a replica holds a namespace.
type Holds = fn(&[u8]) -> bool;

/// Replicas in this process, each answering for the namespaces `holds` says are its own.
struct InProcess {
    replicas: Vec<(Arc<MetaStore>, Holds)>,
    pass: AtomicU64,
    /// Run as the doom is announced, and as the end is, before the replicas hear of it.
    at_doom: Mutex<Vec<Hook>>,
    at_done: Mutex<Vec<Hook>>,
}

impl Replicas for InProcess {
    fn start(&self) -> Result<(u64, Touches), MetaError> {
        let pass = self.pass.fetch_add(1, Ordering::SeqCst) + 1;
        let mut all = Touches {
            recorded: true,
            ..Touches::default()
        };
        for (r, _) in &self.replicas {
            all.merge(r.gc_report());
        }
        Ok((pass, all))
    }

    fn doom(&self, doomed: &Doomed) -> Result<Option<Touches>, MetaError> {
        for hook in std::mem::take(&mut *self.at_doom.lock().unwrap()) {
            hook();
        }
        let mut spared = Touches {
            recorded: true,
            ..Touches::default()
        };
        for (r, holds) in &self.replicas {
            spared.merge(r.gc_doom(doomed, holds)?.0);
        }
        Ok(Some(spared))
    }

    fn done(&self, pass: u64, collected: &[BlockHash]) -> Result<(), MetaError> {
        for hook in std::mem::take(&mut *self.at_done.lock().unwrap()) {
            hook();
        }
        for (r, _) in &self.replicas {
            r.gc_done(pass, collected);
        }
        Ok(())
    }
}

/// Two replicas of one store: the collector, and another that holds the namespace `other`.
fn two_replicas() -> (tempfile::TempDir, ManualClock, Arc<InProcess>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.path().join("db"), &families, &[CF_BLOCKS]).unwrap();
    let replica = || {
        let files = BlockFiles::open(&dir.path().join("blocks")).unwrap();
        let blocks = Arc::new(StoreBlocks::new(db.clone(), files));
        Arc::new(MetaStore::new(
            db.clone(),
            blocks,
            Duration::from_secs(15),
            clock.shared(),
        ))
    };
    let replicas = InProcess {
        replicas: vec![
            (replica(), |ns: &[u8]| ns != b"other"),
            (replica(), |ns: &[u8]| ns == b"other"),
        ],
        pass: AtomicU64::new(0),
        at_doom: Mutex::default(),
        at_done: Mutex::default(),
    };
    (dir, clock, Arc::new(replicas))
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn publish(meta: &MetaStore, ns: &Namespace, key: &str, data: &[u8], ttl_secs: u64) {
    meta.blocks().put(&BlockHash::of(data), data).unwrap();
    let key = KeyPath::parse(key).unwrap();
    meta.publish(Publish {
        ttl_secs,
        ..Publish::new(ns, &key, &one_block(data))
    })
    .unwrap();
}

/// What one replica uploaded is kept by the other's collection for a whole pass; what a
/// replica asks about while a pass deletes it waits for the pass and then finds it gone.
#[test]
fn a_shared_pass_keeps_what_any_replica_touched_and_holds_what_it_deletes() {
    let (_dir, clock, all) = two_replicas();
    let (collector, other) = (all.replicas[0].0.clone(), all.replicas[1].0.clone());
    // The first pass only starts the replicas' records.
    assert_eq!(
        collector.collect_shared(all.as_ref()).unwrap(),
        Default::default()
    );

    // Uploaded through the other replica, not published yet.
    let pending = b"uploaded, its publish still to come".to_vec();
    other
        .blocks()
        .put(&BlockHash::of(&pending), &pending)
        .unwrap();
    let removed = b"published, then removed".to_vec();
    publish(&other, &ns("other"), "gone", &removed, 0);
    other
        .remove(&ns("other"), &KeyPath::parse("gone").unwrap(), false, false)
        .unwrap();
    clock.advance(Duration::from_secs(1));
    // Both were touched since the pass before, on the other replica alone.
    let r = collector.collect_shared(all.as_ref()).unwrap();
    assert_eq!((r.manifests, r.blocks), (0, 0), "{r:?}");

    // A pass later both are dead and untouched: doomed. The other replica asks about the
    // removed block meanwhile: it waits for the pass, then finds the block gone.
    let asked = Arc::new(Mutex::new(None));
    let (other_at_done, asked_at_done) = (other.clone(), asked.clone());
    let hash = BlockHash::of(&removed);
    all.at_done.lock().unwrap().push(Box::new(move || {
        let (tx, rx) = std::sync::mpsc::channel();
        let asking = std::thread::spawn(move || {
            let held = other_at_done.blocks().contains(&hash).unwrap();
            let _ = tx.send(());
            held
        });
        // Held while the pass is not done.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        *asked_at_done.lock().unwrap() = Some(asking);
    }));
    let r = collector.collect_shared(all.as_ref()).unwrap();
    assert_eq!((r.manifests, r.blocks), (1, 2), "{r:?}");
    let asking = asked.lock().unwrap().take().unwrap();
    assert!(!asking.join().unwrap(), "the block asked about was deleted");
}

/// A block a replica touches after its report and before the doom is spared (a publish
/// between the two naming a block the mark found dead), and each replica deletes the expired
/// keys of its own namespaces alone.
#[test]
fn a_shared_pass_spares_what_was_touched_since_the_report_and_expires_keys_by_their_owner() {
    let (_dir, clock, all) = two_replicas();
    let (collector, other) = (all.replicas[0].0.clone(), all.replicas[1].0.clone());
    collector.collect_shared(all.as_ref()).unwrap();
    let data = b"named again between the report and the doom".to_vec();
    publish(&other, &ns("other"), "k", &data, 0);
    other
        .remove(&ns("other"), &KeyPath::parse("k").unwrap(), false, false)
        .unwrap();
    publish(&other, &ns("other"), "brief", b"lives a second", 1);
    publish(&collector, &ns("mine"), "brief", b"lives a second too", 1);
    collector.collect_shared(all.as_ref()).unwrap();
    clock.advance(Duration::from_secs(2));

    let again = other.clone();
    let named = data.clone();
    all.at_doom.lock().unwrap().push(Box::new(move || {
        publish(&again, &ns("other"), "k", &named, 0);
    }));
    let r = collector.collect_shared(all.as_ref()).unwrap();
    // The block named again stays (and so does its manifest, named again); the two expired
    // keys' manifests and blocks go, each key deleted by its own replica.
    assert_eq!((r.manifests, r.blocks), (2, 2), "{r:?}");
    let k = KeyPath::parse("k").unwrap();
    let found = other.resolve(&ns("other"), &k).unwrap();
    assert!(!found.manifest.entries.is_empty());
    assert!(collector.blocks().contains(&BlockHash::of(&data)).unwrap());
    let rows = |meta: &MetaStore| {
        let mut n = 0;
        meta.backend
            .for_each(backend::Table::Keys, &mut |_, _| {
                n += 1;
                Ok(())
            })
            .unwrap();
        n
    };
    // Only `k` is left of the keys.
    assert_eq!(rows(&collector), 1);
}
