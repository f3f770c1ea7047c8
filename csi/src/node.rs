//! CSI Node: publishes volumes into pods (see [`crate::publish`]) and says who this node is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::agents::{AgentError, Agents};
use crate::capability;
use crate::proto::node_server::Node;
use crate::proto::volume_capability::AccessType;
use crate::proto::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, Topology,
};
use crate::publish::{self, PublishError};
use crate::volume::VolumeSpec;

#[derive(Debug, Clone)]
pub struct NodeService {
    node_id: String,
    agents: Agents,
    /// Publishes and unpublishes one at a time: they start namespace mounts and stack mounts.
    lock: Arc<Mutex<()>>,
}

impl NodeService {
    pub fn new(node_id: String, agents: Agents) -> Self {
        NodeService {
            node_id,
            agents,
            lock: Arc::new(Mutex::new(())),
        }
    }
}

fn status(e: PublishError) -> Status {
    let msg = e.to_string();
    match e {
        PublishError::Incompatible { .. } => Status::already_exists(msg),
        PublishError::NotDirectory(_) => Status::failed_precondition(msg),
        PublishError::Hung(_) | PublishError::Agent(AgentError::Hung(_)) => {
            Status::unavailable(msg)
        }
        _ => Status::internal(msg),
    }
}

fn target_path(raw: &str) -> Result<PathBuf, Status> {
    if raw.is_empty() {
        return Err(Status::invalid_argument("target_path is required"));
    }
    let p = PathBuf::from(raw);
    if !p.is_absolute() {
        return Err(Status::invalid_argument(format!(
            "target_path {raw:?} is not absolute"
        )));
    }
    Ok(p)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let target = target_path(&req.target_path)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        capability::check(cap).map_err(Status::invalid_argument)?;
        let ctx: HashMap<String, String> = req.volume_context;
        let spec = VolumeSpec::from_publish(&req.volume_id, &ctx)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        // A PV's `mountOptions: [ro]` arrives as a mount flag.
        let ro_flag = matches!(&cap.access_type,
            Some(AccessType::Mount(m)) if m.mount_flags.iter().any(|f| f == "ro"));
        let readonly = req.readonly || ro_flag;
        let _guard = self.lock.lock().await;
        let agents = self.agents.clone();
        tokio::task::spawn_blocking(move || publish::publish(&agents, &spec, &target, readonly))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(status)?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let target = target_path(&req.target_path)?;
        let _guard = self.lock.lock().await;
        tokio::task::spawn_blocking(move || publish::unpublish(&target))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(status)?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // No staging, no stats, no expansion: publish and unpublish are all there is.
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _req: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: HashMap::from([(
                    crate::TOPOLOGY_NODE_KEY.to_string(),
                    self.node_id.clone(),
                )]),
            }),
        }))
    }
}
