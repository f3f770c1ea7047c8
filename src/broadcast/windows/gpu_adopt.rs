//! A GPU window whose owner died, taken up by the next (in cluster mode a window is the memory
//! of the replica that owns the store). A window still forming re-forms there from its
//! members' joins, each keeping its place where it has one ([`GpuWindows::join_again`]). One
//! whose quorum closed has its members moving bytes by the plan they were given, and only their
//! reports are left to gather: the first member to reach the new owner brings its copy of the
//! window, which is taken up as it stands (the places, the plan, the fates it shows), and the
//! others' reports land in it ([`GpuWindows::adopt`]). The members of a window are callers of
//! one namespace (a group is scoped to its namespace), so a member's copy is believed for the
//! fates it shows; not for secrets: an adopted window issues none, its members holding those
//! their plan gave them.

use super::error::BroadcastError;
use super::gpu_window::{Failure, Fate, GpuJoiner, GpuWindowState, Member};
use super::gpu_windows::{GpuView, GpuWindows};
use crate::clock::Moment;
use crate::proto::{GpuMemberState, GpuWindow, WindowSpec};
use crate::rpc::gpu_window::comm_key;

impl GpuWindows {
    /// Joins as [`GpuWindows::join`] does, but a member the group's window holds already (it
    /// joined before its owner died, and a copy brought here since holds it) keeps its place.
    pub fn join_again(
        &mut self,
        spec: WindowSpec,
        joiner: GpuJoiner,
        live: &dyn Fn(&str) -> bool,
        now: Moment,
    ) -> Result<(GpuView, u64), BroadcastError> {
        let held = self
            .windows
            .get(&spec.group_id)
            .filter(|w| !w.replaceable())
            .and_then(|w| w.place_of(&joiner));
        let Some(member) = held else {
            return self.join(spec, joiner, live, now);
        };
        let w = self
            .touch(&spec.group_id, live, now)
            .ok_or_else(|| BroadcastError::NoWindow(spec.group_id.clone()))?;
        Ok(((w.to_proto(), w.deadline()), member))
    }

    /// Takes up `known`, a closed window as a member was told it by an owner that died: as it
    /// stands where this replica knows nothing of it (or only a window of the group still
    /// forming, whose members then find their places in this one); the fates it shows added
    /// where this replica took it up already; refused where the group's window here closed at
    /// another generation (the group moved on).
    pub fn adopt(
        &mut self,
        known: &GpuWindow,
        live: &dyn Fn(&str) -> bool,
        now: Moment,
    ) -> Result<GpuView, BroadcastError> {
        let group = &known.group_id;
        match self.windows.get_mut(group) {
            Some(w) if w.generation == known.generation => w.add_fates(known),
            // A window of the group formed here since: taken over where members of the copy
            // formed it again (they missed its close), not where others did (the group's
            // next transfer).
            Some(w)
                if w.closed_by.is_some()
                    || !w
                        .members
                        .iter()
                        .any(|m| place_in(known, &m.joiner).is_some()) =>
            {
                return Err(BroadcastError::Busy(format!(
                    "window {group} moved on: generation {} here, not {}",
                    w.generation, known.generation
                )))
            }
            _ => {
                let w = GpuWindowState::from_known(known, now)?;
                if let Some((key, _)) = &w.comm {
                    self.comms.use_for(key.clone(), group, w.generation);
                }
                tracing::info!(group = %group, generation = w.generation, "took up a GPU window from a member");
                if let Some(old) = self.windows.insert(group.clone(), w) {
                    Self::forget(&mut self.comms, &old);
                }
            }
        }
        let w = self
            .touch(group, live, now)
            .ok_or_else(|| BroadcastError::NoWindow(group.clone()))?;
        Ok((w.to_proto(), w.deadline()))
    }
}

/// Whether two joins are one member's: the same registration of the same worker, for the same
/// key in the same role (a worker numbers its registrations).
fn same(a: &GpuJoiner, b: &GpuJoiner) -> bool {
    a.registration != 0
        && !a.worker_addr.is_empty()
        && (a.registration, &a.worker_addr, &a.node_id, &a.key, a.role)
            == (b.registration, &b.worker_addr, &b.node_id, &b.key, b.role)
}

/// The place in `known`, a window as a member was told it, of the member that joined with
/// `joiner`, if it holds one.
pub fn place_in(known: &GpuWindow, joiner: &GpuJoiner) -> Option<u64> {
    let m = known.members.iter().find(|m| {
        let was = GpuJoiner {
            key: m.key.clone(),
            node_id: m.node_id.clone(),
            role: m.role(),
            worker_addr: m.worker_addr.clone(),
            registration: m.registration,
            ..Default::default()
        };
        same(&was, joiner)
    })?;
    Some(m.id)
}

