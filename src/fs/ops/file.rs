//! Files: open (a read resolves the version now, close-to-open; a write stages), read, write,
//! and close (publish what was written).
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use crate::fs::attr::{Attr, Caller, Kind};
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::FsCore;
use crate::fs::handles::Handle;
use crate::fs::paths::{check_key, gpu_rest};
use crate::locks::lock;
use bytes::Bytes;

use crate::fs::read::file::{PageCache, ReadFile, BYPASS_MIN};
use crate::fs::read::reader::Pending;
use crate::fs::write::staged::Staged;

/// A read as [`FsCore::read_now`] left it: answered, or to be finished by
/// [`FsCore::read_wait`].
pub enum ReadNow {
    Ready(FsResult<Bytes>),
    Wait(ReadWait),
}

/// A read waiting for the network or the store server (`Send`: it may be finished by a task).
pub struct ReadWait {
    waiting: Waiting,
    /// Times the whole read, its wait included.
    _timer: crate::metrics::Timer,
}

enum Waiting {
    /// Blocks this node did not hold.
    Blocks(Pending),
    /// A control file's contents, or a handle of an earlier agent to open again.
    Handle {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
}

impl FsCore {
    /// Opens a file. Reads resolve the version now (close-to-open); writes stage.
    /// Returns the handle and what the kernel should do with its cached pages of the file.
    pub async fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, PageCache)> {
        self.open_by(ino, flags, std::process::id()).await
    }
    /// [`FsCore::open`] for the process `caller` (whose GPU buffers a control file reaches).
    pub async fn open_by(&self, ino: u64, flags: i32, caller: u32) -> FsResult<(u64, PageCache)> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_OPEN_SECONDS);
        let path = self.path_of(ino).await?;
        if let Some(rest) = gpu_rest(&path) {
            if rest.is_empty() {
                return Err(FsError::IsDir);
            }
            self.writable()?;
            return self.gpu_open(rest, caller, false).await;
        }
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.writable()?;
            let s = self.open_staged(&path, flags & libc::O_TRUNC != 0).await?;
            return Ok((self.handles.insert(Handle::Write(s)), PageCache::Fresh));
        }
        if let Some(s) = self.writer.staged_at(&path) {
            s.opens.fetch_add(1, Ordering::SeqCst);
            return Ok((self.handles.insert(Handle::Write(s)), PageCache::Fresh));
        }
        let file = self.reader.resolve(&path).await?;
        if let Ok(a) = self.stat_path(&path).await {
            self.accessed(ino, &a);
        }
        let keep = self.reader.opened(ino, file.version);
        let cache = if keep {
            PageCache::Keep
        } else if file.entry.size >= BYPASS_MIN {
            PageCache::Bypass
        } else {
            PageCache::Fresh
        };
        Ok((self.handles.insert(Handle::Read(Arc::new(file))), cache))
    }
    /// The handle of an open file (for tests and tools: a reader's window, say).
    pub fn read_file(&self, fh: u64) -> FsResult<Arc<ReadFile>> {
        match self.handles.get(fh)? {
            Handle::Read(f) => Ok(f),
            _ => Err(FsError::BadHandle),
        }
    }
    /// A read as far as it goes without waiting, on the caller's thread: a file being written
    /// here, or a published file's blocks this node holds, each looked up once (a cached file's
    /// read costs no hop to the runtime and back). What must be fetched is left to
    /// [`FsCore::read_wait`], which gets it with no second lookup.
    pub fn read_now(&self, ino: u64, fh: u64, offset: u64, size: u32) -> ReadNow {
        let timer = crate::metrics::Timer::start(&crate::metrics::FUSE_READ_SECONDS);
        let waiting = match self.handles.get(fh) {
            Ok(Handle::Read(f)) => match self.reader.read_start(&f, offset, size) {
                Ok(Ok(bytes)) => return ReadNow::Ready(Ok(bytes)),
                Ok(Err(pending)) => Waiting::Blocks(pending),
                Err(e) => return ReadNow::Ready(Err(e)),
            },
            Ok(Handle::Write(s)) => return ReadNow::Ready(s.read(offset, size).map(Bytes::from)),
            Ok(Handle::Dir(_)) => return ReadNow::Ready(Err(FsError::IsDir)),
            // A control file's contents, and a handle of an earlier agent, are made anew.
            Ok(Handle::Gpu(_)) | Err(FsError::BadHandle) => Waiting::Handle {
                ino,
                fh,
                offset,
                size,
            },
            Err(e) => return ReadNow::Ready(Err(e)),
        };
        ReadNow::Wait(ReadWait {
            waiting,
            _timer: timer,
        })
    }

    /// The rest of a read [`FsCore::read_now`] could not answer.
    pub async fn read_wait(&self, wait: ReadWait) -> FsResult<Bytes> {
        let (ino, fh, offset, size) = match wait.waiting {
            Waiting::Blocks(pending) => return self.reader.read_rest(pending).await,
            Waiting::Handle {
                ino,
                fh,
                offset,
                size,
            } => (ino, fh, offset, size),
        };
        match self.handle_or_reopen(ino, fh, false).await? {
            Handle::Read(f) => match self.reader.read_start(&f, offset, size)? {
                Ok(bytes) => Ok(bytes),
                Err(pending) => self.reader.read_rest(pending).await,
            },
            Handle::Write(s) => s.read(offset, size).map(Bytes::from),
            Handle::Dir(_) => Err(FsError::IsDir),
            Handle::Gpu(cf) => Ok(Bytes::from(self.gpu.control.read(&cf, offset, size).await?)),
        }
    }

    /// A read of `size` bytes at `offset`, waiting for whatever it needs.
    pub async fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        match self.read_now(ino, fh, offset, size) {
            ReadNow::Ready(r) => r,
            ReadNow::Wait(w) => self.read_wait(w).await,
        }
    }

    /// Stages an existing file for writing: empty for `O_TRUNC`, else a copy of its published bytes.
    pub(crate) async fn open_staged(&self, path: &str, trunc: bool) -> FsResult<Arc<Staged>> {
        // Counted under the map's lock: a flusher retires only what no one opened.
        let open = {
            let m = lock(&self.writer.staged);
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
        let s = self.writer.new_staged(
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
                self.writer.drop_staged(&s).await;
                return Err(e);
            }
        }
        Ok(s)
    }
    /// Copy on write: the published bytes of `path` into the staged file, which no one else
    /// reads or writes until it is [`Staged::filled`]. Its length is set first, so a stat
    /// meanwhile shows the file's size.
    pub(crate) async fn copy_published(&self, path: &str, s: &Staged) -> FsResult<()> {
        let f = self.reader.resolve(path).await?;
        lock(&s.body).set_len(f.entry.size, &self.cfg.staging)?;
        for i in 0..f.entry.blocks.len() {
            let job = f.job(i)?;
            let data = self
                .reader
                .loader
                .block(&job, &f.route, self.reader.seed_hook(f.version))
                .await?;
            lock(&s.body).write_at(f.offsets[i], &data, &self.cfg.staging)?;
        }
        Ok(())
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
        if let Some(rest) = gpu_rest(&path) {
            if rest.is_empty() {
                return Err(FsError::Exists);
            }
            let (fh, cache) = self.gpu_open(rest, caller.pid, true).await?;
            self.gpu.made(rest, caller.uid, caller.gid);
            let mut attr = self.stat_path(&path).await?;
            attr.ino = self.inodes().lookup(&path);
            return Ok((attr, fh, cache));
        }
        check_key(&path)?;
        let s = match self.stat_path(&path).await {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::Exists),
            Ok(_) => self.open_staged(&path, flags & libc::O_TRUNC != 0).await?,
            Err(e) if e.is_not_found() => {
                let (owner, _) = self.owner_for(parent, caller).await?;
                let now = SystemTime::now();
                self.writer
                    .new_staged(&path, mode, owner, (now, now), true, true)?
            }
            Err(e) => return Err(e),
        };
        let ino = self.inodes().lookup(&path);
        let attr = s.attr(ino)?;
        Ok((
            attr,
            self.handles.insert(Handle::Write(s)),
            PageCache::Fresh,
        ))
    }
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_WRITE_SECONDS);
        match self.handles.get(fh)? {
            Handle::Write(s) => s.write(offset, data, &self.cfg.staging),
            Handle::Gpu(cf) => Ok(cf.write(offset, data)?),
            _ => Err(FsError::BadHandle),
        }
    }
    /// `fallocate(2)`: reserving space extends a file open for writing (its bytes are zeros
    /// until written); `FALLOC_FL_KEEP_SIZE` has nothing to do, the staging file being sparse;
    /// punching holes, collapsing and zeroing ranges are not supported.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let Handle::Write(s) = self.handles.get(fh)? else {
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
        if self.writer.writeback.on() {
            if let Ok(Handle::Write(s)) = self.handles.get(fh) {
                self.queue_publish(&s).await?;
            }
            return Ok(());
        }
        self.fsync(fh).await
    }
    /// `fsync`: publish what was written, write-back or not.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        match self.handles.get(fh) {
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
            self.writer.drop_staged(s).await;
        }
        r
    }
    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_RELEASE_SECONDS);
        let h = self.handles.remove(fh);
        match h {
            Some(Handle::Write(s)) => self.release_staged(&s).await,
            Some(Handle::Gpu(cf)) => {
                self.gpu_release(&cf);
                Ok(())
            }
            // Nothing to release for a handle of an earlier agent either.
            _ => Ok(()),
        }
    }
}
