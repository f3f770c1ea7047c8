//! `/kt/.gpu`: the GPU control files in the mount. `.gpu` is not listed at the root (like a
//! snapshot directory) but is always there; below it, each GPU key of the namespace is a control
//! file and the prefixes of GPU keys are directories. A publisher makes the directories of a
//! new key first (`mkdir -p`, as for any path): they are this mount's until a key below them is
//! published, and then everyone's. The directories are sticky, as `/tmp` is: every user of the
//! node may make a key there, and only a key's owner (the user who made its control file on
//! this mount; for a key made elsewhere, the mount's owner) or root may unlink, and so
//! unpublish, it. What a control file does on read, write, ioctl and poll is `gpu::control`'s;
//! this file maps paths and handles to it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::SystemTime;

use super::attr::{Attr, Kind};
use super::error::FsResult;
use crate::gpu::control::GpuControl;
use crate::key::KeyPath;
use crate::locks::lock;

/// The GPU control tree of a mount: what a control file does, and what this mount made or
/// holds open below `/.gpu` before any of it is published.
pub struct GpuTree {
    pub(crate) control: GpuControl,
    /// GPU control files open here, by key: they exist before they are published.
    pub(crate) files: Mutex<HashMap<String, usize>>,
    /// Directories made below `/.gpu` on this mount, for keys to come.
    pub(crate) dirs: Mutex<HashSet<String>>,
    /// Who made each control file made on this mount (uid, gid): its owner until it is unlinked.
    owners: Mutex<HashMap<String, (u32, u32)>>,
    started: SystemTime,
    uid: u32,
    gid: u32,
}

pub(crate) fn key_of(rest: &str) -> FsResult<KeyPath> {
    Ok(KeyPath::parse(rest)?)
}

impl GpuTree {
    /// The tree over `control`, its entries owned by `uid`/`gid` and dated `started`.
    pub fn new(control: GpuControl, started: SystemTime, uid: u32, gid: u32) -> Self {
        GpuTree {
            control,
            files: Mutex::default(),
            dirs: Mutex::default(),
            owners: Mutex::default(),
            started,
            uid,
            gid,
        }
    }

    pub fn dir_attr(&self, ino: u64) -> Attr {
        Attr {
            ino,
            kind: Kind::Dir,
            size: 0,
            // Any process of the node (any user of a pod) may make a key's directories there;
            // sticky, so only a key's owner removes it.
            perm: 0o1777,
            mtime: self.started,
            atime: self.started,
            ctime: self.started,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
        }
    }

    /// The attributes of the control file of key `key`: its owner's where it was made here.
    pub fn file_attr(&self, ino: u64, key: &str) -> Attr {
        let (uid, gid) = lock(&self.owners)
            .get(key)
            .copied()
            .unwrap_or((self.uid, self.gid));
        Attr {
            ino,
            kind: Kind::File,
            size: 0,
            // Any process of the node may publish or receive; the tensors are its own.
            perm: 0o666,
            mtime: self.started,
            atime: self.started,
            ctime: self.started,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
        }
    }

    /// A control file at `key` was made here by `uid`/`gid`, its owner from now on (unless
    /// one was made before and not unlinked since).
    pub fn made(&self, key: &str, uid: u32, gid: u32) {
        lock(&self.owners)
            .entry(key.to_string())
            .or_insert((uid, gid));
    }

    /// The key's control file was unlinked: it has no owner here any more.
    pub fn unlinked(&self, key: &str) {
        lock(&self.owners).remove(key);
    }

    /// Whether `rest` is a directory this mount made, or the parent of one, or of a control file
    /// open here.
    pub fn local_dir(&self, rest: &str) -> bool {
        let below = |p: &String| {
            p.len() > rest.len() && p.starts_with(rest) && p.as_bytes()[rest.len()] == b'/'
        };
        lock(&self.dirs).iter().any(|d| d == rest || below(d))
            || lock(&self.files).keys().any(below)
    }

    /// A control file at `key` was opened here.
    pub fn opened(&self, key: &str) {
        *lock(&self.files).entry(key.to_string()).or_default() += 1;
    }

    /// A control file at `key` was closed here.
    pub fn closed(&self, key: &str) {
        let mut open = lock(&self.files);
        if let Some(n) = open.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                open.remove(key);
            }
        }
    }

    /// Whether a control file at `key` is open here.
    pub fn is_open(&self, key: &str) -> bool {
        lock(&self.files).get(key).is_some_and(|n| *n > 0)
    }
}
