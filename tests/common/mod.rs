//! A harness for integration tests: real `kt server` and `kt agent` processes on 127.0.0.x
//! addresses, each with its own data directory, driven through the real CLI.
#![allow(dead_code)]

pub mod rig;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

// The generic pieces come from the workspace's shared harness; `spawn_ready_cmd` is its
// `spawn_ready` (this crate's `spawn_ready` takes `kt`'s arguments). Each test file uses some.
#[allow(unused_imports)]
pub use test_support::{
    eventually, is_mounted, lazy_umount, pseudo_random, sh, spawn_ready as spawn_ready_cmd, Proc,
    Tmpfs,
};

pub fn kt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kt")
}

/// Starts `kt ARGS` and waits (on its output, not on a clock) for its ready line; returns the
/// address that follows `listening on `.
pub fn spawn_ready(args: &[&str]) -> Proc {
    let mut cmd = Command::new(kt_bin());
    cmd.args(args).env("RUST_LOG", "warn");
    // A store server's metadata where `KT_TEST_META` says (see [`meta_args`]).
    let data_dir = args
        .iter()
        .position(|a| *a == "--data-dir")
        .and_then(|i| args.get(i + 1));
    if let (Some("server"), Some(dir), false) =
        (args.first().copied(), data_dir, args.contains(&"--meta"))
    {
        cmd.args(meta_args(Path::new(dir)));
    }
    spawn_ready_cmd(cmd)
}

pub fn start_server(ip: &str, data_dir: &Path) -> Proc {
    let args = vec![
        "server".to_string(),
        "--listen".into(),
        format!("{ip}:0"),
        "--data-dir".into(),
        data_dir.to_str().unwrap().into(),
        // Agents heartbeat every second; a lease this long survives a starved machine.
        "--lease-secs".into(),
        "10".into(),
    ];
    spawn_ready_owned(args)
}

/// Where a test's store server keeps its metadata: RocksDB in its data directory, or, with
/// `KT_TEST_META=etcd://HOST:PORT` (the test command runs the metadata-heavy tests so a second
/// time), the etcd there, under a prefix of the server's own, the same for a server restarted
/// on the same data directory.
pub fn meta_args(data_dir: &Path) -> Vec<String> {
    match std::env::var("KT_TEST_META") {
        Ok(base) if !base.is_empty() => {
            let id = blake3::hash(data_dir.as_os_str().as_encoded_bytes()).to_hex();
            vec!["--meta".into(), format!("{base}/t-{}", &id[..16])]
        }
        _ => Vec::new(),
    }
}

pub struct AgentProc {
    pub proc: Proc,
    pub socket: PathBuf,
    pub node_id: String,
}

