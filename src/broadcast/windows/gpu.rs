//! GPU windows: the quorum and the plan of a coordinated transfer of one GPU key.
//!
//! Unlike a file window, whose getters each get a parent the moment they join and fetch at
//! their own pace, a GPU window moves every participant's buffers in one transfer: NCCL needs
//! every rank of a communicator present, and a receiver must know the whole tree before the
//! first byte moves. So everyone waits for the quorum (the same criteria as files: ANY of
//! world_size, ips, timeout), and when it closes the window is checked and planned once:
//! exactly one putter, every getter's tensor table the putter's (by digest: a mismatch fails the
//! whole window, so that no rank waits for one that will never send), ranks in an order that
//! keeps the members of one node next to each other, and each getter's parent: a chain (what
//! NCCL's pipelined broadcast does over its ring) or, with an explicit fanout, a tree of that
//! degree. Then members report how they finished; the putter's transfer ends when every getter's
//! has, and fails naming each getter that failed or whose node stopped answering.
//!
//! Plain state with an explicit `now`, as [`super::Broadcasts`] is.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::comms::{CommBook, Ended};
use super::members::quorum;
use super::{BroadcastError, WINDOW_IDLE};
use crate::clock::Moment;
use crate::proto::{GpuMember, GpuMemberState, GpuWindow, HeldComm, Role, WindowSpec};
use crate::rpc::gpu_window::comm_key;

/// Who joins a GPU window.
#[derive(Clone, Debug, Default)]
pub struct GpuJoiner {
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
enum Fate {
    Waiting,
    Done,
    Failed(String),
}

#[derive(Debug)]
struct Member {
    joiner: GpuJoiner,
    rank: u32,
    parent: Option<usize>,
    fate: Fate,
}

/// Why a window failed as a whole, and the errno its participants see.
#[derive(Clone, Debug)]
struct Failure {
    errno: i32,
    message: String,
}

#[derive(Debug)]
struct Window {
    group_id: String,
    generation: u64,
    spec: WindowSpec,
    opened: Instant,
    opened_unix_ms: i64,
    closed_by: Option<&'static str>,
    closed_unix_ms: i64,
    touched: Instant,
    members: Vec<Member>,
    failure: Option<Failure>,
    /// Over NCCL, once planned: the communicator the broadcast runs on, and whether the members
    /// kept it from an earlier window (else it is formed from the putter's unique id).
    comm: Option<(Vec<u8>, bool)>,
}

impl Window {
    fn putter(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.joiner.role == Role::Putter)
    }

    fn label(&self, i: usize) -> String {
        let m = &self.members[i];
        format!("member {i} on node {}", m.joiner.node_id)
    }

    fn finished(&self) -> bool {
        !self.members.is_empty() && self.members.iter().all(|m| m.fate != Fate::Waiting)
    }

