//! The `kt` command line: argument definitions and what each command prints.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use crate::agent::{AgentConfig, AgentProcess};
use crate::client;
use crate::fs::FsConfig;
use crate::get::{self, GetOptions};
use crate::key::{KeyPath, Namespace};
use crate::manifest::DEFAULT_BLOCK_SIZE;
use crate::mount::Mounted;
use crate::mount::Stop;
use crate::proto::{ListRequest, Locale, RemoveRequest, WindowSpec};
use crate::put::{self, PutOptions};
use crate::scan::ScanOptions;
use crate::server::StoreServerProcess;

pub const DEFAULT_SERVER: &str = crate::k8s::LOCAL_SERVER;
pub const DEFAULT_SOCKET: &str = "/tmp/ktfs/agent.sock";

#[derive(Parser)]
#[command(
    name = "kt",
    version,
    about = "ktfs: a distributed data store for Kubernetes, seen as a filesystem"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Publish files or a directory under a key.
    Put(PutArgs),
    /// Copy a published key to local disk.
    Get(GetArgs),
    /// List keys, or the inside of a published directory.
    Ls(LsArgs),
    /// Remove keys.
    Rm(RmArgs),
    /// Run the store server.
    Server(ServerArgs),
    /// Run a node agent.
    Agent(AgentArgs),
    /// Run a node agent with the filesystem mounted.
    Mount(MountArgs),
    /// Run a store server and a node agent in one process, on loopback.
    Up(UpArgs),
    /// Show a broadcast window: its quorum, members and tree.
    Window(WindowCmdArgs),
    /// Mount a namespace in this node's agent (one started with --host-mounts).
    Attach(AttachArgs),
    /// Unmount a mount that `kt attach` made.
    Detach(DetachArgs),
    /// Run a node agent under a keeper of its FUSE devices: when the agent dies it is started
    /// again on the same mounts, and readers see a pause, not an error.
    Keeper(KeeperArgs),
}

#[derive(Args)]
pub struct KeeperArgs {
    /// The keeper's socket; the agent finds it in KT_FD_KEEPER.
    #[arg(long)]
    pub socket: PathBuf,
    /// The agent's command line, after `--` (e.g. `-- kt agent --host-mounts ...`).
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Args)]
pub struct AttachArgs {
    pub mountpoint: PathBuf,
    /// Default locale of files written through the mount.
    #[arg(long, value_enum, default_value_t = LocaleArg::Store)]
    pub locale: LocaleArg,
    /// Refuse every write with EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Readers of one version per source (default the server's).
    #[arg(long, default_value_t = 0)]
    pub fanout: u32,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct DetachArgs {
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Clone)]
pub struct Common {
    /// Store server, host:port (in a pod: the kt-store Service).
    #[arg(long, env = "KT_SERVER", default_value_t = crate::k8s::default_server(), global = true)]
    pub server: String,
    /// Namespace of the keys (in a pod: the pod's, from POD_NAMESPACE).
    #[arg(short = 'n', long, env = "KT_NAMESPACE", default_value_t = crate::k8s::default_namespace(), global = true)]
    pub namespace: String,
    /// This node's agent socket.
    #[arg(long = "agent", env = "KT_AGENT", default_value = DEFAULT_SOCKET, global = true)]
    pub agent: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Show progress and what happens.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// From outside the cluster: reach the store server through this kubeconfig's cluster, by
    /// port-forward to a pod of --store-service (--server is then not used). Blocks come from
    /// the store only: the nodes' agents are not reachable from outside.
    #[arg(long, env = "KT_KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The store server's Service, NAMESPACE/NAME:PORT, for --kubeconfig.
    #[arg(long, default_value = crate::cluster::DEFAULT_STORE_SERVICE, global = true)]
    pub store_service: String,
}

#[derive(Clone, Copy, ValueEnum, Default, PartialEq)]
pub enum LocaleArg {
    #[default]
    Store,
    Local,
}

impl From<LocaleArg> for Locale {
    fn from(l: LocaleArg) -> Self {
        match l {
            LocaleArg::Store => Locale::Store,
            LocaleArg::Local => Locale::Local,
        }
    }
}

