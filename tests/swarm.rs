//! The swarm with real processes, at the defaults (no window flags): a getter takes blocks from
//! several members at once, a late joiner takes them from the nodes that hold them, eight
//! getters at once cost the store about one copy, and a member killed mid-transfer costs the
//! others only what was in flight from it.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

const MIB: usize = 1 << 20;

/// The sources a `kt get --json` answer took bytes from, with their bytes.
fn sources(got: &serde_json::Value) -> Vec<(String, u64)> {
    got["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap().to_string(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_late_joiner_takes_blocks_from_every_node_that_holds_them_and_none_from_the_store() {
    let c = Cluster::new("127.0.0.215");
    let (data, _) = c.publish_random("w", 4 * MIB, 21, "65536");
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| c.agent(&format!("127.0.0.{}", 216 + i), &format!("node-{i}")))
        .collect();
    for (i, a) in agents[..2].iter().enumerate() {
        let d = c.path(&format!("d{i}"));
        let got = c.json(Some(a), &["get", "w", "-d", d.to_str().unwrap()]);
        assert!(fs::read(&d).unwrap() == data);
        assert_eq!(got["seeded"], true, "{got}");
    }
    let d = c.path("late");
    let got = c.json(Some(&agents[2]), &["get", "w", "-d", d.to_str().unwrap()]);
    assert!(fs::read(&d).unwrap() == data);
    let from = sources(&got);
    let total: u64 = from.iter().map(|(_, b)| b).sum();
    assert_eq!(total, data.len() as u64, "{got}");
    assert_eq!(bytes_from(&got, "store"), 0, "two nodes hold it: {got}");
    for node in ["node-0", "node-1"] {
        assert!(bytes_from(&got, node) > 0, "nothing from {node}: {got}");
    }
    // The report names the members it fetched from.
    let used = got["broadcast"][0]["parents"].as_array().unwrap().len();
    assert!(used >= 2, "{got}");
}

#[test]
fn eight_getters_at_once_cost_the_store_about_one_copy() {
    let c = Cluster::new("127.0.0.219");
    let (data, _) = c.publish_random("w", 4 * MIB, 22, "65536");
    let agents: Vec<AgentProc> = (0..8)
        .map(|i| c.agent(&format!("127.0.0.{}", 220 + i), &format!("node-{i}")))
        .collect();
    // Slow writers, so that all eight are fetching at the same time.
    let running: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let d = c.path(&format!("d{i}"));
            let child = c.spawn(
                Some(a),
                &["get", "w", "-d", d.to_str().unwrap(), "--bwlimit", "4M"],
            );
            (d, child)
        })
        .collect();
    let mut from_store = 0;
    let mut from_peers = 0;
    for (d, child) in running {
        let got = finish_json(child);
        assert!(fs::read(&d).unwrap() == data);
        from_store += bytes_from(&got, "store");
        from_peers += sources(&got)
            .iter()
            .filter(|(s, _)| s != "store")
            .map(|(_, b)| b)
            .sum::<u64>();
    }
    assert!(
        from_store <= 2 * data.len() as u64,
        "the store sent {from_store} bytes for {} of data",
        data.len()
    );
    assert!(
        from_peers >= 6 * data.len() as u64,
        "peers sent {from_peers}"
    );
    eprintln!("8 getters: the store sent {from_store} bytes, peers {from_peers}");
}

#[test]
fn a_member_killed_mid_transfer_costs_the_others_only_what_it_had_in_flight() {
    let c = Cluster::new("127.0.0.204");
    let (data, version) = c.publish_random("w", 4 * MIB, 23, "65536");
    let group = format!("v-{}", &version[..16]);
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| c.agent(&format!("127.0.0.{}", 205 + i), &format!("node-{i}")))
        .collect();
    // node-0 fetches slowly; node-1 and node-2 join while it is at it, and trade with it.
    let d0 = c.path("d0");
    let mut first = c.spawn(
        Some(&agents[0]),
        &["get", "w", "-d", d0.to_str().unwrap(), "--bwlimit", "1M"],
    );
    c.wait_members(&group, 1);
    let others: Vec<_> = (1..3)
        .map(|i| {
            let d = c.path(&format!("d{i}"));
            let child = c.spawn(
                Some(&agents[i]),
                &["get", "w", "-d", d.to_str().unwrap(), "--bwlimit", "2M"],
            );
            (d, child)
        })
        .collect();
    c.wait_members(&group, 3);
    std::thread::sleep(Duration::from_millis(800));
    let mut agents = agents;
    agents.remove(0).proc.kill();
    // Its getter goes with it.
    let _ = first.kill();
    let _ = first.wait();
    for (d, child) in others {
        let got = finish_json(child);
        assert!(fs::read(&d).unwrap() == data, "a survivor's copy differs");
        let total: u64 = sources(&got).iter().map(|(_, b)| b).sum();
        assert_eq!(total, data.len() as u64, "{got}");
    }
}
