//! The agent's service on its unix socket, for CLIs on this node: publish in place, seed what
//! a getter fetched, offer blocks while they arrive, mount and unmount namespaces, status.
//! Its errors become statuses through the one table of `rpc::status`.

use std::sync::Arc;

use indicatif::ProgressBar;
use tonic::{Request, Response, Status};

use super::caller::Caller;
use super::config::AgentConfig;
use super::hosted::{HostError, HostedMounts};
use crate::auth::credential::AUTHORIZATION;
use crate::auth::ticket::{Gate, SharedGate};
use crate::blocks::in_place::{Check, InPlaceError};
use crate::blocks::node::NodeBlocks;
use crate::hash::{BlockHash, Version};
use crate::manifest::{self, Manifest};
use crate::proto::agent_server::Agent;
use crate::proto::*;
use crate::rpc::client::{self, ClientError};
use crate::rpc::status::{to_status, Fault};
use crate::transfer::publish::{self, Payload, PublishError};

pub(super) struct AgentHandler {
    pub cfg: AgentConfig,
    pub data_addr: String,
    pub blocks: Arc<NodeBlocks>,
    pub hosted: Option<Arc<HostedMounts>>,
    pub gate: SharedGate,
}

fn invalid(msg: impl Into<String>) -> Status {
    to_status(Fault::Invalid, msg)
}

fn client_status(e: ClientError) -> Status {
    to_status(e.fault(), e.to_string())
}

fn in_place_status(e: InPlaceError) -> Status {
    let fault = match &e {
        InPlaceError::NoEntry(_) | InPlaceError::NotAbsolute(_) | InPlaceError::BadHash(_) => {
            Fault::Invalid
        }
        InPlaceError::Disk { .. } | InPlaceError::Changed(_) => Fault::Conflict,
        InPlaceError::NotItsBlock { .. } => Fault::Invalid,
        InPlaceError::Db(_) | InPlaceError::Corrupt(_) => Fault::Internal,
    };
    to_status(fault, e.to_string())
}

fn host_status(e: HostError) -> Status {
    let fault = match &e {
        HostError::Conflict { .. } => Fault::Exists,
        HostError::BadRequest(_) => Fault::Invalid,
        HostError::Mount { .. } => Fault::Internal,
        HostError::NotMounted(_) => Fault::NotFound,
    };
    to_status(fault, e.to_string())
}

fn publish_status(e: PublishError) -> Status {
    match e {
        PublishError::Client(c) => client_status(c),
        PublishError::Transfer(t) => to_status(t.fault(), t.to_string()),
        PublishError::BadVersion => to_status(Fault::Internal, e.to_string()),
    }
}

/// A manifest a CLI sent, checked before anything is registered from it.
fn checked(m: Option<Manifest>) -> Result<Manifest, Status> {
    let m = m.ok_or_else(|| invalid("manifest missing"))?;
    manifest::validate(&m).map_err(|e| invalid(e.to_string()))?;
    Ok(m)
}

impl AgentHandler {
    fn hosted(&self) -> Result<&HostedMounts, Status> {
        self.hosted.as_deref().ok_or_else(|| {
            to_status(
                Fault::Conflict,
                "this agent does not host mounts (start it with --host-mounts)",
            )
        })
    }

    /// Registers `files` as holding the blocks of `m`, opened and hashed with `caller`'s
    /// rights, off the async threads.
    async fn register(
        &self,
        caller: Caller,
        m: Manifest,
        files: Vec<LocalFile>,
    ) -> Result<usize, Status> {
        let blocks = self.blocks.clone();
        let open = move |p: &std::path::Path| caller.open(p);
        tokio::task::spawn_blocking(move || blocks.register(&m, &files, Check::Hashes, &open))
            .await
            .map_err(|e| to_status(Fault::Internal, e.to_string()))?
            .map_err(in_place_status)
    }
}

#[tonic::async_trait]
impl Agent for AgentHandler {
    async fn publish_local(
        &self,
        req: Request<PublishLocalRequest>,
    ) -> Result<Response<PublishResponse>, Status> {
        let caller = Caller::of(&req)?;
        // The store checks the namespace against the caller's own credential, the origin
        // against this node's.
        let credential = self
            .cfg
            .credential
            .acting_for(req.metadata().get(AUTHORIZATION).cloned());
        let r = req.into_inner();
        let mut req = r.publish.ok_or_else(|| invalid("publish missing"))?;
        // The store cannot check this manifest's block lengths against its index: the blocks
        // stay here. Registering checks each file's size against its entry, serving reads each
        // block at the manifest's length and checks its hash, and every reader checks the
        // length of what it receives; those are what stop a manifest that lies.
        let m = checked(req.manifest.clone())?;
        let started = std::time::Instant::now();
        let n = self.register(caller, m, r.files).await?;
        let registered_ms = started.elapsed().as_millis() as u64;
        req.locale = Locale::Local as i32;
        req.origin_node = self.cfg.node_id.clone();
        let store = client::connect_store(&self.cfg.server, &credential)
            .await
            .map_err(client_status)?;
        let done = publish::publish(
            &store,
            &self.cfg.server,
            req,
            Payload::InPlace,
            &ProgressBar::hidden(),
        )
        .await
        .map_err(publish_status)?;
        tracing::info!(blocks = n, registered_ms, "published in place");
        Ok(Response::new(PublishResponse {
            version: done.version.0.to_vec(),
            parent: done.parent,
            entry: done.entry,
        }))
    }