#[derive(Args)]
pub struct PutArgs {
    pub key: String,
    /// A file or directory to publish (repeatable). `dir/` or --contents publishes its contents.
    #[arg(long = "src", required = true)]
    pub src: Vec<String>,
    #[arg(long, value_enum, default_value_t = LocaleArg::Store)]
    pub locale: LocaleArg,
    /// Publish the contents of the source directories, not the directories themselves.
    #[arg(short = 'c', long)]
    pub contents: bool,
    /// Replace the key if it already exists.
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Leave out paths matching this rsync pattern (repeatable).
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Keep paths matching this rsync pattern, whatever the excludes and .gitignore say.
    #[arg(long)]
    pub include: Vec<String>,
    /// Expire the key after this many seconds.
    #[arg(long, default_value_t = 0)]
    pub ttl: u64,
    /// Block size in bytes.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: u32,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub common: Common,
}

/// A broadcast window: participants that join the same group form one distribution tree.
#[derive(Args, Clone, Default)]
pub struct WindowArgs {
    /// Close the window's quorum this many seconds after it opened.
    #[arg(long = "broadcast-timeout", value_name = "SECS")]
    pub broadcast_timeout: Option<f64>,
    /// Close the quorum once this many putters and getters have joined.
    #[arg(long)]
    pub world_size: Option<u32>,
    /// Close the quorum once participants from all these addresses have joined.
    #[arg(long, value_delimiter = ',')]
    pub ips: Vec<String>,
    /// The window to join (default: one per key).
    #[arg(long)]
    pub group_id: Option<String>,
    /// Children per parent in the tree.
    #[arg(long)]
    pub fanout: Option<u32>,
}

impl WindowArgs {
    pub fn spec(&self) -> WindowSpec {
        WindowSpec {
            group_id: self.group_id.clone().unwrap_or_default(),
            timeout_ms: self
                .broadcast_timeout
                .map(|s| (s.max(0.0) * 1000.0) as u64)
                .unwrap_or(0),
            world_size: self.world_size.unwrap_or(0),
            ips: self.ips.clone(),
            fanout: self.fanout.unwrap_or(0),
        }
    }

    /// Whether a window was asked for at all.
    pub fn any(&self) -> bool {
        self.broadcast_timeout.is_some()
            || self.world_size.is_some()
            || !self.ips.is_empty()
            || self.group_id.is_some()
    }
}

