//! From outside the cluster (a laptop, a notebook): the store server is reached through a
//! kubeconfig's cluster, by port-forward to a pod of its Service, and what the client presents
//! is a short-lived token of a ServiceAccount of the target namespace, which the Kubernetes API
//! issues to the kubeconfig's user if RBAC lets it; the user's own credential never reaches the
//! store server. `kt --kubeconfig` and the Python package's `kubeconfig_path` both come here, with
//! the same settings: flags for `kt`, the environment for both.

use std::path::PathBuf;

use super::api::{self, ClusterError, Forward};
use super::tokens::{self, ServiceAccountName};

/// The kubeconfig context (default: its current context).
pub const ENV_CONTEXT: &str = "KT_CONTEXT";
/// The store server's Service, `NAMESPACE/NAME:PORT`.
pub const ENV_STORE_SERVICE: &str = "KT_STORE_SERVICE";
/// The ServiceAccount of the target namespace whose token to ask for (empty: none, for a store
/// server without authentication).
pub const ENV_SERVICE_ACCOUNT: &str = "KT_SERVICE_ACCOUNT";
/// How long an issued token lasts, in seconds: one command or one call.
const TOKEN_SECONDS: i64 = 3600;

/// How to reach the store server from outside.
#[derive(Clone, Debug)]
pub struct Outside {
    pub kubeconfig: PathBuf,
    pub context: Option<String>,
    /// `NAMESPACE/NAME:PORT`.
    pub store_service: String,
    /// Empty: ask for no token.
    pub service_account: String,
}

#[derive(Debug, thiserror::Error)]
pub enum OutsideError {
    #[error("cannot reach the store server {service}: {source}")]
    Unreachable {
        service: String,
        #[source]
        source: ClusterError,
    },
    #[error("no token of ServiceAccount {account} for the store server: {reason}")]
    Denied { account: String, reason: String },
}

impl Outside {
    /// Through `kubeconfig`, with the rest from the environment ([`ENV_CONTEXT`],
    /// [`ENV_STORE_SERVICE`], [`ENV_SERVICE_ACCOUNT`]) or the defaults.
    pub fn from_env(kubeconfig: PathBuf) -> Self {
        let var = |k: &str| std::env::var(k).ok();
        Outside {
            kubeconfig,
            context: var(ENV_CONTEXT).filter(|c| !c.is_empty()),
            store_service: var(ENV_STORE_SERVICE)
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| api::DEFAULT_STORE_SERVICE.to_string()),
            service_account: var(ENV_SERVICE_ACCOUNT)
                .unwrap_or_else(|| tokens::DEFAULT_SERVICE_ACCOUNT.to_string()),
        }
    }

    /// A local port that reaches the store server; it forwards while the value lives.
    pub async fn forward(&self) -> Result<Forward, OutsideError> {
        api::reach_store(
            &self.kubeconfig,
            self.context.as_deref(),
            &self.store_service,
        )
        .await
        .map_err(|source| OutsideError::Unreachable {
            service: self.store_service.clone(),
            source,
        })
    }

    /// A token of the ServiceAccount in `namespace`, asked of the API with the kubeconfig's own
    /// credentials; `None` where no ServiceAccount is named.
    pub async fn token(&self, namespace: &str) -> Result<Option<String>, OutsideError> {
        if self.service_account.is_empty() {
            return Ok(None);
        }
        let account = ServiceAccountName {
            namespace: namespace.to_string(),
            name: self.service_account.clone(),
        };
        let denied = |e: &ClusterError| OutsideError::Denied {
            account: account.to_string(),
            reason: short_api_error(e),
        };
        let client = api::client_from_kubeconfig(&self.kubeconfig, self.context.as_deref())
            .await
            .map_err(|e| denied(&e))?;
        tokens::request(client, &account, tokens::AUDIENCE, TOKEN_SECONDS)
            .await
            .map(Some)
            .map_err(|e| denied(&e))
    }

    /// The ServiceAccount a token is asked for, as `NAMESPACE/NAME`.
    pub fn account(&self, namespace: &str) -> String {
        format!("{namespace}/{}", self.service_account)
    }
}

/// The API's own message, without the debug dump kube appends to it.
fn short_api_error(e: &ClusterError) -> String {
    match e {
        ClusterError::Api(kube::Error::Api(s)) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    }
}
