//! One GPU window: the quorum and the plan of a coordinated transfer of its GPU keys.
//!
//! Unlike a file window, whose getters each get a parent the moment they join and fetch at
//! their own pace, a GPU window moves every participant's buffers in one transfer: NCCL needs
//! every rank of a communicator present, and a receiver must know the whole tree before the
//! first byte moves. So everyone waits for the quorum (the same criteria as files: ANY of
//! world_size, ips, timeout; putters and getters count alike), and when it closes the window
//! is checked and planned once. A window may carry several keys, each put by one member (the
//! weights of a sharded trainer, a shard per rank, to sharded consumers): every key's putter is
//! one, every getter's key is put by someone, and every getter's tensor table is its key's
//! putter's (by digest). A failed check fails the whole window, naming the key or the member,
//! so that no rank waits for one that will never send. Each key then gets a tree: its putter,
//! its getters in an order that keeps the members of one node next to each other, and each
//! getter's parent a chain (what NCCL's pipelined broadcast does over its ring) or, with an
//! explicit fanout, a tree of that degree. Ranks run key after key, a key's putter first. Then
//! members report how they finished; a putter's transfer ends when every getter's has, and fails
//! naming each getter that failed or whose node stopped answering.
//!
//! Plain state with an explicit `now`, as [`super::Broadcasts`] is; [`super::GpuWindows`] keeps
//! every such window.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use super::comms::{CommBook, Ended};
use super::quorum::quorum;
use crate::clock::Moment;
use crate::proto::{GpuMember, GpuMemberState, GpuWindow, HeldComm, Role, WindowSpec};
use crate::rpc::gpu_window::comm_key;

/// Who joins a GPU window.
#[derive(Clone, Debug, Default)]
pub struct GpuJoiner {
    /// The key it puts or gets.
    pub key: String,
    pub node_id: String,
    pub ip: String,
    pub role: Role,
    pub worker_addr: String,
    pub registration: u64,
    pub digest: Vec<u8>,
    /// A putter's table (JSON), its flags and NCCL unique id.
    pub table_json: String,
    pub flags: u32,
    pub unique_id: Vec<u8>,
    /// Its worker can move its buffers over NCCL.
    pub nccl: bool,
    /// The communicators its worker keeps on its buffers' device.
    pub comms: Vec<HeldComm>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Fate {
    Waiting,
    Done,
    Failed(String),
}

#[derive(Debug)]
pub(super) struct Member {
    pub(super) joiner: GpuJoiner,
    pub(super) rank: u32,
    pub(super) parent: Option<usize>,
    pub(super) fate: Fate,
}

impl Member {
    /// A joiner, before the plan gives it a rank and a parent.
    pub(super) fn waiting(joiner: GpuJoiner) -> Self {
        Member {
            joiner,
            rank: 0,
            parent: None,
            fate: Fate::Waiting,
        }
    }
}

/// Why a window failed as a whole, and the errno its participants see.
#[derive(Clone, Debug)]
pub(super) struct Failure {
    pub(super) errno: i32,
    pub(super) message: String,
}

/// One GPU window as the server keeps it.
#[derive(Debug)]
pub(super) struct GpuWindowState {
    pub(super) group_id: String,
    pub(super) generation: u64,
    pub(super) spec: WindowSpec,
    pub(super) opened: Instant,
    pub(super) opened_unix_ms: i64,
    pub(super) closed_by: Option<&'static str>,
    pub(super) closed_unix_ms: i64,
    pub(super) touched: Instant,
    pub(super) members: Vec<Member>,
    pub(super) failure: Option<Failure>,
    /// Over NCCL, once planned: the communicator the broadcast runs on, and whether the members
    /// kept it from an earlier window (else it is formed from the putter's unique id).
    pub(super) comm: Option<(Vec<u8>, bool)>,
    /// Taken up from a member's copy after its owner died (`gpu_adopt`).
    pub(super) adopted: bool,
}

impl GpuWindowState {
    /// Window `spec` of `generation`, opened `now`, no one in it yet.
    pub(super) fn new(spec: WindowSpec, generation: u64, now: Moment) -> Self {
        GpuWindowState {
            group_id: spec.group_id.clone(),
            generation,
            spec,
            opened: now.at,
            opened_unix_ms: now.unix_ms,
            closed_by: None,
            closed_unix_ms: 0,
            touched: now.at,
            members: Vec::new(),
            failure: None,
            comm: None,
            adopted: false,
        }
    }

    /// The first putter: its unique id forms the window's communicator.
    pub(super) fn putter(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.joiner.role == Role::Putter)
    }

    fn label(&self, i: usize) -> String {
        let m = &self.members[i];
        format!("member {i} on node {}", m.joiner.node_id)
    }

    fn fail(&mut self, errno: i32, message: String) {
        self.failure = Some(Failure { errno, message });
    }

    pub(super) fn finished(&self) -> bool {
        !self.members.is_empty() && self.members.iter().all(|m| m.fate != Fate::Waiting)
    }

