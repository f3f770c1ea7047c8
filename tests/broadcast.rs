//! Broadcast windows and trees with real processes: quorums, fanout, rolling joins, pipelining
//! down the tree, and a mid-tree agent killed during a transfer.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::*;

const MIB: usize = 1 << 20;

fn parents(get: &serde_json::Value) -> Vec<String> {
    get["broadcast"][0]["parents"]
        .as_array()
        .expect("a broadcast report")
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

/// Blocks an agent has served to peers, from its own status.
fn served_blocks(agent: &AgentProc) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = ktfs::rpc::client::connect_agent(&agent.socket).await.ok()?;
        let st = c
            .status(ktfs::proto::AgentStatusRequest {})
            .await
            .ok()?
            .into_inner();
        Some(st.blocks_served)
    })
    .unwrap_or(0)
}

/// The parent of every member of a window, in join order.
fn window_parents(w: &serde_json::Value) -> Vec<String> {
    w["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["parent"].as_str().unwrap().to_string())
        .collect()
}

/// Starts `kt get w` on every agent, one after the other, each once the previous one is in
/// `group`'s window, so that the join order is the agents' order; returns destinations and
/// the running getters.
fn spawn_getters(
    c: &Cluster,
    agents: &[AgentProc],
    group: &str,
    flags: &[&str],
) -> Vec<(std::path::PathBuf, std::process::Child)> {
    let mut running = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let d = c.path(&format!("d{i}"));
        let mut args = vec!["get", "w", "-d", d.to_str().unwrap()];
        args.extend(flags);
        let child = c.spawn(Some(a), &args);
        c.wait_members(group, i + 1);
        running.push((d, child));
    }
    running
}

#[test]
fn quorum_closes_by_world_size_by_ips_and_by_timeout() {
    let c = Cluster::new("127.0.0.40");
    let a = c.agent("127.0.0.41", "node-a");
    let b = c.agent("127.0.0.42", "node-b");
    let f = c.path("w.src");
    fs::write(&f, pseudo_random(MIB, 1)).unwrap();
    let src = f.to_str().unwrap();

    // World size: the putter waits until two getters have joined.
    let put = c.spawn(
        None,
        &[
            "put",
            "w",
            "--src",
            src,
            "--world-size",
            "3",
            "--group-id",
            "ws",
        ],
    );
    c.wait_members("ws", 1);
    let w = c.window("ws").unwrap();
    assert_eq!(w["closed"], false);
    for (agent, dir) in [(&a, "a"), (&b, "b")] {
        let d = c.path(dir);
        let got = c.json(
            Some(agent),
            &["get", "w", "-d", d.to_str().unwrap(), "--group-id", "ws"],
        );
        assert_eq!(
            got["broadcast"][0]["group_id"], "default/ws",
            "a window lives in its namespace"
        );
    }
    let put = finish_json(put);
    assert_eq!(put["broadcast"]["closed"], true);
    assert_eq!(put["broadcast"]["closed_by"], "world_size");
    assert_eq!(put["broadcast"]["members"].as_array().unwrap().len(), 3);

    // Addresses: the quorum closes once both agents' addresses have joined.
    let put = c.spawn(
        None,
        &[
            "put",
            "w",
            "-f",
            "--src",
            src,
            "--ips",
            "127.0.0.41,127.0.0.42",
            "--group-id",
            "by-ip",
        ],
    );
    c.wait_members("by-ip", 1);
    for (agent, dir) in [(&a, "a2"), (&b, "b2")] {
        let d = c.path(dir);
        c.ok(
            Some(agent),
            &["get", "w", "-d", d.to_str().unwrap(), "--group-id", "by-ip"],
        );
    }
    let put = finish_json(put);
    assert_eq!(put["broadcast"]["closed_by"], "ips");

    // Timeout: nobody else comes; the putter is released when the timeout passes, not before.
    let start = Instant::now();
    let put = c.json(
        None,
        &[
            "put",
            "w",
            "-f",
            "--src",
            src,
            "--world-size",
            "10",
            "--broadcast-timeout",
            "1",
            "--group-id",
            "late",
        ],
    );
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert_eq!(put["broadcast"]["closed_by"], "timeout");
    assert_eq!(put["broadcast"]["members"].as_array().unwrap().len(), 1);
}

