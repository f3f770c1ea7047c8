//! The store server's metadata: keys, manifests, locations and node leases.
//!
//! Keys, manifests and locations live in a [`MetaBackend`] (RocksDB today) and survive a
//! restart; node leases live in memory ([`nodes`]). Every change is planned against a view that
//! sees its own pending edits and written in one atomic batch ([`txn`]), so a reader sees the
//! old version or the new one, never half of a put. Concurrent changes are made durable in
//! batches, one sync each ([`commit`]), and a change returns only once it is durable; until then
//! only changes planned after it see it. Time (TTLs, leases) comes from the injected clock.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prost::Message;

use crate::blocks::store::StoreBlocks;
use crate::blocks::touched::Touched;
use crate::blocks::BlockError;
use crate::clock::SharedClock;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::locks;
use crate::manifest::{self, EntryKind, FileEntry, Manifest, ManifestError};
use crate::proto::{
    KeyRecord, ListEntry, ListResponse, Listing, Locale, NodeInfo, PathAttrs, Source,
};

pub mod backend;
pub mod collected;
mod commit;
pub use commit::Ticket;
pub mod gc;
mod gpu;
mod keys;
pub mod nodes;
mod txn;

pub use backend::{BackendError, MetaBackend, FAMILIES};
use backend::{KeyValue, Step, Table};
pub use commit::CommitStats;
use keys::{file_entry, key_bytes, key_entry, live, location_key, manifest_listing, overlay};
use nodes::NodeLeases;
pub use txn::Loc;
use txn::{moved_entries, Lineage, Txn};

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("key {0} already exists (use --force to replace it)")]
    Exists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotEmpty(String),
    #[error("{0}")]
    NotDir(String),
    #[error("{0}")]
    IsDir(String),
    #[error("{0} blocks of the manifest are not in the store")]
    MissingBlocks(usize),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("block store: {0}")]
    Blocks(#[from] BlockError),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
}

/// What a resolve finds.
pub struct Resolved {
    pub key: String,
    pub record: KeyRecord,
    pub manifest: Manifest,
    pub subpath: String,
}

/// Which state a read sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// What is durable: what readers see.
    Stored,
    /// What is durable with every change queued for commit laid over it: what a change being
    /// planned (under the write lock) checks against.
    Planned,
}

pub struct MetaStore {
    backend: Box<dyn MetaBackend>,
    blocks: Arc<StoreBlocks>,
    /// Serialises the planning of publish, remove and every other change, which check and
    /// then write.
    write_lock: Mutex<()>,
    /// Changes planned and waiting to be durable.
    commits: commit::Commits,
    nodes: NodeLeases,
    clock: SharedClock,
    /// Versions written lately, which garbage collection keeps.
    touched: Mutex<Touched<Version>>,
    /// Blocks garbage collection took, which nodes learn of to drop them from their caches.
    collected: collected::Collected,
    /// Moves whenever a change edits a hard-linked file's inode record: every name of the
    /// file changed then, and those names are not listed anywhere the change could name them.
    inode_changes: std::sync::atomic::AtomicU64,
}

/// A number for this run of the server, different from the last one's: the time it started.
fn run_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

impl MetaStore {
    pub fn new(
        backend: impl MetaBackend,
        blocks: Arc<StoreBlocks>,
        lease: Duration,
        clock: SharedClock,
    ) -> Self {
        MetaStore {
            backend: Box::new(backend),
            blocks,
            write_lock: Mutex::new(()),
            commits: commit::Commits::default(),
            nodes: NodeLeases::new(lease, clock.clone()),
            clock,
            touched: Mutex::new(Touched::default()),
            collected: collected::Collected::new(run_epoch()),
            inode_changes: Default::default(),
        }
    }

