//! The write side of the mount: staging, publish-on-close, and metadata operations.
//!
//! A file opened for writing is staged in a local file (a new file starts empty; an existing one
//! is copied on write from its published blocks). `close` (the kernel's `flush`) and `fsync`
//! publish it: hash, upload what the store lacks (`locale=store`) or register the staged file as
//! an in-place source (`locale=local`), then swap the key to the new version. The close returns
//! only after that, so a reader that opens afterwards sees the new version. The locale comes
//! from the nearest directory with a `user.kt.locale` xattr, else the mount's default. A file
//! published in place is never modified again: a later write copies it first.
//!
//! Directory operations (mkdir, unlink, rmdir, rename, chmod, utimens, symlink) are metadata
//! operations on the store server, applied atomically there.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;

use super::{join, split, Attr, FsCore, FsError, FsResult, Kind};
use crate::agent::CF_XATTR;
use crate::hash::BlockHash;
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{
    InlineBlock, LocalFile, Locale, MissingBlocksRequest, PublishRequest, RemoveRequest,
    RenameRequest, SetAttrRequest,
};
use crate::transfer::{self, UploadJob};

pub const LOCALE_XATTR: &str = "user.kt.locale";
/// Files up to this size go to the store inside their publish (`PublishRequest.inline_blocks`):
/// for a small file, asking which blocks are missing and uploading on the data plane cost two
/// more round trips than the bytes themselves.
const INLINE_MAX: u64 = crate::server::MAX_INLINE_FILE as u64;

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

struct StagedFile {
    file: File,
    disk: PathBuf,
    /// Published in place: its bytes are being served and must not change.
    in_place: bool,
}

/// A file open for writing on this node.
pub struct Staged {
    path: Mutex<String>,
    file: Mutex<StagedFile>,
    pub(crate) opens: AtomicUsize,
    /// Changes made so far, and how many of them the last publish took in. A publish may run
    /// while writes go on (a FLUSH comes whenever any copy of the descriptor is closed, e.g. by
    /// a forked child at exec), so "dirty" is a count, never a flag that a publish clears.
    changes: AtomicU64,
    published: AtomicU64,
    unlinked: AtomicBool,
    mode: AtomicU32,
    mtime: Mutex<SystemTime>,
    publish_lock: Mutex<()>,
}

fn lock_err() -> FsError {
    FsError::new(libc::EIO)
}

fn to_unix(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(_) => (0, 0),
    }
}

impl Staged {
    fn path(&self) -> String {
        self.path.lock().map(|p| p.clone()).unwrap_or_default()
    }

    pub(crate) fn attr(&self, ino: u64, uid: u32, gid: u32) -> FsResult<Attr> {
        let size = self
            .file
            .lock()
            .map_err(|_| lock_err())?
            .file
            .metadata()?
            .len();
        Ok(Attr {
            ino,
            kind: Kind::File,
            size,
            perm: self.mode.load(Ordering::Relaxed) as u16,
            mtime: self.mtime.lock().map(|t| *t).unwrap_or(UNIX_EPOCH),
            nlink: 1,
            uid,
            gid,
        })
    }

    pub(crate) fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let f = self.file.lock().map_err(|_| lock_err())?;
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            let k = f.file.read_at(&mut buf[n..], offset + n as u64)?;
            if k == 0 {
                break;
            }
            n += k;
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// Makes the staged file writable again after it was published in place.
    fn unshare(&self, f: &mut StagedFile, staging: &std::path::Path) -> FsResult<()> {
        if !f.in_place {
            return Ok(());
        }
        let (mut file, disk) = new_staging_file(staging)?;
        let mut src = File::open(&f.disk)?;
        std::io::copy(&mut src, &mut file)?;
        *f = StagedFile {
            file,
            disk,
            in_place: false,
        };
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], staging: &std::path::Path) -> FsResult<u32> {
        let mut f = self.file.lock().map_err(|_| lock_err())?;
        self.unshare(&mut f, staging)?;
        f.file.write_all_at(data, offset)?;
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut t) = self.mtime.lock() {
            *t = SystemTime::now();
        }
        Ok(data.len() as u32)
    }

    /// Whether something changed since the last publish took its snapshot.
    fn dirty(&self) -> bool {
        self.changes.load(Ordering::SeqCst) != self.published.load(Ordering::SeqCst)
    }

    fn truncate(&self, size: u64, staging: &std::path::Path) -> FsResult<()> {
        let mut f = self.file.lock().map_err(|_| lock_err())?;
        self.unshare(&mut f, staging)?;
        f.file.set_len(size)?;
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut t) = self.mtime.lock() {
            *t = SystemTime::now();
        }
        Ok(())
    }
}

