//! The wrapper that lets only the store's owner answer: a replica that stands by (or an owner
//! unsure of its claim) answers every call of the store's service `UNAVAILABLE`, naming the
//! owner where it knows it (`kt-owner`), so that a client of several replicas goes there at
//! once (`rpc::replicas`). Nothing of the call reaches a handler: a standby's memory holds
//! none of the store's state.

use tokio::sync::watch;
use tonic::codegen::http;

use super::guard::{guarded, BoxFuture, Guard, Guarded};
use crate::meta::engine::Standing;
use crate::rpc::status::{to_status, Fault, OWNER_HEADER};

/// `inner`, answered only while `standing` says this replica owns the store.
pub fn owner_only<S>(inner: S, standing: watch::Receiver<Standing>) -> Guarded<S, OwnerOnly> {
    guarded(inner, OwnerOnly(standing))
}

/// The check that this replica owns the store.
#[derive(Clone)]
pub struct OwnerOnly(watch::Receiver<Standing>);

impl Guard for OwnerOnly {
    fn admit<B: Send + 'static>(
        &self,
        req: http::Request<B>,
    ) -> BoxFuture<Result<http::Request<B>, tonic::Status>> {
        let refused = refusal(&self.0.borrow());
        Box::pin(async move {
            match refused {
                None => Ok(req),
                Some(status) => Err(status),
            }
        })
    }
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
