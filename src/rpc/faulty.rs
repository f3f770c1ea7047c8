//! A store server that fails or stalls the calls a test chooses, in front of a real one: what a
//! caller does when the store fails mid-put, or stops answering, is tested against it without
//! killing a process at the right instant.
//!
//! ```text
//! let faulty = Arc::new(FaultyStore::new(real));
//! faulty.fail(Some("publish"), 1, Fault::Unavailable);
//! let store = Store::shared(faulty.clone());
//! ```

use std::collections::HashMap;
use std::sync::Mutex;

use super::error::ClientError;
use super::status::{Fault, RemoteError};
use super::store::messages::*;
use super::store::{Store, StoreApi, WatchDowns, WatchUps};
use crate::locks::lock;

/// What an injected call does instead of reaching the store.
#[derive(Clone, Copy, Debug)]
pub enum Injected {
    /// Fails at once, as the store would with this fault.
    Fail(Fault),
    /// Never answers (the caller's own deadline ends it).
    Stall,
    /// A listing's answer whose next page begins where this one did (a server that would
    /// have its caller ask forever); other calls pass.
    NoProgress,
}

struct Rule {
    /// The RPC it applies to (its method's name, `"publish"`), or every call.
    rpc: Option<&'static str>,
    /// Which call it hits, counting from 1: of that RPC, or of all calls.
    nth: u64,
    what: Injected,
}

/// A store that passes every call to `inner`, but for those its rules hit.
pub struct FaultyStore {
    inner: Store,
    rules: Mutex<Vec<Rule>>,
    /// Calls made so far, by RPC, and in all (under `""`).
    calls: Mutex<HashMap<&'static str, u64>>,
}

impl FaultyStore {
    pub fn new(inner: Store) -> Self {
        FaultyStore {
            inner,
            rules: Mutex::default(),
            calls: Mutex::default(),
        }
    }

    /// The `nth` call of `rpc` (of any RPC with `None`) fails with `fault`.
    pub fn fail(&self, rpc: Option<&'static str>, nth: u64, fault: Fault) {
        self.inject(rpc, nth, Injected::Fail(fault));
    }

    /// The `nth` call of `rpc` (of any RPC with `None`) never answers.
    pub fn stall(&self, rpc: Option<&'static str>, nth: u64) {
        self.inject(rpc, nth, Injected::Stall);
    }

    pub fn inject(&self, rpc: Option<&'static str>, nth: u64, what: Injected) {
        lock(&self.rules).push(Rule { rpc, nth, what });
    }

    /// How many calls of `rpc` (of every RPC with `None`) were made, injected ones too.
    pub fn calls(&self, rpc: Option<&'static str>) -> u64 {
        lock(&self.calls)
            .get(rpc.unwrap_or(""))
            .copied()
            .unwrap_or(0)
    }

    /// Counts a call of `rpc`, and does what a rule says of it, if one does.
    async fn before(&self, rpc: &'static str) -> Result<(), ClientError> {
        let (of_rpc, of_all) = {
            let mut calls = lock(&self.calls);
            let of_rpc = {
                let n = calls.entry(rpc).or_default();
                *n += 1;
                *n
            };
            let all = calls.entry("").or_default();
            *all += 1;
            (of_rpc, *all)
        };
        let hit = lock(&self.rules)
            .iter()
            .find(|r| match r.rpc {
                Some(name) => name == rpc && r.nth == of_rpc,
                None => r.nth == of_all,
            })
            .map(|r| r.what);
        match hit {
            None => Ok(()),
            Some(Injected::Fail(fault)) => Err(ClientError::Remote(RemoteError::new(
                fault,
                format!("injected: call {of_rpc} of {rpc} fails"),
            ))),
            Some(Injected::Stall) => std::future::pending().await,
            Some(Injected::NoProgress) => Ok(()),
        }
    }

    /// Whether the `n`th call of `rpc` (counted already) is to make no progress.
    fn no_progress(&self, rpc: &'static str) -> bool {
        let n = lock(&self.calls).get(rpc).copied().unwrap_or(0);
        lock(&self.rules)
            .iter()
            .any(|r| matches!(r.what, Injected::NoProgress) && r.rpc == Some(rpc) && r.nth <= n)
    }
}

#[async_trait::async_trait]
impl StoreApi for FaultyStore {
    async fn register_node(
        &self,
        req: RegisterNodeRequest,
    ) -> Result<RegisterNodeResponse, ClientError> {
        self.before("register_node").await?;
        self.inner.register_node(req).await
    }

    async fn heartbeat(&self, req: HeartbeatRequest) -> Result<HeartbeatResponse, ClientError> {
        self.before("heartbeat").await?;
        self.inner.heartbeat(req).await
    }

