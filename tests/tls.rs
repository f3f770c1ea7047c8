//! TLS on both planes: a store server and agents given a certificate speak TLS only (gRPC and
//! the data plane on one port, `/metrics` still in the clear), clients that trust the CA reach
//! them, and a client that does not is told why. The servers also demand the shared token, so
//! the mount runs end to end under authentication.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;
use ktfs::dataplane::wire;
use ktfs::hash::BlockHash;
use test_support::tls::Pki;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

#[track_caller]
fn ok(o: Output) {
    assert!(o.status.success(), "{}", stderr(&o));
}

#[track_caller]
fn fails_with(o: Output, why: &str) {
    assert!(!o.status.success(), "succeeded without trusting the server");
    let err = stderr(&o);
    assert!(err.contains(why), "{err:?} lacks {why:?}");
}

/// A store server on `ip` with its data in `dir` that speaks TLS with `cert` and `key`.
fn tls_store(ip: &str, dir: &Path, cert: &Path, key: &Path, extra: &[&str]) -> Proc {
    let (data, cert, key) = (
        dir.join("store"),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let listen = format!("{ip}:0");
    let mut args = vec!["server", "--listen", &listen, "--data-dir"];
    args.extend([data.to_str().unwrap(), "--tls-cert", cert, "--tls-key", key]);
    args.extend(extra);
    spawn_ready(&args)
}

#[test]
fn both_planes_speak_tls_only_when_given_a_certificate() {
    test_support::require_fuse();
    let (ip, ip_a, ip_b) = ("127.0.0.193", "127.0.0.194", "127.0.0.195");
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = Pki::new(&[ip, ip_a, ip_b]).write(dir.path());
    let other_ca = dir.path().join("other");
    std::fs::create_dir_all(&other_ca).unwrap();
    let (other_ca, _, _) = Pki::new(&[ip]).write(&other_ca);
    let token = dir.path().join("token");
    std::fs::write(&token, "tls-test-token\n").unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (ca_s, cert_s, key_s, token_s) = (s(&ca), s(&cert), s(&key), s(&token));
    let serve_tls = [
        "--tls-cert",
        &cert_s,
        "--tls-key",
        &key_s,
        "--tls-ca",
        &ca_s,
        "--token-file",
        &token_s,
    ];

    let server = tls_store(ip, dir.path(), &cert, &key, &["--token-file", &token_s]);
    let node_a = dir.path().join("a");
    std::fs::create_dir_all(&node_a).unwrap();
    let agent = start_agent_with(ip_a, &server.addr, &node_a, "a", &serve_tls);
    let trusted = [("KT_TLS_CA", ca_s.as_str()), ("KT_TOKEN_FILE", &token_s)];
    let no_agent = dir.path().join("no-agent.sock");

    // The store: a put (gRPC and block uploads) and a get (block fetches) over TLS.
    let data = pseudo_random(3 << 20, 11);
    let src = dir.path().join("w.bin");
    std::fs::write(&src, &data).unwrap();
    ok(kt_env(
        &server.addr,
        &no_agent,
        &trusted,
        &["put", "w", "--src", &s(&src)],
    ));
    let got = dir.path().join("got.bin");
    ok(kt_env(
        &server.addr,
        &no_agent,
        &trusted,
        &["get", "w", "--dest", &s(&got)],
    ));
    assert!(std::fs::read(&got).unwrap() == data, "store copy differs");

    // A client that does not trust the CA is told to, on gRPC and on the data plane; one that
    // trusts another CA is refused by its own check of the certificate.
    let token_only = [("KT_TOKEN_FILE", token_s.as_str())];
    fails_with(
        kt_env(&server.addr, &no_agent, &token_only, &["ls"]),
        "speaks TLS only",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let (mut tx, mut rx) = wire::connect(&server.addr, wire::Peer::Store)
            .await
            .unwrap();
        tx.get(&BlockHash::of(&data[..1 << 20])).await.unwrap();
        rx.recv().await.unwrap()
    });
    assert!(
        matches!(&answer, wire::Response::Error(m) if m.contains("speaks TLS only")),
        "{answer:?}"
    );
    fails_with(
        kt_env(
            &server.addr,
            &no_agent,
            &[("KT_TLS_CA", &s(&other_ca)), ("KT_TOKEN_FILE", &token_s)],
            &["ls"],
        ),
        "certificate",
    );
    // Checked against a name the certificate does not hold, it is refused as well.
    fails_with(
        kt_env(
            &server.addr,
            &no_agent,
            &[
                ("KT_TLS_CA", &ca_s),
                ("KT_TLS_SERVER_NAME", "elsewhere.example"),
                ("KT_TOKEN_FILE", &token_s),
            ],
            &["ls"],
        ),
        "certificate",
    );

    // A scrape needs neither the CA nor the token, nor does a readiness probe (an HTTP one:
    // Kubernetes' gRPC probes speak no TLS).
    let metrics = common::http_get(&server.addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let ready = common::http_get(&server.addr, "/ready");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");

    // Node A publishes in place: only its TLS port holds the blocks.
    let local = pseudo_random(2 << 20, 12);
    let local_src = dir.path().join("l.bin");
    std::fs::write(&local_src, &local).unwrap();
    ok(kt_env(
        &server.addr,
        &agent.socket,
        &trusted,
        &["put", "l", "--src", &s(&local_src), "--locale", "local"],
    ));

    // Node B's mount, under the token and over TLS: it reads the store's key and A's in-place
    // one (from A's port), and what it writes is published to the store.
    let mount = start_mount(ip_b, &server.addr, &dir.path().join("b"), "b", &serve_tls);
    assert!(
        std::fs::read(mount.path("w")).unwrap() == data,
        "w through the mount"
    );
    assert!(
        std::fs::read(mount.path("l")).unwrap() == local,
        "l through the mount"
    );
    let written = pseudo_random(1 << 20, 13);
    std::fs::write(mount.path("from-b"), &written).unwrap();
    let got_b = dir.path().join("got-b.bin");
    ok(kt_env(
        &server.addr,
        &no_agent,
        &trusted,
        &["get", "from-b", "--dest", &s(&got_b)],
    ));
    assert!(
        std::fs::read(&got_b).unwrap() == written,
        "written through the mount"
    );
}

/// A certificate renewed in place (as cert-manager renews one, and Kubernetes swaps a mounted
/// Secret's files) is served at the next handshakes without a restart; a broken pair keeps the
/// last good one.
#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    let ip = "127.0.0.250";
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    let live = dir.path().join("live");
    for d in [&old, &new, &live] {
        std::fs::create_dir_all(d).unwrap();
    }
    let (old_ca, old_cert, old_key) = Pki::new(&[ip]).write(&old);
    let (new_ca, new_cert, new_key) = Pki::new(&[ip]).write(&new);
    // The files the server reads, replaced whole by a rename each time.
    let (cert, key) = (live.join("cert.pem"), live.join("key.pem"));
    let replace = |from: &Path, to: &Path| {
        let tmp = to.with_extension("tmp");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, to).unwrap();
    };
    replace(&old_cert, &cert);
    replace(&old_key, &key);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let server = tls_store(ip, dir.path(), &cert, &key, &[]);
    let no_agent = dir.path().join("no-agent.sock");
    let ls = |ca: &Path| kt_env(&server.addr, &no_agent, &[("KT_TLS_CA", &s(ca))], &["ls"]);
    ok(ls(&old_ca));
    fails_with(ls(&new_ca), "certificate");

    replace(&new_cert, &cert);
    replace(&new_key, &key);
    assert!(
        eventually(std::time::Duration::from_secs(10), || ls(&new_ca)
            .status
            .success()),
        "the renewed certificate was not served"
    );
    fails_with(ls(&old_ca), "certificate");

    // Half a renewal (a key of another certificate): the renewed one goes on being served.
    replace(&old_key, &key);
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        ok(ls(&new_ca));
    }
}

