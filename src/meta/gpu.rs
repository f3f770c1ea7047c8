//! GPU keys in the metadata: a key whose bytes stay in the buffers a node's transfer worker
//! holds, recorded with its tensor table and its holder. It shares the namespace with files (a
//! GPU key and a file never share a name), shows in listings with its publishing node as its
//! locale, and is there for readers only while that node is alive.

use super::error::MetaError;
use super::store::MetaStore;
use super::txn::{Lineage, Loc, Txn};
use crate::gpu::table::Table;
use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{GpuKey, Locale};

impl MetaStore {
    /// Publishes the GPU key `gpu` at `key`. Refused where a file, a directory or a symlink is
    /// (or keys lie below), and where another registration's GPU key is.
    pub fn publish_gpu(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        mut gpu: GpuKey,
    ) -> Result<Version, MetaError> {
        let table = Table::parse(gpu.table_json.as_bytes())
            .map_err(|e| MetaError::BadRequest(e.to_string()))?;
        if gpu.table_digest != table.digest().0 {
            return Err(MetaError::BadRequest(
                "the table digest is not the table's".into(),
            ));
        }
        gpu.nbytes = table.nbytes();
        if !self.node_alive(&gpu.publisher_node) {
            return Err(MetaError::BadRequest(format!(
                "publisher node {:?} is not registered with the store server",
                gpu.publisher_node
            )));
        }
        let mut t = Txn::write(self, ns);
        let path = key.as_str();
        t.check_parent(path)?;
        match t.locate(path)? {
            Loc::Nothing => {}
            Loc::Key { record } if record.kind() == EntryKind::Gpu => {
                let held = record.gpu.unwrap_or_default();
                if held.publisher_node != gpu.publisher_node
                    || held.registration != gpu.registration
                {
                    return Err(MetaError::Exists(format!(
                        "{key} (a GPU key of node {})",
                        held.publisher_node
                    )));
                }
            }
            Loc::Implicit => return Err(MetaError::IsDir(format!("{key} is a directory"))),
            _ => return Err(MetaError::Exists(key.to_string())),
        }
        let m = Manifest {
            block_size: manifest::DEFAULT_BLOCK_SIZE,
            entries: vec![FileEntry {
                kind: EntryKind::Gpu as i32,
                mode: 0o644,
                ..Default::default()
            }],
        };
        let version = gpu_version(&gpu);
        let lineage = Lineage::fresh(Locale::Local, &gpu.publisher_node, 0, self.now_ms());
        t.put_gpu(path, m, &lineage, gpu);
        t.commit()?;
        Ok(version)
    }

    /// Removes the GPU key at `key` if `registration` published it; `false` when it did not
    /// (gone already, or published again since).
    pub fn remove_gpu(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        registration: u64,
    ) -> Result<bool, MetaError> {
        let mut t = Txn::write(self, ns);
        match t.locate(key.as_str())? {
            Loc::Key { record }
                if record.kind() == EntryKind::Gpu
                    && record.gpu.as_ref().map(|g| g.registration) == Some(registration) =>
            {
                t.delete_key(key.as_str())?;
                t.commit()?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// What names one publication of a GPU key: its table, its holder and its registration.
pub fn gpu_version(gpu: &GpuKey) -> Version {
    let mut h = blake3::Hasher::new();
    h.update(&gpu.table_digest);
    h.update(gpu.publisher_node.as_bytes());
    h.update(&[0]);
    h.update(&gpu.registration.to_le_bytes());
    Version(*h.finalize().as_bytes())
}
