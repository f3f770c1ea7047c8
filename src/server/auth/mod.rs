//! Who calls the store server, and what each caller may do. Every call passes [`layer`] first,
//! which turns the bearer token of its `authorization` metadata into a [`Principal`] (or answers
//! UNAUTHENTICATED); each handler then asks the principal about the namespace the call names.
//!
//! - The shared token (`kt server --token-file`): an operator, every namespace. For `kt up` and
//!   clusters without Kubernetes. A node token made from it (`kt node-token NODE`, see
//!   [`crate::auth::node_token`]): a node agent of that node only, every namespace.
//! - A ServiceAccount token, checked with the Kubernetes TokenReview API (`--token-review`): a
//!   node agent's ServiceAccount (`--node-account`) is a node, every namespace (it serves the
//!   mounts kt-csi checked against the pod's namespace), and, where its token is bound to a pod
//!   and the API names the pod's node, that node only: the node id it registers, heartbeats and
//!   announces locations for must be that node's name, so one node cannot add or withdraw
//!   another's copies; any other ServiceAccount may use its own namespace only, whatever the
//!   call names, and names in broadcast and GPU windows the node of the pod its token is bound
//!   to, or none. The node of a bound token is TokenReview's (Kubernetes 1.30 and later), or
//!   the pod's `spec.nodeName`, asked of the API (1.21 to 1.29 name the pod only).
//! - Neither configured: anyone may do anything, as before authentication existed (the server
//!   warns at start).

pub mod layer;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::Status;

use crate::auth::node_token::NodeTokens;
use crate::k8s::tokens::{self, Review, ServiceAccountName};
use crate::locks;
use crate::rpc::status::{to_status, Fault};

/// How long a reviewed token is trusted before it is reviewed again: a deleted ServiceAccount
/// or a revoked token is refused at most this late; a hot client costs one review a minute.
const REVIEW_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at most; beyond it the expired ones go, then all.
const CACHE_MAX: usize = 8192;
/// The longest a review may take before the call fails as unavailable.
const REVIEW_PATIENCE: Duration = Duration::from_secs(10);
/// Reviews one address may cause: a burst of this many, then [`REVIEWS_PER_SEC`]. A token
/// refused is remembered as long as one accepted, but a caller with endless new junk tokens
/// would make the Kubernetes API answer each (400 junk tokens made 400 reviews).
const REVIEW_BURST: f64 = 20.0;
const REVIEWS_PER_SEC: f64 = 5.0;
/// Addresses whose reviews are counted at most; beyond it the idle ones are forgotten.
const PEERS_MAX: usize = 4096;

/// A caller, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Nothing is checked: a server started without authentication.
    Anyone,
    /// The holder of the shared token.
    Operator,
    /// A node agent; `node`: the only node it may act for, where its token says.
    Node {
        sa: ServiceAccountName,
        node: Option<String>,
    },
    /// A pod, or a laptop with a token the API issued for a ServiceAccount; `node`: the node
    /// of the pod its token is bound to, where the API says.
    Account {
        sa: ServiceAccountName,
        node: Option<String>,
    },
    /// The holder of a node token (see [`crate::auth::node_token`]): a node agent that may act
    /// for that node only.
    NodeToken(String),
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Anyone => f.write_str("anyone"),
            Principal::Operator => f.write_str("the shared token's holder"),
            Principal::Node { sa, node: None } => write!(f, "node agent {sa}"),
            Principal::Node { sa, node: Some(n) } => write!(f, "node agent {sa} on node {n}"),
            Principal::Account { sa, node: None } => write!(f, "ServiceAccount {sa}"),
            Principal::Account { sa, node: Some(n) } => {
                write!(f, "ServiceAccount {sa} of a pod on node {n}")
            }
            Principal::NodeToken(n) => write!(f, "the node token of node {n}"),
        }
    }
}

