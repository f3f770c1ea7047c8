//! A file open for writing on this node, staged here until published.
//!
//! A new file starts empty; an existing one is copied on write from its published blocks. The
//! staged bytes ([`Body`]: in memory while small, else a staging file) belong to every
//! descriptor that opened the path; the last release publishes them and removes them (unless
//! they were published in place: then the file stays, served to peers, and a later write
//! copies it first).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use super::body::Body;
use super::journal::Journaled;
use crate::fs::attr::{Attr, Kind};
use crate::fs::error::FsResult;
use crate::locks::lock;

/// A file open for writing on this node.
pub struct Staged {
    pub(crate) path: Mutex<String>,
    pub(crate) body: Mutex<Body>,
    pub(crate) opens: AtomicUsize,
    /// Changes made so far, and how many of them the last publish took in. A publish may run
    /// while writes go on (a FLUSH comes whenever any copy of the descriptor is closed, e.g. by
    /// a forked child at exec), so "dirty" is a count, never a flag that a publish clears.
    pub(crate) changes: AtomicU64,
    pub(crate) published: AtomicU64,
    pub(crate) unlinked: AtomicBool,
    pub(crate) mode: AtomicU32,
    /// uid and gid: its creator's, or those of the file it rewrites.
    pub(crate) owner: Mutex<(u32, u32)>,
    pub(crate) mtime: Mutex<SystemTime>,
    /// When this node last changed it (a write, a chmod), until its publish stamps it anew.
    pub(crate) ctime: Mutex<SystemTime>,
    pub(crate) publish_lock: tokio::sync::Mutex<()>,
    /// Whether its bytes are all here: a file opened to be rewritten is filled from its
    /// published blocks first, and whoever else opens or publishes it meanwhile waits.
    pub(crate) filled: tokio::sync::watch::Sender<bool>,
    /// In the write-back queue (see `writeback`), not yet taken by a flusher.
    pub(crate) queued: AtomicBool,
    /// Its write-back journal record, while it has one, and the count of changes it holds.
    pub(crate) record: Mutex<Option<Journaled>>,
    pub(crate) journaled: AtomicU64,
}

impl Staged {
    /// A file staged at `path` with `body`, opened once, with nothing changed yet.
    pub(crate) fn new(
        path: &str,
        body: Body,
        mode: u32,
        owner: (u32, u32),
        (mtime, ctime): (SystemTime, SystemTime),
    ) -> Staged {
        Staged {
            path: Mutex::new(path.to_string()),
            body: Mutex::new(body),
            opens: AtomicUsize::new(1),
            changes: AtomicU64::new(0),
            published: AtomicU64::new(0),
            unlinked: AtomicBool::new(false),
            mode: AtomicU32::new(mode & 0o7777),
            owner: Mutex::new(owner),
            mtime: Mutex::new(mtime),
            ctime: Mutex::new(ctime),
            publish_lock: tokio::sync::Mutex::new(()),
            filled: tokio::sync::watch::Sender::new(true),
            queued: AtomicBool::new(false),
            record: Mutex::new(None),
            journaled: AtomicU64::new(0),
        }
    }

    pub(crate) fn path(&self) -> String {
        lock(&self.path).clone()
    }

    pub(crate) fn attr(&self, ino: u64) -> FsResult<Attr> {
        let size = lock(&self.body).size()?;
        let (uid, gid) = *lock(&self.owner);
        let mtime = *lock(&self.mtime);
        Ok(Attr {
            ino,
            kind: Kind::File,
            size,
            perm: self.mode.load(Ordering::Relaxed) as u16,
            mtime,
            atime: mtime,
            ctime: *lock(&self.ctime),
            nlink: 1,
            uid,
            gid,
            rdev: 0,
        })
    }

    pub(crate) fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        Ok(lock(&self.body).read_at(offset, size)?)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        let now = SystemTime::now();
        *lock(&self.mtime) = now;
        *lock(&self.ctime) = now;
    }

    pub(crate) fn write(&self, offset: u64, data: &[u8], staging: &Path) -> FsResult<u32> {
        let mut b = lock(&self.body);
        b.write_at(offset, data, staging)?;
        self.changed();
        Ok(data.len() as u32)
    }

    /// Whether something changed since the last publish took its snapshot.
    pub(crate) fn dirty(&self) -> bool {
        self.changes.load(Ordering::SeqCst) != self.published.load(Ordering::SeqCst)
    }

    /// Waits until its bytes are all here (see [`Staged::filled`]).
    pub(crate) async fn until_filled(&self) {
        let mut rx = self.filled.subscribe();
        // The sender lives as long as `self`: the wait ends.
        let _ = rx.wait_for(|filled| *filled).await;
    }

    pub(crate) fn truncate(&self, size: u64, staging: &Path) -> FsResult<()> {
        lock(&self.body).set_len(size, staging)?;
        self.changed();
        Ok(())
    }

    /// Forgets the record of `s` (gone from every map: nothing journals it again).
    pub(crate) fn forget_record(&self) {
        if let Some(r) = lock(&self.record).take() {
            r.remove();
        }
    }

    /// Forgets the record of `s` if every change of it is published. Under the record's lock,
    /// as `Writeback::journal` writes it: a change counted after the check journals anew.
    pub(crate) fn forget_record_if_clean(&self) {
        let mut rec = lock(&self.record);
        if !self.dirty() {
            if let Some(r) = rec.take() {
                r.remove();
            }
        }
    }
}
