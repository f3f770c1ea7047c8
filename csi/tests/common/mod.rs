//! Harness for kt-csi's integration tests: a real `kt server`, a real kt-csi on a unix socket
//! and the real `kt mount` processes it starts, with real FUSE mounts. Everything started is
//! stopped, and everything mounted unmounted, when the guards drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kt_csi::proto::controller_client::ControllerClient;
use kt_csi::proto::identity_client::IdentityClient;
use kt_csi::proto::node_client::NodeClient;
use kt_csi::proto::volume_capability::access_mode::Mode;
use kt_csi::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use kt_csi::proto::VolumeCapability;
use tonic::transport::Channel;

// The generic pieces come from the workspace's shared harness.
#[allow(unused_imports)]
pub use test_support::{alive, eventually, lazy_umount, mount_points, pattern, require_fuse, Proc};

/// The `kt` binary of this workspace: `target/PROFILE/kt`, next to the `deps` directory this
/// test runs from (Cargo does not tell another package's tests where it is).
pub fn kt_bin() -> PathBuf {
    test_support::workspace_bin("kt")
}

pub fn kt_csi_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kt-csi")
}

/// Starts `cmd` with `RUST_LOG=warn` and waits for its ready line ([`test_support::spawn_ready`]).
pub fn spawn_ready(mut cmd: Command) -> Proc {
    cmd.env("RUST_LOG", "warn");
    test_support::spawn_ready(cmd)
}

/// A `kt server` on `ip` with its data in a temporary directory.
pub struct Store {
    pub dir: tempfile::TempDir,
    pub proc: Proc,
    pub addr: String,
}

impl Store {
    pub fn start(ip: &str) -> Store {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new(kt_bin());
        cmd.args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
            .arg(dir.path().join("store"))
            .args(["--lease-secs", "10"]);
        let proc = spawn_ready(cmd);
        let addr = proc.addr.clone();
        Store { dir, proc, addr }
    }

    /// Runs the CLI against this store (no agent); returns its output.
    pub fn kt(&self, args: &[&str]) -> Output {
        Command::new(kt_bin())
            .args(args)
            .env("KT_SERVER", &self.addr)
            .env("KT_AGENT", self.dir.path().join("no-agent.sock"))
            .env_remove("KT_NAMESPACE")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run kt")
    }

    /// Like [`Store::kt`]; the command must succeed. Returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kt(args);
        assert!(
            out.status.success(),
            "kt {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// The names `kt ls -n NS KEY --json` lists (`[]` when the key does not exist).
    pub fn ls(&self, ns: &str, key: Option<&str>) -> Vec<String> {
        let mut args = vec!["ls", "-n", ns, "--json"];
        args.extend(key);
        let out = self.kt(&args);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("not found"), "kt {args:?} failed: {err}");
            return vec![];
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v.as_array()
            .expect("an array")
            .iter()
            .map(|e| e["name"].as_str().expect("name").to_string())
            .collect()
    }
}

/// Where one kt-csi keeps things, and the guard that cleans up after it and its agents.
pub struct CsiDirs {
    pub dir: tempfile::TempDir,
}

impl CsiDirs {
    pub fn new() -> Self {
        CsiDirs {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }
    /// A fresh directory for pod targets (their parent exists, as the kubelet guarantees).
    pub fn pods(&self) -> PathBuf {
        let p = self.dir.path().join("pods");
        std::fs::create_dir_all(&p).unwrap();
        p
    }
    /// The pid of the node agent that hosts every namespace's mount, from kt-csi's state.
    pub fn agent_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.state().join("agents").join("node.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
    pub fn ns_mount(&self, ns: &str) -> PathBuf {
        self.state().join("mounts").join(ns)
    }
}

impl Drop for CsiDirs {
    fn drop(&mut self) {
        // Every mount below the test directory goes, pods' binds first (deepest first).
        let mut mounted: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|m| m.starts_with(self.dir.path()))
            .collect();
        mounted.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounted.iter().filter(|m| !m.starts_with(self.state())) {
            lazy_umount(m);
        }
        // The node agent: SIGTERM (it unmounts), then SIGKILL if it lingers.
        if let Ok(entries) = std::fs::read_dir(self.state().join("agents")) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "pid") {
                    if let Some(pid) = std::fs::read_to_string(&p)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok())
                    {
                        test_support::terminate(pid, Duration::from_secs(10));
                    }
                }
            }
        }
        for m in mount_points()
            .into_iter()
            .filter(|m| m.starts_with(self.dir.path()))
        {
            lazy_umount(&m);
        }
    }
}

/// Starts kt-csi on the socket of `dirs`, its agents on `agent_ip`.
pub fn start_csi(dirs: &CsiDirs, store: &Store, agent_ip: &str, controller: bool) -> Proc {
    let mut cmd = Command::new(kt_csi_bin());
    cmd.arg("--endpoint")
        .arg(format!("unix://{}", dirs.socket().display()))
        .args(["--node-id", "test-node", "--server", &store.addr])
        .arg("--cache-dir")
        .arg(dirs.cache())
        .arg("--state-dir")
        .arg(dirs.state())
        .arg("--kt")
        .arg(kt_bin())
        .args(["--agent-ip", agent_ip, "--cache-size", "256M"])
        .env_remove("POD_IP")
        .env_remove("KT_ZONE");
    if controller {
        cmd.arg("--controller");
    }
    spawn_ready(cmd)
}

/// Clients of the three CSI services on one connection.
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

pub async fn connect(socket: &Path) -> Clients {
    let ch = kt_csi::client::connect(socket)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    Clients {
        identity: IdentityClient::new(ch.clone()),
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch),
    }
}

pub fn mount_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}
