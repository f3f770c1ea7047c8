//! The store server's side of data-plane tickets (`crate::auth::ticket`): its ticket key,
//! kept in the data directory so that tickets outlive a restart, and the check that a block
//! served under a read ticket is one of that version's.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::auth::ticket::{TicketKey, VersionBlocks};
use crate::hash::{BlockHash, Version};
use crate::locks;
use crate::meta::{MetaError, MetaStore};

const KEY_FILE: &str = "ticket.key";
/// Versions whose block sets are kept: the versions being fetched now.
const VERSIONS_KEPT: usize = 256;

/// The key in `data_dir`, made on first use (readable by this user only).
pub fn load_or_create_key(data_dir: &Path) -> std::io::Result<TicketKey> {
    let path = data_dir.join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(b) => TicketKey::from_bytes(&b).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a 32-byte key", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))?;
            // Written whole under a temporary name, then renamed: a crash leaves no half key.
            let tmp = data_dir.join(format!("{KEY_FILE}.tmp"));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&key)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(TicketKey::from_bytes(&key).expect("32 bytes"))
        }
        Err(e) => Err(e),
    }
}

/// Block sets of versions, from their manifests.
pub struct ManifestBlocks {
    meta: Arc<MetaStore>,
    sets: Mutex<HashMap<Version, Arc<HashSet<BlockHash>>>>,
}

impl ManifestBlocks {
    pub fn new(meta: Arc<MetaStore>) -> Self {
        ManifestBlocks {
            meta,
            sets: Mutex::new(HashMap::new()),
        }
    }

    fn set_of(&self, version: &Version) -> Option<Arc<HashSet<BlockHash>>> {
        if let Some(s) = locks::lock(&self.sets).get(version) {
            return Some(s.clone());
        }
        let set = match blocks_of(&self.meta, version) {
            Ok(Some(s)) => Arc::new(s),
            Ok(None) => {
                tracing::debug!(%version, "no manifest for a read ticket");
                return None;
            }
            Err(e) => {
                tracing::warn!(%version, error = %e, "a read ticket's manifest cannot be read");
                return None;
            }
        };
        let mut sets = locks::lock(&self.sets);
        if sets.len() >= VERSIONS_KEPT {
            sets.clear();
        }
        sets.insert(*version, set.clone());
        Some(set)
    }
}

/// The distinct blocks of `version`; `None` where the store holds no such version.
pub(super) fn blocks_of(
    meta: &MetaStore,
    version: &Version,
) -> Result<Option<HashSet<BlockHash>>, MetaError> {
    Ok(meta.manifest_if_any(&version.0)?.map(|m| {
        m.entries
            .iter()
            .flat_map(|e| e.blocks.iter())
            .filter_map(crate::manifest::block_hash)
            .collect()
    }))
}

impl VersionBlocks for ManifestBlocks {
    fn holds(&self, version: &Version, hash: &BlockHash) -> bool {
        self.set_of(version).is_some_and(|s| s.contains(hash))
    }

    fn known(&self, version: &Version, hash: &BlockHash) -> Option<bool> {
        locks::lock(&self.sets)
            .get(version)
            .map(|s| s.contains(hash))
    }
}
