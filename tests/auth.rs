//! Authentication and namespace isolation, enforced by a real store server: the shared token
//! (`kt server --token-file`), ServiceAccount tokens checked with TokenReview against the fake
//! API server of tests/kube_api, node agents as principals of their own, and the token a laptop
//! asks the API for with its kubeconfig.

mod common;
#[allow(dead_code)] // each test file uses part of the fake
mod kube_api;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use ktfs::auth::ticket::{Grant, TicketKey, NODE_TTL};
use ktfs::dataplane::wire;
use ktfs::hash::BlockHash;
use kube_api::{FakeApi, World};

fn kt_as(server: &str, sock: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    kt_env(server, sock, env, args)
}

/// One data-plane request for `block` at `addr`, presenting `ticket`: the error it got, or
/// "block" when it was served.
fn raw_get(addr: &str, ticket: Option<&[u8]>, block: BlockHash) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut tx, mut rx) = wire::connect(addr, wire::Peer::Store).await.unwrap();
        if let Some(t) = ticket {
            tx.ticket(t).await.unwrap();
        }
        tx.get(&block).await.unwrap();
        match rx.recv().await.unwrap() {
            wire::Response::Error(m) => m,
            wire::Response::Block(..) => "block".into(),
            other => format!("{other:?}"),
        }
    })
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

#[track_caller]
fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// The command failed as refused (exit code 9) with one line that says `why`.
#[track_caller]
fn refused(o: Output, why: &str) {
    assert_eq!(o.status.code(), Some(9), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(why), "{err:?} lacks {why:?}");
}

/// A store server on `ip`, its data in `dir`, that demands the shared token `s3cret-token`; and
/// the token's file.
fn token_server(ip: &str, dir: &Path) -> (Proc, std::path::PathBuf) {
    let token = dir.join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    (server_of_token(ip, dir, &token), token)
}

/// A store server on `ip` with its data in `dir`/store, taking the token in the file `token`.
fn server_of_token(ip: &str, dir: &Path, token: &Path) -> Proc {
    spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        dir.join("store").to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
    ])
}

/// What the steps of the shared-token test share: a store server that demands the token, an
/// agent that presents it, and a file to put. Dropped in this order: the agent, the server,
/// then their directory.
struct Guarded {
    agent: AgentProc,
    server: Proc,
    dir: tempfile::TempDir,
    ip: &'static str,
    /// The token's file.
    token: String,
    /// A socket no agent listens on: a `kt` there talks to the server alone.
    none: std::path::PathBuf,
    src: std::path::PathBuf,
}

impl Guarded {
    fn start(ip: &'static str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (server, token) = token_server(ip, dir.path());
        let token = token.to_str().unwrap().to_string();
        let node_dir = dir.path().join("n1");
        std::fs::create_dir_all(&node_dir).unwrap();
        let agent = start_agent_with(ip, &server.addr, &node_dir, "n1", &["--token-file", &token]);
        let src = dir.path().join("w.bin");
        std::fs::write(&src, pseudo_random(300_000, 3)).unwrap();
        Guarded {
            agent,
            server,
            none: dir.path().join("no-agent.sock"),
            src,
            token,
            ip,
            dir,
        }
    }

    fn with_token(&self) -> [(&str, &str); 1] {
        [("KT_TOKEN_FILE", self.token.as_str())]
    }

    fn src(&self) -> &str {
        self.src.to_str().unwrap()
    }

    /// The block of the file put (one block of 300 kB).
    fn block(&self) -> BlockHash {
        BlockHash::of(&std::fs::read(&self.src).unwrap())
    }

    /// `kt ARGS` through the agent at `sock` (or none), with the token file; what it printed.
    #[track_caller]
    fn kt_ok(&self, sock: &Path, args: &[&str]) -> String {
        ok(kt_as(&self.server.addr, sock, &self.with_token(), args))
    }

    /// `kt ARGS --json` as [`Guarded::kt_ok`], parsed.
    #[track_caller]
    fn kt_json(&self, sock: &Path, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.kt_ok(sock, args)).unwrap()
    }

    /// The read ticket a resolve of `key` brings.
    fn ticket_of(&self, key: &str) -> Vec<u8> {
        read_ticket(&self.server.addr, "s3cret-token", "default", key)
    }
}

/// The read ticket a resolve of `key` in `ns` at the store at `addr` brings, asked with `token`.
fn read_ticket(addr: &str, token: &str, ns: &str, key: &str) -> Vec<u8> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let credential = ktfs::auth::Credential::token(token).unwrap();
        let store = ktfs::rpc::client::connect_store(addr, &credential)
            .await
            .unwrap();
        let r = store
            .resolve(ktfs::proto::ResolveRequest {
                watcher: 0,
                namespace: ns.into(),
                key: key.into(),
                inline_up_to: 0,
            })
            .await
            .unwrap();
        assert!(!r.ticket.is_empty(), "no read ticket for {key}");
        r.ticket
    })
}

/// The ticket key is rotated when the shared token changes (issue 42, item 6): a ticket issued
/// under the old token, good for hours yet, reads nothing once the store restarts with a new
/// one (with one key kept in the data directory, it was served); one issued now is.
#[test]
fn a_changed_shared_token_retires_every_ticket_issued_before() {
    let ip = "127.0.0.77";
    let dir = tempfile::tempdir().unwrap();
    let (server, token) = token_server(ip, dir.path());
    let src = dir.path().join("w.bin");
    std::fs::write(&src, pseudo_random(200_000, 8)).unwrap();
    let block = BlockHash::of(&std::fs::read(&src).unwrap());
    let none = dir.path().join("no-agent.sock");
    let env = [("KT_TOKEN_FILE", token.to_str().unwrap())];
    ok(kt_as(
        &server.addr,
        &none,
        &env,
        &["put", "w", "--src", src.to_str().unwrap()],
    ));
    let old = read_ticket(&server.addr, "s3cret-token", "default", "w");
    assert_eq!(raw_get(&server.addr, Some(&old), block), "block");
    drop(server);

    std::fs::write(&token, "another-token\n").unwrap();
    let server = server_of_token(ip, dir.path(), &token);
    let answer = raw_get(&server.addr, Some(&old), block);
    assert!(answer.contains("retired"), "{answer}");
    let new = read_ticket(&server.addr, "another-token", "default", "w");
    assert_eq!(raw_get(&server.addr, Some(&new), block), "block");
}

/// The value of `series` in a `/metrics` page.
#[track_caller]
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

