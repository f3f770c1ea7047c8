//! Files open for writing on this node, staged here until published.
//!
//! A new file starts empty; an existing one is copied on write from its published blocks. The
//! staged bytes ([`Body`]: in memory while small, else a staging file) belong to every
//! descriptor that opened the path; the last release publishes them and removes them (unless
//! they were published in place: then the file stays, served to peers, and a later write
//! copies it first).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::body::Body;
use super::{Attr, Caller, FsCore, FsError, FsResult, Handle, Kind, PageCache};
use crate::locks::lock;

/// How long an unmount waits for queued publishes; what is left is published by the next
/// agent on the mount, from the journal.
const UNMOUNT_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A file open for writing on this node.
pub struct Staged {
    pub(super) path: Mutex<String>,
    pub(super) body: Mutex<Body>,
    pub(crate) opens: AtomicUsize,
    /// Changes made so far, and how many of them the last publish took in. A publish may run
    /// while writes go on (a FLUSH comes whenever any copy of the descriptor is closed, e.g. by
    /// a forked child at exec), so "dirty" is a count, never a flag that a publish clears.
    pub(super) changes: AtomicU64,
    pub(super) published: AtomicU64,
    pub(super) unlinked: AtomicBool,
    pub(super) mode: AtomicU32,
    /// uid and gid: its creator's, or those of the file it rewrites.
    pub(super) owner: Mutex<(u32, u32)>,
    pub(super) mtime: Mutex<SystemTime>,
    /// When this node last changed it (a write, a chmod), until its publish stamps it anew.
    pub(super) ctime: Mutex<SystemTime>,
    pub(super) publish_lock: tokio::sync::Mutex<()>,
    /// Whether its bytes are all here: a file opened to be rewritten is filled from its
    /// published blocks first, and whoever else opens or publishes it meanwhile waits.
    pub(super) filled: tokio::sync::watch::Sender<bool>,
    /// In the write-back queue (see [`super::writeback`]), not yet taken by a flusher.
    pub(super) queued: AtomicBool,
    /// Its write-back journal record, while it has one, and the count of changes it holds.
    pub(super) record: Mutex<Option<super::writeback::Journaled>>,
    pub(super) journaled: AtomicU64,
}

impl Staged {
    pub(super) fn path(&self) -> String {
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

    fn write(&self, offset: u64, data: &[u8], staging: &Path) -> FsResult<u32> {
        let mut b = lock(&self.body);
        b.write_at(offset, data, staging)?;
        self.changed();
        Ok(data.len() as u32)
    }

    /// Whether something changed since the last publish took its snapshot.
    pub(super) fn dirty(&self) -> bool {
        self.changes.load(Ordering::SeqCst) != self.published.load(Ordering::SeqCst)
    }

    /// Waits until its bytes are all here (see [`Staged::filled`]).
    pub(super) async fn until_filled(&self) {
        let mut rx = self.filled.subscribe();
        // The sender lives as long as `self`: the wait ends.
        let _ = rx.wait_for(|filled| *filled).await;
    }

    pub(super) fn truncate(&self, size: u64, staging: &Path) -> FsResult<()> {
        lock(&self.body).set_len(size, staging)?;
        self.changed();
        Ok(())
    }
}

impl FsCore {
    pub(crate) fn staged_at(&self, path: &str) -> Option<Arc<Staged>> {
        let s = lock(&self.staged).get(path).cloned()?;
        (!s.unlinked.load(Ordering::SeqCst)).then_some(s)
    }

    pub(crate) fn staged_paths(&self) -> Vec<String> {
        lock(&self.staged).keys().cloned().collect()
    }

    fn new_staged(
        &self,
        path: &str,
        mode: u32,
        owner: (u32, u32),
        (mtime, ctime): (SystemTime, SystemTime),
        dirty: bool,
        filled: bool,
    ) -> FsResult<Arc<Staged>> {
        let body = Body::new(&self.cfg.staging, &self.staging_memory)?;
        let s = Arc::new(Staged {
            path: Mutex::new(path.to_string()),
            body: Mutex::new(body),
            opens: AtomicUsize::new(1),
            changes: AtomicU64::new(u64::from(dirty)),
            published: AtomicU64::new(0),
            unlinked: AtomicBool::new(false),
            mode: AtomicU32::new(mode & 0o7777),
            owner: Mutex::new(owner),
            mtime: Mutex::new(mtime),
            ctime: Mutex::new(ctime),
            publish_lock: tokio::sync::Mutex::new(()),
            filled: tokio::sync::watch::Sender::new(filled),
            queued: AtomicBool::new(false),
            record: Mutex::new(None),
            journaled: AtomicU64::new(0),
        });
        lock(&self.staged).insert(path.to_string(), s.clone());
        Ok(s)
    }

