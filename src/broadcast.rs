//! Broadcast windows and fan-out trees, kept in memory by the store server.
//!
//! A window gathers the participants of one distribution under a `group_id`. Its quorum closes
//! when ANY of its criteria is met: `world_size` participants joined, every address of `ips`
//! joined, or `timeout` passed since it opened. Putters may wait for the quorum; getters of files
//! do not: each is given a parent the moment it joins (rolling), among the nodes that already
//! hold the version (seeds: the store, the origin, earlier getters) and the participants that are
//! receiving it, at most `fanout` children each. Nearer is better (same node, then same zone),
//! then shallower, then less loaded. A child whose parent fails asks again and gets a parent
//! outside its own subtree, so that no one ever waits on its own descendants.
//!
//! Getters without window settings join an implicit window per version with no quorum: that is
//! how concurrent getters spread over the sources instead of all hitting the store.
//!
//! Everything here is plain state driven with an explicit `now`, so tests run it without a clock.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::hash::Version;
use crate::proto::{Member, Role, Source, Window, WindowSpec};

pub const DEFAULT_FANOUT: u32 = 50;
/// A window no one has touched for this long is forgotten.
pub const WINDOW_IDLE: Duration = Duration::from_secs(600);
/// The label of the store server as a parent.
pub const STORE: &str = "store";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BroadcastError {
    #[error("no broadcast window {0}")]
    NoWindow(String),
    #[error("window {0} has no member {1}")]
    NoMember(String, u64),
    #[error("bad window request: {0}")]
    Bad(String),
}

/// A node that holds a whole version already: the store server (empty `node_id`), the origin of
/// a local publication, or a node that fetched it before.
#[derive(Clone, Debug)]
pub struct Seed {
    pub node_id: String,
    pub data_addr: String,
    pub zone: String,
    /// The store or the origin: asked only when no other holder is as near, to spare it.
    pub origin: bool,
}

impl Seed {
    fn label(&self) -> &str {
        if self.node_id.is_empty() {
            STORE
        } else {
            &self.node_id
        }
    }
}

/// A live node as the server's lease table knows it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub data_addr: String,
    pub zone: String,
}

