//! What a pod's environment tells about the cluster: the namespace from the downward API
//! (`POD_NAMESPACE`), and the store server by its Service name (deploy/store.yaml) when running
//! inside a cluster. Explicit flags and `KT_*` variables always win over these defaults.

use crate::key::Namespace;

/// The store server's Service, as deploy/ names it.
pub const STORE_SERVICE: &str = "kt-store.kt-system:7447";
/// The store server outside a cluster: `kt up` on this machine.
pub const LOCAL_SERVER: &str = "127.0.0.1:7447";

/// The namespace when none is given: the pod's own, else `default`.
pub fn default_namespace() -> String {
    namespace_from(std::env::var("POD_NAMESPACE").ok())
}

fn namespace_from(pod_namespace: Option<String>) -> String {
    pod_namespace
        .filter(|ns| Namespace::parse(ns).is_ok())
        .unwrap_or_else(|| Namespace::DEFAULT.to_string())
}

/// The store server when none is given: its Service inside a cluster, else this machine.
pub fn default_server() -> String {
    server_from(std::env::var_os("KUBERNETES_SERVICE_HOST").is_some())
}

fn server_from(in_cluster: bool) -> String {
    if in_cluster {
        STORE_SERVICE
    } else {
        LOCAL_SERVER
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_pod_environment() {
        assert_eq!(namespace_from(Some("team-a".into())), "team-a");
        assert_eq!(namespace_from(None), Namespace::DEFAULT);
        // Garbage in the environment is no namespace.
        assert_eq!(namespace_from(Some("a/b".into())), Namespace::DEFAULT);
        assert_eq!(server_from(true), STORE_SERVICE);
        assert_eq!(server_from(false), LOCAL_SERVER);
    }
}
