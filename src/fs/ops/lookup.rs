//! Names: what a path is, as the store server lists it (cached under the watch's lease, see
//! `names::listings`), and what `lookup`, `stat` and `readlink` show; a file being written
//! here shows as its staged copy before it is published.
use std::time::{Duration, SystemTime};

use crate::fs::attr::{kind_of, time_of, Attr, Caller, Kind};
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::{FsCore, Orphan};
use crate::fs::handles::Handle;
use crate::fs::names::inode;
use crate::fs::names::listings::{entries_of, Entries, LIST_AHEAD};
use crate::fs::paths::{gpu_rest, join, split};
use crate::locks::lock;
use crate::manifest::EntryKind;
use crate::proto::{ListEntry, ListRequest};

impl FsCore {
    /// The owner of a new entry in directory `parent` made by `caller`, and whether the
    /// directory is set-group-ID (its gid, and for a directory the bit too, are inherited).
    pub(crate) async fn owner_for(
        &self,
        parent: u64,
        caller: Caller,
    ) -> FsResult<((u32, u32), bool)> {
        let dir = self.getattr(parent).await?;
        if dir.perm & 0o2000 != 0 {
            return Ok(((caller.uid, dir.gid), true));
        }
        Ok(((caller.uid, caller.gid), false))
    }
    /// `relatime`: a read moves the access time when it is not after the last change, or is
    /// a day old; otherwise a read writes nothing, here or anywhere.
    pub(crate) fn accessed(&self, ino: u64, a: &Attr) {
        let now = SystemTime::now();
        let mut atimes = lock(&self.atimes);
        let at = atimes.get(&ino).copied().unwrap_or(a.mtime);
        let stale = at <= a.mtime
            || at <= a.ctime
            || now
                .duration_since(at)
                .is_ok_and(|d| d >= Duration::from_secs(86_400));
        if stale {
            atimes.insert(ino, now);
        }
    }
    pub(crate) fn set_atime(&self, ino: u64, t: SystemTime) {
        lock(&self.atimes).insert(ino, t);
    }
    pub(crate) fn with_atime(&self, mut a: Attr) -> Attr {
        a.atime = lock(&self.atimes).get(&a.ino).copied().unwrap_or(a.mtime);
        a
    }
    /// The path of `name` in directory `parent`. Every call that takes a name checks it here:
    /// the kernel leaves NAME_MAX to the filesystem.
    pub(crate) async fn child(&self, parent: u64, name: &str) -> FsResult<String> {
        if name.len() > crate::key::MAX_SEGMENT {
            return Err(FsError::Name(crate::key::KeyError::SegmentTooLong(
                name.chars().take(32).collect::<String>() + "...",
            )));
        }
        Ok(join(&self.path_of(parent).await?, name))
    }
    pub(crate) async fn path_of(&self, ino: u64) -> FsResult<String> {
        let (path, names) = {
            let t = self.inodes();
            (t.path(ino).ok_or(FsError::Stale)?, t.names(ino))
        };
        // A file of several names whose name here went away on another node goes on under a
        // name it still has, as a local unlink of the name passes it on.
        if let Some(names) = names {
            if self.writer.staged_at(&path).is_none()
                && matches!(self.entry(&path).await, Err(FsError::NotFound))
            {
                for other in names.iter().filter(|n| **n != path) {
                    if self.entry(other).await.is_ok() {
                        self.inodes().pass_on(ino, &path, other);
                        return Ok(other.clone());
                    }
                }
            }
        }
        Ok(path)
    }
    pub(crate) fn ino_of(&self, path: &str) -> u64 {
        self.inodes().ino(path)
    }
    /// Forgets cached listings of `paths`, after this mount changed them.
    pub(crate) fn invalidate(&self, paths: &[&str]) {
        self.listings.forget(paths);
    }
    /// Forgets what is cached of the other names of the file at `path` (a hard link), after
    /// this mount changed it through `path`: they show the same file.
    pub(crate) fn invalidate_other_names(&self, path: &str) {
        for other in self.inodes().other_names(path) {
            self.invalidate(&[split(&other).0, &other]);
        }
    }
    /// Forgets what is cached at or below `path`, after this mount moved it.
    pub(crate) fn invalidate_below(&self, path: &str) {
        self.listings.forget_below(path);
    }
    /// Takes the entry of `path`'s directory as a publish returned it (its times moved), so
    /// that its next stat needs no request.
    pub(crate) fn take_parent(&self, path: &str, dir: Option<ListEntry>) {
        let Some(d) = dir else { return };
        match split(path).0 {
            "" if !path.is_empty() => self.listings.put_root(d, None),
            parent => self.listings.put_own(parent, Some(d), None),
        }
    }
    /// Forgets the link counts of `paths`, after this mount added, removed or moved a directory
    /// in them (a file's changes leave them as they were).
    pub(crate) fn invalidate_links(&self, paths: &[&str]) {
        self.listings.forget_links(paths);
    }
    pub(crate) async fn fetch_listing(&self, path: &str) -> FsResult<Entries> {
        let since = self.listings.epoch();
        let entries = self.fetch_listing_uncached(path).await?;
        self.listings.put(path, entries.clone(), since);
        Ok(entries)
    }
    /// `path`'s listing for a reader of the directory, with the listings a walk of the tree
    /// reads next (see [`LIST_AHEAD`]), all kept under the lease alone: without it each
    /// opendir asks anew, and they would go unused.
    pub(crate) async fn fetch_listing_ahead(&self, path: &str) -> FsResult<Entries> {
        if !self.listings.leased() {
            return self.fetch_listing(path).await;
        }
        let since = self.listings.epoch();
        let resp = self.list_rpc(path, false, LIST_AHEAD).await?;
        if !resp.exists && !path.is_empty() {
            return Err(FsError::NotFound);
        }
        for l in resp.ahead {
            self.listings.put(&l.path, entries_of(l.entries), since);
        }
        let entries = entries_of(resp.entries);
        self.listings.put(path, entries.clone(), since);
        Ok(entries)
    }
    /// One directory's listing from the store server, or with `dir_only` its own entry alone;
    /// with `ahead`, the listings a walk reads after it, up to about that many entries.
    pub(crate) async fn list_rpc(
        &self,
        path: &str,
        dir_only: bool,
        ahead: u32,
    ) -> FsResult<crate::proto::ListResponse> {
        crate::metrics::MOUNT_METADATA_REQUESTS.inc();
        let store = self.store();
        let asked = store
            .list_all(ListRequest {
                watcher: self.listings.watcher(),
                namespace: self.ns(),
                prefix: path.to_string(),
                dir_only,
                ahead,
                ..Default::default()
            })
            .await;
        self.listings
            .called(asked.as_ref().err().map(crate::rpc::ClientError::fault));
        match asked {
            Err(e) if self.cfg.stale_reads && self.listings.unreachable() => {
                self.last_seen(path, dir_only).ok_or_else(|| e.into())
            }
            answered => Ok(answered?),
        }
    }
    /// What this mount last saw of `path` (its listing, or with `dir_only` its own entry), as
    /// a store server's answer: stale reads while none is reachable.
    fn last_seen(&self, path: &str, dir_only: bool) -> Option<crate::proto::ListResponse> {
        if dir_only {
            let own = self.listings.last_own(path)?;
            return Some(crate::proto::ListResponse {
                exists: own.is_some(),
                dir: own,
                ..Default::default()
            });
        }
        let entries = self.listings.last_listing(path)?;
        Some(crate::proto::ListResponse {
            exists: true,
            entries: entries.values().cloned().collect(),
            ..Default::default()
        })
    }
    pub(crate) async fn fetch_listing_uncached(&self, path: &str) -> FsResult<Entries> {
        let resp = self.list_rpc(path, false, 0).await?;
        if !resp.exists && !path.is_empty() {
            return Err(FsError::NotFound);
        }
        Ok(entries_of(resp.entries))
    }
    /// `path`'s own entry from the store server, or `None` for nothing there.
    pub(crate) async fn fetch_own(&self, path: &str) -> FsResult<Option<ListEntry>> {
        let resp = self.list_rpc(path, true, 0).await?;
        Ok(resp
            .exists
            .then_some(resp.dir)
            .flatten()
            .filter(|e| e.kind() != EntryKind::Gpu))
    }
    /// The root's attributes: its own record on the store server (owner, mode, and times that
    /// move as top-level entries come and go), or the mount's where the server has none.
    pub(crate) async fn root_attr(&self) -> Attr {
        let entry = match self.listings.root() {
            Some(e) => Some(e),
            None => {
                let since = self.listings.epoch();
                let e = self.fetch_own("").await.ok().flatten();
                if let Some(e) = &e {
                    self.listings.put_root(e.clone(), Some(since));
                }
                e
            }
        };
        if let Some(e) = entry {
            return self.attr_from_entry(inode::ROOT, &e);
        }
        Attr {
            ino: inode::ROOT,
            kind: Kind::Dir,
            size: 0,
            perm: 0o755,
            mtime: self.started,
            atime: self.started,
            ctime: self.started,
            nlink: 2,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            rdev: 0,
        }
    }
    pub(crate) fn attr_from_entry(&self, ino: u64, e: &ListEntry) -> Attr {
        let kind = kind_of(e.kind());
        let perm = if e.mode == 0 {
            if kind == Kind::Dir {
                0o755
            } else {
                0o644
            }
        } else {
            (e.mode & 0o7777) as u16
        };
        Attr {
            ino,
            kind,
            size: match kind {
                Kind::File => e.size,
                Kind::Symlink => e.symlink_target.len() as u64,
                _ => 0,
            },
            perm,
            mtime: self.time_or_start(e.mtime_sec, e.mtime_nsec),
            atime: self.time_or_start(e.mtime_sec, e.mtime_nsec),
            ctime: self.time_or_start(e.ctime_sec, e.ctime_nsec),
            nlink: if kind == Kind::Dir { 2 } else { e.nlink.max(1) },
            uid: e.uid.unwrap_or(self.cfg.uid),
            gid: e.gid.unwrap_or(self.cfg.gid),
            rdev: e.rdev as u32,
        }
    }
    /// A stored time, or the mount's start for one never stamped (a bare parent of keys).
    pub(crate) fn time_or_start(&self, sec: i64, nsec: u32) -> std::time::SystemTime {
        if sec == 0 && nsec == 0 {
            self.started
        } else {
            time_of(sec, nsec)
        }
    }
    /// The listing entry of `path`, from its parent's listing (or asked for alone after this
    /// mount changed it).
    pub(crate) async fn entry(&self, path: &str) -> FsResult<ListEntry> {
        if let Some(e) = self.listings.own(path) {
            return e.ok_or(FsError::NotFound);
        }
        let (parent, name) = split(path);
        let listing = match (
            self.listings.fresh_at(parent),
            self.listings.changed_at(path),
        ) {
            (Some((taken, _)), Some(changed)) if taken <= changed => {
                let since = self.listings.epoch();
                let e = self.fetch_own(path).await?;
                self.listings.put_own(path, e.clone(), Some(since));
                return e.ok_or(FsError::NotFound);
            }
            (Some((_, l)), _) => l,
            // A listing taken now shows the change, and serves the siblings too.
            (None, _) => self.fetch_listing(parent).await?,
        };
        listing.get(name).cloned().ok_or(FsError::NotFound)
    }
    /// A directory's link count as a local filesystem keeps it: its name, its `.`, and each
    /// subdirectory's `..`.
    pub(crate) async fn dir_links(&self, path: &str) -> u32 {
        // A stat must not fill the listing cache: a lookup right after it would trust a listing
        // older than another node's close, and close-to-open would be lost. The count is kept
        // on its own, so a directory's stats (one per create under it, for the kernel's
        // permission checks) cost one listing per TTL, not one each.
        if let Some(n) = self.listings.links(path) {
            return n;
        }
        let since = self.listings.epoch();
        let listing = match self.listings.fresh(path) {
            Some(l) => Ok(l),
            None => self.fetch_listing_uncached(path).await,
        };
        let Ok(l) = listing else { return 2 };
        let n = 2 + l.values().filter(|e| e.is_directory).count() as u32;
        self.listings.put_links(path, n, since);
        n
    }
    /// The attributes of `path`: an open staged write if there is one, else what the store shows.
    pub async fn stat_path(&self, path: &str) -> FsResult<Attr> {
        let mut a = self.stat_path_links(path).await?;
        if a.kind == Kind::Dir && gpu_rest(path).is_none() {
            a.nlink = self.dir_links(path).await;
        }
        Ok(a)
    }
    pub(crate) async fn stat_path_links(&self, path: &str) -> FsResult<Attr> {
        if path.is_empty() {
            return Ok(self.root_attr().await);
        }
        if let Some(rest) = gpu_rest(path) {
            return self.gpu_stat(path, rest).await;
        }
        if let Some(s) = self.writer.staged_at(path) {
            if !self.published_clean(&s) {
                return s.attr(self.ino_of(path));
            }
        }
        let e = self.entry(path).await?;
        Ok(self.attr_from_entry(self.ino_of(path), &e))
    }
    pub async fn lookup(&self, parent: u64, name: &str) -> FsResult<Attr> {
        let _t = crate::metrics::Timer::start(&crate::metrics::FUSE_LOOKUP_SECONDS);
        self.look_up(parent, name).await
    }
    pub(crate) async fn look_up(&self, parent: u64, name: &str) -> FsResult<Attr> {
        let path = self.child(parent, name).await?;
        let mut attr = self.stat_path(&path).await?;
        // A file of several names: the number its other names show.
        let record = match (attr.kind, attr.nlink) {
            (Kind::File, n) if n > 1 => self.entry(&path).await.map_or(0, |e| e.inode),
            _ => 0,
        };
        attr.ino = self.inodes().lookup_record(&path, record);
        Ok(self.with_atime(attr))
    }
    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes().forget(ino, n);
        if self.inodes().path(ino).is_none() {
            lock(&self.orphans).remove(&ino);
            lock(&self.atimes).remove(&ino);
        }
    }
    pub async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let path = self.path_of(ino).await?;
        let mut a = self.stat_path(&path).await?;
        a.ino = ino;
        Ok(self.with_atime(a))
    }
    /// `getattr` through an open file (fstat, and the kernel's look before a read): a file
    /// unlinked while open keeps its attributes, with no link left, until its last close.
    pub async fn getattr_open(&self, ino: u64, fh: Option<u64>) -> FsResult<Attr> {
        let err = match self.getattr(ino).await {
            Err(e) if e.is_not_found() => e,
            r => return r,
        };
        let mut a = match fh.map(|fh| self.handles.get(fh)) {
            Some(Ok(Handle::Write(s))) => s.attr(ino)?,
            Some(Ok(Handle::Read(f))) => self.attr_of_file(ino, &f.entry),
            // fstat(2) comes without the descriptor: what the unlink left.
            _ => match lock(&self.orphans).get(&ino) {
                Some(Orphan::Staged(s)) => s.attr(ino)?,
                Some(Orphan::Published(a)) => a.clone(),
                None => return Err(err),
            },
        };
        a.ino = ino;
        a.nlink = 0;
        Ok(self.with_atime(a))
    }
    /// A file's attributes from its manifest entry, read as its listing entry would be.
    pub(crate) fn attr_of_file(&self, ino: u64, e: &crate::proto::FileEntry) -> Attr {
        self.attr_from_entry(
            ino,
            &ListEntry {
                kind: e.kind,
                mode: e.mode,
                size: e.size,
                mtime_sec: e.mtime_sec,
                mtime_nsec: e.mtime_nsec,
                uid: e.uid,
                gid: e.gid,
                rdev: e.rdev,
                ..Default::default()
            },
        )
    }
    pub async fn readlink(&self, ino: u64) -> FsResult<String> {
        let path = self.path_of(ino).await?;
        if gpu_rest(&path).is_some() {
            return Err(FsError::NotSymlink);
        }
        let e = self.entry(&path).await?;
        if e.kind() != EntryKind::Symlink {
            return Err(FsError::NotSymlink);
        }
        Ok(e.symlink_target)
    }
}
