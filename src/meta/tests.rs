//! Tests of the metadata store, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use super::backend::Table;
use super::keys::key_bytes;
use super::*;
use crate::blocks::files::{BlockFiles, MIN_FILE_BLOCK};
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::blocks::Served;
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{BlockRef, EntryKind, FileEntry, Manifest};
use crate::proto::{ListEntry, Locale, NodeInfo};

/// A store over a fresh database in `dir`, on `clock`.
fn open_in(dir: &std::path::Path, lease: Duration, clock: &ManualClock) -> MetaStore {
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.join("db"), &families, &[CF_BLOCKS]).unwrap();
    let files = BlockFiles::open(&dir.join("blocks")).unwrap();
    let blocks = Arc::new(StoreBlocks::new(db.clone(), files));
    MetaStore::new(db, blocks, lease, clock.shared())
}

fn store_on(lease: Duration) -> (tempfile::TempDir, MetaStore, ManualClock) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let meta = open_in(dir.path(), lease, &clock);
    (dir, meta, clock)
}

fn store(lease: Duration) -> (tempfile::TempDir, MetaStore) {
    let (dir, meta, _) = store_on(lease);
    (dir, meta)
}

fn one_file(data: &[u8]) -> Manifest {
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

#[test]
fn nodes_that_stop_heartbeating_stop_being_sources() {
    let (_d, meta, clock) = store_on(Duration::from_millis(200));
    meta.register_node(NodeInfo {
        node_id: "n1".into(),
        data_addr: "127.0.0.1:1".into(),
        zone: String::new(),
    });
    let ns = Namespace::default();
    let key = KeyPath::parse("k").unwrap();
    let v = meta
        .publish(Publish {
            locale: Locale::Local,
            origin: "n1",
            ..Publish::new(&ns, &key, &one_file(b"abc"))
        })
        .unwrap();
    let rec = meta.resolve(&ns, &key).unwrap().record;
    assert_eq!(meta.sources(&v, &rec).unwrap().len(), 1);
    assert!(meta.heartbeat("n1"));
    clock.advance(Duration::from_millis(300));
    assert!(meta.sources(&v, &rec).unwrap().is_empty());
    assert!(!meta.heartbeat("unknown"));
}

#[test]
fn store_publish_checks_block_lengths_against_the_store() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    // A block in the database and one in a file: the index knows both lengths.
    let small = b"small".to_vec();
    let large = vec![7u8; MIN_FILE_BLOCK];
    for b in [&small, &large] {
        meta.blocks().put(&BlockHash::of(b), b).unwrap();
        assert_eq!(
            meta.blocks().stored_len(&BlockHash::of(b)).unwrap(),
            Some(b.len() as u32)
        );
    }
    assert_eq!(
        meta.blocks().stored_len(&BlockHash::of(b"none")).unwrap(),
        None
    );
    for (i, b) in [&small, &large].into_iter().enumerate() {
        let key = KeyPath::parse(&format!("lie{i}")).unwrap();
        let mut m = one_file(b);
        m.block_size = MIN_FILE_BLOCK as u32 * 2;
        m.entries[0].blocks[0].len += 1;
        m.entries[0].size += 1;
        match meta.publish(Publish::new(&ns, &key, &m)) {
            Err(MetaError::BadRequest(msg)) => {
                assert!(msg.contains(&format!("lie{i}: block 0")), "{msg}")
            }
            other => panic!("a lying length was {:?}", other.map(|v| v.hex())),
        }
        assert!(matches!(
            meta.resolve(&ns, &key),
            Err(MetaError::NotFound(_))
        ));
        // Where the store does not hold the blocks, it has nothing to check against.
        meta.register_node(NodeInfo {
            node_id: "n1".into(),
            data_addr: "127.0.0.1:1".into(),
            zone: String::new(),
        });
        meta.publish(Publish {
            locale: Locale::Local,
            origin: "n1",
            ..Publish::new(&ns, &key, &m)
        })
        .unwrap();
    }
}

#[test]
fn store_publish_needs_its_blocks_and_swaps_atomically() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    let key = KeyPath::parse("a/b").unwrap();
    let m1 = one_file(b"one");
    assert!(matches!(
        meta.publish(Publish::new(&ns, &key, &m1)),
        Err(MetaError::MissingBlocks(1))
    ));
    assert!(matches!(
        meta.resolve(&ns, &key),
        Err(MetaError::NotFound(_))
    ));
    meta.blocks().put(&BlockHash::of(b"one"), b"one").unwrap();
    let v1 = meta.publish(Publish::new(&ns, &key, &m1)).unwrap();
    // Same content again is idempotent; different content needs force.
    assert_eq!(meta.publish(Publish::new(&ns, &key, &m1)).unwrap(), v1);
    let m2 = one_file(b"two");
    meta.blocks().put(&BlockHash::of(b"two"), b"two").unwrap();
    assert!(matches!(
        meta.publish(Publish::new(&ns, &key, &m2)),
        Err(MetaError::Exists(_))
    ));
    let v2 = meta
        .publish(Publish {
            force: true,
            ..Publish::new(&ns, &key, &m2)
        })
        .unwrap();
    assert_eq!(
        meta.resolve(&ns, &key).unwrap().record.version,
        v2.0.to_vec()
    );
    // Nothing can be published inside a file key, and a parent with keys below is no file.
    let inner = KeyPath::parse("a/b/c").unwrap();
    assert!(matches!(
        meta.publish(Publish::new(&ns, &inner, &m1)),
        Err(MetaError::NotDir(_))
    ));
    let parent = KeyPath::parse("a").unwrap();
    assert!(matches!(
        meta.publish(Publish {
            force: true,
            ..Publish::new(&ns, &parent, &m1)
        }),
        Err(MetaError::IsDir(_))
    ));
}