/// Who is joining.
#[derive(Clone, Debug, Default)]
pub struct Joiner {
    pub node_id: String,
    pub zone: String,
    pub ip: String,
    pub role: Role,
    pub version: Option<Version>,
    pub serves: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum ParentRef {
    Seed(String),
    Member(usize),
}

#[derive(Debug)]
struct MemberState {
    joiner: Joiner,
    parent: Option<ParentRef>,
    depth: u32,
    children: u32,
    done: bool,
    failed: bool,
    left: bool,
}

#[derive(Debug)]
struct WindowState {
    group_id: String,
    generation: u64,
    spec: WindowSpec,
    opened: Instant,
    opened_unix_ms: i64,
    closed_by: Option<&'static str>,
    closed_unix_ms: i64,
    touched: Instant,
    members: Vec<MemberState>,
    /// Children of each seed, by label.
    seed_load: HashMap<String, u32>,
    /// Nodes reported unreachable; never offered again in this window.
    dead: Vec<String>,
    /// The holders of each version, as of the latest join for it.
    seeds: HashMap<Version, Vec<Seed>>,
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl WindowState {
    fn new(group_id: String, generation: u64, spec: WindowSpec, now: Instant) -> Self {
        WindowState {
            group_id,
            generation,
            spec,
            opened: now,
            opened_unix_ms: unix_ms(),
            closed_by: None,
            closed_unix_ms: 0,
            touched: now,
            members: Vec::new(),
            seed_load: HashMap::new(),
            dead: Vec::new(),
            seeds: HashMap::new(),
        }
    }

    fn fanout(&self) -> u32 {
        if self.spec.fanout == 0 {
            DEFAULT_FANOUT
        } else {
            self.spec.fanout
        }
    }

    fn has_criteria(&self) -> bool {
        self.spec.timeout_ms > 0 || self.spec.world_size > 0 || !self.spec.ips.is_empty()
    }

    /// Closes the quorum if a criterion is met; the first one met is recorded.
    fn update_quorum(&mut self, now: Instant) {
        if self.closed_by.is_some() {
            return;
        }
        let by = if self.spec.world_size > 0 && self.members.len() >= self.spec.world_size as usize
        {
            Some("world_size")
        } else if !self.spec.ips.is_empty()
            && self
                .spec
                .ips
                .iter()
                .all(|ip| self.members.iter().any(|m| &m.joiner.ip == ip))
        {
            Some("ips")
        } else if self.spec.timeout_ms > 0
            && now.duration_since(self.opened) >= Duration::from_millis(self.spec.timeout_ms)
        {
            Some("timeout")
        } else {
            None
        };
        if let Some(by) = by {
            self.closed_by = Some(by);
            self.closed_unix_ms = unix_ms();
        }
    }

    /// When the quorum closes by timeout, if nothing closes it earlier.
    fn deadline(&self) -> Option<Instant> {
        (self.closed_by.is_none() && self.spec.timeout_ms > 0)
            .then(|| self.opened + Duration::from_millis(self.spec.timeout_ms))
    }

    /// Every member has finished; a new join starts the next generation.
    fn finished(&self) -> bool {
        !self.members.is_empty()
            && self.members.iter().all(|m| m.left)
            && (self.closed_by.is_some() || !self.has_criteria())
    }

    /// `m` and every member below it.
    fn subtree(&self, m: usize) -> Vec<bool> {
        let mut inside = vec![false; self.members.len()];
        inside[m] = true;
        // Members join after their parents, so one pass in join order would not see re-parented
        // members; iterate to a fixed point instead (windows are small).
        loop {
            let mut changed = false;
            for (i, x) in self.members.iter().enumerate() {
                if let Some(ParentRef::Member(p)) = x.parent {
                    if inside[p] && !inside[i] {
                        inside[i] = true;
                        changed = true;
                    }
                }
            }
            if !changed {
                return inside;
            }
        }
    }

    /// Picks a parent for member `m` and records it.
    fn assign(
        &mut self,
        m: usize,
        live: &dyn Fn(&str) -> Option<NodeView>,
        exclude: Option<&str>,
    ) -> Option<(ParentRef, Source)> {
        let fanout = self.fanout();
        let me = self.members[m].joiner.clone();
        let no_seeds = Vec::new();
        let seeds = me
            .version
            .as_ref()
            .and_then(|v| self.seeds.get(v))
            .unwrap_or(&no_seeds);
        let class = |node: &str, zone: &str| -> u8 {
            if !me.node_id.is_empty() && node == me.node_id {
                0
            } else if !me.zone.is_empty() && zone == me.zone {
                1
            } else {
                2
            }
        };
        // ((class, depth, origin, load), parent, source)
        type Rank = (u8, u32, bool, u32);
        let mut best: Option<(Rank, ParentRef, Source)> = None;
        let mut consider = |c: (Rank, ParentRef, Source)| {
            let label = if c.2.node_id.is_empty() {
                STORE
            } else {
                c.2.node_id.as_str()
            };
            if exclude == Some(label) {
                return;
            }
            if best.as_ref().is_none_or(|b| c.0 < b.0) {
                best = Some(c);
            }
        };
        for s in seeds {
            let label = s.label().to_string();
            let load = self.seed_load.get(&label).copied().unwrap_or(0);
            if load >= fanout
                || self.dead.contains(&label)
                || (!s.node_id.is_empty() && live(&s.node_id).is_none())
            {
                continue;
            }
            consider((
                (class(&s.node_id, &s.zone), 0, s.origin, load),
                ParentRef::Seed(label),
                Source {
                    node_id: s.node_id.clone(),
                    data_addr: s.data_addr.clone(),
                    zone: s.zone.clone(),
                    origin: false,
                },
            ));
        }
        let inside = self.subtree(m);
        for (i, x) in self.members.iter().enumerate() {
            if inside[i]
                || !x.joiner.serves
                || x.failed
                || x.children >= fanout
                || x.joiner.version != me.version
                || x.joiner.node_id.is_empty()
                || self.dead.contains(&x.joiner.node_id)
                || (x.left && !x.done)
            {
                continue;
            }
            // A parent still receiving must itself have a parent to receive from.
            if !x.done && x.parent.is_none() {
                continue;
            }
            let Some(view) = live(&x.joiner.node_id) else {
                continue;
            };
            consider((
                // A member that is done holds everything, as a seed does.
                (
                    class(&x.joiner.node_id, &view.zone),
                    if x.done { 0 } else { x.depth },
                    false,
                    x.children,
                ),
                ParentRef::Member(i),
                Source {
                    node_id: x.joiner.node_id.clone(),
                    data_addr: view.data_addr,
                    zone: view.zone,
                    origin: false,
                },
            ));
        }
        let ((_, depth, _, _), parent, source) = best?;
        match &parent {
            ParentRef::Seed(label) => *self.seed_load.entry(label.clone()).or_default() += 1,
            ParentRef::Member(i) => self.members[*i].children += 1,
        }
        let me = &mut self.members[m];
        me.parent = Some(parent.clone());
        me.depth = depth + 1;
        Some((parent, source))
    }

    /// Lets go of member `m`'s parent.
    fn release(&mut self, m: usize) {
        match self.members[m].parent.take() {
            Some(ParentRef::Seed(label)) => {
                if let Some(l) = self.seed_load.get_mut(&label) {
                    *l = l.saturating_sub(1);
                }
            }
            Some(ParentRef::Member(i)) => {
                let p = &mut self.members[i];
                p.children = p.children.saturating_sub(1);
            }
            None => {}
        }
    }

    fn parent_label(&self, p: &ParentRef) -> String {
        match p {
            ParentRef::Seed(l) => l.clone(),
            ParentRef::Member(i) => self.members[*i].joiner.node_id.clone(),
        }
    }

    fn to_proto(&self) -> Window {
        Window {
            group_id: self.group_id.clone(),
            generation: self.generation,
            spec: Some(self.spec.clone()),
            members: self
                .members
                .iter()
                .enumerate()
                .map(|(i, m)| Member {
                    id: i as u64,
                    node_id: m.joiner.node_id.clone(),
                    ip: m.joiner.ip.clone(),
                    role: m.joiner.role as i32,
                    version: m.joiner.version.map(|v| v.0.to_vec()).unwrap_or_default(),
                    parent: m
                        .parent
                        .as_ref()
                        .map(|p| self.parent_label(p))
                        .unwrap_or_default(),
                    done: m.done,
                    failed: m.failed,
                    children: m.children,
                })
                .collect(),
            closed: self.closed_by.is_some(),
            closed_by: self.closed_by.unwrap_or_default().to_string(),
            opened_unix_ms: self.opened_unix_ms,
            closed_unix_ms: self.closed_unix_ms,
        }
    }
}

/// What a join returns.
#[derive(Debug)]
pub struct Joined {
    pub window: Window,
    pub member: u64,
    pub parent: Option<Source>,
    /// When the quorum closes by timeout, if it is still open.
    pub deadline: Option<Instant>,
}

/// Every window the server knows.
#[derive(Default)]
pub struct Broadcasts {
    windows: HashMap<String, WindowState>,
    generations: u64,
}

/// The group of a window given no explicit id: the same for every participant of one key.
pub fn default_group(namespace: &str, key: &str) -> String {
    let h = blake3::hash(format!("{namespace}\0{key}").as_bytes());
    format!("k-{}", &h.to_hex()[..16])
}

/// The implicit window of getters that gave no window settings.
pub fn implicit_group(version: &Version) -> String {
    format!("v-{}", &version.hex()[..16])
}

impl Broadcasts {
    fn sweep(&mut self, now: Instant) {
        self.windows
            .retain(|_, w| now.duration_since(w.touched) < WINDOW_IDLE);
    }

