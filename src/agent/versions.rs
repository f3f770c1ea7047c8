//! Which blocks a version holds, as the store server says. A read ticket names a version, not
//! its blocks, and blocks are shared across namespaces: a node that served any block to any
//! holder of a valid read ticket would let a caller of one namespace fetch another's blocks by
//! hash. So a node asks the store, once per version, for that version's block set, and serves a
//! read ticket's holder those blocks only.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::ticket::VersionBlocks;
use crate::auth::Credential;
use crate::hash::{BlockHash, Version};
use crate::locks;
use crate::proto::VersionBlocksRequest;
use crate::rpc::client::{self, Store};

/// Versions whose block sets are kept: those being fetched from this node now.
const VERSIONS_KEPT: usize = 256;
/// How long "the store has no such version" is believed before the store is asked again.
const ABSENT_FOR: Duration = Duration::from_secs(10);
/// The longest a request waits for the store's answer before it is refused.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long requests are refused at once after the store could not be asked: a getter's
/// pipelined requests then fail over to their next source together, not one timeout each.
const UNASKED_FOR: Duration = Duration::from_secs(2);

enum Known {
    Blocks(Arc<HashSet<BlockHash>>),
    Absent(Instant),
    Unasked(Instant),
}

/// Block sets of versions, from the store server, asked with this node's credential.
pub struct StoreVersions {
    server: String,
    credential: Credential,
    runtime: tokio::runtime::Handle,
    store: Mutex<Option<Store>>,
    sets: Mutex<HashMap<Version, Known>>,
    /// One question to the store at a time: a getter's pipelined requests for one version's
    /// blocks arrive together, and the first answer serves them all.
    asking: Mutex<()>,
}

impl StoreVersions {
    /// Must be called on the tokio runtime that later answers the questions.
    pub fn new(server: &str, credential: Credential) -> Self {
        StoreVersions {
            server: server.to_string(),
            credential,
            runtime: tokio::runtime::Handle::current(),
            store: Mutex::new(None),
            sets: Mutex::new(HashMap::new()),
            asking: Mutex::new(()),
        }
    }

    fn store(&self) -> Result<Store, String> {
        let mut store = locks::lock(&self.store);
        if let Some(s) = &*store {
            return Ok(s.clone());
        }
        // A lazy channel starts its connection task on the runtime it is made in.
        let _in = self.runtime.enter();
        let s = client::store_lazy(&self.server, &self.credential).map_err(|e| e.to_string())?;
        *store = Some(s.clone());
        Ok(s)
    }

    /// The store's answer for `version`: its blocks, or that it has no such version.
    fn ask(&self, version: &Version) -> Result<Known, String> {
        let store = self.store()?;
        let request = VersionBlocksRequest {
            version: version.0.to_vec(),
        };
        let answer = self.runtime.block_on(async {
            tokio::time::timeout(ASK_TIMEOUT, store.version_blocks(request)).await
        });
        let r = match answer {
            Err(_) => return Err("the store server did not answer in time".into()),
            Ok(Err(status)) => return Err(status.to_string().to_string()),
            Ok(Ok(r)) => r,
        };
        if !r.found {
            return Ok(Known::Absent(Instant::now()));
        }
        if r.hashes.len() % 32 != 0 {
            return Err(format!(
                "the store sent {} bytes of hashes, not a multiple of 32",
                r.hashes.len()
            ));
        }
        Ok(Known::Blocks(Arc::new(
            r.hashes
                .chunks_exact(32)
                .filter_map(BlockHash::from_slice)
                .collect(),
        )))
    }
}

impl VersionBlocks for StoreVersions {
    /// Asks the store where the answer is not known: call it off the async threads.
    fn holds(&self, version: &Version, hash: &BlockHash) -> bool {
        if let Some(known) = self.known(version, hash) {
            return known;
        }
        let _one = locks::lock(&self.asking);
        if let Some(known) = self.known(version, hash) {
            return known;
        }
        let known = self.ask(version).unwrap_or_else(|e| {
            tracing::warn!(%version, error = %e, "cannot learn a read ticket's blocks");
            Known::Unasked(Instant::now())
        });
        let holds = matches!(&known, Known::Blocks(s) if s.contains(hash));
        let mut sets = locks::lock(&self.sets);
        if sets.len() >= VERSIONS_KEPT {
            sets.clear();
        }
        sets.insert(*version, known);
        holds
    }

    fn known(&self, version: &Version, hash: &BlockHash) -> Option<bool> {
        match locks::lock(&self.sets).get(version)? {
            Known::Blocks(set) => Some(set.contains(hash)),
            Known::Absent(at) if at.elapsed() < ABSENT_FOR => Some(false),
            Known::Unasked(at) if at.elapsed() < UNASKED_FOR => Some(false),
            Known::Absent(_) | Known::Unasked(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_cannot_be_asked_refuses_at_once_for_a_while_not_one_timeout_each() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        // Nothing listens on port 1: the question fails at once.
        let versions = rt.block_on(async { StoreVersions::new("127.0.0.1:1", Credential::none()) });
        let (v, h) = (Version([3; 32]), BlockHash::of(b"block"));
        assert_eq!(versions.known(&v, &h), None);
        assert!(!versions.holds(&v, &h));
        assert_eq!(versions.known(&v, &h), Some(false));
        assert_eq!(versions.known(&Version([4; 32]), &h), None);
    }
}
