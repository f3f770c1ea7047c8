//! `/kt/.gpu`: the GPU control files in the mount. `.gpu` is not listed at the root (like a
//! snapshot directory) but is always there; below it, each GPU key of the namespace is a control
//! file and the prefixes of GPU keys are directories. A publisher makes the directories of a
//! new key first (`mkdir -p`, as for any path): they are this mount's until a key below them is
//! published, and then everyone's. What a control file does on read, write, ioctl and poll is
//! `gpu::control`'s; this file maps paths and handles to it.

use std::sync::Arc;

use super::read::PageCache;
use super::{join, Attr, DirEntry, FsCore, FsError, FsResult, Handle, Kind};
use crate::gpu::control::{ControlFile, Waker};
use crate::gpu::CONTROL_DIR;
use crate::key::KeyPath;
use crate::locks::lock;

/// The key below `/.gpu` that `path` names: `Some("")` for `.gpu` itself.
pub(crate) fn gpu_rest(path: &str) -> Option<&str> {
    if path == CONTROL_DIR {
        Some("")
    } else {
        path.strip_prefix(CONTROL_DIR)?.strip_prefix('/')
    }
}

fn key_of(rest: &str) -> FsResult<KeyPath> {
    Ok(KeyPath::parse(rest)?)
}

impl FsCore {
    fn gpu_dir_attr(&self, ino: u64) -> Attr {
        Attr {
            ino,
            kind: Kind::Dir,
            size: 0,
            // Any process of the node (any user of a pod) may make a key's directories there.
            perm: 0o777,
            mtime: self.started,
            atime: self.started,
            ctime: self.started,
            nlink: 2,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            rdev: 0,
        }
    }

