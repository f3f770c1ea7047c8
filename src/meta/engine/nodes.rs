//! Node leases on etcd: a node is live while its key `PREFIX/nodes/<id>` exists, which lives
//! under an etcd lease of the node's lease time. The replica that takes the node's heartbeats
//! renews it with each (a keep-alive: etcd's leader renews in memory, no write to its log);
//! every replica reads the key, so a standby answering a read, or a new owner before the
//! node's next heartbeat, names the sources the owner would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::PutOptions;
use prost::Message;

use super::etcd_url::EtcdUrl;
use super::members::Members;
use super::seam::EngineError;
use crate::bridge::Bridge;
use crate::locks::lock;
use crate::meta::backend::BackendError;
use crate::meta::nodes::SharedNodes;
use crate::proto::NodeInfo;

/// Where the nodes' keys lie, beside the tables (whose keys begin with a one-byte tag).
pub(super) const NODES: &[u8] = b"nodes/";

/// The node leases of the store `url` names.
pub struct EtcdNodes {
    members: Arc<Members>,
    prefix: Vec<u8>,
    bridge: Bridge,
    /// The etcd lease of each node this replica registered or renewed.
    leases: Mutex<HashMap<String, i64>>,
}

fn backend_err(e: EngineError) -> BackendError {
    BackendError(Box::new(e))
}

impl EtcdNodes {
    /// Connects on first use.
    pub fn new(url: &EtcdUrl) -> Result<Self, EngineError> {
        Ok(EtcdNodes {
            members: Arc::new(Members::new(url)),
            prefix: url.prefix.as_bytes().to_vec(),
            bridge: Bridge::new("kt-node-leases").map_err(EngineError::other)?,
            leases: Mutex::default(),
        })
    }

    fn key(&self, node_id: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(NODES);
        k.extend_from_slice(node_id.as_bytes());
        k
    }

    fn on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, BackendError> {
        self.bridge
            .run(fut)
            .ok_or_else(|| EngineError::Unavailable("the node leases' runtime stopped".into()))
            .and_then(|r| r)
            .map_err(backend_err)
    }

    /// The node's key and the lease it lives under (0: none), as etcd holds them.
    fn read(&self, node_id: &str) -> Result<Option<(NodeInfo, i64)>, BackendError> {
        let (members, key) = (self.members.clone(), self.key(node_id));
        let kv = self.on(async move {
            let resp = members
                .call(|mut c| {
                    let key = key.clone();
                    async move { c.get(key, None).await }
                })
                .await?;
            Ok(resp
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.lease())))
        })?;
        let Some((value, lease)) = kv else {
            return Ok(None);
        };
        let info = NodeInfo::decode(&value[..]).map_err(|e| {
            backend_err(EngineError::Other(format!("node {node_id:?}: {e}").into()))
        })?;
        Ok(Some((info, lease)))
    }
}

impl SharedNodes for EtcdNodes {
    fn register(&self, node: &NodeInfo, lease: Duration) -> Result<(), BackendError> {
        let (members, key, value) = (
            self.members.clone(),
            self.key(&node.node_id),
            node.encode_to_vec(),
        );
        let ttl = i64::try_from(lease.as_secs().max(1)).unwrap_or(i64::MAX);
        let id = self.on(async move {
            let id = members
                .call(|mut c| async move { c.lease_grant(ttl, None).await })
                .await?
                .id();
            members
                .call(|mut c| {
                    let (key, value) = (key.clone(), value.clone());
                    async move {
                        c.put(key, value, Some(PutOptions::new().with_lease(id)))
                            .await
                    }
                })
                .await?;
            Ok(id)
        })?;
        // The lease it had, if any, holds no key now and runs out by itself.
        lock(&self.leases).insert(node.node_id.clone(), id);
        Ok(())
    }

    fn renew(&self, node_id: &str) -> Result<bool, BackendError> {
        let known = lock(&self.leases).get(node_id).copied();
        let lease = match known {
            Some(l) => l,
            None => match self.read(node_id)? {
                Some((_, l)) if l != 0 => l,
                _ => return Ok(false),
            },
        };
        let members = self.members.clone();
        let lives = self.on(async move {
            members
                .call(|mut c| async move {
                    // Opening the stream renews the lease once, and says whether it lives (the
                    // client reads etcd's first answer, "not found" for a dead lease).
                    match c.lease_keep_alive(lease).await {
                        Ok(_) => Ok(true),
                        Err(etcd_client::Error::LeaseKeepAliveError(m))
                            if m.contains("not found") =>
                        {
                            Ok(false)
                        }
                        Err(e) => Err(e),
                    }
                })
                .await
        })?;
        let mut leases = lock(&self.leases);
        match lives {
            true => leases.insert(node_id.to_string(), lease),
            false => leases.remove(node_id),
        };
        Ok(lives)
    }

    fn live(&self, node_id: &str) -> Result<Option<NodeInfo>, BackendError> {
        Ok(self.read(node_id)?.map(|(info, _)| info))
    }
}
