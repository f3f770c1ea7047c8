//! Kubernetes integration against a fake API server (tests/kube_api): the CLI reaching the store
//! from outside the cluster by port-forward, and an agent taking its zone from its node object.

mod common;
#[allow(dead_code)] // each test file uses part of the fake
mod kube_api;

use std::process::{Command, Output, Stdio};

use common::*;
use kube_api::{FakeApi, World};

/// The store's Service and pod, and a ServiceAccount of team-a whose token the kubeconfig's
/// user may ask for (the CLI presents one; this store server checks none).
fn store_world(pod_target: std::net::SocketAddr, phase: &str) -> World {
    let mut w = World::with_store(pod_target, phase);
    w.service_accounts.push("team-a/default".into());
    w
}

/// `kt ARGS` with no usable --server: only a port-forward can reach the store.
fn kt_outside(kubeconfig: &std::path::Path, dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(kt_bin())
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("KT_SERVER", "127.0.0.131:1")
        .env("KT_AGENT", dir.join("no-agent.sock"))
        .env_remove("KT_NAMESPACE")
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run kt")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cli_reaches_the_store_by_port_forward_from_outside_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server("127.0.0.130", &dir.path().join("store"));
    let api = FakeApi::start(
        "127.0.0.131",
        store_world(server.addr.parse().unwrap(), "Running"),
    );
    let cfg = api.kubeconfig(dir.path());
    // Several blocks, so the data plane carries them over its own forwarded connections.
    let src = dir.path().join("weights.bin");
    std::fs::write(&src, pseudo_random((9 << 20) + 17, 5)).unwrap();
    let src_s = src.to_str().unwrap();

    ok(kt_outside(
        &cfg,
        dir.path(),
        &["put", "my-svc/weights", "--src", src_s, "-n", "team-a"],
    ));
    let ls = ok(kt_outside(
        &cfg,
        dir.path(),
        &["ls", "my-svc", "-n", "team-a", "--json"],
    ));
    let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(ls[0]["name"], "weights", "{ls}");
    let dest = dir.path().join("out.bin");
    let got = ok(kt_outside(
        &cfg,
        dir.path(),
        &[
            "get",
            "my-svc/weights",
            "--dest",
            dest.to_str().unwrap(),
            "-n",
            "team-a",
            "--json",
        ],
    ));
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["sources"][0]["source"], "store", "{got}");
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&src).unwrap());
    ok(kt_outside(
        &cfg,
        dir.path(),
        &["rm", "my-svc/weights", "-n", "team-a"],
    ));

    // Every connection went through the pod's port, the one the Service's named port maps to.
    let ports = api.forwarded_ports.lock().unwrap().clone();
    assert!(ports.len() >= 4, "port-forwards: {ports:?}");
    assert!(ports.iter().all(|&p| p == 7448), "{ports:?}");
    // And the key is gone from the real store.
    let ls = kt_with(
        &server.addr,
        &dir.path().join("none.sock"),
        &["ls", "my-svc", "-n", "team-a", "--json"],
    );
    assert!(!String::from_utf8_lossy(&ls.stdout).contains("weights"));
}

#[test]
fn no_running_store_pod_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(
        "127.0.0.132",
        store_world("127.0.0.132:1".parse().unwrap(), "Pending"),
    );
    let cfg = api.kubeconfig(dir.path());
    let out = kt_outside(&cfg, dir.path(), &["ls"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no running pod behind service kt-system/kt-store:7447"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let missing = dir.path().join("missing-kubeconfig");
    let out = kt_outside(&missing, dir.path(), &["ls"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubeconfig"));
}

/// Starts `kt agent` as a pod would run it (NODE_NAME from the downward API, no zone given) with
/// the API reachable through KUBECONFIG; returns its ready line.
fn agent_ready_line(server: &str, api: &FakeApi, dir: &std::path::Path, node: &str) -> String {
    let mut cmd = Command::new(kt_bin());
    cmd.args(["agent", "--server", server, "--listen", "127.0.0.133:0"])
        .arg("--cache-dir")
        .arg(dir.join(format!("cache-{node}")))
        .arg("--socket")
        .arg(dir.join(format!("{node}.sock")))
        .args(["--node-id", node])
        .env("KUBECONFIG", api.kubeconfig(dir))
        .env("NODE_NAME", node)
        .env_remove("KT_ZONE")
        .env("RUST_LOG", "warn");
    spawn_ready_cmd(cmd).ready_line.clone()
}

#[test]
fn agent_takes_its_zone_from_its_node_object() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server("127.0.0.133", &dir.path().join("store"));
    let mut world = World::default();
    world.nodes.insert(
        "node-a".into(),
        [(
            "topology.kubernetes.io/zone".to_string(),
            "zone-q".to_string(),
        )]
        .into(),
    );
    world.nodes.insert("node-b".into(), Default::default());
    let api = FakeApi::start("127.0.0.134", world);
    let line = agent_ready_line(&server.addr, &api, dir.path(), "node-a");
    assert!(line.ends_with(", zone zone-q"), "{line}");
    // A node without the label, or unknown to the API, leaves the zone empty and the agent up.
    let line = agent_ready_line(&server.addr, &api, dir.path(), "node-b");
    assert!(!line.contains("zone"), "{line}");
    let line = agent_ready_line(&server.addr, &api, dir.path(), "node-c");
    assert!(!line.contains("zone"), "{line}");
}
