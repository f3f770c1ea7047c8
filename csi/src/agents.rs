//! One node agent for every namespace mounted on this node: one block cache, one node id.
//!
//! The agent is `kt agent --host-mounts` (cache `CACHE_DIR`, socket `STATE_DIR/agents/node.sock`,
//! pid `STATE_DIR/agents/node.pid`, log `STATE_DIR/logs/node.log`); namespace `NS` is mounted in
//! its process at `STATE_DIR/mounts/NS` (`kt attach`), shared by every volume of that namespace.
//! The agent runs under `kt keeper` (socket `STATE_DIR/agents/keeper.sock`), which holds the
//! mounts' FUSE devices and starts the agent again when it dies: readers of a volume see a
//! pause, never "transport endpoint is not connected". Both are started in their own session,
//! so they outlive kt-csi: a restarted kt-csi finds the mounts in the mount table and the agent
//! on its socket, and the volumes published from them never notice.
//!
//! Publishes run concurrently (one at a time per volume, see [`crate::guard`]), but the steps
//! here are shared by every volume, so [`Agents::ensure`] serialises them itself: per
//! namespace, the check, detach and attach of its mount (two volumes of one namespace would
//! otherwise both find no mount and both attach, or one detach the mount the other just made);
//! and, across namespaces, the start of the one node agent (two first publishes would start
//! two keepers on one socket). Publishes of namespaces already mounted only take their own
//! namespace's lock, briefly.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::mounts::{self, MountError, Probe};

/// How long a stat of a namespace mount may take before it counts as hung.
const RESPONSE_LIMIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);
/// Ends the mount point of a namespace's mount with stale reads.
pub const STALE_SUFFIX: &str = "@stale-reads";

#[derive(Debug, Clone)]
pub struct AgentsConfig {
    /// The `kt` binary.
    pub kt: PathBuf,
    /// The store server, host:port.
    pub server: String,
    /// This node's id; the node agent registers with the store under it.
    pub node_id: String,
    /// The node agent's block cache.
    pub cache_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Address the agents listen on for peers (port chosen by the system).
    pub agent_ip: String,
    pub agent_port: u16,
    /// Byte budget of the node's cache (`kt agent --cache-size`), or kt's default.
    pub cache_size: Option<String>,
    /// Topology zone passed to the agents.
    pub zone: Option<String>,
    /// How long a new agent may take to answer on its socket.
    pub mount_timeout: Duration,
    /// The certificate the node agent's port presents (`kt agent --tls-cert --tls-key`): with
    /// it the port speaks TLS only. Whom the agent trusts as a client (`KT_TLS_CA`,
    /// `KT_TLS_SERVER_NAME`) it inherits from kt-csi's environment.
    pub tls: Option<AgentTls>,
}

