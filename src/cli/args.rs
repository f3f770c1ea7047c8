//! The arguments of every `kt` command.

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use ktfs::k8s::{api, env, outside, tokens};
use ktfs::manifest::DEFAULT_BLOCK_SIZE;
use ktfs::proto::{Locale, WindowSpec};

use ktfs::rpc::client::default_agent_socket;

#[derive(Parser)]
#[command(
    name = "kt",
    version,
    about = "ktfs: a distributed data store for Kubernetes, seen as a filesystem",
    after_help = super::output::EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

/// Whom this process trusts when it connects: with a CA, every connection (to the store and to
/// peers) is TLS.
#[derive(Args)]
pub struct ClientTlsArgs {
    /// The CA bundle (PEM) that signed the servers' certificates; connect over TLS.
    #[arg(long, env = ktfs::auth::tls::ENV_CA, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Check the servers' certificates against this name instead of the host dialled (one
    /// certificate for every node, or the Service behind --kubeconfig's port-forward).
    #[arg(long, env = ktfs::auth::tls::ENV_SERVER_NAME, global = true)]
    pub tls_server_name: Option<String>,
    /// Check node agents' certificates against this name (default: --tls-server-name, else the
    /// host dialled): the store and the nodes then hold certificates of different names.
    #[arg(long, env = ktfs::auth::tls::ENV_NODE_NAME, global = true)]
    pub tls_node_name: Option<String>,
}

/// This server's certificate: with it, its port speaks TLS only (`/metrics` excepted).
#[cfg(feature = "daemons")]
#[derive(Args, Clone, Default)]
pub struct ServerTlsArgs {
    /// The certificate chain (PEM, leaf first) this port presents.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
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
    #[cfg(feature = "daemons")]
    /// Run the store server.
    Server(ServerArgs),
    #[cfg(feature = "daemons")]
    /// Run a node agent.
    Agent(AgentArgs),
    #[cfg(feature = "daemons")]
    /// Run a node agent with the filesystem mounted.
    Mount(MountArgs),
    #[cfg(feature = "daemons")]
    /// Run a store server and a node agent in one process, on loopback.
    Up(UpArgs),
    /// Show a broadcast window: its quorum, members and tree.
    Window(WindowCmdArgs),
    /// Mount a namespace in this node's agent (one started with --host-mounts).
    Attach(AttachArgs),
    /// Unmount a mount that `kt attach` made.
    Detach(DetachArgs),
    /// This node's view: its agent, cache use, what it served and fetched (`/metrics` on its
    /// port has the rest).
    Status(StatusArgs),
    /// Print node NODE's own token, made from the shared token (`kt server --token-file`): an
    /// agent presenting it (KT_TOKEN or --token-file) may act for node NODE only.
    NodeToken(NodeTokenArgs),
    /// Run a node agent under a keeper of its FUSE devices: when the agent dies it is started
    /// again on the same mounts, and readers see a pause, not an error.
    #[cfg(feature = "daemons")]
    Keeper(KeeperArgs),
    /// A GPU transfer worker: started by the node agent, in its caller's namespaces.
    #[cfg(feature = "daemons")]
    #[command(hide = true)]
    GpuWorker(GpuWorkerArgs),
}

#[cfg(feature = "daemons")]
#[derive(Args)]
pub struct GpuWorkerArgs {
    /// The address other workers reach this one's data port at.
    #[arg(long, conflicts_with = "near")]
    pub host: Option<String>,
    /// Listen on this host's address towards NODE_IP (in a pod: the pod's address).
    #[arg(long, value_name = "NODE_IP")]
    pub near: Option<String>,
    /// Join the IPC, network, PID and mount namespaces of this process (a pod's) first.
    #[arg(long, value_name = "PID")]
    pub enter: Option<u32>,
    /// Run as this uid (the caller's), with no capability.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Run as this gid (the caller's).
    #[arg(long, requires = "uid")]
    pub gid: Option<u32>,
    /// Once in the pod, make `libnccl.so` in this directory, a link to --nccl-target (the
    /// NCCL the caller uses, a path in the pod).
    #[arg(long, requires = "nccl_target")]
    pub nccl_dir: Option<PathBuf>,
    #[arg(long, requires = "nccl_dir")]
    pub nccl_target: Option<PathBuf>,
}

