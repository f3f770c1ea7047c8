//! CSI Node: publishes volumes into pods (see [`crate::publish`]) and says who this node is.
//!
//! Publishes and unpublishes run concurrently, one at a time per volume id and per target path
//! ([`VolumeGuard`]): a second call for either while the first runs gets ABORTED, and the CO
//! retries it. The target guard keeps two calls that name different volumes from stacking or
//! removing mounts on one target (a CO never sends those, but one that lost its state might).
//! What volumes of a namespace share, its mount and the node agent, [`Agents`] serialises.

use std::collections::HashMap;
use std::path::PathBuf;

use tonic::{Request, Response, Status};

use crate::agents::{AgentError, Agents};
use crate::capability;
use crate::guard::{Permit, VolumeGuard};
use crate::proto::node_server::Node;
use crate::proto::volume_capability::AccessType;
use crate::proto::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, Topology,
};
use crate::publish::{self, PublishError};
use crate::volume::{VolumeError, VolumeSpec};

#[derive(Debug, Clone)]
pub struct NodeService {
    node_id: String,
    agents: Agents,
    /// Volume ids with a publish or unpublish in flight.
    volumes: VolumeGuard,
    /// Target paths with a publish or unpublish in flight.
    targets: VolumeGuard,
}

impl NodeService {
    pub fn new(node_id: String, agents: Agents) -> Self {
        NodeService {
            node_id,
            agents,
            volumes: VolumeGuard::new(),
            targets: VolumeGuard::of("target path"),
        }
    }

    /// Permits for the volume and the target of one call, or ABORTED.
    fn acquire(&self, volume_id: &str, target: &std::path::Path) -> Result<[Permit; 2], Status> {
        let volume = self.volumes.try_acquire(volume_id)?;
        let target = self.targets.try_acquire(&target.display().to_string())?;
        Ok([volume, target])
    }

    /// The guard of volume ids in flight (tests hold a permit of it to stand for a call).
    #[cfg(test)]
    pub(crate) fn volume_guard(&self) -> &VolumeGuard {
        &self.volumes
    }

    /// The guard of target paths in flight.
    #[cfg(test)]
    pub(crate) fn target_guard(&self) -> &VolumeGuard {
        &self.targets
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

/// The gRPC status of a volume a publish cannot mount: a pod's volume it may not mount, a
/// kubelet that does not say which pod it is for, or a bad request.
fn volume_status(e: &VolumeError) -> Status {
    let msg = e.to_string();
    match e {
        VolumeError::Denied(_) => Status::permission_denied(msg),
        VolumeError::NoPodInfo(_) => Status::failed_precondition(msg),
        _ => Status::invalid_argument(msg),
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
        let spec = VolumeSpec::from_publish(&req.volume_id, &ctx).map_err(|e| {
            let status = volume_status(&e);
            if status.code() == tonic::Code::PermissionDenied {
                tracing::warn!(volume_id = req.volume_id, target = %target.display(),
                    error = %e, "publish refused");
            }
            status
        })?;
        // A PV's `mountOptions: [ro]` arrives as a mount flag.
        let ro_flag = matches!(&cap.access_type,
            Some(AccessType::Mount(m)) if m.mount_flags.iter().any(|f| f == "ro"));
        let readonly = req.readonly || ro_flag;
        let permits = self.acquire(&req.volume_id, &target)?;
        let agents = self.agents.clone();
        // The permits go with the work: a call whose client gave up still holds the volume
        // until its mounts are done.
        tokio::task::spawn_blocking(move || {
            let _permits = permits;
            publish::publish(&agents, &spec, &target, readonly)
        })
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
        let permits = self.acquire(&req.volume_id, &target)?;
        tokio::task::spawn_blocking(move || {
            let _permits = permits;
            publish::unpublish(&target)
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::AgentsConfig;
    use crate::proto::volume_capability::access_mode::Mode;
    use crate::proto::volume_capability::{AccessMode, MountVolume};
    use crate::proto::VolumeCapability;
    use crate::volume::{EPHEMERAL, POD_NAMESPACE};
    use std::path::Path;
    use std::time::Duration;
    use tonic::Code;

    /// A node whose `kt` does not exist: a publish that gets past the guards fails when it
    /// starts the node agent, without mounting anything.
    fn service(dir: &Path) -> NodeService {
        NodeService::new(
            "n1".into(),
            Agents::new(AgentsConfig {
                kt: dir.join("no-kt"),
                server: "s:7447".into(),
                node_id: "n1".into(),
                cache_dir: dir.join("cache"),
                state_dir: dir.join("state"),
                agent_ip: "127.0.0.1".into(),
                agent_port: 0,
                cache_size: None,
                zone: None,
                mount_timeout: Duration::from_secs(1),
                tls: None,
            }),
        )
    }

    fn publish(id: &str, target: &Path) -> Request<NodePublishVolumeRequest> {
        Request::new(NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: Mode::MultiNodeMultiWriter as i32,
                }),
            }),
            // As the kubelet sends it for a pod of namespace `team` (podInfoOnMount).
            volume_context: HashMap::from([
                ("namespace".into(), "team".into()),
                (POD_NAMESPACE.into(), "team".into()),
                (EPHEMERAL.into(), "false".into()),
            ]),
            ..Default::default()
        })
    }

