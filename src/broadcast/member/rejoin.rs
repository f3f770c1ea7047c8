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

/// Joins again a membership makes before it gives the swarm up: each is one owner's death.
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
    tries: u32,
    running: Option<JoinHandle<Result<JoinResponse, ClientError>>>,
}

impl Rejoin {
    pub(super) fn new(store: Store, request: JoinRequest, moved: Moved) -> Self {
        Rejoin {
            store,
            request,
            moved,
            tries: 0,
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
        let (store, req) = (self.store.clone(), self.request.clone());
        self.running = Some(tokio::spawn(async move { store.join_broadcast(req).await }));
        true
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
            rejoins: self.tries,
        };
        *crate::locks::lock(&self.moved) = Some(seat.clone());
        Ok(seat)
    }
}
