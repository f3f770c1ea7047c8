//! The Kubernetes API, through the `kube` crate: a node's zone for nearest-source choice, and,
//! from outside the cluster, a local port that forwards to the store server's pod (as
//! `kubectl port-forward service/kt-store` does), so that `kt put/get/ls/rm` work from a laptop.
//!
//! Both are best effort where they are defaults (a pod without API access still runs, without a
//! zone) and hard errors where the user asked for them (`--kubeconfig`).

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::net::{TcpListener, TcpStream};

/// The well-known label that carries a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The store server's Service as deploy/ names it.
pub const DEFAULT_STORE_SERVICE: &str = "kt-system/kt-store:7447";
/// How long a default that asks the API may hold up a start.
const API_PATIENCE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("service {0} has no pod selector to forward to")]
    NoSelector(String),
    #[error("no running pod behind service {0}")]
    NoPod(String),
    #[error("bad service {0:?}: expected NAMESPACE/NAME:PORT")]
    BadService(String),
    #[error("port forward: {0}")]
    Io(#[from] std::io::Error),
    #[error("the Kubernetes API did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the Kubernetes API issued no token for ServiceAccount {0}")]
    NoToken(String),
}

/// A client for the cluster of a kubeconfig file (its current context, or `context`).
pub async fn client_from_kubeconfig(
    path: &Path,
    context: Option<&str>,
) -> Result<Client, ClusterError> {
    let bad = |reason: String| ClusterError::Kubeconfig {
        path: path.display().to_string(),
        reason,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| bad(e.to_string()))?;
    Ok(Client::try_from(config)?)
}

/// The zone label of a node, if it has one.
pub async fn node_zone(client: Client, node: &str) -> Result<Option<String>, ClusterError> {
    let nodes: Api<Node> = Api::all(client);
    let n = nodes.get(node).await?;
    Ok(n.metadata
        .labels
        .and_then(|l| l.get(ZONE_LABEL).cloned())
        .filter(|z| !z.is_empty()))
}

/// This node's zone, asked of the API when the process knows its node (`NODE_NAME`, set by
/// deploy/ from the downward API) and can reach the API (in-cluster credentials, or
/// `KUBECONFIG`). `None`, with a warning, when it cannot: zones only refine source choice.
pub async fn zone_from_api() -> Option<String> {
    let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty())?;
    let ask = async {
        let client = Client::try_default().await?;
        node_zone(client, &node).await
    };
    match tokio::time::timeout(API_PATIENCE, ask).await {
        Ok(Ok(zone)) => {
            tracing::info!(node = %node, zone = ?zone, "zone from the node object");
            zone
        }
        Ok(Err(e)) => {
            tracing::warn!(node = %node, error = %e, "no zone from the Kubernetes API");
            None
        }
        Err(_) => {
            tracing::warn!(node = %node, "no zone: the Kubernetes API did not answer");
            None
        }
    }
}

/// A Service to forward to: `NAMESPACE/NAME:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

impl FromStr for ServiceRef {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ClusterError::BadService(s.to_string());
        let (ns, rest) = s.split_once('/').ok_or_else(bad)?;
        let (name, port) = rest.split_once(':').ok_or_else(bad)?;
        let port = port.parse().map_err(|_| bad())?;
        if ns.is_empty() || name.is_empty() {
            return Err(bad());
        }
        Ok(ServiceRef {
            namespace: ns.to_string(),
            name: name.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

/// From outside the cluster: a local port that reaches the store server through the cluster of
/// a kubeconfig (its current context, or `context`), forwarding to a running pod behind
/// `service` (`NAMESPACE/NAME:PORT`), as `kubectl port-forward` does. Lasts as long as the
/// returned value.
pub async fn reach_store(
    kubeconfig: &Path,
    context: Option<&str>,
    service: &str,
) -> Result<Forward, ClusterError> {
    let svc: ServiceRef = service.parse()?;
    let client = client_from_kubeconfig(kubeconfig, context).await?;
    forward_service(client, &svc).await
}

/// A local port that forwards each connection to a pod; stops forwarding when dropped.
pub struct Forward {
    pub addr: SocketAddr,
    pub pod: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens a local port on 127.0.0.1 that reaches `svc` through a running pod behind it. Every
/// connection accepted there is one port-forward stream through the API server, so the control
/// plane and the data plane (one port, see `net.rs`) both pass.
pub async fn forward_service(client: Client, svc: &ServiceRef) -> Result<Forward, ClusterError> {
    let ask = async {
        let services: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
        let spec = services.get(&svc.name).await?.spec.unwrap_or_default();
        let selector = spec
            .selector
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ClusterError::NoSelector(svc.to_string()))?;
        let target = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.port == i32::from(svc.port))
            .and_then(|p| p.target_port);
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let pods: Api<Pod> = Api::namespaced(client, &svc.namespace);
        let list = pods
            .list(&ListParams::default().labels(&labels.join(",")))
            .await?;
        let pod = list
            .items
            .into_iter()
            .find(running)
            .ok_or_else(|| ClusterError::NoPod(svc.to_string()))?;
        let port = pod_port(&pod, target.as_ref()).unwrap_or(svc.port);
        Ok::<_, ClusterError>((pods, pod.metadata.name.unwrap_or_default(), port))
    };
    let (pods, pod, port) = tokio::time::timeout(API_PATIENCE, ask)
        .await
        .map_err(|_| ClusterError::Timeout(API_PATIENCE))??;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let name = pod.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let (pods, name) = (pods.clone(), name.clone());
            tokio::spawn(async move {
                if let Err(e) = forward_one(&pods, &name, port, conn).await {
                    tracing::warn!(pod = %name, port, error = %e, "port forward failed");
                }
            });
        }
    });
    tracing::debug!(%addr, pod = %pod, port, "forwarding to the store server");
    Ok(Forward { addr, pod, task })
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The pod's port for a Service's target port: a number as it is, a name looked up among the
/// pod's container ports.
fn pod_port(pod: &Pod, target: Option<&IntOrString>) -> Option<u16> {
    match target? {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

async fn forward_one(
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
    mut conn: TcpStream,
) -> Result<(), ClusterError> {
    let mut pf = pods.portforward(pod, &[port]).await?;
    let mut upstream = pf
        .take_stream(port)
        .ok_or_else(|| ClusterError::NoPod(pod.to_string()))?;
    // Either side closing ends the stream; the other side sees the end.
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
    drop(upstream);
    let _ = pf.join().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_refs() {
        let s: ServiceRef = DEFAULT_STORE_SERVICE.parse().unwrap();
        assert_eq!(
            s,
            ServiceRef {
                namespace: "kt-system".into(),
                name: "kt-store".into(),
                port: 7447
            }
        );
        assert_eq!(s.to_string(), DEFAULT_STORE_SERVICE);
        for bad in ["kt-store:7447", "ns/name", "ns/name:x", "/n:1", "ns/:1"] {
            assert!(bad.parse::<ServiceRef>().is_err(), "{bad}");
        }
    }
}
