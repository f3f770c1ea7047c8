//! Every GPU window the server knows ([`GpuWindows`]): joins (a new generation once the last
//! one has finished), looks, members' ends, idle windows forgotten, and the NCCL communicators
//! the windows run on ([`CommBook`]) let go of with them.

use std::collections::HashMap;
use std::time::Instant;

use super::comms::{CommBook, Ended};
use super::error::BroadcastError;
use super::generations::Generations;
use super::gpu_window::{Fate, GpuJoiner, GpuWindowState, Member};
use super::quorum::WINDOW_IDLE;
use crate::clock::Moment;
use crate::proto::{GpuWindow, WindowSpec};

/// What a join or a look at a window returns: the window, and when its quorum closes by
/// timeout if it is still open.
pub type GpuView = (GpuWindow, Option<Instant>);

/// Every GPU window the server knows.
#[derive(Default)]
pub struct GpuWindows {
    pub(super) windows: HashMap<String, GpuWindowState>,
    generations: Generations,
    pub(super) comms: CommBook,
}

impl GpuWindows {
    /// Window `group`'s state brought up to `now`, and its communicator picked if it was just
    /// planned over NCCL.
    pub(super) fn touch(
        &mut self,
        group: &str,
        live: &dyn Fn(&str) -> bool,
        now: Moment,
    ) -> Option<&GpuWindowState> {
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
                    .map_or(Ended::Failed, GpuWindowState::ended)
            });
            w.settle_comm(&mut self.comms);
        }
        Some(self.windows.entry(group.to_string()).or_insert(w))
    }

    /// `w` is let go of (replaced by a new generation, or idle): so is its communicator, and
    /// retired unless it is known to have succeeded.
    pub(super) fn forget(comms: &mut CommBook, w: &GpuWindowState) {
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
            .is_none_or(GpuWindowState::replaceable)
        {
            let generation = self.generations.next();
            let w = GpuWindowState::new(spec.clone(), generation, now);
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
        w.members.push(Member::waiting(joiner));
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
pub(super) mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::proto::{HeldComm, Role};
    use crate::rpc::gpu_window::comm_key;
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

    pub(in crate::broadcast::windows) fn joiner(node: &str, role: Role, digest: u8) -> GpuJoiner {
        GpuJoiner {
            key: "k".into(),
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

    pub(in crate::broadcast::windows) const ALIVE: &dyn Fn(&str) -> bool = &|_| true;

    /// A fresh window of as many members as `joins`, joined in order: as it stands at the last.
    fn window_of(clock: &ManualClock, joins: Vec<GpuJoiner>) -> GpuWindow {
        let mut g = GpuWindows::default();
        let s = spec(joins.len() as u32, 0, 0);
        let mut last = None;
        for j in joins {
            last = Some(g.join(s.clone(), j, ALIVE, clock.now()).unwrap().0 .0);
        }
        last.unwrap()
    }

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
        let run = |members: Vec<GpuJoiner>| window_of(&clock, members);
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
    fn a_window_without_a_quorum_is_refused_and_a_key_put_twice_fails_it_naming_the_key() {
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
        g.join(
            spec(3, 0, 0),
            joiner("b", Role::Putter, 1),
            ALIVE,
            clock.now(),
        )
        .unwrap();
        let ((w, _), _) = g
            .join(
                spec(3, 0, 0),
                joiner("c", Role::Getter, 1),
                ALIVE,
                clock.now(),
            )
            .unwrap();
        assert_eq!(w.errno, libc::EEXIST, "{}", w.error);
        assert!(
            w.error
                .contains("k by member 0 on node a and member 1 on node b"),
            "{}",
            w.error
        );
    }

    #[test]
    fn a_putter_that_failed_before_anyone_joined_still_fails_the_window_at_its_quorum() {
        // The second putter of a key learns at publish that the key exists, and joins only to
        // tell the window; when it is the first to join, the others must still meet it.
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let ((w, _), d) = g
            .join(
                spec(3, 0, 0),
                joiner("d", Role::Putter, 1),
                ALIVE,
                clock.now(),
            )
            .unwrap();
        g.finish("g", w.generation, d, "key k already exists", clock.now())
            .unwrap();
        for (node, role) in [("a", Role::Putter), ("b", Role::Getter)] {
            let ((next, _), _) = g
                .join(spec(3, 0, 0), joiner(node, role, 1), ALIVE, clock.now())
                .unwrap();
            assert_eq!(next.generation, w.generation, "a fresh window was opened");
        }
        let (w, _) = g.view("g", w.generation, ALIVE, clock.now()).unwrap();
        assert_eq!(w.errno, libc::EEXIST, "{}", w.error);
        assert!(w.error.contains("on node d"), "{}", w.error);

        // A window whose only members left before its quorum is replaced by the next join.
        let mut g = GpuWindows::default();
        let ((w, _), b) = g
            .join(
                spec(3, 0, 0),
                joiner("b", Role::Getter, 1),
                ALIVE,
                clock.now(),
            )
            .unwrap();
        g.finish("g", w.generation, b, "closed", clock.now())
            .unwrap();
        let ((next, _), member) = g
            .join(
                spec(3, 0, 0),
                joiner("a", Role::Putter, 1),
                ALIVE,
                clock.now(),
            )
            .unwrap();
        assert!(next.generation > w.generation);
        assert_eq!(member, 0);
    }

    fn keyed(key: &str, node: &str, role: Role, digest: u8) -> GpuJoiner {
        GpuJoiner {
            key: key.into(),
            ..joiner(node, role, digest)
        }
    }

    #[test]
    fn a_window_of_several_keys_plans_a_tree_per_key_from_its_putter() {
        let clock = ManualClock::default();
        let mut g = GpuWindows::default();
        let s = spec(5, 0, 0);
        // Two shards, each put by a trainer rank and got by an inference rank; a third getter
        // of shard 0 on the node of shard 1's putter. Tables differ by key, not within one.
        let joins = [
            keyed("shard-1", "c", Role::Getter, 2),
            keyed("shard-0", "a", Role::Putter, 1),
            keyed("shard-0", "d", Role::Getter, 1),
            keyed("shard-1", "b", Role::Putter, 2),
            keyed("shard-0", "b", Role::Getter, 1),
        ];
        let mut last = None;
        for j in joins {
            last = Some(g.join(s.clone(), j, ALIVE, clock.now()).unwrap().0 .0);
        }
        let w = last.unwrap();
        assert!(w.closed && w.error.is_empty(), "{}", w.error);
        let by_id = |id: u64| &w.members[id as usize];
        // Shard 0 first (its putter joined first): putter 1, then its getters by node (b, d);
        // then shard 1: putter 3, getter 0.
        let mut by_rank: Vec<(u32, u64, i64)> =
            w.members.iter().map(|m| (m.rank, m.id, m.parent)).collect();
        by_rank.sort();
        let ranked: Vec<(u64, i64)> = by_rank.iter().map(|&(_, id, p)| (id, p)).collect();
        assert_eq!(ranked, vec![(1, -1), (4, 1), (2, 4), (3, -1), (0, 3)]);
        for m in &w.members {
            if m.parent >= 0 {
                assert_eq!(by_id(m.parent as u64).key, m.key, "a parent of another key");
            }
        }
        // Each putter's table goes out with it, for its key's getters to check theirs.
        assert!(by_id(3).table_json == "{}" && by_id(0).table_json.is_empty());
    }

    #[test]
    fn a_getter_of_a_key_no_one_puts_or_of_another_table_fails_the_window_naming_it() {
        let clock = ManualClock::default();
        let run = |joins: Vec<GpuJoiner>| window_of(&clock, joins);
        let w = run(vec![
            keyed("shard-0", "a", Role::Putter, 1),
            keyed("shard-0", "b", Role::Getter, 1),
            keyed("shard-9", "c", Role::Getter, 1),
        ]);
        assert_eq!(w.errno, libc::ENOENT, "{}", w.error);
        assert!(
            w.error
                .contains("puts shard-9 (asked by member 2 on node c)"),
            "{}",
            w.error
        );
        // The table check is per key: shard 1's getter matches shard 1's putter, not shard 0's.
        let w = run(vec![
            keyed("shard-0", "a", Role::Putter, 1),
            keyed("shard-1", "b", Role::Putter, 2),
            keyed("shard-1", "c", Role::Getter, 2),
            keyed("shard-0", "d", Role::Getter, 2),
        ]);
        assert_eq!(w.errno, libc::EBADMSG, "{}", w.error);
        assert!(
            w.error.contains("member 3 on node d (key shard-0)") && !w.error.contains("node c"),
            "{}",
            w.error
        );
    }
}