    fn unpublish(id: &str, target: &Path) -> Request<NodeUnpublishVolumeRequest> {
        Request::new(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
    }

    #[tokio::test]
    async fn a_volume_in_flight_refuses_publish_and_unpublish_others_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let node = service(dir.path());
        let (tx, ty) = (dir.path().join("pod-x"), dir.path().join("pod-y"));
        let held = node.volume_guard().try_acquire("team/x").unwrap();

        let e = node
            .node_publish_volume(publish("team/x", &tx))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        assert_eq!(
            e.message(),
            "an operation for volume team/x is already in progress"
        );
        let e = node
            .node_unpublish_volume(unpublish("team/x", &tx))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        // Nothing was done for x: its target was not made.
        assert!(!tx.exists());

        // Volume y goes on: to the start of the node agent, which fails here.
        let e = node
            .node_publish_volume(publish("team/y", &ty))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
        assert!(e.message().contains("no-kt"), "{e:?}");
        assert!(!node.volume_guard().is_held("team/y"));
        // Unpublishing a target that does not exist is success.
        node.node_unpublish_volume(unpublish("team/y", &ty))
            .await
            .unwrap();

        // A bad request is refused as such, held volume or not.
        let mut bad = publish("team/x", &tx);
        bad.get_mut().volume_capability = None;
        let e = node.node_publish_volume(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);

        drop(held);
        node.node_unpublish_volume(unpublish("team/x", &tx))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_target_in_flight_refuses_calls_for_any_volume() {
        let dir = tempfile::tempdir().unwrap();
        let node = service(dir.path());
        let t = dir.path().join("pod");
        let held = node
            .target_guard()
            .try_acquire(&t.display().to_string())
            .unwrap();
        let e = node
            .node_publish_volume(publish("team/y", &t))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        assert!(e.message().contains("target path"), "{e:?}");
        let e = node
            .node_unpublish_volume(unpublish("team/z", &t))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        // The volume's permit taken before the target's was refused is given back.
        assert!(!node.volume_guard().is_held("team/y"));
        drop(held);
        node.node_unpublish_volume(unpublish("team/z", &t))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_volume_the_pod_may_not_mount_is_refused_before_anything_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let node = service(dir.path());
        let t = dir.path().join("pod");
        let with = |ctx: &[(&str, &str)]| {
            let mut r = publish("csi-0123", &t);
            r.get_mut().volume_context = ctx
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r
        };
        // An inline volume of a pod in team-a that names team-b.
        let e = node
            .node_publish_volume(with(&[
                (POD_NAMESPACE, "team-a"),
                (EPHEMERAL, "true"),
                ("namespace", "team-b"),
                ("prefix", "keys"),
            ]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("team-b"), "{e:?}");
        // A persistent volume of another namespace that its class does not share.
        let e = node
            .node_publish_volume(with(&[
                (POD_NAMESPACE, "team-a"),
                (EPHEMERAL, "false"),
                ("namespace", "shared"),
                ("prefix", "keys"),
            ]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        // A kubelet that does not say which pod the volume is for.
        let e = node
            .node_publish_volume(with(&[("namespace", "team-a"), ("prefix", "keys")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("podInfoOnMount"), "{e:?}");
        assert!(!t.exists());
        assert!(!node.volume_guard().is_held("csi-0123"));

        // The same inline volume naming its pod's own namespace gets to the node agent.
        let e = node
            .node_publish_volume(with(&[
                (POD_NAMESPACE, "team-a"),
                (EPHEMERAL, "true"),
                ("namespace", "team-a"),
                ("prefix", "keys"),
            ]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
        assert!(e.message().contains("no-kt"), "{e:?}");
    }
}
