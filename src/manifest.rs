//! Manifests: the immutable description of one version of an entry.
//!
//! A manifest lists, for each file, its relative path, mode, size, mtime and blocks, and for each
//! symlink its target. Its version id is the blake3 of its encoding, so two publications of the
//! same bytes with the same metadata are the same version. Manifests that come from the network
//! are checked by [`validate`] before a single byte is written from them: paths stay below the
//! destination, sizes match their blocks.

use prost::Message;

use crate::hash::{BlockHash, Version};
use crate::key::MAX_SEGMENT;
pub use crate::proto::{BlockRef, EntryKind, FileEntry, Manifest, ManifestPatch};

/// Default block size: 4 MiB.
pub const DEFAULT_BLOCK_SIZE: u32 = 4 << 20;
/// Largest block any peer accepts or sends.
pub const MAX_BLOCK_SIZE: u32 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest has a bad path {0:?}")]
    BadPath(String),
    #[error("manifest entry {0:?}: blocks add up to {1} bytes, size says {2}")]
    SizeMismatch(String, u64, u64),
    #[error("manifest entry {0:?} has a malformed block reference")]
    BadBlock(String),
    #[error("manifest entry {path:?} lists block {hash} as {len} bytes, and elsewhere as {other}")]
    InconsistentBlock {
        path: String,
        hash: String,
        len: u32,
        other: u32,
    },
    #[error("manifest block size {0} is out of range")]
    BadBlockSize(u32),
    #[error("manifest entries are not sorted and unique at {0:?}")]
    Unsorted(String),
    #[error("manifest is empty")]
    Empty,
    #[error("the patched manifest is not the version the patch names (made against another base)")]
    PatchVersion,
    #[error("malformed manifest: {0}")]
    Decode(#[from] prost::DecodeError),
}

pub fn version_of(m: &Manifest) -> Version {
    Version(*blake3::hash(&m.encode_to_vec()).as_bytes())
}

pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let m = Manifest::decode(bytes)?;
    validate(&m)?;
    Ok(m)
}

/// True when the manifest describes a directory tree rather than a single file.
pub fn is_directory(m: &Manifest) -> bool {
    m.entries
        .first()
        .is_some_and(|e| e.path.is_empty() && e.kind() == EntryKind::Directory)
}

pub fn total_size(m: &Manifest) -> u64 {
    m.entries
        .iter()
        .filter(|e| e.kind() == EntryKind::File)
        .map(|e| e.size)
        .sum()
}

pub fn file_count(m: &Manifest) -> u64 {
    m.entries
        .iter()
        .filter(|e| e.kind() == EntryKind::File)
        .count() as u64
}

pub fn block_hash(b: &BlockRef) -> Option<BlockHash> {
    BlockHash::from_slice(&b.hash)
}

/// The version's unique blocks in manifest order (first occurrence), as a swarm names them:
/// their 32-byte hashes one after another, and their lengths. Malformed references are left
/// out.
pub fn unique_blocks(m: &Manifest) -> (Vec<u8>, Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    let (mut hashes, mut lens) = (Vec::new(), Vec::new());
    for b in m.entries.iter().flat_map(|e| &e.blocks) {
        if let Some(h) = block_hash(b) {
            if seen.insert(h.0) {
                hashes.extend_from_slice(&h.0);
                lens.push(b.len);
            }
        }
    }
    (hashes, lens)
}

/// A fifo, socket or device node: an entry of metadata alone.
pub fn is_special(k: EntryKind) -> bool {
    matches!(
        k,
        EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice
    )
}

