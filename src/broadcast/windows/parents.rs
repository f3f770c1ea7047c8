//! Parent choice: who a getter receives from, nearest first, then shallowest, then least
//! loaded, never from inside its own subtree.

use super::members::{ParentRef, WindowState};
use super::nodes::NodeView;
use crate::proto::Source;
use crate::rpc::STORE;

impl WindowState {
    /// `m` and every member below it.
    pub(super) fn subtree(&self, m: usize) -> Vec<bool> {
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
    pub(super) fn assign(
        &mut self,
        m: usize,
        live: &dyn Fn(&str) -> Option<NodeView>,
    ) -> Option<(ParentRef, Source)> {
        let fanout = self.fanout();
        let me = self.members[m].joiner.clone();
        let exclude = self.members[m].failed_parents.clone();
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
            if exclude.iter().any(|f| f == label) {
                return;
            }
            if best.as_ref().is_none_or(|b| c.0 < b.0) {
                best = Some(c);
            }
        };
        // A seed on the node of another member still receiving the version: what that node
        // serves of it may be what its getter is receiving (a copy seeded earlier and removed
        // since leaves the registration), and its agent holds a request for such a block until
        // it arrives. Taken as seeds, such nodes closed cycles (three getters, each another's
        // parent, each waiting 10 s per hop: bench/chaos.sh). They are parents as members, with
        // the tree's checks. The getter's own node stays: it is asked only for what it holds.
        let receiving = self.receiving_nodes(me.version.as_ref(), Some(m));
        for s in seeds {
            if s.node_id != me.node_id && receiving.contains(&s.node_id) {
                continue;
            }
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
    pub(super) fn release(&mut self, m: usize) {
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
}