#[derive(Args)]
pub struct GetArgs {
    pub key: String,
    /// Where to write (a directory, or a file name for a single file).
    #[arg(short = 'd', long, default_value = ".")]
    pub dest: String,
    /// Write the contents of a published directory straight into DEST.
    #[arg(short = 'c', long)]
    pub contents: bool,
    /// Overwrite existing files that differ.
    #[arg(short = 'f', long)]
    pub force: bool,
    #[arg(long)]
    pub exclude: Vec<String>,
    #[arg(long)]
    pub include: Vec<String>,
    /// Offer the fetched data to peers through this node's agent (default).
    #[arg(long = "seed-data", overrides_with = "no_seed_data", action = ArgAction::SetTrue)]
    pub seed_data: bool,
    /// Do not offer the fetched data to peers.
    #[arg(long = "no-seed-data", action = ArgAction::SetTrue)]
    pub no_seed_data: bool,
    /// Write at most this many bytes per second (e.g. 50M).
    #[arg(long, value_parser = parse_size)]
    pub bwlimit: Option<u64>,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct WindowCmdArgs {
    /// The window's group id.
    pub group_id: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct LsArgs {
    pub key: Option<String>,
    /// List everything below, not only the first level.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct RmArgs {
    pub key: String,
    /// Remove a directory and every key below it.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Remove every key whose name starts with KEY.
    #[arg(long)]
    pub prefix: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct ServerArgs {
    #[arg(long, default_value = "0.0.0.0:7447")]
    pub listen: String,
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Seconds a node stays a source without a heartbeat.
    #[arg(long, default_value_t = 15)]
    pub lease_secs: u64,
}

#[derive(Args)]
pub struct AgentArgs {
    #[arg(long, env = "KT_SERVER", default_value_t = crate::k8s::default_server())]
    pub server: String,
    #[arg(long, default_value = "0.0.0.0:7448")]
    pub listen: String,
    /// Address peers use to reach this agent (default: the listen address; POD_IP in a pod).
    #[arg(long, env = "KT_ADVERTISE")]
    pub advertise: Option<String>,
    #[arg(long)]
    pub cache_dir: PathBuf,
    /// Byte budget of the block cache (e.g. 50G, 512M).
    #[arg(long, default_value = "10G", value_parser = parse_size)]
    pub cache_size: u64,
    #[arg(long, env = "KT_AGENT", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// This node's id (default: the host name).
    #[arg(long, env = "KT_NODE_ID")]
    pub node_id: Option<String>,
    /// Topology zone, for nearest-source choice (default: in a pod, the label
    /// topology.kubernetes.io/zone of its node, NODE_NAME, asked of the Kubernetes API).
    #[arg(long, env = "KT_ZONE", default_value = "")]
    pub zone: String,
    #[arg(long, default_value_t = 5)]
    pub heartbeat_secs: u64,
    /// Mount namespaces in this process when asked over the socket (`kt attach`): one agent
    /// and one cache for every mount of the node.
    #[arg(long)]
    pub host_mounts: bool,
    /// The keeper of this agent's FUSE devices (set by `kt keeper`): hosted mounts survive
    /// the agent.
    #[arg(long, env = crate::keeper::ENV)]
    pub fd_keeper: Option<PathBuf>,
}

#[derive(Args)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    /// Default locale of files written through the mount (per directory: xattr user.kt.locale).
    #[arg(long, value_enum, default_value_t = LocaleArg::Store)]
    pub locale: LocaleArg,
    /// Namespace shown at the mount's root.
    #[arg(short = 'n', long, env = "KT_NAMESPACE", default_value_t = crate::k8s::default_namespace())]
    pub namespace: String,
    /// Refuse every write with EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Readers of one version per source (the implicit window's fanout; default the server's).
    #[arg(long, default_value_t = 0)]
    pub fanout: u32,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// Parses a byte count with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['i', 'B', 'b']);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in {s:?}")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s:?}"))
}

#[derive(Args)]
pub struct UpArgs {
    /// Where to mount the filesystem.
    #[arg(default_value = "./kt")]
    pub mountpoint: PathBuf,
    /// Run the store server and the agent without mounting.
    #[arg(long)]
    pub no_mount: bool,
    /// Where the store and the agent keep their data.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_SERVER)]
    pub listen: String,
    #[arg(long, default_value = "127.0.0.1:7448")]
    pub agent_listen: String,
    #[arg(long, env = "KT_AGENT", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

fn progress_bar(verbose: bool) -> ProgressBar {
    if !verbose || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn namespace(c: &Common) -> Result<Namespace> {
    Ok(Namespace::parse(&c.namespace)?)
}

/// With `--kubeconfig`, opens a port-forward to the store server and points `c.server` at it;
/// the forward lasts as long as the value returned.
async fn reach_store(c: &mut Common) -> Result<Option<crate::cluster::Forward>> {
    let Some(path) = &c.kubeconfig else {
        return Ok(None);
    };
    let svc: crate::cluster::ServiceRef = c.store_service.parse()?;
    let client = crate::cluster::client_from_kubeconfig(path, c.context.as_deref()).await?;
    let fwd = crate::cluster::forward_service(client, &svc)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the store server {svc}: {e}"))?;
    if c.verbose {
        eprintln!("store server {svc} through pod {} at {}", fwd.pod, fwd.addr);
    }
    c.server = fwd.addr.to_string();
    Ok(Some(fwd))
}

pub fn print_json(v: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(v)?);
    Ok(())
}

fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

pub async fn put(mut a: PutArgs) -> Result<()> {
    let _forward = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    if a.block_size == 0 || a.block_size > crate::manifest::MAX_BLOCK_SIZE {
        anyhow::bail!(
            "--block-size must be between 1 and {}",
            crate::manifest::MAX_BLOCK_SIZE
        );
    }
    let pb = progress_bar(a.common.verbose);
    let report = put::put(
        PutOptions {
            server: a.common.server.clone(),
            namespace: ns,
            key,
            srcs: a.src,
            scan: ScanOptions {
                block_size: a.block_size,
                contents: a.contents,
                excludes: a.exclude,
                includes: a.include,
            },
            locale: a.locale.into(),
            force: a.force,
            ttl_secs: a.ttl,
            agent_socket: a.common.agent.clone(),
            window: a.window.any().then(|| a.window.spec()),
        },
        &pb,
    )
    .await?;
    pb.finish_and_clear();
    if a.common.json {
        print_json(&report)?;
    } else {
        if let Some(w) = &report.broadcast {
            println!(
                "broadcast window {} {} with {} members{}",
                w.group_id,
                if w.closed { "closed" } else { "open" },
                w.members.len(),
                if w.closed {
                    format!(" (by {})", w.closed_by)
                } else {
                    String::new()
                }
            );
        }
        println!(
            "published {} ({} files, {}, {} sent, locale {}) version {}",
            report.key,
            report.files,
            human(report.bytes),
            human(report.bytes_transferred),
            report.locale,
            &report.version[..16]
        );
    }
    Ok(())
}

pub async fn get(mut a: GetArgs) -> Result<()> {
    let _forward = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    let pb = progress_bar(a.common.verbose);
    let report = get::get(
        GetOptions {
            server: a.common.server.clone(),
            namespace: ns,
            key,
            dest: a.dest,
            contents: a.contents,
            force: a.force,
            excludes: a.exclude,
            includes: a.include,
            seed: !a.no_seed_data,
            agent_socket: a.common.agent.clone(),
            window: a.window.spec(),
            bwlimit: a.bwlimit,
            store_only: _forward.is_some(),
        },
        &pb,
    )
    .await?;
    pb.finish_and_clear();
    if a.common.json {
        print_json(&report)?;
    } else {
        println!(
            "fetched {} to {} ({} files, {}, {} transferred)",
            report.key,
            report.dest,
            report.files,
            human(report.bytes),
            human(report.bytes_transferred)
        );
        if a.common.verbose {
            for s in &report.sources {
                println!("  {} from {} ({})", human(s.bytes), s.source, s.addr);
            }
        }
    }
    Ok(())
}

pub async fn attach(a: AttachArgs) -> Result<()> {
    let ns = namespace(&a.common)?;
    let mountpoint = std::path::absolute(&a.mountpoint)?;
    std::fs::create_dir_all(&mountpoint)?;
    let mut agent = client::connect_agent(&a.common.agent).await?;
    let r = agent
        .mount(crate::proto::MountRequest {
            mountpoint: mountpoint.display().to_string(),
            namespace: ns.to_string(),
            locale: Locale::from(a.locale) as i32,
            read_only: a.read_only,
            fanout: a.fanout,
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    if !a.common.json {
        println!(
            "{} namespace {ns} at {}",
            if r.already_mounted {
                "already mounted:"
            } else {
                "mounted"
            },
            mountpoint.display()
        );
    } else {
        print_json(&serde_json::json!({
            "mountpoint": mountpoint,
            "namespace": ns.to_string(),
            "already_mounted": r.already_mounted,
        }))?;
    }
    Ok(())
}

pub async fn detach(a: DetachArgs) -> Result<()> {
    let mountpoint = std::path::absolute(&a.mountpoint)?;
    let mut agent = client::connect_agent(&a.common.agent).await?;
    agent
        .unmount(crate::proto::UnmountRequest {
            mountpoint: mountpoint.display().to_string(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    Ok(())
}

pub async fn window(mut a: WindowCmdArgs) -> Result<()> {
    let _forward = reach_store(&mut a.common).await?;
    let mut store = client::connect_store(&a.common.server).await?;
    let w = store
        .get_window(crate::proto::GetWindowRequest {
            group_id: a.group_id,
        })
        .await
        .map_err(client::ClientError::from)?
        .into_inner();
    if a.common.json {
        return print_json(&crate::fanout::window_json(&w));
    }
    println!(
        "window {} generation {}: {}{}",
        w.group_id,
        w.generation,
        if w.closed { "closed" } else { "open" },
        if w.closed {
            format!(" by {}", w.closed_by)
        } else {
            String::new()
        }
    );
    for m in &w.members {
        println!(
            "  {:>3} {:<20} parent {:<20} children {:>3} {}",
            m.id,
            if m.node_id.is_empty() {
                "-"
            } else {
                &m.node_id
            },
            if m.parent.is_empty() { "-" } else { &m.parent },
            m.children,
            if m.failed {
                "failed"
            } else if m.done {
                "done"
            } else {
                "receiving"
            }
        );
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct LsEntry {
    name: String,
    is_directory: bool,
    locale: String,
    size: u64,
}

pub async fn ls(mut a: LsArgs) -> Result<()> {
    let _forward = reach_store(&mut a.common).await?;
    let prefix = match &a.key {
        Some(k) => KeyPath::parse_prefix(k)?,
        None => None,
    };
    let ns = namespace(&a.common)?;
    let mut store = client::connect_store(&a.common.server).await?;
    let resp = store
        .list(ListRequest {
            namespace: ns.to_string(),
            prefix: prefix.as_ref().map(|p| p.to_string()).unwrap_or_default(),
            recursive: a.recursive,
        })
        .await
        .map_err(client::ClientError::from)?
        .into_inner();
    if !resp.exists {
        anyhow::bail!("key {} not found", a.key.unwrap_or_default());
    }
    let entries: Vec<LsEntry> = resp
        .entries
        .into_iter()
        .map(|e| LsEntry {
            locale: if e.locale() == Locale::Local && !e.origin_node.is_empty() {
                e.origin_node.clone()
            } else {
                "store".into()
            },
            name: e.name,
            is_directory: e.is_directory,
            size: e.size,
        })
        .collect();
    if a.common.json {
        print_json(&entries)?;
    } else {
        for e in entries {
            println!(
                "{:>10}  {:<12}  {}",
                if e.is_directory {
                    "-".into()
                } else {
                    human(e.size)
                },
                e.locale,
                e.name
            );
        }
    }
    Ok(())
}

pub async fn rm(mut a: RmArgs) -> Result<()> {
    let _forward = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    let mut store = client::connect_store(&a.common.server).await?;
    let removed = store
        .remove(RemoveRequest {
            namespace: ns.to_string(),
            key: key.to_string(),
            recursive: a.recursive,
            prefix: a.prefix,
        })
        .await
        .map_err(client::ClientError::from)?
        .into_inner()
        .removed;
    if a.common.json {
        print_json(&serde_json::json!({ "removed": removed }))?;
    } else {
        for k in &removed {
            println!("removed {k}");
        }
    }
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

pub async fn server(a: ServerArgs) -> Result<()> {
    let srv =
        StoreServerProcess::bind(&a.listen, &a.data_dir, Duration::from_secs(a.lease_secs)).await?;
    println!("kt server listening on {}", srv.local_addr()?);
    srv.run(shutdown_signal()).await
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
}

fn agent_config(a: AgentArgs) -> AgentConfig {
    AgentConfig {
        server: a.server,
        listen: a.listen,
        advertise: a.advertise,
        cache_dir: a.cache_dir,
        cache_size: a.cache_size,
        socket: a.socket,
        node_id: a.node_id.unwrap_or_else(hostname),
        zone: a.zone,
        heartbeat: Duration::from_secs(a.heartbeat_secs.max(1)),
        host_mounts: a.host_mounts,
        fd_keeper: a.fd_keeper,
    }
}

async fn start_agent(mut cfg: AgentConfig) -> Result<AgentProcess> {
    if cfg.zone.is_empty() {
        cfg.zone = crate::cluster::zone_from_api().await.unwrap_or_default();
    }
    let agent = AgentProcess::bind(cfg).await?;
    if let Err(e) = agent.register().await {
        tracing::warn!(error = %e, "not registered yet; will keep trying");
    }
    Ok(agent)
}

fn print_agent_ready(agent: &AgentProcess) {
    let cfg = agent.config();
    let zone = if cfg.zone.is_empty() {
        String::new()
    } else {
        format!(", zone {}", cfg.zone)
    };
    println!(
        "kt agent {} listening on {}, socket {}{zone}",
        cfg.node_id,
        agent.data_addr(),
        cfg.socket.display()
    );
}

pub async fn agent(a: AgentArgs) -> Result<()> {
    let agent = start_agent(agent_config(a)).await?;
    print_agent_ready(&agent);
    agent.run(shutdown_signal()).await
}

fn fs_config(
    agent: &AgentProcess,
    namespace: &str,
    locale: LocaleArg,
    read_only: bool,
    fanout: u32,
) -> Result<FsConfig> {
    Ok(agent.config().fs_config(
        Namespace::parse(namespace)?,
        locale.into(),
        read_only,
        fanout,
    ))
}

/// Runs an agent with its filesystem mounted until signalled or unmounted.
async fn run_mounted(agent: AgentProcess, mounted: Mounted) -> Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agent_task = tokio::spawn(agent.run(async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    mounted
        .serve_until(async {
            shutdown_signal().await;
            Stop::Unmount
        })
        .await;
    let _ = stop_tx.send(true);
    agent_task.await??;
    Ok(())
}

pub async fn mount(a: MountArgs) -> Result<()> {
    let agent = start_agent(agent_config(a.agent)).await?;
    let fs = fs_config(&agent, &a.namespace, a.locale, a.read_only, a.fanout)?;
    let mounted = crate::mount::mount(agent.blocks(), fs, &a.mountpoint)?;
    print_agent_ready(&agent);
    println!("mounted at {}", a.mountpoint.display());
    run_mounted(agent, mounted).await
}

pub async fn keeper(a: KeeperArgs) -> Result<()> {
    let (program, args) = a
        .command
        .split_first()
        .context("no agent command after --")?;
    let code = crate::keeper::supervise(&a.socket, program, args).await?;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

pub async fn up(a: UpArgs) -> Result<()> {
    let data_dir = match a.data_dir {
        Some(d) => d,
        None => {
            let home = std::env::var_os("HOME").context("no --data-dir and no HOME")?;
            PathBuf::from(home).join(".local/share/ktfs")
        }
    };
    let srv = StoreServerProcess::bind(
        &a.listen,
        &data_dir.join("store"),
        crate::server::DEFAULT_LEASE,
    )
    .await?;
    let server_addr = srv.local_addr()?.to_string();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server_task = tokio::spawn(srv.run(async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    let agent = start_agent(AgentConfig {
        server: server_addr.clone(),
        listen: a.agent_listen,
        advertise: None,
        cache_dir: data_dir.join("agent"),
        cache_size: crate::cache::DEFAULT_BUDGET,
        socket: a.socket,
        node_id: hostname(),
        zone: String::new(),
        heartbeat: crate::agent::DEFAULT_HEARTBEAT,
        host_mounts: false,
        fd_keeper: None,
    })
    .await?;
    println!("kt server listening on {server_addr}");
    print_agent_ready(&agent);
    let result = if a.no_mount {
        println!("data in {}; Ctrl-C to stop", data_dir.display());
        agent.run(shutdown_signal()).await
    } else {
        let fs = fs_config(&agent, Namespace::DEFAULT, LocaleArg::Store, false, 0)?;
        let mounted = crate::mount::mount(agent.blocks(), fs, &a.mountpoint)?;
        println!(
            "mounted at {}; data in {}; Ctrl-C to stop",
            a.mountpoint.display(),
            data_dir.display()
        );
        run_mounted(agent, mounted).await
    };
    let _ = stop_tx.send(true);
    server_task.await??;
    result
}
