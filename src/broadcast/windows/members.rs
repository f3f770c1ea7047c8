//! One window: its members, its quorum, and how it shows on the wire.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::nodes::{Joiner, Seed};
use super::quorum::quorum;
use super::version_swarm::Swarm;
use crate::clock::Moment;
use crate::hash::Version;
use crate::proto::{Member, Role, Window, WindowSpec};
use crate::rpc::DEFAULT_FANOUT;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum ParentRef {
    Seed(String),
    Member(usize),
}

#[derive(Debug)]
pub(super) struct MemberState {
    pub(super) joiner: Joiner,
    pub(super) parent: Option<ParentRef>,
    pub(super) depth: u32,
    pub(super) children: u32,
    pub(super) done: bool,
    pub(super) failed: bool,
    pub(super) left: bool,
    /// Parents (node ids, or the store's label) that failed this member: never offered to it
    /// again, so two parents that both stall cannot send it back and forth past its deadline.
    pub(super) failed_parents: Vec<String>,
}

impl MemberState {
    /// A getter of `version` still receiving it.
    pub(super) fn receiving(&self, version: Option<&Version>) -> bool {
        self.joiner.role == Role::Getter
            && !self.done
            && !self.left
            && !self.failed
            && self.joiner.version.as_ref() == version
            && !self.joiner.node_id.is_empty()
    }
}

#[derive(Debug)]
pub(super) struct WindowState {
    pub(super) group_id: String,
    pub(super) generation: u64,
    pub(super) spec: WindowSpec,
    pub(super) opened: Instant,
    pub(super) opened_unix_ms: i64,
    pub(super) closed_by: Option<&'static str>,
    pub(super) closed_unix_ms: i64,
    pub(super) touched: Instant,
    pub(super) members: Vec<MemberState>,
    /// Children of each seed, by label.
    pub(super) seed_load: HashMap<String, u32>,
    /// Nodes reported unreachable; never offered again in this window.
    pub(super) dead: Vec<String>,
    /// The holders of each version, as of the latest join for it.
    pub(super) seeds: HashMap<Version, Vec<Seed>>,
    /// The swarm of each version its getters fetch.
    pub(super) swarms: HashMap<Version, Swarm>,
}

impl WindowState {
    /// The nodes of the getters still receiving `version`, but for member `except`.
    pub(super) fn receiving_nodes(
        &self,
        version: Option<&Version>,
        except: Option<usize>,
    ) -> Vec<String> {
        self.members
            .iter()
            .enumerate()
            .filter(|&(i, x)| Some(i) != except && x.receiving(version))
            .map(|(_, x)| x.joiner.node_id.clone())
            .collect()
    }

    pub(super) fn new(group_id: String, generation: u64, spec: WindowSpec, now: Moment) -> Self {
        WindowState {
            group_id,
            generation,
            spec,
            opened: now.at,
            opened_unix_ms: now.unix_ms,
            closed_by: None,
            closed_unix_ms: 0,
            touched: now.at,
            members: Vec::new(),
            seed_load: HashMap::new(),
            dead: Vec::new(),
            seeds: HashMap::new(),
            swarms: HashMap::new(),
        }
    }

    pub(super) fn fanout(&self) -> u32 {
        if self.spec.fanout == 0 {
            DEFAULT_FANOUT
        } else {
            self.spec.fanout
        }
    }

    pub(super) fn has_criteria(&self) -> bool {
        self.spec.timeout_ms > 0 || self.spec.world_size > 0 || !self.spec.ips.is_empty()
    }

    /// Closes the quorum if a criterion is met; the first one met is recorded.
    pub(super) fn update_quorum(&mut self, now: Moment) {
        if self.closed_by.is_some() {
            return;
        }
        let ips: Vec<&str> = self.members.iter().map(|m| m.joiner.ip.as_str()).collect();
        if let Some(by) = quorum(&self.spec, &ips, now.at.duration_since(self.opened)) {
            self.closed_by = Some(by);
            self.closed_unix_ms = now.unix_ms;
        }
    }

    /// When the quorum closes by timeout, if nothing closes it earlier.
    pub(super) fn deadline(&self) -> Option<Instant> {
        (self.closed_by.is_none() && self.spec.timeout_ms > 0)
            .then(|| self.opened + Duration::from_millis(self.spec.timeout_ms))
    }

    /// Every member has finished; a new join starts the next generation.
    pub(super) fn finished(&self) -> bool {
        !self.members.is_empty()
            && self.members.iter().all(|m| m.left)
            && (self.closed_by.is_some() || !self.has_criteria())
    }

    /// Takes every swarm member on `node` out of the window's swarms (it was found dead).
    pub(super) fn swarm_node_dead(&mut self, node: &str) {
        let ids: Vec<u64> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.joiner.node_id == node)
            .map(|(i, _)| i as u64)
            .collect();
        for s in self.swarms.values_mut() {
            s.node_dead(&ids, node);
        }
    }

    /// Member `m` left: out of its swarm, unless it holds a copy its node serves.
    pub(super) fn swarm_leave(&mut self, m: usize, done: bool) {
        let Some(version) = self.members[m].joiner.version else {
            return;
        };
        if let Some(s) = self.swarms.get_mut(&version) {
            s.board.leave(m as u64, done);
        }
    }

    pub(super) fn parent_label(&self, p: &ParentRef) -> String {
        match p {
            ParentRef::Seed(l) => l.clone(),
            ParentRef::Member(i) => self.members[*i].joiner.node_id.clone(),
        }
    }

    pub(super) fn to_proto(&self) -> Window {
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