    /// How many changes edited a hard-linked file's inode record so far: a watcher told of a
    /// change that moved it is told that everything changed.
    pub fn inode_changes(&self) -> u64 {
        self.inode_changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The store's blocks, which a publish of `locale=store` needs.
    pub fn blocks(&self) -> &Arc<StoreBlocks> {
        &self.blocks
    }

    fn now_ms(&self) -> i64 {
        self.clock.now().unix_ms
    }

    pub(crate) fn clock_now(&self) -> crate::clock::Moment {
        self.clock.now()
    }

    /// One stored value as `view` sees it.
    fn get(&self, view: View, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        // The overlay first: a batch leaves it only once stored, so a value is in one or the
        // other (or both) at any moment.
        if view == View::Planned {
            if let Some(v) = self.commits.planned(table, key) {
                return Ok(v);
            }
        }
        Ok(self.backend.get(table, key)?)
    }

    /// The values whose key starts with `prefix` as `view` sees them, in key order.
    fn scan(&self, view: View, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, MetaError> {
        let planned = match view {
            View::Stored => Vec::new(),
            View::Planned => self.commits.planned_below(table, prefix),
        };
        let rows = self.backend.scan_prefix(table, prefix)?;
        if planned.is_empty() {
            return Ok(rows);
        }
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = rows.into_iter().collect();
        for (k, v) in planned {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        Ok(merged.into_iter().collect())
    }

    /// Calls `f` with the values whose key starts with `prefix` as `view` sees them, in no
    /// particular order, until it returns `true`; says whether it did.
    fn scan_until(
        &self,
        view: View,
        table: Table,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, MetaError>,
    ) -> Result<bool, MetaError> {
        let planned = match view {
            View::Stored => Vec::new(),
            View::Planned => self.commits.planned_below(table, prefix),
        };
        for (k, v) in &planned {
            if let Some(v) = v {
                if f(k, v)? {
                    return Ok(true);
                }
            }
        }
        let mut found = false;
        self.walk_prefix(table, prefix, |k, v| {
            if planned.iter().any(|(p, _)| p.as_slice() == k) {
                return Ok(Step::Next);
            }
            found = f(k, v)?;
            Ok(if found { Step::Stop } else { Step::Next })
        })?;
        Ok(found)
    }

    /// Calls `f` with the stored values whose key starts with `prefix`, in key order, going on
    /// as it says (see [`Step`]); its error stops the walk and is returned.
    fn walk_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<Step, MetaError>,
    ) -> Result<(), MetaError> {
        let mut failed = None;
        self.backend.walk_prefix(table, prefix, &mut |k, v| {
            f(k, v).unwrap_or_else(|e| {
                failed = Some(e);
                Step::Stop
            })
        })?;
        failed.map_or(Ok(()), Err)
    }

    pub(crate) fn path_attrs(
        &self,
        view: View,
        ns: &Namespace,
        path: &str,
    ) -> Result<Option<PathAttrs>, MetaError> {
        let Some(v) = self.get(view, Table::Attrs, &key_bytes(ns, path))? else {
            return Ok(None);
        };
        PathAttrs::decode(v.as_slice())
            .map(Some)
            .map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// The stored attributes of the paths strictly below `path`, by their path relative to
    /// it: of every path below, or with `one_level` of the names directly in it alone (without
    /// reading what lies deeper).
    fn attrs_below(
        &self,
        ns: &Namespace,
        path: &str,
        one_level: bool,
    ) -> Result<std::collections::HashMap<String, PathAttrs>, MetaError> {
        let prefix = if path.is_empty() {
            key_bytes(ns, "")
        } else {
            key_bytes(ns, &format!("{path}/"))
        };
        let mut out = std::collections::HashMap::new();
        let corrupt = || MetaError::Corrupt("path attributes".into());
        self.walk_prefix(Table::Attrs, &prefix, |k, v| {
            let rel = k.get(prefix.len()..).ok_or_else(corrupt)?;
            if rel.is_empty() {
                return Ok(Step::Next);
            }
            if let (true, Some(i)) = (one_level, rel.iter().position(|&b| b == b'/')) {
                return Ok(Step::Past(prefix.len() + i + 1));
            }
            let a = PathAttrs::decode(v).map_err(|_| corrupt())?;
            let rel =
                String::from_utf8(rel.to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()))?;
            out.insert(rel, a);
            Ok(Step::Next)
        })?;
        Ok(out)
    }

    /// Paths strictly below `path` (everything for the root) with attributes of their own.
    pub(crate) fn attr_paths_below(
        &self,
        view: View,
        ns: &Namespace,
        path: &str,
    ) -> Result<Vec<String>, MetaError> {
        let prefix = if path.is_empty() {
            key_bytes(ns, "")
        } else {
            key_bytes(ns, &format!("{path}/"))
        };
        let skip = ns.as_str().len() + 1;
        let rows = self.scan(view, Table::Attrs, &prefix)?;
        rows.into_iter()
            .filter(|(k, _)| k.len() > skip)
            .map(|(k, _)| {
                String::from_utf8(k[skip..].to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()))
            })
            .collect()
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), MetaError> {
        Ok(self.backend.flush()?)
    }

    pub(crate) fn record(
        &self,
        view: View,
        ns: &Namespace,
        key: &str,
    ) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.get(view, Table::Keys, &key_bytes(ns, key))? else {
            return Ok(None);
        };
        let r = self.name_record(view, ns, &v)?;
        Ok(self.visible(&r, self.now_ms()).then_some(r))
    }

    /// A stored name's record: its own, or a hard-linked file's inode record.
    fn name_record(
        &self,
        view: View,
        ns: &Namespace,
        bytes: &[u8],
    ) -> Result<KeyRecord, MetaError> {
        let r = KeyRecord::decode(bytes).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        if r.inode == 0 {
            return Ok(r);
        }
        self.inode(view, ns, r.inode)?
            .ok_or_else(|| MetaError::Corrupt(format!("inode {} of a name is missing", r.inode)))
    }

    pub(crate) fn inode(
        &self,
        view: View,
        ns: &Namespace,
        id: u64,
    ) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.get(view, Table::Inodes, &keys::inode_bytes(ns, id))? else {
            return Ok(None);
        };
        KeyRecord::decode(v.as_slice())
            .map(Some)
            .map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// Whether a stored key is there for readers: not expired, and a GPU key only while the
    /// node that holds its buffers is alive.
    fn visible(&self, r: &KeyRecord, now_ms: i64) -> bool {
        live(r, now_ms) && (r.kind() != EntryKind::Gpu || self.node_alive(&r.origin_node))
    }

