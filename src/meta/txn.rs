//! Metadata transactions: every change to keys is planned against a view that sees its own
//! pending edits, then written in one atomic batch. A publish, a remove or a rename therefore
//! lands whole or not at all, and readers never see half of one. A change is planned under the
//! write lock and sees the changes queued for commit ahead of it; it waits for its batch to be
//! durable after letting go of the lock (`super::commit`).
//!
//! The namespace is a tree made of keys. A key names a file, a symlink or a directory manifest;
//! keys may nest below directory keys (a file written into a published directory through the
//! mount becomes a key of its own, and the directory's manifest loses that path). A path is
//! therefore one of: a key, an entry inside the nearest directory key above it, a parent of keys
//! (an implicit directory), or nothing.

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use prost::Message;

use super::backend::{Op, Table};
use super::commit::Ticket;
use super::error::MetaError;
use super::keys::{inode_bytes, key_bytes, location_key};
use super::reads::View;
use super::store::MetaStore;
use crate::hash::Version;
use crate::key::Namespace;
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{KeyRecord, Locale, PathAttrs};

/// Where a path lies.
#[derive(Clone, Debug)]
pub enum Loc {
    Key {
        record: KeyRecord,
    },
    Entry {
        key: String,
        record: KeyRecord,
        sub: String,
        entry: FileEntry,
    },
    /// No key and no manifest entry, but keys below it.
    Implicit,
    Nothing,
}

impl Loc {
    pub fn exists(&self) -> bool {
        !matches!(self, Loc::Nothing)
    }

    pub fn kind(&self) -> Option<EntryKind> {
        match self {
            Loc::Key { record } => Some(record.kind()),
            Loc::Entry { entry, .. } => Some(entry.kind()),
            Loc::Implicit => Some(EntryKind::Directory),
            Loc::Nothing => None,
        }
    }
}

/// The parts of a key record that survive edits of its manifest.
#[derive(Clone)]
pub struct Lineage {
    pub locale: Locale,
    pub origin: String,
    pub created: i64,
    pub expires: i64,
}

impl Lineage {
    pub fn of(r: &KeyRecord) -> Self {
        Lineage {
            locale: r.locale(),
            origin: r.origin_node.clone(),
            created: r.created_unix_ms,
            expires: r.expires_unix_ms,
        }
    }

    pub fn fresh(locale: Locale, origin: &str, ttl_secs: u64, now_ms: i64) -> Self {
        let created = now_ms;
        Lineage {
            locale,
            origin: if locale == Locale::Local {
                origin.to_string()
            } else {
                String::new()
            },
            created,
            // The TTL is the caller's number: one past the end of time is no expiry, never a
            // wrapped one that expires the key at once or an overflow that fails the publish.
            expires: if ttl_secs == 0 {
                0
            } else {
                let ttl_ms = i64::try_from(ttl_secs).map_or(i64::MAX, |s| s.saturating_mul(1000));
                created.saturating_add(ttl_ms)
            },
        }
    }
}

pub fn record_for(m: &Manifest, version: &Version, l: &Lineage) -> KeyRecord {
    let root = m.entries.first().cloned().unwrap_or_default();
    KeyRecord {
        version: version.0.to_vec(),
        locale: l.locale as i32,
        origin_node: l.origin.clone(),
        created_unix_ms: l.created,
        expires_unix_ms: l.expires,
        is_directory: manifest::is_directory(m),
        size: manifest::total_size(m),
        files: manifest::file_count(m),
        kind: root.kind,
        mode: root.mode,
        mtime_sec: root.mtime_sec,
        mtime_nsec: root.mtime_nsec,
        symlink_target: root.symlink_target,
        gpu: None,
        uid: root.uid,
        gid: root.gid,
        rdev: root.rdev,
        ..Default::default()
    }
}

enum Pending {
    Put(Box<(KeyRecord, Manifest)>),
    /// A name of a hard-linked file: its record is that inode's.
    Link(u64),
    Delete,
}