    /// Whether a join starts the group's next generation rather than joining this one: it
    /// has finished, and if its quorum has not closed yet, no putter failed in it. A putter
    /// whose key could not be published finishes at once, and may be the only member so far;
    /// its window must stay to fail at the quorum naming it, or the members that join after
    /// it would wait in a fresh window for a key no one puts.
    pub(super) fn replaceable(&self) -> bool {
        self.finished()
            && (self.closed_by.is_some()
                || self.failure.is_some()
                || !self
                    .members
                    .iter()
                    .any(|m| m.joiner.role == Role::Putter && matches!(m.fate, Fate::Failed(_))))
    }

    /// How the window's broadcast ended, for the communicator it ran on.
    pub(super) fn ended(&self) -> Ended {
        if self.failure.is_some()
            || self
                .members
                .iter()
                .any(|m| matches!(m.fate, Fate::Failed(_)))
        {
            // Failed as soon as one member has: the others' fates change nothing.
            Ended::Failed
        } else if self.finished() {
            Ended::Succeeded
        } else {
            Ended::Running
        }
    }

    /// Once planned over NCCL, picks the communicator: one every member kept, with their
    /// ranks in it, or a fresh one. Runs once.
    pub(super) fn settle_comm(&mut self, book: &mut CommBook) {
        if self.comm.is_some() || self.failure.is_some() || !self.over_nccl() {
            return;
        }
        let held: Vec<&[HeldComm]> = self.members.iter().map(|m| &m.joiner.comms[..]).collect();
        let (key, kept) = match book.shared(&held) {
            Some((key, ranks)) => {
                for (m, rank) in self.members.iter_mut().zip(ranks) {
                    m.rank = rank;
                }
                (key, true)
            }
            None => match self.putter() {
                Some(p) => (comm_key(&self.members[p].joiner.unique_id), false),
                None => return,
            },
        };
        book.use_for(key.clone(), &self.group_id, self.generation);
        self.comm = Some((key, kept));
    }

    pub(super) fn update(&mut self, live: &dyn Fn(&str) -> bool, now: Moment) {
        if self.closed_by.is_none() {
            let ips: Vec<&str> = self.members.iter().map(|m| m.joiner.ip.as_str()).collect();
            if let Some(by) = quorum(&self.spec, &ips, now.at.duration_since(self.opened)) {
                self.closed_by = Some(by);
                self.closed_unix_ms = now.unix_ms;
                self.plan();
            }
        }
        for m in &mut self.members {
            if m.fate == Fate::Waiting && !live(&m.joiner.node_id) {
                m.fate = Fate::Failed(format!(
                    "node {} stopped answering (its lease lapsed)",
                    m.joiner.node_id
                ));
            }
        }
    }

