//! `/kt/.gpu` as the kernel sees it: stat, listing, mkdir and rmdir below it, and a control
//! file's open, close, unlink, ioctl and poll (see `gpu_tree`).

use std::sync::Arc;

use crate::fs::attr::{Attr, DirEntry, Kind};
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::FsCore;
use crate::fs::gpu_tree::key_of;
use crate::fs::handles::Handle;
use crate::fs::paths::join;
use crate::fs::read::file::PageCache;
use crate::gpu::control::{ControlFile, Waker};
use crate::locks::lock;

impl FsCore {
    /// What `stat` shows below `/.gpu`.
    pub(crate) async fn gpu_stat(&self, path: &str, rest: &str) -> FsResult<Attr> {
        let ino = self.ino_of(path);
        if rest.is_empty() {
            return Ok(self.gpu.dir_attr(ino));
        }
        if self.gpu.is_open(rest) {
            return Ok(self.gpu.file_attr(ino, rest));
        }
        if self.gpu.local_dir(rest) {
            return Ok(self.gpu.dir_attr(ino));
        }
        let key = key_of(rest)?;
        if self.gpu.control.exists(&key).await? {
            return Ok(self.gpu.file_attr(ino, rest));
        }
        if !self.gpu.control.list(Some(&key)).await?.is_empty() {
            return Ok(self.gpu.dir_attr(ino));
        }
        Err(FsError::NotFound)
    }

    /// A directory below `/.gpu`, for `readdir`: the published GPU keys and their prefixes, and
    /// what this mount made or holds open there.
    pub(crate) async fn gpu_snapshot(
        &self,
        path: &str,
        rest: &str,
    ) -> FsResult<Arc<Vec<DirEntry>>> {
        let prefix = if rest.is_empty() {
            None
        } else {
            Some(key_of(rest)?)
        };
        let mut found: std::collections::BTreeMap<String, bool> = self
            .gpu
            .control
            .list(prefix.as_ref())
            .await?
            .into_iter()
            .collect();
        let strip = |p: &str| -> Option<String> {
            let rel = if rest.is_empty() {
                p
            } else {
                p.strip_prefix(rest)?.strip_prefix('/')?
            };
            Some(rel.to_string())
        };
        for d in lock(&self.gpu.dirs).iter() {
            if let Some(rel) = strip(d) {
                let top = rel.split('/').next().unwrap_or_default().to_string();
                found.insert(top, true);
            }
        }
        for f in lock(&self.gpu.files).keys() {
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
    pub(crate) async fn gpu_mkdir(&self, path: &str, rest: &str) -> FsResult<Attr> {
        key_of(rest)?;
        if self.gpu_stat(path, rest).await.is_ok() {
            return Err(FsError::Exists);
        }
        lock(&self.gpu.dirs).insert(rest.to_string());
        let mut a = self.gpu.dir_attr(0);
        a.ino = self.inodes().lookup(path);
        Ok(a)
    }

    /// `rmdir` below `/.gpu`: only a directory this mount made, with nothing below it.
    pub(crate) async fn gpu_rmdir(&self, path: &str, rest: &str) -> FsResult<()> {
        if self.gpu_stat(path, rest).await?.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if !self.gpu_snapshot(path, rest).await?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        if !lock(&self.gpu.dirs).remove(rest) {
            return Err(FsError::NotPermitted);
        }
        Ok(())
    }

    /// Opens (or, with `create`, makes) the control file at `path`.
    pub(crate) async fn gpu_open(
        &self,
        rest: &str,
        caller: u32,
        create: bool,
    ) -> FsResult<(u64, PageCache)> {
        let key = key_of(rest)?;
        if !create
            && !self.gpu.control.exists(&key).await?
            && !lock(&self.gpu.files).contains_key(rest)
        {
            return Err(FsError::NotFound);
        }
        self.gpu.opened(rest);
        let cf = self.gpu.control.open(key, caller);
        // Reads go to the control file, never to pages sized by a stat.
        Ok((self.handles.insert(Handle::Gpu(cf)), PageCache::Direct))
    }

    pub(crate) fn gpu_release(&self, cf: &ControlFile) {
        self.gpu.control.release(cf);
        self.gpu.closed(cf.key.as_str());
    }

    /// `unlink` below `/.gpu`: unpublishes the GPU key (the kernel let only its owner, or
    /// root, get here: the directories are sticky).
    pub(crate) async fn gpu_unlink(&self, rest: &str) -> FsResult<()> {
        self.gpu.control.unpublish(&key_of(rest)?).await?;
        self.gpu.unlinked(rest);
        Ok(())
    }

    /// An ioctl on an open control file: the call's return value and the bytes copied out.
    pub async fn ioctl(&self, fh: u64, cmd: u32, data: &[u8]) -> FsResult<(i32, Vec<u8>)> {
        match self.handles.get(fh)? {
            Handle::Gpu(cf) => Ok(self.gpu.control.ioctl(&cf, cmd, data).await?),
            // Not a terminal, nor anything else with ioctls.
            _ => Err(FsError::NoIoctl),
        }
    }

    /// poll(2) on an open file: whether it is readable now. A control file is, once its latest
    /// transfer finished; if it has not, `waker` is called when it does. Other files always are.
    pub fn poll(&self, fh: u64, waker: Option<Waker>) -> FsResult<bool> {
        match self.handles.get(fh)? {
            Handle::Gpu(cf) => Ok(cf.poll(waker)),
            _ => Ok(true),
        }
    }
}