#[test]
fn expired_keys_disappear() {
    let (_d, meta, clock) = store_on(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    let key = KeyPath::parse("tmp").unwrap();
    meta.blocks().put(&BlockHash::of(b"x"), b"x").unwrap();
    meta.publish(Publish {
        ttl_secs: 1,
        ..Publish::new(&ns, &key, &one_file(b"x"))
    })
    .unwrap();
    assert_eq!(meta.list(&ns, None, false).unwrap().entries.len(), 1);
    clock.advance(Duration::from_millis(999));
    assert_eq!(meta.list(&ns, None, false).unwrap().entries.len(), 1);
    clock.advance(Duration::from_millis(1));
    assert!(meta.list(&ns, None, false).unwrap().entries.is_empty());
    assert!(matches!(
        meta.resolve(&ns, &key),
        Err(MetaError::NotFound(_))
    ));
}

const DEFAULT_TEST_LEASE: Duration = Duration::from_secs(10);

fn k(s: &str) -> KeyPath {
    KeyPath::parse(s).unwrap()
}

fn dir_entry(path: &str) -> FileEntry {
    FileEntry {
        path: path.into(),
        kind: EntryKind::Directory as i32,
        mode: 0o755,
        ..Default::default()
    }
}

fn names(meta: &MetaStore, ns: &Namespace, p: &str) -> Vec<String> {
    let prefix = KeyPath::parse_prefix(p).unwrap();
    meta.list(ns, prefix.as_ref(), false)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// A published directory `d` with `x/f` and `g` inside, blocks present.
fn published_dir(meta: &MetaStore, ns: &Namespace) {
    meta.blocks().put(&BlockHash::of(b"f"), b"f").unwrap();
    let mut f = one_file(b"f").entries.remove(0);
    f.path = "x/f".into();
    let mut g = f.clone();
    g.path = "g".into();
    let m = Manifest {
        block_size: 1024,
        entries: vec![dir_entry(""), g, dir_entry("x"), f],
    };
    meta.publish(Publish::new(ns, &k("d"), &m)).unwrap();
}

#[test]
fn keys_nest_inside_published_directories() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    published_dir(&meta, &ns);
    // A file written into the published directory becomes its own key and replaces the entry.
    meta.blocks().put(&BlockHash::of(b"new"), b"new").unwrap();
    meta.publish(Publish {
        force: true,
        ..Publish::new(&ns, &k("d/x/f"), &one_file(b"new"))
    })
    .unwrap();
    meta.publish(Publish::new(&ns, &k("d/x/h"), &one_file(b"new")))
        .unwrap();
    assert_eq!(names(&meta, &ns, "d/x"), ["f", "h"]);
    let r = meta.resolve(&ns, &k("d/x/f")).unwrap();
    assert_eq!(r.key, "d/x/f");
    assert_eq!(r.manifest.entries[0].size, 3);
    // Inside a file there is nothing.
    assert!(matches!(
        meta.publish(Publish::new(&ns, &k("d/g/z"), &one_file(b"new"))),
        Err(MetaError::NotDir(_))
    ));
    // Removing a path inside the directory rewrites its manifest; non-empty directories need -r.
    meta.remove(&ns, &k("d/g"), false, false).unwrap();
    assert_eq!(names(&meta, &ns, "d"), ["x/"]);
    assert!(matches!(
        meta.remove(&ns, &k("d/x"), false, false),
        Err(MetaError::NotEmpty(_))
    ));
    meta.remove(&ns, &k("d/x"), true, false).unwrap();
    assert!(names(&meta, &ns, "d").is_empty());
    assert!(meta
        .list(&ns, None, true)
        .unwrap()
        .entries
        .iter()
        .all(|e| !e.name.starts_with("d/x")));
}

#[test]
fn renames_move_keys_entries_and_subtrees() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    published_dir(&meta, &ns);
    // Inside one published directory: a manifest edit.
    meta.rename(&ns, &k("d/g"), &k("d/x/g2"), false).unwrap();
    assert_eq!(names(&meta, &ns, "d/x"), ["f", "g2"]);
    // Out of it: the subtree becomes a key of its own.
    meta.rename(&ns, &k("d/x"), &k("top"), false).unwrap();
    assert_eq!(names(&meta, &ns, "top"), ["f", "g2"]);
    assert!(names(&meta, &ns, "d").is_empty());
    // A directory of keys moves whole, and replaces an empty directory.
    meta.blocks().put(&BlockHash::of(b"y"), b"y").unwrap();
    meta.publish(Publish::new(&ns, &k("tmp/a/b"), &one_file(b"y")))
        .unwrap();
    meta.publish(Publish::new(&ns, &k("tmp/c"), &one_file(b"y")))
        .unwrap();
    meta.rename(&ns, &k("tmp"), &k("d"), false).unwrap();
    assert_eq!(names(&meta, &ns, "d"), ["a/", "c"]);
    assert_eq!(names(&meta, &ns, ""), ["d/", "top/"]);
    // A file replaces a file (lock-file renames); not a non-empty directory.
    meta.rename(&ns, &k("d/c"), &k("top/f"), false).unwrap();
    assert!(matches!(
        meta.rename(&ns, &k("top/f"), &k("d"), false),
        Err(MetaError::IsDir(_))
    ));
    assert!(matches!(
        meta.rename(&ns, &k("top"), &k("top/f/x"), false),
        Err(MetaError::BadRequest(_))
    ));
    assert!(matches!(
        meta.rename(&ns, &k("nope"), &k("x"), false),
        Err(MetaError::NotFound(_))
    ));
}