fn new_staging_file(staging: &std::path::Path) -> FsResult<(File, PathBuf)> {
    let n = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let disk = staging.join(format!("{}-{t}-{n}", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&disk)?;
    Ok((file, disk))
}

impl FsCore {
    fn writable(&self) -> FsResult<()> {
        if self.cfg.read_only {
            Err(FsError::new(libc::EROFS))
        } else {
            Ok(())
        }
    }

    pub(crate) fn staged_at(&self, path: &str) -> Option<Arc<Staged>> {
        let s = self.staged.lock().ok()?.get(path).cloned()?;
        (!s.unlinked.load(Ordering::SeqCst)).then_some(s)
    }

    pub(crate) fn staged_paths(&self) -> Vec<String> {
        self.staged
            .lock()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn new_staged(
        &self,
        path: &str,
        mode: u32,
        mtime: SystemTime,
        dirty: bool,
    ) -> FsResult<Arc<Staged>> {
        let (file, disk) = new_staging_file(&self.cfg.staging)?;
        let s = Arc::new(Staged {
            path: Mutex::new(path.to_string()),
            file: Mutex::new(StagedFile {
                file,
                disk,
                in_place: false,
            }),
            opens: AtomicUsize::new(1),
            changes: AtomicU64::new(u64::from(dirty)),
            published: AtomicU64::new(0),
            unlinked: AtomicBool::new(false),
            mode: AtomicU32::new(mode & 0o7777),
            mtime: Mutex::new(mtime),
            publish_lock: Mutex::new(()),
        });
        self.staged
            .lock()
            .map_err(|_| lock_err())?
            .insert(path.to_string(), s.clone());
        Ok(s)
    }

    /// Stages an existing file for writing: empty for `O_TRUNC`, else a copy of its published bytes.
    pub(crate) fn open_staged(&self, path: &str, trunc: bool) -> FsResult<Arc<Staged>> {
        if let Some(s) = self.staged_at(path) {
            s.opens.fetch_add(1, Ordering::SeqCst);
            if trunc {
                s.truncate(0, &self.cfg.staging)?;
            }
            return Ok(s);
        }
        let attr = self.stat_path(path)?;
        match attr.kind {
            Kind::File => {}
            Kind::Dir => return Err(FsError::new(libc::EISDIR)),
            Kind::Symlink => return Err(FsError::new(libc::ELOOP)),
        }
        let s = self.new_staged(path, u32::from(attr.perm), attr.mtime, trunc)?;
        if !trunc && attr.size > 0 {
            if let Err(e) = self.copy_published(path, &s) {
                self.drop_staged(&s);
                return Err(e);
            }
        }
        Ok(s)
    }

    /// Copy on write: the published bytes of `path` into the staged file.
    fn copy_published(&self, path: &str, s: &Staged) -> FsResult<()> {
        let f = self.resolve_file(path)?;
        let staged = s.file.lock().map_err(|_| lock_err())?;
        for i in 0..f.entry.blocks.len() {
            let job = Self::job(&f, i)?;
            let data = self.block_on(self.loader.block(
                &job,
                &f.sources,
                self.seed_hook(f.version),
            ))?;
            crate::filewrite::write_all_at(&staged.file, &data, f.offsets[i])?;
        }
        Ok(())
    }

    fn drop_staged(&self, s: &Arc<Staged>) {
        let path = s.path();
        if let Ok(mut m) = self.staged.lock() {
            if m.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                m.remove(&path);
            }
        }
        if let Ok(f) = s.file.lock() {
            if !f.in_place {
                let _ = std::fs::remove_file(&f.disk);
            }
        }
    }

    pub fn create(&self, parent: u64, name: &str, mode: u32, flags: i32) -> FsResult<(Attr, u64)> {
        self.writable()?;
        let path = join(&self.path_of(parent)?, name);
        Self::check_key(&path)?;
        let s = match self.stat_path(&path) {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::new(libc::EEXIST)),
            Ok(_) => self.open_staged(&path, flags & libc::O_TRUNC != 0)?,
            Err(e) if e.errno() == libc::ENOENT => {
                self.new_staged(&path, mode, SystemTime::now(), true)?
            }
            Err(e) => return Err(e),
        };
        let ino = self.inodes.lock().map_err(|_| lock_err())?.lookup(&path);
        let attr = s.attr(ino, self.cfg.uid, self.cfg.gid)?;
        Ok((attr, self.insert_handle(super::Handle::Write(s))))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        match self.handle(fh)? {
            super::Handle::Write(s) => s.write(offset, data, &self.cfg.staging),
            _ => Err(FsError::new(libc::EBADF)),
        }
    }

    /// `close` and `fsync`: publish what was written.
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        match self.handle(fh) {
            Ok(super::Handle::Write(s)) => self.publish_staged(&s),
            // A reader's handle from an earlier agent: closing it is fine.
            Err(e) if e.errno() == libc::EBADF => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }

    pub(crate) fn release_staged(&self, s: &Arc<Staged>) -> FsResult<()> {
        if s.opens.fetch_sub(1, Ordering::SeqCst) > 1 {
            return Ok(());
        }
        let r = self.publish_staged(s);
        self.drop_staged(s);
        r
    }

    fn locale_for(&self, path: &str) -> Locale {
        let mut cur = Some(split(path).0);
        while let Some(dir) = cur {
            if let Ok(Some(v)) = self.blocks.db().get(CF_XATTR, &self.xattr_key(dir)) {
                match v.as_slice() {
                    b"local" => return Locale::Local,
                    b"store" => return Locale::Store,
                    _ => {}
                }
            }
            cur = if dir.is_empty() {
                None
            } else {
                Some(split(dir).0)
            };
        }
        self.cfg.locale
    }

    fn xattr_key(&self, path: &str) -> Vec<u8> {
        format!("{}\0{path}", self.cfg.namespace).into_bytes()
    }

    fn publish_staged(&self, s: &Arc<Staged>) -> FsResult<()> {
        let _guard = s.publish_lock.lock().map_err(|_| lock_err())?;
        if !s.dirty() || s.unlinked.load(Ordering::SeqCst) {
            return Ok(());
        }
        let path = s.path();
        let locale = self.locale_for(&path);
        let (disk, len, changes) = {
            let mut f = s.file.lock().map_err(|_| lock_err())?;
            // Writes hold this lock: the count and the length agree.
            let changes = s.changes.load(Ordering::SeqCst);
            if locale == Locale::Local {
                // Served in place from now on: it must survive a crash of this node.
                f.file.sync_data()?;
                f.in_place = true;
            }
            (f.disk.clone(), f.file.metadata()?.len(), changes)
        };
        let mut buf = vec![0u8; manifest::DEFAULT_BLOCK_SIZE.min(len.max(1) as u32) as usize];
        let (size, blocks) = crate::scan::hash_file(&disk, &mut buf)
            .map_err(|e| FsError::Io(libc::EIO, e.to_string()))?;
        let (mtime_sec, mtime_nsec) = to_unix(s.mtime.lock().map(|t| *t).unwrap_or(UNIX_EPOCH));
        let m = Manifest {
            block_size: manifest::DEFAULT_BLOCK_SIZE,
            entries: vec![FileEntry {
                path: String::new(),
                kind: EntryKind::File as i32,
                mode: s.mode.load(Ordering::Relaxed),
                size,
                mtime_sec,
                mtime_nsec,
                blocks,
                symlink_target: String::new(),
            }],
        };
        let mut store = self.store();
        let mut inline_blocks = Vec::new();
        if locale == Locale::Store {
            match &m.entries[0].blocks[..] {
                // Already read whole into `buf`: sent with the publish, one round trip.
                [b] if size <= INLINE_MAX && u64::from(b.len) == size => {
                    inline_blocks.push(InlineBlock {
                        hash: b.hash.clone(),
                        data: buf[..size as usize].to_vec(),
                    });
                }
                _ => self.upload(&m, &disk)?,
            }
        } else {
            let files = [LocalFile {
                entry_path: String::new(),
                disk_path: disk.display().to_string(),
            }];
            self.blocks.register(&m, &files).map_err(FsError::from)?;
        }
        self.block_on(store.publish(PublishRequest {
            namespace: self.ns(),
            key: path.clone(),
            manifest: Some(m),
            locale: locale as i32,
            origin_node: self.cfg.node_id.clone(),
            ttl_secs: 0,
            force: true,
            inline_blocks,
        }))?;
        s.published.fetch_max(changes, Ordering::SeqCst);
        self.invalidate(&[split(&path).0, &path]);
        Ok(())
    }

    /// Uploads the blocks of `m` that the store lacks, read from `disk`.
    fn upload(&self, m: &Manifest, disk: &std::path::Path) -> FsResult<()> {
        let entry = &m.entries[0];
        let disk = Arc::new(disk.to_path_buf());
        let mut seen = HashSet::new();
        let mut jobs = Vec::new();
        let mut off = 0u64;
        for b in &entry.blocks {
            if let Some(hash) = BlockHash::from_slice(&b.hash) {
                if seen.insert(hash) {
                    jobs.push(UploadJob {
                        hash,
                        len: b.len,
                        path: disk.clone(),
                        offset: off,
                    });
                }
            }
            off += u64::from(b.len);
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let mut store = self.store();
        self.block_on(async {
            let missing = store
                .missing_blocks(MissingBlocksRequest {
                    hashes: jobs.iter().map(|j| j.hash.0.to_vec()).collect(),
                })
                .await?
                .into_inner()
                .hashes;
            let missing: HashSet<Vec<u8>> = missing.into_iter().collect();
            let todo: Vec<UploadJob> = jobs
                .into_iter()
                .filter(|j| missing.contains(j.hash.0.as_slice()))
                .collect();
            transfer::upload(&self.cfg.server, todo, &ProgressBar::hidden()).await?;
            Ok::<(), FsError>(())
        })
    }

    /// Publishes a manifest with no blocks (a directory or a symlink) at `path`.
    fn publish_meta(&self, path: &str, entry: FileEntry) -> FsResult<()> {
        let mut store = self.store();
        self.block_on(store.publish(PublishRequest {
            namespace: self.ns(),
            key: path.to_string(),
            manifest: Some(Manifest {
                block_size: manifest::DEFAULT_BLOCK_SIZE,
                entries: vec![entry],
            }),
            locale: Locale::Store as i32,
            origin_node: String::new(),
            ttl_secs: 0,
            force: false,
            inline_blocks: Vec::new(),
        }))?;
        self.invalidate(&[split(path).0, path]);
        Ok(())
    }

    fn new_entry_path(&self, parent: u64, name: &str) -> FsResult<String> {
        self.writable()?;
        let path = join(&self.path_of(parent)?, name);
        Self::check_key(&path)?;
        match self.stat_path(&path) {
            Ok(_) => Err(FsError::new(libc::EEXIST)),
            Err(e) if e.errno() == libc::ENOENT => Ok(path),
            Err(e) => Err(e),
        }
    }

    fn lookup_new(&self, path: &str) -> FsResult<Attr> {
        let mut a = self.stat_path(path)?;
        a.ino = self.inodes.lock().map_err(|_| lock_err())?.lookup(path);
        Ok(a)
    }

    pub fn mkdir(&self, parent: u64, name: &str, mode: u32) -> FsResult<Attr> {
        let path = self.new_entry_path(parent, name)?;
        let (mtime_sec, mtime_nsec) = to_unix(SystemTime::now());
        self.publish_meta(
            &path,
            FileEntry {
                kind: EntryKind::Directory as i32,
                mode: mode & 0o7777,
                mtime_sec,
                mtime_nsec,
                ..Default::default()
            },
        )?;
        self.lookup_new(&path)
    }

    pub fn symlink(&self, parent: u64, name: &str, target: &str) -> FsResult<Attr> {
        let path = self.new_entry_path(parent, name)?;
        let (mtime_sec, mtime_nsec) = to_unix(SystemTime::now());
        self.publish_meta(
            &path,
            FileEntry {
                kind: EntryKind::Symlink as i32,
                mode: 0o777,
                mtime_sec,
                mtime_nsec,
                symlink_target: target.to_string(),
                ..Default::default()
            },
        )?;
        self.lookup_new(&path)
    }

    fn remove(&self, path: &str, want_dir: bool) -> FsResult<()> {
        self.writable()?;
        let staged = self.staged_at(path);
        let attr = self.stat_path(path)?;
        match (want_dir, attr.kind == Kind::Dir) {
            (true, false) => return Err(FsError::new(libc::ENOTDIR)),
            (false, true) => return Err(FsError::new(libc::EISDIR)),
            _ => {}
        }
        if let Some(s) = &staged {
            s.unlinked.store(true, Ordering::SeqCst);
            if let Ok(mut m) = self.staged.lock() {
                m.remove(path);
            }
        }
        let mut store = self.store();
        let r = self.block_on(store.remove(RemoveRequest {
            namespace: self.ns(),
            key: path.to_string(),
            recursive: false,
            prefix: false,
        }));
        self.invalidate(&[split(path).0, path]);
        match r {
            Ok(_) => Ok(()),
            // A file that was created but never published has nothing to remove on the server.
            Err(e) if staged.is_some() && e.code() == tonic::Code::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        self.remove(&join(&self.path_of(parent)?, name), false)
    }

    pub fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        self.remove(&join(&self.path_of(parent)?, name), true)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        if flags & libc::RENAME_EXCHANGE != 0 || flags & libc::RENAME_WHITEOUT != 0 {
            return Err(FsError::new(libc::EINVAL));
        }
        let from = join(&self.path_of(parent)?, name);
        let to = join(&self.path_of(newparent)?, newname);
        Self::check_key(&to)?;
        // A file still being written is published first, so the move carries its bytes.
        if let Some(s) = self.staged_at(&from) {
            self.publish_staged(&s)?;
        }
        let mut store = self.store();
        self.block_on(store.rename(RenameRequest {
            namespace: self.ns(),
            from: from.clone(),
            to: to.clone(),
            no_replace: flags & libc::RENAME_NOREPLACE != 0,
        }))?;
        if let Ok(mut m) = self.staged.lock() {
            if let Some(s) = m.remove(&from) {
                if let Ok(mut p) = s.path.lock() {
                    *p = to.clone();
                }
                m.insert(to.clone(), s);
            }
        }
        if let Ok(mut t) = self.inodes.lock() {
            t.rename(&from, &to);
        }
        self.invalidate(&[split(&from).0, split(&to).0, &from, &to]);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime: Option<SystemTime>,
        fh: Option<u64>,
    ) -> FsResult<Attr> {
        let path = self.path_of(ino)?;
        if mode.is_none() && uid.is_none() && gid.is_none() && size.is_none() && mtime.is_none() {
            return self.getattr(ino);
        }
        self.writable()?;
        if uid.is_some_and(|u| u != self.cfg.uid) || gid.is_some_and(|g| g != self.cfg.gid) {
            return Err(FsError::new(libc::EPERM));
        }
        let staged = match fh.map(|f| self.handle(f)) {
            Some(Ok(super::Handle::Write(s))) => Some(s),
            _ => self.staged_at(&path),
        };
        if let Some(size) = size {
            match &staged {
                Some(s) => s.truncate(size, &self.cfg.staging)?,
                None => {
                    let s = self.open_staged(&path, size == 0)?;
                    let r = s
                        .truncate(size, &self.cfg.staging)
                        .and_then(|_| self.release_staged(&s));
                    r?;
                }
            }
        }
        if mode.is_some() || mtime.is_some() {
            match &staged {
                Some(s) => {
                    if let Some(m) = mode {
                        s.mode.store(m & 0o7777, Ordering::Relaxed);
                    }
                    if let (Some(t), Ok(mut mt)) = (mtime, s.mtime.lock()) {
                        *mt = t;
                    }
                    s.changes.fetch_add(1, Ordering::SeqCst);
                }
                None => {
                    let (sec, nsec) = mtime.map(to_unix).unzip();
                    let mut store = self.store();
                    self.block_on(store.set_attr(SetAttrRequest {
                        namespace: self.ns(),
                        key: path.clone(),
                        mode,
                        mtime_sec: sec,
                        mtime_nsec: nsec.unwrap_or(0),
                    }))?;
                    self.invalidate(&[split(&path).0, &path]);
                }
            }
        }
        self.getattr(ino)
    }

    pub fn setxattr(&self, ino: u64, name: &str, value: &[u8]) -> FsResult<()> {
        if name != LOCALE_XATTR {
            return Err(FsError::new(libc::ENOTSUP));
        }
        self.writable()?;
        let path = self.path_of(ino)?;
        if self.stat_path(&path)?.kind != Kind::Dir {
            return Err(FsError::Io(
                libc::EINVAL,
                format!("{LOCALE_XATTR} applies to directories"),
            ));
        }
        let v = std::str::from_utf8(value).map(str::trim).unwrap_or("");
        if v != "store" && v != "local" {
            return Err(FsError::Io(
                libc::EINVAL,
                format!("{LOCALE_XATTR} must be store or local"),
            ));
        }
        self.blocks
            .db()
            .put(CF_XATTR, &self.xattr_key(&path), v.as_bytes())
            .map_err(|e| FsError::Io(libc::EIO, e.to_string()))
    }

    pub fn getxattr(&self, ino: u64, name: &str) -> FsResult<Vec<u8>> {
        let path = self.path_of(ino)?;
        if name != LOCALE_XATTR {
            return Err(FsError::new(libc::ENODATA));
        }
        self.blocks
            .db()
            .get(CF_XATTR, &self.xattr_key(&path))
            .map_err(|e| FsError::Io(libc::EIO, e.to_string()))?
            .ok_or_else(|| FsError::new(libc::ENODATA))
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<u8>> {
        match self.getxattr(ino, LOCALE_XATTR) {
            Ok(_) => Ok(format!("{LOCALE_XATTR}\0").into_bytes()),
            Err(e) if e.errno() == libc::ENODATA => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    pub fn removexattr(&self, ino: u64, name: &str) -> FsResult<()> {
        self.writable()?;
        self.getxattr(ino, name)?;
        let path = self.path_of(ino)?;
        self.blocks
            .db()
            .delete(CF_XATTR, &self.xattr_key(&path))
            .map_err(|e| FsError::Io(libc::EIO, e.to_string()))
    }
}

impl FsCore {
    /// Publishes every file still open for writing (at unmount).
    pub fn flush_all(&self) {
        let all: Vec<Arc<Staged>> = self
            .staged
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for s in all {
            if let Err(e) = self.publish_staged(&s) {
                tracing::error!(path = %s.path(), error = %e, "could not publish a file open at unmount");
            }
        }
    }
}
