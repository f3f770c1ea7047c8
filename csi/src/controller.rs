//! CSI Controller: CreateVolume maps a PVC to a key prefix in a namespace (nothing is written
//! to the store until a pod writes); DeleteVolume removes the keys under the prefix.
//!
//! CreateVolume is idempotent by name: the first request for a name is recorded in
//! `STATE_DIR/volumes/`, a repeat with the same parameters and capacity returns the same volume,
//! and one that differs is refused with ALREADY_EXISTS.
//!
//! Calls run concurrently, one at a time per volume ([`VolumeGuard`]): a CreateVolume holds
//! its name (its record is read, compared and written) and the volume id it maps to, a
//! DeleteVolume the id; a second call for either while the first runs gets ABORTED.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tonic::{Request, Response, Status};

use crate::capability;
use crate::guard::VolumeGuard;
use crate::kt::{ErrorKind, KtError};
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
    #[error("{path} is the record of another volume name than {name:?}")]
    Other { path: PathBuf, name: String },
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

    /// A name's record file. Plain names (PV names are DNS labels) stay as they are, short
    /// other names are hex-encoded, and the rest are hashed: the spec's longest name, 128 bytes
    /// of any characters, would not fit in a file name (255 bytes) hex-encoded. The three forms
    /// start apart, and a record holds its name, which [`Records::get`] checks.
    fn path(&self, name: &str) -> PathBuf {
        let plain = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && name.len() <= 128;
        let file = if plain {
            format!("n-{name}.json")
        } else if name.len() <= 50 {
            let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            format!("x-{hex}.json")
        } else {
            format!("h-{}.json", crate::volume::name_hash(name))
        };
        self.dir.join(file)
    }

    fn get(&self, name: &str) -> Result<Option<Value>, RecordError> {
        let path = self.path(name);
        match std::fs::read(&path) {
            // A record that does not parse was not written by us: treat it as absent.
            Ok(bytes) => match serde_json::from_slice::<Value>(&bytes).ok() {
                Some(v) if v["name"] != name => Err(RecordError::Other {
                    path,
                    name: name.to_string(),
                }),
                v => Ok(v),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RecordError::Io {
                what: "reading",
                path,
                source,
            }),
        }
    }

    fn put(&self, name: &str, record: &Value) -> Result<(), RecordError> {
        let path = self.path(name);
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
    /// Volume ids with a CreateVolume or DeleteVolume in flight.
    volumes: VolumeGuard,
    /// Volume names with a CreateVolume in flight (their records are read, compared and
    /// written).
    names: VolumeGuard,
}

impl ControllerService {
    pub fn new(kt: PathBuf, server: String, state_dir: &Path) -> Self {
        ControllerService {
            kt,
            server,
            records: Records::new(state_dir.join("volumes")),
            volumes: VolumeGuard::new(),
            names: VolumeGuard::of("volume name"),
        }
    }

