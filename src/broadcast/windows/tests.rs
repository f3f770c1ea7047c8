//! Tests of windows, quorums and parent choice, on explicit moments of time.

use std::time::Duration;

use super::members::ParentRef;
use super::*;
use crate::clock::{Clock, SystemClock};
use crate::hash::Version;
use crate::proto::{Role, WindowSpec};

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
        reads: false,
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
    let now = SystemClock.now();
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
    let now = SystemClock.now();
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
    assert_eq!(j.deadline, Some((now + Duration::from_secs(5)).at));
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
    let now = SystemClock.now();
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
    let now = SystemClock.now();
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
    let now = SystemClock.now();
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
fn a_member_is_never_sent_back_to_a_parent_that_failed_it() {
    // a and b left with their copies but cannot serve them (their agents lost them): c stalls
    // on each in turn and must end at the store, not go back and forth between the two.
    let now = SystemClock.now();
    let mut b = Broadcasts::default();
    let s = spec("g");
    let mut gen = 0;
    for n in ["a", "b", "w"] {
        let j = b
            .join(s.clone(), getter(n, ""), &store(), &all_live, now)
            .unwrap();
        gen = j.window.generation;
    }
    b.leave("g", gen, 0, true, now).unwrap();
    b.leave("g", gen, 1, true, now).unwrap();
    let j = b
        .join(s, getter("c", ""), &store(), &all_live, now)
        .unwrap();
    let first = parent_of(&j);
    assert!(first == "a" || first == "b", "{first}");
    let second = b
        .new_parent("g", gen, j.member, &first, false, &all_live, now)
        .unwrap()
        .unwrap()
        .node_id;
    assert!(
        second != first && (second == "a" || second == "b"),
        "{second}"
    );
    let third = b
        .new_parent("g", gen, j.member, &second, false, &all_live, now)
        .unwrap()
        .unwrap();
    assert!(
        third.node_id.is_empty(),
        "back to {third:?} instead of the store"
    );
}