    fn gpu_file_attr(&self, ino: u64) -> Attr {
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
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            rdev: 0,
        }
    }

    /// What `stat` shows below `/.gpu`.
    pub(super) async fn gpu_stat(&self, path: &str, rest: &str) -> FsResult<Attr> {
        let ino = self.ino_of(path);
        if rest.is_empty() {
            return Ok(self.gpu_dir_attr(ino));
        }
        if lock(&self.gpu_files).get(rest).is_some_and(|n| *n > 0) {
            return Ok(self.gpu_file_attr(ino));
        }
        if self.gpu_local_dir(rest) {
            return Ok(self.gpu_dir_attr(ino));
        }
        let key = key_of(rest)?;
        if self.gpu.exists(&key).await? {
            return Ok(self.gpu_file_attr(ino));
        }
        if !self.gpu.list(Some(&key)).await?.is_empty() {
            return Ok(self.gpu_dir_attr(ino));
        }
        Err(FsError::NotFound)
    }

    /// Whether `rest` is a directory this mount made, or the parent of one, or of a control file
    /// open here.
    fn gpu_local_dir(&self, rest: &str) -> bool {
        let below = |p: &String| {
            p.len() > rest.len() && p.starts_with(rest) && p.as_bytes()[rest.len()] == b'/'
        };
        lock(&self.gpu_dirs).iter().any(|d| d == rest || below(d))
            || lock(&self.gpu_files).keys().any(below)
    }

    /// A directory below `/.gpu`, for `readdir`: the published GPU keys and their prefixes, and
    /// what this mount made or holds open there.
    pub(super) async fn gpu_snapshot(
        &self,
        path: &str,
        rest: &str,
    ) -> FsResult<Arc<Vec<DirEntry>>> {
        let prefix = if rest.is_empty() {
            None
        } else {
            Some(key_of(rest)?)
        };
        let mut found: std::collections::BTreeMap<String, bool> =
            self.gpu.list(prefix.as_ref()).await?.into_iter().collect();
        let strip = |p: &str| -> Option<String> {
            let rel = if rest.is_empty() {
                p
            } else {
                p.strip_prefix(rest)?.strip_prefix('/')?
            };
            Some(rel.to_string())
        };
        for d in lock(&self.gpu_dirs).iter() {
            if let Some(rel) = strip(d) {
                let top = rel.split('/').next().unwrap_or_default().to_string();
                found.insert(top, true);
            }
        }
        for f in lock(&self.gpu_files).keys() {
            if let Some(rel) = strip(f) {
                match rel.split_once('/') {
                    Some((dir, _)) => {
                        found.insert(dir.to_string(), true);
                    }
                    None => {
                        found.entry(rel).or_insert(false);
                    }
                }
            }
        }
        let entries = found
            .into_iter()
            .filter(|(name, _)| !name.is_empty())
            .map(|(name, dir)| DirEntry {
                ino: self.ino_of(&join(path, &name)),
                kind: if dir { Kind::Dir } else { Kind::File },
                name,
            })
            .collect();
        Ok(Arc::new(entries))
    }

    /// `mkdir` below `/.gpu`: a directory of this mount for keys to come.
    pub(super) async fn gpu_mkdir(&self, path: &str, rest: &str) -> FsResult<Attr> {
        key_of(rest)?;
        if self.gpu_stat(path, rest).await.is_ok() {
            return Err(FsError::Exists);
        }
        lock(&self.gpu_dirs).insert(rest.to_string());
        let mut a = self.gpu_dir_attr(0);
        a.ino = self.inodes().lookup(path);
        Ok(a)
    }

    /// `rmdir` below `/.gpu`: only a directory this mount made, with nothing below it.
    pub(super) async fn gpu_rmdir(&self, path: &str, rest: &str) -> FsResult<()> {
        if self.gpu_stat(path, rest).await?.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if !self.gpu_snapshot(path, rest).await?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        if !lock(&self.gpu_dirs).remove(rest) {
            return Err(FsError::NotPermitted);
        }
        Ok(())
    }

    /// Opens (or, with `create`, makes) the control file at `path`.
    pub(super) async fn gpu_open(
        &self,
        rest: &str,
        caller: u32,
        create: bool,
    ) -> FsResult<(u64, PageCache)> {
        let key = key_of(rest)?;
        if !create && !self.gpu.exists(&key).await? && !lock(&self.gpu_files).contains_key(rest) {
            return Err(FsError::NotFound);
        }
        *lock(&self.gpu_files).entry(rest.to_string()).or_default() += 1;
        let cf = self.gpu.open(key, caller);
        // Reads go to the control file, never to pages sized by a stat.
        Ok((self.insert_handle(Handle::Gpu(cf)), PageCache::Direct))
    }

    pub(super) fn gpu_release(&self, cf: &ControlFile) {
        self.gpu.release(cf);
        let mut open = lock(&self.gpu_files);
        let key = cf.key.to_string();
        if let Some(n) = open.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&key);
            }
        }
    }

    /// `unlink` below `/.gpu`: unpublishes the GPU key.
    pub(super) async fn gpu_unlink(&self, rest: &str) -> FsResult<()> {
        Ok(self.gpu.unpublish(&key_of(rest)?).await?)
    }

    /// An ioctl on an open control file: the call's return value and the bytes copied out.
    pub async fn ioctl(&self, fh: u64, cmd: u32, data: &[u8]) -> FsResult<(i32, Vec<u8>)> {
        match self.handle(fh)? {
            Handle::Gpu(cf) => Ok(self.gpu.ioctl(&cf, cmd, data).await?),
            // Not a terminal, nor anything else with ioctls.
            _ => Err(FsError::NoIoctl),
        }
    }

    /// poll(2) on an open file: whether it is readable now. A control file is, once its latest
    /// transfer finished; if it has not, `waker` is called when it does. Other files always are.
    pub fn poll(&self, fh: u64, waker: Option<Waker>) -> FsResult<bool> {
        match self.handle(fh)? {
            Handle::Gpu(cf) => Ok(cf.poll(waker)),
            _ => Ok(true),
        }
    }
}