pub struct Txn<'m> {
    meta: &'m MetaStore,
    /// What the reads see: the stored state, or for a change, the planned one.
    view: View,
    /// The write lock, held by a change from its first read until it is queued.
    guard: Option<MutexGuard<'m, ()>>,
    /// The commit epoch the change was planned in.
    epoch: u64,
    ns: Namespace,
    pending: BTreeMap<String, Pending>,
    /// Path attributes to write (`None`: to delete).
    attrs: BTreeMap<String, Option<PathAttrs>>,
    /// Inode records of hard-linked files to write, with a manifest that is new (`None`: the
    /// last name went).
    inodes: BTreeMap<u64, Option<(KeyRecord, Option<Manifest>)>>,
    /// When this change happens: every time it stamps is this one, as a kernel's operation
    /// stamps a file and its directory alike.
    now: (i64, u32),
    /// Writes of another table the change carries whole (a publish's small blocks).
    carried: Vec<Op>,
}

pub(super) fn parent_of(path: &str) -> Option<&str> {
    path.rfind('/').map(|i| &path[..i])
}

impl<'m> Txn<'m> {
    /// A view of the stored state, for reading.
    pub fn new(meta: &'m MetaStore, ns: &Namespace) -> Self {
        Self::with(meta, ns, View::Stored, None)
    }

    /// A change: holds the write lock until [`Txn::commit`] queues it (or it is dropped).
    pub fn write(meta: &'m MetaStore, ns: &Namespace) -> Self {
        let guard = meta.lock();
        Self::with(meta, ns, View::Planned, Some(guard))
    }

    fn with(
        meta: &'m MetaStore,
        ns: &Namespace,
        view: View,
        guard: Option<MutexGuard<'m, ()>>,
    ) -> Self {
        Txn {
            meta,
            view,
            // Only a change is submitted; readers need not ask the queue.
            epoch: match view {
                View::Planned => meta.commits.epoch(),
                View::Stored => 0,
            },
            guard,
            ns: ns.clone(),
            pending: BTreeMap::new(),
            attrs: BTreeMap::new(),
            inodes: BTreeMap::new(),
            now: meta.clock_now().unix(),
            carried: Vec::new(),
        }
    }

    /// When this change happens (see [`Txn::now`]).
    pub fn now(&self) -> (i64, u32) {
        self.now
    }

    /// What `path` shows beyond its entry, pending edits applied.
    pub fn attrs(&self, path: &str) -> Result<Option<PathAttrs>, MetaError> {
        match self.attrs.get(path) {
            Some(a) => Ok(*a),
            None => self.meta.path_attrs(self.view, &self.ns, path),
        }
    }

    /// Paths strictly below `path` that have attributes, pending edits applied.
    fn attr_paths_below(&self, path: &str) -> Result<Vec<String>, MetaError> {
        let pfx = format!("{path}/");
        let mut paths: std::collections::BTreeSet<String> = self
            .meta
            .attr_paths_below(self.view, &self.ns, path)?
            .into_iter()
            .collect();
        for (p, a) in self.attrs.range(pfx.clone()..) {
            if !p.starts_with(&pfx) {
                break;
            }
            if a.is_some() {
                paths.insert(p.clone());
            } else {
                paths.remove(p);
            }
        }
        Ok(paths.into_iter().collect())
    }

    /// Forgets the attributes of `path` and of everything below it.
    /// Forgets `path`'s own attributes (not those below it).
    pub(super) fn forget_attrs(&mut self, path: &str) {
        self.attrs.insert(path.to_string(), None);
    }

    pub fn drop_attrs(&mut self, path: &str) -> Result<(), MetaError> {
        for p in self.attr_paths_below(path)? {
            self.attrs.insert(p, None);
        }
        self.attrs.insert(path.to_string(), None);
        Ok(())
    }

