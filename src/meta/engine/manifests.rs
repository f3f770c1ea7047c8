//! Manifests in the object store ([`ObjectManifests`]): a manifest may exceed what an etcd
//! transaction carries (1.5 MiB), and it never changes (a version is the hash of its manifest),
//! so it is written as an object named by its version before the transaction that names it,
//! and each replica caches what it read.
//!
//! But a small one (a file of a few blocks: [`INLINE_MAX`] bytes or fewer) stays in the
//! tables, in the transaction that names it: an object is a request to the object store and
//! CPU of it, and measured (a mount writing 4 KiB files on etcd and s3s-fs) the S3 server's
//! CPU for two objects a file (a block and its manifest) was over half of the cluster's. A
//! manifest is read from the tables first, then from the objects (where a store written
//! before kept every manifest); a deletion goes to both.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::hash::Version;
use crate::locks::lock;
use crate::meta::backend::{
    read_each, BackendError, KeyValue, MetaBackend, Op, ReadMany, Step, Table, Visit,
};
use crate::objects::Objects;

/// What [`ObjectManifests::walk`] calls with each manifest.
type Walk<'a> = dyn FnMut(&[u8], &[u8]) -> Result<Step, BackendError> + 'a;

/// Where in the object store the manifests are.
const MANIFEST_OBJECTS: &str = "manifests/";
/// How many bytes of manifests a replica keeps in memory.
const CACHE_BYTES: usize = 64 << 20;
/// The largest manifest kept in the tables: a few blocks' worth, small beside what an etcd
/// transaction carries (1.5 MiB, 128 writes) so that a batch of publishes still packs.
pub const INLINE_MAX: usize = 2 << 10;

/// Any metadata backend, with its manifests table in `objects`.
pub struct ObjectManifests<B> {
    inner: B,
    objects: Arc<Objects>,
    cache: Mutex<Cache>,
}