/// A PEM certificate chain (leaf first) and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is already a mount point of something else ({fstype} {source_name})")]
    Occupied {
        path: PathBuf,
        fstype: String,
        source_name: String,
    },
    #[error("the ktfs mount at {0} does not respond")]
    Hung(PathBuf),
    #[error("the node agent exited ({status}) before it answered; its log says: {log}")]
    Exited {
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("the node agent did not answer on {path} within {secs} s; its log says: {log}")]
    Timeout {
        path: PathBuf,
        secs: u64,
        log: String,
    },
    #[error("mounting namespace {ns} at {path}: {message}")]
    Attach {
        ns: String,
        path: PathBuf,
        message: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// The node agent and its namespace mounts. Clones share the locks.
#[derive(Debug, Clone)]
pub struct Agents {
    cfg: AgentsConfig,
    locks: Arc<Locks>,
}

/// What [`Agents::ensure`] serialises (see the module's header). Blocking locks: `ensure`
/// runs on a blocking thread. Their data is on disk and in the mount table, checked again by
/// whoever takes a lock next, so a lock poisoned by a panic is taken as it is.
#[derive(Debug, Default)]
struct Locks {
    /// Starting the node agent.
    start: Mutex<()>,
    /// One lock per namespace, for its mount. Never shrinks: namespace mounts stay too.
    namespaces: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

fn take<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agents {
    pub fn new(cfg: AgentsConfig) -> Self {
        Agents {
            cfg,
            locks: Arc::default(),
        }
    }

    fn namespace_lock(&self, ns: &str) -> Arc<Mutex<()>> {
        take(&self.locks.namespaces)
            .entry(ns.to_string())
            .or_default()
            .clone()
    }

    pub fn config(&self) -> &AgentsConfig {
        &self.cfg
    }

    /// Where namespace `ns` is mounted: one mount of it for the volumes that read stale
    /// while no store server answers, another for the rest (a mount's semantics are the
    /// whole mount's; `@` is in no namespace name, so the two never meet another's).
    pub fn mountpoint(&self, ns: &str, stale_reads: bool) -> PathBuf {
        let name = match stale_reads {
            false => ns.to_string(),
            true => format!("{ns}{STALE_SUFFIX}"),
        };
        self.cfg.state_dir.join("mounts").join(name)
    }

    pub fn log_path(&self) -> PathBuf {
        self.cfg.state_dir.join("logs").join("node.log")
    }

    pub fn pid_path(&self) -> PathBuf {
        self.cfg.state_dir.join("agents").join("node.pid")
    }

    fn socket_path(&self) -> PathBuf {
        self.cfg.state_dir.join("agents").join("node.sock")
    }

    fn keeper_path(&self) -> PathBuf {
        self.cfg.state_dir.join("agents").join("keeper.sock")
    }

    /// The pid recorded for the node agent, if any.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_path())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The mount point of namespace `ns`, mounted and answering: an existing mount is reused
    /// (also one made for an earlier kt-csi), a dead one is detached and made again, and the
    /// node agent is started first if it does not answer. Blocking; calls for one namespace
    /// wait for each other, and a call that starts the node agent holds up the others that
    /// need it until it answers.
    pub fn ensure(&self, ns: &str, stale_reads: bool) -> Result<PathBuf, AgentError> {
        let ns_lock = self.namespace_lock(ns);
        let _ns = take(&ns_lock);
        let mp = self.mountpoint(ns, stale_reads);
        match mounts::lookup(&mp)? {
            Some(e) if e.is_ktfs(ns) => match mounts::probe(&mp, RESPONSE_LIMIT) {
                Probe::Answers => return Ok(mp),
                Probe::Hangs => return Err(AgentError::Hung(mp)),
                Probe::Fails(err) => {
                    tracing::warn!(namespace = ns, mountpoint = %mp.display(), error = %err,
                        "the ktfs mount's agent is gone; detaching it and mounting again");
                    mounts::detach(&mp)?;
                }
            },
            Some(e) => {
                return Err(AgentError::Occupied {
                    path: mp,
                    fstype: e.fstype,
                    source_name: e.source,
                })
            }
            None => {}
        }
        if !self.agent_answers() {
            let _start = take(&self.locks.start);
            // Another namespace's publish may have started it while this one waited.
            let started_meanwhile = self.agent_answers();
            if started_meanwhile {
                tracing::debug!(namespace = ns, "the node agent was started meanwhile");
            } else if UnixStream::connect(self.keeper_path()).is_ok() {
                // The keeper is restarting its agent.
                self.wait_for_agent(None)?;
            } else {
                self.start_agent()?;
            }
        }
        self.attach(ns, &mp, stale_reads)?;
        Ok(mp)
    }

    fn agent_answers(&self) -> bool {
        UnixStream::connect(self.socket_path()).is_ok()
    }

    /// Asks the node agent to mount `ns` at `mp` (`kt attach`), and checks the mount table.
    fn attach(&self, ns: &str, mp: &Path, stale_reads: bool) -> Result<(), AgentError> {
        std::fs::create_dir_all(mp).map_err(io(format!("creating {}", mp.display())))?;
        let out = Command::new(&self.cfg.kt)
            .arg("attach")
            .arg(mp)
            .args(["--namespace", ns])
            .args(stale_reads.then_some("--stale-reads"))
            .arg("--agent")
            .arg(self.socket_path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("running {} attach", self.cfg.kt.display())))?;
        let attach_err = |message: String| AgentError::Attach {
            ns: ns.to_string(),
            path: mp.to_path_buf(),
            message,
        };
        if !out.status.success() {
            let msg = String::from_utf8_lossy(&out.stderr);
            return Err(attach_err(
                msg.split_whitespace().collect::<Vec<_>>().join(" "),
            ));
        }
        if !mounts::lookup(mp)?.is_some_and(|e| e.is_ktfs(ns)) {
            return Err(attach_err(
                "the agent answered but the mount is not there".into(),
            ));
        }
        tracing::info!(namespace = ns, mountpoint = %mp.display(), "namespace mounted");
        Ok(())
    }

    /// Starts the node agent in its own session and waits until it answers on its socket.
    fn start_agent(&self) -> Result<(), AgentError> {
        let cfg = &self.cfg;
        for d in [
            &cfg.cache_dir,
            &cfg.state_dir.join("mounts"),
            &cfg.state_dir.join("agents"),
            &cfg.state_dir.join("logs"),
        ] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        let log_path = self.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(format!("opening {}", log_path.display())))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log_err = log
            .try_clone()
            .map_err(io(format!("opening {}", log_path.display())))?;
        let mut cmd = Command::new(&cfg.kt);
        cmd.arg("keeper")
            .arg("--socket")
            .arg(self.keeper_path())
            .arg("--")
            .arg(&cfg.kt)
            .args(["agent", "--host-mounts", "--server", &cfg.server])
            .arg("--cache-dir")
            .arg(&cfg.cache_dir)
            .arg("--socket")
            .arg(self.socket_path())
            .args(["--listen", &format!("{}:{}", cfg.agent_ip, cfg.agent_port)])
            .args(["--node-id", &cfg.node_id]);
        if let Some(size) = &cfg.cache_size {
            cmd.args(["--cache-size", size]);
        }
        if let Some(zone) = &cfg.zone {
            cmd.args(["--zone", zone]);
        }
        if let Some(tls) = &cfg.tls {
            cmd.arg("--tls-cert")
                .arg(&tls.cert)
                .arg("--tls-key")
                .arg(&tls.key);
        }
        // Plain log lines, no colour codes.
        cmd.env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SAFETY: setsid is async-signal-safe; the keeper gets its own session and process
        // group, so neither a signal to kt-csi's group nor kt-csi's death reaches it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        tracing::info!(kt = %cfg.kt.display(), "starting the node agent under its keeper");
        let mut child = cmd
            .spawn()
            .map_err(io(format!("starting {}", cfg.kt.display())))?;
        let pid_path = self.pid_path();
        std::fs::write(&pid_path, format!("{}\n", child.id()))
            .map_err(io(format!("writing {}", pid_path.display())))?;
        let waited = self.wait_for_agent(Some((&mut child, log_start)));
        if waited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            return waited;
        }
        tracing::info!(keeper = child.id(), "the node agent answers");
        // Reap the keeper when it ends, so that it never lingers as a zombie of this process.
        std::thread::spawn(move || match child.wait() {
            Ok(status) => tracing::info!(%status, "the node agent's keeper ended"),
            Err(e) => tracing::warn!(error = %e, "waiting for the node agent's keeper"),
        });
        Ok(())
    }

    /// Waits until the node agent answers on its socket; `started` is the keeper this process
    /// just started (whose exit ends the wait) and where its log began.
    fn wait_for_agent(
        &self,
        mut started: Option<(&mut std::process::Child, u64)>,
    ) -> Result<(), AgentError> {
        let log_path = self.log_path();
        let log_start = started.as_ref().map_or(0, |(_, at)| *at);
        let deadline = Instant::now() + self.cfg.mount_timeout;
        while !self.agent_answers() {
            if let Some((child, _)) = started.as_mut() {
                if let Some(status) = child
                    .try_wait()
                    .map_err(io("waiting for the node agent".to_string()))?
                {
                    return Err(AgentError::Exited {
                        status,
                        log: log_tail(&log_path, log_start),
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(AgentError::Timeout {
                    path: self.socket_path(),
                    secs: self.cfg.mount_timeout.as_secs(),
                    log: log_tail(&log_path, log_start),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

/// What the node agent wrote to its log since `from` (its last 2 KiB), on one line.
fn log_tail(path: &Path, from: u64) -> String {
    const MAX: u64 = 2048;
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let start = from.max(len.saturating_sub(MAX));
        if f.seek(SeekFrom::Start(start)).is_ok() {
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            s = String::from_utf8_lossy(&buf).into_owned();
        }
    }
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.is_empty() {
        "(nothing)".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kt::fake_kt;

    /// Node agents whose `kt` writes its arguments, one a line, to `argv` and exits 1: the
    /// start fails, after the command line was recorded.
    fn agents(dir: &Path, tls: Option<AgentTls>) -> Agents {
        let argv = dir.join("argv");
        let body = format!(
            "for a in \"$@\"; do echo \"$a\"; done > '{}'\nexit 1",
            argv.display()
        );
        Agents::new(AgentsConfig {
            kt: fake_kt(dir, &body),
            server: "kt-store.kt-system:7447".into(),
            node_id: "n1".into(),
            cache_dir: dir.join("cache"),
            state_dir: dir.join("state"),
            agent_ip: "10.0.0.7".into(),
            agent_port: 7448,
            cache_size: None,
            zone: None,
            mount_timeout: Duration::from_secs(5),
            tls,
        })
    }

    /// What the spawned `kt keeper` was given, and the agent's part of it (after `--`).
    fn spawned(dir: &Path, agents: &Agents) -> (Vec<String>, Vec<String>) {
        let err = agents.ensure("team", false).unwrap_err();
        assert!(matches!(err, AgentError::Exited { .. }), "{err}");
        let argv: Vec<String> = std::fs::read_to_string(dir.join("argv"))
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let dashes = argv
            .iter()
            .position(|a| a == "--")
            .expect("kt keeper ... -- kt agent");
        let agent = argv[dashes + 1..].to_vec();
        assert_eq!(argv[0], "keeper");
        assert_eq!(agent[1..3], ["agent", "--host-mounts"]);
        (argv, agent)
    }

    fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + 1).map(String::as_str)
    }

    #[test]
    fn the_node_agent_presents_the_certificate_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let tls = AgentTls {
            cert: "/etc/ktfs/tls/tls.crt".into(),
            key: "/etc/ktfs/tls/tls.key".into(),
        };
        let (argv, agent) = spawned(dir.path(), &agents(dir.path(), Some(tls)));
        assert_eq!(
            value_of(&agent, "--tls-cert"),
            Some("/etc/ktfs/tls/tls.crt")
        );
        assert_eq!(value_of(&agent, "--tls-key"), Some("/etc/ktfs/tls/tls.key"));
        assert_eq!(value_of(&agent, "--listen"), Some("10.0.0.7:7448"));
        // The keeper itself serves no port: the flags are the agent's only.
        let keeper = &argv[..argv.len() - agent.len()];
        assert!(!keeper.iter().any(|a| a.starts_with("--tls")), "{keeper:?}");
    }

    #[test]
    fn without_a_certificate_the_node_agent_gets_no_tls_flags() {
        let dir = tempfile::tempdir().unwrap();
        let (argv, _) = spawned(dir.path(), &agents(dir.path(), None));
        assert!(!argv.iter().any(|a| a.starts_with("--tls")), "{argv:?}");
    }
}
