//! A swarm member's join again of its window, where the window's owner changed: the replica
//! that owned the window's group died, and the next owner, which knew nothing of the window
//! (windows live in the owner's memory), answers the member's syncs that there is no such
//! window. Rather than give the swarm up, which sends every member to the store at once for
//! what is left (the herd a broadcast exists to avoid), the member joins the same window again:
//! the first to come back opens it at the new owner, the others join it, and each tells the new
//! board what it holds at its first sync, so the members go on trading pieces among themselves.
//! A window whose quorum had closed forms again the same way, its quorum counted anew.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::task::{JoinError, JoinHandle};

use crate::hash::BlockHash;
use crate::proto::{JoinRequest, JoinResponse};
use crate::rpc::{ClientError, Store};

/// Joins again in a row, with no sync answered between them, before the member gives the swarm
/// up (a new owner that keeps forgetting the window must not keep it joining).
const MAX_REJOINS: u32 = 3;

/// Where a member sits after it joined its window again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seat {
    pub group_id: String,
    pub generation: u64,
    pub member: u64,
    /// Joins again so far.
    pub rejoins: u32,
}

/// The seat a membership leaves and reports from, once its swarm task moved it.
pub type Moved = Arc<Mutex<Option<Seat>>>;

type Answer = Result<Result<JoinResponse, ClientError>, JoinError>;

/// What a member needs to join its window again, and the join under way.
pub(super) struct Rejoin {
    store: Store,
    /// The join that made the member, naming the window's group as its owner gave it.
    request: JoinRequest,
    moved: Moved,
    /// Joins again since a sync was last answered.
    tries: u32,
    /// Joins again in all, for the member's report.
    total: u32,
    running: Option<JoinHandle<Result<JoinResponse, ClientError>>>,
}

impl Rejoin {
    pub(super) fn new(store: Store, request: JoinRequest, moved: Moved) -> Self {
        Rejoin {
            store,
            request,
            moved,
            tries: 0,
            total: 0,
            running: None,
        }
    }

    /// Whether a join is under way.
    pub(super) fn running(&self) -> bool {
        self.running.is_some()
    }

    /// Starts a join again, unless one runs or the member joined again too often already.
    /// Whether it started.
    pub(super) fn start(&mut self) -> bool {
        if self.running.is_some() || self.tries >= MAX_REJOINS {
            return false;
        }
        self.tries += 1;
        self.total += 1;
        let (store, req) = (self.store.clone(), self.request.clone());
        self.running = Some(tokio::spawn(async move { store.join_broadcast(req).await }));
        true
    }

    /// A sync was answered: the window stands, and a later owner's death may be joined
    /// through again.
    pub(super) fn settled(&mut self) {
        self.tries = 0;
    }

    /// The join's answer, once it comes; never, while none runs.
    pub(super) async fn answered(&mut self) -> Answer {
        match self.running.as_mut() {
            Some(h) => h.await,
            None => std::future::pending().await,
        }
    }

    /// Takes in the join's answer: the member's new seat, where the new owner describes the
    /// version's swarm as the old one did (`index`: each unique block's place; `log2`: the
    /// pieces' size), else why it cannot go on in that swarm.
    pub(super) fn take(
        &mut self,
        answer: Answer,
        index: &HashMap<[u8; 32], usize>,
        log2: u8,
    ) -> Result<Seat, String> {
        self.running = None;
        let joined = answer
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let same_blocks =
            joined.pieces.len() == index.len() * 32
                && joined.pieces.chunks_exact(32).enumerate().all(|(i, h)| {
                    BlockHash::from_slice(h).and_then(|h| index.get(&h.0)) == Some(&i)
                });
        if !same_blocks || u32::from(log2) != joined.piece_log2 {
            return Err("the new owner cuts the version into other pieces".into());
        }
        let window = joined.window.unwrap_or_default();
        let seat = Seat {
            group_id: match window.group_id.is_empty() {
                true => self
                    .request
                    .window
                    .as_ref()
                    .map_or_else(String::new, |w| w.group_id.clone()),
                false => window.group_id,
            },
            generation: window.generation,
            member: joined.member,
            rejoins: self.total,
        };
        *crate::locks::lock(&self.moved) = Some(seat.clone());
        Ok(seat)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::auth::credential::Credential;
    use crate::rpc::faulty::FaultyStore;
    use crate::rpc::Fault;

    /// Joins again until the member may not, each refused: how many it started.
    async fn tries(rejoin: &mut Rejoin, index: &HashMap<[u8; 32], usize>) -> u32 {
        let mut started = 0;
        while rejoin.start() {
            started += 1;
            let answer = rejoin.answered().await;
            assert!(rejoin.take(answer, index, 0).is_err());
        }
        started
    }

    #[tokio::test]
    async fn joins_again_in_a_row_are_bounded_and_an_answered_sync_frees_them() {
        // Every join refused at once, as a store that knows no such key would.
        let nowhere = crate::rpc::client::store_lazy("127.0.0.1:9", &Credential::none()).unwrap();
        let faulty = Arc::new(FaultyStore::new(nowhere));
        for nth in 1..=8 {
            faulty.fail(Some("join_broadcast"), nth, Fault::NotFound);
        }
        let mut rejoin = Rejoin::new(
            Store::shared(faulty.clone()),
            JoinRequest::default(),
            Moved::default(),
        );
        let index = HashMap::new();
        assert_eq!(tries(&mut rejoin, &index).await, MAX_REJOINS);
        assert_eq!(
            tries(&mut rejoin, &index).await,
            0,
            "still failing: no more"
        );
        rejoin.settled();
        assert_eq!(tries(&mut rejoin, &index).await, MAX_REJOINS);
        assert_eq!(
            faulty.calls(Some("join_broadcast")),
            u64::from(2 * MAX_REJOINS)
        );
    }
}