impl GpuWindowState {
    /// The place of the member that joined with `joiner`, if one did.
    pub(super) fn place_of(&self, joiner: &GpuJoiner) -> Option<u64> {
        let at = self.members.iter().position(|m| same(&m.joiner, joiner))?;
        u64::try_from(at).ok()
    }

    /// The window `w` says, checked: closed, its members numbered in order, each parent one
    /// of them.
    fn from_known(w: &GpuWindow, now: Moment) -> Result<Self, BroadcastError> {
        let bad = |why: String| {
            BroadcastError::Bad(format!("window {} as a member knows it: {why}", w.group_id))
        };
        let closed_by = match w.closed_by.as_str() {
            _ if !w.closed => return Err(bad("its quorum had not closed".into())),
            "world_size" => "world_size",
            "ips" => "ips",
            "timeout" => "timeout",
            other => return Err(bad(format!("closed by {other:?}"))),
        };
        let n = w.members.len();
        if n == 0 {
            return Err(bad("no members".into()));
        }
        let mut spec = w.spec.clone().unwrap_or_default();
        spec.group_id.clone_from(&w.group_id);
        let mut state = GpuWindowState::new(spec, w.generation, now);
        state.opened_unix_ms = w.opened_unix_ms;
        state.closed_by = Some(closed_by);
        state.closed_unix_ms = w.closed_unix_ms;
        state.adopted = true;
        for (at, m) in w.members.iter().enumerate() {
            if m.id != at as u64 {
                return Err(bad(format!("member {} listed at {at}", m.id)));
            }
            let parent = match usize::try_from(m.parent) {
                Ok(p) if p < n && p != at => Some(p),
                Ok(p) => return Err(bad(format!("member {at}'s parent {p} is no other member"))),
                Err(_) => None,
            };
            state.members.push(Member {
                joiner: GpuJoiner {
                    key: m.key.clone(),
                    node_id: m.node_id.clone(),
                    ip: m.ip.clone(),
                    role: m.role(),
                    worker_addr: m.worker_addr.clone(),
                    registration: m.registration,
                    // Checked at the quorum, which has closed.
                    digest: Vec::new(),
                    table_json: m.table_json.clone(),
                    flags: m.flags,
                    unique_id: Vec::new(),
                    nccl: m.nccl,
                    comms: Vec::new(),
                },
                rank: m.rank,
                parent,
                fate: Fate::Waiting,
            });
        }
        if let Some(p) = state.putter() {
            state.members[p].joiner.unique_id.clone_from(&w.unique_id);
        }
        if !w.error.is_empty() {
            state.failure = Some(Failure {
                errno: w.errno,
                message: w.error.clone(),
            });
        }
        state.comm = match (w.nccl, w.comm.is_empty()) {
            (true, false) => Some((w.comm.clone(), true)),
            (true, true) if !w.unique_id.is_empty() => Some((comm_key(&w.unique_id), false)),
            _ => None,
        };
        state.add_fates(w);
        Ok(state)
    }

