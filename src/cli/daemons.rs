//! The daemons: `kt server`, `kt agent`, `kt mount`, `kt up`, `kt keeper`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use ktfs::agent::{AgentConfig, AgentProcess, DEFAULT_HEARTBEAT};
use ktfs::auth::tls::ServerTls;
use ktfs::auth::Credential;
use ktfs::blocks::cache::DEFAULT_BUDGET;
use ktfs::fs::session::{self, Mounted, Stop};
use ktfs::fs::FsConfig;
use ktfs::k8s::api;
use ktfs::k8s::tokens::ServiceAccountName;
use ktfs::key::Namespace;
use ktfs::server::auth::{AuthConfig, TokenReview};
use ktfs::server::{hostname, StoreServerProcess, StoreSpec};

use kt_host::shutdown_signal;

use super::args::*;

/// Whom a store server started with these flags accepts.
async fn auth_config(a: &ServerAuthArgs) -> Result<AuthConfig> {
    let shared_token = a
        .token_file
        .as_deref()
        .map(ktfs::auth::credential::read_token_file)
        .transpose()?;
    let token_review = if a.token_review {
        let client = match &a.kubeconfig {
            Some(path) => api::client_from_kubeconfig(path, None).await?,
            None => kube::Client::try_default().await.context(
                "TokenReview needs the Kubernetes API (in-cluster, or --review-kubeconfig)",
            )?,
        };
        let nodes = a
            .node_accounts
            .iter()
            .map(|n| {
                ServiceAccountName::parse(n)
                    .with_context(|| format!("--node-account {n:?}: expected NAMESPACE/NAME"))
            })
            .collect::<Result<_>>()?;
        Some(TokenReview {
            client,
            audiences: Some(a.token_audience.clone())
                .filter(|a| !a.is_empty())
                .into_iter()
                .collect(),
            nodes,
        })
    } else {
        None
    };
    Ok(AuthConfig {
        shared_token,
        token_review,
    })
}

/// The certificate a daemon's port presents, if it was given one.
fn server_tls(a: &ServerTlsArgs) -> Result<Option<ServerTls>> {
    match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(ServerTls::from_pem_files(cert, key)?)),
        _ => Ok(None),
    }
}

pub async fn server(a: ServerArgs) -> Result<()> {
    if let Some(ServerAction::Migrate(m)) = a.action {
        return migrate(m).await;
    }
    // Required by the arguments wherever no subcommand is given.
    let data_dir = a
        .data_dir
        .ok_or_else(|| anyhow::anyhow!("kt server needs --data-dir"))?;
    let auth = auth_config(&a.auth).await?;
    let srv = StoreServerProcess::bind_on(
        &a.listen,
        &data_dir,
        Duration::from_secs(a.lease_secs),
        ktfs::clock::system(),
        &StoreSpec {
            meta: a.meta.unwrap_or_default(),
            blocks: a.blocks,
            meta_blocks_under: Some(a.meta_blocks_under),
            shards: a.shards,
        },
    )
    .await?
    .with_auth(auth)
    .with_tls(server_tls(&a.tls)?)
    .with_gc((a.gc_interval_secs > 0).then(|| Duration::from_secs(a.gc_interval_secs)))
    .with_gc_grace(Duration::from_secs(a.gc_grace_secs))
    .with_advertise(a.advertise.clone())
    .with_owner_ttl(Duration::from_secs(a.owner_ttl_secs))
    .with_ticket_secret(a.ticket_secret.clone());
    let stop = shutdown_signal();
    println!("kt server listening on {}", srv.local_addr()?);
    Ok(srv.run(stop).await?)
}

async fn migrate(m: Box<MigrateArgs>) -> Result<()> {
    let engines = StoreSpec {
        meta: m.meta,
        blocks: Some(m.blocks),
        meta_blocks_under: None,
        shards: None,
    };
    let (done, dir) = match (&m.from, &m.to) {
        (Some(from), _) => (ktfs::server::migrate(from, &engines).await?, from),
        (None, Some(to)) => (ktfs::server::migrate_back(&engines, to).await?, to),
        (None, None) => anyhow::bail!("--from DIR or --to DIR"),
    };
    if m.json {
        let out = serde_json::json!({
            "entries": done.entries,
            "blocks": done.blocks,
            "block_bytes": done.block_bytes,
        });
        println!("{out}");
    } else {
        println!(
            "migrated {}: {} metadata entries, {} blocks ({} bytes)",
            dir.display(),
            done.entries,
            done.blocks,
            done.block_bytes
        );
    }
    Ok(())
}

fn agent_config(a: AgentArgs) -> Result<AgentConfig> {
    Ok(AgentConfig {
        server: a.server,
        credential: Credential::from_environment(a.token_file.as_deref())?,
        node_ticket: Default::default(),
        listen: a.listen,
        advertise: a.advertise,
        cache_dir: a.cache_dir,
        cache_size: a.cache_size,
        socket: a.socket,
        node_id: a.node_id.unwrap_or_else(hostname),
        zone: a.zone,
        heartbeat: Duration::from_secs(a.heartbeat_secs.max(1)),
        host_mounts: a.host_mounts,
        tls: server_tls(&a.tls)?,
        fd_keeper: a.fd_keeper,
    })
}