    /// Adds a participant; a getter is given its parent at once.
    pub fn join(
        &mut self,
        spec: WindowSpec,
        joiner: Joiner,
        seeds: &[Seed],
        live: &dyn Fn(&str) -> Option<NodeView>,
        now: Instant,
    ) -> Result<Joined, BroadcastError> {
        if spec.group_id.is_empty() {
            return Err(BroadcastError::Bad("group id missing".into()));
        }
        self.sweep(now);
        let fresh = match self.windows.get(&spec.group_id) {
            None => true,
            Some(w) => w.finished(),
        };
        if fresh {
            self.generations += 1;
            let w = WindowState::new(spec.group_id.clone(), self.generations, spec.clone(), now);
            self.windows.insert(spec.group_id.clone(), w);
        }
        let Some(w) = self.windows.get_mut(&spec.group_id) else {
            return Err(BroadcastError::NoWindow(spec.group_id));
        };
        w.touched = now;
        if let Some(v) = joiner.version {
            w.seeds.insert(v, seeds.to_vec());
        }
        let getter = joiner.role == Role::Getter;
        w.members.push(MemberState {
            joiner,
            parent: None,
            depth: 0,
            children: 0,
            done: !getter,
            failed: false,
            left: false,
        });
        let m = w.members.len() - 1;
        let parent = if getter {
            w.assign(m, live, None).map(|(_, s)| s)
        } else {
            None
        };
        w.update_quorum(now);
        Ok(Joined {
            window: w.to_proto(),
            member: m as u64,
            parent,
            deadline: w.deadline(),
        })
    }