/// The size listed for `name` in the directory `dir`.
fn listed_size(meta: &MetaStore, ns: &Namespace, dir: &str, name: &str) -> u64 {
    let prefix = KeyPath::parse_prefix(dir).unwrap();
    let l = meta.list(ns, prefix.as_ref(), false).unwrap();
    let e = l.entries.iter().find(|e| e.name == name);
    e.unwrap_or_else(|| panic!("{dir}: no {name} in {:?}", l.entries))
        .size
}

#[test]
fn an_exchange_swaps_two_names_of_any_kinds_in_one_change() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    published_dir(&meta, &ns);
    meta.blocks().put(&BlockHash::of(b"top"), b"top").unwrap();
    meta.publish(Publish::new(&ns, &k("top"), &one_file(b"top")))
        .unwrap();
    // A path inside a published directory and a key of its own.
    meta.exchange(&ns, &k("d/g"), &k("top")).unwrap();
    assert_eq!(names(&meta, &ns, "d"), ["g", "x/"]);
    assert_eq!(listed_size(&meta, &ns, "d", "g"), 3);
    assert_eq!(listed_size(&meta, &ns, "", "top"), 1);
    // A directory and a file, each taking the other's place whole.
    meta.exchange(&ns, &k("d/x"), &k("top")).unwrap();
    assert_eq!(names(&meta, &ns, "top"), ["f"]);
    assert_eq!(listed_size(&meta, &ns, "d", "x"), 1);
    // Two directories of keys.
    meta.blocks().put(&BlockHash::of(b"y"), b"y").unwrap();
    for key in ["tmp/a/b", "tmp/c"] {
        meta.publish(Publish::new(&ns, &k(key), &one_file(b"y")))
            .unwrap();
    }
    meta.exchange(&ns, &k("tmp"), &k("d")).unwrap();
    assert_eq!(names(&meta, &ns, "d"), ["a/", "c"]);
    assert_eq!(names(&meta, &ns, "tmp"), ["g", "x"]);
    assert_eq!(names(&meta, &ns, ""), ["d/", "tmp/", "top/"]);
    // The name the swap passes through is never left behind.
    let all = meta.list(&ns, None, true).unwrap().entries;
    assert!(all.iter().all(|e| !e.name.contains('\0')), "{all:?}");
    // Both names must exist, and neither may hold the other.
    assert!(matches!(
        meta.exchange(&ns, &k("top"), &k("top/f")),
        Err(MetaError::BadRequest(_))
    ));
    assert!(matches!(
        meta.exchange(&ns, &k("nope"), &k("top")),
        Err(MetaError::NotFound(_))
    ));
    assert!(matches!(
        meta.exchange(&ns, &k("top"), &k("nope")),
        Err(MetaError::NotFound(_))
    ));
    assert_eq!(names(&meta, &ns, "top"), ["f"]);
}

#[test]
fn set_attr_rewrites_metadata_only() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    published_dir(&meta, &ns);
    let before = meta.resolve(&ns, &k("d/g")).unwrap();
    meta.set_attr(
        &ns,
        &k("d/g"),
        Some(0o600),
        Some((1_000, 5)),
        (Some(7), Some(8)),
    )
    .unwrap();
    let after = meta.resolve(&ns, &k("d/g")).unwrap();
    assert_eq!(after.manifest.entries[0].mode, 0o600);
    assert_eq!(after.manifest.entries[0].mtime_sec, 1_000);
    assert_eq!(
        (after.manifest.entries[0].uid, after.manifest.entries[0].gid),
        (Some(7), Some(8))
    );
    assert_eq!(
        after.manifest.entries[0].blocks,
        before.manifest.entries[0].blocks
    );
    meta.publish(Publish::new(&ns, &k("p/q"), &one_file(b"f")))
        .unwrap();
    meta.set_attr(&ns, &k("p"), Some(0o700), None, (Some(1000), None))
        .unwrap();
    let l = meta.list(&ns, None, false).unwrap().entries;
    let p = l.iter().find(|e| e.name == "p/").unwrap();
    assert_eq!(p.mode, 0o700);
    assert_eq!((p.uid, p.gid), (Some(1000), None));
    assert_eq!(names(&meta, &ns, "p"), ["q"]);
}

#[test]
fn large_blocks_are_files_that_survive_a_restart_and_a_lost_file_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let open = || open_in(dir.path(), DEFAULT_TEST_LEASE, &clock);
    let big = vec![3u8; MIN_FILE_BLOCK];
    let small = b"small".to_vec();
    let (hb, hs) = (BlockHash::of(&big), BlockHash::of(&small));
    let ns = Namespace::default();
    let key = KeyPath::parse("k").unwrap();
    {
        let meta = open();
        meta.blocks().put(&hb, &big).unwrap();
        meta.blocks().put(&hs, &small).unwrap();
        let mut m = one_file(&big);
        m.entries[0].blocks.push(BlockRef {
            hash: hs.0.to_vec(),
            len: small.len() as u32,
        });
        m.entries[0].size += small.len() as u64;
        m.block_size = MIN_FILE_BLOCK as u32;
        meta.publish(Publish::new(&ns, &key, &m)).unwrap();
        assert!(
            matches!(meta.blocks().get(&hb).unwrap(), Some(Served::File(_, n)) if n == big.len() as u64)
        );
        assert!(
            matches!(meta.blocks().get(&hs).unwrap(), Some(Served::Bytes(b)) if b[..] == small[..])
        );
    }
    let meta = open();
    assert_eq!(meta.blocks().missing(&[hb, hs]).unwrap(), vec![]);
    let Some(Served::File(f, _)) = meta.blocks().get(&hb).unwrap() else {
        panic!("the large block is not a file after a restart");
    };
    let mut read = Vec::new();
    std::io::Read::read_to_end(&mut &f, &mut read).unwrap();
    assert!(read == big);

    // A block file lost under the store is missing, so that the next put uploads it again.
    let hex = hb.hex();
    std::fs::remove_file(dir.path().join("blocks").join(&hex[..2]).join(&hex)).unwrap();
    assert_eq!(meta.blocks().missing(&[hb, hs]).unwrap(), vec![hb]);
    assert!(meta.blocks().get(&hb).unwrap().is_none());
    meta.blocks().put(&hb, &big).unwrap();
    assert!(meta.blocks().missing(&[hb]).unwrap().is_empty());
}

