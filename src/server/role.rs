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
//!
//! An owner unsure of its claim holds a call (up to [`HOLD`]) until it knows, rather than
//! refuse it at once: its renewal is unanswered while etcd elects a leader (measured: 3 to 6 s
//! with bench/failover.sh's etcd), and a client of this one replica (a `kt put` naming one
//! server) had nowhere else to go and failed; once a renewal answers, the call goes on.

use std::time::Duration;

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

/// How long a call waits for an owner unsure of its claim to learn whether it holds it: longer
/// than etcd's election with its timeout at its largest usual setting (2.5 s, twice), shorter
/// than any caller's deadline.
const HOLD: Duration = Duration::from_secs(10);

/// `inner`, answered only while `standing` says this replica owns the store, but for reads
/// where `reads` says any replica may answer them.
pub fn owner_only<S>(
    inner: S,
    standing: watch::Receiver<Standing>,
    reads: bool,
) -> Guarded<S, OwnerOnly> {
    guarded(
        inner,
        OwnerOnly {
            standing,
            reads,
            hold: HOLD,
        },
    )
}

/// The check that this replica owns the store.
#[derive(Clone)]
pub struct OwnerOnly {
    standing: watch::Receiver<Standing>,
    /// Whether this replica answers reads of callers without a lease while it stands by.
    reads: bool,
    /// How long a call waits while this replica is unsure of its claim.
    hold: Duration,
}

impl Guard for OwnerOnly {
    fn admit<B: Send + 'static>(
        &self,
        req: http::Request<B>,
    ) -> BoxFuture<Result<http::Request<B>, tonic::Status>> {
        let read = self.reads && READS.contains(&req.uri().path());
        let (mut standing, hold) = (self.standing.clone(), self.hold);
        Box::pin(async move {
            if read {
                return Ok(req);
            }
            let unsure = *standing.borrow_and_update() == Standing::Unsure;
            if unsure {
                // Whatever the wait ends with (an answer, the time, a replica shutting down),
                // the standing then decides.
                let _ =
                    tokio::time::timeout(hold, standing.wait_for(|s| *s != Standing::Unsure)).await;
            }
            let refused = refusal(&standing.borrow());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(guard: &OwnerOnly) -> tokio::task::JoinHandle<Result<(), tonic::Status>> {
        let req = http::Request::builder()
            .uri("/ktfs.v1.Store/Publish")
            .body(())
            .unwrap();
        let admitted = guard.admit(req);
        tokio::spawn(async move { admitted.await.map(|_| ()) })
    }

    #[tokio::test]
    async fn an_unsure_owner_holds_a_call_until_it_knows_and_then_answers_as_it_stands() {
        let (tx, rx) = watch::channel(Standing::Unsure);
        let guard = OwnerOnly {
            standing: rx,
            reads: false,
            hold: Duration::from_millis(300),
        };
        // Its renewal answers: the call goes on.
        let held = call(&guard);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "an unsure owner refused at once");
        tx.send_replace(Standing::Owner);
        held.await.unwrap().unwrap();

        // Another replica took the store over: refused, naming it.
        tx.send_replace(Standing::Unsure);
        let held = call(&guard);
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send_replace(Standing::Standby {
            owner: Some("127.0.0.1:7000".into()),
        });
        let refused = held.await.unwrap().unwrap_err();
        assert_eq!(
            refused.metadata().get(OWNER_HEADER).unwrap(),
            "127.0.0.1:7000"
        );

        // Nothing said within the hold: refused, to try again.
        tx.send_replace(Standing::Unsure);
        let started = tokio::time::Instant::now();
        let refused = call(&guard).await.unwrap().unwrap_err();
        assert!(started.elapsed() >= guard.hold);
        assert!(refused.message().contains("try again"), "{refused:?}");
    }
}