/// Checks a manifest that may come from anyone: every path is a clean relative path, entries
/// are sorted and unique, block references are well formed and add up to each file's size.
pub fn validate(m: &Manifest) -> Result<(), ManifestError> {
    if m.block_size == 0 || m.block_size > MAX_BLOCK_SIZE {
        return Err(ManifestError::BadBlockSize(m.block_size));
    }
    if m.entries.is_empty() {
        return Err(ManifestError::Empty);
    }
    let mut prev: Option<&str> = None;
    // Every entry's parent must be a directory of the manifest: no file or symlink may stand
    // where a later entry needs a directory (a symlink there would redirect writes elsewhere).
    let mut dirs: std::collections::HashSet<&str> = std::collections::HashSet::new();
    // A block is its bytes: one hash with two lengths is a lie, and readers that fetch each
    // hash once would cut or pad one of its places.
    let mut lens: std::collections::HashMap<&[u8], u32> = std::collections::HashMap::new();
    for e in &m.entries {
        check_rel_path(&e.path)?;
        if let Some(p) = prev {
            if p >= e.path.as_str() {
                return Err(ManifestError::Unsorted(e.path.clone()));
            }
        }
        prev = Some(&e.path);
        if !e.path.is_empty() {
            let parent = e.path.rfind('/').map_or("", |i| &e.path[..i]);
            if !dirs.contains(parent) {
                return Err(ManifestError::BadPath(e.path.clone()));
            }
        }
        if e.kind() == EntryKind::Directory {
            dirs.insert(&e.path);
        }
        if e.kind() == EntryKind::File {
            let mut sum = 0u64;
            for b in &e.blocks {
                if b.hash.len() != 32 || b.len == 0 || b.len > m.block_size {
                    return Err(ManifestError::BadBlock(e.path.clone()));
                }
                let len = *lens.entry(&b.hash).or_insert(b.len);
                if len != b.len {
                    return Err(ManifestError::InconsistentBlock {
                        path: e.path.clone(),
                        hash: block_hash(b).map(|h| h.to_string()).unwrap_or_default(),
                        len: b.len,
                        other: len,
                    });
                }
                sum += u64::from(b.len);
            }
            if sum != e.size {
                return Err(ManifestError::SizeMismatch(e.path.clone(), sum, e.size));
            }
        } else if !e.blocks.is_empty() {
            return Err(ManifestError::BadBlock(e.path.clone()));
        } else if is_special(e.kind()) && e.size != 0 {
            return Err(ManifestError::SizeMismatch(e.path.clone(), 0, e.size));
        }
    }
    // A single-file manifest has one entry with an empty path; a directory's first entry is its
    // root with an empty path.
    if m.entries.len() > 1 && !is_directory(m) {
        return Err(ManifestError::BadPath(m.entries[0].path.clone()));
    }
    if m.entries[0].path.is_empty() && m.entries[0].kind() == EntryKind::Symlink {
        return Ok(());
    }
    if !m.entries[0].path.is_empty() {
        return Err(ManifestError::BadPath(m.entries[0].path.clone()));
    }
    Ok(())
}

fn check_rel_path(p: &str) -> Result<(), ManifestError> {
    if p.is_empty() {
        return Ok(());
    }
    let bad = p.split('/').any(|s| {
        s.is_empty() || s == "." || s == ".." || s.len() > MAX_SEGMENT || s.contains('\0')
    });
    if bad || p.len() > crate::key::MAX_KEY {
        return Err(ManifestError::BadPath(p.to_string()));
    }
    Ok(())
}

/// `new` told as its differences from `base`; both sorted by path, as valid manifests are.
pub fn diff(base: &Manifest, new: &Manifest) -> ManifestPatch {
    let mut patch = ManifestPatch {
        block_size: new.block_size,
        version: version_of(new).0.to_vec(),
        ..Default::default()
    };
    let (mut b, mut n) = (
        base.entries.iter().peekable(),
        new.entries.iter().peekable(),
    );
    loop {
        match (b.peek(), n.peek()) {
            (None, None) => break,
            (Some(x), Some(y)) if x.path == y.path => {
                if x != y {
                    patch.upserts.push((*y).clone());
                }
                b.next();
                n.next();
            }
            (Some(x), Some(y)) if x.path < y.path => {
                patch.removed.push(x.path.clone());
                b.next();
            }
            (Some(x), None) => {
                patch.removed.push(x.path.clone());
                b.next();
            }
            (_, Some(y)) => {
                patch.upserts.push((*y).clone());
                n.next();
            }
        }
    }
    patch
}

/// Whether a patch changes nothing.
pub fn is_empty_patch(p: &ManifestPatch) -> bool {
    p.upserts.is_empty() && p.removed.is_empty()
}

/// `base` with `patch` applied, checked: it must be a valid manifest and have the version the
/// patch names, so a patch made against another base cannot publish something unintended.
pub fn apply(base: &Manifest, patch: &ManifestPatch) -> Result<Manifest, ManifestError> {
    let removed: std::collections::HashSet<&str> =
        patch.removed.iter().map(String::as_str).collect();
    let mut entries: std::collections::BTreeMap<&str, &FileEntry> = base
        .entries
        .iter()
        .filter(|e| !removed.contains(e.path.as_str()))
        .map(|e| (e.path.as_str(), e))
        .collect();
    for e in &patch.upserts {
        entries.insert(e.path.as_str(), e);
    }
    let m = Manifest {
        block_size: patch.block_size,
        entries: entries.into_values().cloned().collect(),
    };
    validate(&m)?;
    if version_of(&m).0[..] != patch.version[..] {
        return Err(ManifestError::PatchVersion);
    }
    Ok(m)
}