    /// The fates `w` shows of this window's members, where this replica has none yet.
    fn add_fates(&mut self, w: &GpuWindow) {
        for m in &w.members {
            let Some(ours) = usize::try_from(m.id)
                .ok()
                .and_then(|i| self.members.get_mut(i))
            else {
                continue;
            };
            if ours.fate != Fate::Waiting || ours.joiner.role != m.role() {
                continue;
            }
            ours.fate = match m.state() {
                GpuMemberState::GpuWaiting => Fate::Waiting,
                GpuMemberState::GpuDone => Fate::Done,
                GpuMemberState::GpuFailed => Fate::Failed(match m.error.is_empty() {
                    true => "failed".into(),
                    false => m.error.clone(),
                }),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::proto::Role;
    use crate::rpc::gpu_window::getters_finished;

    use crate::broadcast::windows::gpu_windows::tests::ALIVE;

    fn spec(world_size: u32) -> WindowSpec {
        WindowSpec {
            group_id: "ns/g".into(),
            world_size,
            ..Default::default()
        }
    }

    fn joiner(node: &str, role: Role) -> GpuJoiner {
        crate::broadcast::windows::gpu_windows::tests::joiner(node, role, 1)
    }

    /// A window of a putter on node a and getters on b and c, closed at its owner: the copy
    /// each member holds.
    fn closed_at_old_owner(clock: &ManualClock) -> GpuWindow {
        let mut old = GpuWindows::default();
        let mut last = None;
        for (node, role) in [
            ("a", Role::Putter),
            ("b", Role::Getter),
            ("c", Role::Getter),
        ] {
            let ((w, _), _) = old
                .join(spec(3), joiner(node, role), ALIVE, clock.now())
                .unwrap();
            last = Some(w);
        }
        let w = last.unwrap();
        assert!(w.closed && w.members.iter().any(|m| m.parent >= 0));
        w
    }

    #[test]
    fn a_closed_window_is_taken_up_from_a_members_copy_and_gathers_the_others_reports() {
        let clock = ManualClock::default();
        let copy = closed_at_old_owner(&clock);
        let mut next = GpuWindows::default();
        let (w, _) = next.adopt(&copy, ALIVE, clock.now()).unwrap();
        assert!(w.adopted && w.closed);
        assert_eq!(w.generation, copy.generation);
        let places = |w: &GpuWindow| -> Vec<(u64, u32, i64, String)> {
            let m = w.members.iter();
            m.map(|m| (m.id, m.rank, m.parent, m.node_id.clone()))
                .collect()
        };
        assert_eq!(places(&w), places(&copy), "the plan changed");
        next.finish(&w.group_id, w.generation, 1, "", clock.now())
            .unwrap();
        // Member c's copy shows b done, and c itself failed: believed where nothing is known.
        let mut c_copy = copy.clone();
        c_copy.members[2].state = GpuMemberState::GpuFailed as i32;
        c_copy.members[2].error = "its parent hung up".into();
        let (w, _) = next.adopt(&c_copy, ALIVE, clock.now()).unwrap();
        assert!(getters_finished(&w), "{w:?}");
        assert_eq!(w.members[1].state(), GpuMemberState::GpuDone);
        assert_eq!(w.members[2].error, "its parent hung up");
        // A copy showing less changes nothing.
        let (w, _) = next.adopt(&copy, ALIVE, clock.now()).unwrap();
        assert!(getters_finished(&w));
    }

    #[test]
    fn a_member_joining_again_keeps_its_place_and_a_closed_copy_replaces_a_forming_window() {
        let clock = ManualClock::default();
        let copy = closed_at_old_owner(&clock);
        let mut next = GpuWindows::default();
        // b had not heard of the close: it joins again, and a window forms around it.
        let ((w, _), b) = next
            .join_again(spec(3), joiner("b", Role::Getter), ALIVE, clock.now())
            .unwrap();
        assert!(!w.closed && b == 0 && w.generation != copy.generation);
        // a brings the closed window: it replaces the forming one.
        next.adopt(&copy, ALIVE, clock.now()).unwrap();
        let gone = next.view("ns/g", w.generation, ALIVE, clock.now());
        assert!(matches!(gone, Err(BroadcastError::NoWindow(_))));
        // b joins again and is given its place in the plan; a newcomer is refused, as at any
        // owner once the quorum has closed.
        let ((w, _), b) = next
            .join_again(spec(3), joiner("b", Role::Getter), ALIVE, clock.now())
            .unwrap();
        assert_eq!((b, w.generation, w.closed), (1, copy.generation, true));
        let newcomer = next.join_again(spec(3), joiner("d", Role::Getter), ALIVE, clock.now());
        assert!(
            matches!(newcomer, Err(BroadcastError::Busy(_))),
            "{newcomer:?}"
        );
    }

    #[test]
    fn a_group_that_moved_on_refuses_an_old_copy_and_a_copy_must_hang_together() {
        let clock = ManualClock::default();
        let copy = closed_at_old_owner(&clock);
        let mut next = GpuWindows::default();
        for (node, role) in [
            ("a", Role::Putter),
            ("b", Role::Getter),
            ("c", Role::Getter),
        ] {
            let mut j = joiner(node, role);
            j.registration = 8;
            next.join(spec(3), j, ALIVE, clock.now()).unwrap();
        }
        let refused = next.adopt(&copy, ALIVE, clock.now());
        assert!(
            matches!(refused, Err(BroadcastError::Busy(_))),
            "{refused:?}"
        );

        let mut fresh = GpuWindows::default();
        let mut open = copy.clone();
        open.closed = false;
        let mut loop_ = copy.clone();
        loop_.members[1].parent = 1;
        let mut gap = copy.clone();
        gap.members.remove(1);
        for bad in [open, loop_, gap] {
            let r = fresh.adopt(&bad, ALIVE, clock.now());
            assert!(matches!(r, Err(BroadcastError::Bad(_))), "{r:?}");
        }
    }
}