    async fn missing_blocks(
        &self,
        req: MissingBlocksRequest,
    ) -> Result<MissingBlocksResponse, ClientError> {
        self.before("missing_blocks").await?;
        self.inner.missing_blocks(req).await
    }

    async fn publish(&self, req: PublishRequest) -> Result<PublishResponse, ClientError> {
        self.before("publish").await?;
        self.inner.publish(req).await
    }

    async fn publish_batch(
        &self,
        req: PublishBatchRequest,
    ) -> Result<PublishBatchResponse, ClientError> {
        self.before("publish_batch").await?;
        self.inner.publish_batch(req).await
    }

    async fn publish_gpu(&self, req: PublishGpuRequest) -> Result<PublishResponse, ClientError> {
        self.before("publish_gpu").await?;
        self.inner.publish_gpu(req).await
    }

    async fn resolve(&self, req: ResolveRequest) -> Result<ResolveResponse, ClientError> {
        self.before("resolve").await?;
        self.inner.resolve(req).await
    }

    async fn resolve_many(
        &self,
        req: ResolveManyRequest,
    ) -> Result<ResolveManyResponse, ClientError> {
        self.before("resolve_many").await?;
        self.inner.resolve_many(req).await
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse, ClientError> {
        self.before("list").await?;
        let after = req.after.clone();
        let mut page = self.inner.list(req).await?;
        if self.no_progress("list") {
            page.next = if after.is_empty() { "~".into() } else { after };
        }
        Ok(page)
    }

    async fn remove(&self, req: RemoveRequest) -> Result<RemoveResponse, ClientError> {
        self.before("remove").await?;
        self.inner.remove(req).await
    }

    async fn add_location(
        &self,
        req: AddLocationRequest,
    ) -> Result<AddLocationResponse, ClientError> {
        self.before("add_location").await?;
        self.inner.add_location(req).await
    }

    async fn version_blocks(
        &self,
        req: VersionBlocksRequest,
    ) -> Result<VersionBlocksResponse, ClientError> {
        self.before("version_blocks").await?;
        self.inner.version_blocks(req).await
    }

    async fn rename(&self, req: RenameRequest) -> Result<RenameResponse, ClientError> {
        self.before("rename").await?;
        self.inner.rename(req).await
    }

    async fn exchange(&self, req: ExchangeRequest) -> Result<RenameResponse, ClientError> {
        self.before("exchange").await?;
        self.inner.exchange(req).await
    }

    async fn link(&self, req: LinkRequest) -> Result<LinkResponse, ClientError> {
        self.before("link").await?;
        self.inner.link(req).await
    }

    async fn set_attr(&self, req: SetAttrRequest) -> Result<SetAttrResponse, ClientError> {
        self.before("set_attr").await?;
        self.inner.set_attr(req).await
    }

    async fn join_broadcast(&self, req: JoinRequest) -> Result<JoinResponse, ClientError> {
        self.before("join_broadcast").await?;
        self.inner.join_broadcast(req).await
    }

    async fn new_parent(&self, req: NewParentRequest) -> Result<NewParentResponse, ClientError> {
        self.before("new_parent").await?;
        self.inner.new_parent(req).await
    }

    async fn leave_broadcast(&self, req: LeaveRequest) -> Result<LeaveResponse, ClientError> {
        self.before("leave_broadcast").await?;
        self.inner.leave_broadcast(req).await
    }

    async fn swarm_sync(&self, req: SwarmSyncRequest) -> Result<SwarmSyncReply, ClientError> {
        self.before("swarm_sync").await?;
        self.inner.swarm_sync(req).await
    }

    async fn get_window(&self, req: GetWindowRequest) -> Result<Window, ClientError> {
        self.before("get_window").await?;
        self.inner.get_window(req).await
    }

    async fn registration_secret(
        &self,
        req: RegistrationSecretRequest,
    ) -> Result<RegistrationSecretResponse, ClientError> {
        self.before("registration_secret").await?;
        self.inner.registration_secret(req).await
    }

    async fn join_gpu_window(&self, req: GpuJoinRequest) -> Result<GpuJoinResponse, ClientError> {
        self.before("join_gpu_window").await?;
        self.inner.join_gpu_window(req).await
    }

    async fn await_gpu_window(&self, req: GpuAwaitRequest) -> Result<GpuWindow, ClientError> {
        self.before("await_gpu_window").await?;
        self.inner.await_gpu_window(req).await
    }

    async fn finish_gpu_window(
        &self,
        req: GpuFinishRequest,
    ) -> Result<GpuFinishResponse, ClientError> {
        self.before("finish_gpu_window").await?;
        self.inner.finish_gpu_window(req).await
    }

    async fn watch(&self, ups: WatchUps) -> Result<WatchDowns, ClientError> {
        self.before("watch").await?;
        self.inner.watch(ups).await
    }
}