    pub(crate) fn manifest(&self, view: View, version: &[u8]) -> Result<Manifest, MetaError> {
        let bytes = self
            .get(view, Table::Manifests, version)?
            .ok_or_else(|| MetaError::Corrupt("manifest missing for a live key".into()))?;
        Manifest::decode(bytes.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// The manifest of `version`, or `None` where the store holds no such version.
    pub(crate) fn manifest_if_any(&self, version: &[u8]) -> Result<Option<Manifest>, MetaError> {
        match self.backend.get(Table::Manifests, version)? {
            None => Ok(None),
            Some(bytes) => Manifest::decode(bytes.as_slice())
                .map(Some)
                .map_err(|e| MetaError::Corrupt(e.to_string())),
        }
    }

    /// Live keys strictly below `key` (or all keys of the namespace for `None`).
    pub(crate) fn descendants(
        &self,
        view: View,
        ns: &Namespace,
        key: Option<&str>,
    ) -> Result<Vec<(String, KeyRecord)>, MetaError> {
        let prefix = match key {
            Some(k) => key_bytes(ns, &format!("{k}/")),
            None => key_bytes(ns, ""),
        };
        let skip = ns.as_str().len() + 1;
        let mut out = Vec::new();
        let now = self.now_ms();
        for (k, v) in self.scan(view, Table::Keys, &prefix)? {
            let r = self.name_record(view, ns, &v)?;
            if self.visible(&r, now) {
                let name = String::from_utf8(k[skip..].to_vec())
                    .map_err(|e| MetaError::Corrupt(e.to_string()))?;
                out.push((name, r));
            }
        }
        Ok(out)
    }

    /// The level directly below `key` (the namespace's top for `None`) as a listing of it
    /// shows it, in name order: each live key there with its record, and each name live keys
    /// lie below as a directory (`None`), found by reading keys below it only until one is
    /// live: a listing of a namespace's root does not read every key in the namespace.
    pub(crate) fn children(
        &self,
        ns: &Namespace,
        key: Option<&str>,
    ) -> Result<Vec<(String, Option<KeyRecord>)>, MetaError> {
        let prefix = match key {
            Some(k) => key_bytes(ns, &format!("{k}/")),
            None => key_bytes(ns, ""),
        };
        let now = self.now_ms();
        let name =
            |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()));
        let mut out = Vec::new();
        self.walk_prefix(Table::Keys, &prefix, |k, v| {
            let rel = k
                .get(prefix.len()..)
                .ok_or_else(|| MetaError::Corrupt("a stored key's name".into()))?;
            let r = self.name_record(View::Stored, ns, v)?;
            if !self.visible(&r, now) {
                return Ok(Step::Next);
            }
            Ok(match rel.iter().position(|&b| b == b'/') {
                Some(i) => {
                    out.push((name(&rel[..i])?, None));
                    Step::Past(prefix.len() + i + 1)
                }
                None => {
                    out.push((name(rel)?, Some(r)));
                    Step::Next
                }
            })
        })?;
        Ok(out)
    }

    /// Whether a live key lies strictly below `key`, leaving out the names `skip` says a
    /// change decides itself. Reads keys only until it finds one: a publish into a directory of
    /// thousands of keys asks this of the directory, once or twice.
    pub(crate) fn any_descendant(
        &self,
        view: View,
        ns: &Namespace,
        key: &str,
        skip: impl Fn(&str) -> bool,
    ) -> Result<bool, MetaError> {
        let prefix = key_bytes(ns, &format!("{key}/"));
        let name_at = ns.as_str().len() + 1;
        let now = self.now_ms();
        self.scan_until(view, Table::Keys, &prefix, |k, v| {
            let name = k
                .get(name_at..)
                .and_then(|n| std::str::from_utf8(n).ok())
                .ok_or_else(|| MetaError::Corrupt("a stored key's name".into()))?;
            if skip(name) {
                return Ok(false);
            }
            let r = self.name_record(view, ns, v)?;
            Ok(self.visible(&r, now))
        })
    }

    /// The state of queued commits.
    pub fn commit_stats(&self) -> CommitStats {
        self.commits.stats()
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        locks::lock(&self.write_lock)
    }