    /// The guard of volume ids in flight (tests hold a permit of it to stand for a call).
    #[cfg(test)]
    pub(crate) fn volume_guard(&self) -> &VolumeGuard {
        &self.volumes
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// The gRPC status of a failed `kt` call, by how kt says it failed.
fn kt_status(e: KtError) -> Status {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Unreachable | ErrorKind::Unavailable => Status::unavailable(msg),
        ErrorKind::Timeout => Status::deadline_exceeded(msg),
        ErrorKind::Invalid => Status::invalid_argument(msg),
        ErrorKind::NotFound => Status::not_found(msg),
        ErrorKind::Denied => Status::permission_denied(msg),
        // Changed concurrently: gRPC's code for "retry the whole call".
        ErrorKind::Conflict => Status::aborted(msg),
        // A usage error is a command line kt-csi got wrong.
        ErrorKind::Other | ErrorKind::Usage => Status::internal(msg),
    }
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
        let _name = self.names.try_acquire(&req.name)?;
        let _volume = self.volumes.try_acquire(&spec.id())?;
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
        let permit = self.volumes.try_acquire(&id)?;
        let (kt, server, records) = (self.kt.clone(), self.server.clone(), self.records.clone());
        let volume_id = id.clone();
        // The permit goes with the work: a call whose client gave up still holds the volume
        // until `kt rm` is done.
        let removed = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let removed = crate::kt::remove_tree(&kt, &server, &spec.namespace, &spec.prefix)
                .map_err(kt_status)?;
            records.remove_volume(&volume_id).map_err(internal)?;
            Ok::<_, Status>(removed)
        })
        .await
        .map_err(internal)??;
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
                VolumeSpec::check_parameters(&params)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::volume_capability::access_mode::Mode;
    use crate::proto::volume_capability::{AccessMode, AccessType, MountVolume};
    use crate::proto::VolumeCapability;
    use std::time::{Duration, Instant};
    use tonic::Code;

    fn delete(id: &str) -> Request<DeleteVolumeRequest> {
        Request::new(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
    }

    fn create(name: &str) -> Request<CreateVolumeRequest> {
        Request::new(CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: Mode::MultiNodeMultiWriter as i32,
                }),
            }],
            // What the external provisioner adds (--extra-create-metadata).
            parameters: HashMap::from([(
                crate::volume::PVC_NAMESPACE.to_string(),
                "default".to_string(),
            )]),
            ..Default::default()
        })
    }

    fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A `kt rm` that blocks on prefix `slow` until `release` exists, finds nothing for any
    /// other prefix, and cannot reach the server for `down`.
    fn fake_rm(dir: &Path) -> PathBuf {
        let release = dir.join("release");
        let body = format!(
            "case \"$9\" in\n\
             slow) while [ ! -e '{}' ]; do sleep 0.02; done; echo '{{\"removed\":[\"slow\"]}}';;\n\
             down) echo '{{\"error\":{{\"kind\":\"unreachable\",\"exit_code\":5,\"message\":\"no store\"}}}}'; exit 5;;\n\
             bad) echo 'kt: error: bad key' >&2; exit 4;;\n\
             *) echo '{{\"error\":{{\"kind\":\"not_found\",\"exit_code\":3,\"message\":\"not found\"}}}}'; exit 3;;\n\
             esac",
            release.display()
        );
        crate::kt::fake_kt(dir, &body)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deletes_run_one_at_a_time_per_volume_and_concurrently_across_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let svc = ControllerService::new(fake_rm(dir.path()), "s:7447".into(), dir.path());
        let first = tokio::spawn({
            let svc = svc.clone();
            async move { svc.delete_volume(delete("team/slow")).await }
        });
        eventually("the first delete holds its volume", || {
            svc.volume_guard().is_held("team/slow")
        });

        let again = svc.delete_volume(delete("team/slow")).await.unwrap_err();
        assert_eq!(again.code(), Code::Aborted, "{again:?}");
        assert_eq!(
            again.message(),
            "an operation for volume team/slow is already in progress"
        );
        // Another volume is deleted while the first is still in flight (a global lock would
        // keep it waiting until the release).
        tokio::time::timeout(
            Duration::from_secs(10),
            svc.delete_volume(delete("team/other")),
        )
        .await
        .expect("a delete of another volume waited for the first")
        .unwrap();
        assert!(!first.is_finished());

        std::fs::write(dir.path().join("release"), b"").unwrap();
        first.await.unwrap().unwrap();
        assert!(!svc.volume_guard().is_held("team/slow"));
        svc.delete_volume(delete("team/slow")).await.unwrap();
    }

    #[tokio::test]
    async fn kt_failures_become_grpc_codes() {
        let dir = tempfile::tempdir().unwrap();
        let svc = ControllerService::new(fake_rm(dir.path()), "s:7447".into(), dir.path());
        let down = svc.delete_volume(delete("team/down")).await.unwrap_err();
        assert_eq!(down.code(), Code::Unavailable, "{down:?}");
        assert!(down.message().contains("no store"), "{down:?}");
        let bad = svc.delete_volume(delete("team/bad")).await.unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
        assert!(bad.message().contains("kt: error: bad key"), "{bad:?}");
        // Not found: already deleted.
        svc.delete_volume(delete("team/gone")).await.unwrap();
        assert!(!svc.volume_guard().is_held("team/down"));

        let missing = ControllerService::new(dir.path().join("no-kt"), "s:7447".into(), dir.path());
        let e = missing.delete_volume(delete("team/x")).await.unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");

        for (kind, code) in [
            (ErrorKind::Other, Code::Internal),
            (ErrorKind::Usage, Code::Internal),
            (ErrorKind::NotFound, Code::NotFound),
            (ErrorKind::Invalid, Code::InvalidArgument),
            (ErrorKind::Unreachable, Code::Unavailable),
            (ErrorKind::Conflict, Code::Aborted),
            (ErrorKind::Timeout, Code::DeadlineExceeded),
            (ErrorKind::Unavailable, Code::Unavailable),
            (ErrorKind::Denied, Code::PermissionDenied),
        ] {
            let e = KtError::Failed {
                args: "rm".into(),
                kind,
                code: Some(kind.code()),
                message: "m".into(),
            };
            assert_eq!(kt_status(e).code(), code, "{kind}");
        }
    }

    #[tokio::test]
    async fn a_volume_in_flight_refuses_create_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let svc = ControllerService::new(dir.path().join("no-kt"), "s:7447".into(), dir.path());
        let held = svc.volume_guard().try_acquire("default/pvc-held").unwrap();
        for e in [
            svc.create_volume(create("pvc-held")).await.unwrap_err(),
            svc.delete_volume(delete("default/pvc-held"))
                .await
                .unwrap_err(),
        ] {
            assert_eq!(e.code(), Code::Aborted, "{e:?}");
        }
        // Other volumes go on.
        let v = svc.create_volume(create("pvc-free")).await.unwrap();
        assert_eq!(v.into_inner().volume.unwrap().volume_id, "default/pvc-free");
        assert!(!svc.volume_guard().is_held("default/pvc-free"));
        // Bad requests are refused as such, held volume or not.
        let e = svc.delete_volume(delete("")).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        drop(held);
        svc.create_volume(create("pvc-held")).await.unwrap();
    }

    #[tokio::test]
    async fn names_of_any_characters_up_to_the_spec_limit_are_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let svc = ControllerService::new(dir.path().join("no-kt"), "s:7447".into(), dir.path());
        // 128 bytes: slashes, dots, spaces, a tab, non-ASCII.
        let name = format!("../ a/b\t\u{e9}/{}xy", "\u{2603}/.".repeat(23));
        assert_eq!(name.len(), 128);
        let mut names = vec![
            name.clone(),
            name[..127].to_string(),
            "p".repeat(128),
            "a b".to_string(),
        ];
        names.push(format!("{}-", "p".repeat(127)));
        let mut ids = vec![];
        for n in &names {
            let v = svc
                .create_volume(create(n))
                .await
                .unwrap_or_else(|e| panic!("{n:?}: {e}"));
            let v = v.into_inner().volume.unwrap();
            // Again: the same volume, from its record.
            let again = svc.create_volume(create(n)).await.unwrap();
            assert_eq!(again.into_inner().volume.unwrap(), v, "{n:?}");
            ids.push(v.volume_id);
        }
        assert_eq!(
            ids[0],
            format!("default/~{}", crate::volume::name_hash(&name))
        );
        assert_eq!(ids[2], format!("default/{}", "p".repeat(128)));
        let mut apart = ids.clone();
        apart.sort();
        apart.dedup();
        assert_eq!(apart.len(), names.len(), "{ids:?}");
        let mut files: Vec<_> = std::fs::read_dir(dir.path().join("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files.len(), names.len(), "{files:?}");
        assert!(files.iter().all(|f| f.len() <= 255 && f.ends_with(".json")));
        // Another name with other parameters is still refused by its own record.
        let mut other = create(&name);
        other
            .get_mut()
            .parameters
            .insert("locale".into(), "local".into());
        let e = svc.create_volume(other).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        // A record under a name's file that is of another name is not taken for it.
        let records = Records::new(dir.path().join("volumes"));
        std::fs::write(records.path(&name), json!({"name": "else"}).to_string()).unwrap();
        let e = svc.create_volume(create(&name)).await.unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
    }
}