    /// Moves the attributes of `from` and everything below it to `to`, whose own go.
    pub fn move_attrs(&mut self, from: &str, to: &str) -> Result<(), MetaError> {
        let mut moved = Vec::new();
        for p in std::iter::once(from.to_string()).chain(self.attr_paths_below(from)?) {
            if let Some(a) = self.attrs(&p)? {
                moved.push((format!("{to}{}", &p[from.len()..]), a));
            }
        }
        self.drop_attrs(to)?;
        self.drop_attrs(from)?;
        for (p, a) in moved {
            self.attrs.insert(p, Some(a));
        }
        Ok(())
    }

    /// Edits the attributes of `path`.
    pub fn update_attrs(
        &mut self,
        path: &str,
        edit: impl FnOnce(&mut PathAttrs),
    ) -> Result<(), MetaError> {
        let mut a = self.attrs(path)?.unwrap_or_default();
        edit(&mut a);
        self.attrs.insert(path.to_string(), Some(a));
        Ok(())
    }

    /// Stamps a change of `path`'s metadata (its ctime) now, and with `entries` a change of a
    /// directory's entries (its mtime too).
    pub fn touch(&mut self, path: &str, entries: bool) -> Result<(), MetaError> {
        self.touch_at(path, entries, self.now)
    }

    /// [`Txn::touch`] at `at` rather than now.
    pub fn touch_at(&mut self, path: &str, entries: bool, at: (i64, u32)) -> Result<(), MetaError> {
        let (s, n) = at;
        // A directory (its entries changed) is never a hard link: no record to look up.
        let linked = match entries {
            true => None,
            false => self.record(path)?.filter(|r| r.inode != 0),
        };
        if let Some(mut r) = linked {
            // A hard-linked file's ctime is its inode's, shared by its names.
            (r.ctime_sec, r.ctime_nsec) = (s, n);
            let m = match self.inodes.remove(&r.inode) {
                Some(Some((_, m))) => m,
                _ => None,
            };
            self.inodes.insert(r.inode, Some((r, m)));
            return Ok(());
        }
        self.update_attrs(path, |a| {
            a.ctime_sec = Some(s);
            a.ctime_nsec = n;
            if entries {
                a.mtime_sec = Some(s);
                a.mtime_nsec = n;
            }
        })
    }

    /// Stamps the directory that holds `path` (the root for a top-level one): an entry of it
    /// came, went or was renamed.
    pub fn touch_parent(&mut self, path: &str) -> Result<(), MetaError> {
        self.touch(parent_of(path).unwrap_or(""), true)
    }

    pub fn record(&self, key: &str) -> Result<Option<KeyRecord>, MetaError> {
        match self.pending.get(key) {
            Some(Pending::Put(p)) => Ok(Some(p.0.clone())),
            Some(Pending::Link(id)) => self.inode(*id),
            Some(Pending::Delete) => Ok(None),
            None => self.meta.record(self.view, &self.ns, key),
        }
    }

    fn inode(&self, id: u64) -> Result<Option<KeyRecord>, MetaError> {
        match self.inodes.get(&id) {
            Some(i) => Ok(i.as_ref().map(|(r, _)| r.clone())),
            None => self.meta.inode(self.view, &self.ns, id),
        }
    }

    pub fn manifest_of(&self, key: &str, r: &KeyRecord) -> Result<Manifest, MetaError> {
        if let Some(Pending::Put(p)) = self.pending.get(key) {
            return Ok(p.1.clone());
        }
        if let Some(Some((_, Some(m)))) = self.inodes.get(&r.inode).filter(|_| r.inode != 0) {
            return Ok(m.clone());
        }
        self.meta.manifest(self.view, &r.version)
    }

