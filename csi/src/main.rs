//! `kt-csi`: the ktfs CSI driver on a unix socket (see README.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use kt_csi::agents::AgentsConfig;
use kt_csi::server::{serve, ServeConfig};

#[derive(Parser)]
#[command(name = "kt-csi", version, about = "The ktfs CSI driver")]
struct Args {
    /// The CSI endpoint to serve.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name (NodeGetInfo; the node agent registers under it).
    #[arg(long, env = "KT_NODE_ID")]
    node_id: String,
    /// The store server, host:port.
    #[arg(long, env = "KT_SERVER")]
    server: String,
    /// Where the node agent keeps its block cache (one for every namespace).
    #[arg(long, default_value = "/var/cache/kt")]
    cache_dir: PathBuf,
    /// Serve the Controller service too (CreateVolume, DeleteVolume).
    #[arg(long)]
    controller: bool,
    /// The kt binary (default: kt next to kt-csi, else on PATH).
    #[arg(long)]
    kt: Option<PathBuf>,
    /// Namespace mounts, agent sockets, logs and volume records.
    #[arg(long, default_value = "/var/lib/kt-csi")]
    state_dir: PathBuf,
    /// Address the node agent serves peers (and `/metrics`) on.
    #[arg(long, env = "POD_IP", default_value = "0.0.0.0")]
    agent_ip: String,
    /// Its port (0: the system chooses; deploy/ fixes one so that Prometheus can scrape it).
    #[arg(long, default_value_t = 0)]
    agent_port: u16,
    /// Byte budget of each namespace's block cache (e.g. 50G; default: kt's).
    #[arg(long)]
    cache_size: Option<String>,
    /// Topology zone of this node, for nearest-source choice.
    #[arg(long, env = "KT_ZONE")]
    zone: Option<String>,
    /// How long a namespace mount may take to come up.
    #[arg(long, default_value_t = 60)]
    mount_timeout_secs: u64,
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    if a.node_id.is_empty() {
        anyhow::bail!("--node-id must not be empty");
    }
    let cfg = ServeConfig {
        endpoint: a.endpoint,
        node_id: a.node_id.clone(),
        controller: a.controller,
        agents: AgentsConfig {
            kt: a.kt.unwrap_or_else(kt_csi::kt::find_kt),
            server: a.server,
            node_id: a.node_id,
            cache_dir: a.cache_dir,
            state_dir: a.state_dir,
            agent_ip: a.agent_ip,
            agent_port: a.agent_port,
            cache_size: a.cache_size,
            zone: a.zone,
            mount_timeout: Duration::from_secs(a.mount_timeout_secs.max(1)),
        },
    };
    tracing::info!(kt = %cfg.agents.kt.display(), "kt-csi starting");
    serve(cfg, shutdown_signal()).await?;
    Ok(())
}
