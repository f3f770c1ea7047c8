//! The board on etcd through which the replicas of a store in shards share collection
//! (`meta::gc_shared`): the collector (the first shard's owner) writes the pass's step at
//! `PREFIX/collect/pass`, under the compare of its claim, so a deposed collector announces
//! nothing; each replica answers at `PREFIX/collect/answer/<id>`, what it touched written
//! first in pieces of etcd's size at `PREFIX/collect/touched/<id>/<n>`. The collector goes on
//! once every replica registered under `servers/` answered the step, and gives the pass up
//! (deleting nothing) where one does not in [`ANSWER_WITHIN`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use prost::Message;

use super::etcd_url::EtcdUrl;
use super::fence::{claim_key, Fence};
use super::members::Members;
use super::seam::EngineError;
use super::shards::REPLICAS;
use crate::bridge::Bridge;
use crate::hash::{BlockHash, Scope, Version};
use crate::meta::backend::{BackendError, Table};
use crate::meta::error::MetaError;
use crate::meta::gc_peers::{Doomed, Replicas, Touches, MOST_DOOMED};

/// Where the board lies, beside the tables (`c` is no table's tag).
pub(super) const BOARD: &str = "collect/";
/// How long the collector waits for every replica's answer to a step.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(15);
/// How often the collector looks for answers.
const LOOK: Duration = Duration::from_millis(100);
/// Most hashes in one piece of what a replica touched (32 or 64 bytes each): well within
/// etcd's request size.
const PIECE: usize = 12_000;

/// A pass's steps.
pub const START: u32 = 1;
pub const DOOM: u32 = 2;
pub const DONE: u32 = 3;

/// A step of a pass, as the collector announces it.
#[derive(Clone, PartialEq, Message)]
pub struct PassNote {
    #[prost(uint64, tag = "1")]
    pub pass: u64,
    #[prost(uint32, tag = "2")]
    pub step: u32,
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub blocks: Vec<Vec<u8>>,
    /// Scope, then block hash.
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub refs: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "5")]
    pub versions: Vec<Vec<u8>>,
    /// [`EXPIRED_KEY`] or [`EXPIRED_INODE`], then the row's key.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub expired: Vec<Vec<u8>>,
    /// The blocks the pass took (its last step).
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub collected: Vec<Vec<u8>>,
}

const EXPIRED_KEY: u8 = 0;
const EXPIRED_INODE: u8 = 1;

/// What a replica touched, or spares.
#[derive(Clone, PartialEq, Message)]
pub struct TouchNote {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub blocks: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub refs: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub versions: Vec<Vec<u8>>,
}

/// A replica's answer to a step.
#[derive(Clone, PartialEq, Message)]
pub struct AnswerNote {
    #[prost(uint64, tag = "1")]
    pub pass: u64,
    #[prost(uint32, tag = "2")]
    pub step: u32,
    /// Whether the replica had a record before its report.
    #[prost(bool, tag = "3")]
    pub recorded: bool,
    /// The replica did not report the pass's start (it joined since): it cannot spare.
    #[prost(bool, tag = "4")]
    pub unready: bool,
    /// How many pieces of what it touched it wrote.
    #[prost(uint32, tag = "5")]
    pub pieces: u32,
    #[prost(message, optional, tag = "6")]
    pub spared: Option<TouchNote>,
}

fn ref_bytes((s, h): &(Scope, BlockHash)) -> Vec<u8> {
    [s.0.as_slice(), h.0.as_slice()].concat()
}

fn ref_of(b: &[u8]) -> Option<(Scope, BlockHash)> {
    Some((
        Scope::from_slice(b.get(..32)?)?,
        BlockHash::from_slice(b.get(32..)?)?,
    ))
}

fn hashes(of: &[Vec<u8>]) -> Vec<BlockHash> {
    of.iter().filter_map(|b| BlockHash::from_slice(b)).collect()
}

fn refs(of: &[Vec<u8>]) -> Vec<(Scope, BlockHash)> {
    of.iter().filter_map(|b| ref_of(b)).collect()
}

fn versions(of: &[Vec<u8>]) -> Vec<Version> {
    of.iter().filter_map(|b| Version::from_slice(b)).collect()
}