/// The store and the nodes hold certificates of different names (`KT_TLS_SERVER_NAME`,
/// `KT_TLS_NODE_NAME`): clients reach both, each checked against its own name, and a node's
/// certificate, whose key every node holds, does not pass for the store's.
#[test]
fn the_store_and_the_nodes_are_checked_against_names_of_their_own() {
    let (ip, ip_a) = ("127.0.0.205", "127.0.0.206");
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&["store.ktfs"]);
    let (ca, store_cert, store_key) = pki.write(dir.path());
    let (node_cert, node_key) = pki.write_another(&["node.ktfs"], dir.path(), "node");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let server = tls_store(ip, dir.path(), &store_cert, &store_key, &[]);
    let node_a = dir.path().join("a");
    std::fs::create_dir_all(&node_a).unwrap();
    let (ca_s, node_cert_s, node_key_s) = (s(&ca), s(&node_cert), s(&node_key));
    let agent = start_agent_with(
        ip_a,
        &server.addr,
        &node_a,
        "a",
        &[
            "--tls-cert",
            &node_cert_s,
            "--tls-key",
            &node_key_s,
            "--tls-ca",
            &ca_s,
            "--tls-server-name",
            "store.ktfs",
            "--tls-node-name",
            "node.ktfs",
        ],
    );
    let trusted = [
        ("KT_TLS_CA", ca_s.as_str()),
        ("KT_TLS_SERVER_NAME", "store.ktfs"),
        ("KT_TLS_NODE_NAME", "node.ktfs"),
    ];
    let no_agent = dir.path().join("no-agent.sock");

    // Node A publishes in place (its agent reaches the store by the store's name); a client
    // fetches it from A's port, checked against the nodes' name.
    let local = pseudo_random(2 << 20, 21);
    let src = dir.path().join("l.bin");
    std::fs::write(&src, &local).unwrap();
    ok(kt_env(
        &server.addr,
        &agent.socket,
        &trusted,
        &["put", "l", "--src", &s(&src), "--locale", "local"],
    ));
    let got = dir.path().join("got.bin");
    let out = kt_env(
        &server.addr,
        &no_agent,
        &trusted,
        &["get", "l", "--dest", &s(&got), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sources"][0]["source"], "a", "{report}");
    assert!(
        std::fs::read(&got).unwrap() == local,
        "the node's copy differs"
    );

    // Checked against the store's name alone, the node's certificate is refused.
    let store_name_only = [
        ("KT_TLS_CA", ca_s.as_str()),
        ("KT_TLS_SERVER_NAME", "store.ktfs"),
    ];
    let refused = dir.path().join("refused.bin");
    fails_with(
        kt_env(
            &server.addr,
            &no_agent,
            &store_name_only,
            &["get", "l", "--dest", &s(&refused)],
        ),
        "certificate",
    );

    // A node's port dialled as the store: its certificate is not the store's.
    fails_with(
        kt_env(&agent.proc.addr, &no_agent, &trusted, &["ls"]),
        "certificate",
    );
}