    fn member(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
    ) -> Result<(&mut WindowState, usize), BroadcastError> {
        let w = self
            .windows
            .get_mut(group)
            .filter(|w| w.generation == generation)
            .ok_or_else(|| BroadcastError::NoWindow(group.to_string()))?;
        let m = member as usize;
        if m >= w.members.len() {
            return Err(BroadcastError::NoMember(group.to_string(), member));
        }
        Ok((w, m))
    }

    /// A new parent for a member whose parent failed. `unreachable` marks that parent dead for
    /// the whole window; a parent that only stalled stays available to others.
    #[allow(clippy::too_many_arguments)]
    pub fn new_parent(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        failed: &str,
        unreachable: bool,
        live: &dyn Fn(&str) -> Option<NodeView>,
        now: Instant,
    ) -> Result<Option<Source>, BroadcastError> {
        let (w, m) = self.member(group, generation, member)?;
        w.touched = now;
        if unreachable && !failed.is_empty() {
            if !w.dead.iter().any(|d| d == failed) {
                w.dead.push(failed.to_string());
            }
            // The dead node's own downloads are over too: their parents get their slots back.
            for i in 0..w.members.len() {
                if w.members[i].joiner.node_id == failed && i != m {
                    w.members[i].failed = true;
                    w.release(i);
                }
            }
        }
        w.release(m);
        Ok(w.assign(m, live, Some(failed).filter(|f| !f.is_empty()))
            .map(|(_, s)| s))
    }

    /// A member is finished: with a verified copy (`done`) or not.
    pub fn leave(
        &mut self,
        group: &str,
        generation: u64,
        member: u64,
        done: bool,
        now: Instant,
    ) -> Result<(), BroadcastError> {
        let (w, m) = self.member(group, generation, member)?;
        w.touched = now;
        w.release(m);
        let x = &mut w.members[m];
        x.left = true;
        x.done = x.done || done;
        // A getter that served others and gave up is failed; a reader that serves no one (a
        // mount's reader closing a file it read in part) just leaves.
        if !done && x.joiner.serves {
            x.failed = true;
        }
        Ok(())
    }