    /// Stages an existing file for writing: empty for `O_TRUNC`, else a copy of its published bytes.
    pub(crate) async fn open_staged(&self, path: &str, trunc: bool) -> FsResult<Arc<Staged>> {
        // Counted under the map's lock: a flusher retires only what no one opened.
        let open = {
            let m = lock(&self.staged);
            let s = m.get(path).filter(|s| !s.unlinked.load(Ordering::SeqCst));
            s.inspect(|s| {
                s.opens.fetch_add(1, Ordering::SeqCst);
            })
            .cloned()
        };
        if let Some(s) = open {
            s.until_filled().await;
            if trunc {
                s.truncate(0, &self.cfg.staging)?;
            }
            return Ok(s);
        }
        let attr = self.stat_path(path).await?;
        match attr.kind {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir),
            Kind::Symlink => return Err(FsError::IsSymlink),
            // The kernel opens special files itself; nothing here has bytes to stage.
            _ => return Err(FsError::Invalid("not a regular file".into())),
        }
        let s = self.new_staged(
            path,
            u32::from(attr.perm),
            (attr.uid, attr.gid),
            (attr.mtime, attr.ctime),
            trunc,
            trunc || attr.size == 0,
        )?;
        if !trunc && attr.size > 0 {
            let copied = self.copy_published(path, &s).await;
            s.filled.send_replace(true);
            if let Err(e) = copied {
                self.drop_staged(&s).await;
                return Err(e);
            }
        }
        Ok(s)
    }

    /// Copy on write: the published bytes of `path` into the staged file, which no one else
    /// reads or writes until it is [`Staged::filled`]. Its length is set first, so a stat
    /// meanwhile shows the file's size.
    async fn copy_published(&self, path: &str, s: &Staged) -> FsResult<()> {
        let f = self.resolve_file(path).await?;
        lock(&s.body).set_len(f.entry.size, &self.cfg.staging)?;
        for i in 0..f.entry.blocks.len() {
            let job = f.job(i)?;
            let data = self
                .loader
                .block(&job, &f.route, self.seed_hook(f.version))
                .await?;
            lock(&s.body).write_at(f.offsets[i], &data, &self.cfg.staging)?;
        }
        Ok(())
    }