    /// Gives the file at `from` (a key, not a directory) a second name `to`: both become
    /// names of one inode record, made now if the file had one name, so that a write, chmod
    /// or unlink through either is what the other shows.
    pub fn link(&mut self, from: &str, to: &str) -> Result<(), MetaError> {
        let r = self
            .record(from)?
            .ok_or_else(|| MetaError::NotFound(from.to_string()))?;
        let (s, n) = self.now;
        let (id, mut inode, manifest) = if r.inode == 0 {
            // A fresh id per namespace: the clock's nanoseconds and the name, hashed.
            let seed = format!("{}\0{from}\0{s}.{n}", self.ns);
            let h = blake3::hash(seed.as_bytes());
            let id = u64::from_be_bytes(h.as_bytes()[..8].try_into().unwrap_or_default()) | 1;
            let m = self.manifest_of(from, &r)?;
            self.pending.insert(from.to_string(), Pending::Link(id));
            (
                id,
                KeyRecord {
                    inode: id,
                    nlink: 1,
                    ..r
                },
                Some(m),
            )
        } else {
            (r.inode, r, None)
        };
        inode.nlink += 1;
        inode.ctime_sec = s;
        inode.ctime_nsec = n;
        self.inodes.insert(id, Some((inode, manifest)));
        self.pending.insert(to.to_string(), Pending::Link(id));
        // Its ctime is the inode's now, shared by the names.
        self.drop_attrs(from)?;
        self.drop_attrs(to)
    }

    /// Moves the name `from` to `to` as it is (a hard link stays one).
    pub fn move_key(&mut self, from: &str, to: &str) -> Result<(), MetaError> {
        let r = self
            .record(from)?
            .ok_or_else(|| MetaError::NotFound(from.to_string()))?;
        if r.inode != 0 {
            self.pending.insert(from.to_string(), Pending::Delete);
            self.pending.insert(to.to_string(), Pending::Link(r.inode));
            return Ok(());
        }
        let m = self.manifest_of(from, &r)?;
        self.delete_key(from)?;
        self.put_key(to, m, &Lineage::of(&r))
    }

    /// Live keys strictly below `key` (all keys for the root), pending edits applied.
    pub fn descendants(&self, key: Option<&str>) -> Result<Vec<(String, KeyRecord)>, MetaError> {
        let stored = self.meta.descendants(self.view, &self.ns, key)?;
        // A reader (a listing) has no edits to apply: the stored keys, already in key order,
        // are the answer, without a map of thousands of them built and taken apart again.
        if self.pending.is_empty() && self.inodes.is_empty() {
            return Ok(stored);
        }
        let mut map: BTreeMap<String, KeyRecord> = stored.into_iter().collect();
        let below = |k: &str| {
            key.is_none_or(|p| {
                k.len() > p.len() + 1 && k.starts_with(p) && k.as_bytes()[p.len()] == b'/'
            })
        };
        for (k, p) in &self.pending {
            if !below(k) {
                continue;
            }
            match p {
                Pending::Put(p) => {
                    map.insert(k.clone(), p.0.clone());
                }
                Pending::Link(_) => {}
                Pending::Delete => {
                    map.remove(k);
                }
            }
        }
        // Names of hard-linked files show their inodes as this change leaves them.
        for (k, p) in &self.pending {
            if let (true, Pending::Link(id)) = (below(k), p) {
                match self.inode(*id)? {
                    Some(r) => map.insert(k.clone(), r),
                    None => map.remove(k),
                };
            }
        }
        for r in map.values_mut().filter(|r| r.inode != 0) {
            if let Some(Some((i, _))) = self.inodes.get(&r.inode) {
                *r = i.clone();
            }
        }
        Ok(map.into_iter().collect())
    }

    /// Whether a live key lies below `key`, pending edits applied: [`Txn::descendants`]
    /// without reading every key below, which made each publish into a directory of many keys
    /// cost time in proportion to their number.
    fn has_descendants(&self, key: &str) -> Result<bool, MetaError> {
        let pfx = format!("{key}/");
        for (k, p) in self.pending.range(pfx.clone()..) {
            if !k.starts_with(&pfx) {
                break;
            }
            match p {
                Pending::Put(_) => return Ok(true),
                Pending::Link(id) if self.inode(*id)?.is_some() => return Ok(true),
                Pending::Link(_) | Pending::Delete => {}
            }
        }
        self.meta.any_descendant(self.view, &self.ns, key, |name| {
            self.pending.contains_key(name)
        })
    }