    /// The window as it stands, with its quorum brought up to date.
    pub fn window(&mut self, group: &str, now: Instant) -> Option<(Window, Option<Instant>)> {
        let w = self.windows.get_mut(group)?;
        w.update_quorum(now);
        Some((w.to_proto(), w.deadline()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(group: &str) -> WindowSpec {
        WindowSpec {
            group_id: group.into(),
            ..Default::default()
        }
    }

    fn getter(node: &str, zone: &str) -> Joiner {
        Joiner {
            node_id: node.into(),
            zone: zone.into(),
            ip: format!("ip-{node}"),
            role: Role::Getter,
            version: Some(Version([7; 32])),
            serves: true,
        }
    }

    fn store() -> Vec<Seed> {
        vec![Seed {
            node_id: String::new(),
            data_addr: String::new(),
            zone: String::new(),
            origin: true,
        }]
    }

    fn all_live(n: &str) -> Option<NodeView> {
        Some(NodeView {
            data_addr: format!("addr-{n}"),
            zone: if n.starts_with('z') {
                "z".into()
            } else {
                String::new()
            },
        })
    }

    fn parent_of(j: &Joined) -> String {
        let p = j.parent.as_ref().expect("a parent");
        if p.node_id.is_empty() {
            STORE.into()
        } else {
            p.node_id.clone()
        }
    }

    #[test]
    fn quorum_closes_by_world_size() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = WindowSpec {
            world_size: 3,
            ..spec("g")
        };
        let put = Joiner {
            role: Role::Putter,
            ..getter("p", "")
        };
        let j = b.join(s.clone(), put, &store(), &all_live, now).unwrap();
        assert!(!j.window.closed);
        assert!(j.parent.is_none(), "putters get no parent");
        b.join(s.clone(), getter("a", ""), &store(), &all_live, now)
            .unwrap();
        let j = b
            .join(s, getter("b", ""), &store(), &all_live, now)
            .unwrap();
        assert!(j.window.closed);
        assert_eq!(j.window.closed_by, "world_size");
        assert_eq!(j.window.members.len(), 3);
    }

    #[test]
    fn quorum_closes_by_ips_and_by_timeout() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = WindowSpec {
            ips: vec!["ip-a".into(), "ip-b".into()],
            timeout_ms: 5000,
            ..spec("g")
        };
        let j = b
            .join(s.clone(), getter("a", ""), &store(), &all_live, now)
            .unwrap();
        assert!(!j.window.closed);
        assert_eq!(j.deadline, Some(now + Duration::from_secs(5)));
        let j = b
            .join(s, getter("b", ""), &store(), &all_live, now)
            .unwrap();
        assert_eq!(j.window.closed_by, "ips");

        let s = WindowSpec {
            timeout_ms: 1000,
            world_size: 10,
            ..spec("t")
        };
        b.join(s, getter("a", ""), &store(), &all_live, now)
            .unwrap();
        let (w, _) = b.window("t", now + Duration::from_millis(999)).unwrap();
        assert!(!w.closed);
        let (w, deadline) = b.window("t", now + Duration::from_millis(1000)).unwrap();
        assert_eq!(w.closed_by, "timeout");
        assert!(deadline.is_none());
    }

    #[test]
    fn fanout_is_respected_and_the_tree_fills_shallow_first() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = WindowSpec {
            fanout: 2,
            ..spec("g")
        };
        let mut parents = Vec::new();
        for i in 0..14 {
            let j = b
                .join(
                    s.clone(),
                    getter(&format!("n{i}"), ""),
                    &store(),
                    &all_live,
                    now,
                )
                .unwrap();
            parents.push(parent_of(&j));
        }
        // The store takes two, each of those two more, and so on: a binary tree.
        assert_eq!(&parents[..2], &["store", "store"]);
        assert_eq!(&parents[2..6], &["n0", "n1", "n0", "n1"]);
        let (w, _) = b.window("g", now).unwrap();
        assert!(w.members.iter().all(|m| m.children <= 2));
        let depth_of = |name: &str| {
            let mut d = 0;
            let mut cur = name.to_string();
            while cur != STORE {
                cur = w
                    .members
                    .iter()
                    .find(|m| m.node_id == cur)
                    .unwrap()
                    .parent
                    .clone();
                d += 1;
            }
            d
        };
        assert_eq!(depth_of("n13"), 3);
    }

