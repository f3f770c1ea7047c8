//! Publish on close: a staged file is hashed and published through the one publish path
//! (`transfer::publish`), with its blocks uploaded to the store, sent inside the publish (a
//! small file), or registered with this node as their in-place source (`locale=local`). The
//! close returns only after the key switched, so a reader that opens afterwards sees the new
//! version.
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::fs::attr::to_unix;
use crate::fs::error::{FsError, FsResult};
use crate::fs::filesystem::FsCore;
use crate::fs::paths::split;
use crate::locks::lock;
use indicatif::ProgressBar;

use crate::blocks::in_place::{open_regular, Check};
use crate::dataplane::upload;
use crate::fs::write::publish::{inline_blocks, Prepared, Settle};
use crate::fs::write::staged::Staged;
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{ListEntry, LocalFile, Locale, PublishRequest};
use crate::rpc::MAX_INLINE_FILE;
use crate::transfer::publish::{self, Payload};
use crate::transfer::put::chunk::{hash_blocks, Chunking};

impl FsCore {
    pub(crate) async fn publish_staged(&self, s: &Arc<Staged>) -> FsResult<()> {
        s.until_filled().await;
        let _guard = s.publish_lock.lock().await;
        match self.prepare_publish(s)? {
            Some(p) => self.send_publish(s, p).await,
            None => Ok(()),
        }
    }
    /// Sends a prepared publish of `s` on its own, and settles it.
    pub(crate) async fn send_publish(&self, s: &Staged, p: Prepared) -> FsResult<()> {
        let store = self.store();
        let done = publish::publish(
            &store,
            &self.cfg.server,
            p.req,
            p.payload,
            &ProgressBar::hidden(),
        )
        .await?;
        self.settle_publish(s, &p.settle, done.entry, done.parent);
        Ok(())
    }
    /// What a publish of `s` sends (`None`: nothing to publish). The caller holds `s`'s
    /// publish lock until [`FsCore::settle_publish`].
    pub(crate) fn prepare_publish(&self, s: &Arc<Staged>) -> FsResult<Option<Prepared>> {
        if s.unlinked.load(Ordering::SeqCst) {
            s.forget_record();
            return Ok(None);
        }
        if !s.dirty() {
            s.forget_record_if_clean();
            return Ok(None);
        }
        let path = s.path();
        let locale = self.locale_for(&path);
        let chunking = Chunking::for_block_size(manifest::DEFAULT_BLOCK_SIZE);
        let mut buf = Vec::new();
        // The bytes as one change count saw them: writes hold the body's lock.
        let (disk, hashed, changes) = {
            let mut b = lock(&s.body);
            let changes = s.changes.load(Ordering::SeqCst);
            if locale == Locale::Local {
                // Served in place from now on: it must survive a crash of this node.
                let d = b.on_disk(&self.cfg.staging)?;
                d.file.sync_data()?;
                d.in_place = true;
            }
            match (b.bytes(), b.disk()) {
                (Some(bytes), _) => {
                    buf.resize(chunking.buffer_len(bytes.len() as u64), 0);
                    let hashed = hash_blocks(&mut &bytes[..], &chunking, &mut buf)?;
                    (None, Some(hashed), changes)
                }
                (None, d) => (d.map(|d| d.disk.clone()), None, changes),
            }
        };
        let (size, blocks) = match (hashed, &disk) {
            (Some(h), _) => h,
            (None, Some(disk)) => crate::transfer::put::scan::hash_file(disk, &chunking, &mut buf)?,
            (None, None) => {
                return Err(FsError::Invalid(format!(
                    "{path}: a staged body is nowhere"
                )))
            }
        };
        let (mtime_sec, mtime_nsec) = to_unix(*lock(&s.mtime));
        let (ctime_sec, ctime_nsec) = to_unix(*lock(&s.ctime));
        let (uid, gid) = *lock(&s.owner);
        let m = Manifest {
            block_size: chunking.max_block(),
            entries: vec![FileEntry {
                path: String::new(),
                kind: EntryKind::File as i32,
                mode: s.mode.load(Ordering::Relaxed),
                size,
                mtime_sec,
                mtime_nsec,
                blocks,
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            }],
        };
        let payload = match (&m.entries[0].blocks[..], locale, disk) {
            (_, Locale::Local, Some(disk)) => {
                let files = [LocalFile {
                    entry_path: String::new(),
                    disk_path: disk.display().to_string(),
                }];
                self.blocks
                    .register(&m, &files, Check::Sizes, &open_regular)?;
                Payload::InPlace
            }
            // A body in memory (at most what goes inline) was hashed from `buf`, whole: its
            // blocks go inside the publish, one round trip.
            (blocks, Locale::Store, None) => Payload::Inline(inline_blocks(blocks, &buf)?),
            // Already read whole into `buf`: sent with the publish, one round trip.
            ([b], Locale::Store, Some(_))
                if size <= u64::from(MAX_INLINE_FILE) && u64::from(b.len) == size =>
            {
                Payload::Inline(inline_blocks(std::slice::from_ref(b), &buf)?)
            }
            (blocks, Locale::Store, Some(disk)) => {
                Payload::Upload(upload::jobs_of([(Arc::new(disk), blocks)]))
            }
            (_, Locale::Local, None) => {
                return Err(FsError::Invalid(format!(
                    "{path}: a file served in place has no file"
                )))
            }
        };
        // Named, the watch does not tell this mount of its own publish: the answer carries it.
        let watcher = self.listings.watcher();
        let req = PublishRequest {
            namespace: self.ns(),
            key: path.clone(),
            locale: locale as i32,
            origin_node: self.cfg.node_id.clone(),
            ttl_secs: 0,
            force: true,
            manifest: Some(m),
            watcher,
            // Its last change here, not the close that publishes it.
            changed_unix_ns: ctime_sec
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::from(ctime_nsec)),
            ..Default::default()
        };
        Ok(Some(Prepared {
            settle: Settle {
                path,
                changes,
                watcher,
            },
            req,
            payload,
        }))
    }
    /// After the server published what `settle` names: `s` is clean up to the changes it took
    /// in, and this mount's caches take the change (as a recall would, but keeping the
    /// directory's listing, with the new entry in it).
    pub(crate) fn settle_publish(
        &self,
        s: &Staged,
        settle: &Settle,
        entry: Option<ListEntry>,
        parent: Option<ListEntry>,
    ) {
        let (path, watcher) = (settle.path.as_str(), settle.watcher);
        s.published.fetch_max(settle.changes, Ordering::SeqCst);
        // Every change on the server now: nothing left to replay.
        s.forget_record_if_clean();
        match entry {
            Some(e) if watcher != 0 => {
                self.listings.own_publish(path, e);
                // What the watch would have had the kernel forget: the directory's times.
                self.kernel_forget_paths(&[split(path).0, path]);
            }
            _ => self.invalidate(&[split(path).0, path]),
        }
        self.invalidate_other_names(path);
        self.take_parent(path, parent);
    }
    /// Publishes a manifest with no blocks (a directory or a symlink) at `path`. Named, the
    /// watch does not recall this mount's own listing of the directory: the answer carries the
    /// new entry and the directory's, as a file's publish does.
    pub(crate) async fn publish_meta(&self, path: &str, entry: FileEntry) -> FsResult<()> {
        let watcher = self.listings.watcher();
        let req = PublishRequest {
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
            watcher,
            ..Default::default()
        };
        let store = self.store();
        let done = publish::publish(
            &store,
            &self.cfg.server,
            req,
            Payload::InPlace,
            &ProgressBar::hidden(),
        )
        .await?;
        let (dir, _) = split(path);
        match done.entry {
            Some(e) if watcher != 0 => {
                self.listings.own_publish(path, e);
                self.kernel_forget_paths(&[dir, path]);
                self.take_parent(path, done.parent);
            }
            _ => self.invalidate(&[dir, path]),
        }
        // A new directory adds a link to its parent.
        self.invalidate_links(&[dir, path]);
        Ok(())
    }
}
