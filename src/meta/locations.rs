//! Nodes as the metadata sees them: their leases, the versions they hold open, the blocks
//! collected since they last asked, and the versions they hold (the sources a reader is given).

use std::collections::HashSet;
use std::time::Duration;

use super::backend::{Op, Table};
use super::collected::Since;
use super::error::MetaError;
use super::keys::location_key;
use super::store::MetaStore;
use crate::hash::Version;
use crate::proto::{KeyRecord, Locale, NodeInfo, Source};

impl MetaStore {
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
    pub fn collected_since(&self, after: u64, epoch: u64) -> Since {
        self.collected.since(after, epoch)
    }

    pub fn lease(&self) -> Duration {
        self.nodes.lease()
    }

    pub(super) fn node_alive(&self, node_id: &str) -> bool {
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
        self.backend.write(vec![Op::Put(
            Table::Locations,
            location_key(version, node_id),
            Vec::new(),
        )])?;
        Ok(())
    }

    /// `node_id` holds `version` no more (its copy was removed): no longer one of its sources.
    pub fn remove_location(&self, version: &Version, node_id: &str) -> Result<(), MetaError> {
        self.backend.write(vec![Op::Delete(
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