    /// The deepest live key that is `path` or one of its ancestors.
    pub fn covering(&self, path: &str) -> Result<Option<(String, KeyRecord)>, MetaError> {
        let mut cur = Some(path);
        while let Some(k) = cur {
            if let Some(r) = self.record(k)? {
                return Ok(Some((k.to_string(), r)));
            }
            cur = parent_of(k);
        }
        Ok(None)
    }

    pub fn locate(&self, path: &str) -> Result<Loc, MetaError> {
        let covering = self.covering(path)?;
        self.locate_under(path, covering.as_ref())
    }

    /// Where `path` lies, for a page of its listing after the first: as [`Txn::locate`], but
    /// a path that is no key and lies in none is the directory of keys the first page found,
    /// not asked again (on etcd, whether anything lies below a million keys costs a count of
    /// them). Removed since, its page comes back empty.
    pub fn locate_listed(&self, path: &str) -> Result<Loc, MetaError> {
        let covering = self.covering(path)?;
        match self.locate_under_keys(path, covering.as_ref())? {
            Some(loc) => Ok(loc),
            None => Ok(Loc::Implicit),
        }
    }

    /// Where `path` lies, given the deepest live key at or above it.
    pub(super) fn locate_under(
        &self,
        path: &str,
        covering: Option<&(String, KeyRecord)>,
    ) -> Result<Loc, MetaError> {
        if let Some(loc) = self.locate_under_keys(path, covering)? {
            return Ok(loc);
        }
        if self.has_descendants(path)? {
            return Ok(Loc::Implicit);
        }
        Ok(Loc::Nothing)
    }

    /// Where `path` lies if it is a key or inside one (`None`: neither).
    fn locate_under_keys(
        &self,
        path: &str,
        covering: Option<&(String, KeyRecord)>,
    ) -> Result<Option<Loc>, MetaError> {
        let Some((key, record)) = covering else {
            return Ok(None);
        };
        if key == path {
            return Ok(Some(Loc::Key {
                record: record.clone(),
            }));
        }
        if record.is_directory {
            let m = self.manifest_of(key, record)?;
            let sub = path[key.len() + 1..].to_string();
            if let Some(entry) = m.entries.iter().find(|e| e.path == sub) {
                return Ok(Some(Loc::Entry {
                    entry: entry.clone(),
                    key: key.clone(),
                    record: record.clone(),
                    sub,
                }));
            }
        }
        Ok(None)
    }

    /// Whether a directory at `path` holds nothing.
    pub fn is_empty_dir(&self, path: &str, loc: &Loc) -> Result<bool, MetaError> {
        if self.has_descendants(path)? {
            return Ok(false);
        }
        Ok(match loc {
            Loc::Key { record } => {
                record.files == 0 && self.manifest_of(path, record)?.entries.len() <= 1
            }
            Loc::Entry {
                key, record, sub, ..
            } => {
                let m = self.manifest_of(key, record)?;
                let pfx = format!("{sub}/");
                !m.entries.iter().any(|e| e.path.starts_with(&pfx))
            }
            Loc::Implicit | Loc::Nothing => true,
        })
    }

    /// Puts `m` at `key`; through a name of a hard-linked file, into its inode.
    pub fn put_key(&mut self, key: &str, m: Manifest, lineage: &Lineage) -> Result<(), MetaError> {
        self.put_key_at(key, m, lineage, self.now)
    }

    /// [`Txn::put_key`] of content changed at `at` (a hard-linked file's inode takes it as its
    /// ctime).
    pub fn put_key_at(
        &mut self,
        key: &str,
        m: Manifest,
        lineage: &Lineage,
        at: (i64, u32),
    ) -> Result<(), MetaError> {
        let version = manifest::version_of(&m);
        let mut r = record_for(&m, &version, lineage);
        if let Some(cur) = self.record(key)?.filter(|c| c.inode != 0) {
            (r.inode, r.nlink) = (cur.inode, cur.nlink);
            (r.ctime_sec, r.ctime_nsec) = at;
            self.inodes.insert(cur.inode, Some((r, Some(m))));
            self.pending
                .insert(key.to_string(), Pending::Link(cur.inode));
            return Ok(());
        }
        self.pending
            .insert(key.to_string(), Pending::Put(Box::new((r, m))));
        Ok(())
    }