#[test]
fn a_shared_token_guards_every_call_and_agents_present_it() {
    let t = Guarded::start("127.0.0.185");
    calls_without_the_token_are_refused(&t);
    calls_with_the_token_work_and_the_agent_presents_it(&t);
    blocks_go_to_holders_of_a_ticket_the_server_issued(&t);
    a_read_ticket_reaches_the_blocks_of_its_version_only(&t);
    metrics_need_no_credential_and_name_no_key(&t);
    an_agent_without_the_token_registers_and_publishes_for_no_one(&t);
    what_a_node_learns_mints_no_ticket(&t);
}

/// Without the token, or with another, nothing is answered: one line says why.
fn calls_without_the_token_are_refused(t: &Guarded) {
    let (addr, none) = (t.server.addr.as_str(), t.none.as_path());
    refused(
        kt_as(addr, none, &[], &["ls"]),
        "no credential: this store server needs a token",
    );
    refused(
        kt_as(addr, none, &[("KT_TOKEN", "guess")], &["ls"]),
        "the token was refused",
    );
    refused(
        kt_as(addr, none, &[], &["put", "k", "--src", t.src()]),
        "no credential",
    );
    // Refused calls changed nothing.
    let ls = t.kt_ok(none, &["ls", "--json"]);
    assert_eq!(ls.trim(), "[]");
}

/// With the token everything works, from a file or as KT_TOKEN; the agent registered with it,
/// so a put in place goes through it, and it is a source.
fn calls_with_the_token_work_and_the_agent_presents_it(t: &Guarded) {
    t.kt_ok(
        &t.none,
        &["put", "models/w", "--src", t.src(), "-n", "team-a"],
    );
    let dest = t.dir.path().join("got.bin");
    ok(kt_as(
        &t.server.addr,
        &t.none,
        &[("KT_TOKEN", "s3cret-token")],
        &[
            "get",
            "models/w",
            "--dest",
            dest.to_str().unwrap(),
            "-n",
            "team-a",
        ],
    ));
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&t.src).unwrap());

    t.kt_ok(
        &t.agent.socket,
        &["put", "local/w", "--src", t.src(), "--locale", "local"],
    );
    let ls = t.kt_json(&t.none, &["ls", "local", "--json"]);
    assert_eq!(ls[0]["locale"], "n1", "{ls}");
}

/// The data plane: blocks go to those holding a ticket the store server issued, from the
/// store and from a node alike; `kt get` presents the one its resolve brought.
fn blocks_go_to_holders_of_a_ticket_the_server_issued(t: &Guarded) {
    let block = t.block();
    assert_eq!(
        raw_get(&t.server.addr, None, block),
        "not allowed: no ticket: resolve the key for one"
    );
    assert!(raw_get(&t.agent.proc.addr, None, block).contains("no ticket"));
    let forged = TicketKey::from_bytes(&[1; 32])
        .unwrap()
        .issue(&Grant::Node, NODE_TTL);
    assert!(raw_get(&t.agent.proc.addr, Some(&forged), block).contains("not issued by"));
    let dest = t.dir.path().join("from-node.bin");
    let got = t.kt_json(
        &t.none,
        &["get", "local/w", "--dest", dest.to_str().unwrap(), "--json"],
    );
    assert_eq!(got["sources"][0]["source"], "n1", "{got}");
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&t.src).unwrap());
}

