//! The `Store` service: each RPC answered by the function of its concern.

use tonic::{Request, Response, Status};

use super::state::StoreHandler;
use super::{blocks, gpu, names, nodes, publish, read, watch, windows};
use crate::proto::store_server::Store;
use crate::proto::*;

#[tonic::async_trait]
impl Store for StoreHandler {
    type WatchStream = watch::WatchStream;

    async fn watch(
        &self,
        req: Request<tonic::Streaming<WatchUp>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        watch::watch(self, req).await
    }

    async fn register_node(
        &self,
        req: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeResponse>, Status> {
        nodes::register_node(self, req).await
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        nodes::heartbeat(self, req).await
    }

    async fn missing_blocks(
        &self,
        req: Request<MissingBlocksRequest>,
    ) -> Result<Response<MissingBlocksResponse>, Status> {
        blocks::missing_blocks(self, req).await
    }

    async fn publish(
        &self,
        req: Request<PublishRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        publish::publish(self, req).await
    }

    async fn publish_batch(
        &self,
        req: Request<PublishBatchRequest>,
    ) -> Result<Response<PublishBatchResponse>, Status> {
        publish::publish_batch(self, req).await
    }

    async fn publish_gpu(
        &self,
        req: Request<PublishGpuRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        publish::publish_gpu(self, req).await
    }

    async fn resolve(
        &self,
        req: Request<ResolveRequest>,
    ) -> Result<Response<ResolveResponse>, Status> {
        read::resolve(self, req).await
    }

    async fn resolve_many(
        &self,
        req: Request<ResolveManyRequest>,
    ) -> Result<Response<ResolveManyResponse>, Status> {
        read::resolve_many(self, req).await
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        read::list(self, req).await
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        names::remove(self, req).await
    }

    async fn rename(
        &self,
        req: Request<RenameRequest>,
    ) -> Result<Response<RenameResponse>, Status> {
        names::rename(self, req).await
    }

    async fn exchange(
        &self,
        req: Request<ExchangeRequest>,
    ) -> Result<Response<RenameResponse>, Status> {
        names::exchange(self, req).await
    }

    async fn link(&self, req: Request<LinkRequest>) -> Result<Response<LinkResponse>, Status> {
        names::link(self, req).await
    }

    async fn set_attr(
        &self,
        req: Request<SetAttrRequest>,
    ) -> Result<Response<SetAttrResponse>, Status> {
        names::set_attr(self, req).await
    }

    async fn join_broadcast(
        &self,
        req: Request<JoinRequest>,
    ) -> Result<Response<JoinResponse>, Status> {
        windows::join_broadcast(self, req).await
    }

    async fn swarm_sync(
        &self,
        req: Request<SwarmSyncRequest>,
    ) -> Result<Response<SwarmSyncReply>, Status> {
        windows::swarm_sync(self, req).await
    }

    async fn new_parent(
        &self,
        req: Request<NewParentRequest>,
    ) -> Result<Response<NewParentResponse>, Status> {
        windows::new_parent(self, req).await
    }

    async fn leave_broadcast(
        &self,
        req: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        windows::leave_broadcast(self, req).await
    }

    async fn get_window(&self, req: Request<GetWindowRequest>) -> Result<Response<Window>, Status> {
        windows::get_window(self, req).await
    }

    async fn registration_secret(
        &self,
        req: Request<RegistrationSecretRequest>,
    ) -> Result<Response<RegistrationSecretResponse>, Status> {
        gpu::registration_secret(self, req).await
    }

    async fn join_gpu_window(
        &self,
        req: Request<GpuJoinRequest>,
    ) -> Result<Response<GpuJoinResponse>, Status> {
        gpu::join_gpu_window(self, req).await
    }

    async fn await_gpu_window(
        &self,
        req: Request<GpuAwaitRequest>,
    ) -> Result<Response<GpuWindow>, Status> {
        gpu::await_gpu_window(self, req).await
    }

    async fn finish_gpu_window(
        &self,
        req: Request<GpuFinishRequest>,
    ) -> Result<Response<GpuFinishResponse>, Status> {
        gpu::finish_gpu_window(self, req).await
    }

    async fn add_location(
        &self,
        req: Request<AddLocationRequest>,
    ) -> Result<Response<AddLocationResponse>, Status> {
        nodes::add_location(self, req).await
    }

    async fn version_blocks(
        &self,
        req: Request<VersionBlocksRequest>,
    ) -> Result<Response<VersionBlocksResponse>, Status> {
        blocks::version_blocks(self, req).await
    }
}
