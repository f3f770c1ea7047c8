//! Directories for `readdir`: a snapshot of the listing taken at `opendir` (with the files
//! being written here), and handles an earlier agent left with the kernel, opened again.
use std::sync::Arc;

use crate::fs::attr::{kind_of, Attr, DirEntry, Kind};
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::FsCore;
use crate::fs::handles::Handle;
use crate::fs::names::inode;
use crate::fs::paths::{gpu_rest, join, split};
use std::collections::BTreeMap;

impl FsCore {
    /// Snapshots a directory for a sequence of `readdir` calls.
    pub async fn opendir(&self, ino: u64) -> FsResult<u64> {
        let entries = self.snapshot_dir(ino).await?;
        Ok(self.handles.insert(Handle::Dir(entries)))
    }
    pub(crate) async fn snapshot_dir(&self, ino: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        let path = self.path_of(ino).await?;
        if let Some(rest) = gpu_rest(&path) {
            if self.stat_path(&path).await?.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            return self.gpu_snapshot(&path, rest).await;
        }
        if !path.is_empty() && self.stat_path(&path).await?.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        // Without the lease a listing is asked for at every opendir: a name another node made
        // shows in the next `ls` after its writer's close.
        let listing = match self.listings.leased_listing(&path) {
            Some(l) => l,
            None => self.fetch_listing_ahead(&path).await?,
        };
        let mut entries: BTreeMap<String, DirEntry> = listing
            .iter()
            .map(|(name, e)| {
                let p = join(&path, name);
                (
                    name.clone(),
                    DirEntry {
                        ino: self.ino_of(&p),
                        kind: kind_of(e.kind()),
                        name: name.clone(),
                    },
                )
            })
            .collect();
        // Files being written here show before they are published.
        for p in self.writer.paths() {
            let (parent, name) = split(&p);
            if parent == path {
                entries.entry(name.to_string()).or_insert_with(|| DirEntry {
                    ino: self.ino_of(&p),
                    kind: Kind::File,
                    name: name.to_string(),
                });
            }
        }
        Ok(Arc::new(entries.into_values().collect()))
    }
    /// Entries of an open directory from `offset` on (`.` and `..` first).
    /// The attributes READDIRPLUS gives with an entry of directory `dir`: a name's as its
    /// lookup gives them, and counted as a lookup (the kernel counts it as one, and forgets it
    /// later); the dot entries' uncounted (the kernel takes no reference for them).
    pub async fn readdirplus_attr(&self, dir: u64, e: &DirEntry) -> FsResult<Attr> {
        match e.name.as_str() {
            "." | ".." => self.getattr(e.ino).await,
            name => {
                crate::metrics::READDIRPLUS_NAMES.inc();
                self.look_up(dir, name).await
            }
        }
    }
    pub async fn readdir(&self, ino: u64, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        let Handle::Dir(entries) = self.handle_or_reopen(ino, fh, true).await? else {
            return Err(FsError::BadHandle);
        };
        let path = self.path_of(ino).await?;
        let parent_ino = if path.is_empty() {
            inode::ROOT
        } else {
            self.ino_of(split(&path).0)
        };
        let dots = [
            DirEntry {
                ino,
                kind: Kind::Dir,
                name: ".".into(),
            },
            DirEntry {
                ino: parent_ino,
                kind: Kind::Dir,
                name: "..".into(),
            },
        ];
        Ok(dots
            .into_iter()
            .chain(entries.iter().cloned())
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e))
            .collect())
    }
    /// A handle from an agent that ran before on this mount (a kept mount, see
    /// `crate::keeper`). A reader's is opened again, on the version the key has now; a
    /// writer's staged bytes died with that agent.
    pub(crate) async fn reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        let h = if dir {
            Handle::Dir(self.snapshot_dir(ino).await?)
        } else {
            Handle::Read(Arc::new(
                self.reader.resolve(&self.path_of(ino).await?).await?,
            ))
        };
        self.handles.put(fh, h.share());
        tracing::debug!(ino, fh, "reopened a handle of an earlier agent");
        Ok(h)
    }
    pub(crate) async fn handle_or_reopen(&self, ino: u64, fh: u64, dir: bool) -> FsResult<Handle> {
        match self.handles.get(fh) {
            Err(FsError::BadHandle) => self.reopen(ino, fh, dir).await,
            other => other,
        }
    }
}