/// The part of a directory manifest at `subpath`, rebased so `subpath` becomes its root.
/// `None` when nothing lies there.
pub fn subtree(m: &Manifest, subpath: &str) -> Option<Manifest> {
    if subpath.is_empty() {
        return Some(m.clone());
    }
    let root = m.entries.iter().find(|e| e.path == subpath)?;
    let mut entries = Vec::new();
    let mut top = root.clone();
    top.path.clear();
    entries.push(top);
    if root.kind() == EntryKind::Directory {
        let pfx = format!("{subpath}/");
        for e in &m.entries {
            if let Some(rest) = e.path.strip_prefix(&pfx) {
                let mut e = e.clone();
                e.path = rest.to_string();
                entries.push(e);
            }
        }
    }
    Some(Manifest {
        block_size: m.block_size,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, blocks: &[(&[u8], u32)]) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind: EntryKind::File as i32,
            mode: 0o644,
            size: blocks.iter().map(|b| u64::from(b.1)).sum(),
            blocks: blocks
                .iter()
                .map(|(d, l)| BlockRef {
                    hash: blake3::hash(d).as_bytes().to_vec(),
                    len: *l,
                })
                .collect(),
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

    #[test]
    fn a_patch_carries_only_changes_and_applies_to_its_base_alone() {
        let m = |entries: Vec<FileEntry>| Manifest {
            block_size: 4,
            entries,
        };
        let base = m(vec![
            dir(""),
            dir("a"),
            file("a/x", &[(b"x", 1)]),
            file("a/y", &[(b"y", 1)]),
            file("z", &[(b"z", 1)]),
        ]);
        assert!(is_empty_patch(&diff(&base, &base)));
        let new = m(vec![
            dir(""),
            dir("a"),
            file("a/x", &[(b"x2", 2)]),
            dir("b"),
            file("b/w", &[(b"w", 1)]),
            file("z", &[(b"z", 1)]),
        ]);
        let p = diff(&base, &new);
        let up: Vec<&str> = p.upserts.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(up, ["a/x", "b", "b/w"]);
        assert_eq!(p.removed, ["a/y"]);
        assert_eq!(apply(&base, &p).unwrap(), new);
        // Against another base the result has another version, and is refused.
        let other = m(vec![dir(""), dir("a"), file("q", &[(b"q", 1)])]);
        assert!(matches!(
            apply(&other, &p),
            Err(ManifestError::PatchVersion)
        ));
        // A patch that would make an invalid manifest is refused as such.
        let mut bad = p.clone();
        bad.removed.push("a".into());
        assert!(apply(&base, &bad).is_err());
    }

    #[test]
    fn refuses_escaping_and_inconsistent_manifests() {
        let ok = Manifest {
            block_size: 4,
            entries: vec![dir(""), file("a", &[(b"x", 4)]), dir("d"), file("d/b", &[])],
        };
        validate(&ok).unwrap();
        for bad in ["../x", "d/../../x", "/abs", "a//b", "."] {
            let mut m = ok.clone();
            m.entries.push(file(bad, &[]));
            m.entries.sort_by(|a, b| a.path.cmp(&b.path));
            assert!(validate(&m).is_err(), "{bad} accepted");
        }
        let mut m = ok.clone();
        m.entries[1].size = 5;
        assert!(matches!(validate(&m), Err(ManifestError::SizeMismatch(..))));
        let mut m = ok.clone();
        m.entries[1].blocks[0].hash.pop();
        assert!(matches!(validate(&m), Err(ManifestError::BadBlock(..))));
        // The same block under two lengths, each entry adding up on its own.
        let mut m = ok.clone();
        m.entries[3] = file("d/b", &[(b"x", 3)]);
        assert!(
            matches!(
                validate(&m),
                Err(ManifestError::InconsistentBlock {
                    len: 3,
                    other: 4,
                    ..
                })
            ),
            "{:?}",
            validate(&m)
        );
        let mut m = ok.clone();
        m.entries.swap(1, 2);
        assert!(matches!(validate(&m), Err(ManifestError::Unsorted(..))));
        // A symlink standing where a directory is needed would redirect writes.
        let mut m = ok.clone();
        m.entries[2] = FileEntry {
            path: "d".into(),
            kind: EntryKind::Symlink as i32,
            symlink_target: "/etc".into(),
            ..Default::default()
        };
        assert!(matches!(validate(&m), Err(ManifestError::BadPath(..))));
        // Parents must be listed.
        let m = Manifest {
            block_size: 4,
            entries: vec![dir(""), file("x/y", &[])],
        };
        assert!(validate(&m).is_err());
    }

    #[test]
    fn version_changes_with_content_and_subtree_rebases() {
        let m = Manifest {
            block_size: 4,
            entries: vec![dir(""), dir("d"), file("d/b", &[(b"y", 4)])],
        };
        let mut m2 = m.clone();
        m2.entries[2].mode = 0o600;
        assert_ne!(version_of(&m), version_of(&m2));
        let sub = subtree(&m, "d").unwrap();
        assert!(is_directory(&sub));
        assert_eq!(sub.entries[1].path, "b");
        let f = subtree(&m, "d/b").unwrap();
        assert_eq!(f.entries.len(), 1);
        validate(&f).unwrap();
        assert!(subtree(&m, "nope").is_none());
    }
}
