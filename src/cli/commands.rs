//! The client commands: put, get, ls, rm, window, attach, detach.

use anyhow::Result;

use ktfs::auth::Credential;
use ktfs::broadcast::member::membership;
use ktfs::k8s::outside::{Outside, OutsideError};
use ktfs::key::{KeyPath, Namespace};
use ktfs::manifest::MAX_BLOCK_SIZE;
use ktfs::proto::{
    AgentStatusRequest, GetWindowRequest, ListRequest, Locale, MountRequest, RemoveRequest,
    UnmountRequest,
};
use ktfs::rpc::client::{self, ClientError};
use ktfs::transfer::get::{self, GetOptions, Preserve};
use ktfs::transfer::put::scan::ScanOptions;
use ktfs::transfer::put::{self, PutOptions};

use super::args::*;
use super::output::{human, print_json, progress_bar, CliError};

pub(super) fn namespace(c: &Common) -> Result<Namespace> {
    Ok(Namespace::parse(&c.namespace)?)
}

/// How a command reaches the store server: through a port-forward with `--kubeconfig` (it
/// lasts as long as this value), presenting `credential`.
pub(super) struct Reached {
    _forward: Option<ktfs::k8s::api::Forward>,
    /// Blocks come from the store only: from outside, the nodes' agents are not reachable.
    pub outside: bool,
    pub credential: Credential,
}

