//! The wrapper that lets only the store's owner answer: a replica that stands by (or an owner
//! unsure of its claim) answers every call of the store's service `UNAVAILABLE`, naming the
//! owner where it knows it (`kt-owner`), so that a client of several replicas goes there at
//! once (`rpc::replicas`). Nothing of the call reaches a handler: a standby's memory holds
//! none of the store's state.
//!
//! But reads: where every replica reaches the same blocks (an object store) and signs the same
//! tickets (a shared secret, or none), a standby answers resolves and listings of callers that
//! hold no lease (`kt get`, Python: `watcher` 0), from etcd's linearizable reads, so such
//! readers spread over the replicas and a publish the owner acknowledged is seen by all of
//! them (close-to-open). A mount's reads, which its watch's lease must cover, go to the owner:
//! the handler refuses them here as any other call (`leased_here`).

use tokio::sync::watch;
use tonic::codegen::http;

use super::guard::{guarded, BoxFuture, Guard, Guarded};
use crate::meta::engine::Standing;
use crate::rpc::status::{to_status, Fault, OWNER_HEADER};

/// The calls a replica that does not own the store answers, where it answers reads.
const READS: [&str; 3] = [
    "/ktfs.v1.Store/Resolve",
    "/ktfs.v1.Store/ResolveMany",
    "/ktfs.v1.Store/List",
];

/// `inner`, answered only while `standing` says this replica owns the store, but for reads
/// where `reads` says any replica may answer them.
pub fn owner_only<S>(
    inner: S,
    standing: watch::Receiver<Standing>,
    reads: bool,
) -> Guarded<S, OwnerOnly> {
    guarded(inner, OwnerOnly { standing, reads })
}

/// The check that this replica owns the store.
#[derive(Clone)]
pub struct OwnerOnly {
    standing: watch::Receiver<Standing>,
    /// Whether this replica answers reads of callers without a lease while it stands by.
    reads: bool,
}

impl Guard for OwnerOnly {
    fn admit<B: Send + 'static>(
        &self,
        req: http::Request<B>,
    ) -> BoxFuture<Result<http::Request<B>, tonic::Status>> {
        let read = self.reads && READS.contains(&req.uri().path());
        let refused = match read {
            true => None,
            false => refusal(&self.standing.borrow()),
        };
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
