//! ServiceAccount tokens through the Kubernetes API: the store server asks who a token belongs
//! to (TokenReview), and a laptop's `kt` asks for a short-lived token of a ServiceAccount in the
//! namespace it works in (TokenRequest), with the user's own kubeconfig credentials, so that no
//! user credential ever reaches the store server.

use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;

use super::api::ClusterError;

/// The audience ktfs tokens are issued for and checked against.
pub const AUDIENCE: &str = "ktfs";
/// The ServiceAccount whose token `kt --kubeconfig` asks for when none is named.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// A ServiceAccount, as a token names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceAccountName {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountName {
    /// `system:serviceaccount:NAMESPACE:NAME`, the user name the API gives a ServiceAccount.
    pub fn from_username(user: &str) -> Option<Self> {
        let rest = user.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then(|| Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// `NAMESPACE/NAME` or `NAMESPACE:NAME`, as flags write it.
    pub fn parse(s: &str) -> Option<Self> {
        let (namespace, name) = s.split_once('/').or_else(|| s.split_once(':'))?;
        (!namespace.is_empty() && !name.is_empty()).then(|| Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl std::fmt::Display for ServiceAccountName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pod a token is bound to, as TokenReview names it: Kubernetes 1.21 and later name the
/// pod of a projected token, 1.30 and later its node too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    /// `authentication.kubernetes.io/pod-name`.
    pub pod: Option<String>,
    /// `authentication.kubernetes.io/node-name`.
    pub node: Option<String>,
}

/// What the API said of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Review {
    /// A ServiceAccount's token, valid now for one of the audiences, and what it is bound to.
    ServiceAccount(ServiceAccountName, Binding),
    /// Valid, but not a ServiceAccount's (a user's token): ktfs takes pods' and agents' only.
    OtherUser(String),
    Rejected(String),
}

/// Where TokenReview names the node of the pod a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Where TokenReview names the pod a token is bound to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// Asks the API whose `token` is (TokenReview; the caller needs `create` on `tokenreviews`).
/// `audiences` empty means the API server's own.
pub async fn review(
    client: Client,
    token: &str,
    audiences: &[String],
) -> Result<Review, ClusterError> {
    let api: Api<TokenReview> = Api::all(client);
    let asked = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &asked).await?;
    let Some(status) = answer.status else {
        return Ok(Review::Rejected("the API gave no review status".into()));
    };
    if status.authenticated != Some(true) {
        let why = status.error.unwrap_or_else(|| "not authenticated".into());
        return Ok(Review::Rejected(why));
    }
    let user = status.user.unwrap_or_default();
    let extra = |name: &str| {
        user.extra
            .as_ref()
            .and_then(|extra| extra.get(name))
            .and_then(|values| values.first())
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let binding = Binding {
        pod: extra(POD_NAME_EXTRA),
        node: extra(NODE_NAME_EXTRA),
    };
    let name = user.username.clone().unwrap_or_default();
    Ok(match ServiceAccountName::from_username(&name) {
        Some(sa) => Review::ServiceAccount(sa, binding),
        None => Review::OtherUser(name),
    })
}

/// The node pod `namespace/pod` runs on (none while it is not scheduled, or where it is gone);
/// the caller needs `get` on `pods`.
pub async fn node_of_pod(
    client: Client,
    namespace: &str,
    pod: &str,
) -> Result<Option<String>, ClusterError> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let found = pods.get_opt(pod).await?;
    Ok(found
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
        .filter(|n| !n.is_empty()))
}

/// A token of ServiceAccount `sa` for `audience`, valid for `seconds` (TokenRequest; RBAC
/// decides whether the kubeconfig's user may `create` `serviceaccounts/token` there).
pub async fn request(
    client: Client,
    sa: &ServiceAccountName,
    audience: &str,
    seconds: i64,
) -> Result<String, ClusterError> {
    let api: Api<ServiceAccount> = Api::namespaced(client, &sa.namespace);
    let asked = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(seconds),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let answer = api
        .create_token_request(&sa.name, &PostParams::default(), &asked)
        .await?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ClusterError::NoToken(sa.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_names_parse_from_users_and_flags() {
        let sa = ServiceAccountName::from_username("system:serviceaccount:team-a:runner").unwrap();
        assert_eq!(
            (sa.namespace.as_str(), sa.name.as_str()),
            ("team-a", "runner")
        );
        assert_eq!(ServiceAccountName::from_username("alice"), None);
        assert_eq!(
            ServiceAccountName::from_username("system:serviceaccount:team-a:"),
            None
        );
        assert_eq!(
            ServiceAccountName::from_username("system:serviceaccount:a:b:c"),
            None
        );
        assert_eq!(ServiceAccountName::parse("kt-system/kt-node"), {
            Some(ServiceAccountName {
                namespace: "kt-system".into(),
                name: "kt-node".into(),
            })
        });
        assert_eq!(ServiceAccountName::parse("nope"), None);
    }
}
