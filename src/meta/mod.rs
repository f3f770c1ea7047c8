//! The store server's metadata: keys, manifests, locations and node leases.
//!
//! Keys, manifests and locations live in RocksDB and survive a restart. Node leases live in
//! memory: after a restart no node is offered as a source until it heartbeats again, which is
//! exactly when it is known to be alive. Publishing writes the manifest and the key record in one
//! atomic batch, so a reader sees the old version or the new one, never half of a put.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::blockfiles::{BlockFiles, MIN_FILE_BLOCK};
use crate::dataplane::Served;
use crate::db::{BatchOp, Db, DbError};
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, FileEntry, Manifest, ManifestError};
use crate::proto::{KeyRecord, ListEntry, Locale, NodeInfo, Source};

mod txn;
pub use txn::Loc;
use txn::{moved_entries, Lineage, Txn};

pub const CF_KEYS: &str = "keys";
pub const CF_MANIFESTS: &str = "manifests";
pub const CF_LOCATIONS: &str = "locations";
pub const CF_BLOCKS: &str = "blocks";
/// Which blocks the store holds (hash -> length): asking RocksDB whether a blob-file value
/// exists reads the whole value and checks its CRC, 4 MiB per question.
pub const CF_BLOCK_INDEX: &str = "block_index";
pub const FAMILIES: &[&str] = &[
    CF_KEYS,
    CF_MANIFESTS,
    CF_LOCATIONS,
    CF_BLOCKS,
    CF_BLOCK_INDEX,
];

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
    Db(#[from] DbError),
    #[error("block store: {0}")]
    Blocks(std::io::Error),
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

pub struct MetaStore {
    db: Db,
    /// Serialises publish and remove, which check and then write.
    write_lock: Mutex<()>,
    nodes: Mutex<HashMap<String, (NodeInfo, Instant)>>,
    lease: Duration,
    files: BlockFiles,
    /// Large blocks are written without the WAL (see [`MetaStore::put_block`]); `true` while
    /// some of them may still be only in the memtable. Block writes hold the gate shared; a
    /// publish holds it alone while it makes them durable, so no block it has seen escapes.
    volatile_gate: RwLock<()>,
    volatile_blocks: AtomicBool,
}

/// Marks an index entry (`len: u32 BE` then this byte) whose block is in a file.
const IN_FILE: u8 = b'f';

fn poisoned() -> MetaError {
    MetaError::Corrupt("lock poisoned".into())
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn key_bytes(ns: &Namespace, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(ns.as_str().len() + 1 + key.len());
    k.extend_from_slice(ns.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

pub(crate) fn live(r: &KeyRecord) -> bool {
    r.expires_unix_ms == 0 || r.expires_unix_ms > now_ms()
}

impl MetaStore {
    pub fn new(db: Db, files: BlockFiles, lease: Duration) -> Self {
        MetaStore {
            db,
            files,
            write_lock: Mutex::new(()),
            nodes: Mutex::new(HashMap::new()),
            lease,
            volatile_gate: RwLock::new(()),
            volatile_blocks: AtomicBool::new(false),
        }
    }

    /// Stores a block that has been verified against its hash (a block already here is left
    /// as it is). Large blocks go to plain files ([`BlockFiles`]) and into the index without the
    /// WAL; the publish that first needs them makes both durable, with one sync for all of them.
    pub fn put_block(&self, hash: &BlockHash, data: &[u8]) -> Result<(), MetaError> {
        if self.has_block(hash)? {
            return Ok(());
        }
        let k = hash.as_bytes();
        let len = (data.len() as u32).to_be_bytes();
        // Small blocks go to RocksDB with the WAL, so many small files do not each force a sync
        // on publish.
        if data.len() < MIN_FILE_BLOCK {
            return Ok(self.db.write(vec![
                BatchOp::Put(CF_BLOCKS, k.to_vec(), data.to_vec()),
                BatchOp::Put(CF_BLOCK_INDEX, k.to_vec(), len.to_vec()),
            ])?);
        }
        let _gate = self.volatile_gate.read().map_err(|_| poisoned())?;
        self.files.write(hash, data).map_err(MetaError::Blocks)?;
        let mut v = len.to_vec();
        v.push(IN_FILE);
        self.db.put_volatile(&[(CF_BLOCK_INDEX, k, &v)])?;
        self.volatile_blocks.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the store holds the block. A block whose file has gone (a disk replaced under
    /// the store) counts as missing, so that the next put uploads it again.
    pub fn has_block(&self, hash: &BlockHash) -> Result<bool, MetaError> {
        Ok(match self.db.get(CF_BLOCK_INDEX, hash.as_bytes())? {
            None => false,
            Some(v) if v.get(4) == Some(&IN_FILE) => self.files.exists(hash),
            Some(_) => true,
        })
    }

    /// A block's bytes for the data plane: an open file for a large block (sent with
    /// sendfile), the value itself for a small one.
    pub fn block(&self, hash: &BlockHash) -> Result<Option<Served>, MetaError> {
        let Some(v) = self.db.get(CF_BLOCK_INDEX, hash.as_bytes())? else {
            return Ok(None);
        };
        if v.get(4) == Some(&IN_FILE) {
            let found = self.files.open_block(hash).map_err(MetaError::Blocks)?;
            if found.is_none() {
                tracing::warn!(block = %hash.hex(), "the index names a block file that is gone");
            }
            return Ok(found.map(|(file, len)| Served::File(file, len)));
        }
        // Blocks stored in RocksDB: small ones, and every block of a store written before
        // large blocks moved to files. Readers check the hash, so RocksDB's CRC is skipped.
        Ok(self
            .db
            .get_unverified(CF_BLOCKS, hash.as_bytes())?
            .map(Served::Bytes))
    }

    /// Indexes the blocks of a store written before the index existed (a one-time pass that
    /// reads every block once).
    pub fn index_blocks(&self) -> Result<(), MetaError> {
        if !self.db.is_empty(CF_BLOCK_INDEX)? || self.db.is_empty(CF_BLOCKS)? {
            return Ok(());
        }
        tracing::info!("indexing the blocks of a store written by an older ktfs");
        let mut n = 0u64;
        self.db.for_each(CF_BLOCKS, |k, v| {
            n += 1;
            self.db
                .put(CF_BLOCK_INDEX, k, &(v.len() as u32).to_be_bytes())
        })?;
        tracing::info!(blocks = n, "blocks indexed");
        Ok(())
    }

    /// Flushes the blocks written without the WAL, if there are any.
    fn make_blocks_durable(&self) -> Result<(), MetaError> {
        let _gate = self.volatile_gate.write().map_err(|_| poisoned())?;
        if self.volatile_blocks.swap(false, Ordering::AcqRel) {
            // Blocks first: a crash between the two leaves blocks the index does not know
            // (uploaded again if asked for), never an index entry without its block.
            let flushed = self
                .files
                .sync()
                .map_err(MetaError::Blocks)
                .and_then(|()| Ok(self.db.flush_family(CF_BLOCK_INDEX)?));
            if let Err(e) = flushed {
                self.volatile_blocks.store(true, Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub(crate) fn record(&self, ns: &Namespace, key: &str) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.db.get(CF_KEYS, &key_bytes(ns, key))? else {
            return Ok(None);
        };
        let r = KeyRecord::decode(v.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        Ok(live(&r).then_some(r))
    }

    pub(crate) fn manifest(&self, version: &[u8]) -> Result<Manifest, MetaError> {
        let bytes = self
            .db
            .get(CF_MANIFESTS, version)?
            .ok_or_else(|| MetaError::Corrupt("manifest missing for a live key".into()))?;
        Manifest::decode(bytes.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// Live keys strictly below `key` (or all keys of the namespace for `None`).
    pub(crate) fn descendants(
        &self,
        ns: &Namespace,
        key: Option<&str>,
    ) -> Result<Vec<(String, KeyRecord)>, MetaError> {
        let prefix = match key {
            Some(k) => key_bytes(ns, &format!("{k}/")),
            None => key_bytes(ns, ""),
        };
        let skip = ns.as_str().len() + 1;
        let mut out = Vec::new();
        for (k, v) in self.db.scan_prefix(CF_KEYS, &prefix)? {
            let r =
                KeyRecord::decode(v.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))?;
            if live(&r) {
                let name = String::from_utf8(k[skip..].to_vec())
                    .map_err(|e| MetaError::Corrupt(e.to_string()))?;
                out.push((name, r));
            }
        }
        Ok(out)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, ()>, MetaError> {
        self.write_lock.lock().map_err(|_| poisoned())
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
        manifest::validate(manifest)?;
        if locale == Locale::Local && !self.node_alive(origin) {
            return Err(MetaError::BadRequest(format!(
                "origin node {origin:?} is not registered with the store server"
            )));
        }
        if locale == Locale::Store {
            let hashes: Vec<BlockHash> = manifest
                .entries
                .iter()
                .flat_map(|e| &e.blocks)
                .filter_map(manifest::block_hash)
                .collect();
            let missing = self.missing_blocks(&hashes)?;
            if !missing.is_empty() {
                return Err(MetaError::MissingBlocks(missing.len()));
            }
            // The key must never outlive its blocks in a crash.
            self.make_blocks_durable()?;
        }
        let version = manifest::version_of(manifest);
        let new_is_dir = manifest::is_directory(manifest);
        let _guard = self.lock()?;
        let mut t = Txn::new(self, ns);
        let path = key.as_str();
        t.check_parent(path)?;
        let loc = t.locate(path)?;
        match &loc {
            Loc::Nothing => {}
            Loc::Key { record } if record.version == version.0 => {}
            _ if !force => return Err(MetaError::Exists(key.to_string())),
            _ => {}
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
        }
        t.put_key(
            path,
            manifest.clone(),
            &Lineage::fresh(locale, origin, ttl_secs),
        );
        t.commit()?;
        Ok(version)
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
    /// published keys, their parents and the insides of published directories.
    pub fn list(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
    ) -> Result<(Vec<ListEntry>, bool), MetaError> {
        let t = Txn::new(self, ns);
        let mut out: BTreeMap<String, ListEntry> = BTreeMap::new();
        let mut exists = prefix.is_none();
        if let Some(p) = prefix {
            let loc = t.locate(p.as_str())?;
            exists = loc.exists();
            let (record, m) = match &loc {
                Loc::Key { record } => (record, t.manifest_of(p.as_str(), record)?),
                Loc::Entry {
                    key, record, sub, ..
                } => {
                    let full = t.manifest_of(key, record)?;
                    (
                        record,
                        manifest::subtree(&full, sub)
                            .ok_or_else(|| MetaError::NotFound(p.to_string()))?,
                    )
                }
                _ => return self.list_keys(&t, prefix, recursive, out, exists),
            };
            for e in manifest_listing(&m, record, recursive) {
                out.insert(e.name.trim_end_matches('/').to_string(), e);
            }
        }
        self.list_keys(&t, prefix, recursive, out, exists)
    }

    fn list_keys(
        &self,
        t: &Txn<'_>,
        prefix: Option<&KeyPath>,
        recursive: bool,
        mut out: BTreeMap<String, ListEntry>,
        exists: bool,
    ) -> Result<(Vec<ListEntry>, bool), MetaError> {
        let strip = prefix.map_or(0, |p| p.as_str().len() + 1);
        for (name, r) in t.descendants(prefix.map(KeyPath::as_str))? {
            let rel = &name[strip..];
            match rel.split_once('/') {
                Some((top, _)) if !recursive => {
                    out.entry(top.to_string()).or_insert_with(|| ListEntry {
                        name: format!("{top}/"),
                        is_directory: true,
                        locale: Locale::Store as i32,
                        kind: EntryKind::Directory as i32,
                        ..Default::default()
                    });
                }
                _ => {
                    out.insert(rel.to_string(), key_entry(rel, &r));
                }
            }
        }
        Ok((out.into_values().collect(), exists))
    }

    pub fn remove(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        recursive: bool,
        prefix: bool,
    ) -> Result<Vec<String>, MetaError> {
        let _guard = self.lock()?;
        let mut t = Txn::new(self, ns);
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
                t.delete_key(k);
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
        if f == d {
            return Ok(());
        }
        if d.starts_with(f) && d.as_bytes().get(f.len()) == Some(&b'/') {
            return Err(MetaError::BadRequest(format!(
                "cannot move {from} into itself"
            )));
        }
        let _guard = self.lock()?;
        let mut t = Txn::new(self, ns);
        let src = t.locate(f)?;
        let src_kind = src
            .kind()
            .ok_or_else(|| MetaError::NotFound(from.to_string()))?;
        t.check_parent(d)?;
        let dst = t.locate(d)?;
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
        // Keys below the source move with it.
        let below = t.descendants(Some(f))?;
        match t.locate(f)? {
            Loc::Key { record } => {
                let m = t.manifest_of(f, &record)?;
                t.delete_key(f);
                t.put_key(d, m, &Lineage::of(&record));
            }
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
                    t.put_key(d, extracted, &Lineage::of(&record));
                }
            }
            Loc::Implicit => {}
            Loc::Nothing => return Err(MetaError::NotFound(from.to_string())),
        }
        for (k, r) in below {
            let m = t.manifest_of(&k, &r)?;
            t.delete_key(&k);
            t.put_key(&format!("{d}{}", &k[f.len()..]), m, &Lineage::of(&r));
        }
        t.commit()
    }

    /// Sets the mode and/or mtime of whatever is at `key`. An implicit directory becomes a
    /// directory key so that its attributes have somewhere to live.
    pub fn set_attr(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
    ) -> Result<(), MetaError> {
        let apply = |e: &mut FileEntry| {
            if let Some(m) = mode {
                e.mode = m & 0o7777;
            }
            if let Some((s, n)) = mtime {
                e.mtime_sec = s;
                e.mtime_nsec = n;
            }
        };
        let _guard = self.lock()?;
        let mut t = Txn::new(self, ns);
        let path = key.as_str();
        match t.locate(path)? {
            Loc::Key { record } => t.edit_manifest(path, &record, |es| {
                if let Some(root) = es.first_mut() {
                    apply(root);
                }
            })?,
            Loc::Entry {
                key: k,
                record,
                sub,
                ..
            } => t.edit_manifest(&k, &record, |es| {
                if let Some(e) = es.iter_mut().find(|e| e.path == sub) {
                    apply(e);
                }
            })?,
            Loc::Implicit => {
                let mut root = FileEntry {
                    kind: EntryKind::Directory as i32,
                    mode: 0o755,
                    ..Default::default()
                };
                apply(&mut root);
                let m = Manifest {
                    block_size: manifest::DEFAULT_BLOCK_SIZE,
                    entries: vec![root],
                };
                t.put_key(path, m, &Lineage::fresh(Locale::Store, "", 0));
            }
            Loc::Nothing => return Err(MetaError::NotFound(key.to_string())),
        }
        t.commit()
    }

    pub fn missing_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<BlockHash>, MetaError> {
        let mut out = Vec::new();
        for h in hashes {
            if !self.has_block(h)? {
                out.push(*h);
            }
        }
        Ok(out)
    }

    pub fn register_node(&self, node: NodeInfo) {
        if let Ok(mut nodes) = self.nodes.lock() {
            nodes.insert(node.node_id.clone(), (node, Instant::now() + self.lease));
        }
    }

    /// Renews a node's lease; `false` when the node must register again (e.g. after a restart).
    pub fn heartbeat(&self, node_id: &str) -> bool {
        let Ok(mut nodes) = self.nodes.lock() else {
            return false;
        };
        match nodes.get_mut(node_id) {
            Some((_, until)) => {
                *until = Instant::now() + self.lease;
                true
            }
            None => false,
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    fn node_alive(&self, node_id: &str) -> bool {
        self.live_node(node_id).is_some()
    }

    pub fn live_node(&self, node_id: &str) -> Option<NodeInfo> {
        let nodes = self.nodes.lock().ok()?;
        let (info, until) = nodes.get(node_id)?;
        (*until > Instant::now()).then(|| info.clone())
    }

    pub fn add_location(&self, version: &Version, node_id: &str) -> Result<(), MetaError> {
        if !self.node_alive(node_id) {
            return Err(MetaError::BadRequest(format!(
                "node {node_id:?} is not registered"
            )));
        }
        if self.db.get(CF_MANIFESTS, &version.0)?.is_none() {
            return Err(MetaError::NotFound(format!("version {version}")));
        }
        self.db
            .put(CF_LOCATIONS, &location_key(version, node_id), &[])?;
        Ok(())
    }

    /// The live sources of a version: nodes that hold it, then the store server itself for
    /// `locale=store` (an empty address: the caller already knows the server's).
    pub fn sources(&self, version: &Version, record: &KeyRecord) -> Result<Vec<Source>, MetaError> {
        let mut out = Vec::new();
        for (k, _) in self.db.scan_prefix(CF_LOCATIONS, &version.0)? {
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

pub(crate) fn location_key(version: &Version, node: &str) -> Vec<u8> {
    let mut k = version.0.to_vec();
    k.extend_from_slice(node.as_bytes());
    k
}

fn key_entry(rel: &str, r: &KeyRecord) -> ListEntry {
    ListEntry {
        name: if r.is_directory {
            format!("{rel}/")
        } else {
            rel.to_string()
        },
        is_directory: r.is_directory,
        locale: r.locale,
        origin_node: r.origin_node.clone(),
        size: r.size,
        is_key: true,
        kind: r.kind,
        mode: r.mode,
        mtime_sec: r.mtime_sec,
        mtime_nsec: r.mtime_nsec,
        symlink_target: r.symlink_target.clone(),
    }
}

fn manifest_listing(m: &Manifest, r: &KeyRecord, recursive: bool) -> Vec<ListEntry> {
    m.entries
        .iter()
        .filter(|e| !e.path.is_empty() || !manifest::is_directory(m))
        .filter(|e| recursive || !e.path.contains('/'))
        .map(|e| {
            let dir = e.kind() == EntryKind::Directory;
            ListEntry {
                name: if dir {
                    format!("{}/", e.path)
                } else {
                    e.path.clone()
                },
                is_directory: dir,
                locale: r.locale,
                origin_node: r.origin_node.clone(),
                size: e.size,
                is_key: false,
                kind: e.kind,
                mode: e.mode,
                mtime_sec: e.mtime_sec,
                mtime_nsec: e.mtime_nsec,
                symlink_target: e.symlink_target.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
