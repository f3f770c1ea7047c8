//! Metadata operations: mkdir, symlink, unlink, rmdir, rename, setattr. Each is one change on
//! the store server, applied atomically there; a file still being written here takes part as
//! its staged copy.
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use crate::fs::attr::{to_unix, Attr, Caller, Kind};
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::{FsCore, Orphan};
use crate::fs::handles::Handle;
use crate::fs::paths::{check_key, gpu_rest, split, under};
use crate::fs::write::staged::Staged;
use crate::locks::lock;
use crate::manifest::{EntryKind, FileEntry};
use crate::proto::{ExchangeRequest, LinkRequest, RemoveRequest, RenameRequest, SetAttrRequest};

impl FsCore {
    async fn new_entry_path(&self, parent: u64, name: &str) -> FsResult<String> {
        self.writable()?;
        let path = self.child(parent, name).await?;
        check_key(&path)?;
        match self.stat_path(&path).await {
            Ok(_) => Err(FsError::Exists),
            Err(e) if e.is_not_found() => Ok(path),
            Err(e) => Err(e),
        }
    }
    async fn lookup_new(&self, path: &str) -> FsResult<Attr> {
        let mut a = self.stat_path(path).await?;
        a.ino = self.inodes().lookup(path);
        Ok(a)
    }
    pub async fn mkdir(&self, parent: u64, name: &str, mode: u32) -> FsResult<Attr> {
        let me = Caller {
            pid: std::process::id(),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
        };
        self.mkdir_by(parent, name, mode, me).await
    }
    /// [`FsCore::mkdir`] for `caller`, who owns the new directory.
    pub async fn mkdir_by(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        let gpu = self.child(parent, name).await?;
        if let Some(rest) = gpu_rest(&gpu) {
            self.writable()?;
            return self.gpu_mkdir(&gpu, rest).await;
        }
        let path = self.new_entry_path(parent, name).await?;
        let ((uid, gid), sgid) = self.owner_for(parent, caller).await?;
        let (mtime_sec, mtime_nsec) = to_unix(SystemTime::now());
        self.publish_meta(
            &path,
            FileEntry {
                kind: EntryKind::Directory as i32,
                mode: (mode & 0o7777) | if sgid { 0o2000 } else { 0 },
                mtime_sec,
                mtime_nsec,
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            },
        )
        .await?;
        self.lookup_new(&path).await
    }
    pub async fn symlink(&self, parent: u64, name: &str, target: &str) -> FsResult<Attr> {
        let me = Caller {
            pid: std::process::id(),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
        };
        self.symlink_by(parent, name, target, me).await
    }
    /// [`FsCore::symlink`] for `caller`, who owns the link.
    pub async fn symlink_by(
        &self,
        parent: u64,
        name: &str,
        target: &str,
        caller: Caller,
    ) -> FsResult<Attr> {
        let path = self.new_entry_path(parent, name).await?;
        let ((uid, gid), _) = self.owner_for(parent, caller).await?;
        let (mtime_sec, mtime_nsec) = to_unix(SystemTime::now());
        self.publish_meta(
            &path,
            FileEntry {
                kind: EntryKind::Symlink as i32,
                mode: 0o777,
                mtime_sec,
                mtime_nsec,
                symlink_target: target.to_string(),
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            },
        )
        .await?;
        self.lookup_new(&path).await
    }
    /// A special file (fifo, socket, character or block node) for `caller`: an entry of
    /// metadata alone, which lists, stats, renames and unlinks as a file does. A regular
    /// `mode` makes an empty file.
    pub async fn mknod_by(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => {
                let (attr, fh, _) = self
                    .create_by(
                        parent,
                        name,
                        mode & 0o7777,
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        caller,
                    )
                    .await?;
                self.release(fh).await?;
                return Ok(attr);
            }
            libc::S_IFIFO => EntryKind::Fifo,
            libc::S_IFSOCK => EntryKind::Socket,
            libc::S_IFCHR => EntryKind::CharDevice,
            libc::S_IFBLK => EntryKind::BlockDevice,
            _ => {
                return Err(FsError::Invalid(format!(
                    "mknod of file type {:o}",
                    mode & libc::S_IFMT
                )))
            }
        };
        let path = self.new_entry_path(parent, name).await?;
        if gpu_rest(&path).is_some() {
            return Err(FsError::NotPermitted);
        }
        let ((uid, gid), _) = self.owner_for(parent, caller).await?;
        let (mtime_sec, mtime_nsec) = to_unix(SystemTime::now());
        let device = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice);
        self.publish_meta(
            &path,
            FileEntry {
                kind: kind as i32,
                mode: mode & 0o7777,
                mtime_sec,
                mtime_nsec,
                rdev: if device { u64::from(rdev) } else { 0 },
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            },
        )
        .await?;
        self.lookup_new(&path).await
    }
    async fn remove(&self, path: &str, want_dir: bool) -> FsResult<()> {
        self.writable()?;
        if let Some(rest) = gpu_rest(path) {
            return match (want_dir, rest.is_empty()) {
                (_, true) => Err(FsError::NotPermitted),
                (true, false) => self.gpu_rmdir(path, rest).await,
                (false, false) => self.gpu_unlink(rest).await,
            };
        }
        if want_dir {
            // Files queued below it are on the server first, which then finds it not empty.
            self.publish_below(path).await?;
        }
        let staged = self.writer.staged_at(path);
        let attr = self.stat_path(path).await?;
        match (want_dir, attr.kind == Kind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            _ => {}
        }
        if let Some(s) = &staged {
            {
                // After a publish in flight, never before: the removal below must follow it.
                let _guard = s.publish_lock.lock().await;
                s.unlinked.store(true, Ordering::SeqCst);
            }
            lock(&self.writer.staged).remove(path);
            self.retire(s).await;
        }
        if !want_dir {
            let orphan = match &staged {
                Some(s) => Orphan::Staged(s.clone()),
                None => Orphan::Published(attr.clone()),
            };
            lock(&self.orphans).insert(self.ino_of(path), orphan);
        }
        let store = self.store();
        let r = store
            .remove(RemoveRequest {
                namespace: self.ns(),
                key: path.to_string(),
                recursive: false,
                prefix: false,
                gpu_registration: 0,
                // The kernel holds the directory for this call: being told of it would make
                // the watch wait to have the kernel forget the name (see KernelCache).
                watcher: self.listings.watcher(),
            })
            .await;
        self.invalidate(&[split(path).0, path]);
        if want_dir {
            self.invalidate_links(&[split(path).0, path]);
        }
        match r {
            Ok(_) => Ok(()),
            // A file that was created but never published has nothing to remove on the server.
            Err(e) if staged.is_some() && e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        let path = self.child(parent, name).await?;
        self.remove(&path, false).await?;
        self.invalidate_other_names(&path);
        self.inodes().unlinked(&path);
        Ok(())
    }
    /// A second name `newname` in `newparent` for the file `ino` (a hard link): one file that
    /// both names show on every node, with the kernel's inode shared too.
    pub async fn link(&self, ino: u64, newparent: u64, newname: &str) -> FsResult<Attr> {
        self.writable()?;
        let from = self.path_of(ino).await?;
        let to = self.new_entry_path(newparent, newname).await?;
        if gpu_rest(&from).is_some() || gpu_rest(&to).is_some() {
            return Err(FsError::NotPermitted);
        }
        if self.stat_path(&from).await?.kind == Kind::Dir {
            return Err(FsError::NotPermitted);
        }
        // A file still being written is published first, so both names hold its bytes.
        if let Some(s) = self.writer.staged_at(&from) {
            self.publish_staged(&s).await?;
        }
        let store = self.store();
        store
            .link(LinkRequest {
                namespace: self.ns(),
                from: from.clone(),
                to: to.clone(),
                watcher: self.listings.watcher(),
            })
            .await?;
        self.invalidate(&[split(&from).0, split(&to).0, &from, &to]);
        // Every name's link count moved.
        self.invalidate_other_names(&from);
        self.inodes().link(ino, &to);
        let mut a = self.stat_path(&to).await?;
        a.ino = ino;
        Ok(a)
    }
    pub async fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        self.remove(&self.child(parent, name).await?, true).await
    }
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(FsError::Invalid("RENAME_WHITEOUT is not supported".into()));
        }
        let from = self.child(parent, name).await?;
        let to = self.child(newparent, newname).await?;
        if gpu_rest(&from).is_some() || gpu_rest(&to).is_some() {
            return Err(FsError::NotPermitted);
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            return self.exchange(from, to).await;
        }
        check_key(&to)?;
        // Files still being written or queued are published first, so the move carries their
        // bytes (and what it replaces is replaced on the server, not after).
        self.publish_below(&from).await?;
        self.publish_below(&to).await?;
        let store = self.store();
        store
            .rename(RenameRequest {
                namespace: self.ns(),
                from: from.clone(),
                to: to.clone(),
                no_replace: flags & libc::RENAME_NOREPLACE != 0,
                watcher: self.listings.watcher(),
            })
            .await
            .map_err(too_large_to_move)?;
        self.move_staged(&[(&from, &to)]).await;
        self.inodes().rename(&from, &to);
        self.invalidate_below(&from);
        self.invalidate_below(&to);
        self.invalidate(&[split(&from).0, split(&to).0, &from, &to]);
        self.invalidate_links(&[split(&from).0, split(&to).0, &from, &to]);
        Ok(())
    }
    /// `renameat2(RENAME_EXCHANGE)`: both names stay, each naming what the other did, in one
    /// change on the store server.
    async fn exchange(&self, a: String, b: String) -> FsResult<()> {
        check_key(&a)?;
        check_key(&b)?;
        // Files still being written are published first, so that each name carries its bytes.
        for p in [&a, &b] {
            self.publish_below(p).await?;
        }
        let store = self.store();
        store
            .exchange(ExchangeRequest {
                namespace: self.ns(),
                a: a.clone(),
                b: b.clone(),
                watcher: self.listings.watcher(),
            })
            .await
            .map_err(too_large_to_move)?;
        self.move_staged(&[(&a, &b), (&b, &a)]).await;
        self.inodes().exchange(&a, &b);
        for p in [&a, &b] {
            self.invalidate_below(p);
        }
        let paths = [split(&a).0, split(&b).0, a.as_str(), b.as_str()];
        self.invalidate(&paths);
        self.invalidate_links(&paths);
        Ok(())
    }
    #[allow(clippy::too_many_arguments)]
    pub async fn setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime: Option<SystemTime>,
        fh: Option<u64>,
    ) -> FsResult<Attr> {
        let path = self.path_of(ino).await?;
        // A control file has no bytes to truncate (open(O_TRUNC) asks) nor mode to change.
        if gpu_rest(&path).is_some()
            || (mode.is_none()
                && uid.is_none()
                && gid.is_none()
                && size.is_none()
                && mtime.is_none())
        {
            return self.getattr(ino).await;
        }
        self.writable()?;
        // Who may change an owner is the kernel's to check (default_permissions: CAP_CHOWN for
        // another uid, membership for another gid), against the owners getattr reports.
        let staged = match fh.map(|f| self.handles.get(f)) {
            Some(Ok(Handle::Write(s))) => Some(s),
            _ => self.writer.staged_at(&path),
        };
        if let Some(size) = size {
            match &staged {
                Some(s) => s.truncate(size, &self.cfg.staging)?,
                None => {
                    let s = self.open_staged(&path, size == 0).await?;
                    let r = match s.truncate(size, &self.cfg.staging) {
                        Ok(()) => self.release_staged(&s).await,
                        Err(e) => Err(e),
                    };
                    r?;
                }
            }
        }
        if mode.is_some() || mtime.is_some() || uid.is_some() || gid.is_some() {
            match &staged {
                // Closed and published, waiting only for the kernel's release (sent after
                // `close` returned): the change goes to the store as a closed file's does,
                // stamped there, and the staged copy takes it too for a write still to come.
                // Made on the staged copy alone, it was published by the release a moment
                // later, under a ctime other than the one this call answered.
                Some(s) if self.published_clean(s) => {
                    if let Some(m) = mode {
                        s.mode.store(m & 0o7777, Ordering::Relaxed);
                    }
                    {
                        let mut o = lock(&s.owner);
                        *o = (uid.unwrap_or(o.0), gid.unwrap_or(o.1));
                    }
                    if let Some(t) = mtime {
                        *lock(&s.mtime) = t;
                    }
                    self.set_attr_on_store(&path, mode, uid, gid, mtime).await?;
                }
                Some(s) => {
                    if let Some(m) = mode {
                        s.mode.store(m & 0o7777, Ordering::Relaxed);
                    }
                    {
                        let mut o = lock(&s.owner);
                        *o = (uid.unwrap_or(o.0), gid.unwrap_or(o.1));
                    }
                    if let Some(t) = mtime {
                        *lock(&s.mtime) = t;
                    }
                    *lock(&s.ctime) = SystemTime::now();
                    s.changes.fetch_add(1, Ordering::SeqCst);
                }
                // (A file closed under write-back is still staged: the arms above.)
                None => self.set_attr_on_store(&path, mode, uid, gid, mtime).await?,
            }
        }
        if let Some(s) = &staged {
            // Closed and queued under write-back: the change is journaled and queued too.
            self.requeue(s).await?;
        }
        self.getattr(ino).await
    }
    /// A metadata change of `path`, made on the store.
    async fn set_attr_on_store(
        &self,
        path: &str,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        mtime: Option<SystemTime>,
    ) -> FsResult<()> {
        let (sec, nsec) = mtime.map(to_unix).unzip();
        self.store()
            .set_attr(SetAttrRequest {
                namespace: self.ns(),
                key: path.to_string(),
                mode,
                mtime_sec: sec,
                mtime_nsec: nsec.unwrap_or(0),
                uid,
                gid,
                watcher: self.listings.watcher(),
            })
            .await?;
        self.invalidate(&[split(path).0, path]);
        self.invalidate_other_names(path);
        Ok(())
    }

    /// Whether staged `s` holds nothing the store lacks (published, unchanged since, and not
    /// under write-back): what is known of it is the store's.
    pub(crate) fn published_clean(&self, s: &Staged) -> bool {
        !self.wb().on() && !s.dirty() && s.published.load(Ordering::SeqCst) > 0
    }

    /// After the server moved each `from` to its `to` (all at once: an exchange swaps), the
    /// files staged at or below each `from` follow; a staged file at a `to` the move replaced
    /// is gone.
    async fn move_staged(&self, moves: &[(&str, &str)]) {
        let replaced = {
            let mut m = lock(&self.writer.staged);
            let mut moved = Vec::new();
            for (from, to) in moves {
                let below: Vec<String> = m.keys().filter(|p| under(p, from)).cloned().collect();
                for p in below {
                    if let Some(s) = m.remove(&p) {
                        moved.push((format!("{to}{}", &p[from.len()..]), s));
                    }
                }
            }
            let replaced: Vec<_> = moves.iter().filter_map(|(_, to)| m.remove(*to)).collect();
            for (p, s) in moved {
                *lock(&s.path) = p.clone();
                m.insert(p, s);
            }
            replaced
        };
        for s in replaced {
            s.unlinked.store(true, Ordering::SeqCst);
            self.retire(&s).await;
        }
    }
}

/// A rename the store's engine cannot commit as one change (a directory of many keys on etcd)
/// is one this filesystem cannot make atomically: EXDEV, on which `mv` copies and removes, as
/// between two filesystems, rather than failing.
fn too_large_to_move(e: crate::rpc::ClientError) -> FsError {
    match e.fault() {
        crate::rpc::Fault::TooLarge => FsError::CrossDevice,
        _ => e.into(),
    }
}