/// What a node learns when it registers mints nothing (issue 42, item 6): the key that checks
/// tickets is the public half of the one that signs them, and no key GPU secrets come from
/// (it asks for each of its registrations'). A ticket made with what it learns is refused by
/// the store and by a node. (It registers a node of its own: run last, after the metrics count
/// the live nodes.)
fn what_a_node_learns_mints_no_ticket(t: &Guarded) {
    let block = t.block();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let learnt = rt.block_on(async {
        let cred = ktfs::auth::Credential::file(Path::new(&t.token)).unwrap();
        let store = ktfs::rpc::client::connect_store(&t.server.addr, &cred)
            .await
            .unwrap();
        store
            .register_node(ktfs::proto::RegisterNodeRequest {
                node: Some(ktfs::proto::NodeInfo {
                    node_id: "minter".into(),
                    data_addr: format!("{}:1", t.ip),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
    });
    assert_eq!((learnt.ticket_key.len(), learnt.gpu_key.len()), (32, 0));
    assert_eq!(learnt.ticket_keys.len(), 1);
    for key in [&learnt.ticket_key, &learnt.ticket_keys[0].key] {
        let minted = TicketKey::from_bytes(key)
            .unwrap()
            .issue(&Grant::Node, NODE_TTL);
        for addr in [&t.server.addr, &t.agent.proc.addr] {
            let answer = raw_get(addr, Some(&minted), block);
            assert!(answer.contains("not issued by"), "{answer}");
        }
    }
}

/// A node serves a read ticket's holder only the blocks of the ticket's version: a ticket for
/// local/w does not reach another key's block on the same node, however it learnt the hash;
/// the ticket for that key does.
fn a_read_ticket_reaches_the_blocks_of_its_version_only(t: &Guarded) {
    let other = t.dir.path().join("o.bin");
    std::fs::write(&other, pseudo_random(200_000, 5)).unwrap();
    t.kt_ok(
        &t.agent.socket,
        &[
            "put",
            "local/o",
            "--src",
            other.to_str().unwrap(),
            "--locale",
            "local",
        ],
    );
    let other_block = BlockHash::of(&std::fs::read(&other).unwrap());
    let (ticket_w, ticket_o) = (t.ticket_of("local/w"), t.ticket_of("local/o"));
    let node = t.agent.proc.addr.as_str();
    let cross = raw_get(node, Some(&ticket_w), other_block);
    assert!(cross.contains("is in no version"), "{cross}");
    assert_eq!(raw_get(node, Some(&ticket_o), other_block), "block");
    assert_eq!(raw_get(node, Some(&ticket_w), t.block()), "block");
}

/// Metrics need no credential, and name no key.
fn metrics_need_no_credential_and_name_no_key(t: &Guarded) {
    let server_metrics = http_get(&t.server.addr, "/metrics");
    assert!(
        server_metrics.starts_with("HTTP/1.1 200 OK"),
        "{server_metrics}"
    );
    assert!(metric(&server_metrics, "kt_served_bytes_total") >= 300_000.0);
    assert!(metric(&server_metrics, "kt_dataplane_denied_total") >= 1.0);
    assert!(metric(&server_metrics, "kt_auth_refused_total") >= 3.0);
    assert_eq!(metric(&server_metrics, "kt_nodes_live"), 1.0);
    // Each publish it answered is timed (the puts of the tests before this one).
    assert!(metric(&server_metrics, "kt_store_publish_seconds_count") >= 1.0);
    let node_metrics = http_get(&t.agent.proc.addr, "/metrics");
    assert!(metric(&node_metrics, "kt_served_bytes_total") >= 300_000.0);
    assert!(metric(&node_metrics, "kt_cache_budget_bytes") > 0.0);
    for text in [&server_metrics, &node_metrics] {
        assert!(
            !text.contains("models") && !text.contains("local/w"),
            "{text}"
        );
    }
    assert!(http_get(&t.server.addr, "/keys").starts_with("HTTP/1.1 404"));
}

/// An agent without the token cannot register or publish for anyone; a getter there fetches
/// (it presents the token itself), but its agent cannot take the files over: it leaves its
/// window holding no copy, so no later getter is sent to it.
fn an_agent_without_the_token_registers_and_publishes_for_no_one(t: &Guarded) {
    let other_dir = t.dir.path().join("n2");
    std::fs::create_dir_all(&other_dir).unwrap();
    let intruder = start_agent_with(t.ip, &t.server.addr, &other_dir, "n2", &[]);
    let out = kt_as(
        &t.server.addr,
        &intruder.socket,
        &t.with_token(),
        &["put", "local/x", "--src", t.src(), "--locale", "local"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no credential"), "{}", stderr(&out));
    let dest = t.dir.path().join("via-intruder.bin");
    t.kt_ok(
        &intruder.socket,
        &[
            "get",
            "models/w",
            "-n",
            "team-a",
            "--dest",
            dest.to_str().unwrap(),
            "--group-id",
            "handover",
        ],
    );
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&t.src).unwrap());
    let window = t.kt_json(&t.none, &["window", "handover", "-n", "team-a", "--json"]);
    let members = window["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{window}");
    assert_eq!(members[0]["done"], serde_json::json!(false), "{window}");
    assert_eq!(members[0]["failed"], serde_json::json!(true), "{window}");
    // `kt status` tells the two apart.
    let status = |sock: &Path| -> serde_json::Value {
        serde_json::from_str(&ok(kt_as(&t.server.addr, sock, &[], &["status", "--json"]))).unwrap()
    };
    let (good, bad) = (status(&t.agent.socket), status(&intruder.socket));
    assert_eq!(
        (good["registered"].as_bool(), bad["registered"].as_bool()),
        (Some(true), Some(false))
    );
    assert!(good["served_bytes"].as_u64().unwrap() >= 300_000, "{good}");
    let out = kt_as(&t.server.addr, &t.none, &t.with_token(), &["ls", "local/x"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

/// A fake API that knows the tokens of two teams, a node agent, a user and a token for the API
/// server alone.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A JWT-shaped token whose `exp` is two minutes after its first use in this process.
fn expiring_jwt() -> String {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN
        .get_or_init(|| {
            use base64::Engine;
            let part = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
            let exp = unix_now() + 120;
            format!(
                "{}.{}.c2ln",
                part(r#"{"alg":"RS256"}"#),
                part(&format!(r#"{{"exp":{exp}}}"#))
            )
        })
        .clone()
}

fn team_world() -> World {
    let mut w = World::default();
    let sa = |ns: &str, name: &str| format!("system:serviceaccount:{ns}:{name}");
    let ktfs = vec!["ktfs".to_string()];
    w.tokens
        .insert("tok-a".into(), (sa("team-a", "runner"), ktfs.clone()));
    w.tokens
        .insert("tok-b".into(), (sa("team-b", "default"), ktfs.clone()));
    w.tokens.insert(
        "tok-node".into(),
        (sa("kt-system", "kt-csi-node"), ktfs.clone()),
    );
    // The node agent's token is bound to its pod on node n1.
    w.token_nodes.insert("tok-node".into(), "n1".into());
    // A token shaped as the API's are, a JWT that expires in two minutes.
    w.tokens
        .insert(expiring_jwt(), (sa("team-a", "runner"), ktfs.clone()));
    w.tokens.insert("tok-alice".into(), ("alice".into(), ktfs));
    w.tokens.insert(
        "tok-api".into(),
        (sa("team-a", "runner"), vec!["api".to_string()]),
    );
    w
}

/// `kt agent` of node `node_id` on 127.0.0.186, in `dir`, presenting `token`.
fn node_agent(server: &str, dir: &Path, node_id: &str, token: &str) -> Command {
    let mut cmd = Command::new(kt_bin());
    cmd.args(["agent", "--server", server, "--listen", "127.0.0.186:0"])
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .arg("--socket")
        .arg(dir.join("agent.sock"))
        .args(["--node-id", node_id, "--heartbeat-secs", "1"])
        .env("KT_TOKEN", token)
        .env("RUST_LOG", "warn");
    cmd
}

/// What `agent` said on stderr before it stopped, as it must: one that runs on (let in) is
/// killed after 20 s and the test fails on what it said.
#[track_caller]
fn an_agent_that_must_stop(mut agent: Command) -> String {
    let mut agent = agent
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its stderr ends when it exits.
    let pid = agent.id() as i32;
    let (exited, told) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if told
            .recv_timeout(std::time::Duration::from_secs(20))
            .is_err()
        {
            // SAFETY: a plain kill(2) of the child this test started, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut why = String::new();
    std::io::Read::read_to_string(agent.stderr.as_mut().unwrap(), &mut why).unwrap();
    let _ = exited.send(());
    watchdog.join().unwrap();
    let status = agent.wait().unwrap();
    assert!(!status.success(), "{why}");
    why
}

fn review_server(ip: &str, api: &FakeApi, dir: &Path) -> Proc {
    spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        dir.join("store").to_str().unwrap(),
        "--token-review",
        "--review-kubeconfig",
        api.kubeconfig(dir).to_str().unwrap(),
    ])
}

#[test]
fn a_node_token_made_from_the_shared_token_acts_for_its_own_node_only() {
    let dir = tempfile::tempdir().unwrap();
    let (server, shared) = token_server("127.0.0.57", dir.path());
    let shared_s = shared.to_str().unwrap();
    let none = dir.path().join("no-agent.sock");
    // The operator makes node n1's token from the shared one; the file is n1's alone.
    let n1_token = dir.path().join("n1.token");
    ok(kt_as(
        &server.addr,
        &none,
        &[],
        &[
            "node-token",
            "n1",
            "--token-file",
            shared_s,
            "--out",
            n1_token.to_str().unwrap(),
        ],
    ));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&n1_token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let n1_s = n1_token.to_str().unwrap();

    // n1's agent presents it: registered, it is the source of what is put in place through it.
    let n1_dir = dir.path().join("n1");
    std::fs::create_dir_all(&n1_dir).unwrap();
    let agent = start_agent_with(
        "127.0.0.58",
        &server.addr,
        &n1_dir,
        "n1",
        &["--token-file", n1_s],
    );
    let src = dir.path().join("w.bin");
    std::fs::write(&src, pseudo_random(200_000, 5)).unwrap();
    let with_shared = [("KT_TOKEN_FILE", shared_s)];
    ok(kt_as(
        &server.addr,
        &agent.socket,
        &with_shared,
        &[
            "put",
            "local/w",
            "--src",
            src.to_str().unwrap(),
            "--locale",
            "local",
        ],
    ));
    let ls: serde_json::Value = serde_json::from_str(&ok(kt_as(
        &server.addr,
        &none,
        &with_shared,
        &["ls", "local", "--json"],
    )))
    .unwrap();
    assert_eq!(ls[0]["locale"], "n1", "{ls}");

    // Nor may it join a broadcast window as node n2 (whose agent getters would then be sent to).
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cred = ktfs::auth::Credential::file(&n1_token).unwrap();
        let store = ktfs::rpc::client::connect_store(&server.addr, &cred)
            .await
            .unwrap();
        let join = |node: &str| ktfs::proto::JoinRequest {
            namespace: "default".into(),
            key: "local/w".into(),
            version: vec![0; 32],
            node_id: node.into(),
            ..Default::default()
        };
        let err = store.join_broadcast(join("n2")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        assert!(err.to_string().contains("own node only"), "{err}");
        // As itself it gets past that check (to the version it named, which is not the key's).
        let err = store.join_broadcast(join("n1")).await.unwrap_err();
        assert_ne!(err.code(), tonic::Code::PermissionDenied, "{err}");
        // It is given the secrets of its own node's GPU registrations, one by one, and none of
        // another node's (issue 42, item 6: no node holds what they are derived from).
        let secret = |node: &str| ktfs::proto::RegistrationSecretRequest {
            namespace: "default".into(),
            node_id: node.into(),
            registration: 77,
        };
        let own = store.registration_secret(secret("n1")).await.unwrap();
        assert_eq!(own.secret.len(), 32);
        let err = store.registration_secret(secret("n2")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    });

    // The same token as node n2 (which could then add or withdraw n2's copies) is refused at
    // registration, and the agent stops saying why.
    let n2_dir = dir.path().join("n2");
    let token = std::fs::read_to_string(&n1_token).unwrap();
    let why = an_agent_that_must_stop(node_agent(&server.addr, &n2_dir, "n2", token.trim()));
    assert!(
        why.contains("refused this node")
            && why.contains("node token of node n1")
            && why.contains("\"n2\""),
        "{why}"
    );

    // A node token the shared token did not make is refused outright, with one line.
    let forged = format!("ktnode1.{}.n1", "0".repeat(64));
    refused(
        kt_as(&server.addr, &none, &[("KT_TOKEN", &forged)], &["ls"]),
        "not made from this server's shared token",
    );
}

#[test]
fn a_service_account_token_reaches_its_own_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start("127.0.0.187", team_world());
    let server = review_server("127.0.0.186", &api, dir.path());
    let none = dir.path().join("no-agent.sock");
    let src = dir.path().join("w.bin");
    std::fs::write(&src, pseudo_random(200_000, 4)).unwrap();
    let src_s = src.to_str().unwrap();
    let a = [("KT_TOKEN", "tok-a")];
    let b = [("KT_TOKEN", "tok-b")];
    let kt = |env: &[(&str, &str)], args: &[&str]| kt_as(&server.addr, &none, env, args);

    ok(kt(&a, &["put", "svc/w", "--src", src_s, "-n", "team-a"]));
    let ls = ok(kt(&a, &["ls", "svc", "-n", "team-a", "--json"]));
    assert!(ls.contains("\"w\""), "{ls}");

    // Team b's pod reaches none of team a's keys, whatever -n it passes.
    let only_b = "ServiceAccount team-b/default may use namespace team-b only, not team-a";
    refused(kt(&b, &["ls", "svc", "-n", "team-a"]), only_b);
    let dest = dir.path().join("stolen.bin");
    refused(
        kt(
            &b,
            &[
                "get",
                "svc/w",
                "--dest",
                dest.to_str().unwrap(),
                "-n",
                "team-a",
            ],
        ),
        only_b,
    );
    assert!(!dest.exists());
    refused(kt(&b, &["rm", "svc/w", "-n", "team-a"]), only_b);
    refused(
        kt(&b, &["put", "svc/w", "--src", src_s, "-n", "team-a", "-f"]),
        only_b,
    );
    refused(kt(&b, &["window", "g", "-n", "team-a"]), only_b);
    // Its own namespace is its own, and the default one is not.
    ok(kt(&b, &["put", "svc/w", "--src", src_s, "-n", "team-b"]));
    refused(kt(&b, &["ls"]), "not default");
    // Team a's key is untouched.
    let ls = ok(kt(&a, &["ls", "svc", "-n", "team-a", "--json"]));
    assert!(ls.contains("\"w\""), "{ls}");

    // A ticket holds no longer than the credential it was asked with (issue 42, item 6): hours
    // for a token without an expiry, two minutes for one that expires then.
    let expiry = |token: &str| {
        let t = read_ticket(&server.addr, token, "team-a", "svc/w");
        ktfs::auth::ticket::expires_at(&t).unwrap()
    };
    let jwt = expiring_jwt();
    let exp = ktfs::server::auth::jwt_expiry(&jwt).unwrap();
    assert!(expiry(&jwt) <= exp && expiry(&jwt) + 180 > exp);
    assert!(expiry("tok-a") > unix_now() + 5 * 3600);

    // A token for the API server alone, a user's token and a made-up one: no principal.
    refused(
        kt(&[("KT_TOKEN", "tok-api")], &["ls", "-n", "team-a"]),
        "audiences",
    );
    refused(
        kt(&[("KT_TOKEN", "tok-alice")], &["ls", "-n", "team-a"]),
        "alice is not a ServiceAccount",
    );
    refused(
        kt(&[("KT_TOKEN", "made-up")], &["ls"]),
        "invalid bearer token",
    );
    refused(kt(&[], &["ls", "-n", "team-a"]), "no credential");

    // A pod's token may not act as a node; the node agent's may, for every namespace.
    let node_dir = dir.path().join("n1");
    std::fs::create_dir_all(&node_dir).unwrap();
    let pod_agent = spawn_ready_cmd(node_agent(&server.addr, &node_dir, "n1", "tok-node"));
    ok(kt_as(
        &server.addr,
        &node_dir.join("agent.sock"),
        &a,
        &[
            "put",
            "svc/local",
            "--src",
            src_s,
            "--locale",
            "local",
            "-n",
            "team-a",
        ],
    ));
    let ls = ok(kt(&a, &["ls", "svc", "-n", "team-a", "--json"]));
    assert!(ls.contains("\"local\""), "{ls}");
    drop(pod_agent);

    // That token acts for node n1 only: an agent presenting it as node n2 (which could then add
    // or withdraw n2's copies) is refused at its registration and stops, saying why.
    let n2_dir = dir.path().join("n2");
    let why = an_agent_that_must_stop(node_agent(&server.addr, &n2_dir, "n2", "tok-node"));
    assert!(
        why.contains("refused this node") && why.contains("on node n1") && why.contains("\"n2\""),
        "{why}"
    );

    // Every review asked for ktfs's audience, and a token is reviewed once while it is trusted.
    let seen = api.seen.lock().unwrap();
    assert!(
        seen.reviews
            .iter()
            .all(|r| r["audiences"] == serde_json::json!(["ktfs"])),
        "{:?}",
        seen.reviews
    );
    let reviews_of_a = seen
        .reviews
        .iter()
        .filter(|r| r["token"] == "tok-a")
        .count();
    assert!(reviews_of_a <= 2, "tok-a reviewed {reviews_of_a} times");
}

/// A pod in team-a on node n1: its tokens as Kubernetes 1.21 to 1.29 review them (the pod named,
/// its node not) and as 1.30 and later do (the node named); one bound to no pod; the node
/// agent's of a DaemonSet pod on n1, reviewed the older way.
fn bound_world() -> World {
    let mut w = World::default();
    let sa = |ns: &str, name: &str| format!("system:serviceaccount:{ns}:{name}");
    let ktfs = vec!["ktfs".to_string()];
    for t in ["tok-pod-named", "tok-node-named", "tok-unbound"] {
        w.tokens
            .insert(t.into(), (sa("team-a", "runner"), ktfs.clone()));
    }
    w.tokens.insert(
        "tok-agent".into(),
        (sa("kt-system", "kt-csi-node"), ktfs.clone()),
    );
    w.token_pods
        .insert("tok-pod-named".into(), "runner-0".into());
    w.token_nodes.insert("tok-node-named".into(), "n1".into());
    w.token_pods
        .insert("tok-agent".into(), "kt-csi-node-x1".into());
    for (ns, pod) in [("team-a", "runner-0"), ("kt-system", "kt-csi-node-x1")] {
        w.pods.push(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}
        }));
    }
    w
}

/// Issue 42: the node a pod names when it joins a broadcast or GPU window is the node its token
/// is bound to, as the API says, not its own word (other members fetch from the node a member
/// names; a GPU window moves tensors within a node by CUDA IPC). Before, any pod named any node.
#[test]
fn a_pod_names_in_windows_the_node_its_token_is_bound_to_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start("127.0.0.214", bound_world());
    let server = review_server("127.0.0.215", &api, dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store_of = |token: &'static str| {
            let addr = server.addr.clone();
            async move {
                let cred = ktfs::auth::Credential::token(token).unwrap();
                ktfs::rpc::client::connect_store(&addr, &cred)
                    .await
                    .unwrap()
            }
        };
        let join = |node: &str| ktfs::proto::JoinRequest {
            namespace: "team-a".into(),
            key: "k/w".into(),
            version: vec![0; 32],
            node_id: node.into(),
            ..Default::default()
        };
        let gpu_join = |node: &str| ktfs::proto::GpuJoinRequest {
            namespace: "team-a".into(),
            key: "k/g".into(),
            node_id: node.into(),
            worker_addr: "127.0.0.215:1".into(),
            registration: 5,
            ..Default::default()
        };
        for token in ["tok-pod-named", "tok-node-named"] {
            let store = store_of(token).await;
            let err = store.join_broadcast(join("n2")).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{token}: {err}");
            assert!(
                err.to_string().contains("pod on node n1") && err.to_string().contains("own node"),
                "{token}: {err}"
            );
            let err = store.join_gpu_window(gpu_join("n2")).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{token}: {err}");
            // As n1 it gets past the check (to the version it named, which is no key's).
            let err = store.join_broadcast(join("n1")).await.unwrap_err();
            assert_ne!(err.code(), tonic::Code::PermissionDenied, "{token}: {err}");
            if let Err(err) = store.join_gpu_window(gpu_join("n1")).await {
                assert_ne!(err.code(), tonic::Code::PermissionDenied, "{token}: {err}");
            }
        }
        // A token bound to no pod says nothing of where its holder runs: a broadcast window takes
        // it as a member on no node, a GPU window refuses the node it names.
        let store = store_of("tok-unbound").await;
        let err = store.join_broadcast(join("n1")).await.unwrap_err();
        assert_ne!(err.code(), tonic::Code::PermissionDenied, "{err}");
        let err = store.join_gpu_window(gpu_join("n1")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        assert!(err.to_string().contains("no pod binding"), "{err}");
        if let Err(err) = store.join_gpu_window(gpu_join("")).await {
            assert_ne!(err.code(), tonic::Code::PermissionDenied, "{err}");
        }
    });
    // The node agent's token, its pod named alone, acts for n1 only.
    let n2_dir = dir.path().join("n2");
    let why = an_agent_that_must_stop(node_agent(&server.addr, &n2_dir, "n2", "tok-agent"));
    assert!(
        why.contains("refused this node") && why.contains("on node n1") && why.contains("\"n2\""),
        "{why}"
    );
    // The pod is asked of the API once per review, not per call.
    let got = api.seen.lock().unwrap().pods_got.clone();
    assert_eq!(
        got.iter().filter(|p| *p == "team-a/runner-0").count(),
        1,
        "{got:?}"
    );
}

#[test]
fn a_laptop_presents_a_token_the_api_issued_never_its_own() {
    let dir = tempfile::tempdir().unwrap();
    // One fake cluster: the laptop reaches the store's pod through it, and the store server
    // reviews tokens with it. The store listens where the pod is (its address is chosen first).
    let store_addr = "127.0.0.188:7447";
    let mut world = World::with_store(store_addr.parse().unwrap(), "Running");
    world.tokens = team_world().tokens;
    // The kubeconfig user's own bearer token: were it sent on, it would be alice's.
    world.tokens.insert(
        "not-a-secret".into(),
        ("alice".into(), vec!["api".into(), "ktfs".into()]),
    );
    world.service_accounts.push("team-a/default".into());
    world.service_accounts.push("team-a/builder".into());
    let store_svc = world.services["kt-system/kt-store"].clone();
    world.services.insert("kt-system/other".into(), store_svc);
    let api = FakeApi::start("127.0.0.189", world);
    let _server = spawn_ready(&[
        "server",
        "--listen",
        store_addr,
        "--data-dir",
        dir.path().join("store").to_str().unwrap(),
        "--token-review",
        "--review-kubeconfig",
        api.kubeconfig(dir.path()).to_str().unwrap(),
    ]);
    let cfg = api.kubeconfig(dir.path());
    let none = dir.path().join("no-agent.sock");
    let src = dir.path().join("w.bin");
    std::fs::write(&src, pseudo_random(100_000, 5)).unwrap();
    let outside = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--kubeconfig", cfg.to_str().unwrap()]);
        kt_as("127.0.0.189:1", &none, &[], &a)
    };

    ok(outside(&[
        "put",
        "svc/w",
        "--src",
        src.to_str().unwrap(),
        "-n",
        "team-a",
    ]));
    let ls = ok(outside(&["ls", "svc", "-n", "team-a", "--json"]));
    assert!(ls.contains("\"w\""), "{ls}");
    {
        let seen = api.seen.lock().unwrap();
        assert_eq!(seen.issued.len(), 2, "one token per command");
        assert!(seen.issued.values().all(|(user, auds)| {
            user == "system:serviceaccount:team-a:default" && auds == &vec!["ktfs".to_string()]
        }));
    }
    // RBAC gives this user no ServiceAccount of team-b: one line says so, before any call.
    refused(
        outside(&["ls", "-n", "team-b"]),
        "no token of ServiceAccount team-b/default for the store server: cannot create \
         serviceaccounts/token team-b/default (Forbidden)",
    );
    // The ServiceAccount and the store's Service named by the environment, as the Python
    // package names them (it has no flags).
    let outside_env = |env: &[(&str, &str)], args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--kubeconfig", cfg.to_str().unwrap()]);
        kt_as("127.0.0.189:1", &none, env, &a)
    };
    let ls = ok(outside_env(
        &[
            ("KT_SERVICE_ACCOUNT", "builder"),
            ("KT_STORE_SERVICE", "kt-system/other:7447"),
        ],
        &["ls", "svc", "-n", "team-a", "--json"],
    ));
    assert!(ls.contains("\"w\""), "{ls}");
    assert!(api
        .seen
        .lock()
        .unwrap()
        .issued
        .values()
        .any(|(user, _)| user == "system:serviceaccount:team-a:builder"));
    let out = outside_env(
        &[("KT_STORE_SERVICE", "kt-system/missing:7447")],
        &["ls", "svc", "-n", "team-a"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot reach the store server kt-system/missing:7447"),
        "{}",
        stderr(&out)
    );
    // The kubeconfig's own credential never reached the store server.
    let seen = api.seen.lock().unwrap();
    assert!(!seen.reviews.is_empty());
    assert!(
        seen.reviews.iter().all(|r| r["token"] != "not-a-secret"),
        "{:?}",
        seen.reviews
    );
    assert!(seen
        .reviews
        .iter()
        .all(|r| r["token"].as_str().unwrap().starts_with("issued-team-a-")));
}

/// Whether the server at `addr` closes `c` (it reads to its end) within `within`.
async fn closed(c: &mut tokio::net::TcpStream, within: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 1 << 16];
    let read = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

/// A data-plane connection from `from`, its hello sent.
async fn hello_from(from: &str, addr: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut c = sock.connect(addr.parse().unwrap()).await.unwrap();
    c.write_all(b"KTDP\x01").await.unwrap();
    c
}

/// A caller with no ticket cannot make the store's data plane hold memory or descriptors: a
/// frame that announces 64 MiB (an upload) is refused at its head, before its bytes are read
/// (they were read and held, 64 MiB a connection, and the next ticket check came after); and
/// connections without a ticket from one address are capped, while a caller with a ticket
/// from another is served.
#[test]
fn a_caller_without_a_ticket_cannot_make_the_data_plane_hold_memory_or_descriptors() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let (server, token) = token_server("127.0.0.29", dir.path());
    let addr = server.addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let held = rt.block_on(async {
        let mut c = hello_from("127.0.0.3", &addr).await;
        let mut head = vec![2u8];
        head.extend_from_slice(&(64u32 << 20).to_be_bytes());
        head.extend_from_slice(&[7u8; 32]);
        c.write_all(&head).await.unwrap();
        assert!(
            closed(&mut c, std::time::Duration::from_secs(10)).await,
            "a 64 MiB frame without a ticket was read on"
        );

        let mut held = Vec::new();
        for _ in 0..wire::admission::MAX_UNTICKETED_PER_ADDR {
            held.push(hello_from("127.0.0.3", &addr).await);
        }
        // The server counts a connection once it reads its hello: each of those answers a
        // request (refused: no ticket) once it is counted.
        for c in &mut held {
            c.write_all(&[1, 0, 0, 0, 32]).await.unwrap();
            c.write_all(&[0u8; 32]).await.unwrap();
            let mut answer = [0u8; 5];
            tokio::io::AsyncReadExt::read_exact(c, &mut answer)
                .await
                .unwrap();
        }
        let mut one_more = hello_from("127.0.0.3", &addr).await;
        assert!(
            closed(&mut one_more, std::time::Duration::from_secs(10)).await,
            "a connection over the cap was kept"
        );
        held
    });
    // Meanwhile a caller with the token (and so tickets) puts and gets from 127.0.0.1.
    let src = dir.path().join("w.bin");
    std::fs::write(&src, pseudo_random(200_000, 29)).unwrap();
    let env = [("KT_TOKEN_FILE", token.to_str().unwrap())];
    let nowhere = dir.path().join("no-agent.sock");
    let put = kt_as(
        &server.addr,
        &nowhere,
        &env,
        &["put", "w", "--src", src.to_str().unwrap()],
    );
    ok(put);
    let got = dir.path().join("got.bin");
    ok(kt_as(
        &server.addr,
        &nowhere,
        &env,
        &["get", "w", "--dest", got.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&src).unwrap());
    drop(held);
}

/// Junk tokens cost the Kubernetes API little: a refused token is remembered as an accepted
/// one is (one review however often it comes back), and an address that sends new junk tokens
/// without end gets a burst of reviews, then a few a second, and is told to wait (400 junk
/// tokens made 400 reviews).
#[test]
fn junk_tokens_make_few_token_reviews() {
    use ktfs::auth::Credential;
    use ktfs::proto::ListRequest;
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start("127.0.0.33", team_world());
    let server = review_server("127.0.0.34", &api, dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let list = |token: String| {
        let addr = server.addr.clone();
        async move {
            let store =
                ktfs::rpc::client::connect_store(&addr, &Credential::token(&token).unwrap())
                    .await
                    .unwrap();
            let req = ListRequest {
                namespace: "team-a".into(),
                ..Default::default()
            };
            store.list(req).await.expect_err("a junk token").to_string()
        }
    };
    let reviews_of = |token: &str| {
        let seen = api.seen.lock().unwrap();
        seen.reviews.iter().filter(|r| r["token"] == token).count()
    };
    rt.block_on(async {
        for _ in 0..30 {
            let why = list("junk".into()).await;
            assert!(why.contains("refused"), "{why}");
        }
    });
    assert_eq!(reviews_of("junk"), 1);

    let started = std::time::Instant::now();
    let answers: Vec<String> = rt.block_on(async {
        futures_util::future::join_all((0..200).map(|i| list(format!("junk-{i}")))).await
    });
    let elapsed = started.elapsed().as_secs_f64();
    let reviews = api.seen.lock().unwrap().reviews.len() - 1;
    assert!(
        (reviews as f64) <= 21.0 + 5.0 * elapsed,
        "{reviews} reviews in {elapsed:.1} s"
    );
    assert!(
        answers
            .iter()
            .any(|a| a.contains("too many tokens to review")),
        "{:?}",
        &answers[..3]
    );
}

/// Every file named `name` below `dir`.
fn files_named(dir: &Path, name: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type().unwrap().is_dir() {
            true => files_named(&e.path(), name),
            false => usize::from(e.file_name() == name),
        })
        .sum()
}

/// Node n1's agent on `ip`, in `dir/n1`, presenting the node agent's token (bound to n1 in
/// [`team_world`]).
fn n1_agent(ip: &str, server: &str, dir: &Path) -> AgentProc {
    let n1_dir = dir.join("n1");
    std::fs::create_dir_all(&n1_dir).unwrap();
    let token = dir.join("node.token");
    std::fs::write(&token, "tok-node").unwrap();
    start_agent_with(
        ip,
        server,
        &n1_dir,
        "n1",
        &["--token-file", token.to_str().unwrap()],
    )
}

/// A publish in team b of a key whose one file is one block, `hash` of `len` bytes.
fn naming_block(ns: &str, hash: &[u8], len: u32) -> ktfs::proto::PublishRequest {
    use ktfs::proto::{BlockRef, EntryKind, FileEntry, Manifest};
    ktfs::proto::PublishRequest {
        namespace: ns.into(),
        key: "stolen".into(),
        manifest: Some(Manifest {
            block_size: 4 << 20,
            entries: vec![FileEntry {
                kind: EntryKind::File as i32,
                size: u64::from(len),
                blocks: vec![BlockRef {
                    hash: hash.to_vec(),
                    len,
                }],
                mode: 0o644,
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
}

/// Asks the agent at `sock` to publish in place a file of 1 MiB of zeros in `dir` as the
/// block `hash`: refused, since the agent hashes what it is to serve.
async fn refused_in_place(sock: &Path, dir: &Path, hash: &[u8]) {
    use ktfs::proto::{LocalFile, PublishLocalRequest};
    let decoy = dir.join("decoy.bin");
    std::fs::write(&decoy, vec![0u8; 1 << 20]).unwrap();
    let mut agent = ktfs::rpc::client::connect_agent(sock).await.unwrap();
    let err = agent
        .publish_local(PublishLocalRequest {
            publish: Some(naming_block("team-b", hash, 1 << 20)),
            files: vec![LocalFile {
                entry_path: String::new(),
                disk_path: decoy.display().to_string(),
            }],
        })
        .await
        .unwrap_err();
    assert!(
        err.message().contains("does not hold the bytes"),
        "{}",
        err.message()
    );
}

/// A block hash is no read capability (issue 42, item 1): team b, knowing the hashes of team
/// a's blocks, is told they are missing, cannot publish a key naming them (nor learn their
/// length), cannot have a node serve them in place, and must upload the bytes itself, after
/// which the store still holds them once. Team a's keys were put before the store separated
/// namespaces: their references are rebuilt when it starts with authentication.
#[test]
fn a_block_hash_reads_nothing_across_namespaces() {
    use ktfs::proto::{Locale, MissingBlocksRequest, ResolveRequest};
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let secret = dir.path().join("secret.env");
    std::fs::write(&secret, b"DB_PASSWORD=hunter2\n").unwrap();
    let big = dir.path().join("big.bin");
    let big_data = pseudo_random(1 << 20, 36);
    std::fs::write(&big, &big_data).unwrap();
    let (secret_s, big_s) = (secret.to_str().unwrap(), big.to_str().unwrap());
    let store_dir = dir.path().join("store");

    // Before tenants: a store without authentication.
    let open = spawn_ready(&[
        "server",
        "--listen",
        "127.0.0.37:0",
        "--data-dir",
        store_dir.to_str().unwrap(),
    ]);
    ok(kt_as(
        &open.addr,
        &none,
        &[],
        &["put", "cfg/secret", "--src", secret_s, "-n", "team-a"],
    ));
    drop(open);

    let api = FakeApi::start("127.0.0.36", team_world());
    let server = review_server("127.0.0.37", &api, dir.path());
    let a = [("KT_TOKEN", "tok-a")];
    let b = [("KT_TOKEN", "tok-b")];
    let kt = |env: &[(&str, &str)], args: &[&str]| kt_as(&server.addr, &none, env, args);
    ok(kt(&a, &["put", "cfg/big", "--src", big_s, "-n", "team-a"]));
    let small_hash = blake3::hash(b"DB_PASSWORD=hunter2\n").as_bytes().to_vec();
    let big_hash = blake3::hash(&big_data).as_bytes().to_vec();
    let naming = naming_block;

    // n1's agent, where team b's pod runs.
    let n1 = n1_agent("127.0.0.38", &server.addr, dir.path());

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let connect = |token: &str| {
            let cred = ktfs::auth::Credential::token(token).unwrap();
            let addr = server.addr.clone();
            async move {
                ktfs::rpc::client::connect_store(&addr, &cred)
                    .await
                    .unwrap()
            }
        };
        let (store_a, store_b) = (connect("tok-a").await, connect("tok-b").await);
        let ask = |ns: &str| MissingBlocksRequest {
            hashes: vec![small_hash.clone(), big_hash.clone()],
            namespace: ns.into(),
        };
        // Team a's blocks are its own: the one put before tenants too (rebuilt).
        let missing = store_a.missing_blocks(ask("team-a")).await.unwrap();
        assert!(missing.hashes.is_empty(), "{:?}", missing.hashes.len());
        // To team b they are missing, and asking in team a's name is refused.
        let missing = store_b.missing_blocks(ask("team-b")).await.unwrap();
        assert_eq!(missing.hashes, [small_hash.clone(), big_hash.clone()]);
        let err = store_b.missing_blocks(ask("team-a")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");

        // A key of b's own naming them is refused as missing, under their true length or
        // another, and the answer tells no length.
        for (hash, len) in [(&small_hash, 20), (&big_hash, 1 << 20), (&big_hash, 999)] {
            let err = store_b
                .publish(naming("team-b", hash, len))
                .await
                .unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("not in the store"), "{msg}");
            assert!(
                !msg.contains("bytes in the store") && !msg.contains(&(1u32 << 20).to_string()),
                "{msg}"
            );
        }
        // Nor may b's pod name a node as the holder: only that node's agent publishes in place.
        let mut local = naming("team-b", &big_hash, 1 << 20);
        local.locale = Locale::Local as i32;
        local.origin_node = "n1".into();
        let err = store_b.publish(local.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        assert!(
            err.to_string().contains("may not publish in place"),
            "{err}"
        );

        // Through n1's agent, b's file of the right size but other bytes is refused: the agent
        // hashes what it is to serve.
        refused_in_place(&n1.socket, dir.path(), &big_hash).await;
        let err = store_b
            .resolve(ResolveRequest {
                watcher: 0,
                namespace: "team-b".into(),
                key: "stolen".into(),
                inline_up_to: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    });

    // Once b uploads the bytes itself, they are b's too; the store keeps one copy.
    let put: serde_json::Value = serde_json::from_str(&ok(kt(
        &b,
        &["put", "mine/big", "--src", big_s, "-n", "team-b", "--json"],
    )))
    .unwrap();
    assert!(
        put["bytes_transferred"].as_u64().unwrap() >= 1 << 20,
        "{put}"
    );
    let back = dir.path().join("back.bin");
    ok(kt(
        &b,
        &[
            "get",
            "mine/big",
            "-n",
            "team-b",
            "--dest",
            back.to_str().unwrap(),
        ],
    ));
    assert_eq!(std::fs::read(&back).unwrap(), big_data);
    let name = blake3::hash(&big_data).to_hex().to_string();
    assert_eq!(files_named(&store_dir.join("blocks"), &name), 1);
}

/// A node agent acts for the callers on its socket in their own namespaces only (issue 42,
/// item 2): it presents each caller's token beside its node's, and the store checks the
/// namespace against the caller's. Without that, any process that reached the socket published
/// in place into any namespace under the node's credential.
#[test]
fn a_node_agent_acts_in_its_callers_namespaces_only() {
    use ktfs::proto::{LocalFile, PublishLocalRequest};
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start("127.0.0.47", team_world());
    let server = review_server("127.0.0.48", &api, dir.path());
    let agent = n1_agent("127.0.0.49", &server.addr, dir.path());
    let data = pseudo_random(100_000, 47);
    let file = dir.path().join("w.bin");
    std::fs::write(&file, &data).unwrap();
    let hash = blake3::hash(&data).as_bytes().to_vec();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let publish = |ns: &str, token: Option<&str>| {
        let mut req = naming_block(ns, &hash, data.len() as u32);
        req.key = "in-place".into();
        let mut call = tonic::Request::new(PublishLocalRequest {
            publish: Some(req),
            files: vec![LocalFile {
                entry_path: String::new(),
                disk_path: file.display().to_string(),
            }],
        });
        if let Some(t) = token {
            call.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        rt.block_on(async {
            let mut a = ktfs::rpc::client::connect_agent(&agent.socket)
                .await
                .unwrap();
            a.publish_local(call).await.map(|_| ())
        })
    };
    let err = publish("team-a", Some("tok-b")).unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains("the caller on the node's socket")
            && err.message().contains("may use namespace team-b only"),
        "{}",
        err.message()
    );
    let err = publish("team-a", None).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    assert!(err.message().contains("no credential"), "{}", err.message());
    publish("team-b", Some("tok-b")).expect("b publishes in place in its own namespace");
    // Team a's namespace holds nothing b put there.
    let none = dir.path().join("no-agent.sock");
    let out = kt_as(
        &server.addr,
        &none,
        &[("KT_TOKEN", "tok-a")],
        &["ls", "in-place", "-n", "team-a"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    // A seed names the key it got: team a puts the same bytes in the store; b, holding them,
    // cannot make the node a source of a's version, neither naming a's key nor its own.
    ok(kt_as(
        &server.addr,
        &none,
        &[("KT_TOKEN", "tok-a")],
        &["put", "w", "--src", file.to_str().unwrap(), "-n", "team-a"],
    ));
    let (version, manifest) = rt.block_on(async {
        let cred = ktfs::auth::Credential::token("tok-a").unwrap();
        let store = ktfs::rpc::client::connect_store(&server.addr, &cred)
            .await
            .unwrap();
        let r = store
            .resolve(ktfs::proto::ResolveRequest {
                namespace: "team-a".into(),
                key: "w".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        (r.version, r.manifest)
    });
    let seed = |ns: &str, key: &str, token: &str| {
        let mut call = tonic::Request::new(ktfs::proto::AddSourceRequest {
            version: version.clone(),
            manifest: manifest.clone(),
            files: vec![LocalFile {
                entry_path: String::new(),
                disk_path: file.display().to_string(),
            }],
            namespace: ns.into(),
            key: key.into(),
        });
        call.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        rt.block_on(async {
            let mut a = ktfs::rpc::client::connect_agent(&agent.socket)
                .await
                .unwrap();
            a.add_source(call).await.map(|_| ())
        })
    };
    let err = seed("team-a", "w", "tok-b").unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let err = seed("team-b", "in-place", "tok-b").unwrap_err();
    assert!(err.message().contains("is not at version"), "{err}");
    seed("team-a", "w", "tok-a").expect("a seeds its own key's version");
}