#[cfg(feature = "daemons")]
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
    /// Write-back: a close returns once the file is journaled on this node, and its publish
    /// follows (within a second while the server keeps up). Weaker than close-to-open: other
    /// nodes see a file when its publish lands; fsync of a file or directory waits for it.
    #[arg(long)]
    pub writeback: bool,
    /// Stale reads: with no store server reachable, go on reading what this node holds (the
    /// listings and versions it last saw, the blocks it cached), refusing writes with EROFS,
    /// until one answers again. Off: such reads fail (close-to-open holds).
    #[arg(long)]
    pub stale_reads: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct NodeTokenArgs {
    /// The node's id, as its agent's --node-id names it.
    pub node: String,
    /// The file holding the shared token (the store server's --token-file).
    #[arg(long, env = "KT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Write the token to this file (created with mode 0600) instead of printing it.
    #[arg(long)]
    pub out: Option<PathBuf>,
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
    #[arg(long, env = "KT_SERVER", default_value_t = env::default_server(), global = true)]
    pub server: String,
    /// Namespace of the keys (in a pod: the pod's, from POD_NAMESPACE).
    #[arg(short = 'n', long, env = "KT_NAMESPACE", default_value_t = env::default_namespace(), global = true)]
    pub namespace: String,
    /// This node's agent socket.
    #[arg(long = "agent", env = "KT_AGENT", default_value_os_t = default_agent_socket(), global = true)]
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
    #[arg(long, env = outside::ENV_CONTEXT, global = true)]
    pub context: Option<String>,
    /// The store server's Service, NAMESPACE/NAME:PORT, for --kubeconfig.
    #[arg(long, env = outside::ENV_STORE_SERVICE, default_value = api::DEFAULT_STORE_SERVICE, global = true)]
    pub store_service: String,
    /// A file holding the token to present to the store server (`KT_TOKEN` gives the token
    /// itself). Default: in a pod, its projected ktfs or ServiceAccount token; with
    /// --kubeconfig, a token the Kubernetes API issues for --service-account.
    #[arg(long, env = "KT_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// With --kubeconfig: the ServiceAccount of the target namespace whose token to ask for
    /// ("": none, for a store server without authentication).
    #[arg(long, env = outside::ENV_SERVICE_ACCOUNT, default_value = tokens::DEFAULT_SERVICE_ACCOUNT, global = true)]
    pub service_account: String,
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
    /// Publish the contents of the source directories, not the directories themselves (one
    /// file: a directory holding it by its name).
    #[arg(short = 'c', long)]
    pub contents: bool,
    /// Trust neither size nor mtime: read and hash every file. (Without it, a put onto an
    /// existing key sends only the files whose size or mtime changed.)
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
    /// Fetches each member serves at once (in the swarm; where a window is a tree, children
    /// per parent).
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
    /// Make the character and block devices the version holds (rsync's -D; needs root).
    /// Without it they are skipped: a manifest is its publisher's word.
    #[arg(long)]
    pub preserve_devices: bool,
    /// Give entries the owner they were published with, and files their set-user-ID and
    /// set-group-ID bits (rsync's -o; the owner needs root). Without it the caller owns what
    /// it gets and those bits are dropped.
    #[arg(long)]
    pub preserve_owner: bool,
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

#[cfg(feature = "daemons")]
#[derive(Subcommand)]
pub enum ServerAction {
    /// Copy a stopped single server's data directory (its RocksDB metadata and its blocks)
    /// into etcd and an object store, for servers started with the same --meta and --blocks;
    /// or with --to, etcd and the object store (their servers stopped) back into a data
    /// directory for a single server. Running it again finishes an interrupted one.
    Migrate(Box<MigrateArgs>),
}

#[cfg(feature = "daemons")]
#[derive(Args)]
pub struct MigrateArgs {
    /// The single server's data directory (its server stopped).
    #[arg(long, required_unless_present = "to", conflicts_with = "to")]
    pub from: Option<PathBuf>,
    /// The other way: the data directory a single server is to serve, copied from --meta and
    /// --blocks (their servers stopped).
    #[arg(long)]
    pub to: Option<PathBuf>,
    /// Where the metadata goes (comes from, with --to): `etcd://HOST:PORT[,...]/PREFIX[?...]`,
    /// as `kt server --meta`.
    #[arg(long, value_name = "URL")]
    pub meta: ktfs::server::MetaSpec,
    /// Where the blocks and manifests go (come from, with --to), as `kt server --blocks`.
    #[arg(long, value_name = "URL")]
    pub blocks: ktfs::objects::ObjectUrl,
    /// Print what was copied as JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(feature = "daemons")]
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ServerArgs {
    #[command(subcommand)]
    pub action: Option<ServerAction>,
    #[arg(long, default_value = "0.0.0.0:7447")]
    pub listen: String,
    /// Required to serve; `migrate` names its own.
    #[arg(long, required = true)]
    pub data_dir: Option<PathBuf>,
    /// Where keys, manifests and attributes live: an etcd cluster,
    /// `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX[?ca=F&cert=F&key=F]`.
    /// Without it, RocksDB in --data-dir.
    #[arg(long, value_name = "URL")]
    pub meta: Option<ktfs::server::MetaSpec>,
    /// Where blocks and manifests live: an object store,
    /// `s3://BUCKET/PREFIX[?endpoint=URL&region=R]`, `gs://BUCKET/PREFIX`,
    /// `az://CONTAINER/PREFIX` or `file:///DIR` (credentials from the environment, as each
    /// cloud's tools read them). Without it, in --data-dir.
    #[arg(long, value_name = "URL")]
    pub blocks: Option<ktfs::objects::ObjectUrl>,
    /// With --meta and --blocks: small blocks (16 KiB or less, files of a few pages) go into
    /// the metadata while its database is under this size, into the object store after (0:
    /// never). Each is one write and one read of etcd instead of an object's PUT and GET.
    /// Keep it well under etcd's --quota-backend-bytes (2 GiB unless set).
    #[arg(long, default_value = "1G", value_parser = parse_size, value_name = "SIZE")]
    pub meta_blocks_under: u64,
    /// The address clients reach this server at (HOST:PORT), which replicas that stand by
    /// name to callers. Default: --listen, or this host's name where --listen is a wildcard.
    #[arg(long, env = "KT_ADVERTISE", value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// With --meta: divides a new store's namespaces into this many shards (1 to 1024), each
    /// owned by one replica at a time, so that the replicas share the writes; a store's count
    /// is fixed once set (every replica serves it; without it, a replica follows the store).
    /// Without shards one replica owns the whole store and the others stand by.
    #[arg(long, value_name = "N")]
    pub shards: Option<u32>,
    /// With --meta: seconds the owner's claim on the store lives without renewal; a replica
    /// standing by takes a dead owner's place within about this long.
    #[arg(long, default_value_t = 3)]
    pub owner_ttl_secs: u64,
    /// With authentication: a file holding a secret (32 bytes or more) every replica of the
    /// store shares, a Kubernetes Secret they all mount; their ticket keys are derived from it,
    /// so a ticket one replica gave holds at the others. Without it, each server keeps keys of
    /// its own in --data-dir.
    #[arg(long, env = "KT_TICKET_SECRET", value_name = "FILE")]
    pub ticket_secret: Option<PathBuf>,
    /// Seconds a node stays a source without a heartbeat.
    #[arg(long, default_value_t = 15)]
    pub lease_secs: u64,
    /// Seconds between garbage collection passes (0: never). Also the least time a removed
    /// version's blocks stay for readers that still have it open.
    #[arg(long, default_value_t = 600)]
    pub gc_interval_secs: u64,
    /// Seconds garbage collection keeps a version or block no key names before deleting it
    /// (0: it deletes at the first pass that finds it so). Set it to at least how long backups
    /// of the metadata (etcd snapshots) are kept: a backup no older restores to keys whose
    /// blocks exist.
    #[arg(long, env = "KT_GC_GRACE_SECS", default_value_t = 0)]
    pub gc_grace_secs: u64,
    #[command(flatten)]
    pub auth: ServerAuthArgs,
    #[command(flatten)]
    pub tls: ServerTlsArgs,
}

/// Whom the store server accepts. With neither a token file nor TokenReview, anyone.
#[cfg(feature = "daemons")]
#[derive(Args, Clone, Default)]
pub struct ServerAuthArgs {
    /// A file holding the shared token: its holder may use every namespace (`kt up`, clusters
    /// without Kubernetes). Clients give it as KT_TOKEN or --token-file.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Check ServiceAccount tokens with the Kubernetes TokenReview API (in-cluster credentials,
    /// or --kubeconfig): a pod's token gives its own namespace only.
    #[arg(long)]
    pub token_review: bool,
    /// The audience tokens must be issued for ("" for the API server's own).
    #[arg(long, default_value = tokens::AUDIENCE)]
    pub token_audience: String,
    /// The ServiceAccount of node agents, NAMESPACE/NAME (repeatable): their tokens may use
    /// every namespace and act as nodes.
    #[arg(long = "node-account", default_values = DEFAULT_NODE_ACCOUNTS)]
    pub node_accounts: Vec<String>,
    /// The kubeconfig for TokenReview when not in a cluster.
    #[arg(long = "review-kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
}

/// The ServiceAccounts of the CSI node plugin (its agents) and controller (it removes deleted
/// volumes' keys), as deploy/ names them.
#[cfg(feature = "daemons")]
pub const DEFAULT_NODE_ACCOUNTS: [&str; 2] =
    ["kt-system/kt-csi-node", "kt-system/kt-csi-controller"];

#[cfg(feature = "daemons")]
#[derive(Args)]
pub struct AgentArgs {
    #[arg(long, env = "KT_SERVER", default_value_t = env::default_server())]
    pub server: String,
    /// A file holding this node's token for the store server (the shared token, or the node
    /// agent's ServiceAccount token; `KT_TOKEN` gives the token itself). Default: in a pod, its
    /// projected ktfs or ServiceAccount token.
    #[arg(long, env = "KT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
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
    #[arg(long, env = "KT_AGENT", default_value_os_t = ktfs::rpc::client::own_agent_socket())]
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
    #[arg(long, env = ktfs::keeper::ENV)]
    pub fd_keeper: Option<PathBuf>,
    #[command(flatten)]
    pub tls: ServerTlsArgs,
}

#[cfg(feature = "daemons")]
#[derive(Args)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    /// Default locale of files written through the mount (per directory: xattr user.kt.locale).
    #[arg(long, value_enum, default_value_t = LocaleArg::Store)]
    pub locale: LocaleArg,
    /// Namespace shown at the mount's root.
    #[arg(short = 'n', long, env = "KT_NAMESPACE", default_value_t = env::default_namespace())]
    pub namespace: String,
    /// Refuse every write with EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Fetches each reader's node serves at once (the implicit window's fanout; default the
    /// server's).
    #[arg(long, default_value_t = 0)]
    pub fanout: u32,
    /// Write-back: a close returns once the file is journaled on this node, and its publish
    /// follows (within a second while the server keeps up). Weaker than close-to-open: other
    /// nodes see a file when its publish lands; fsync of a file or directory waits for it.
    #[arg(long)]
    pub writeback: bool,
    /// Stale reads: with no store server reachable, go on reading what this node holds (the
    /// listings and versions it last saw, the blocks it cached), refusing writes with EROFS,
    /// until one answers again. Off: such reads fail (close-to-open holds).
    #[arg(long)]
    pub stale_reads: bool,
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

#[cfg(feature = "daemons")]
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
    #[arg(long, default_value = env::LOCAL_SERVER)]
    pub listen: String,
    #[arg(long, default_value = "127.0.0.1:7448")]
    pub agent_listen: String,
    #[arg(long, env = "KT_AGENT", default_value_os_t = ktfs::rpc::client::own_agent_socket())]
    pub socket: PathBuf,
    /// A file holding the shared token the store server and this node's agent agree on.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}