    #[test]
    fn nearer_parents_first_same_node_then_zone() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = spec("g");
        b.join(s.clone(), getter("a", ""), &store(), &all_live, now)
            .unwrap();
        b.join(s.clone(), getter("z1", "z"), &store(), &all_live, now)
            .unwrap();
        let j = b
            .join(s.clone(), getter("z2", "z"), &store(), &all_live, now)
            .unwrap();
        assert_eq!(parent_of(&j), "z1", "same zone beats the store");
        let j = b
            .join(s, getter("a", ""), &store(), &all_live, now)
            .unwrap();
        assert_eq!(parent_of(&j), "a", "same node beats everything");
    }

    #[test]
    fn failover_moves_children_outside_their_subtree() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = WindowSpec {
            fanout: 1,
            ..spec("g")
        };
        // A chain: store -> a -> b -> c.
        let mut gen = 0;
        for n in ["a", "b", "c"] {
            let j = b
                .join(s.clone(), getter(n, ""), &store(), &all_live, now)
                .unwrap();
            gen = j.window.generation;
        }
        // a dies: b moves to the store (free again once a is gone), never to its child c.
        let p = b
            .new_parent("g", gen, 1, "a", true, &all_live, now)
            .unwrap()
            .unwrap();
        assert!(p.node_id.is_empty(), "b goes to the store, got {p:?}");
        let (w, _) = b.window("g", now).unwrap();
        assert!(w.members[0].failed);
        // b stalls for c, which asks again: a is dead, b is excluded, the store is full.
        let p = b
            .new_parent("g", gen, 2, "b", false, &all_live, now)
            .unwrap();
        assert!(p.is_none(), "{p:?}");
        // When b is done, the store frees up.
        b.leave("g", gen, 1, true, now).unwrap();
        let p = b
            .new_parent("g", gen, 2, "b", false, &all_live, now)
            .unwrap()
            .unwrap();
        assert!(p.node_id.is_empty());
    }

    #[test]
    fn dead_nodes_and_non_serving_getters_are_never_parents() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let s = spec("g");
        let quiet = Joiner {
            serves: false,
            ..getter("q", "")
        };
        b.join(s.clone(), quiet, &store(), &all_live, now).unwrap();
        b.join(s.clone(), getter("gone", ""), &store(), &all_live, now)
            .unwrap();
        let live = |n: &str| if n == "gone" { None } else { all_live(n) };
        let j = b.join(s, getter("x", ""), &store(), &live, now).unwrap();
        assert_eq!(parent_of(&j), STORE);
    }

    #[test]
    fn a_finished_window_starts_a_new_generation_and_idle_ones_are_forgotten() {
        let now = Instant::now();
        let mut b = Broadcasts::default();
        let j = b
            .join(spec("g"), getter("a", ""), &store(), &all_live, now)
            .unwrap();
        b.leave("g", j.window.generation, 0, true, now).unwrap();
        let k = b
            .join(spec("g"), getter("b", ""), &store(), &all_live, now)
            .unwrap();
        assert!(k.window.generation > j.window.generation);
        assert_eq!(k.window.members.len(), 1);
        assert!(b.window("g", now).is_some());
        b.join(
            spec("other"),
            getter("c", ""),
            &store(),
            &all_live,
            now + WINDOW_IDLE,
        )
        .unwrap();
        assert!(b.window("g", now + WINDOW_IDLE).is_none());
        assert_eq!(
            b.leave("g", k.window.generation, 0, true, now),
            Err(BroadcastError::NoWindow("g".into()))
        );
    }
}
