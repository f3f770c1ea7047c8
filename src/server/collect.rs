//! A replica's part in the collection its store's replicas share (`meta::gc_shared`): it
//! follows the steps the collector announces on the board and answers each once: its report
//! at a pass's start, what it spares at the doom (and the expired keys of its own shards
//! deleted), the holds lifted at the end.

use std::sync::Arc;
use std::time::Duration;

use crate::meta::engine::{
    shard_of, AnswerNote, Fence, GcBoard, PassNote, TouchNote, DONE, DOOM, START,
};
use crate::meta::gc_peers::Touches;
use crate::meta::MetaStore;

/// How often a replica looks at the board: a pass's step waits about this long for each
/// replica's answer.
const LOOK: Duration = Duration::from_millis(300);

pub(super) struct Follower {
    pub board: GcBoard,
    pub meta: Arc<MetaStore>,
    pub fence: Arc<Fence>,
}

/// An answer worked out, kept until it is written (an answer's work, such as a report's
/// rotation of the record, is done once).
struct Pending {
    answer: AnswerNote,
    touched: Option<Touches>,
}

impl Follower {
    /// Follows the board until `stop`.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        // The step answered last, and the last pass whose start this replica reported.
        let mut answered: Option<(u64, u32)> = None;
        let mut reported: Option<u64> = None;
        let mut pending: Option<((u64, u32), Pending)> = None;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(LOOK) => {}
            }
            let note = match self.board.step().await {
                Ok(Some(note)) => note,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the collection board");
                    continue;
                }
            };
            let step = (note.pass, note.step);
            if answered == Some(step) {
                continue;
            }
            let work = match pending.take() {
                Some((at, work)) if at == step => Some(work),
                _ => self.work(&note, reported).await,
            };
            let Some(work) = work else {
                answered = Some(step);
                continue;
            };
            match self
                .board
                .answer(work.answer.clone(), work.touched.as_ref())
                .await
            {
                Ok(()) => {
                    answered = Some(step);
                    if note.step == START {
                        reported = Some(note.pass);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, pass = note.pass, "answering the collector");
                    pending = Some((step, work));
                }
            }
        }
    }

    /// This replica's part in `note`'s step: the answer to write, if the step asks one.
    async fn work(&self, note: &PassNote, reported: Option<u64>) -> Option<Pending> {
        let meta = self.meta.clone();
        let mut answer = AnswerNote {
            pass: note.pass,
            step: note.step,
            ..AnswerNote::default()
        };
        match note.step {
            START => {
                let touched = tokio::task::spawn_blocking(move || meta.gc_report())
                    .await
                    .ok()?;
                answer.recorded = touched.recorded;
                Some(Pending {
                    answer,
                    touched: Some(touched),
                })
            }
            DOOM if reported != Some(note.pass) => {
                answer.unready = true;
                Some(Pending {
                    answer,
                    touched: None,
                })
            }
            DOOM => {
                let doomed = note.doomed();
                let (held, count) = (self.fence.held(), self.fence.shards());
                let done = tokio::task::spawn_blocking(move || {
                    let holds = |ns: &[u8]| held.contains_key(&shard_of(ns, count));
                    meta.gc_doom(&doomed, &holds)
                })
                .await
                .ok()?;
                match done {
                    Ok((spared, expired)) => {
                        if expired > 0 {
                            tracing::info!(keys = expired, "deleted keys whose TTL ran out");
                        }
                        answer.spared = Some(TouchNote::of(&spared));
                    }
                    // Nothing can be spared for certain: the pass deletes nothing.
                    Err(e) => {
                        tracing::warn!(error = %e, pass = note.pass, "answering a collection");
                        answer.unready = true;
                    }
                }
                Some(Pending {
                    answer,
                    touched: None,
                })
            }
            DONE => {
                let (pass, collected) = (note.pass, note.collected());
                let _ = tokio::task::spawn_blocking(move || meta.gc_done(pass, &collected)).await;
                None
            }
            _ => None,
        }
    }
}