fn gpu_key(node: &str, registration: u64) -> crate::proto::GpuKey {
    let json = r#"{"entries": [{"name": "w", "dtype": "float32", "shape": [4, 4]}]}"#;
    let table = crate::gpu::table::Table::parse(json.as_bytes()).unwrap();
    crate::proto::GpuKey {
        table_json: json.into(),
        table_digest: table.digest().0.to_vec(),
        publisher_node: node.into(),
        registration,
        ..Default::default()
    }
}

#[test]
fn gpu_keys_share_the_namespace_with_files_and_live_with_their_holder() {
    let (_d, meta, clock) = store_on(Duration::from_secs(10));
    meta.register_node(NodeInfo {
        node_id: "gpu-node".into(),
        data_addr: "127.0.0.1:1".into(),
        zone: String::new(),
    });
    let ns = Namespace::default();
    meta.publish_gpu(&ns, &k("model/layer1"), gpu_key("gpu-node", 7))
        .unwrap();
    // Listed with its publishing node as its locale and its table's size.
    let l = meta.list(&ns, Some(&k("model")), false).unwrap().entries;
    assert_eq!(l.len(), 1);
    assert_eq!(
        (
            l[0].name.as_str(),
            l[0].kind(),
            l[0].locale(),
            l[0].origin_node.as_str(),
            l[0].size
        ),
        ("layer1", EntryKind::Gpu, Locale::Local, "gpu-node", 64)
    );
    let r = meta.resolve(&ns, &k("model/layer1")).unwrap();
    assert_eq!(r.record.gpu.unwrap().registration, 7);

    // A file never takes a GPU key's name, even forced; another registration neither.
    meta.blocks().put(&BlockHash::of(b"f"), b"f").unwrap();
    assert!(matches!(
        meta.publish(Publish {
            force: true,
            ..Publish::new(&ns, &k("model/layer1"), &one_file(b"f"))
        }),
        Err(MetaError::Exists(_))
    ));
    assert!(matches!(
        meta.publish_gpu(&ns, &k("model/layer1"), gpu_key("gpu-node", 8)),
        Err(MetaError::Exists(_))
    ));
    meta.publish_gpu(&ns, &k("model/layer1"), gpu_key("gpu-node", 7))
        .unwrap();
    // Nor a GPU key a file's, or a directory's.
    meta.publish(Publish::new(&ns, &k("files/f"), &one_file(b"f")))
        .unwrap();
    assert!(matches!(
        meta.publish_gpu(&ns, &k("files/f"), gpu_key("gpu-node", 9)),
        Err(MetaError::Exists(_))
    ));
    assert!(matches!(
        meta.publish_gpu(&ns, &k("files"), gpu_key("gpu-node", 9)),
        Err(MetaError::IsDir(_))
    ));
    assert!(matches!(
        meta.rename(&ns, &k("model/layer1"), &k("model/moved"), false),
        Err(MetaError::BadRequest(_))
    ));
    let mut lying = gpu_key("gpu-node", 9);
    lying.table_digest = vec![0; 32];
    assert!(matches!(
        meta.publish_gpu(&ns, &k("model/other"), lying),
        Err(MetaError::BadRequest(_))
    ));

    // Only the registration that published it lets it go.
    assert!(!meta.remove_gpu(&ns, &k("model/layer1"), 8).unwrap());
    assert!(meta.resolve(&ns, &k("model/layer1")).is_ok());
    assert!(meta.remove_gpu(&ns, &k("model/layer1"), 7).unwrap());
    assert!(matches!(
        meta.resolve(&ns, &k("model/layer1")),
        Err(MetaError::NotFound(_))
    ));

    // A GPU key is there only while its holder's lease is.
    meta.publish_gpu(&ns, &k("model/layer2"), gpu_key("gpu-node", 10))
        .unwrap();
    clock.advance(Duration::from_secs(11));
    assert!(matches!(
        meta.resolve(&ns, &k("model/layer2")),
        Err(MetaError::NotFound(_))
    ));
    assert!(meta.list(&ns, Some(&k("files")), false).unwrap().exists);
}