impl Principal {
    /// Whether the caller may read and change the keys of namespace `ns`.
    pub fn may_use(&self, ns: &str) -> Result<(), Status> {
        match self {
            Principal::Account { sa, .. } if sa.namespace != ns => Err(to_status(
                Fault::Denied,
                format!("{self} may use namespace {} only, not {ns}", sa.namespace),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the caller may act as a node: ask what a node asks.
    pub fn may_be_a_node(&self) -> Result<(), Status> {
        match self {
            Principal::Account { .. } => Err(to_status(
                Fault::Denied,
                format!("{self} is not a node agent"),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the caller may act as node `node_id`: register it, heartbeat for it, say what
    /// it holds and no longer holds.
    pub fn may_act_for_node(&self, node_id: &str) -> Result<(), Status> {
        self.may_be_a_node()?;
        self.may_name_node(node_id)
    }

    /// Whether the caller may publish a key whose blocks are on node `origin` (`locale=local`):
    /// that node's agent alone, which registered the files it serves them from. A pod naming a
    /// node could otherwise have that node serve whatever its manifest names.
    pub fn may_publish_in_place(&self, origin: &str) -> Result<(), Status> {
        if let Principal::Account { .. } = self {
            return Err(to_status(
                Fault::Denied,
                format!(
                    "{self} may not publish in place on node {origin:?}: a locale=local key is \
                     published by its node's agent (kt put --locale local through the agent's \
                     socket on that node)"
                ),
            ));
        }
        self.may_name_node(origin)
    }

    /// Whether the caller may say that node `node_id` holds a copy (a local publish's origin):
    /// a node agent bound to its node names that node only.
    pub fn may_name_node(&self, node_id: &str) -> Result<(), Status> {
        match self {
            Principal::Node { node: Some(n), .. }
            | Principal::NodeToken(n)
            | Principal::Account { node: Some(n), .. }
                if n != node_id =>
            {
                Err(to_status(
                    Fault::Denied,
                    format!("{self} may act for its own node only, not node {node_id:?}"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The node a member of a broadcast or GPU window is taken to be on, where it says
    /// `claimed` (empty: none). Other members fetch from the node a member names, and a GPU
    /// window moves tensors within one node by CUDA IPC: a caller bound to a node names that
    /// node or none; a ServiceAccount whose token is bound to no pod has nothing that says
    /// where it runs, so its word is not taken (it joins as a member on no node, which serves
    /// no one, rather than being refused).
    pub fn node_claim(&self, claimed: &str) -> Result<String, Status> {
        if claimed.is_empty() {
            return Ok(String::new());
        }
        self.may_name_node(claimed)?;
        Ok(match self {
            Principal::Account { node: None, .. } => {
                tracing::debug!(caller = %self, claimed, "a node claim no pod binding backs: dropped");
                String::new()
            }
            _ => claimed.to_string(),
        })
    }
}

/// How a server with TokenReview checks ServiceAccount tokens.
pub struct TokenReview {
    pub client: kube::Client,
    /// The audiences a token must be for (empty: the API server's own).
    pub audiences: Vec<String>,
    /// The ServiceAccounts of node agents.
    pub nodes: Vec<ServiceAccountName>,
}

impl TokenReview {
    /// The node of the pod a token of `sa` is bound to: the review's word where it has one,
    /// else the pod's as the API has it now. A pod is never moved to another node, so the
    /// answer holds as long as the review.
    async fn node_of(
        &self,
        sa: &ServiceAccountName,
        bound: tokens::Binding,
    ) -> Result<Option<String>, AuthError> {
        let Some(pod) = bound.pod.filter(|_| bound.node.is_none()) else {
            return Ok(bound.node);
        };
        let asked = tokens::node_of_pod(self.client.clone(), &sa.namespace, &pod);
        tokio::time::timeout(REVIEW_PATIENCE, asked)
            .await
            .map_err(|_| AuthError::Unavailable(format!("no answer in {REVIEW_PATIENCE:?}")))?
            .map_err(|e| {
                AuthError::Unavailable(format!(
                    "the node of pod {}/{pod}, whose token this is (the store server needs `get` \
                     on pods, deploy/rbac.yaml): {e}",
                    sa.namespace
                ))
            })
    }
}

/// What the server accepts.
#[derive(Default)]
pub struct AuthConfig {
    /// The shared token.
    pub shared_token: Option<String>,
    pub token_review: Option<TokenReview>,
}

impl AuthConfig {
    pub fn is_open(&self) -> bool {
        self.shared_token.is_none() && self.token_review.is_none()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no credential: this store server needs a token (KT_TOKEN, --token-file, or a pod's ServiceAccount token)")]
    Missing,
    #[error("the credential is not a bearer token")]
    Malformed,
    #[error("the token was refused: {0}")]
    Refused(String),
    #[error("cannot check the token with the Kubernetes API: {0}")]
    Unavailable(String),
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unavailable(_) => to_status(Fault::Unavailable, e.to_string()),
            _ => Status::unauthenticated(e.to_string()),
        }
    }
}

/// A token's review: its principal, or why it was refused; and when.
type Reviewed = (Result<Principal, String>, Instant);

/// Turns credentials into principals.
pub struct Authenticator {
    /// The shared token's hash: compared in constant time, and never kept in the clear.
    shared: Option<blake3::Hash>,
    /// The node tokens the shared token makes.
    node_tokens: Option<NodeTokens>,
    review: Option<TokenReview>,
    /// Each token reviewed lately: its principal, or why it was refused.
    reviewed: Mutex<HashMap<blake3::Hash, Reviewed>>,
    /// Reviews each address may still cause now, and when that was counted.
    budgets: Mutex<HashMap<Option<IpAddr>, (f64, Instant)>>,
}

impl Authenticator {
    pub fn new(cfg: AuthConfig) -> Self {
        Authenticator {
            node_tokens: cfg.shared_token.as_deref().map(NodeTokens::new),
            shared: cfg.shared_token.map(|t| blake3::hash(t.trim().as_bytes())),
            review: cfg.token_review,
            reviewed: Mutex::new(HashMap::new()),
            budgets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one review from `peer`'s budget; `false` where it has none left.
    fn may_review(&self, peer: Option<IpAddr>) -> bool {
        let mut budgets = locks::lock(&self.budgets);
        if budgets.len() >= PEERS_MAX {
            budgets.retain(|_, (left, at)| {
                *left + at.elapsed().as_secs_f64() * REVIEWS_PER_SEC < REVIEW_BURST
            });
        }
        let (left, at) = budgets
            .entry(peer)
            .or_insert((REVIEW_BURST, Instant::now()));
        *left = (*left + at.elapsed().as_secs_f64() * REVIEWS_PER_SEC).min(REVIEW_BURST);
        *at = Instant::now();
        if *left < 1.0 {
            return false;
        }
        *left -= 1.0;
        true
    }

    /// The principal of a call from `peer` whose `authorization` value is `header`.
    pub async fn authenticate(
        &self,
        header: Option<&[u8]>,
        peer: Option<IpAddr>,
    ) -> Result<Principal, AuthError> {
        if self.shared.is_none() && self.review.is_none() {
            return Ok(Principal::Anyone);
        }
        let header = header.ok_or(AuthError::Missing)?;
        let token = std::str::from_utf8(header)
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Malformed)?;
        let hash = blake3::hash(token.as_bytes());
        // blake3::Hash compares in constant time.
        if self.shared == Some(hash) {
            return Ok(Principal::Operator);
        }
        if let Some(node) = self.node_tokens.as_ref().and_then(|t| t.node_of(token)) {
            return node
                .map(|n| Principal::NodeToken(n.to_string()))
                .map_err(|e| AuthError::Refused(e.to_string()));
        }
        let Some(review) = &self.review else {
            return Err(AuthError::Refused("not the shared token".into()));
        };
        if let Some((p, at)) = locks::lock(&self.reviewed).get(&hash) {
            if at.elapsed() < REVIEW_TTL {
                return p.clone().map_err(AuthError::Refused);
            }
        }
        if !self.may_review(peer) {
            return Err(AuthError::Unavailable(
                "too many tokens to review from this address: try again shortly".into(),
            ));
        }
        let asked = tokens::review(review.client.clone(), token, &review.audiences);
        let answer = tokio::time::timeout(REVIEW_PATIENCE, asked)
            .await
            .map_err(|_| AuthError::Unavailable(format!("no answer in {REVIEW_PATIENCE:?}")))?
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let principal = match answer {
            Review::ServiceAccount(sa, bound) => {
                let node = review.node_of(&sa, bound).await?;
                Ok(if review.nodes.contains(&sa) {
                    Principal::Node { sa, node }
                } else {
                    Principal::Account { sa, node }
                })
            }
            Review::OtherUser(user) => Err(format!(
                "{user} is not a ServiceAccount; ktfs takes ServiceAccount tokens (from a \
                 laptop, `kt --kubeconfig` asks for one)"
            )),
            Review::Rejected(why) => Err(why),
        };
        let mut reviewed = locks::lock(&self.reviewed);
        if reviewed.len() >= CACHE_MAX {
            reviewed.retain(|_, (_, at)| at.elapsed() < REVIEW_TTL);
            if reviewed.len() >= CACHE_MAX {
                reviewed.clear();
            }
        }
        reviewed.insert(hash, (principal.clone(), Instant::now()));
        principal.map_err(AuthError::Refused)
    }
}

/// When the credential a call was made with expires (seconds since the epoch), where it says:
/// a ServiceAccount token's `exp`. Tickets issued on the call hold no longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry(pub u64);

/// The `exp` claim of `token` if it is a JWT that has one. Read only after the token was
/// accepted (the API server checked its signature): it can only shorten what the holder gets.
pub fn jwt_expiry(token: &str) -> Option<u64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// The earliest expiry of the credentials a call was made with (the caller's, and the one a
/// node agent acts for).
pub fn expiry_of<T>(req: &tonic::Request<T>) -> Option<u64> {
    req.extensions().get::<Expiry>().map(|e| e.0)
}

/// The principal [`layer`] attached to a call. A call without one never passed the layer: a
/// bug, refused rather than trusted.
pub fn principal<T>(req: &tonic::Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

/// The principal a node agent acts for on this call (see [`crate::auth::credential::ON_BEHALF`]):
/// a namespace the call names must be one it may use too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnBehalf(pub Principal);

/// Whether the caller of `req`, and the process a node agent acts for in it, may use `ns`.
pub fn may_use<T>(req: &tonic::Request<T>, ns: &str) -> Result<(), Status> {
    principal(req)?.may_use(ns)?;
    match req.extensions().get::<OnBehalf>() {
        Some(OnBehalf(p)) => p.may_use(ns).map_err(|e| {
            to_status(
                Fault::Denied,
                format!("the caller on the node's socket: {}", e.message()),
            )
        }),
        None => Ok(()),
    }
}

impl Principal {
    /// Whether the caller may act for a process that called it (a node agent for a caller on
    /// its socket).
    pub fn may_act_on_behalf(&self) -> Result<(), AuthError> {
        match self {
            Principal::Account { .. } => Err(AuthError::Refused(format!(
                "{self} acts for itself only: only a node agent presents a caller's credential"
            ))),
            _ => Ok(()),
        }
    }
}

/// The namespace a scoped broadcast group belongs to (see [`crate::rpc::scope_group`]).
pub fn group_namespace(group: &str) -> Result<&str, Status> {
    group
        .split_once('/')
        .map(|(ns, _)| ns)
        .filter(|ns| !ns.is_empty())
        .ok_or_else(|| to_status(Fault::NotFound, format!("no broadcast window {group}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(ns: &str, name: &str) -> ServiceAccountName {
        ServiceAccountName {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn an_account_uses_its_own_namespace_only_and_is_no_node() {
        let p = Principal::Account {
            sa: sa("team-a", "default"),
            node: None,
        };
        assert!(p.may_use("team-a").is_ok());
        let denied = p.may_use("team-b").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("team-a only"));
        assert!(p.may_be_a_node().is_err());
        assert!(p.may_act_for_node("n1").is_err());
        for p in [
            Principal::Anyone,
            Principal::Operator,
            Principal::Node {
                sa: sa("kt-system", "kt-node"),
                node: None,
            },
        ] {
            assert!(p.may_use("team-b").is_ok());
            assert!(p.may_be_a_node().is_ok());
            assert!(p.may_act_for_node("n1").is_ok());
        }
    }

    #[test]
    fn a_member_of_a_window_is_on_the_node_its_token_is_bound_to_or_on_none() {
        let bound = Principal::Account {
            sa: sa("team-a", "default"),
            node: Some("n1".into()),
        };
        assert_eq!(bound.node_claim("n1").unwrap(), "n1");
        assert_eq!(bound.node_claim("").unwrap(), "");
        let err = bound.node_claim("n2").unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        // Bound to no pod: what it says of its node is not taken, nor refused.
        let unbound = Principal::Account {
            sa: sa("team-a", "default"),
            node: None,
        };
        assert_eq!(unbound.node_claim("n1").unwrap(), "");
        // An operator, and a node agent whose token names no node, are taken at their word.
        assert_eq!(Principal::Operator.node_claim("n2").unwrap(), "n2");
        let agent = Principal::Node {
            sa: sa("kt-system", "kt-node"),
            node: None,
        };
        assert_eq!(agent.node_claim("n2").unwrap(), "n2");
    }

    #[test]
    fn a_node_agent_whose_token_names_its_node_acts_for_that_node_only() {
        let p = Principal::Node {
            sa: sa("kt-system", "kt-node"),
            node: Some("n1".into()),
        };
        assert!(p.may_use("team-b").is_ok() && p.may_be_a_node().is_ok());
        assert!(p.may_act_for_node("n1").is_ok() && p.may_name_node("n1").is_ok());
        assert!(p.may_name_node("n2").is_err());
        let denied = p.may_act_for_node("n2").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("on node n1") && denied.message().contains("\"n2\""),
            "{}",
            denied.message()
        );
    }

    #[tokio::test]
    async fn the_shared_token_and_nothing_else() {
        let auth = Authenticator::new(AuthConfig {
            shared_token: Some("s3cret\n".into()),
            token_review: None,
        });
        assert_eq!(
            auth.authenticate(Some(b"Bearer s3cret"), None)
                .await
                .unwrap(),
            Principal::Operator
        );
        assert!(matches!(
            auth.authenticate(None, None).await,
            Err(AuthError::Missing)
        ));
        assert!(matches!(
            auth.authenticate(Some(b"Bearer wrong"), None).await,
            Err(AuthError::Refused(_))
        ));
        assert!(matches!(
            auth.authenticate(Some(b"s3cret"), None).await,
            Err(AuthError::Malformed)
        ));
        let open = Authenticator::new(AuthConfig::default());
        assert_eq!(
            open.authenticate(None, None).await.unwrap(),
            Principal::Anyone
        );
    }

    #[tokio::test]
    async fn a_node_token_of_the_shared_token_is_that_node_alone() {
        let auth = Authenticator::new(AuthConfig {
            shared_token: Some("s3cret\n".into()),
            token_review: None,
        });
        let n1 = NodeTokens::new("s3cret").token_for("n1").unwrap();
        let p = auth
            .authenticate(Some(format!("Bearer {n1}").as_bytes()), None)
            .await
            .unwrap();
        assert_eq!(p, Principal::NodeToken("n1".into()));
        assert!(p.may_use("team-b").is_ok() && p.may_act_for_node("n1").is_ok());
        let denied = p.may_act_for_node("n2").unwrap_err();
        assert!(
            denied.message().contains("node token of node n1"),
            "{denied:?}"
        );
        assert!(p.may_name_node("n2").is_err());
        // Another shared token's node token, and one whose node was changed, are refused.
        for forged in [
            NodeTokens::new("other").token_for("n1").unwrap(),
            n1.replace(".n1", ".n2"),
        ] {
            let refused = auth
                .authenticate(Some(format!("Bearer {forged}").as_bytes()), None)
                .await;
            assert!(
                matches!(&refused, Err(AuthError::Refused(why)) if why.contains("not made from")),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_scoped_group_names_its_namespace() {
        let g = crate::rpc::scope_group("team-a", "x/y");
        assert_eq!(group_namespace(&g).unwrap(), "team-a");
        assert!(group_namespace("bare").is_err());
        assert!(group_namespace("/g").is_err());
    }
}

#[cfg(test)]
mod expiry_tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn a_jwts_exp_is_read_and_anything_else_has_none() {
        let part = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let jwt = |claims: &str| format!("{}.{}.sig", part(r#"{"alg":"RS256"}"#), part(claims));
        assert_eq!(
            jwt_expiry(&jwt(r#"{"exp":1767225600,"sub":"x"}"#)),
            Some(1_767_225_600)
        );
        assert_eq!(jwt_expiry(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(jwt_expiry(&jwt(r#"{"exp":"soon"}"#)), None);
        assert_eq!(jwt_expiry("s3cret-token"), None);
        assert_eq!(jwt_expiry("a.!!!.c"), None);
        assert_eq!(jwt_expiry(&format!("a.{}.c", part("not json"))), None);
    }
}