    /// How the window's broadcast ended, for the communicator it ran on.
    fn ended(&self) -> Ended {
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
    fn settle_comm(&mut self, book: &mut CommBook) {
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

    fn update(&mut self, live: &dyn Fn(&str) -> bool, now: Moment) {
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
        let Some(root) = self.putter() else {
            let by = self.closed_by.unwrap_or_default();
            self.failure = Some(Failure {
                errno: if by == "timeout" {
                    libc::ETIMEDOUT
                } else {
                    libc::ENOENT
                },
                message: format!(
                    "no one put into window {} before its quorum closed (by {by})",
                    self.group_id
                ),
            });
            return;
        };
        let digest = self.members[root].joiner.digest.clone();
        let differ: Vec<String> = (0..self.members.len())
            .filter(|&i| self.members[i].joiner.digest != digest)
            .map(|i| self.label(i))
            .collect();
        if !differ.is_empty() {
            self.failure = Some(Failure {
                errno: libc::EBADMSG,
                message: format!(
                    "the tensor tables of {} do not match the putter's",
                    differ.join(", ")
                ),
            });
            return;
        }
        // The putter first, then its own node's getters (a hop over loopback), then each other
        // node's getters together, in join order within a node.
        let root_node = self.members[root].joiner.node_id.clone();
        let mut order: Vec<usize> = (0..self.members.len()).filter(|&i| i != root).collect();
        order.sort_by_key(|&i| {
            let n = &self.members[i].joiner.node_id;
            (n != &root_node, n.clone(), i)
        });
        order.insert(0, root);
        let fanout = self.spec.fanout as usize;
        for (rank, &i) in order.iter().enumerate() {
            self.members[i].rank = rank as u32;
            self.members[i].parent = match (rank, fanout) {
                (0, _) => None,
                (r, 0) => Some(order[r - 1]),
                (r, f) => Some(order[(r - 1) / f]),
            };
        }
    }

    fn to_proto(&self) -> GpuWindow {
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
            table_json: putter.map(|p| p.table_json.clone()).unwrap_or_default(),
            unique_id: putter.map(|p| p.unique_id.clone()).unwrap_or_default(),
            flags: putter.map_or(0, |p| p.flags),
            finished: self.finished(),
            opened_unix_ms: self.opened_unix_ms,
            closed_unix_ms: self.closed_unix_ms,
            nccl: self.over_nccl(),
            comm: match &self.comm {
                Some((key, true)) => key.clone(),
                _ => Vec::new(),
            },
        }
    }

    /// Whether the plan is one NCCL broadcast: decided at the quorum, when the members are
    /// known; every one must be able to (a host buffer, or a worker without NCCL, takes the
    /// whole window to the host transport), the putter must have brought a unique id, and no
    /// two members may be one worker (a rank per process: two callers of one pod in one
    /// window would be two ranks of one process, on one GPU perhaps, which NCCL refuses).
    fn over_nccl(&self) -> bool {
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

    fn deadline(&self) -> Option<Instant> {
        (self.closed_by.is_none() && self.spec.timeout_ms > 0)
            .then(|| self.opened + std::time::Duration::from_millis(self.spec.timeout_ms))
    }
}

/// What a join or a look at a window returns: the window, and when its quorum closes by
/// timeout if it is still open.
pub type GpuView = (GpuWindow, Option<Instant>);

/// Every GPU window the server knows.
#[derive(Default)]
pub struct GpuWindows {
    windows: HashMap<String, Window>,
    generations: u64,
    comms: CommBook,
}

impl GpuWindows {
    /// Window `group`'s state brought up to `now`, and its communicator picked if it was just
    /// planned over NCCL.
    fn touch(&mut self, group: &str, live: &dyn Fn(&str) -> bool, now: Moment) -> Option<&Window> {
        let mut w = self.windows.remove(group)?;
        w.touched = now.at;
        w.update(live, now);
        if w.closed_by.is_some() && w.comm.is_none() && w.over_nccl() {
            let windows = &self.windows;
            self.comms.release_finished(&|group, generation| {
                windows
                    .get(group)
                    .filter(|o| o.generation == generation)
                    // Every window let go of is forgotten first, so this is not seen.
                    .map_or(Ended::Failed, Window::ended)
            });
            w.settle_comm(&mut self.comms);
        }
        Some(self.windows.entry(group.to_string()).or_insert(w))
    }

    /// `w` is let go of (replaced by a new generation, or idle): so is its communicator, and
    /// retired unless it is known to have succeeded.
    fn forget(comms: &mut CommBook, w: &Window) {
        if let Some((key, _)) = &w.comm {
            let ended = match w.ended() {
                Ended::Running => Ended::Failed,
                e => e,
            };
            comms.end(key, &w.group_id, w.generation, ended);
        }
    }

    /// Adds a participant to the window `spec` names (a new generation once the last one has
    /// finished). Returns the window and the member's id.
    pub fn join(
        &mut self,
        spec: WindowSpec,
        joiner: GpuJoiner,
        live: &dyn Fn(&str) -> bool,
        now: Moment,
    ) -> Result<(GpuView, u64), BroadcastError> {
        if spec.group_id.is_empty() {
            return Err(BroadcastError::Bad("group id missing".into()));
        }
        if spec.world_size == 0 && spec.timeout_ms == 0 && spec.ips.is_empty() {
            return Err(BroadcastError::Bad(
                "a GPU window needs a quorum: world_size, timeout or ips".into(),
            ));
        }
        let idle: Vec<String> = self
            .windows
            .iter()
            .filter(|(_, w)| now.at.duration_since(w.touched) >= WINDOW_IDLE)
            .map(|(g, _)| g.clone())
            .collect();
        for g in idle {
            if let Some(w) = self.windows.remove(&g) {
                Self::forget(&mut self.comms, &w);
            }
        }
        if self
            .windows
            .get(&spec.group_id)
            .is_none_or(|w| w.finished())
        {
            self.generations += 1;
            let w = Window {
                group_id: spec.group_id.clone(),
                generation: self.generations,
                spec: spec.clone(),
                opened: now.at,
                opened_unix_ms: now.unix_ms,
                closed_by: None,
                closed_unix_ms: 0,
                touched: now.at,
                members: Vec::new(),
                failure: None,
                comm: None,
            };
            if let Some(old) = self.windows.insert(spec.group_id.clone(), w) {
                Self::forget(&mut self.comms, &old);
            }
        }
        self.touch(&spec.group_id, live, now);
        let w = self
            .windows
            .get_mut(&spec.group_id)
            .ok_or_else(|| BroadcastError::NoWindow(spec.group_id.clone()))?;
        if let Some(by) = w.closed_by {
            return Err(BroadcastError::Busy(format!(
                "window {} closed its quorum (by {by}) before this joined, and is still moving \
                 its bytes; join once it has finished",
                w.group_id
            )));
        }
        if joiner.role == Role::Putter && w.putter().is_some() {
            return Err(BroadcastError::Exists(format!(
                "window {} has a putter already",
                w.group_id
            )));
        }
        w.members.push(Member {
            joiner,
            rank: 0,
            parent: None,
            fate: Fate::Waiting,
        });
        let member = (w.members.len() - 1) as u64;
        let group = w.group_id.clone();
        let w = self
            .touch(&group, live, now)
            .ok_or_else(|| BroadcastError::NoWindow(group.clone()))?;
        Ok(((w.to_proto(), w.deadline()), member))
    }

    /// The window `group` of `generation` as it stands now.
    pub fn view(
        &mut self,
        group: &str,
        generation: u64,
        live: &dyn Fn(&str) -> bool,
        now: Moment,
    ) -> Result<GpuView, BroadcastError> {
        if self
            .windows
            .get(group)
            .is_none_or(|w| w.generation != generation)
        {
            return Err(BroadcastError::NoWindow(group.to_string()));
        }
        let w = self
            .touch(group, live, now)
            .ok_or_else(|| BroadcastError::NoWindow(group.to_string()))?;
        Ok((w.to_proto(), w.deadline()))
    }

    /// A member has finished: its buffers filled (`error` empty) or not.
    pub fn finish(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        error: &str,
        now: Moment,
    ) -> Result<(), BroadcastError> {
        let w = self
            .windows
            .get_mut(group)
            .filter(|w| w.generation == generation)
            .ok_or_else(|| BroadcastError::NoWindow(group.to_string()))?;
        w.touched = now.at;
        let m = w
            .members
            .get_mut(member as usize)
            .ok_or_else(|| BroadcastError::NoMember(group.to_string(), member))?;
        if m.fate == Fate::Waiting {
            m.fate = if error.is_empty() {
                Fate::Done
            } else {
                Fate::Failed(error.to_string())
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::rpc::gpu_window::outcome;
    use std::time::Duration;

    fn spec(world_size: u32, timeout_ms: u64, fanout: u32) -> WindowSpec {
        WindowSpec {
            group_id: "g".into(),
            timeout_ms,
            world_size,
            ips: Vec::new(),
            fanout,
        }
    }

    fn joiner(node: &str, role: Role, digest: u8) -> GpuJoiner {
        GpuJoiner {
            node_id: node.into(),
            ip: format!("ip-{node}"),
            role,
            worker_addr: format!("{node}:1"),
            registration: 7,
            digest: vec![digest; 32],
            table_json: "{}".into(),
            flags: 0,
            unique_id: Vec::new(),
            nccl: false,
            comms: Vec::new(),
        }
    }

    const ALIVE: &dyn Fn(&str) -> bool = &|_| true;

    #[test]
    fn the_quorum_closes_at_world_size_and_plans_a_chain_grouped_by_node() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(4, 0, 0);
        let ((w, _), _) = g
            .join(s.clone(), joiner("b", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        assert!(!w.closed);
        g.join(s.clone(), joiner("a", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        g.join(s.clone(), joiner("b", Role::Putter, 1), ALIVE, clock.now())
            .unwrap();
        let ((w, deadline), m) = g
            .join(s, joiner("a", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        assert_eq!((m, w.closed, w.closed_by.as_str()), (3, true, "world_size"));
        assert!(deadline.is_none() && w.error.is_empty());
        // Putter (member 2, node b) first, its node's getter next, then node a's in join order.
        let by_rank: Vec<(u64, i64)> = {
            let mut v: Vec<_> = w.members.iter().map(|m| (m.rank, m.id, m.parent)).collect();
            v.sort();
            v.into_iter().map(|(_, id, p)| (id, p)).collect()
        };
        assert_eq!(by_rank, vec![(2, -1), (0, 2), (1, 0), (3, 1)]);
    }

    #[test]
    fn a_window_goes_over_nccl_only_when_every_member_can_and_the_putter_brought_an_id() {
        let clock = ManualClock::default();
        let nccl = |node: &str, role: Role, id: bool| GpuJoiner {
            nccl: true,
            unique_id: if id { vec![9; 128] } else { Vec::new() },
            ..joiner(node, role, 1)
        };
        let run = |members: Vec<GpuJoiner>| {
            let mut g = GpuWindows::default();
            let s = spec(members.len() as u32, 0, 0);
            let mut last = None;
            for m in members {
                last = Some(g.join(s.clone(), m, ALIVE, clock.now()).unwrap().0 .0);
            }
            last.unwrap()
        };
        let w = run(vec![
            nccl("a", Role::Putter, true),
            nccl("b", Role::Getter, false),
            nccl("c", Role::Getter, false),
        ]);
        assert!(w.closed && w.nccl && w.unique_id == vec![9; 128]);
        let putter = w.members.iter().find(|m| m.role() == Role::Putter).unwrap();
        assert_eq!(putter.rank, 0, "the putter is the root, rank 0");
        assert!(w.members.iter().all(|m| m.nccl));
        // One member with host buffers (or no NCCL) takes the window to the host transport.
        let w = run(vec![
            nccl("a", Role::Putter, true),
            joiner("b", Role::Getter, 1),
            nccl("c", Role::Getter, false),
        ]);
        assert!(w.closed && !w.nccl);
        // Two members of one worker: the host transport.
        let w = run(vec![
            nccl("a", Role::Putter, true),
            nccl("b", Role::Getter, false),
            nccl("b", Role::Getter, false),
        ]);
        assert!(w.closed && !w.nccl);
        // No id from the putter: no NCCL either.
        let w = run(vec![
            nccl("a", Role::Putter, false),
            nccl("b", Role::Getter, false),
        ]);
        assert!(w.closed && !w.nccl);
        // Before the quorum nothing is decided.
        let mut g = GpuWindows::default();
        let ((w, _), _) = g
            .join(
                spec(3, 0, 0),
                nccl("a", Role::Putter, true),
                ALIVE,
                clock.now(),
            )
            .unwrap();
        assert!(!w.closed && !w.nccl);
    }

    #[test]
    fn a_window_of_the_workers_of_an_earlier_one_runs_on_the_communicator_they_kept() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let member = |node: &str, role: Role, id: u8, comms: Vec<HeldComm>| GpuJoiner {
            nccl: true,
            unique_id: if role == Role::Putter {
                vec![id; 128]
            } else {
                Vec::new()
            },
            comms,
            ..joiner(node, role, 1)
        };
        let run = |g: &mut GpuWindows, group: &str, joiners: Vec<GpuJoiner>| {
            let s = WindowSpec {
                group_id: group.into(),
                ..spec(joiners.len() as u32, 0, 0)
            };
            let mut last = None;
            for j in joiners {
                last = Some(g.join(s.clone(), j, ALIVE, clock.now()).unwrap().0 .0);
            }
            last.unwrap()
        };
        let finish = |g: &mut GpuWindows, w: &GpuWindow, error: &str| {
            for m in &w.members {
                g.finish(&w.group_id, w.generation, m.id, error, clock.now())
                    .unwrap();
            }
        };
        // The first window forms a communicator from the putter's id.
        let w1 = run(
            &mut g,
            "g",
            vec![
                member("a", Role::Putter, 1, vec![]),
                member("b", Role::Getter, 0, vec![]),
                member("c", Role::Getter, 0, vec![]),
            ],
        );
        assert!(w1.nccl && w1.comm.is_empty());
        finish(&mut g, &w1, "");
        // What each worker then holds: its rank in that communicator.
        let key = comm_key(&[1; 128]);
        let held = |w: &GpuWindow, node: &str| {
            let m = w.members.iter().find(|m| m.node_id == node).unwrap();
            vec![HeldComm {
                key: key.clone(),
                rank: m.rank,
                nranks: 3,
            }]
        };
        let (ha, hb, hc) = (held(&w1, "a"), held(&w1, "b"), held(&w1, "c"));
        // The same workers, joining in another order, with a getter putting this time: the
        // kept communicator, each member at its rank there, the putter's the root.
        let w2 = run(
            &mut g,
            "g",
            vec![
                member("c", Role::Getter, 0, hc.clone()),
                member("b", Role::Putter, 2, hb.clone()),
                member("a", Role::Getter, 0, ha.clone()),
            ],
        );
        assert!(w2.nccl && w2.generation > w1.generation);
        assert_eq!(w2.comm, key);
        for node in ["a", "b", "c"] {
            let rank = |w: &GpuWindow| w.members.iter().find(|m| m.node_id == node).unwrap().rank;
            assert_eq!(rank(&w2), rank(&w1), "{node} keeps its rank");
        }
        // While that window runs, another window of the same workers forms a fresh one (NCCL
        // needs the same collectives in the same order on every rank of a communicator).
        let other = run(
            &mut g,
            "h",
            vec![
                member("a", Role::Putter, 3, ha.clone()),
                member("b", Role::Getter, 0, hb.clone()),
                member("c", Role::Getter, 0, hc.clone()),
            ],
        );
        assert!(other.nccl && other.comm.is_empty());
        finish(&mut g, &other, "");
        // A member that does not hold it (its worker restarted), or one more member: fresh.
        finish(&mut g, &w2, "");
        let w3 = run(
            &mut g,
            "g",
            vec![
                member("a", Role::Putter, 4, ha.clone()),
                member("b", Role::Getter, 0, vec![]),
                member("c", Role::Getter, 0, hc.clone()),
            ],
        );
        assert!(w3.nccl && w3.comm.is_empty());
        finish(&mut g, &w3, "");
        let w4 = run(
            &mut g,
            "g",
            vec![
                member("a", Role::Putter, 5, ha.clone()),
                member("b", Role::Getter, 0, hb.clone()),
                member("c", Role::Getter, 0, hc.clone()),
                member("d", Role::Getter, 0, vec![]),
            ],
        );
        assert!(w4.nccl && w4.comm.is_empty());
        finish(&mut g, &w4, "");
        // Once more, and this time the window fails: the communicator may be broken on some
        // member, so no later window runs on it.
        let w5 = run(
            &mut g,
            "g",
            vec![
                member("a", Role::Putter, 6, ha.clone()),
                member("b", Role::Getter, 0, hb.clone()),
                member("c", Role::Getter, 0, hc.clone()),
            ],
        );
        assert_eq!(w5.comm, key);
        finish(&mut g, &w5, "NCCL: the communicator was aborted");
        let w6 = run(
            &mut g,
            "g",
            vec![
                member("a", Role::Putter, 7, ha),
                member("b", Role::Getter, 0, hb),
                member("c", Role::Getter, 0, hc),
            ],
        );
        assert!(w6.nccl && w6.comm.is_empty(), "retired after a failure");
    }

    #[test]
    fn a_fanout_builds_a_tree_of_that_degree() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(7, 0, 2);
        g.join(s.clone(), joiner("n", Role::Putter, 1), ALIVE, clock.now())
            .unwrap();
        let mut last = None;
        for _ in 0..6 {
            last = Some(
                g.join(s.clone(), joiner("n", Role::Getter, 1), ALIVE, clock.now())
                    .unwrap(),
            );
        }
        let ((w, _), _) = last.unwrap();
        let parents: Vec<i64> = w.members.iter().map(|m| m.parent).collect();
        assert_eq!(parents, vec![-1, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn a_timeout_closes_with_whoever_joined_and_a_window_without_a_putter_fails() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(10, 500, 0);
        let ((w, deadline), _) = g
            .join(s.clone(), joiner("a", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        assert!(deadline.is_some());
        clock.advance(Duration::from_millis(500));
        let (w, _) = g.view("g", w.generation, ALIVE, clock.now()).unwrap();
        assert_eq!(
            (w.closed_by.as_str(), w.errno),
            ("timeout", libc::ETIMEDOUT)
        );
        assert!(w.error.contains("no one put"), "{}", w.error);
        // A late joiner of a closed window that is still moving is refused, not hung.
        assert!(matches!(
            g.join(s, joiner("b", Role::Getter, 1), ALIVE, clock.now()),
            Err(BroadcastError::Busy(_))
        ));
    }

    #[test]
    fn a_table_that_differs_fails_the_whole_window_naming_it() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(3, 0, 0);
        g.join(s.clone(), joiner("a", Role::Putter, 1), ALIVE, clock.now())
            .unwrap();
        g.join(s.clone(), joiner("b", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        let ((w, _), _) = g
            .join(s, joiner("c", Role::Getter, 2), ALIVE, clock.now())
            .unwrap();
        assert_eq!(w.errno, libc::EBADMSG);
        assert!(w.error.contains("member 2 on node c"), "{}", w.error);
    }

    #[test]
    fn the_putter_learns_which_getters_failed_and_whose_node_died() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(4, 0, 0);
        for (n, r) in [
            ("a", Role::Putter),
            ("b", Role::Getter),
            ("c", Role::Getter),
        ] {
            g.join(s.clone(), joiner(n, r, 1), ALIVE, clock.now())
                .unwrap();
        }
        let ((w, _), _) = g
            .join(s.clone(), joiner("d", Role::Getter, 1), ALIVE, clock.now())
            .unwrap();
        let generation = w.generation;
        g.finish("g", generation, 1, "", clock.now()).unwrap();
        g.finish("g", generation, 2, "its parent hung up", clock.now())
            .unwrap();
        let dead_d = |n: &str| n != "d";
        let (w, _) = g.view("g", generation, &dead_d, clock.now()).unwrap();
        let members: Vec<i32> = w.members.iter().map(|m| m.state).collect();
        assert_eq!(members[1..], [1, 2, 2]);
        let err = outcome(&w).unwrap_err();
        assert!(err.starts_with("2 of 3 getters failed"), "{err}");
        assert!(
            err.contains("member 2 on node c: its parent hung up"),
            "{err}"
        );
        assert!(err.contains("node d stopped answering"), "{err}");
        g.finish("g", generation, 0, "", clock.now()).unwrap();
        // Finished: the next join opens the next generation.
        let ((w, _), m) = g
            .join(s, joiner("a", Role::Putter, 1), ALIVE, clock.now())
            .unwrap();
        assert_eq!((m, w.generation > generation), (0, true));
    }

    #[test]
    fn a_second_putter_and_a_window_without_a_quorum_are_refused() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        assert!(matches!(
            g.join(
                spec(0, 0, 0),
                joiner("a", Role::Putter, 1),
                ALIVE,
                clock.now()
            ),
            Err(BroadcastError::Bad(_))
        ));
        g.join(
            spec(3, 0, 0),
            joiner("a", Role::Putter, 1),
            ALIVE,
            clock.now(),
        )
        .unwrap();
        assert!(matches!(
            g.join(
                spec(3, 0, 0),
                joiner("b", Role::Putter, 1),
                ALIVE,
                clock.now()
            ),
            Err(BroadcastError::Exists(_))
        ));
    }
}