/// Manifests read lately, the oldest let go of first past [`CACHE_BYTES`].
#[derive(Default)]
struct Cache {
    by_key: HashMap<Vec<u8>, Arc<Vec<u8>>>,
    order: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl Cache {
    fn insert(&mut self, key: &[u8], value: Arc<Vec<u8>>) {
        if value.len() > CACHE_BYTES / 4 || self.by_key.contains_key(key) {
            return;
        }
        self.bytes += value.len();
        self.by_key.insert(key.to_vec(), value);
        self.order.push_back(key.to_vec());
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.by_key.remove(&old) {
                self.bytes -= v.len();
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(v) = self.by_key.remove(key) {
            self.bytes -= v.len();
            self.order.retain(|k| k != key);
        }
    }
}

fn err(e: crate::objects::ObjectError) -> BackendError {
    BackendError(Box::new(e))
}

/// A manifest's object name; `None` for a key that is no version (the table holds none).
fn name(key: &[u8]) -> Option<String> {
    Version::from_slice(key).map(|v| format!("{MANIFEST_OBJECTS}{}", v.hex()))
}

impl<B: MetaBackend> ObjectManifests<B> {
    pub fn new(inner: B, objects: Arc<Objects>) -> Self {
        ObjectManifests {
            inner,
            objects,
            cache: Mutex::default(),
        }
    }

    /// Every manifest whose key starts with `prefix`, in key order, read one at a time.
    fn walk(
        &self,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut Walk<'_>,
    ) -> Result<(), BackendError> {
        let mut keys = Vec::new();
        self.objects
            .list(MANIFEST_OBJECTS, |n| {
                if let Some(v) = Version::from_hex(n) {
                    keys.push(v.0.to_vec());
                }
                Ok(())
            })
            .map_err(err)?;
        // The keys alone (a walk of every manifest holds 32 bytes of each, not its value).
        self.inner
            .walk_from(Table::Manifests, prefix, span, &mut |k, _| {
                keys.push(k.to_vec());
                Step::Next
            })?;
        keys.retain(|k| {
            k.starts_with(prefix)
                && k.as_slice() >= span.0
                && span.1.is_none_or(|to| k.as_slice() < to)
        });
        keys.sort();
        keys.dedup();
        let mut past: Option<Vec<u8>> = None;
        for k in keys {
            if past.as_ref().is_some_and(|p| k.starts_with(p)) {
                continue;
            }
            // One deleted since the listing is skipped. A walk (collection reads every
            // manifest) leaves the cache to the reads that will come again.
            let Some(v) = self.read(&k, false)? else {
                continue;
            };
            match f(&k, &v)? {
                Step::Next => past = None,
                Step::Past(n) => past = Some(k[..n.min(k.len())].to_vec()),
                Step::Stop => return Ok(()),
            }
        }
        Ok(())
    }

    /// A manifest, from the cache or the store (kept in the cache if `keep`).
    fn read(&self, key: &[u8], keep: bool) -> Result<Option<Arc<Vec<u8>>>, BackendError> {
        if let Some(v) = lock(&self.cache).by_key.get(key) {
            return Ok(Some(v.clone()));
        }
        let Some(name) = name(key) else {
            return Ok(None);
        };
        let v = match self.inner.get(Table::Manifests, key)? {
            Some(inline) => Arc::new(inline),
            None => match self.objects.get(&name).map_err(err)? {
                Some(bytes) => Arc::new(bytes.to_vec()),
                None => return Ok(None),
            },
        };
        if keep {
            lock(&self.cache).insert(key, v.clone());
        }
        Ok(Some(v))
    }

    /// Writes the large manifests `ops` put and hands back the rest (small manifests among
    /// them), and the manifests they delete, whose objects go once the rest is written: a key
    /// is never left naming a manifest gone.
    fn split(&self, ops: Vec<Op>) -> Result<(Vec<Op>, Vec<Vec<u8>>), BackendError> {
        let mut rest = Vec::with_capacity(ops.len());
        let mut deletes = Vec::new();
        for op in ops {
            match op {
                Op::Put(Table::Manifests, k, v) => {
                    let name = name(&k).ok_or_else(|| {
                        BackendError("a manifest's key is no version".to_string().into())
                    })?;
                    if v.len() <= INLINE_MAX {
                        rest.push(Op::Put(Table::Manifests, k, v));
                    } else {
                        self.objects.put(&name, Bytes::from(v)).map_err(err)?;
                    }
                }
                Op::Delete(Table::Manifests, k) => {
                    rest.push(Op::Delete(Table::Manifests, k.clone()));
                    deletes.push(k);
                }
                op => rest.push(op),
            }
        }
        Ok((rest, deletes))
    }

    fn delete(&self, keys: Vec<Vec<u8>>) -> Result<(), BackendError> {
        for k in keys {
            lock(&self.cache).remove(&k);
            if let Some(name) = name(&k) {
                self.objects.delete(&name).map_err(err)?;
            }
        }
        Ok(())
    }
}

impl<B: MetaBackend> MetaBackend for ObjectManifests<B> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        match table {
            Table::Manifests => Ok(self.read(key, true)?.map(|v| v.to_vec())),
            t => self.inner.get(t, key),
        }
    }

    fn scan_prefix(&self, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, BackendError> {
        if table != Table::Manifests {
            return self.inner.scan_prefix(table, prefix);
        }
        let mut out = Vec::new();
        self.walk(prefix, (prefix, None), &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(Step::Next)
        })?;
        Ok(out)
    }

    fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError> {
        if table != Table::Manifests {
            return self.inner.for_each(table, f);
        }
        self.walk(b"", (b"", None), &mut |k, v| f(k, v).map(|()| Step::Next))
    }

    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError> {
        if table != Table::Manifests {
            return self.inner.walk_from(table, prefix, span, f);
        }
        self.walk(prefix, span, &mut |k, v| Ok(f(k, v)))
    }

    fn write(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        let (rest, deletes) = self.split(ops)?;
        if !rest.is_empty() {
            self.inner.write(rest)?;
        }
        self.delete(deletes)
    }

    fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        let (rest, deletes) = self.split(ops)?;
        if !rest.is_empty() {
            self.inner.write_synced(rest)?;
        }
        self.delete(deletes)
    }

    fn write_shared(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        // No manifest is ever one of them.
        self.inner.write_shared(ops)
    }

    fn read_many(&self, gets: &[(Table, Vec<u8>)], below: Option<(Table, &[u8])>) -> ReadMany {
        let manifests = gets.iter().any(|(t, _)| *t == Table::Manifests)
            || below.is_some_and(|(t, _)| t == Table::Manifests);
        match manifests {
            true => read_each(self, gets, below),
            false => self.inner.read_many(gets, below),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.inner.flush()
    }

    fn check(&self) -> Result<(), BackendError> {
        self.inner.check()?;
        self.objects.check().map_err(err)
    }

    fn commit(&self, changes: Vec<Vec<Op>>) -> Result<(), BackendError> {
        let mut kept = Vec::with_capacity(changes.len());
        let mut deletes = Vec::new();
        for change in changes {
            let (rest, d) = self.split(change)?;
            deletes.extend(d);
            if !rest.is_empty() {
                kept.push(rest);
            }
        }
        if !kept.is_empty() {
            self.inner.commit(kept)?;
        }
        self.delete(deletes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::engine::{EngineTables, RocksEngine};
    use crate::objects::ObjectUrl;

    /// Over etcd's limits in one transaction, a manifest still commits: it is an object, and
    /// the engine's transaction carries the key alone; a small one stays in the tables; walks
    /// see manifests of both in key order, and a deleted one is gone from the cache too.
    #[test]
    fn manifests_are_objects_beside_an_engine_whose_transactions_they_outgrow() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("engine");
        let tables = EngineTables::connect(move || async move { RocksEngine::open(&db) }).unwrap();
        let objects = Objects::open(&ObjectUrl::Dir(dir.path().join("objects"))).unwrap();
        let m = ObjectManifests::new(tables, Arc::new(objects));
        let big = vec![7u8; 2 << 20];
        let (v1, v2) = ([1u8; 32].to_vec(), [2u8; 32].to_vec());
        m.commit(vec![vec![
            Op::Put(Table::Manifests, v2.clone(), b"two".to_vec()),
            Op::Put(Table::Manifests, v1.clone(), big.clone()),
            Op::Put(Table::Keys, b"ns\0k".to_vec(), v1.clone()),
        ]])
        .unwrap();
        assert_eq!(m.get(Table::Manifests, &v1).unwrap(), Some(big.clone()));
        assert_eq!(m.get(Table::Keys, b"ns\0k").unwrap(), Some(v1.clone()));
        // The large one is an object, the small one in the tables alone.
        let objects = m.objects.clone();
        let object = |v: &[u8]| objects.get(&name(v).unwrap()).unwrap();
        assert_eq!(object(&v1).unwrap().len(), big.len());
        assert!(object(&v2).is_none());
        assert_eq!(
            m.inner.get(Table::Manifests, &v2).unwrap(),
            Some(b"two".to_vec())
        );
        let mut walked = Vec::new();
        m.for_each(Table::Manifests, &mut |k, v| {
            walked.push((k.to_vec(), v.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(walked, [(v1.clone(), big.len()), (v2.clone(), 3)]);
        let mut first = Vec::new();
        m.walk_prefix(Table::Manifests, b"", &mut |k, _| {
            first.push(k.to_vec());
            Step::Stop
        })
        .unwrap();
        assert_eq!(first, std::slice::from_ref(&v1));
        // Not a version: refused before anything is written.
        let bad = m.write(vec![Op::Put(Table::Manifests, b"short".to_vec(), vec![])]);
        assert!(bad.is_err());
        m.write_synced(vec![Op::Delete(Table::Manifests, v1.clone())])
            .unwrap();
        assert_eq!(m.get(Table::Manifests, &v1).unwrap(), None);
        assert_eq!(m.scan_prefix(Table::Manifests, b"").unwrap().len(), 1);
        m.commit(vec![vec![Op::Delete(Table::Manifests, v2.clone())]])
            .unwrap();
        assert_eq!(m.get(Table::Manifests, &v2).unwrap(), None);
        assert!(m.scan_prefix(Table::Manifests, b"").unwrap().is_empty());
    }
}