    /// Checks the window at its quorum and gives every member its rank and parent.
    fn plan(&mut self) {
        if self.putter().is_none() {
            let by = self.closed_by.unwrap_or_default();
            let errno = if by == "timeout" {
                libc::ETIMEDOUT
            } else {
                libc::ENOENT
            };
            let why = format!(
                "no one put into window {} before its quorum closed (by {by})",
                self.group_id
            );
            return self.fail(errno, why);
        }
        let putters = match self.putters_by_key() {
            Ok(p) => p,
            Err(why) => return self.fail(libc::EEXIST, why),
        };
        // A putter that failed before the quorum (its key could not be published) would leave
        // its key's getters waiting on bytes that never come.
        let gone: Vec<String> = putters
            .values()
            .filter_map(|&p| match &self.members[p].fate {
                Fate::Failed(why) => Some(format!(
                    "{}, the putter of {}: {why}",
                    self.label(p),
                    self.members[p].joiner.key
                )),
                _ => None,
            })
            .collect();
        if !gone.is_empty() {
            let why = format!(
                "a putter failed before the quorum closed: {}",
                gone.join("; ")
            );
            return self.fail(libc::EIO, why);
        }
        let several = putters.len() > 1;
        let mut getters: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut orphans = Vec::new();
        let mut differ = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.joiner.role == Role::Putter {
                continue;
            }
            let key = m.joiner.key.as_str();
            match putters.get(key) {
                None => orphans.push(format!("{key} (asked by {})", self.label(i))),
                Some(&p) if self.members[p].joiner.digest != m.joiner.digest => {
                    differ.push(if several {
                        format!("{} (key {key})", self.label(i))
                    } else {
                        self.label(i)
                    });
                }
                Some(_) => getters.entry(key.to_string()).or_default().push(i),
            }
        }
        if !orphans.is_empty() {
            let why = format!(
                "no member of window {} puts {}",
                self.group_id,
                orphans.join(", ")
            );
            return self.fail(libc::ENOENT, why);
        }
        if !differ.is_empty() {
            let why = format!(
                "the tensor tables of {} do not match the putter's",
                differ.join(", ")
            );
            return self.fail(libc::EBADMSG, why);
        }
        // Key after key in the order their putters joined: the putter, then its own node's
        // getters (a hop over loopback), then each other node's getters together, in join order
        // within a node.
        let mut roots: Vec<(String, usize)> = putters.into_iter().collect();
        roots.sort_by_key(|&(_, p)| p);
        let fanout = self.spec.fanout as usize;
        let mut places = Vec::with_capacity(self.members.len());
        for (key, root) in roots {
            let root_node = &self.members[root].joiner.node_id;
            let mut order = getters.remove(&key).unwrap_or_default();
            order.sort_by_key(|&i| {
                let n = &self.members[i].joiner.node_id;
                (n != root_node, n.clone(), i)
            });
            order.insert(0, root);
            for (at, &i) in order.iter().enumerate() {
                let parent = match (at, fanout) {
                    (0, _) => None,
                    (a, 0) => Some(order[a - 1]),
                    (a, f) => Some(order[(a - 1) / f]),
                };
                places.push((i, parent));
            }
        }
        for (rank, (i, parent)) in places.into_iter().enumerate() {
            self.members[i].rank = rank as u32;
            self.members[i].parent = parent;
        }
    }

    /// Each key's one putter; `Err` names the keys put twice, and by whom.
    fn putters_by_key(&self) -> Result<BTreeMap<String, usize>, String> {
        let mut putters: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.joiner.role == Role::Putter {
                putters.entry(m.joiner.key.clone()).or_default().push(i);
            }
        }
        let twice: Vec<String> = putters
            .iter()
            .filter(|(_, ps)| ps.len() > 1)
            .map(|(k, ps)| {
                let who: Vec<String> = ps.iter().map(|&i| self.label(i)).collect();
                format!("{k} by {}", who.join(" and "))
            })
            .collect();
        if !twice.is_empty() {
            return Err(format!(
                "a key has two putters in window {}: {}",
                self.group_id,
                twice.join("; ")
            ));
        }
        Ok(putters.into_iter().map(|(k, ps)| (k, ps[0])).collect())
    }

    pub(super) fn to_proto(&self) -> GpuWindow {
        let putter = self.putter().map(|i| &self.members[i].joiner);
        GpuWindow {
            group_id: self.group_id.clone(),
            generation: self.generation,
            spec: Some(self.spec.clone()),
            members: self
                .members
                .iter()
                .enumerate()
                .map(|(i, m)| GpuMember {
                    id: i as u64,
                    rank: m.rank,
                    node_id: m.joiner.node_id.clone(),
                    ip: m.joiner.ip.clone(),
                    role: m.joiner.role as i32,
                    worker_addr: m.joiner.worker_addr.clone(),
                    registration: m.joiner.registration,
                    parent: m.parent.map_or(-1, |p| p as i64),
                    state: match m.fate {
                        Fate::Waiting => GpuMemberState::GpuWaiting,
                        Fate::Done => GpuMemberState::GpuDone,
                        Fate::Failed(_) => GpuMemberState::GpuFailed,
                    } as i32,
                    error: match &m.fate {
                        Fate::Failed(e) => e.clone(),
                        _ => String::new(),
                    },
                    nccl: m.joiner.nccl,
                    // Issued in the server's answers, to the members only.
                    secret: Vec::new(),
                    key: m.joiner.key.clone(),
                    table_json: if m.joiner.role == Role::Putter {
                        m.joiner.table_json.clone()
                    } else {
                        String::new()
                    },
                    flags: m.joiner.flags,
                })
                .collect(),
            closed: self.closed_by.is_some(),
            closed_by: self.closed_by.unwrap_or_default().to_string(),
            error: self
                .failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_default(),
            errno: self.failure.as_ref().map_or(0, |f| f.errno),
            unique_id: putter.map(|p| p.unique_id.clone()).unwrap_or_default(),
            finished: self.finished(),
            opened_unix_ms: self.opened_unix_ms,
            closed_unix_ms: self.closed_unix_ms,
            nccl: self.over_nccl(),
            comm: match &self.comm {
                Some((key, true)) => key.clone(),
                _ => Vec::new(),
            },
            adopted: self.adopted,
        }
    }

    /// Whether the plan is one NCCL broadcast: decided at the quorum, when the members are
    /// known; every one must be able to (a host buffer, or a worker without NCCL, takes the
    /// whole window to the host transport), the putter must have brought a unique id, and no
    /// two members may be one worker (a rank per process: two callers of one pod in one
    /// window would be two ranks of one process, on one GPU perhaps, which NCCL refuses).
    pub(super) fn over_nccl(&self) -> bool {
        let mut workers = HashSet::new();
        self.closed_by.is_some()
            && self
                .putter()
                .is_some_and(|p| !self.members[p].joiner.unique_id.is_empty())
            && self
                .members
                .iter()
                .all(|m| m.joiner.nccl && workers.insert(m.joiner.worker_addr.as_str()))
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        (self.closed_by.is_none() && self.spec.timeout_ms > 0)
            .then(|| self.opened + Duration::from_millis(self.spec.timeout_ms))
    }
}