    /// A GPU key: `m` (one root entry of kind GPU) with its table and holder in the record.
    pub fn put_gpu(
        &mut self,
        key: &str,
        m: Manifest,
        lineage: &Lineage,
        gpu: crate::proto::GpuKey,
    ) {
        let version = manifest::version_of(&m);
        let mut r = record_for(&m, &version, lineage);
        r.size = gpu.nbytes;
        r.gpu = Some(gpu);
        self.pending
            .insert(key.to_string(), Pending::Put(Box::new((r, m))));
    }

    /// Deletes the name `key`; a hard-linked file goes with its last name.
    pub fn delete_key(&mut self, key: &str) -> Result<(), MetaError> {
        if let Some(mut cur) = self.record(key)?.filter(|c| c.inode != 0) {
            cur.nlink = cur.nlink.saturating_sub(1);
            (cur.ctime_sec, cur.ctime_nsec) = self.now;
            let left = (cur.nlink > 0).then_some((cur.clone(), None));
            self.inodes.insert(cur.inode, left);
        }
        self.pending.insert(key.to_string(), Pending::Delete);
        Ok(())
    }

    /// Rewrites the manifest of directory key `key` through `edit`.
    pub fn edit_manifest(
        &mut self,
        key: &str,
        record: &KeyRecord,
        edit: impl FnOnce(&mut Vec<FileEntry>),
    ) -> Result<(), MetaError> {
        let mut m = self.manifest_of(key, record)?;
        edit(&mut m.entries);
        m.entries.sort_by(|a, b| a.path.cmp(&b.path));
        self.put_key(key, m, &Lineage::of(record))
    }

    /// Removes what is at `path` (and, with `recursive`, everything below it).
    pub fn remove_path(&mut self, path: &str, loc: &Loc, recursive: bool) -> Result<(), MetaError> {
        if !recursive
            && loc.kind() == Some(EntryKind::Directory)
            && !self.is_empty_dir(path, loc)?
        {
            return Err(MetaError::NotEmpty(format!(
                "{path} is a directory and not empty; use --recursive"
            )));
        }
        match loc {
            Loc::Key { .. } => self.delete_key(path)?,
            Loc::Entry {
                key, record, sub, ..
            } => {
                let pfx = format!("{sub}/");
                self.edit_manifest(key, record, |es| {
                    es.retain(|e| e.path != *sub && !e.path.starts_with(&pfx))
                })?;
            }
            Loc::Implicit => {}
            Loc::Nothing => return Err(MetaError::NotFound(path.to_string())),
        }
        for (k, _) in self.descendants(Some(path))? {
            self.delete_key(&k)?;
        }
        self.drop_attrs(path)
    }

    /// Writes every pending change in one batch, and returns once it is durable. The write
    /// lock goes as soon as the batch is queued, so the next change plans while this one waits.
    pub fn commit(self) -> Result<(), MetaError> {
        let meta = self.meta;
        let ticket = self.submit()?;
        meta.wait(ticket)
    }

    /// Reads ahead what planning a new entry at `path` will ask (see
    /// `MetaStore::read_ahead_for_new`): a change, holding the write lock.
    pub fn read_ahead_for_new(&self, path: &str) -> Result<(), MetaError> {
        match self.view {
            View::Planned => self.meta.read_ahead_for_new(&self.ns, path),
            View::Stored => Ok(()),
        }
    }

    /// Adds writes the change makes beside its own (a publish's small blocks and their
    /// references, where the metadata keeps them): they land with it or not at all.
    pub fn carry(&mut self, ops: Vec<Op>) {
        self.carried.extend(ops);
    }