/// The flags every agent process of the tests gets: its own address, cache, socket and id.
fn agent_args(ip: &str, server: &str, dir: &Path, node_id: &str) -> Vec<String> {
    let socket = dir.join("agent.sock");
    [
        "--server",
        server,
        "--listen",
        &format!("{ip}:0"),
        "--cache-dir",
        dir.join("cache").to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
        "--node-id",
        node_id,
        "--heartbeat-secs",
        "1",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

fn spawn_ready_owned(args: Vec<String>) -> Proc {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_ready(&refs)
}

pub fn start_agent(ip: &str, server: &str, dir: &Path, node_id: &str) -> AgentProc {
    start_agent_with(ip, server, dir, node_id, &[])
}

/// [`start_agent`] with more flags.
pub fn start_agent_with(
    ip: &str,
    server: &str,
    dir: &Path,
    node_id: &str,
    extra: &[&str],
) -> AgentProc {
    let mut args = vec!["agent".to_string()];
    args.extend(agent_args(ip, server, dir, node_id));
    args.extend(extra.iter().map(|a| a.to_string()));
    AgentProc {
        proc: spawn_ready_owned(args),
        socket: dir.join("agent.sock"),
        node_id: node_id.to_string(),
    }
}

/// A store server in a temporary directory.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub server: Proc,
    pub ip: String,
}

impl Cluster {
    pub fn new(ip: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = start_server(ip, &dir.path().join("store"));
        Cluster {
            dir,
            server,
            ip: ip.to_string(),
        }
    }

    /// A cluster whose store server keeps the pipelined tree for a window that names its
    /// fanout (the benchmarks' switch, `KT_BENCH_TOPOLOGY=tree`), for the tests of the tree
    /// itself: users get the swarm.
    pub fn with_tree(ip: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new(kt_bin());
        cmd.args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
            .arg(dir.path().join("store"))
            .args(["--lease-secs", "10"])
            .env("RUST_LOG", "warn")
            .env("KT_BENCH_TOPOLOGY", "tree")
            .args(meta_args(&dir.path().join("store")));
        Cluster {
            server: spawn_ready_cmd(cmd),
            dir,
            ip: ip.to_string(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn agent(&self, ip: &str, node_id: &str) -> AgentProc {
        let d = self.path(node_id);
        std::fs::create_dir_all(&d).unwrap();
        start_agent(ip, &self.server.addr, &d, node_id)
    }

    /// Runs the CLI against this cluster's server with `agent` as the node's agent socket (or
    /// one that does not exist).
    pub fn kt(&self, agent: Option<&AgentProc>, args: &[&str]) -> Output {
        let sock = agent.map_or_else(|| self.path("no-agent.sock"), |a| a.socket.clone());
        kt_with(&self.server.addr, &sock, args)
    }

    /// Like [`Cluster::kt`], and the command must succeed; returns its stdout.
    pub fn ok(&self, agent: Option<&AgentProc>, args: &[&str]) -> String {
        let out = self.kt(agent, args);
        assert!(
            out.status.success(),
            "kt {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Publishes `len` pseudo-random bytes under `key` in blocks of `block` bytes; returns them
    /// and the version's hex id.
    pub fn publish_random(
        &self,
        key: &str,
        len: usize,
        seed: u64,
        block: &str,
    ) -> (Vec<u8>, String) {
        let f = self.path(&format!("{key}.src"));
        let data = pseudo_random(len, seed);
        std::fs::write(&f, &data).unwrap();
        let put = self.json(
            None,
            &[
                "put",
                key,
                "--src",
                f.to_str().unwrap(),
                "--block-size",
                block,
            ],
        );
        (data, put["version"].as_str().unwrap().to_string())
    }

    /// Runs with `--json` and parses the output.
    pub fn json(&self, agent: Option<&AgentProc>, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(self.ok(agent, &a).trim()).expect("json output")
    }
}

impl Cluster {
    /// Starts the CLI in the background; its stdout is piped for [`finish_json`].
    pub fn spawn(&self, agent: Option<&AgentProc>, args: &[&str]) -> Child {
        let sock = agent.map_or_else(|| self.path("no-agent.sock"), |a| a.socket.clone());
        Command::new(kt_bin())
            .args(args)
            .arg("--json")
            .env("KT_SERVER", &self.server.addr)
            .env("KT_AGENT", sock)
            .env_remove("KT_NAMESPACE")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kt")
    }

    /// A broadcast window as `kt window --json` shows it.
    pub fn window(&self, group: &str) -> Option<serde_json::Value> {
        let out = self.kt(None, &["window", group, "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("json"))
    }

    /// Waits until the window has `n` members.
    pub fn wait_members(&self, group: &str, n: usize) {
        assert!(
            eventually(Duration::from_secs(60), || {
                self.window(group)
                    .is_some_and(|w| w["members"].as_array().is_some_and(|m| m.len() >= n))
            }),
            "window {group} never reached {n} members: {:?}",
            self.window(group)
        );
    }
}

/// Waits for a background CLI started by [`Cluster::spawn`], which must succeed; parses its JSON.
pub fn finish_json(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "kt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

pub fn kt_with(server: &str, agent_sock: &Path, args: &[&str]) -> Output {
    Command::new(kt_bin())
        .args(args)
        .env("KT_SERVER", server)
        .env("KT_AGENT", agent_sock)
        .env_remove("KT_NAMESPACE")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run kt")
}

/// `kt ARGS` against `server` with `env` and nothing from the caller's environment that says
/// what to present or whom to trust (no token, no CA, no kubeconfig unless `env` gives one).
pub fn kt_env(server: &str, agent_sock: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(kt_bin());
    cmd.args(args)
        .env("KT_SERVER", server)
        .env("KT_AGENT", agent_sock)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for var in [
        "KT_NAMESPACE",
        "KT_TOKEN",
        "KT_TOKEN_FILE",
        "KUBECONFIG",
        "KT_TLS_CA",
        "KT_TLS_SERVER_NAME",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run kt")
}

/// Asserts two trees are identical: names, kinds, bytes, modes, symlink targets.
pub fn assert_same_tree(a: &Path, b: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let list = |root: &Path| {
        let mut v: Vec<PathBuf> = walk(root)
            .into_iter()
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect();
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(la, lb, "trees differ in their names");
    for rel in la {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = (
            std::fs::symlink_metadata(&pa).unwrap(),
            std::fs::symlink_metadata(&pb).unwrap(),
        );
        assert_eq!(ma.file_type(), mb.file_type(), "{rel:?} kind");
        if ma.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(&pa).unwrap(),
                std::fs::read_link(&pb).unwrap(),
                "{rel:?} target"
            );
        } else if ma.is_file() {
            assert_eq!(
                ma.permissions().mode(),
                mb.permissions().mode(),
                "{rel:?} mode"
            );
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{rel:?} bytes differ"
            );
        }
    }
}

/// Every path below `root`, depth first; what vanishes while it walks (a daemon's temporary
/// files) is left out.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    for p in entries.flatten().map(|e| e.path()) {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.push(p.clone());
        if meta.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// A `kt mount` process; unmounted (SIGTERM, as a user would) when dropped.
pub struct MountProc {
    pub proc: Option<Proc>,
    pub mountpoint: PathBuf,
    pub socket: PathBuf,
    pub node_id: String,
    pub dir: PathBuf,
}

pub fn start_mount(ip: &str, server: &str, dir: &Path, node_id: &str, extra: &[&str]) -> MountProc {
    std::fs::create_dir_all(dir).unwrap();
    let mountpoint = dir.join("kt");
    let mut args = vec![
        "mount".to_string(),
        mountpoint.to_str().unwrap().to_string(),
    ];
    args.extend(agent_args(ip, server, dir, node_id));
    args.extend(extra.iter().map(|s| s.to_string()));
    MountProc {
        proc: Some(spawn_ready_owned(args)),
        mountpoint,
        socket: dir.join("agent.sock"),
        node_id: node_id.to_string(),
        dir: dir.to_path_buf(),
    }
}

/// A store server and two mounts of it, A on `ip_a` (with `a_args`) and B on `ip_b`, once both
/// watch the server's namespace.
pub fn two_watching_mounts(
    ip_a: &str,
    ip_b: &str,
    a_args: &[&str],
) -> (Cluster, MountProc, MountProc) {
    let c = Cluster::new(ip_a);
    let a = start_mount(
        ip_a,
        &c.server.addr,
        &c.path("a"),
        &format!("{ip_a}-a"),
        a_args,
    );
    let b = start_mount(
        ip_b,
        &c.server.addr,
        &c.path("b"),
        &format!("{ip_b}-b"),
        &[],
    );
    watchers(&c.server.addr, 2.0);
    (c, a, b)
}

/// Waits until `n` mounts watch the server's namespaces.
pub fn watchers(server: &str, n: f64) {
    assert!(
        eventually(Duration::from_secs(10), || metric(server, "kt_watchers")
            == n),
        "{n} watchers: {}",
        metric(server, "kt_watchers")
    );
}

impl MountProc {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// Kills the agent without warning, as a crash would, and clears the dead mount.
    pub fn crash(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
        lazy_umount(&self.mountpoint);
    }
}

impl Drop for MountProc {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.stop();
        }
        // Whatever happened, leave no mount behind.
        if is_mounted(&self.mountpoint) {
            lazy_umount(&self.mountpoint);
        }
    }
}

/// The `name` of every entry of a `kt ls --json` answer, in order.
pub fn ls_names(ls: &serde_json::Value) -> Vec<String> {
    ls.as_array()
        .expect("ls --json prints an array")
        .iter()
        .map(|e| e["name"].as_str().expect("name").to_string())
        .collect()
}

/// The `source` of every entry of a `kt get --json` answer's `sources`, in order.
pub fn listed_sources(get: &serde_json::Value) -> Vec<String> {
    get["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| s["source"].as_str().expect("source").to_string())
        .collect()
}

/// Payload bytes a `kt get --json` answer says came from `source`.
pub fn bytes_from(get: &serde_json::Value, source: &str) -> u64 {
    get["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter(|s| s["source"] == source)
        .map(|s| s["bytes"].as_u64().expect("bytes"))
        .sum()
}

/// Sends `sig` to a process this test started.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(pid, sig) };
}

/// One HTTP/1.1 GET; the whole response.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: kt\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// One series of a `/metrics` page at `addr`.
pub fn metric(addr: &str, series: &str) -> f64 {
    let text = http_get(addr, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

/// Runs `f` on a thread of its own whose uid and gid are `id` (raw system calls: they change
/// that thread alone, and it holds no capability then), and returns what it returned.
pub fn as_user<T: Send + 'static>(id: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: raw setgroups/setresgid/setresuid(2) of this thread alone, which ends after.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, id, id, id), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, id, id, id), 0);
        }
        f()
    })
    .join()
    .unwrap()
}