#[test]
fn paths_keep_times_of_their_own_that_move_with_them_and_go_with_them() {
    let (_d, meta, clock) = store_on(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    meta.blocks().put(&BlockHash::of(b"f"), b"f").unwrap();
    let entry = |prefix: &str, name: &str| {
        let p = KeyPath::parse_prefix(prefix).unwrap();
        meta.list(&ns, p.as_ref(), false)
            .unwrap()
            .entries
            .into_iter()
            .find(|e| e.name.trim_end_matches('/') == name)
            .unwrap_or_else(|| panic!("{name} not listed in {prefix:?}"))
    };
    let times = |e: &ListEntry| ((e.mtime_sec, e.mtime_nsec), (e.ctime_sec, e.ctime_nsec));
    let root = || meta.list_dir_only(&ns, None).unwrap().dir.unwrap();
    let now = || crate::clock::Clock::now(&clock).unix();
    let tick = || clock.advance(Duration::from_millis(1500));

    // A key brings its parents into being, as mkdir -p would, and stamps the root.
    tick();
    let t1 = now();
    meta.publish(Publish::new(&ns, &k("a/b/c"), &one_file(b"f")))
        .unwrap();
    for (dir, name) in [("", "a"), ("a", "b")] {
        assert_eq!(times(&entry(dir, name)), (t1, t1), "{name}");
    }
    assert_eq!(times(&root()), (t1, t1));
    // chmod: the ctime alone; a directory's mtime set by hand is its own.
    tick();
    let t2 = now();
    meta.set_attr(&ns, &k("a/b/c"), Some(0o600), None, (None, None))
        .unwrap();
    let c = entry("a/b", "c");
    assert_eq!((c.ctime_sec, c.ctime_nsec), t2);
    assert_eq!(times(&entry("a", "b")), (t1, t1), "a chmod of c moved b");
    meta.set_attr(&ns, &k("a/b"), None, Some((86_400, 7)), (None, None))
        .unwrap();
    assert_eq!(times(&entry("a", "b")), ((86_400, 7), t2));

    // A rename carries a subtree's times, stamps the moved entry and both directories.
    tick();
    let t3 = now();
    meta.rename(&ns, &k("a/b"), &k("z"), false).unwrap();
    assert_eq!(times(&entry("", "z")), ((86_400, 7), t3));
    assert_eq!(
        entry("z", "c").ctime_sec,
        t2.0,
        "c's own ctime moved with it"
    );
    assert_eq!(times(&root()), (t3, t3));
    assert!(
        KeyPath::parse_prefix("a").map(|p| meta.list(&ns, p.as_ref(), false).unwrap().exists)
            == Ok(false),
        "a vanished with its last key"
    );

    // Removed and made again, a path starts afresh: nothing of what it was comes back.
    tick();
    let t4 = now();
    meta.remove(&ns, &k("z/c"), false, false).unwrap();
    meta.publish(Publish::new(&ns, &k("z/c"), &one_file(b"f")))
        .unwrap();
    assert_eq!(times(&entry("", "z")), (t4, t4));
    let c = entry("z", "c");
    assert_eq!((c.ctime_sec, c.ctime_nsec), t4);
    assert_eq!(c.mode, 0, "the old chmod came back");
    assert!(meta
        .attr_paths_below(View::Stored, &ns, "a")
        .unwrap()
        .is_empty());
}

#[test]
fn a_publish_stamps_the_writers_last_change_never_a_time_past_the_servers_clock() {
    let (_d, meta, clock) = store_on(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    meta.blocks().put(&BlockHash::of(b"f"), b"f").unwrap();
    let ctime = |key: &str| {
        let e = meta.list_dir_only(&ns, Some(&k(key))).unwrap().dir.unwrap();
        (e.ctime_sec, e.ctime_nsec)
    };
    let now = || crate::clock::Clock::now(&clock).unix();
    let written = now();
    clock.advance(Duration::from_millis(1500));
    let publish = |key: &str, changed| {
        meta.publish(Publish {
            changed,
            ..Publish::new(&ns, &k(key), &one_file(b"f"))
        })
        .unwrap();
    };
    publish("written", Some(written));
    assert_eq!(
        ctime("written"),
        written,
        "the close's time, not the write's"
    );
    publish("ahead", Some((now().0 + 3600, 0)));
    assert_eq!(
        ctime("ahead"),
        now(),
        "a writer's clock ahead of the server's"
    );
    publish("told-nothing", None);
    assert_eq!(ctime("told-nothing"), now());
}

#[test]
fn hard_links_are_names_of_one_inode_record() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    for d in [&b"one"[..], b"two"] {
        meta.blocks().put(&BlockHash::of(d), d).unwrap();
    }
    let put = |key: &str, data: &[u8]| {
        meta.publish(Publish {
            force: true,
            ..Publish::new(&ns, &k(key), &one_file(data))
        })
        .unwrap()
    };
    let listed = |name: &str| {
        meta.list(&ns, None, true)
            .unwrap()
            .entries
            .into_iter()
            .find(|e| e.name == name)
    };
    put("f", b"one");
    meta.link(&ns, &k("f"), &k("d/g")).unwrap();
    for name in ["f", "d/g"] {
        assert_eq!(listed(name).unwrap().nlink, 2, "{name}");
    }
    // A write through one name is what the other reads; so is a chmod.
    let v2 = put("d/g", b"two");
    assert_eq!(meta.resolve(&ns, &k("f")).unwrap().record.version, v2.0);
    meta.set_attr(&ns, &k("f"), Some(0o600), None, (None, None))
        .unwrap();
    let (f, g) = (listed("f").unwrap(), listed("d/g").unwrap());
    assert_eq!((f.mode, g.mode), (0o600, 0o600));
    assert_eq!((f.ctime_sec, f.ctime_nsec), (g.ctime_sec, g.ctime_nsec));
    // Names move as they are; neither the name taken nor a directory may be linked.
    meta.rename(&ns, &k("d/g"), &k("h"), false).unwrap();
    assert!(matches!(
        meta.link(&ns, &k("h"), &k("f")),
        Err(MetaError::Exists(_))
    ));
    assert!(matches!(
        meta.link(&ns, &k("d"), &k("d2")),
        Err(MetaError::IsDir(_)) | Err(MetaError::NotFound(_))
    ));
    // Unlinking one name keeps the other; the last takes the inode with it.
    meta.remove(&ns, &k("f"), false, false).unwrap();
    let h = listed("h").unwrap();
    assert_eq!((h.nlink, h.mode), (1, 0o600));
    let blocks = |key: &str| {
        meta.resolve(&ns, &k(key)).unwrap().manifest.entries[0]
            .blocks
            .clone()
    };
    assert_eq!(blocks("h"), one_file(b"two").entries[0].blocks);
    meta.remove(&ns, &k("h"), false, false).unwrap();
    assert!(meta
        .backend
        .scan_prefix(Table::Inodes, &key_bytes(&ns, ""))
        .unwrap()
        .is_empty());
    // A file inside a published directory is linked too: it becomes a key of its own.
    published_dir(&meta, &ns);
    meta.link(&ns, &k("d/g"), &k("g2")).unwrap();
    assert_eq!(listed("g2").unwrap().nlink, 2);
    assert_eq!(names(&meta, &ns, "d"), ["g", "x/"]);
}

/// A one-block file of any block size.
pub(super) fn one_block(data: &[u8]) -> Manifest {
    Manifest {
        block_size: crate::manifest::MAX_BLOCK_SIZE,
        ..one_file(data)
    }
}

/// With namespaces told apart, a namespace names only blocks it references: another's block
/// is missing to it until it uploads the bytes itself (kept once); collection forgets the
/// references no live key of a namespace needs, and a store without them rebuilds them.
#[test]
fn a_namespace_names_only_the_blocks_it_references() {
    let (_d, meta, _clock) = store_on(DEFAULT_TEST_LEASE);
    let rebuilt = meta.separate_namespaces(true).unwrap();
    assert_eq!(rebuilt.map(|r| (r.keys, r.references)), Some((0, 0)));
    let (a, b) = (
        Namespace::parse("team-a").unwrap(),
        Namespace::parse("team-b").unwrap(),
    );
    let (sa, sb) = (meta.scope_of(&a).unwrap(), meta.scope_of(&b).unwrap());
    let data = vec![7u8; MIN_FILE_BLOCK + 1];
    let h = BlockHash::of(&data);
    meta.blocks().put_for(&[sa], &h, &data).unwrap();
    meta.publish(Publish::new(&a, &k("w"), &one_block(&data)))
        .unwrap();
    assert!(meta
        .blocks()
        .missing_for(Some(&sa), &[h])
        .unwrap()
        .is_empty());
    assert_eq!(meta.blocks().missing_for(Some(&sb), &[h]).unwrap(), [h]);
    assert!(matches!(
        meta.publish(Publish::new(&b, &k("w"), &one_block(&data))),
        Err(MetaError::MissingBlocks(1))
    ));
    // Uploaded by b too, it is b's as well; the store holds one copy.
    meta.blocks().put_for(&[sb], &h, &data).unwrap();
    meta.publish(Publish::new(&b, &k("w"), &one_block(&data)))
        .unwrap();
    let mut held = 0;
    meta.blocks().for_each_block(|_| held += 1).unwrap();
    assert_eq!(held, 1);

    // a's key goes: a's reference goes with collection, b's and the block stay.
    meta.collect_garbage().unwrap();
    meta.remove(&a, &k("w"), false, false).unwrap();
    let taken: usize = (0..2)
        .map(|_| meta.collect_garbage().unwrap())
        .map(|r| {
            assert_eq!(r.blocks, 0, "{r:?}");
            r.references
        })
        .sum();
    assert_eq!(taken, 1);
    assert_eq!(meta.blocks().missing_for(Some(&sa), &[h]).unwrap(), [h]);
    assert!(meta
        .blocks()
        .missing_for(Some(&sb), &[h])
        .unwrap()
        .is_empty());

    // A store run without namespaces told apart forgets them; told apart again, it rebuilds
    // them from the keys: b's key, not a's removed one.
    assert_eq!(meta.separate_namespaces(false).unwrap(), None);
    assert!(meta.blocks().missing_for(None, &[h]).unwrap().is_empty());
    let rebuilt = meta.separate_namespaces(true).unwrap().unwrap();
    assert_eq!((rebuilt.keys, rebuilt.references), (1, 1));
    assert!(meta
        .blocks()
        .missing_for(Some(&sb), &[h])
        .unwrap()
        .is_empty());
    assert_eq!(meta.blocks().missing_for(Some(&sa), &[h]).unwrap(), [h]);
    // Started again with them complete, nothing is rebuilt.
    assert_eq!(meta.separate_namespaces(true).unwrap(), None);
}

#[test]
fn collection_takes_what_no_key_names_and_keeps_what_was_touched_lately() {
    let (_d, meta, clock) = store_on(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    let big = |b: u8| vec![b; MIN_FILE_BLOCK + 1];
    let (kept, gone, fresh, expiring) = (big(1), big(2), big(3), b"soon".to_vec());
    for d in [&kept, &gone, &expiring] {
        meta.blocks().put(&BlockHash::of(d), d).unwrap();
    }
    // The first pass only starts the record of what is touched: it knows nothing of uploads
    // in flight before it, and deletes nothing.
    assert_eq!(meta.collect_garbage().unwrap(), gc::GcReport::default());
    meta.publish(Publish::new(&ns, &k("kept"), &one_block(&kept)))
        .unwrap();
    meta.publish(Publish::new(&ns, &k("gone"), &one_block(&gone)))
        .unwrap();
    meta.publish(Publish {
        ttl_secs: 1,
        ..Publish::new(&ns, &k("ttl"), &one_block(&expiring))
    })
    .unwrap();
    let gone_version = meta.resolve(&ns, &k("gone")).unwrap().record.version;
    meta.remove(&ns, &k("gone"), false, false).unwrap();
    clock.advance(Duration::from_secs(2));
    // An upload whose publish has not come yet.
    meta.blocks().put(&BlockHash::of(&fresh), &fresh).unwrap();

    // Touched since the start of the pass before: kept, but for the expired key's record,
    // which no one may touch any more.
    let r = meta.collect_garbage().unwrap();
    assert_eq!((r.blocks, r.manifests, r.expired_keys), (0, 0, 1), "{r:?}");
    // (Asking whether the store holds a block counts as touching it: `get` does not.)
    assert!(meta.blocks().get(&BlockHash::of(&gone)).unwrap().is_some());
    // Then what no key names goes, the expired key with it; the live key's block stays.
    let r = meta.collect_garbage().unwrap();
    assert_eq!(r.blocks, 3, "{r:?}");
    assert_eq!(r.block_bytes, (2 * (MIN_FILE_BLOCK + 1) + 4) as u64);
    assert_eq!(r.manifests, 2, "{r:?}");
    for d in [&gone, &fresh, &expiring] {
        assert!(!meta.blocks().contains(&BlockHash::of(d)).unwrap());
    }
    assert!(meta.manifest(View::Stored, &gone_version).is_err());
    let found = meta.resolve(&ns, &k("kept")).unwrap();
    assert!(matches!(
        meta.blocks().get(&BlockHash::of(&kept)).unwrap(),
        Some(Served::File(..))
    ));
    assert!(meta.manifest(View::Stored, &found.record.version).is_ok());
    assert_eq!(meta.collect_garbage().unwrap(), gc::GcReport::default());

    // A publish that needs a collected block is told it is missing, and works once it is back.
    assert!(matches!(
        meta.publish(Publish::new(&ns, &k("again"), &one_block(&gone))),
        Err(MetaError::MissingBlocks(1))
    ));
    meta.blocks().put(&BlockHash::of(&gone), &gone).unwrap();
    meta.publish(Publish::new(&ns, &k("again"), &one_block(&gone)))
        .unwrap();
}

#[test]
fn collection_takes_block_files_a_crash_left_without_an_index_entry() {
    let (d, meta) = store(DEFAULT_TEST_LEASE);
    let orphan = vec![7u8; MIN_FILE_BLOCK];
    let h = BlockHash::of(&orphan);
    // A file written by an earlier run, whose index entry never became durable.
    let files = BlockFiles::open(&d.path().join("blocks")).unwrap();
    files.write(&h, &orphan).unwrap();
    files.sync().unwrap();
    assert!(!meta.blocks().contains(&h).unwrap());
    meta.collect_garbage().unwrap();
    let r = meta.collect_garbage().unwrap();
    assert_eq!(r.orphan_files, 1, "{r:?}");
    assert!(files.list().unwrap().is_empty());
}

#[test]
fn an_unreadable_key_record_stops_collection_before_anything_goes() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let data = vec![9u8; MIN_FILE_BLOCK + 1];
    meta.collect_garbage().unwrap();
    meta.blocks().put(&BlockHash::of(&data), &data).unwrap();
    meta.collect_garbage().unwrap();
    // A record that does not decode may name any version: its blocks must not go.
    let ns = Namespace::default();
    meta.backend
        .write(vec![backend::Op::Put(
            Table::Keys,
            key_bytes(&ns, "bad"),
            vec![0xff; 7],
        )])
        .unwrap();
    assert!(matches!(meta.collect_garbage(), Err(MetaError::Corrupt(_))));
    assert!(meta.blocks().get(&BlockHash::of(&data)).unwrap().is_some());
}

/// A publish made by patching the key's current version looks up only the blocks the patch
/// brings: the base's were checked when it was published (here one of them is gone from the
/// store's index, and only a block of the patch counts as missing).
#[test]
fn a_patched_publish_checks_only_the_blocks_its_base_did_not_hold() {
    let (_d, meta) = store(DEFAULT_TEST_LEASE);
    let ns = Namespace::default();
    let key = KeyPath::parse("tree").unwrap();
    let old = b"old".to_vec();
    meta.blocks().put(&BlockHash::of(&old), &old).unwrap();
    let base = one_file(&old);
    meta.publish(Publish::new(&ns, &key, &base)).unwrap();
    meta.blocks().remove(&BlockHash::of(&old)).unwrap();
    let with = |data: &[u8]| {
        let mut m = base.clone();
        let mut e = one_file(data).entries.remove(0);
        e.path = "new".into();
        m.entries[0].path = "old".into();
        m.entries.insert(0, e);
        m.entries.insert(
            0,
            FileEntry {
                kind: EntryKind::Directory as i32,
                ..Default::default()
            },
        );
        m
    };
    // A block the patch brings that the store lacks is missing, and the base's is not counted.
    match meta.publish(Publish {
        base: Some(&base),
        force: true,
        ..Publish::new(&ns, &key, &with(b"absent"))
    }) {
        Err(MetaError::MissingBlocks(1)) => {}
        other => panic!("{:?}", other.map(|v| v.hex())),
    }
    let new = b"new".to_vec();
    meta.blocks().put(&BlockHash::of(&new), &new).unwrap();
    meta.publish(Publish {
        base: Some(&base),
        force: true,
        ..Publish::new(&ns, &key, &with(&new))
    })
    .unwrap();
    // Without a base every block is looked up.
    assert!(matches!(
        meta.publish(Publish {
            force: true,
            ..Publish::new(&ns, &key, &with(&new))
        }),
        Err(MetaError::MissingBlocks(1))
    ));
}

/// A backend that counts the reads made of it.
struct Counting {
    inner: Db,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl Counting {
    fn read(&self) {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl MetaBackend for Counting {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        self.read();
        MetaBackend::get(&self.inner, table, key)
    }
    fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
    ) -> Result<Vec<backend::KeyValue>, BackendError> {
        self.read();
        MetaBackend::scan_prefix(&self.inner, table, prefix)
    }
    fn for_each(&self, table: Table, f: &mut backend::Visit<'_>) -> Result<(), BackendError> {
        self.read();
        MetaBackend::for_each(&self.inner, table, f)
    }
    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> backend::Step,
    ) -> Result<(), BackendError> {
        self.read();
        MetaBackend::walk_from(&self.inner, table, prefix, span, f)
    }
    fn write(&self, ops: Vec<backend::Op>) -> Result<(), BackendError> {
        MetaBackend::write(&self.inner, ops)
    }
    fn write_synced(&self, ops: Vec<backend::Op>) -> Result<(), BackendError> {
        MetaBackend::write_synced(&self.inner, ops)
    }
    fn flush(&self) -> Result<(), BackendError> {
        MetaBackend::flush(&self.inner)
    }
}

/// A store over a backend that counts its reads, and the count.
fn counting_store() -> (
    tempfile::TempDir,
    MetaStore,
    Arc<std::sync::atomic::AtomicU64>,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.path().join("db"), &families, &[CF_BLOCKS]).unwrap();
    let files = BlockFiles::open(&dir.path().join("blocks")).unwrap();
    let blocks = Arc::new(StoreBlocks::new(db.clone(), files));
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let backend = Counting {
        inner: db,
        reads: reads.clone(),
    };
    let clock = ManualClock::default();
    let meta = MetaStore::new(backend, blocks, Duration::from_secs(30), clock.shared());
    (dir, meta, reads)
}