impl TouchNote {
    pub fn of(t: &Touches) -> Self {
        TouchNote {
            blocks: t.blocks.iter().map(|h| h.0.to_vec()).collect(),
            refs: t.refs.iter().map(ref_bytes).collect(),
            versions: t.versions.iter().map(|v| v.0.to_vec()).collect(),
        }
    }

    pub fn touches(&self) -> Touches {
        Touches {
            recorded: true,
            blocks: hashes(&self.blocks),
            refs: refs(&self.refs),
            versions: versions(&self.versions),
        }
    }

    /// `t` in pieces of at most [`PIECE`] entries.
    fn pieces(t: &Touches) -> Vec<TouchNote> {
        let whole = TouchNote::of(t);
        let mut pieces = Vec::new();
        let mut lists = [whole.blocks, whole.refs, whole.versions];
        while lists.iter().any(|l| !l.is_empty()) {
            let mut piece = TouchNote::default();
            let mut room = PIECE;
            for (i, list) in lists.iter_mut().enumerate() {
                let n = list.len().min(room);
                room -= n;
                let taken: Vec<Vec<u8>> = list.drain(..n).collect();
                match i {
                    0 => piece.blocks = taken,
                    1 => piece.refs = taken,
                    _ => piece.versions = taken,
                }
            }
            pieces.push(piece);
        }
        pieces
    }
}

impl PassNote {
    /// The doom of `d` (which `gc_shared` keeps within one value's size).
    pub fn doom(d: &Doomed) -> Self {
        let expired = d
            .expired
            .iter()
            .map(|(t, k)| {
                let tag = match t {
                    Table::Inodes => EXPIRED_INODE,
                    _ => EXPIRED_KEY,
                };
                [&[tag][..], k].concat()
            })
            .collect();
        PassNote {
            pass: d.pass,
            step: DOOM,
            blocks: d.blocks.iter().map(|h| h.0.to_vec()).collect(),
            refs: d.refs.iter().map(ref_bytes).collect(),
            versions: d.versions.iter().map(|v| v.0.to_vec()).collect(),
            expired,
            collected: Vec::new(),
        }
    }

    pub fn doomed(&self) -> Doomed {
        Doomed {
            pass: self.pass,
            blocks: hashes(&self.blocks),
            refs: refs(&self.refs),
            versions: versions(&self.versions),
            expired: self
                .expired
                .iter()
                .filter_map(|e| {
                    let (tag, k) = e.split_first()?;
                    let table = match *tag {
                        EXPIRED_KEY => Table::Keys,
                        EXPIRED_INODE => Table::Inodes,
                        _ => return None,
                    };
                    Some((table, k.to_vec()))
                })
                .collect(),
        }
    }

    pub fn collected(&self) -> Vec<BlockHash> {
        hashes(&self.collected)
    }
}

/// The board of the store `url` names, as replica `id` reads and writes it.
pub struct GcBoard {
    members: Members,
    prefix: Vec<u8>,
    id: String,
}

impl GcBoard {
    pub fn new(url: &EtcdUrl, id: &str) -> Self {
        GcBoard {
            members: Members::new(url),
            prefix: url.prefix.as_bytes().to_vec(),
            id: id.to_string(),
        }
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(BOARD.as_bytes());
        k.extend_from_slice(rest.as_bytes());
        k
    }

