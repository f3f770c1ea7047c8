//! A check every call of a gRPC service passes before any handler runs (authentication; in
//! cluster mode, whether this replica owns the store): one tower wrapper for each of them, so a
//! new RPC cannot forget one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a call must pass: it goes on (with what the check adds to it), or is answered with a
/// status and reaches no handler.
pub trait Guard: Clone + Send + Sync + 'static {
    fn admit<B: Send + 'static>(
        &self,
        req: http::Request<B>,
    ) -> BoxFuture<Result<http::Request<B>, tonic::Status>>;
}

/// `inner`, behind `guard`.
pub fn guarded<S, G: Guard>(inner: S, guard: G) -> Guarded<S, G> {
    Guarded { inner, guard }
}

#[derive(Clone)]
pub struct Guarded<S, G> {
    inner: S,
    guard: G,
}

impl<S: tonic::server::NamedService, G> tonic::server::NamedService for Guarded<S, G> {
    const NAME: &'static str = S::NAME;
}

impl<S, G, B> tower::Service<http::Request<B>> for Guarded<S, G>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    G: Guard,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The service that was polled ready is the one to call; the clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admitted = self.guard.admit(req);
        Box::pin(async move {
            match admitted.await {
                Ok(req) => inner.call(req).await,
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}