    /// Every block of `m` is in the store, with the length the manifest gives it: a manifest
    /// that lies about a block's length would show one size in listings and another in reads.
    /// Blocks of `known` (the version a patch was made against, checked when it was published)
    /// are not looked up again: a one-file edit of a tree of thousands checks one file's
    /// blocks, not a lookup per block of the tree (measured: more than half the server's time
    /// of such a publish).
    fn check_stored_blocks(
        &self,
        key: &KeyPath,
        m: &Manifest,
        known: Option<&Manifest>,
    ) -> Result<(), MetaError> {
        let known: std::collections::HashSet<(&[u8], u32)> = known
            .iter()
            .flat_map(|k| &k.entries)
            .flat_map(|e| &e.blocks)
            .map(|b| (b.hash.as_slice(), b.len))
            .collect();
        let mut missing = 0;
        for e in &m.entries {
            for (i, b) in e.blocks.iter().enumerate() {
                if known.contains(&(b.hash.as_slice(), b.len)) {
                    continue;
                }
                let hash: BlockHash = manifest::block_hash(b)
                    .ok_or_else(|| ManifestError::BadBlock(e.path.clone()))?;
                match self.blocks.stored_len(&hash)? {
                    None => missing += 1,
                    Some(len) if len != b.len => {
                        let file = if e.path.is_empty() {
                            key.to_string()
                        } else {
                            format!("{key}/{}", e.path)
                        };
                        return Err(MetaError::BadRequest(format!(
                            "{file}: block {i} ({}) is {len} bytes in the store, the manifest says {}",
                            hash.hex(),
                            b.len
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        if missing > 0 {
            return Err(MetaError::MissingBlocks(missing));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        manifest: &Manifest,
        locale: Locale,
        origin: &str,
        ttl_secs: u64,
        force: bool,
    ) -> Result<Version, MetaError> {
        self.publish_over(ns, key, manifest, None, locale, origin, ttl_secs, force)
    }

    /// [`MetaStore::publish`] of a manifest made by patching `base` (the key's current
    /// version), whose blocks need no check again.
    #[allow(clippy::too_many_arguments)]
    pub fn publish_over(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        manifest: &Manifest,
        base: Option<&Manifest>,
        locale: Locale,
        origin: &str,
        ttl_secs: u64,
        force: bool,
    ) -> Result<Version, MetaError> {
        let (version, ticket) =
            self.publish_queued_over(ns, key, manifest, base, locale, origin, ttl_secs, force)?;
        self.wait(ticket)?;
        Ok(version)
    }

    /// Returns once the change of `ticket` is durable (or failed). Waiting for the last of
    /// several queued changes makes all of them durable, in one sync where they were queued
    /// together.
    pub fn wait(&self, ticket: commit::Ticket) -> Result<(), MetaError> {
        Ok(self.commits.wait(ticket, self.backend.as_ref())?)
    }

    /// [`MetaStore::publish`] without waiting for the change to be durable: its ticket, for
    /// [`MetaStore::wait`] (a batch of publishes queues each, then waits once).
    #[allow(clippy::too_many_arguments)]
    pub fn publish_queued(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        manifest: &Manifest,
        locale: Locale,
        origin: &str,
        ttl_secs: u64,
        force: bool,
    ) -> Result<(Version, commit::Ticket), MetaError> {
        self.publish_queued_over(ns, key, manifest, None, locale, origin, ttl_secs, force)
    }

    #[allow(clippy::too_many_arguments)]
    fn publish_queued_over(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        manifest: &Manifest,
        base: Option<&Manifest>,
        locale: Locale,
        origin: &str,
        ttl_secs: u64,
        force: bool,
    ) -> Result<(Version, commit::Ticket), MetaError> {
        manifest::validate(manifest)?;
        if locale == Locale::Local && !self.node_alive(origin) {
            return Err(MetaError::BadRequest(format!(
                "origin node {origin:?} is not registered with the store server"
            )));
        }
        // A `locale=local` manifest's blocks are on its origin node, not here: its lengths
        // cannot be checked against anything the store holds, and every reader checks the
        // length of each block it receives instead (`fetch`, the mount's loader).
        if locale == Locale::Store {
            self.check_stored_blocks(key, manifest, base)?;
            // The key must never outlive its blocks in a crash.
            self.blocks.make_durable()?;
        }
        let version = manifest::version_of(manifest);
        let new_is_dir = manifest::is_directory(manifest);
        let mut t = Txn::write(self, ns);
        let path = key.as_str();
        t.check_parent(path)?;
        let loc = t.locate(path)?;
        match &loc {
            // A GPU key and a file never share a name, whatever --force says.
            Loc::Key { record } if record.kind() == EntryKind::Gpu => {
                return Err(MetaError::Exists(format!("{key} (a GPU key)")))
            }
            Loc::Nothing => {}
            Loc::Key { record } if record.version == version.0 => {}
            _ if !force => return Err(MetaError::Exists(key.to_string())),
            _ => {}
        }
        if !loc.exists() {
            t.stamp_new_entry(path)?;
        }
        if loc.exists() {
            if new_is_dir {
                // A directory replaces the whole subtree.
                t.remove_path(path, &loc, true)?;
            } else if loc.kind() == Some(EntryKind::Directory) {
                if !t.is_empty_dir(path, &loc)? {
                    return Err(MetaError::IsDir(format!("{key} is a directory")));
                }
                t.remove_path(path, &loc, false)?;
            } else if let Loc::Entry { .. } = loc {
                t.remove_path(path, &loc, false)?;
            }
            // What the path showed of its own goes with what it was.
            t.drop_attrs(path)?;
        }
        // Stamped to the nanosecond, as its directory is (a key's record keeps milliseconds).
        t.touch(path, false)?;
        t.put_key(
            path,
            manifest.clone(),
            &Lineage::fresh(locale, origin, ttl_secs, self.now_ms()),
        )?;
        Ok((version, t.submit()?))
    }

    pub fn locate(&self, ns: &Namespace, key: &KeyPath) -> Result<Loc, MetaError> {
        Txn::new(self, ns).locate(key.as_str())
    }

    pub fn resolve(&self, ns: &Namespace, key: &KeyPath) -> Result<Resolved, MetaError> {
        let t = Txn::new(self, ns);
        match t.locate(key.as_str())? {
            Loc::Key { record } => Ok(Resolved {
                key: key.to_string(),
                manifest: t.manifest_of(key.as_str(), &record)?,
                record,
                subpath: String::new(),
            }),
            Loc::Entry {
                key: found,
                record,
                sub,
                ..
            } => {
                let full = t.manifest_of(&found, &record)?;
                let manifest = manifest::subtree(&full, &sub)
                    .ok_or_else(|| MetaError::NotFound(key.to_string()))?;
                Ok(Resolved {
                    key: found,
                    record,
                    manifest,
                    subpath: sub,
                })
            }
            Loc::Implicit | Loc::Nothing => Err(MetaError::NotFound(key.to_string())),
        }
    }

    /// The entries directly below `prefix` (or everything below it when `recursive`), merging
    /// published keys, their parents and the insides of published directories, and the listed
    /// directory's own entry (the namespace's root for no prefix).
    pub fn list(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
    ) -> Result<ListResponse, MetaError> {
        self.list_with(ns, prefix, recursive, false)
    }

    /// The entry of the directory at `prefix` (the namespace's root for none) alone: its
    /// attributes without the cost of what it holds.
    pub fn list_dir_only(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
    ) -> Result<ListResponse, MetaError> {
        self.list_with(ns, prefix, false, true)
    }

    fn list_with(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
        dir_only: bool,
    ) -> Result<ListResponse, MetaError> {
        let t = Txn::new(self, ns);
        let base = prefix.map_or("", KeyPath::as_str);
        let mut out: BTreeMap<String, ListEntry> = BTreeMap::new();
        let bare_dir = || ListEntry {
            is_directory: true,
            locale: Locale::Store as i32,
            kind: EntryKind::Directory as i32,
            ..Default::default()
        };
        let loc = match prefix {
            Some(p) => t.locate(p.as_str())?,
            None => Loc::Implicit,
        };
        if dir_only {
            let mut dir = match &loc {
                Loc::Key { record } => Some(key_entry("", record)),
                Loc::Entry { record, entry, .. } => Some(file_entry(String::new(), entry, record)),
                Loc::Implicit => Some(bare_dir()),
                Loc::Nothing => None,
            };
            if let Some(d) = dir.as_mut() {
                overlay(d, t.attrs(base)?.as_ref());
                d.name.clear();
            }
            return Ok(ListResponse {
                entries: Vec::new(),
                exists: loc.exists(),
                dir,
                ahead: Vec::new(),
            });
        }
        let mut dir = match &loc {
            Loc::Key { record } => {
                let m = t.manifest_of(base, record)?;
                for e in manifest_listing(&m, record, recursive) {
                    out.insert(e.name.trim_end_matches('/').to_string(), e);
                }
                Some(key_entry("", record))
            }
            Loc::Entry {
                key,
                record,
                sub,
                entry,
            } => {
                let full = t.manifest_of(key, record)?;
                let m = manifest::subtree(&full, sub)
                    .ok_or_else(|| MetaError::NotFound(base.to_string()))?;
                for e in manifest_listing(&m, record, recursive) {
                    out.insert(e.name.trim_end_matches('/').to_string(), e);
                }
                Some(file_entry(String::new(), entry, record))
            }
            Loc::Implicit => Some(bare_dir()),
            Loc::Nothing => None,
        };
        self.list_keys(&t, prefix, recursive, &mut out, bare_dir)?;
        // One scan of the attributes below, as the keys below were scanned: no lookup each.
        let below = self.attrs_below(ns, base, !recursive)?;
        for (name, e) in out.iter_mut() {
            overlay(e, below.get(name.as_str()));
        }
        if let Some(d) = dir.as_mut() {
            overlay(d, t.attrs(base)?.as_ref());
            d.name.clear();
        }
        Ok(ListResponse {
            entries: out.into_values().collect(),
            exists: loc.exists(),
            dir,
            ahead: Vec::new(),
        })
    }

    /// The listings a walk of the tree in name order (ls -R, find, cp -r) reads after the
    /// one of `prefix` (`first`): each directory below it, depth first, then those after it in
    /// its parent (no higher: a walk of a tree that began there would not go on to its
    /// neighbours, and whoever walks higher asks there); whole listings only, until `budget`
    /// entries or `max_bytes` in all.
    pub fn listings_ahead(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        first: &ListResponse,
        budget: usize,
        max_bytes: usize,
    ) -> Result<Vec<Listing>, MetaError> {
        let at = prefix.map_or("", KeyPath::as_str);
        let mut ahead = Ahead {
            out: Vec::new(),
            room: (budget, max_bytes),
        };
        if !self.walk_ahead(ns, subdirs(at, &first.entries, None), &mut ahead)? || at.is_empty() {
            return Ok(ahead.out);
        }
        let (parent, name) = at.rsplit_once('/').unwrap_or(("", at));
        let parent_key =
            KeyPath::parse_prefix(parent).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        let l = self.list(ns, parent_key.as_ref(), false)?;
        self.walk_ahead(ns, subdirs(parent, &l.entries, Some(name)), &mut ahead)?;
        Ok(ahead.out)
    }

    /// Lists `stack` (popped from the end) and the directories below each, depth first, into
    /// `ahead` while it has room; says whether the walk ended without running out of it.
    fn walk_ahead(
        &self,
        ns: &Namespace,
        mut stack: Vec<String>,
        ahead: &mut Ahead,
    ) -> Result<bool, MetaError> {
        while let Some(path) = stack.pop() {
            let Ok(key) = KeyPath::parse(&path) else {
                continue;
            };
            let l = self.list(ns, Some(&key), false)?;
            if !l.exists {
                continue;
            }
            let listing = Listing {
                path,
                entries: l.entries,
                dir: l.dir,
            };
            let (entries, bytes) = (listing.entries.len(), listing.encoded_len());
            if entries > ahead.room.0 || bytes > ahead.room.1 {
                return Ok(false);
            }
            ahead.room = (ahead.room.0 - entries, ahead.room.1 - bytes);
            stack.extend(subdirs(&listing.path, &listing.entries, None));
            ahead.out.push(listing);
        }
        Ok(true)
    }

    fn list_keys(
        &self,
        t: &Txn<'_>,
        prefix: Option<&KeyPath>,
        recursive: bool,
        out: &mut BTreeMap<String, ListEntry>,
        bare_dir: impl Fn() -> ListEntry,
    ) -> Result<(), MetaError> {
        if !recursive {
            for (name, r) in t.children(prefix.map(KeyPath::as_str))? {
                match r {
                    Some(r) => {
                        out.insert(name.clone(), key_entry(&name, &r));
                    }
                    None => {
                        out.entry(name.clone()).or_insert_with(|| ListEntry {
                            name: format!("{name}/"),
                            ..bare_dir()
                        });
                    }
                }
            }
            return Ok(());
        }
        let strip = prefix.map_or(0, |p| p.as_str().len() + 1);
        for (name, r) in t.descendants(prefix.map(KeyPath::as_str))? {
            out.insert(name[strip..].to_string(), key_entry(&name[strip..], &r));
        }
        Ok(())
    }

    pub fn remove(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        recursive: bool,
        prefix: bool,
    ) -> Result<Vec<String>, MetaError> {
        let mut t = Txn::write(self, ns);
        if prefix {
            let doomed: Vec<String> = t
                .descendants(None)?
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| k.starts_with(key.as_str()))
                .collect();
            if doomed.is_empty() {
                return Err(MetaError::NotFound(format!("{key}*")));
            }
            for k in &doomed {
                t.delete_key(k)?;
                t.drop_attrs(k)?;
                t.touch_parent(k)?;
            }
            for k in &doomed {
                t.prune_vanished(k)?;
            }
            t.commit()?;
            return Ok(doomed);
        }
        let loc = t.locate(key.as_str())?;
        let mut removed: Vec<String> = t
            .descendants(Some(key.as_str()))?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        removed.insert(0, key.to_string());
        t.remove_path(key.as_str(), &loc, recursive)?;
        t.touch_parent(key.as_str())?;
        t.prune_vanished(key.as_str())?;
        t.commit()?;
        Ok(removed)
    }

    /// Moves `from` to `to`: a key, a directory of keys, or a path inside a published directory.
    /// Only metadata changes; blocks stay where they are.
    pub fn rename(
        &self,
        ns: &Namespace,
        from: &KeyPath,
        to: &KeyPath,
        no_replace: bool,
    ) -> Result<(), MetaError> {
        let (f, d) = (from.as_str(), to.as_str());
        if d.starts_with(f) && d.as_bytes().get(f.len()) == Some(&b'/') {
            return Err(MetaError::BadRequest(format!(
                "cannot move {from} into itself"
            )));
        }
        let mut t = Txn::write(self, ns);
        let src = t.locate(f)?;
        let src_kind = src
            .kind()
            .ok_or_else(|| MetaError::NotFound(from.to_string()))?;
        // Onto itself changes nothing, but only once the name is known to exist.
        if f == d {
            return Ok(());
        }
        t.check_parent(d)?;
        let dst = t.locate(d)?;
        if src_kind == EntryKind::Gpu || dst.kind() == Some(EntryKind::Gpu) {
            return Err(MetaError::BadRequest(
                "a GPU key is neither renamed nor replaced by a rename".into(),
            ));
        }
        if let Some(dk) = dst.kind() {
            if no_replace {
                return Err(MetaError::Exists(to.to_string()));
            }
            let (sd, dd) = (src_kind == EntryKind::Directory, dk == EntryKind::Directory);
            if sd && !dd {
                return Err(MetaError::NotDir(format!("{to} is not a directory")));
            }
            if !sd && dd {
                return Err(MetaError::IsDir(format!("{to} is a directory")));
            }
            t.remove_path(d, &dst, false)?;
        }
        move_path(&mut t, f, d, from)?;
        // As a local filesystem stamps them: the moved entry, and both directories.
        let new_dest = !dst.exists();
        t.touch(d, false)?;
        t.touch_parent(f)?;
        if new_dest {
            t.stamp_new_entry(d)?;
        } else {
            t.touch_parent(d)?;
        }
        t.prune_vanished(f)?;
        t.commit()
    }

    /// Swaps what `a` and `b` name (`renameat2(RENAME_EXCHANGE)`): both must exist, of any
    /// kinds, and neither may lie inside the other. One batch, so another node sees both names
    /// as they were or both swapped. The swap passes through a name no one can see, since the
    /// batch is written whole.
    pub fn exchange(&self, ns: &Namespace, a: &KeyPath, b: &KeyPath) -> Result<(), MetaError> {
        let (f, d) = (a.as_str(), b.as_str());
        let inside =
            |x: &str, y: &str| y.starts_with(x) && y.as_bytes().get(x.len()) == Some(&b'/');
        if inside(f, d) || inside(d, f) {
            return Err(MetaError::BadRequest(format!(
                "cannot exchange {a} and {b}: one holds the other"
            )));
        }
        let mut t = Txn::write(self, ns);
        for (p, key) in [(f, a), (d, b)] {
            match t.locate(p)?.kind() {
                None => return Err(MetaError::NotFound(key.to_string())),
                Some(EntryKind::Gpu) => {
                    return Err(MetaError::BadRequest(
                        "a GPU key is neither renamed nor replaced by a rename".into(),
                    ))
                }
                Some(_) => {}
            }
        }
        if f == d {
            return Ok(());
        }
        // A name beside `a` that no key can have (keys never hold a NUL).
        let hidden = match f.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/\0exchange"),
            None => "\0exchange".to_string(),
        };
        move_path(&mut t, f, &hidden, a)?;
        move_path(&mut t, d, f, b)?;
        move_path(&mut t, &hidden, d, a)?;
        // As a local filesystem stamps them: both entries, and both directories.
        t.touch(f, false)?;
        t.touch(d, false)?;
        t.touch_parent(f)?;
        t.touch_parent(d)?;
        t.commit()
    }

    /// Gives the file at `from` a second name `to` (a hard link): one inode record that both
    /// names share, so a write, chmod or unlink through either is what the other shows. A file
    /// inside a published directory becomes a key of its own first (a metadata-only move).
    pub fn link(&self, ns: &Namespace, from: &KeyPath, to: &KeyPath) -> Result<(), MetaError> {
        let (f, d) = (from.as_str(), to.as_str());
        let mut t = Txn::write(self, ns);
        let src = t.locate(f)?;
        match src.kind() {
            None => return Err(MetaError::NotFound(from.to_string())),
            Some(EntryKind::Directory) => {
                return Err(MetaError::IsDir(format!(
                    "{from} is a directory: it has one name"
                )))
            }
            Some(EntryKind::Gpu) => {
                return Err(MetaError::BadRequest(format!("{from} is a GPU key")))
            }
            _ => {}
        }
        t.check_parent(d)?;
        if t.locate(d)?.exists() {
            return Err(MetaError::Exists(to.to_string()));
        }
        if let Loc::Entry {
            key, record, sub, ..
        } = &src
        {
            let m = t.manifest_of(key, record)?;
            let extracted = Manifest {
                block_size: m.block_size,
                entries: moved_entries(&m, sub, ""),
            };
            t.edit_manifest(key, record, |es| es.retain(|e| e.path != *sub))?;
            t.put_key(f, extracted, &Lineage::of(record))?;
        }
        t.link(f, d)?;
        t.stamp_new_entry(d)?;
        t.commit()
    }

    /// Sets the mode, owner and/or mtime of whatever is at `key`, and stamps its ctime. A
    /// file's mode, owner and mtime are in its manifest entry (a metadata-only new version that
    /// shares the blocks); a directory's mtime, and everything of a directory that is only a
    /// parent of keys, are path attributes.
    pub fn set_attr(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
        owner: (Option<u32>, Option<u32>),
    ) -> Result<(), MetaError> {
        let mut t = Txn::write(self, ns);
        let path = key.as_str();
        let loc = t.locate(path)?;
        let is_dir = loc.kind() == Some(EntryKind::Directory);
        let entry_mtime = mtime.filter(|_| !is_dir);
        let apply = |e: &mut FileEntry| {
            if let Some(m) = mode {
                e.mode = m & 0o7777;
            }
            if owner.0.is_some() {
                e.uid = owner.0;
            }
            if owner.1.is_some() {
                e.gid = owner.1;
            }
            if let Some((s, n)) = entry_mtime {
                e.mtime_sec = s;
                e.mtime_nsec = n;
            }
        };
        let edits_entry = mode.is_some() || owner != (None, None) || entry_mtime.is_some();
        match &loc {
            Loc::Key { record } if record.kind() == EntryKind::Gpu => {
                return Err(MetaError::BadRequest(format!(
                    "{key} is a GPU key: it has no mode, owner or mtime to set"
                )))
            }
            Loc::Key { record } if edits_entry => t.edit_manifest(path, record, |es| {
                if let Some(root) = es.first_mut() {
                    apply(root);
                }
            })?,
            Loc::Entry {
                key: k,
                record,
                sub,
                ..
            } if edits_entry => t.edit_manifest(k, record, |es| {
                if let Some(e) = es.iter_mut().find(|e| e.path == *sub) {
                    apply(e);
                }
            })?,
            Loc::Implicit => t.update_attrs(path, |a| {
                if let Some(m) = mode {
                    a.mode = Some(m & 0o7777);
                }
                if owner.0.is_some() {
                    a.uid = owner.0;
                }
                if owner.1.is_some() {
                    a.gid = owner.1;
                }
            })?,
            Loc::Nothing => return Err(MetaError::NotFound(key.to_string())),
            _ => {}
        }
        if let (true, Some((s, n))) = (is_dir, mtime) {
            t.update_attrs(path, |a| {
                a.mtime_sec = Some(s);
                a.mtime_nsec = n;
            })?;
        }
        t.touch(path, false)?;
        t.commit()
    }

    pub fn register_node(&self, node: NodeInfo) {
        self.nodes.register(node);
    }

    /// Renews a node's lease; `false` when the node must register again (e.g. after a restart).
    pub fn heartbeat(&self, node_id: &str) -> bool {
        self.nodes.heartbeat(node_id)
    }

    /// What a node's heartbeat says it has open, which collection keeps while its lease holds.
    pub fn set_open_versions(&self, node_id: &str, versions: HashSet<Version>) {
        self.nodes.set_open(node_id, versions);
    }

    /// Versions open on live nodes.
    pub fn open_versions(&self) -> HashSet<Version> {
        self.nodes.open_versions()
    }

    /// The blocks collected after a node's cursor.
    pub fn collected_since(&self, after: u64, epoch: u64) -> collected::Since {
        self.collected.since(after, epoch)
    }

    pub fn lease(&self) -> Duration {
        self.nodes.lease()
    }

    fn node_alive(&self, node_id: &str) -> bool {
        self.live_node(node_id).is_some()
    }

    pub fn live_nodes(&self) -> usize {
        self.nodes.live_count()
    }

    pub fn live_node(&self, node_id: &str) -> Option<NodeInfo> {
        self.nodes.live(node_id)
    }

    pub fn add_location(&self, version: &Version, node_id: &str) -> Result<(), MetaError> {
        if !self.node_alive(node_id) {
            return Err(MetaError::BadRequest(format!(
                "node {node_id:?} is not registered"
            )));
        }
        if self.backend.get(Table::Manifests, &version.0)?.is_none() {
            return Err(MetaError::NotFound(format!("version {version}")));
        }
        self.backend.write(vec![backend::Op::Put(
            Table::Locations,
            location_key(version, node_id),
            Vec::new(),
        )])?;
        Ok(())
    }

    /// `node_id` holds `version` no more (its copy was removed): no longer one of its sources.
    pub fn remove_location(&self, version: &Version, node_id: &str) -> Result<(), MetaError> {
        self.backend.write(vec![backend::Op::Delete(
            Table::Locations,
            location_key(version, node_id),
        )])?;
        Ok(())
    }

    /// The live sources of a version: nodes that hold it, then the store server itself for
    /// `locale=store` (an empty address: the caller already knows the server's).
    pub fn sources(&self, version: &Version, record: &KeyRecord) -> Result<Vec<Source>, MetaError> {
        let mut out = Vec::new();
        for (k, _) in self.backend.scan_prefix(Table::Locations, &version.0)? {
            let node = String::from_utf8_lossy(&k[32..]).into_owned();
            if let Some(info) = self.live_node(&node) {
                out.push(Source {
                    origin: node == record.origin_node,
                    node_id: info.node_id,
                    data_addr: info.data_addr,
                    zone: info.zone,
                });
            }
        }
        if record.locale() == Locale::Store {
            out.push(Source {
                origin: true,
                ..Default::default()
            });
        }
        Ok(out)
    }
}

/// Listings asked for ahead, and the entries and bytes still allowed.
struct Ahead {
    out: Vec<Listing>,
    room: (usize, usize),
}

/// The directories among `entries` (of the directory `at`), after the name `after` if given,
/// as paths in a stack that pops them in name order.
fn subdirs(at: &str, entries: &[ListEntry], after: Option<&str>) -> Vec<String> {
    let mut dirs: Vec<String> = entries
        .iter()
        .filter(|e| e.is_directory)
        .map(|e| e.name.trim_end_matches('/'))
        .filter(|n| after.is_none_or(|a| *n > a))
        .map(|n| match at {
            "" => n.to_string(),
            at => format!("{at}/{n}"),
        })
        .collect();
    dirs.reverse();
    dirs
}

#[cfg(test)]
mod commit_tests;
#[cfg(test)]
mod tests;

/// Moves what `f` names, with every key below it and their path attributes, to `d`, which the
/// caller has made free. Only metadata changes; blocks stay where they are.
fn move_path(t: &mut Txn, f: &str, d: &str, from: &KeyPath) -> Result<(), MetaError> {
    // Keys below the source move with it.
    let below = t.descendants(Some(f))?;
    match t.locate(f)? {
        Loc::Key { .. } => t.move_key(f, d)?,
        Loc::Entry {
            key, record, sub, ..
        } => {
            let same_dir_key = t
                .covering(d)?
                .is_some_and(|(k, r)| k == key && r.is_directory);
            if same_dir_key {
                let to_sub = d[key.len() + 1..].to_string();
                let m = t.manifest_of(&key, &record)?;
                let moved = moved_entries(&m, &sub, &to_sub);
                let pfx = format!("{sub}/");
                t.edit_manifest(&key, &record, |es| {
                    es.retain(|e| e.path != sub && !e.path.starts_with(&pfx));
                    es.extend(moved);
                })?;
            } else {
                let m = t.manifest_of(&key, &record)?;
                let extracted = Manifest {
                    block_size: m.block_size,
                    entries: moved_entries(&m, &sub, ""),
                };
                let pfx = format!("{sub}/");
                t.edit_manifest(&key, &record, |es| {
                    es.retain(|e| e.path != sub && !e.path.starts_with(&pfx))
                })?;
                t.put_key(d, extracted, &Lineage::of(&record))?;
            }
        }
        Loc::Implicit => {}
        Loc::Nothing => return Err(MetaError::NotFound(from.to_string())),
    }
    for (k, _) in below {
        t.move_key(&k, &format!("{d}{}", &k[f.len()..]))?;
    }
    t.move_attrs(f, d)?;
    Ok(())
}
