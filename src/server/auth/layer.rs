//! The wrapper around every gRPC service of the store server: a call is authenticated before
//! any handler runs, so a new RPC cannot forget it. The principal travels to the handler in the
//! request's extensions.

use std::sync::Arc;

use tonic::codegen::http;

use super::{jwt_expiry, AuthError, Authenticator, Expiry, OnBehalf, Principal};
use crate::auth::credential::{AUTHORIZATION, NO_CREDENTIAL, ON_BEHALF};
use crate::server::guard::{guarded, BoxFuture, Guard, Guarded};

/// `inner`, behind `auth`.
pub fn authenticated<S>(inner: S, auth: Arc<Authenticator>) -> Guarded<S, Authenticate> {
    guarded(inner, Authenticate(auth))
}

/// The check of a call's credentials.
#[derive(Clone)]
pub struct Authenticate(Arc<Authenticator>);

impl Guard for Authenticate {
    fn admit<B: Send + 'static>(
        &self,
        mut req: http::Request<B>,
    ) -> BoxFuture<Result<http::Request<B>, tonic::Status>> {
        let auth = self.0.clone();
        Box::pin(async move {
            let header = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
            let peer = req
                .extensions()
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr)
                .map(|a| a.ip());
            let acting_for = req.headers().get(ON_BEHALF).map(|v| v.as_bytes().to_vec());
            let expiry = [header, acting_for.as_deref()]
                .into_iter()
                .flatten()
                .filter_map(|h| std::str::from_utf8(h).ok())
                .filter_map(|h| jwt_expiry(h.trim_start_matches("Bearer ").trim()))
                .min();
            let authenticated = match auth.authenticate(header, peer).await {
                Ok(principal) => match acting_for {
                    None => Ok((principal, None)),
                    Some(caller) => on_behalf(&auth, &principal, &caller, peer)
                        .await
                        .map(|of| (principal, Some(of))),
                },
                Err(e) => Err(e),
            };
            match authenticated {
                Ok((principal, of)) => {
                    if principal != Principal::Anyone {
                        tracing::trace!(%principal, path = %req.uri().path(), "authenticated");
                    }
                    req.extensions_mut().insert(principal);
                    if let Some(of) = of {
                        req.extensions_mut().insert(of);
                    }
                    if let Some(at) = expiry {
                        req.extensions_mut().insert(Expiry(at));
                    }
                    Ok(req)
                }
                Err(e) => {
                    crate::metrics::AUTH_REFUSED.inc();
                    tracing::info!(error = %e, path = %req.uri().path(), "refused a call");
                    Err(tonic::Status::from(e))
                }
            }
        })
    }
}

/// The principal a node agent (`principal`) acts for, from the `caller` credential it presents
/// beside its own: checked as any caller's (a server without authentication takes anyone).
async fn on_behalf(
    auth: &Authenticator,
    principal: &Principal,
    caller: &[u8],
    peer: Option<std::net::IpAddr>,
) -> Result<OnBehalf, AuthError> {
    principal.may_act_on_behalf()?;
    let header = (caller != NO_CREDENTIAL.as_bytes()).then_some(caller);
    match auth.authenticate(header, peer).await {
        Ok(p) => Ok(OnBehalf(p)),
        Err(AuthError::Unavailable(why)) => Err(AuthError::Unavailable(why)),
        Err(e) => Err(AuthError::Refused(format!(
            "the caller on the node's socket: {e}"
        ))),
    }
}