    async fn add_source(
        &self,
        req: Request<AddSourceRequest>,
    ) -> Result<Response<AddSourceResponse>, Status> {
        let caller = Caller::of(&req)?;
        // The store checks the key against the caller's own credential, presented beside the
        // node's, as a local publish does.
        let credential = self
            .cfg
            .credential
            .acting_for(req.metadata().get(AUTHORIZATION).cloned());
        let r = req.into_inner();
        let version = Version::from_slice(&r.version).ok_or_else(|| invalid("bad version"))?;
        let m = checked(r.manifest)?;
        let (namespace, key) = (r.namespace.clone(), r.key.clone());
        let blocks = self.blocks.clone();
        let started = std::time::Instant::now();
        let open = move |p: &std::path::Path| caller.open(p);
        tokio::task::spawn_blocking(move || blocks.seed(&version, &m, &r.files, &open))
            .await
            .map_err(|e| to_status(Fault::Internal, e.to_string()))?
            .map_err(in_place_status)?;
        let registered_ms = started.elapsed().as_millis() as u64;
        let store = client::connect_store(&self.cfg.server, &credential)
            .await
            .map_err(client_status)?;
        store
            .add_location(AddLocationRequest {
                version: version.0.to_vec(),
                node_id: self.cfg.node_id.clone(),
                namespace,
                key,
            })
            .await
            .map_err(client_status)?;
        tracing::info!(%version, registered_ms, "seeding");
        Ok(Response::new(AddSourceResponse {}))
    }

    async fn status(
        &self,
        _req: Request<AgentStatusRequest>,
    ) -> Result<Response<AgentStatusResponse>, Status> {
        let (bytes_served, blocks_served) = self.blocks.served();
        Ok(Response::new(AgentStatusResponse {
            node_id: self.cfg.node_id.clone(),
            data_addr: self.data_addr.clone(),
            server: self.cfg.server.clone(),
            zone: self.cfg.zone.clone(),
            bytes_served,
            blocks_served,
            cache_bytes: self.blocks.cache().used(),
            cache_budget_bytes: self.blocks.cache().budget(),
            fetched_store_bytes: crate::metrics::FETCHED_STORE_BYTES.get(),
            fetched_peer_bytes: crate::metrics::FETCHED_PEER_BYTES.get(),
            registered: !matches!(*crate::locks::read(&self.gate), Gate::Closed),
        }))
    }

    async fn mount(&self, req: Request<MountRequest>) -> Result<Response<MountResponse>, Status> {
        Caller::of(&req)?.may_administer()?;
        let already_mounted = self
            .hosted()?
            .mount(req.into_inner())
            .await
            .map_err(host_status)?;
        Ok(Response::new(MountResponse { already_mounted }))
    }

    async fn unmount(
        &self,
        req: Request<UnmountRequest>,
    ) -> Result<Response<UnmountResponse>, Status> {
        Caller::of(&req)?.may_administer()?;
        self.hosted()?
            .unmount(&req.into_inner().mountpoint)
            .await
            .map_err(host_status)?;
        Ok(Response::new(UnmountResponse {}))
    }

    async fn receive(
        &self,
        req: Request<tonic::Streaming<ReceiveEvent>>,
    ) -> Result<Response<ReceiveResponse>, Status> {
        let caller = Caller::of(&req)?;
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| invalid("empty receive stream"))?;
        let m = checked(first.manifest)?;
        // The files are the caller's, opened with its rights: what it could not read, the
        // agent does not serve for it.
        let (blocks, files) = (self.blocks.clone(), first.files);
        let open = move |p: &std::path::Path| caller.open(p);
        let offer = tokio::task::spawn_blocking(move || blocks.offer(&m, &files, &open))
            .await
            .map_err(|e| to_status(Fault::Internal, e.to_string()))?
            .map_err(in_place_status)?;
        let ready = |hashes: &[Vec<u8>]| {
            let hashes: Vec<BlockHash> = hashes
                .iter()
                .filter_map(|h| BlockHash::from_slice(h))
                .collect();
            offer.ready(&hashes);
        };
        let pieces = |ready: &[crate::proto::ReadyPieces]| {
            for r in ready {
                let (Some(hash), Ok(log2)) =
                    (BlockHash::from_slice(&r.block), u8::try_from(r.log2))
                else {
                    continue;
                };
                let cvs: Vec<[u8; 32]> = r
                    .cvs
                    .chunks_exact(32)
                    .filter_map(|c| c.try_into().ok())
                    .collect();
                offer.ready_pieces(&hash, log2, &cvs, &r.pieces);
            }
        };
        ready(&first.ready);
        pieces(&first.pieces);
        // The offer lasts as long as the getter's stream; a getter that dies ends it.
        while let Ok(Some(ev)) = stream.message().await {
            ready(&ev.ready);
            pieces(&ev.pieces);
        }
        drop(offer);
        Ok(Response::new(ReceiveResponse {}))
    }
}