    pub(super) async fn drop_staged(&self, s: &Arc<Staged>) {
        let path = s.path();
        {
            let mut m = lock(&self.staged);
            if m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                m.remove(&path);
            }
        }
        self.discard(s).await;
    }

    /// Removes the staged bytes (unless served in place) and the journal record of `s`, gone
    /// from the map. Under its publish lock: a publish in flight reads them.
    pub(super) async fn discard(&self, s: &Staged) {
        let _guard = s.publish_lock.lock().await;
        super::writeback::Writeback::forget(s);
        lock(&s.body).remove();
    }

    pub async fn create(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64)> {
        let me = Caller {
            pid: std::process::id(),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
        };
        self.create_by(parent, name, mode, flags, me)
            .await
            .map(|(a, fh, _)| (a, fh))
    }

    /// [`FsCore::create`] for the process `caller`: a new file is its uid's, and its gid's (or
    /// the directory's, under a set-group-ID directory); a control file reaches its buffers.
    pub async fn create_by(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Attr, u64, PageCache)> {
        self.writable()?;
        let path = self.child(parent, name).await?;
        if let Some(rest) = super::gpu_tree::gpu_rest(&path) {
            if rest.is_empty() {
                return Err(FsError::Exists);
            }
            let (fh, cache) = self.gpu_open(rest, caller.pid, true).await?;
            let mut attr = self.stat_path(&path).await?;
            attr.ino = self.inodes().lookup(&path);
            return Ok((attr, fh, cache));
        }
        Self::check_key(&path)?;
        let s = match self.stat_path(&path).await {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::Exists),
            Ok(_) => self.open_staged(&path, flags & libc::O_TRUNC != 0).await?,
            Err(e) if e.is_not_found() => {
                let (owner, _) = self.owner_for(parent, caller).await?;
                let now = SystemTime::now();
                self.new_staged(&path, mode, owner, (now, now), true, true)?
            }
            Err(e) => return Err(e),
        };
        let ino = self.inodes().lookup(&path);
        let attr = s.attr(ino)?;
        Ok((attr, self.insert_handle(Handle::Write(s)), PageCache::Fresh))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_WRITE_SECONDS);
        match self.handle(fh)? {
            Handle::Write(s) => s.write(offset, data, &self.cfg.staging),
            Handle::Gpu(cf) => Ok(cf.write(offset, data)?),
            _ => Err(FsError::BadHandle),
        }
    }

    /// `fallocate(2)`: reserving space extends a file open for writing (its bytes are zeros
    /// until written); `FALLOC_FL_KEEP_SIZE` has nothing to do, the staging file being sparse;
    /// punching holes, collapsing and zeroing ranges are not supported.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let Handle::Write(s) = self.handle(fh)? else {
            return Err(FsError::BadHandle);
        };
        match mode {
            0 => {
                let end = offset
                    .checked_add(length)
                    .ok_or_else(|| FsError::Invalid("offset + length overflows".into()))?;
                if end > s.attr(0)?.size {
                    s.truncate(end, &self.cfg.staging)?;
                }
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(FsError::NotSupported(
                "fallocate modes other than 0 and FALLOC_FL_KEEP_SIZE",
            )),
        }
    }

    /// `copy_file_range(2)` within the mount: `len` bytes from `fh_in` at `offset_in` into the
    /// file open for writing `fh_out`, a block at a time; what was copied (short at the end of
    /// the source).
    pub async fn copy_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u32> {
        const STEP: u64 = 1 << 20;
        // The call answers in 32 bits.
        let len = len.min(u64::from(u32::MAX) & !(STEP - 1));
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(STEP) as u32;
            let data = self.read(ino_in, fh_in, offset_in + done, want).await?;
            if data.is_empty() {
                break;
            }
            let n = self.write(fh_out, offset_out + done, &data)?;
            done += u64::from(n);
            if (n as usize) < data.len() {
                break;
            }
        }
        Ok(done as u32)
    }

    /// `close`: publish what was written; under write-back, journal and queue it (here, not
    /// at the last release: the kernel sends that after `close` returned).
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_FLUSH_SECONDS);
        if self.writeback.on() {
            if let Ok(Handle::Write(s)) = self.handle(fh) {
                self.queue_publish(&s).await?;
            }
            return Ok(());
        }
        self.fsync(fh).await
    }

    /// `fsync`: publish what was written, write-back or not.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        match self.handle(fh) {
            Ok(Handle::Write(s)) => self.publish_staged(&s).await,
            // A reader's handle from an earlier agent: closing it is fine.
            Err(FsError::BadHandle) => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }

    pub(crate) async fn release_staged(&self, s: &Arc<Staged>) -> FsResult<()> {
        if s.opens.fetch_sub(1, Ordering::SeqCst) > 1 {
            return Ok(());
        }
        if self.queue_publish(s).await? {
            return Ok(());
        }
        let r = self.publish_staged(s).await;
        // A file the journal of an earlier agent held may still be queued: its flusher drops it.
        if !s.queued.load(Ordering::SeqCst) {
            self.drop_staged(s).await;
        }
        r
    }

    /// Publishes every file still open for writing, and lets the write-back queue drain
    /// (at unmount).
    pub async fn flush_all(&self) {
        let all: Vec<Arc<Staged>> = lock(&self.staged)
            .values()
            .filter(|s| s.opens.load(Ordering::SeqCst) > 0)
            .cloned()
            .collect();
        self.drain_writeback(UNMOUNT_DRAIN).await;
        for s in all {
            if let Err(e) = self.publish_staged(&s).await {
                tracing::error!(path = %s.path(), error = %e, "could not publish a file open at unmount");
            }
        }
    }
}
