//! Manifests from anyone: decoded and validated as a server or a getter does before writing a
//! byte from one.

use std::collections::{HashMap, HashSet};

use prost::Message;

use ktfs::key::{MAX_KEY, MAX_SEGMENT};
use ktfs::manifest::{self, EntryKind, Manifest, MAX_BLOCK_SIZE};

/// Any bytes as an encoded manifest: `manifest::decode` agrees with decoding then validating,
/// and what validates keeps every promise readers rely on, as do its subtrees.
pub fn manifest(input: &[u8]) {
    let Ok(m) = Manifest::decode(input) else {
        assert!(
            manifest::decode(input).is_err(),
            "undecodable bytes accepted"
        );
        return;
    };
    let valid = manifest::validate(&m).is_ok();
    assert_eq!(
        manifest::decode(input).is_ok(),
        valid,
        "decode and validate disagree"
    );
    if !valid {
        return;
    }
    holds(&m);
    // The encoding is the version's identity: it must survive a round trip.
    let again = Manifest::decode(&m.encode_to_vec()[..]).expect("a manifest's own encoding");
    assert_eq!(again, m, "round trip changed the manifest");
    assert_eq!(manifest::version_of(&again), manifest::version_of(&m));
    for e in &m.entries {
        let sub = manifest::subtree(&m, &e.path).expect("an entry's own path has a subtree");
        assert!(
            manifest::validate(&sub).is_ok(),
            "the subtree at {:?} is refused: {:?}",
            e.path,
            manifest::validate(&sub)
        );
        holds(&sub);
        assert_eq!(
            sub.entries[0].kind, e.kind,
            "the subtree's root changed kind"
        );
    }
    assert!(manifest::subtree(&m, "no/such/entry/\u{0}").is_none());
}

/// What every reader of an accepted manifest relies on (the model in `tests/hostile.rs`, and
/// more).
fn holds(m: &Manifest) {
    assert!(m.block_size > 0 && m.block_size <= MAX_BLOCK_SIZE);
    assert!(!m.entries.is_empty());
    assert!(m.entries[0].path.is_empty(), "the root is not first");
    let mut dirs = HashSet::new();
    let mut lens: HashMap<&[u8], u32> = HashMap::new();
    let mut prev: Option<&str> = None;
    let mut total = 0u64;
    for e in &m.entries {
        if let Some(p) = prev {
            assert!(p < e.path.as_str(), "unsorted at {:?}", e.path);
        }
        prev = Some(&e.path);
        if !e.path.is_empty() {
            assert!(e.path.len() <= MAX_KEY);
            for seg in e.path.split('/') {
                assert!(
                    !seg.is_empty()
                        && seg != "."
                        && seg != ".."
                        && seg.len() <= MAX_SEGMENT
                        && !seg.contains('\0'),
                    "a path that escapes or breaks: {:?}",
                    e.path
                );
            }
            let parent = e.path.rfind('/').map_or("", |i| &e.path[..i]);
            assert!(
                dirs.contains(parent),
                "{:?} has no directory above it",
                e.path
            );
        }
        match e.kind() {
            EntryKind::Directory => {
                dirs.insert(e.path.as_str());
            }
            EntryKind::File => {
                let mut sum = 0u64;
                for b in &e.blocks {
                    assert!(b.len > 0 && b.len <= m.block_size && b.hash.len() == 32);
                    let first = *lens.entry(&b.hash[..]).or_insert(b.len);
                    assert_eq!(first, b.len, "one block with two lengths");
                    sum = sum.checked_add(u64::from(b.len)).expect("sizes overflow");
                }
                assert_eq!(sum, e.size, "{:?}: blocks do not add up", e.path);
                total = total.checked_add(e.size).expect("sizes overflow");
            }
            k => {
                assert!(e.blocks.is_empty(), "a {k:?} with blocks");
                if manifest::is_special(k) {
                    assert_eq!(e.size, 0, "a {k:?} with a size");
                }
            }
        }
    }
    if m.entries.len() > 1 {
        assert!(
            manifest::is_directory(m),
            "many entries but no directory root"
        );
    }
    assert_eq!(manifest::total_size(m), total);
    let files = m.entries.iter().filter(|e| e.kind() == EntryKind::File);
    assert_eq!(manifest::file_count(m), files.count() as u64);
}