#[test]
fn rolling_joins_get_parents_at_once_within_the_fanout() {
    let c = Cluster::new("127.0.0.50");
    let (data, _) = c.publish_random("w", 6 * MIB, 2, "1048576");
    let agents: Vec<AgentProc> = (0..4)
        .map(|i| c.agent(&format!("127.0.0.{}", 51 + i), &format!("node-{i}")))
        .collect();
    // Slow getters, so that all four are receiving at once; the quorum never closes (world
    // size 10), yet each starts at once with a parent.
    let running = spawn_getters(
        &c,
        &agents,
        "roll",
        &[
            "--group-id",
            "roll",
            "--world-size",
            "10",
            "--fanout",
            "2",
            "--bwlimit",
            "3M",
        ],
    );
    let w = c.window("roll").unwrap();
    assert_eq!(w["closed"], false);
    let members = w["members"].as_array().unwrap();
    for m in members {
        assert!(m["children"].as_u64().unwrap() <= 2, "fanout exceeded: {w}");
    }
    let parents_now: Vec<&str> = members
        .iter()
        .map(|m| m["parent"].as_str().unwrap())
        .collect();
    assert_eq!(&parents_now[..2], &["store", "store"], "{w}");
    assert!(
        parents_now[2..].iter().all(|p| p.starts_with("node-")),
        "later joiners are children of earlier ones, the store being full: {w}"
    );
    for (d, child) in running {
        let got = finish_json(child);
        assert!(fs::read(&d).unwrap() == data);
        assert_eq!(got["broadcast"][0]["closed"], false);
    }
}

#[test]
fn a_child_is_fed_block_by_block_and_finishes_before_its_throttled_parent() {
    let c = Cluster::with_tree("127.0.0.60");
    let (data, _) = c.publish_random("w", 4 * MIB, 3, "1048576");
    let p = c.agent("127.0.0.61", "parent");
    let k = c.agent("127.0.0.62", "child");
    let (dp, dk) = (c.path("p"), c.path("k"));
    let window = ["--group-id", "pipe", "--fanout", "1"];
    let mut args = vec!["get", "w", "-d", dp.to_str().unwrap(), "--bwlimit", "1M"];
    args.extend(window);
    let mut parent = c.spawn(Some(&p), &args);
    c.wait_members("pipe", 1);
    let mut args = vec!["get", "w", "-d", dk.to_str().unwrap()];
    args.extend(window);
    let child = finish_json(c.spawn(Some(&k), &args));
    // The parent, throttled, is still writing when the child is done: the child cannot have
    // waited for whole files.
    assert!(
        parent.try_wait().unwrap().is_none(),
        "the parent finished first"
    );
    assert_eq!(parents(&child), ["parent"]);
    assert_eq!(bytes_from(&child, "parent"), 4 * MIB as u64);
    assert!(fs::read(&dk).unwrap() == data);
    let parent = finish_json(parent);
    assert_eq!(parents(&parent), ["store"]);
    assert!(fs::read(&dp).unwrap() == data);
}

