//! How keys and locations are stored, and how stored records become listing entries.

use crate::hash::Version;
use crate::key::Namespace;
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{KeyRecord, ListEntry, PathAttrs};

/// The stored key of `key` in namespace `ns`: `namespace NUL key`.
pub(crate) fn key_bytes(ns: &Namespace, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(ns.as_str().len() + 1 + key.len());
    k.extend_from_slice(ns.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// Whether a key has not expired at `now_ms`.
pub(crate) fn live(r: &KeyRecord, now_ms: i64) -> bool {
    r.expires_unix_ms == 0 || r.expires_unix_ms > now_ms
}

/// The stored key of inode `id` in namespace `ns`.
pub(crate) fn inode_bytes(ns: &Namespace, id: u64) -> Vec<u8> {
    let mut k = key_bytes(ns, "");
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn location_key(version: &Version, node: &str) -> Vec<u8> {
    let mut k = version.0.to_vec();
    k.extend_from_slice(node.as_bytes());
    k
}

pub(crate) fn key_entry(rel: &str, r: &KeyRecord) -> ListEntry {
    ListEntry {
        name: if r.is_directory {
            format!("{rel}/")
        } else {
            rel.to_string()
        },
        is_directory: r.is_directory,
        locale: r.locale,
        origin_node: r.origin_node.clone(),
        size: r.size,
        is_key: true,
        kind: r.kind,
        mode: r.mode,
        mtime_sec: r.mtime_sec,
        mtime_nsec: r.mtime_nsec,
        symlink_target: r.symlink_target.clone(),
        uid: r.uid,
        gid: r.gid,
        ctime_sec: if r.inode != 0 {
            r.ctime_sec
        } else {
            r.created_unix_ms.div_euclid(1000)
        },
        ctime_nsec: if r.inode != 0 {
            r.ctime_nsec
        } else {
            (r.created_unix_ms.rem_euclid(1000) * 1_000_000) as u32
        },
        rdev: r.rdev,
        nlink: r.nlink,
        inode: r.inode,
        expires_unix_ms: r.expires_unix_ms,
    }
}

/// The listing entry of `e`, an entry of `r`'s manifest, named `name`.
pub(crate) fn file_entry(name: String, e: &FileEntry, r: &KeyRecord) -> ListEntry {
    let dir = e.kind() == EntryKind::Directory;
    ListEntry {
        name: if dir { format!("{name}/") } else { name },
        is_directory: dir,
        locale: r.locale,
        origin_node: r.origin_node.clone(),
        size: e.size,
        is_key: false,
        kind: e.kind,
        mode: e.mode,
        mtime_sec: e.mtime_sec,
        mtime_nsec: e.mtime_nsec,
        symlink_target: e.symlink_target.clone(),
        uid: e.uid,
        gid: e.gid,
        // Until its metadata changes, an entry is as old as the version that holds it.
        ctime_sec: r.created_unix_ms.div_euclid(1000),
        ctime_nsec: (r.created_unix_ms.rem_euclid(1000) * 1_000_000) as u32,
        rdev: e.rdev,
        nlink: 0,
        inode: 0,
        expires_unix_ms: r.expires_unix_ms,
    }
}

/// Lays a path's own attributes over its listing entry.
pub(crate) fn overlay(e: &mut ListEntry, a: Option<&PathAttrs>) {
    let Some(a) = a else { return };
    if let Some(s) = a.ctime_sec {
        e.ctime_sec = s;
        e.ctime_nsec = a.ctime_nsec;
    }
    // A file's mtime is its content's, in its manifest; a directory's moves with its entries.
    if e.is_directory {
        if let Some(s) = a.mtime_sec {
            e.mtime_sec = s;
            e.mtime_nsec = a.mtime_nsec;
        }
    }
    if let Some(m) = a.mode {
        e.mode = m;
    }
    if a.uid.is_some() {
        e.uid = a.uid;
    }
    if a.gid.is_some() {
        e.gid = a.gid;
    }
}

/// The entries a listing of the key (or the directory inside it) `m` shows, those whose path
/// comes after `after` (the first page: all, the root of a one-file key included), at most
/// `limit`. A manifest is sorted by path, which is the listing's order, so a page of a tree
/// of a million files costs its own entries, not the tree's.
pub(crate) fn manifest_listing(
    m: &Manifest,
    r: &KeyRecord,
    recursive: bool,
    (after, limit): (&str, usize),
) -> Vec<ListEntry> {
    let from = match after {
        "" => 0,
        after => m.entries.partition_point(|e| e.path.as_str() <= after),
    };
    m.entries[from..]
        .iter()
        .filter(|e| !e.path.is_empty() || !manifest::is_directory(m))
        .filter(|e| recursive || !e.path.contains('/'))
        .take(limit)
        .map(|e| file_entry(e.path.clone(), e, r))
        .collect()
}
