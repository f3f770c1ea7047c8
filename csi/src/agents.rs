//! One `kt mount` per namespace on the node, shared by every volume of that namespace.
//!
//! Namespace `NS` is mounted at `STATE_DIR/mounts/NS` by a `kt mount` process (the node agent
//! with its FUSE mount; cache `CACHE_DIR/NS`, socket `STATE_DIR/agents/NS.sock`, log
//! `STATE_DIR/logs/NS.log`). The process is started in its own session, so it outlives kt-csi:
//! a restarted kt-csi finds the mount in the mount table and keeps using it, and the volumes
//! published from it never notice.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mounts::{self, MountError, Probe};

/// How long a stat of a namespace mount may take before it counts as hung.
const RESPONSE_LIMIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct AgentsConfig {
    /// The `kt` binary.
    pub kt: PathBuf,
    /// The store server, host:port.
    pub server: String,
    /// This node's id; the agent of namespace NS registers as `NODE/NS`.
    pub node_id: String,
    /// Block caches live in `CACHE_DIR/NS`.
    pub cache_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Address the agents listen on for peers (port chosen by the system).
    pub agent_ip: String,
    /// Byte budget of each namespace's cache (`kt mount --cache-size`), or kt's default.
    pub cache_size: Option<String>,
    /// Topology zone passed to the agents.
    pub zone: Option<String>,
    /// How long a new `kt mount` may take to appear in the mount table.
    pub mount_timeout: Duration,
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
    #[error("kt mount for namespace {ns} exited ({status}) before mounting; its log says: {log}")]
    Exited {
        ns: String,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error(
        "kt mount for namespace {ns} did not mount {path} within {secs} s; its log says: {log}"
    )]
    Timeout {
        ns: String,
        path: PathBuf,
        secs: u64,
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// The namespace mounts of this node.
#[derive(Debug, Clone)]
pub struct Agents {
    cfg: AgentsConfig,
}

impl Agents {
    pub fn new(cfg: AgentsConfig) -> Self {
        Agents { cfg }
    }

    pub fn config(&self) -> &AgentsConfig {
        &self.cfg
    }

    pub fn mountpoint(&self, ns: &str) -> PathBuf {
        self.cfg.state_dir.join("mounts").join(ns)
    }

    pub fn log_path(&self, ns: &str) -> PathBuf {
        self.cfg.state_dir.join("logs").join(format!("{ns}.log"))
    }

    pub fn pid_path(&self, ns: &str) -> PathBuf {
        self.cfg.state_dir.join("agents").join(format!("{ns}.pid"))
    }

    fn socket_path(&self, ns: &str) -> PathBuf {
        self.cfg.state_dir.join("agents").join(format!("{ns}.sock"))
    }

    /// The pid recorded for namespace `ns`'s `kt mount`, if any.
    pub fn pid(&self, ns: &str) -> Option<u32> {
        std::fs::read_to_string(self.pid_path(ns))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The mount point of namespace `ns`, mounted and answering: an existing mount is reused
    /// (also one started by an earlier kt-csi), a dead one is detached and replaced, and
    /// otherwise a new `kt mount` is started. Blocking.
    pub fn ensure(&self, ns: &str) -> Result<PathBuf, AgentError> {
        let mp = self.mountpoint(ns);
        match mounts::lookup(&mp)? {
            Some(e) if e.is_ktfs(ns) => match mounts::probe(&mp, RESPONSE_LIMIT) {
                Probe::Answers => return Ok(mp),
                Probe::Hangs => return Err(AgentError::Hung(mp)),
                Probe::Fails(err) => {
                    tracing::warn!(namespace = ns, mountpoint = %mp.display(), error = %err,
                        "the ktfs mount's agent is gone; detaching it and starting a new one");
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
        self.start(ns, &mp)?;
        Ok(mp)
    }

    /// Starts `kt mount` for `ns` in its own session and waits until its mount shows in the
    /// mount table.
    fn start(&self, ns: &str, mp: &Path) -> Result<(), AgentError> {
        let cfg = &self.cfg;
        let cache = cfg.cache_dir.join(ns);
        for d in [
            &cache,
            &cfg.state_dir.join("mounts"),
            &cfg.state_dir.join("agents"),
            &cfg.state_dir.join("logs"),
        ] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        let log_path = self.log_path(ns);
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
        cmd.arg("mount")
            .arg(mp)
            .args(["--server", &cfg.server, "--namespace", ns])
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--socket")
            .arg(self.socket_path(ns))
            .args(["--listen", &format!("{}:0", cfg.agent_ip)])
            .args(["--node-id", &format!("{}/{ns}", cfg.node_id)]);
        if let Some(size) = &cfg.cache_size {
            cmd.args(["--cache-size", size]);
        }
        if let Some(zone) = &cfg.zone {
            cmd.args(["--zone", zone]);
        }
        // Plain log lines, no colour codes.
        cmd.env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SAFETY: setsid is async-signal-safe; the child gets its own session and process group,
        // so neither a signal to kt-csi's group nor kt-csi's death reaches it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        tracing::info!(namespace = ns, mountpoint = %mp.display(), kt = %cfg.kt.display(),
            "starting kt mount");
        let mut child = cmd
            .spawn()
            .map_err(io(format!("starting {}", cfg.kt.display())))?;
        let pid_path = self.pid_path(ns);
        std::fs::write(&pid_path, format!("{}\n", child.id()))
            .map_err(io(format!("writing {}", pid_path.display())))?;
        let deadline = Instant::now() + cfg.mount_timeout;
        loop {
            if mounts::lookup(mp)?.is_some_and(|e| e.is_ktfs(ns)) {
                break;
            }
            if let Some(status) = child
                .try_wait()
                .map_err(io("waiting for kt mount".to_string()))?
            {
                return Err(AgentError::Exited {
                    ns: ns.to_string(),
                    status,
                    log: log_tail(&log_path, log_start),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(AgentError::Timeout {
                    ns: ns.to_string(),
                    path: mp.to_path_buf(),
                    secs: cfg.mount_timeout.as_secs(),
                    log: log_tail(&log_path, log_start),
                });
            }
            std::thread::sleep(POLL);
        }
        tracing::info!(namespace = ns, pid = child.id(), "kt mount is mounted");
        // Reap it when it ends, so that it never lingers as a zombie of this process.
        let ns = ns.to_string();
        std::thread::spawn(move || match child.wait() {
            Ok(status) => tracing::info!(namespace = ns, %status, "kt mount ended"),
            Err(e) => tracing::warn!(namespace = ns, error = %e, "waiting for kt mount"),
        });
        Ok(())
    }
}

/// What `kt mount` wrote to its log since `from` (its last 2 KiB), on one line.
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