async fn start_agent(mut cfg: AgentConfig) -> Result<AgentProcess> {
    if cfg.zone.is_empty() {
        cfg.zone = api::zone_from_api().await.unwrap_or_default();
    }
    let agent = AgentProcess::bind(cfg).await?;
    if let Err(e) = agent.register().await {
        // A credential that is good but may not act for this node id is this node's
        // configuration, not a passing fault: say so and stop.
        if e.fault() == ktfs::rpc::status::Fault::Denied {
            anyhow::bail!("the store server refused this node: {e}");
        }
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
    let agent = start_agent(agent_config(a)?).await?;
    let stop = shutdown_signal();
    print_agent_ready(&agent);
    Ok(agent.run(stop).await?)
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

/// Runs an agent with its filesystem mounted until `stop` (see [`kt_host::shutdown_signal`]) or
/// unmounted.
async fn run_mounted(
    agent: AgentProcess,
    mounted: Mounted,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agent_task = tokio::spawn(agent.run(async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    mounted
        .serve_until(async {
            stop.await;
            Stop::Unmount
        })
        .await;
    let _ = stop_tx.send(true);
    agent_task.await??;
    Ok(())
}

pub async fn mount(a: MountArgs) -> Result<()> {
    let agent = start_agent(agent_config(a.agent)?).await?;
    let mut fs = fs_config(&agent, &a.namespace, a.locale, a.read_only, a.fanout)?;
    fs.writeback = a.writeback;
    fs.stale_reads = a.stale_reads;
    let mounted = session::mount(agent.blocks(), fs, &a.mountpoint)?;
    let stop = shutdown_signal();
    print_agent_ready(&agent);
    println!("mounted at {}", a.mountpoint.display());
    run_mounted(agent, mounted, stop).await
}

pub async fn keeper(a: KeeperArgs) -> Result<()> {
    let (program, args) = a
        .command
        .split_first()
        .context("no agent command after --")?;
    let code = ktfs::keeper::supervise(&a.socket, program, args).await?;
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
    let auth = ServerAuthArgs {
        token_file: a.token_file.clone(),
        ..Default::default()
    };
    let credential = match &a.token_file {
        Some(path) => Credential::file(path)?,
        None => Credential::none(),
    };
    let srv = StoreServerProcess::bind(
        &a.listen,
        &data_dir.join("store"),
        ktfs::server::DEFAULT_LEASE,
    )
    .await?
    .with_auth(auth_config(&auth).await?);
    let server_addr = srv.local_addr()?.to_string();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server_task = tokio::spawn(srv.run(async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    let agent = start_agent(AgentConfig {
        server: server_addr.clone(),
        credential,
        node_ticket: Default::default(),
        listen: a.agent_listen,
        advertise: None,
        cache_dir: data_dir.join("agent"),
        cache_size: DEFAULT_BUDGET,
        socket: a.socket,
        node_id: hostname(),
        zone: String::new(),
        heartbeat: DEFAULT_HEARTBEAT,
        host_mounts: false,
        tls: None,
        fd_keeper: None,
    })
    .await?;
    // The ready lines come once everything is up, the mount included: whoever waits for
    // them (a script, a test) may use the mount at once.
    let ready = |agent: &_| {
        println!("kt server listening on {server_addr}");
        print_agent_ready(agent);
    };
    let stop = shutdown_signal();
    let result = if a.no_mount {
        ready(&agent);
        println!("data in {}; Ctrl-C to stop", data_dir.display());
        agent.run(stop).await.map_err(anyhow::Error::from)
    } else {
        let fs = fs_config(&agent, Namespace::DEFAULT, LocaleArg::Store, false, 0)?;
        let mounted = session::mount(agent.blocks(), fs, &a.mountpoint)?;
        ready(&agent);
        println!(
            "mounted at {}; data in {}; Ctrl-C to stop",
            a.mountpoint.display(),
            data_dir.display()
        );
        run_mounted(agent, mounted, stop).await
    };
    let _ = stop_tx.send(true);
    server_task.await??;
    result
}

/// `kt gpu-worker`, before its runtime: into its caller's namespaces (the parent of the fork
/// stays behind, and exits with the worker), then down to the caller's ids.
pub fn gpu_worker_prepare(a: &GpuWorkerArgs) -> Result<()> {
    use ktfs::gpu::worker::{enter, spawn::CONTROL_FD};
    if let Some(pid) = a.enter {
        enter::enter(pid, &[CONTROL_FD])?;
    }
    if let Some(uid) = a.uid {
        enter::drop_privileges(uid, a.gid.unwrap_or(uid))?;
    }
    // As the caller, in its filesystem: the link can lead nowhere it could not go itself.
    if let (Some(dir), Some(target)) = (&a.nccl_dir, &a.nccl_target) {
        if let Err(e) = ktfs::gpu::worker::spawn::link_pod_nccl(dir, target) {
            tracing::warn!(dir = %dir.display(), "no link to the pod's NCCL (windows take the host transport): {e}");
        }
    }
    Ok(())
}

/// `kt gpu-worker`: its control socket is the descriptor the agent left at
/// `gpu::worker::spawn::CONTROL_FD`.
pub async fn gpu_worker(a: GpuWorkerArgs) -> Result<()> {
    use std::os::fd::FromRawFd;
    // SAFETY: the agent that started this process put its end of a socket pair there, and
    // nothing else in this process owns that descriptor.
    let control = unsafe {
        std::os::unix::net::UnixStream::from_raw_fd(ktfs::gpu::worker::spawn::CONTROL_FD)
    };
    control.set_nonblocking(true)?;
    let control = tokio::net::UnixStream::from_std(control)?;
    let host = match (&a.host, &a.near) {
        (Some(h), _) => h.clone(),
        (None, Some(near)) => ktfs::gpu::worker::enter::local_address_towards(near)?.to_string(),
        (None, None) => anyhow::bail!("kt gpu-worker needs --host or --near"),
    };
    Ok(ktfs::gpu::worker::run(control, &host).await?)
}
