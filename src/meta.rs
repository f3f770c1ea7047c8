//! The store server's metadata: keys, manifests, locations and node leases.
//!
//! Keys, manifests and locations live in RocksDB and survive a restart. Node leases live in
//! memory: after a restart no node is offered as a source until it heartbeats again, which is
//! exactly when it is known to be alive. Publishing writes the manifest and the key record in one
//! atomic batch, so a reader sees the old version or the new one, never half of a put.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::db::{BatchOp, Db, DbError};
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, Manifest, ManifestError};
use crate::proto::{KeyRecord, ListEntry, Locale, NodeInfo, Source};

pub const CF_KEYS: &str = "keys";
pub const CF_MANIFESTS: &str = "manifests";
pub const CF_LOCATIONS: &str = "locations";
pub const CF_BLOCKS: &str = "blocks";
pub const FAMILIES: &[&str] = &[CF_KEYS, CF_MANIFESTS, CF_LOCATIONS, CF_BLOCKS];

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("key {0} already exists (use --force to replace it)")]
    Exists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0} blocks of the manifest are not in the store")]
    MissingBlocks(usize),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Db(#[from] DbError),
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
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn key_bytes(ns: &Namespace, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(ns.as_str().len() + 1 + key.len());
    k.extend_from_slice(ns.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

fn live(r: &KeyRecord) -> bool {
    r.expires_unix_ms == 0 || r.expires_unix_ms > now_ms()
}

impl MetaStore {
    pub fn new(db: Db, lease: Duration) -> Self {
        MetaStore {
            db,
            write_lock: Mutex::new(()),
            nodes: Mutex::new(HashMap::new()),
            lease,
        }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    fn record(&self, ns: &Namespace, key: &str) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.db.get(CF_KEYS, &key_bytes(ns, key))? else {
            return Ok(None);
        };
        let r = KeyRecord::decode(v.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        Ok(live(&r).then_some(r))
    }

    fn manifest(&self, version: &[u8]) -> Result<Manifest, MetaError> {
        let bytes = self
            .db
            .get(CF_MANIFESTS, version)?
            .ok_or_else(|| MetaError::Corrupt("manifest missing for a live key".into()))?;
        Manifest::decode(bytes.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// Live keys strictly below `key` (or all keys of the namespace for `None`).
    fn descendants(
        &self,
        ns: &Namespace,
        key: Option<&KeyPath>,
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

    /// The nearest live key that is `key` itself or one of its ancestors.
    fn covering(
        &self,
        ns: &Namespace,
        key: &KeyPath,
    ) -> Result<Option<(String, KeyRecord)>, MetaError> {
        let s = key.as_str();
        let mut end = s.len();
        loop {
            let k = &s[..end];
            if let Some(r) = self.record(ns, k)? {
                return Ok(Some((k.to_string(), r)));
            }
            match k.rfind('/') {
                Some(i) => end = i,
                None => return Ok(None),
            }
        }
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
        let version = manifest::version_of(manifest);
        let _guard = self
            .write_lock
            .lock()
            .map_err(|_| MetaError::Corrupt("lock".into()))?;
        if let Some((anc, r)) = self.covering(ns, key)? {
            if anc != key.as_str() {
                let what = if r.is_directory { "directory" } else { "file" };
                return Err(MetaError::Conflict(format!(
                    "{key} lies inside the published {what} {anc}"
                )));
            }
            if r.version != version.0 && !force {
                return Err(MetaError::Exists(key.to_string()));
            }
        }
        if !self.descendants(ns, Some(key))?.is_empty() {
            return Err(MetaError::Conflict(format!(
                "{key} has keys below it; remove them first (kt rm -r {key})"
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
        }
        let created = now_ms();
        let record = KeyRecord {
            version: version.0.to_vec(),
            locale: locale as i32,
            origin_node: if locale == Locale::Local {
                origin.to_string()
            } else {
                String::new()
            },
            created_unix_ms: created,
            expires_unix_ms: if ttl_secs == 0 {
                0
            } else {
                created + (ttl_secs as i64) * 1000
            },
            is_directory: manifest::is_directory(manifest),
            size: manifest::total_size(manifest),
            files: manifest::file_count(manifest),
        };
        let mut ops = vec![
            BatchOp::Put(CF_MANIFESTS, version.0.to_vec(), manifest.encode_to_vec()),
            BatchOp::Put(CF_KEYS, key_bytes(ns, key.as_str()), record.encode_to_vec()),
        ];
        if locale == Locale::Local {
            ops.push(BatchOp::Put(
                CF_LOCATIONS,
                location_key(&version, origin),
                Vec::new(),
            ));
        }
        self.db.write(ops)?;
        Ok(version)
    }

    pub fn resolve(&self, ns: &Namespace, key: &KeyPath) -> Result<Resolved, MetaError> {
        let (found, record) = self
            .covering(ns, key)?
            .ok_or_else(|| MetaError::NotFound(key.to_string()))?;
        let full = self.manifest(&record.version)?;
        let subpath = key.as_str()[found.len()..]
            .trim_start_matches('/')
            .to_string();
        let manifest = if subpath.is_empty() {
            full
        } else {
            manifest::subtree(&full, &subpath)
                .ok_or_else(|| MetaError::NotFound(key.to_string()))?
        };
        Ok(Resolved {
            key: found,
            record,
            manifest,
            subpath,
        })
    }

    /// The entries directly below `prefix` (or every key below it when `recursive`), merging
    /// published keys, their parents and the insides of published directories.
    pub fn list(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
    ) -> Result<(Vec<ListEntry>, bool), MetaError> {
        if let Some(p) = prefix {
            if let Some((found, r)) = self.covering(ns, p)? {
                let full = self.manifest(&r.version)?;
                let sub = p.as_str()[found.len()..].trim_start_matches('/');
                let Some(m) = manifest::subtree(&full, sub) else {
                    return Ok((Vec::new(), false));
                };
                return Ok((manifest_listing(&m, &r, recursive), true));
            }
        }
        let keys = self.descendants(ns, prefix)?;
        let exists = prefix.is_none() || !keys.is_empty();
        let strip = prefix.map_or(0, |p| p.as_str().len() + 1);
        let mut out: BTreeMap<String, ListEntry> = BTreeMap::new();
        for (name, r) in keys {
            let rel = &name[strip..];
            if recursive {
                out.insert(rel.to_string(), key_entry(rel, &r));
                continue;
            }
            match rel.split_once('/') {
                None => {
                    out.insert(rel.to_string(), key_entry(rel, &r));
                }
                Some((top, _)) => {
                    out.entry(top.to_string()).or_insert_with(|| ListEntry {
                        name: format!("{top}/"),
                        is_directory: true,
                        locale: Locale::Store as i32,
                        ..Default::default()
                    });
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
        let _guard = self
            .write_lock
            .lock()
            .map_err(|_| MetaError::Corrupt("lock".into()))?;
        let mut doomed: Vec<String> = Vec::new();
        if prefix {
            let all = self.descendants(ns, None)?;
            doomed.extend(
                all.into_iter()
                    .map(|(k, _)| k)
                    .filter(|k| k.starts_with(key.as_str())),
            );
        } else {
            let own = self.record(ns, key.as_str())?;
            let below = self.descendants(ns, Some(key))?;
            if own.is_none() && below.is_empty() {
                if let Some((found, _)) = self.covering(ns, key)? {
                    return Err(MetaError::Conflict(format!(
                        "{key} lies inside the published key {found}; remove {found} instead"
                    )));
                }
                return Err(MetaError::NotFound(key.to_string()));
            }
            let is_dir = own.as_ref().is_some_and(|r| r.is_directory) || !below.is_empty();
            if is_dir && !recursive {
                return Err(MetaError::Conflict(format!(
                    "{key} is a directory; use --recursive"
                )));
            }
            if own.is_some() {
                doomed.push(key.to_string());
            }
            doomed.extend(below.into_iter().map(|(k, _)| k));
        }
        if doomed.is_empty() {
            return Err(MetaError::NotFound(format!("{key}*")));
        }
        self.db.write(
            doomed
                .iter()
                .map(|k| BatchOp::Delete(CF_KEYS, key_bytes(ns, k)))
                .collect(),
        )?;
        Ok(doomed)
    }

    pub fn missing_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<BlockHash>, MetaError> {
        let mut out = Vec::new();
        for h in hashes {
            if !self.db.contains(CF_BLOCKS, h.as_bytes())? {
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

    fn live_node(&self, node_id: &str) -> Option<NodeInfo> {
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

fn location_key(version: &Version, node: &str) -> Vec<u8> {
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
    }
}

fn manifest_listing(m: &Manifest, r: &KeyRecord, recursive: bool) -> Vec<ListEntry> {
    use crate::manifest::EntryKind;
    m.entries
        .iter()
        .filter(|e| !e.path.is_empty() || !manifest::is_directory(m))
        .filter(|e| recursive || !e.path.contains('/'))
        .map(|e| {
            let dir = e.kind() == EntryKind::Directory;
            let name = if e.path.is_empty() { "" } else { &e.path };
            ListEntry {
                name: if dir {
                    format!("{name}/")
                } else {
                    name.to_string()
                },
                is_directory: dir,
                locale: r.locale,
                origin_node: r.origin_node.clone(),
                size: e.size,
                is_key: false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{BlockRef, EntryKind, FileEntry};

    fn store(lease: Duration) -> (tempfile::TempDir, MetaStore) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), FAMILIES, &[CF_BLOCKS]).unwrap();
        (dir, MetaStore::new(db, lease))
    }

    fn one_file(data: &[u8]) -> Manifest {
        Manifest {
            block_size: 1024,
            entries: vec![FileEntry {
                kind: EntryKind::File as i32,
                size: data.len() as u64,
                blocks: vec![BlockRef {
                    hash: BlockHash::of(data).0.to_vec(),
                    len: data.len() as u32,
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn nodes_that_stop_heartbeating_stop_being_sources() {
        let (_d, meta) = store(Duration::from_millis(200));
        meta.register_node(NodeInfo {
            node_id: "n1".into(),
            data_addr: "127.0.0.1:1".into(),
            zone: String::new(),
        });
        let ns = Namespace::default();
        let key = KeyPath::parse("k").unwrap();
        let v = meta
            .publish(&ns, &key, &one_file(b"abc"), Locale::Local, "n1", 0, false)
            .unwrap();
        let rec = meta.resolve(&ns, &key).unwrap().record;
        assert_eq!(meta.sources(&v, &rec).unwrap().len(), 1);
        assert!(meta.heartbeat("n1"));
        std::thread::sleep(Duration::from_millis(300));
        assert!(meta.sources(&v, &rec).unwrap().is_empty());
        assert!(!meta.heartbeat("unknown"));
    }

    #[test]
    fn store_publish_needs_its_blocks_and_swaps_atomically() {
        let (_d, meta) = store(DEFAULT_TEST_LEASE);
        let ns = Namespace::default();
        let key = KeyPath::parse("a/b").unwrap();
        let m1 = one_file(b"one");
        assert!(matches!(
            meta.publish(&ns, &key, &m1, Locale::Store, "", 0, false),
            Err(MetaError::MissingBlocks(1))
        ));
        assert!(matches!(
            meta.resolve(&ns, &key),
            Err(MetaError::NotFound(_))
        ));
        meta.db()
            .put(CF_BLOCKS, BlockHash::of(b"one").as_bytes(), b"one")
            .unwrap();
        let v1 = meta
            .publish(&ns, &key, &m1, Locale::Store, "", 0, false)
            .unwrap();
        // Same content again is idempotent; different content needs force.
        assert_eq!(
            meta.publish(&ns, &key, &m1, Locale::Store, "", 0, false)
                .unwrap(),
            v1
        );
        let m2 = one_file(b"two");
        meta.db()
            .put(CF_BLOCKS, BlockHash::of(b"two").as_bytes(), b"two")
            .unwrap();
        assert!(matches!(
            meta.publish(&ns, &key, &m2, Locale::Store, "", 0, false),
            Err(MetaError::Exists(_))
        ));
        let v2 = meta
            .publish(&ns, &key, &m2, Locale::Store, "", 0, true)
            .unwrap();
        assert_eq!(
            meta.resolve(&ns, &key).unwrap().record.version,
            v2.0.to_vec()
        );
        // Nothing can be published inside a file key, and a parent with keys below is no file.
        let inner = KeyPath::parse("a/b/c").unwrap();
        assert!(matches!(
            meta.publish(&ns, &inner, &m1, Locale::Store, "", 0, false),
            Err(MetaError::Conflict(_))
        ));
        let parent = KeyPath::parse("a").unwrap();
        assert!(matches!(
            meta.publish(&ns, &parent, &m1, Locale::Store, "", 0, false),
            Err(MetaError::Conflict(_))
        ));
    }

    #[test]
    fn expired_keys_disappear() {
        let (_d, meta) = store(DEFAULT_TEST_LEASE);
        let ns = Namespace::default();
        let key = KeyPath::parse("tmp").unwrap();
        meta.db()
            .put(CF_BLOCKS, BlockHash::of(b"x").as_bytes(), b"x")
            .unwrap();
        meta.publish(&ns, &key, &one_file(b"x"), Locale::Store, "", 1, false)
            .unwrap();
        assert_eq!(meta.list(&ns, None, false).unwrap().0.len(), 1);
        std::thread::sleep(Duration::from_millis(1100));
        assert!(meta.list(&ns, None, false).unwrap().0.is_empty());
        assert!(matches!(
            meta.resolve(&ns, &key),
            Err(MetaError::NotFound(_))
        ));
    }

    const DEFAULT_TEST_LEASE: Duration = Duration::from_secs(10);
}