/// A new key brings its parents into being, and the reads its publish makes of the backend grow
/// in proportion to its depth: asking each parent where it lies read every record above it
/// again (quadratic: 8,000 one-letter segments took 117 s under the write lock). Past
/// `MAX_DEPTH` segments a key is refused before it reaches the store.
#[test]
fn a_deep_key_costs_reads_in_proportion_to_its_depth() {
    let (_dir, meta, reads) = counting_store();
    meta.register_node(NodeInfo {
        node_id: "n1".into(),
        ..Default::default()
    });
    let ns = Namespace::parse("default").unwrap();
    let m = one_file(b"deep");
    let cost = |depth: usize| {
        let key = format!("d{depth}/{}f", "a/".repeat(depth - 2));
        let key = KeyPath::parse(&key).unwrap();
        assert_eq!(key.segments().count(), depth);
        let before = reads.load(std::sync::atomic::Ordering::Relaxed);
        meta.publish(Publish {
            locale: Locale::Local,
            origin: "n1",
            ..Publish::new(&ns, &key, &m)
        })
        .unwrap();
        reads.load(std::sync::atomic::Ordering::Relaxed) - before
    };
    let (c64, c256) = (cost(64), cost(crate::key::MAX_DEPTH));
    // In proportion: about 4x for 4x the depth; asked again per parent it was about 16x.
    assert!(c256 <= 5 * c64, "64 segments: {c64} reads; 256: {c256}");
    let deeper = format!("{}f", "a/".repeat(crate::key::MAX_DEPTH));
    assert_eq!(KeyPath::parse(&deeper), Err(crate::key::KeyError::TooDeep));
}