/// With `--kubeconfig`, opens a port-forward to the store server and points `c.server` at it,
/// and asks the Kubernetes API for a short-lived token of `--service-account` in the target
/// namespace unless a token was given (`KT_TOKEN`, `--token-file`): the user's own kubeconfig
/// credentials never reach the store server.
async fn reach_store(c: &mut Common) -> Result<Reached> {
    let given = std::env::var_os("KT_TOKEN").is_some() || c.token_file.is_some();
    let Some(path) = c.kubeconfig.clone() else {
        let credential = Credential::from_environment(c.token_file.as_deref())?;
        return Ok(Reached {
            _forward: None,
            outside: false,
            credential,
        });
    };
    let outside = Outside {
        kubeconfig: path,
        context: c.context.clone(),
        store_service: c.store_service.clone(),
        service_account: c.service_account.clone(),
    };
    let fwd = outside.forward().await?;
    if c.verbose {
        eprintln!(
            "store server {} through pod {} at {}",
            c.store_service, fwd.pod, fwd.addr
        );
    }
    c.server = fwd.addr.to_string();
    let credential = if given {
        Credential::from_environment(c.token_file.as_deref())?
    } else {
        let ns = namespace(c)?;
        match outside.token(ns.as_str()).await {
            Ok(Some(token)) => {
                if c.verbose {
                    eprintln!(
                        "presenting a token of ServiceAccount {}",
                        outside.account(ns.as_str())
                    );
                }
                Credential::token(&token)?
            }
            Ok(None) => Credential::none(),
            Err(e @ OutsideError::Denied { .. }) => {
                return Err(CliError::Denied(e.to_string()).into())
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(Reached {
        _forward: Some(fwd),
        outside: true,
        credential,
    })
}

pub async fn put(mut a: PutArgs) -> Result<()> {
    let reached = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    if a.block_size == 0 || a.block_size > MAX_BLOCK_SIZE {
        return Err(CliError::Invalid(format!(
            "--block-size must be between 1 and {MAX_BLOCK_SIZE}"
        ))
        .into());
    }
    let pb = progress_bar(a.common.verbose);
    let report = put::put(
        PutOptions {
            server: a.common.server.clone(),
            credential: reached.credential.clone(),
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
            remotes: Default::default(),
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
    let reached = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    let pb = progress_bar(a.common.verbose);
    let report = get::get(
        GetOptions {
            server: a.common.server.clone(),
            credential: reached.credential.clone(),
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
            store_only: reached.outside,
            preserve: Preserve {
                devices: a.preserve_devices,
                owner: a.preserve_owner,
            },
            remotes: Default::default(),
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
        .mount(MountRequest {
            mountpoint: mountpoint.display().to_string(),
            namespace: ns.to_string(),
            locale: Locale::from(a.locale) as i32,
            read_only: a.read_only,
            fanout: a.fanout,
            writeback: a.writeback,
            stale_reads: a.stale_reads,
        })
        .await
        .map_err(ClientError::from)?
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
        .unmount(UnmountRequest {
            mountpoint: mountpoint.display().to_string(),
        })
        .await
        .map_err(ClientError::from)?;
    Ok(())
}

pub async fn status(a: StatusArgs) -> Result<()> {
    let mut agent = client::connect_agent(&a.common.agent).await?;
    let s = agent
        .status(AgentStatusRequest {})
        .await
        .map_err(ClientError::from)?
        .into_inner();
    if a.common.json {
        return print_json(&serde_json::json!({
            "node_id": s.node_id, "zone": s.zone, "server": s.server, "data_addr": s.data_addr,
            "registered": s.registered,
            "cache_bytes": s.cache_bytes, "cache_budget_bytes": s.cache_budget_bytes,
            "served_bytes": s.bytes_served, "served_blocks": s.blocks_served,
            "fetched_store_bytes": s.fetched_store_bytes, "fetched_peer_bytes": s.fetched_peer_bytes,
        }));
    }
    let zone = if s.zone.is_empty() { "-" } else { &s.zone };
    println!(
        "node {} (zone {zone}) at {}, store server {}{}",
        s.node_id,
        s.data_addr,
        s.server,
        if s.registered {
            ""
        } else {
            " (not registered yet: serving no peers)"
        }
    );
    println!(
        "cache {} of {} ({:.0}%)",
        human(s.cache_bytes),
        human(s.cache_budget_bytes),
        100.0 * s.cache_bytes as f64 / s.cache_budget_bytes.max(1) as f64
    );
    println!(
        "served {} in {} blocks",
        human(s.bytes_served),
        s.blocks_served
    );
    println!(
        "fetched by this agent: {} from the store, {} from peers",
        human(s.fetched_store_bytes),
        human(s.fetched_peer_bytes)
    );
    Ok(())
}

pub async fn window(mut a: WindowCmdArgs) -> Result<()> {
    let reached = reach_store(&mut a.common).await?;
    let ns = namespace(&a.common)?;
    let store = client::connect_store(&a.common.server, &reached.credential).await?;
    let w = store
        .get_window(GetWindowRequest {
            group_id: ktfs::rpc::scope_group(ns.as_str(), &a.group_id),
        })
        .await?;
    if a.common.json {
        return print_json(&membership::window_json(&w));
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
    let reached = reach_store(&mut a.common).await?;
    let prefix = match &a.key {
        Some(k) => KeyPath::parse_prefix(k)?,
        None => None,
    };
    let ns = namespace(&a.common)?;
    let store = client::connect_store(&a.common.server, &reached.credential).await?;
    // Printed a page at a time: a listing of a million keys is never held whole.
    let json = a.common.json;
    let mut printed = 0usize;
    let first = store
        .list_each(
            ListRequest {
                namespace: ns.to_string(),
                prefix: prefix.as_ref().map(|p| p.to_string()).unwrap_or_default(),
                recursive: a.recursive,
                ..Default::default()
            },
            |page| -> Result<()> {
                let mut text = String::new();
                for e in page {
                    let e = LsEntry {
                        locale: if e.locale() == Locale::Local && !e.origin_node.is_empty() {
                            e.origin_node.clone()
                        } else {
                            "store".into()
                        },
                        name: e.name,
                        is_directory: e.is_directory,
                        size: e.size,
                    };
                    if json {
                        text.push(if printed == 0 { '[' } else { ',' });
                        text.push_str(&serde_json::to_string(&e)?);
                    } else {
                        let size = if e.is_directory {
                            "-".into()
                        } else {
                            human(e.size)
                        };
                        text.push_str(&format!("{size:>10}  {:<12}  {}\n", e.locale, e.name));
                    }
                    printed += 1;
                }
                std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
                Ok(())
            },
        )
        .await?;
    if !first.exists {
        return Err(CliError::NotFound(a.key.unwrap_or_default()).into());
    }
    if json {
        println!("{}", if printed == 0 { "[]" } else { "]" });
    }
    Ok(())
}

pub async fn rm(mut a: RmArgs) -> Result<()> {
    let reached = reach_store(&mut a.common).await?;
    let key = KeyPath::parse(&a.key)?;
    let ns = namespace(&a.common)?;
    let store = client::connect_store(&a.common.server, &reached.credential).await?;
    let removed = store
        .remove(RemoveRequest {
            namespace: ns.to_string(),
            key: key.to_string(),
            recursive: a.recursive,
            prefix: a.prefix,
            gpu_registration: 0,
            watcher: 0,
        })
        .await?
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

/// `kt node-token NODE`: node NODE's token, from the shared token in `--token-file`.
pub fn node_token(a: NodeTokenArgs) -> Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let shared = ktfs::auth::credential::read_token_file(&a.token_file)?;
    let token = ktfs::auth::node_token::NodeTokens::new(&shared)
        .token_for(&a.node)
        .with_context(|| format!("node {:?}", a.node))?;
    match &a.out {
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("--out {}", path.display()))?;
            writeln!(f, "{token}").with_context(|| format!("--out {}", path.display()))?;
        }
        None => println!("{token}"),
    }
    Ok(())
}
