//! The store server as its clients see it: [`StoreApi`], one async method per RPC, taking the
//! request message and answering the response or a [`ClientError`], and [`Store`], the
//! handle every caller passes around.
//!
//! The real store is [`GrpcStore`](super::client::GrpcStore), over tonic; a test puts
//! [`FaultyStore`](super::faulty::FaultyStore) in front of it to fail or stall chosen calls,
//! and cluster mode puts a router here that sends each call to the replica that serves it.

use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;

use super::error::ClientError;
use messages::*;

/// The request and response messages of the store's RPCs, for the implementations of
/// [`StoreApi`] to import at once.
pub mod messages {
    pub use crate::proto::{
        AddLocationRequest, AddLocationResponse, ExchangeRequest, GetWindowRequest,
        GpuAwaitRequest, GpuFinishRequest, GpuFinishResponse, GpuJoinRequest, GpuJoinResponse,
        GpuWindow, HeartbeatRequest, HeartbeatResponse, JoinRequest, JoinResponse, LeaveRequest,
        LeaveResponse, LinkRequest, LinkResponse, ListRequest, ListResponse, MissingBlocksRequest,
        MissingBlocksResponse, NewParentRequest, NewParentResponse, PublishBatchRequest,
        PublishBatchResponse, PublishGpuRequest, PublishRequest, PublishResponse,
        RegisterNodeRequest, RegisterNodeResponse, RegistrationSecretRequest,
        RegistrationSecretResponse, RemoveRequest, RemoveResponse, RenameRequest, RenameResponse,
        ResolveManyRequest, ResolveManyResponse, ResolveRequest, ResolveResponse, SetAttrRequest,
        SetAttrResponse, SwarmSyncReply, SwarmSyncRequest, VersionBlocksRequest,
        VersionBlocksResponse, WatchDown, WatchUp, Window,
    };
}

/// What a watcher sends up its watch: acknowledgements and lease renewals.
pub type WatchUps = tokio::sync::mpsc::Receiver<WatchUp>;
/// What the store server sends down a watch: the changes it tells of.
pub type WatchDowns = Pin<Box<dyn Stream<Item = Result<WatchDown, ClientError>> + Send>>;

/// The store server's RPCs (`proto/ktfs.proto`, service `Store`).
#[async_trait::async_trait]
pub trait StoreApi: Send + Sync {
    async fn register_node(
        &self,
        req: RegisterNodeRequest,
    ) -> Result<RegisterNodeResponse, ClientError>;
    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, ClientError>;
    async fn missing_blocks(
        &self,
        req: MissingBlocksRequest,
    ) -> Result<MissingBlocksResponse, ClientError>;
    async fn publish(&self, req: PublishRequest) -> Result<PublishResponse, ClientError>;
    async fn publish_batch(
        &self,
        req: PublishBatchRequest,
    ) -> Result<PublishBatchResponse, ClientError>;
    async fn publish_gpu(&self, req: PublishGpuRequest) -> Result<PublishResponse, ClientError>;
    async fn resolve(&self, req: ResolveRequest) -> Result<ResolveResponse, ClientError>;
    async fn resolve_many(
        &self,
        req: ResolveManyRequest,
    ) -> Result<ResolveManyResponse, ClientError>;
    async fn list(&self, req: ListRequest) -> Result<ListResponse, ClientError>;
    async fn remove(&self, req: RemoveRequest) -> Result<RemoveResponse, ClientError>;
    async fn add_location(
        &self,
        req: AddLocationRequest,
    ) -> Result<AddLocationResponse, ClientError>;
    async fn version_blocks(
        &self,
        req: VersionBlocksRequest,
    ) -> Result<VersionBlocksResponse, ClientError>;
    async fn rename(&self, req: RenameRequest) -> Result<RenameResponse, ClientError>;
    async fn exchange(&self, req: ExchangeRequest) -> Result<RenameResponse, ClientError>;
    async fn link(&self, req: LinkRequest) -> Result<LinkResponse, ClientError>;
    async fn set_attr(&self, req: SetAttrRequest) -> Result<SetAttrResponse, ClientError>;
    async fn join_broadcast(&self, req: JoinRequest) -> Result<JoinResponse, ClientError>;
    async fn new_parent(&self, req: NewParentRequest) -> Result<NewParentResponse, ClientError>;
    async fn leave_broadcast(&self, req: LeaveRequest) -> Result<LeaveResponse, ClientError>;
    async fn swarm_sync(&self, req: SwarmSyncRequest) -> Result<SwarmSyncReply, ClientError>;
    async fn get_window(&self, req: GetWindowRequest) -> Result<Window, ClientError>;
    async fn registration_secret(
        &self,
        req: RegistrationSecretRequest,
    ) -> Result<RegistrationSecretResponse, ClientError>;
    async fn join_gpu_window(&self, req: GpuJoinRequest) -> Result<GpuJoinResponse, ClientError>;
    async fn await_gpu_window(&self, req: GpuAwaitRequest) -> Result<GpuWindow, ClientError>;
    async fn finish_gpu_window(
        &self,
        req: GpuFinishRequest,
    ) -> Result<GpuFinishResponse, ClientError>;
    /// Watches a namespace: `ups` carries the watcher's acknowledgements and renewals.
    async fn watch(&self, ups: WatchUps) -> Result<WatchDowns, ClientError>;
}

/// A handle on a store server, cheap to clone.
#[derive(Clone)]
pub struct Store(Arc<dyn StoreApi>);

impl Store {
    pub fn new(api: impl StoreApi + 'static) -> Store {
        Store(Arc::new(api))
    }

    /// A store shared with its maker (a test keeps its `FaultyStore` to set what fails).
    pub fn shared(api: Arc<dyn StoreApi>) -> Store {
        Store(api)
    }
}

impl Deref for Store {
    type Target = dyn StoreApi;

    fn deref(&self) -> &(dyn StoreApi + 'static) {
        &*self.0
    }
}