#[test]
fn killing_a_mid_tree_agent_leaves_every_survivor_with_a_verified_copy() {
    let c = Cluster::with_tree("127.0.0.70");
    let (data, _) = c.publish_random("w", 6 * MIB, 4, "1048576");
    let a = c.agent("127.0.0.71", "node-a");
    let b = c.agent("127.0.0.72", "node-b");
    let cc = c.agent("127.0.0.73", "node-c");
    let (da, db, dc) = (c.path("a"), c.path("b"), c.path("c"));
    let window = ["--group-id", "chain", "--fanout", "1"];
    // A chain store -> A -> B -> C, A throttled so that the kill lands mid-transfer.
    let mut args = vec!["get", "w", "-d", da.to_str().unwrap(), "--bwlimit", "1M"];
    args.extend(window);
    let ga = c.spawn(Some(&a), &args);
    c.wait_members("chain", 1);
    let mut args = vec!["get", "w", "-d", db.to_str().unwrap()];
    args.extend(window);
    let gb = c.spawn(Some(&b), &args);
    c.wait_members("chain", 2);
    let mut args = vec!["get", "w", "-d", dc.to_str().unwrap()];
    args.extend(window);
    let gc = c.spawn(Some(&cc), &args);
    c.wait_members("chain", 3);
    let w = c.window("chain").unwrap();
    assert_eq!(window_parents(&w), ["store", "node-a", "node-b"]);
    // Once A has fed B something, A's agent dies.
    assert!(eventually(Duration::from_secs(30), || served_blocks(&a) > 0));
    drop(a);

    let gb = finish_json(gb);
    let gc = finish_json(gc);
    assert!(fs::read(&db).unwrap() == data);
    assert!(fs::read(&dc).unwrap() == data);
    assert_eq!(parents(&gb)[0], "node-a");
    assert!(
        parents(&gb).len() >= 2,
        "B must have moved to another parent: {gb}"
    );
    // (What A sent right before it died may be lost with the connection, so B's bytes from A
    // are not asserted; that it had A as parent and moved on is.)
    assert_eq!(parents(&gc)[0], "node-b");
    // A's getter lost only its agent: it still finishes its own copy.
    let ga = finish_json(ga);
    assert!(fs::read(&da).unwrap() == data);
    assert_eq!(ga["seeded"], false);
    let w = c.window("chain").unwrap();
    assert_eq!(w["members"][0]["failed"], true, "{w}");
}

#[test]
fn getters_without_a_window_spread_over_the_sources_within_the_fanout() {
    let c = Cluster::new("127.0.0.80");
    let (data, version) = c.publish_random("w", 4 * MIB, 5, "1048576");
    // The implicit window every getter without window flags joins.
    let group = format!("v-{}", &version[..16]);
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| c.agent(&format!("127.0.0.{}", 81 + i), &format!("node-{i}")))
        .collect();
    // No window flags: only the fanout (one child per source) and a slow writer, so that all
    // three are fetching at once.
    let running = spawn_getters(&c, &agents, &group, &["--fanout", "1", "--bwlimit", "2M"]);
    let w = c.window(&group).unwrap();
    // The store serves one; each later getter hangs below one still receiving.
    assert_eq!(window_parents(&w), ["store", "node-0", "node-1"], "{w}");
    for (d, child) in running {
        let got = finish_json(child);
        assert!(fs::read(&d).unwrap() == data);
        assert_eq!(got["broadcast"][0]["group_id"], format!("default/{group}"));
    }
}

#[test]
fn a_file_window_carries_several_keys_each_getter_fetching_its_own() {
    let c = Cluster::new("127.0.0.67");
    let a = c.agent("127.0.0.68", "node-a");
    let b = c.agent("127.0.0.69", "node-b");
    let mut datas = Vec::new();
    let mut puts = Vec::new();
    // Two keys put into one window (the shards of a sharded writer), each putter waiting for
    // the quorum of four: both putters and both getters.
    for (i, key) in ["shard-0", "shard-1"].iter().enumerate() {
        let f = c.path(&format!("{key}.src"));
        let data = pseudo_random(MIB + i * 4096, 40 + i as u64);
        fs::write(&f, &data).unwrap();
        datas.push(data);
        let src = f.to_str().unwrap().to_string();
        puts.push(c.spawn(
            None,
            &[
                "put",
                key,
                "--src",
                &src,
                "--world-size",
                "4",
                "--group-id",
                "mm",
            ],
        ));
        c.wait_members("mm", i + 1);
    }
    assert_eq!(c.window("mm").unwrap()["closed"], false);
    // Each getter, on its own node, starts at once and gets the other key.
    for (agent, key, want) in [(&a, "shard-1", &datas[1]), (&b, "shard-0", &datas[0])] {
        let d = c.path(&format!("got-{key}"));
        let got = c.json(
            Some(agent),
            &["get", key, "-d", d.to_str().unwrap(), "--group-id", "mm"],
        );
        assert_eq!(got["broadcast"][0]["group_id"], "default/mm");
        assert!(
            fs::read(&d).unwrap() == *want,
            "{key} came back with other bytes"
        );
    }
    for put in puts {
        let put = finish_json(put);
        assert_eq!(put["broadcast"]["closed_by"], "world_size");
        assert_eq!(put["broadcast"]["members"].as_array().unwrap().len(), 4);
    }
}
