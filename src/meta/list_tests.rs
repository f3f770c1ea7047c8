//! Listings in pages: every page boundary gives back the whole listing, once, in order.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::blocks::files::BlockFiles;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::clock::ManualClock;
use crate::db::Db;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{BlockRef, EntryKind, FileEntry, Manifest};
use crate::proto::ListResponse;

fn k(s: &str) -> KeyPath {
    KeyPath::parse(s).unwrap()
}

fn file(path: &str) -> FileEntry {
    FileEntry {
        path: path.into(),
        kind: EntryKind::File as i32,
        size: 1,
        blocks: vec![BlockRef {
            hash: BlockHash::of(b"y").0.to_vec(),
            len: 1,
        }],
        ..Default::default()
    }
}

fn dir(path: &str) -> FileEntry {
    FileEntry {
        path: path.into(),
        kind: EntryKind::Directory as i32,
        mode: 0o755,
        ..Default::default()
    }
}

/// A namespace whose names put a directory's keys after names that sort after the directory
/// ("d.a", "d-b" and "d a" before "d/x" in key order, though "d" comes first by name), with a
/// published tree ("t", listed as "t/") beside "t.x", keys inside that tree, and attributes
/// of paths that are no keys.
fn tricky() -> (tempfile::TempDir, MetaStore, Namespace) {
    let dir_ = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let mut families = FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir_.path().join("db"), &families, &[CF_BLOCKS]).unwrap();
    let files = BlockFiles::open(&dir_.path().join("blocks")).unwrap();
    let blocks = Arc::new(StoreBlocks::new(db.clone(), files));
    let meta = MetaStore::new(db, blocks, Duration::from_secs(30), clock.shared());
    meta.blocks().put(&BlockHash::of(b"y"), b"y").unwrap();
    let ns = Namespace::default();
    let one = Manifest {
        block_size: 1024,
        entries: vec![file("")],
    };
    for key in [
        "d/x", "d/y/z", "d.a", "d-b", "d a", "d.a.b/z", "d.a.c", "dd", "e", "t.x", "u/v/w",
    ] {
        meta.publish(Publish::new(&ns, &k(key), &one)).unwrap();
    }
    let tree = Manifest {
        block_size: 1024,
        entries: vec![dir(""), file("f"), dir("s"), file("s.h"), file("s/g")],
    };
    meta.publish(Publish::new(&ns, &k("t"), &tree)).unwrap();
    meta.publish(Publish::new(&ns, &k("t/s/k"), &one)).unwrap();
    meta.publish(Publish::new(&ns, &k("t/n"), &one)).unwrap();
    for path in ["d", "d.a.b", "u/v"] {
        meta.set_attr(&ns, &k(path), Some(0o700), None, (Some(7), None))
            .unwrap();
    }
    (dir_, meta, ns)
}

/// The listing read page by page, `limit` entries a page at most.
fn by_pages(
    meta: &MetaStore,
    ns: &Namespace,
    prefix: Option<&KeyPath>,
    recursive: bool,
    limit: usize,
) -> ListResponse {
    let mut after = String::new();
    let mut all: Option<ListResponse> = None;
    loop {
        let page = Page {
            after: &after,
            limit,
            max_bytes: usize::MAX,
        };
        let l = meta.list_page(ns, prefix, recursive, page).unwrap();
        assert!(l.entries.len() <= limit, "a page of {limit} held more");
        assert!(l.next.is_empty() || l.next.as_str() > after.as_str());
        after = l.next.clone();
        match all.as_mut() {
            None => all = Some(l),
            Some(a) => a.entries.extend(l.entries),
        }
        if after.is_empty() {
            return all.unwrap();
        }
    }
}

#[test]
fn every_page_boundary_gives_the_whole_listing_once_in_order() {
    let (_d, meta, ns) = tricky();
    let top = meta.list(&ns, None, false).unwrap();
    let names: Vec<&str> = top.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["d/", "d a", "d-b", "d.a", "d.a.b/", "d.a.c", "dd", "e", "t/", "t.x", "u/"]
    );
    assert_eq!(
        top.entries[0].mode, 0o700,
        "the attributes of a directory of keys"
    );
    assert!(top.next.is_empty());
    for prefix in [
        None,
        Some(k("t")),
        Some(k("t/s")),
        Some(k("d")),
        Some(k("u")),
        Some(k("e")),
    ] {
        for recursive in [false, true] {
            let whole = meta.list(&ns, prefix.as_ref(), recursive).unwrap();
            for limit in 1..=whole.entries.len() + 1 {
                let paged = by_pages(&meta, &ns, prefix.as_ref(), recursive, limit);
                assert_eq!(
                    paged.entries, whole.entries,
                    "{prefix:?} recursive {recursive} in pages of {limit}"
                );
                assert_eq!((paged.exists, &paged.dir), (whole.exists, &whole.dir));
            }
        }
    }
}

#[test]
fn a_page_stays_within_its_bytes_and_holds_at_least_one_entry() {
    let (_d, meta, ns) = tricky();
    let whole = meta.list(&ns, None, true).unwrap();
    let mut after = String::new();
    let mut seen = Vec::new();
    loop {
        let l = meta
            .list_page(
                &ns,
                None,
                true,
                Page {
                    after: &after,
                    limit: 1000,
                    max_bytes: 1,
                },
            )
            .unwrap();
        assert_eq!(
            l.entries.len(),
            1,
            "one entry a page when one is over the bytes"
        );
        seen.extend(l.entries);
        if l.next.is_empty() {
            break;
        }
        after = l.next;
    }
    assert_eq!(seen, whole.entries);
}