    /// Queues every pending change as one batch and returns without waiting: the change is
    /// visible to later plans at once, and durable once [`MetaStore::wait`] of its ticket
    /// returned (so many changes can share one sync of the log).
    pub fn submit(mut self) -> Result<Ticket, MetaError> {
        let Some(guard) = self.guard.take() else {
            return Err(MetaError::BadRequest(
                "a read-only view of the metadata cannot commit".into(),
            ));
        };
        let ticket = self.meta.commits.submit(self.ops()?, self.epoch)?;
        drop(guard);
        Ok(ticket)
    }

    /// The writes the pending edits make.
    fn ops(&mut self) -> Result<Vec<Op>, MetaError> {
        let pending = std::mem::take(&mut self.pending);
        let inodes = std::mem::take(&mut self.inodes);
        if !inodes.is_empty() {
            self.meta
                .inode_changes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let attrs = std::mem::take(&mut self.attrs);
        let mut ops = std::mem::take(&mut self.carried);
        for (k, p) in pending {
            match p {
                Pending::Put(p) => {
                    let (r, m) = *p;
                    let v = Version::from_slice(&r.version)
                        .ok_or_else(|| MetaError::Corrupt("version".into()))?;
                    self.meta.touch_version(v);
                    ops.push(Op::Put(Table::Manifests, v.0.to_vec(), m.encode_to_vec()));
                    // A GPU key's bytes are in its holder's buffers, never a source of blocks.
                    if r.locale() == Locale::Local
                        && !r.origin_node.is_empty()
                        && r.kind() != EntryKind::Gpu
                    {
                        ops.push(Op::Put(
                            Table::Locations,
                            location_key(&v, &r.origin_node),
                            Vec::new(),
                        ));
                    }
                    ops.push(Op::Put(
                        Table::Keys,
                        key_bytes(&self.ns, &k),
                        r.encode_to_vec(),
                    ));
                }
                Pending::Link(id) => ops.push(Op::Put(
                    Table::Keys,
                    key_bytes(&self.ns, &k),
                    KeyRecord {
                        inode: id,
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )),
                Pending::Delete => ops.push(Op::Delete(Table::Keys, key_bytes(&self.ns, &k))),
            }
        }
        for (id, i) in inodes {
            let k = inode_bytes(&self.ns, id);
            let Some((r, m)) = i else {
                ops.push(Op::Delete(Table::Inodes, k));
                continue;
            };
            if let Some(v) = Version::from_slice(&r.version) {
                self.meta.touch_version(v);
            }
            if let Some(m) = m {
                let v = Version::from_slice(&r.version)
                    .ok_or_else(|| MetaError::Corrupt("version".into()))?;
                ops.push(Op::Put(Table::Manifests, v.0.to_vec(), m.encode_to_vec()));
                if r.locale() == Locale::Local && !r.origin_node.is_empty() {
                    ops.push(Op::Put(
                        Table::Locations,
                        location_key(&v, &r.origin_node),
                        Vec::new(),
                    ));
                }
            }
            ops.push(Op::Put(Table::Inodes, k, r.encode_to_vec()));
        }
        for (p, a) in attrs {
            let k = key_bytes(&self.ns, &p);
            ops.push(match a {
                Some(a) => Op::Put(Table::Attrs, k, a.encode_to_vec()),
                None => Op::Delete(Table::Attrs, k),
            });
        }
        Ok(ops)
    }
}

/// The entries of `m` at and below `sub`, rebased onto `to` (an empty `to` makes `sub` the root).
pub fn moved_entries(m: &Manifest, sub: &str, to: &str) -> Vec<FileEntry> {
    let pfx = format!("{sub}/");
    m.entries
        .iter()
        .filter_map(|e| {
            let rest = if e.path == sub {
                Some("")
            } else {
                e.path.strip_prefix(&pfx)
            }?;
            let mut e = e.clone();
            e.path = match (to.is_empty(), rest.is_empty()) {
                (true, _) => rest.to_string(),
                (false, true) => to.to_string(),
                (false, false) => format!("{to}/{rest}"),
            };
            Some(e)
        })
        .collect()
}
