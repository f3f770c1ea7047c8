//! CSI Controller: CreateVolume maps a PVC to a key prefix in a namespace (nothing is written
//! to the store until a pod writes); DeleteVolume removes the keys under the prefix.
//!
//! CreateVolume is idempotent by name: the first request for a name is recorded in
//! `STATE_DIR/volumes/`, a repeat with the same parameters and capacity returns the same volume,
//! and one that differs is refused with ALREADY_EXISTS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::capability;
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::{self, rpc};
use crate::proto::validate_volume_capabilities_response::Confirmed;
use crate::proto::{
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerServiceCapability, CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest,
    DeleteVolumeResponse, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    Volume,
};
use crate::volume::VolumeSpec;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("volume name {0:?} cannot be recorded (longer than 100 bytes once encoded)")]
    Name(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The CreateVolume requests this controller has answered, one JSON file per volume name.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(dir: PathBuf) -> Self {
        Records { dir }
    }

    fn path(&self, name: &str) -> Result<PathBuf, RecordError> {
        // PV names are DNS labels and stay as they are; anything else is hex-encoded.
        let plain = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && name.len() <= 100;
        let file = if plain {
            format!("n-{name}.json")
        } else if name.len() <= 50 {
            let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            format!("x-{hex}.json")
        } else {
            return Err(RecordError::Name(name.to_string()));
        };
        Ok(self.dir.join(file))
    }

    fn get(&self, name: &str) -> Result<Option<Value>, RecordError> {
        let path = self.path(name)?;
        match std::fs::read(&path) {
            // A record that does not parse was not written by us: treat it as absent.
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RecordError::Io {
                what: "reading",
                path,
                source,
            }),
        }
    }

    fn put(&self, name: &str, record: &Value) -> Result<(), RecordError> {
        let path = self.path(name)?;
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io { what, path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, record.to_string()).map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))
    }

    /// Forgets every name recorded for `volume_id`.
    fn remove_volume(&self, volume_id: &str) -> Result<(), RecordError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(RecordError::Io {
                    what: "listing",
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if v["volume_id"] == volume_id {
                std::fs::remove_file(&path).map_err(|source| RecordError::Io {
                    what: "removing",
                    path: path.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct ControllerService {
    kt: PathBuf,
    server: String,
    records: Records,
    /// CreateVolume and DeleteVolume one at a time: a record is read, compared and written.
    lock: Arc<Mutex<()>>,
}

impl ControllerService {
    pub fn new(kt: PathBuf, server: String, state_dir: &Path) -> Self {
        ControllerService {
            kt,
            server,
            records: Records::new(state_dir.join("volumes")),
            lock: Arc::new(Mutex::new(())),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// `(required, limit)` from a capacity range; ktfs has no size, so any range is accepted as long
/// as it is well formed.
fn capacity(range: Option<&crate::proto::CapacityRange>) -> Result<(i64, i64), Status> {
    let Some(r) = range else {
        return Ok((0, 0));
    };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(Status::invalid_argument("capacity must not be negative"));
    }
    if r.limit_bytes > 0 && r.limit_bytes < r.required_bytes {
        return Err(Status::out_of_range(format!(
            "capacity limit {} is below the required {}",
            r.limit_bytes, r.required_bytes
        )));
    }
    Ok((r.required_bytes, r.limit_bytes))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        capability::check_all(&req.volume_capabilities).map_err(Status::invalid_argument)?;
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "ktfs volumes cannot be created from a snapshot or another volume",
            ));
        }
        let (required, limit) = capacity(req.capacity_range.as_ref())?;
        let spec = VolumeSpec::from_parameters(&req.name, &req.parameters)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let record = json!({
            "name": req.name,
            "volume_id": spec.id(),
            "spec": spec.fields(),
            "required_bytes": required,
            "limit_bytes": limit,
        });
        let _guard = self.lock.lock().await;
        match self.records.get(&req.name).map_err(internal)? {
            Some(old) if old == record => {}
            Some(old) => {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists with other parameters or capacity: {}",
                    req.name, old
                )))
            }
            None => self.records.put(&req.name, &record).map_err(internal)?,
        }
        tracing::info!(name = req.name, volume_id = spec.id(), "volume created");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: required,
                volume_id: spec.id(),
                volume_context: spec.context(),
                content_source: None,
                accessible_topology: vec![],
            }),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let spec = match VolumeSpec::from_id(&id) {
            Ok(s) => s,
            Err(e) => {
                // Not a volume this driver ever made: there is nothing to delete.
                tracing::info!(volume_id = id, error = %e, "delete of an unknown volume");
                return Ok(Response::new(DeleteVolumeResponse {}));
            }
        };
        let _guard = self.lock.lock().await;
        let (kt, server) = (self.kt.clone(), self.server.clone());
        let removed = tokio::task::spawn_blocking(move || {
            crate::kt::remove_tree(&kt, &server, &spec.namespace, &spec.prefix)
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
        self.records.remove_volume(&id).map_err(internal)?;
        tracing::info!(volume_id = id, removed, "volume deleted");
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume capabilities are required"));
        }
        VolumeSpec::from_id(&req.volume_id).map_err(|e| Status::not_found(e.to_string()))?;
        let problem = capability::check_all(&req.volume_capabilities)
            .err()
            .or_else(|| {
                let params: HashMap<String, String> = req.parameters.clone();
                VolumeSpec::from_parameters("x", &params)
                    .err()
                    .map(|e| e.to_string())
            });
        Ok(Response::new(match problem {
            Some(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc {
                        r#type: rpc::Type::CreateDeleteVolume as i32,
                    },
                )),
            }],
        }))
    }
}