/// On etcd each read is a round trip: a batch of publishes into one directory reads the
/// directory once, not once each, as the planner remembers what it read (11 reads a publish
/// before, 5 now: the new key, its attributes, and walks below it and its directory). What a
/// stored batch wrote is read again.
#[test]
fn the_planner_remembers_its_reads_until_a_stored_change_changes_them() {
    let (_dir, meta, reads) = counting_store();
    for b in [&b"x"[..], b"y"] {
        meta.blocks().put(&BlockHash::of(b), b).unwrap();
    }
    let ns = Namespace::default();
    meta.publish(Publish::new(&ns, &k("big/k0"), &one_file(b"x")))
        .unwrap();
    let before = reads.load(std::sync::atomic::Ordering::Relaxed);
    for i in 1..=20 {
        meta.publish(Publish::new(&ns, &k(&format!("big/k{i}")), &one_file(b"x")))
            .unwrap();
    }
    let each = (reads.load(std::sync::atomic::Ordering::Relaxed) - before) / 20;
    assert!(each <= 6, "{each} reads a publish into one directory");

    // Stored, a key is what the next plan sees: another version without force is refused,
    // and once removed the key is free again.
    assert!(matches!(
        meta.publish(Publish::new(&ns, &k("big/k3"), &one_file(b"y"))),
        Err(MetaError::Exists(_))
    ));
    meta.remove(&ns, &k("big/k3"), false, false).unwrap();
    meta.publish(Publish::new(&ns, &k("big/k3"), &one_file(b"y")))
        .unwrap();
}