#[test]
fn dead_nodes_and_non_serving_getters_are_never_parents() {
    let now = SystemClock.now();
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
    let now = SystemClock.now();
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

/// `n` blocks, small enough that the swarm does not cut them (pieces are whole blocks).
fn pieces(n: u8) -> SwarmPieces {
    SwarmPieces {
        hashes: (0..n).flat_map(|i| [i; 32]).collect(),
        lens: vec![1024; n as usize],
        log2: 0,
    }
}

#[test]
fn serving_getters_of_a_version_of_several_blocks_join_its_swarm_and_learn_where_peers_are() {
    let now = SystemClock.now();
    let mut b = Broadcasts::default();
    let holder = Seed {
        node_id: "h".into(),
        data_addr: "addr-h".into(),
        zone: String::new(),
        origin: false,
    };
    let seeds = [store(), vec![holder]].concat();
    let j = b
        .join(spec("g"), getter("a", ""), &seeds, &all_live, now)
        .unwrap();
    let got = b
        .swarm_join("g", j.window.generation, j.member, pieces(8), &seeds)
        .unwrap();
    assert_eq!(got, pieces(8));
    assert_eq!(b.swarm_pieces("g", &Version([7; 32])), Some(pieces(8)));
    let req = crate::proto::SwarmSyncRequest {
        group_id: "g".into(),
        generation: j.window.generation,
        member: j.member,
        idle: 1,
        ..Default::default()
    };
    let (r, _) = b.swarm_sync(&req, &all_live, now).unwrap();
    assert_eq!(r.fetch.len(), 1);
    assert!(
        !r.fetch[0].store,
        "a node holds it all: nothing from the store"
    );
    let h = r
        .peers
        .iter()
        .find(|p| p.member == r.fetch[0].from)
        .expect("the holder");
    let src = h.source.as_ref().expect("where to reach it");
    assert_eq!(
        (src.node_id.as_str(), src.data_addr.as_str()),
        ("h", "addr-h")
    );
    let mail = b.swarm_mail("g", j.window.generation, j.member, &all_live);
    assert!(mail.fetch.is_empty(), "all was sent in the answer");

    // An explicit fanout is the swarm too, each member serving that many fetches at once; only
    // the benchmarks' switch keeps the tree for it.
    let fanout3 = || WindowSpec {
        fanout: 3,
        ..spec("t")
    };
    let t = b
        .join(fanout3(), getter("a", ""), &seeds, &all_live, now)
        .unwrap();
    assert_eq!(
        b.swarm_join("t", t.window.generation, t.member, pieces(8), &seeds)
            .unwrap(),
        pieces(8)
    );
    let swarm = &b.windows["t"].swarms[&Version([7; 32])];
    assert_eq!(swarm.board.uploads(), 3);
    assert_eq!(
        b.windows["g"].swarms[&Version([7; 32])].board.uploads(),
        crate::broadcast::swarm::DEFAULT_UPLOADS
    );
    let mut bench = Broadcasts::with_tree_for_fanout(true);
    let t = bench
        .join(fanout3(), getter("a", ""), &seeds, &all_live, now)
        .unwrap();
    assert!(bench
        .swarm_join("t", t.window.generation, t.member, pieces(8), &seeds)
        .unwrap()
        .is_empty());
    // A getter that serves nothing and a version of few blocks keep the tree.
    let quiet = Joiner {
        serves: false,
        ..getter("c", "")
    };
    let q = b.join(spec("q"), quiet, &seeds, &all_live, now).unwrap();
    assert!(b
        .swarm_join("q", q.window.generation, q.member, pieces(8), &seeds)
        .unwrap()
        .is_empty());
    let f = b
        .join(spec("f"), getter("a", ""), &seeds, &all_live, now)
        .unwrap();
    assert!(b
        .swarm_join("f", f.window.generation, f.member, pieces(2), &seeds)
        .unwrap()
        .is_empty());
    // A sync of a member in no swarm is refused, not answered with nothing.
    let bad = crate::proto::SwarmSyncRequest {
        group_id: "f".into(),
        generation: f.window.generation,
        member: f.member,
        ..Default::default()
    };
    assert!(b.swarm_sync(&bad, &all_live, now).is_err());
}

fn holders(nodes: &[&str]) -> Vec<Seed> {
    let mut seeds = store();
    for n in nodes {
        seeds.push(Seed {
            node_id: n.to_string(),
            data_addr: format!("addr-{n}"),
            zone: String::new(),
            origin: false,
        });
    }
    seeds
}

/// Nodes registered as holding the version (earlier getters seeded it) whose getters join a
/// window for it again: what they hold may be what they are receiving, so none is another's
/// seed (bench/chaos.sh saw three such getters each given another's node, waiting 10 s per
/// hop). A getter's own node stays its nearest (it asks it only for what it holds now).
#[test]
fn a_holder_whose_node_is_receiving_the_version_again_is_no_seed_for_the_others() {
    let now = SystemClock.now();
    let mut b = Broadcasts::default();
    let seeds = holders(&["a", "b", "c"]);
    let s = spec("g");
    // They join at once; each is given its own node, which says "not here" at once (its copy
    // is gone), and asks again.
    let mut joined = Vec::new();
    for n in ["a", "b", "c"] {
        let j = b
            .join(s.clone(), getter(n, ""), &seeds, &all_live, now)
            .unwrap();
        assert_eq!(parent_of(&j), n, "its own node first");
        joined.push((n, j));
    }
    for (n, j) in &joined {
        let p = b
            .new_parent("g", j.window.generation, j.member, n, false, &all_live, now)
            .unwrap()
            .map_or(STORE.to_string(), |p| p.node_id);
        let p = if p.is_empty() { STORE.to_string() } else { p };
        match &b.windows["g"].members[j.member as usize].parent {
            Some(ParentRef::Seed(l)) => assert_eq!(l, STORE, "{n} was given {p} as a seed"),
            Some(ParentRef::Member(_)) => {}
            None => panic!("{n}: no parent"),
        }
    }
    // And no two of them are each other's parents.
    let parents: Vec<Option<usize>> = b.windows["g"]
        .members
        .iter()
        .map(|x| match x.parent {
            Some(ParentRef::Member(i)) => Some(i),
            _ => None,
        })
        .collect();
    for (i, p) in parents.iter().enumerate() {
        if let Some(p) = p {
            assert_ne!(parents[*p], Some(i), "{i} and {p} wait on each other");
        }
    }

    // The swarm: holders whose nodes receive the version again are dropped from the board.
    let mut b = Broadcasts::default();
    let mut ids = Vec::new();
    for n in ["a", "b"] {
        let j = b
            .join(spec("w"), getter(n, ""), &seeds, &all_live, now)
            .unwrap();
        b.swarm_join("w", j.window.generation, j.member, pieces(8), &seeds)
            .unwrap();
        ids.push((j.window.generation, j.member));
    }
    for (generation, member) in ids {
        let req = crate::proto::SwarmSyncRequest {
            group_id: "w".into(),
            generation,
            member,
            idle: 1,
            ..Default::default()
        };
        let (r, _) = b.swarm_sync(&req, &all_live, now).unwrap();
        for f in r.fetch.iter().filter(|f| !f.store) {
            let p = r.peers.iter().find(|p| p.member == f.from).unwrap();
            let node = p.source.as_ref().map_or("", |s| s.node_id.as_str());
            assert_eq!(node, "c", "member {member} fetches from {node}");
        }
    }
}

#[test]
fn a_swarm_of_few_large_blocks_trades_pieces_readers_keep_to_whole_blocks() {
    let now = SystemClock.now();
    // Two blocks of 4 MiB: pieces of 64 KiB, 128 of them.
    let big = SwarmPieces {
        hashes: [[1u8; 32], [2u8; 32]].concat(),
        lens: vec![4 << 20; 2],
        log2: 0,
    };
    let join = |b: &mut Broadcasts, group: &str, who: Joiner| {
        let j = b.join(spec(group), who, &store(), &all_live, now).unwrap();
        b.swarm_join(group, j.window.generation, j.member, big.clone(), &store())
            .unwrap()
    };
    let mut b = Broadcasts::default();
    let got = join(&mut b, "g", getter("a", ""));
    assert_eq!((got.log2, got.lens.clone()), (16, big.lens.clone()));
    // A reader could not serve pieces before its block is whole: not in this swarm.
    let reader = Joiner {
        reads: true,
        ..getter("r", "")
    };
    assert!(join(&mut b, "g", reader.clone()).is_empty());
    // A swarm a reader starts trades whole blocks; two are too few for a swarm at all.
    assert!(join(&mut Broadcasts::default(), "r", reader).is_empty());
    // The benchmarks' switch: whole blocks.
    let mut b = Broadcasts::default().with_whole_blocks(true);
    assert!(join(&mut b, "w", getter("a", "")).is_empty());
}

#[test]
fn a_store_on_an_object_store_sends_several_pieces_at_once() {
    let now = SystemClock.now();
    let store_fetches = |b: &mut Broadcasts| {
        let j = b
            .join(spec("g"), getter("a", ""), &store(), &all_live, now)
            .unwrap();
        b.swarm_join("g", j.window.generation, j.member, pieces(8), &store())
            .unwrap();
        let req = crate::proto::SwarmSyncRequest {
            group_id: "g".into(),
            generation: j.window.generation,
            member: j.member,
            idle: 8,
            ..Default::default()
        };
        let (r, _) = b.swarm_sync(&req, &all_live, now).unwrap();
        assert!(r.fetch.iter().all(|f| f.store), "{r:?}");
        r.fetch.len()
    };
    assert_eq!(
        store_fetches(&mut Broadcasts::default()),
        crate::broadcast::swarm::SEED_SLOTS
    );
    let objects = crate::broadcast::swarm::OBJECT_SEED_SLOTS;
    let mut b = Broadcasts::default().with_seed_slots(objects);
    assert_eq!(store_fetches(&mut b), objects);
}
