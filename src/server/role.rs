//! The wrapper that lets only the store's owner answer: a replica that stands by (or an owner
//! unsure of its claim) answers every call of the store's service `UNAVAILABLE`, naming the
//! owner where it knows it (`kt-owner`), so that a client of several replicas goes there at
//! once (`rpc::replicas`). Nothing of the call reaches a handler: a standby's memory holds
//! none of the store's state.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tonic::codegen::http;

use crate::meta::engine::Standing;
use crate::rpc::status::{to_status, Fault, OWNER_HEADER};

/// `inner`, answered only while `standing` says this replica owns the store.
pub fn owner_only<S>(inner: S, standing: watch::Receiver<Standing>) -> OwnerOnly<S> {
    OwnerOnly { inner, standing }
}

#[derive(Clone)]
pub struct OwnerOnly<S> {
    inner: S,
    standing: watch::Receiver<Standing>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for OwnerOnly<S> {
    const NAME: &'static str = S::NAME;
}

/// The answer of a replica that does not serve, or `None` where it owns the store.
pub(super) fn refusal(standing: &Standing) -> Option<tonic::Status> {
    let (message, owner) = match standing {
        Standing::Owner => return None,
        Standing::Standby { owner: Some(o) } => (
            format!("this store server stands by; the store's owner is at {o}"),
            Some(o),
        ),
        Standing::Standby { owner: None } => (
            "this store server stands by, and no replica owns the store yet".to_string(),
            None,
        ),
        Standing::Unsure => (
            "this store server could not renew its claim on the store; try again".to_string(),
            None,
        ),
    };
    Some(not_owner(message, owner.map_or("", String::as_str)))
}

/// The answer of a replica that does not own the store: `UNAVAILABLE`, naming the owner in
/// `kt-owner` (empty where it is not known), which tells a client nothing was done.
pub(super) fn not_owner(message: impl Into<String>, owner: &str) -> tonic::Status {
    let mut status = to_status(Fault::Unreachable, message);
    if let Ok(v) = owner.parse() {
        status.metadata_mut().insert(OWNER_HEADER, v);
    }
    status
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<http::Request<B>> for OwnerOnly<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let refused = refusal(&self.standing.borrow());
        // The service that was polled ready is the one to call; the clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            match refused {
                None => inner.call(req).await,
                Some(status) => Ok(status.into_http()),
            }
        })
    }
}