    async fn get(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, EngineError> {
        let got = self
            .members
            .call(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(got.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Every entry whose key begins with `from`: the key past it, and the value.
    async fn range(&self, from: Vec<u8>) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
        let all = self.members.beside(from).await?;
        Ok(all.into_iter().map(|(k, v, _, _)| (k, v)).collect())
    }

    async fn put(&self, key: Vec<u8>, value: Vec<u8>) -> Result<(), EngineError> {
        self.members
            .call(|mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(key, value, None).await }
            })
            .await
            .map(|_| ())
    }

    async fn delete_prefix(&self, from: Vec<u8>) -> Result<(), EngineError> {
        self.members
            .call(|mut c| {
                let from = from.clone();
                async move {
                    c.delete(from, Some(etcd_client::DeleteOptions::new().with_prefix()))
                        .await
                }
            })
            .await
            .map(|_| ())
    }

    /// The step the collector announced last.
    pub async fn step(&self) -> Result<Option<PassNote>, EngineError> {
        let Some(v) = self.get(self.key("pass")).await? else {
            return Ok(None);
        };
        PassNote::decode(&v[..])
            .map(Some)
            .map_err(|e| EngineError::Other(format!("the collection board: {e}").into()))
    }

    /// Announces `note` while the claim at `claim` is still the one written at `revision`.
    async fn announce(
        &self,
        note: &PassNote,
        claim: Vec<u8>,
        revision: i64,
    ) -> Result<(), EngineError> {
        let txn = Txn::new()
            .when([Compare::mod_revision(claim, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(self.key("pass"), note.encode_to_vec(), None)]);
        let resp = self.members.txn(txn).await?;
        match resp.succeeded() {
            true => Ok(()),
            false => Err(EngineError::NotOwner(
                "the first shard's claim moved: another replica collects".into(),
            )),
        }
    }

    /// This replica's answer to a step; `touched`, for a start, written first in pieces.
    pub async fn answer(
        &self,
        mut answer: AnswerNote,
        touched: Option<&Touches>,
    ) -> Result<(), EngineError> {
        if let Some(t) = touched {
            self.delete_prefix(self.key(&format!("touched/{}/", self.id)))
                .await?;
            let pieces = TouchNote::pieces(t);
            for (n, piece) in pieces.iter().enumerate() {
                let key = self.key(&format!("touched/{}/{}/{n}", self.id, answer.pass));
                self.put(key, piece.encode_to_vec()).await?;
            }
            answer.pieces = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
        }
        self.put(
            self.key(&format!("answer/{}", self.id)),
            answer.encode_to_vec(),
        )
        .await
    }

    /// The ids of the live replicas.
    async fn live(&self) -> Result<Vec<String>, EngineError> {
        let mut from = self.prefix.clone();
        from.extend_from_slice(REPLICAS);
        Ok(self
            .range(from)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Every live replica's answer to `step` of `pass`, once all answered.
    async fn answers(
        &self,
        pass: u64,
        step: u32,
    ) -> Result<Vec<(String, AnswerNote)>, EngineError> {
        let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
        loop {
            let live = self.live().await?;
            // The collector is a replica too: a view of the replicas without it (its lease
            // lapsed, or the read is of another store) could be missing any of them.
            if !live.contains(&self.id) {
                return Err(EngineError::Unavailable(
                    "this replica is not registered: it cannot know every replica".into(),
                ));
            }
            let answers: HashMap<String, AnswerNote> = self
                .range(self.key("answer/"))
                .await?
                .into_iter()
                .filter_map(|(id, v)| Some((id, AnswerNote::decode(&v[..]).ok()?)))
                .filter(|(_, a)| a.pass == pass && a.step == step)
                .collect();
            let missing: Vec<&String> = live
                .iter()
                .filter(|id| !answers.contains_key(*id))
                .collect();
            if missing.is_empty() {
                return Ok(answers.into_iter().collect());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(EngineError::Unavailable(format!(
                    "replicas {missing:?} did not answer step {step} of collection pass {pass}"
                )));
            }
            tokio::time::sleep(LOOK).await;
        }
    }

    /// What replica `id` reported touched at the start of `pass`, in `pieces`.
    async fn touched(&self, id: &str, pass: u64, pieces: u32) -> Result<Touches, EngineError> {
        let mut all = Touches {
            recorded: true,
            ..Touches::default()
        };
        for n in 0..pieces {
            let key = self.key(&format!("touched/{id}/{pass}/{n}"));
            let Some(v) = self.get(key).await? else {
                return Err(EngineError::Other(
                    format!("replica {id}'s report of pass {pass} lacks piece {n}").into(),
                ));
            };
            let note = TouchNote::decode(&v[..])
                .map_err(|e| EngineError::Other(format!("the collection board: {e}").into()))?;
            all.merge(note.touches());
        }
        Ok(all)
    }

    /// Drops the answers and reports of replicas no longer live.
    async fn tidy(&self) -> Result<(), EngineError> {
        let live = self.live().await?;
        for (id, _) in self.range(self.key("answer/")).await? {
            if !live.contains(&id) {
                self.delete_prefix(self.key(&format!("touched/{id}/")))
                    .await?;
                self.delete_prefix(self.key(&format!("answer/{id}")))
                    .await?;
            }
        }
        Ok(())
    }
}

/// The collector's side: the other replicas, through the board.
pub struct BoardReplicas {
    board: Arc<GcBoard>,
    fence: Arc<Fence>,
    bridge: Bridge,
    /// A start failed after the replicas may have rotated their records: what they reported
    /// then is lost, so the next pass deletes nothing, as a first one.
    lost_reports: AtomicBool,
}

impl BoardReplicas {
    pub fn new(url: &EtcdUrl, id: &str, fence: Arc<Fence>) -> Result<Self, EngineError> {
        Ok(BoardReplicas {
            board: Arc::new(GcBoard::new(url, id)),
            fence,
            bridge: Bridge::new("kt-collect").map_err(EngineError::other)?,
            lost_reports: AtomicBool::new(false),
        })
    }

    fn on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, MetaError> {
        self.bridge
            .run(fut)
            .ok_or_else(|| EngineError::Unavailable("the collector's runtime stopped".into()))
            .and_then(|r| r)
            .map_err(|e| MetaError::Backend(BackendError(Box::new(e))))
    }

    /// Announces `note` under the first shard's claim.
    fn announce(
        &self,
        note: PassNote,
    ) -> impl std::future::Future<Output = Result<(), EngineError>> {
        let board = self.board.clone();
        let held = self.fence.held().get(&0).copied();
        let claim = [board.prefix.as_slice(), &claim_key(0, self.fence.shards())].concat();
        async move {
            let Some(revision) = held else {
                return Err(EngineError::NotOwner(
                    "this replica no longer holds the first shard".into(),
                ));
            };
            board.announce(&note, claim, revision).await
        }
    }
}

impl Replicas for BoardReplicas {
    fn start(&self) -> Result<(u64, Touches), MetaError> {
        let board = self.board.clone();
        let last = self.on(async move { board.step().await })?;
        let pass = last.map_or(0, |n| n.pass) + 1;
        let announced = self.announce(PassNote {
            pass,
            step: START,
            ..PassNote::default()
        });
        let board = self.board.clone();
        let lost_before = self.lost_reports.swap(true, Ordering::SeqCst);
        let (pass, mut all) = self.on(async move {
            announced.await?;
            let mut all = Touches {
                recorded: true,
                ..Touches::default()
            };
            for (id, a) in board.answers(pass, START).await? {
                let mut t = board.touched(&id, pass, a.pieces).await?;
                t.recorded = a.recorded;
                all.merge(t);
            }
            Ok((pass, all))
        })?;
        self.lost_reports.store(false, Ordering::SeqCst);
        all.recorded &= !lost_before;
        Ok((pass, all))
    }

    fn doom(&self, doomed: &Doomed) -> Result<Option<Touches>, MetaError> {
        let pass = doomed.pass;
        let announced = self.announce(PassNote::doom(doomed));
        let board = self.board.clone();
        self.on(async move {
            announced.await?;
            let mut spared = Touches {
                recorded: true,
                ..Touches::default()
            };
            for (_, a) in board.answers(pass, DOOM).await? {
                if a.unready {
                    return Ok(None);
                }
                spared.merge(a.spared.unwrap_or_default().touches());
            }
            Ok(Some(spared))
        })
    }

    fn done(&self, pass: u64, collected: &[BlockHash]) -> Result<(), MetaError> {
        let announced = self.announce(PassNote {
            pass,
            step: DONE,
            collected: collected
                .iter()
                .take(MOST_DOOMED * 4)
                .map(|h| h.0.to_vec())
                .collect(),
            ..PassNote::default()
        });
        let board = self.board.clone();
        self.on(async move {
            announced.await?;
            if let Err(e) = board.tidy().await {
                tracing::debug!(error = %e, "tidying the collection board");
            }
            Ok(())
        })
    }
}
