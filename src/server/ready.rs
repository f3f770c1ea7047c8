//! Readiness: the standard gRPC health service (`grpc.health.v1`, which Kubernetes' grpc probes
//! ask), SERVING while the metadata's engine and the blocks' object store answer, NOT_SERVING
//! while either does not, so that a replica cut off from etcd or S3 leaves its Service's
//! endpoints until they answer again. A store on its own disk is always ready. The same answer
//! is `GET /ready` on the port (`crate::metrics::ready`), for an HTTP probe: a port that speaks
//! TLS still answers plain HTTP there, where Kubernetes' gRPC probes cannot reach it.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::meta::MetaStore;

/// How often the engines are asked, and how long an answer may take.
const EVERY: Duration = Duration::from_secs(2);
const WITHIN: Duration = Duration::from_secs(10);

/// Keeps the overall status (service "") to what the engines answer, until aborted.
pub(super) async fn report(meta: Arc<MetaStore>, reporter: HealthReporter) {
    let mut was = None;
    loop {
        let m = meta.clone();
        let checked =
            tokio::time::timeout(WITHIN, tokio::task::spawn_blocking(move || m.check())).await;
        let failed = match checked {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(e))) => Some(e.to_string()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {WITHIN:?}")),
        };
        let now = match failed {
            None => ServingStatus::Serving,
            Some(_) => ServingStatus::NotServing,
        };
        if was != Some(now) {
            match &failed {
                None => tracing::info!("ready: the metadata and blocks answer"),
                Some(why) => tracing::warn!(error = %why, "not ready"),
            }
            reporter.set_service_status("", now).await;
            crate::metrics::set_ready(failed.is_none());
            was = Some(now);
        }
        tokio::time::sleep(EVERY).await;
    }
}
