//! `kt-csi`: the ktfs CSI driver on a unix socket (see README.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use kt_csi::agents::{AgentTls, AgentsConfig};
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
    /// The certificate chain (PEM, leaf first) the node agent's port presents (`kt agent
    /// --tls-cert`): with it the port speaks TLS only. Give the agent the CA to trust as a
    /// client with KT_TLS_CA (and KT_TLS_SERVER_NAME) in kt-csi's environment.
    #[arg(long, requires = "agent_tls_key")]
    agent_tls_cert: Option<PathBuf>,
    /// Its private key (PEM; `kt agent --tls-key`).
    #[arg(long, requires = "agent_tls_cert")]
    agent_tls_key: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let stop = kt_host::shutdown_signal();
    let a = Args::parse();
    if a.node_id.is_empty() {
        anyhow::bail!("--node-id must not be empty");
    }
    let tls = match (a.agent_tls_cert, a.agent_tls_key) {
        (Some(cert), Some(key)) => {
            for f in [&cert, &key] {
                std::fs::metadata(f).map_err(|e| {
                    anyhow::anyhow!("--agent-tls-cert/--agent-tls-key: {}: {e}", f.display())
                })?;
            }
            if std::env::var_os("KT_TLS_CA").is_none_or(|v| v.is_empty()) {
                tracing::warn!(
                    "the node agent's port speaks TLS (--agent-tls-cert) but KT_TLS_CA is not \
                     set: the agent will speak plaintext to the store and its peers"
                );
            }
            Some(AgentTls { cert, key })
        }
        _ => None,
    };
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
            tls,
        },
    };
    tracing::info!(kt = %cfg.agents.kt.display(), "kt-csi starting");
    serve(cfg, stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: [&str; 5] = ["kt-csi", "--node-id", "n1", "--server", "s:7447"];

    #[test]
    fn the_agent_certificate_comes_with_its_key_or_not_at_all() {
        let both = Args::try_parse_from(BASE.iter().copied().chain([
            "--agent-tls-cert",
            "c.pem",
            "--agent-tls-key",
            "k.pem",
        ]))
        .unwrap();
        assert_eq!(both.agent_tls_cert, Some(PathBuf::from("c.pem")));
        assert_eq!(both.agent_tls_key, Some(PathBuf::from("k.pem")));
        for one in [["--agent-tls-cert", "c.pem"], ["--agent-tls-key", "k.pem"]] {
            assert!(Args::try_parse_from(BASE.iter().copied().chain(one)).is_err());
        }
        let none = Args::try_parse_from(BASE).unwrap();
        assert_eq!((none.agent_tls_cert, none.agent_tls_key), (None, None));
    }
}
