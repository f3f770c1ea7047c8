//! A load generator for the store server's metadata, over its gRPC API: `publish` fills a
//! prefix with keys in batches (a mount's write-back queue does the same), `list` reads a
//! prefix page by page and reports the largest answer, `resolve` resolves keys of several
//! namespaces from several replicas at once, as many `kt get`s would. The benches drive it
//! (bench/list.sh, bench/replicas.sh).
//!
//!   cargo build --example load
//!   load publish ADDR NAMESPACE PREFIX KEYS [CONCURRENCY]
//!   load list ADDR NAMESPACE PREFIX
//!   load resolve ADDR[,ADDR...] NAMESPACE[,NAMESPACE...] PREFIX KEYS SECONDS [CONCURRENCY]
//!   load shards COUNT NAMESPACE...   (each namespace's shard of a store in COUNT shards)

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ktfs::auth::Credential;
use ktfs::proto::{
    BlockRef, FileEntry, InlineBlock, ListRequest, Manifest, PublishBatchRequest, PublishRequest,
    ResolveRequest,
};
use ktfs::rpc::client::connect_store;
use prost::Message;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Publishes KEYS one-byte keys PREFIX/k0000000 ... in batches of 256.
    Publish {
        addr: String,
        namespace: String,
        prefix: String,
        keys: usize,
        #[arg(default_value_t = 4)]
        concurrency: usize,
    },
    /// Lists PREFIX recursively page by page: entries, pages, the largest answer, the time.
    List {
        addr: String,
        namespace: String,
        prefix: String,
    },
    /// For SECONDS, CONCURRENCY callers (each on one replica of ADDRS and one namespace of
    /// NAMESPACES, in turn) resolve PREFIX/k0000000 ... of the first KEYS keys at random;
    /// prints how many were answered, a second.
    Resolve {
        addrs: String,
        namespaces: String,
        prefix: String,
        keys: usize,
        seconds: f64,
        #[arg(default_value_t = 16)]
        concurrency: usize,
    },
    /// Prints each namespace and its shard among COUNT.
    Shards { count: u32, namespaces: Vec<String> },
}

/// Resolves of random keys by `concurrency` callers spread over `addrs` and `namespaces`, for
/// `seconds`: how many were answered.
async fn resolve_load(
    addrs: &str,
    namespaces: &str,
    prefix: &str,
    keys: usize,
    seconds: f64,
    concurrency: usize,
) -> Result<u64> {
    let mut stores = Vec::new();
    for a in addrs.split(',') {
        stores.push(connect_store(a, &Credential::none()).await?);
    }
    let namespaces: Vec<String> = namespaces.split(',').map(String::from).collect();
    let until = Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..concurrency.max(1) {
        let store = stores[i % stores.len()].clone();
        let ns = namespaces[i % namespaces.len()].clone();
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            // A cheap generator of its own per caller: xorshift, seeded by the caller's number.
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (i as u64 + 1);
            let mut answered = 0u64;
            while Instant::now() < until {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("{prefix}/k{:07}", x as usize % keys.max(1));
                store
                    .resolve(ResolveRequest {
                        namespace: ns.clone(),
                        key,
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("resolving in {ns}"))?;
                answered += 1;
            }
            Ok::<_, anyhow::Error>(answered)
        });
    }
    let mut answered = 0;
    while let Some(r) = tasks.join_next().await {
        answered += r.context("a resolving task")??;
    }
    Ok(answered)
}

const BATCH: usize = 256;

fn item(namespace: &str, key: String) -> PublishRequest {
    let hash = blake3::hash(b"x").as_bytes().to_vec();
    PublishRequest {
        namespace: namespace.into(),
        key,
        manifest: Some(Manifest {
            block_size: 4 << 20,
            entries: vec![FileEntry {
                size: 1,
                blocks: vec![BlockRef {
                    hash: hash.clone(),
                    len: 1,
                }],
                mode: 0o644,
                ..Default::default()
            }],
        }),
        inline_blocks: vec![InlineBlock {
            hash,
            data: b"x".to_vec(),
        }],
        force: true,
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    match args.what {
        What::Publish {
            addr,
            namespace,
            prefix,
            keys,
            concurrency,
        } => {
            let store = connect_store(&addr, &Credential::none()).await?;
            let start = Instant::now();
            let batches = keys.div_ceil(BATCH);
            let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..concurrency.max(1) {
                let (store, next, ns, prefix) = (
                    store.clone(),
                    next.clone(),
                    namespace.clone(),
                    prefix.clone(),
                );
                tasks.spawn(async move {
                    loop {
                        let b = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if b >= batches {
                            return Ok::<_, anyhow::Error>(());
                        }
                        let items = (b * BATCH..((b + 1) * BATCH).min(keys))
                            .map(|i| item(&ns, format!("{prefix}/k{i:07}")))
                            .collect();
                        let results = store
                            .publish_batch(PublishBatchRequest {
                                namespace: ns.clone(),
                                items,
                                watcher: 0,
                            })
                            .await?
                            .results;
                        if let Some(r) = results.iter().find(|r| r.published.is_none()) {
                            bail!("batch {b}: {}", r.message);
                        }
                    }
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.context("a publishing task")??;
            }
            let s = start.elapsed().as_secs_f64();
            println!(
                "published={keys} seconds={s:.1} per_second={:.0}",
                keys as f64 / s
            );
        }
        What::List {
            addr,
            namespace,
            prefix,
        } => {
            let store = connect_store(&addr, &Credential::none()).await?;
            let start = Instant::now();
            let (mut entries, mut pages, mut largest) = (0usize, 0usize, 0usize);
            let mut req = ListRequest {
                namespace,
                prefix,
                recursive: true,
                ..Default::default()
            };
            loop {
                let page = store.list(req.clone()).await?;
                pages += 1;
                entries += page.entries.len();
                largest = largest.max(page.encoded_len());
                if page.next.is_empty() {
                    break;
                }
                req.after = page.next;
            }
            println!(
                "entries={entries} pages={pages} largest_answer_bytes={largest} seconds={:.1}",
                start.elapsed().as_secs_f64()
            );
        }
        What::Shards { count, namespaces } => {
            for ns in namespaces {
                println!("{ns} {}", ktfs::key::shard_of(&ns, count));
            }
        }
        What::Resolve {
            addrs,
            namespaces,
            prefix,
            keys,
            seconds,
            concurrency,
        } => {
            let start = Instant::now();
            let answered =
                resolve_load(&addrs, &namespaces, &prefix, keys, seconds, concurrency).await?;
            let s = start.elapsed().as_secs_f64();
            println!(
                "resolved={answered} seconds={s:.1} per_second={:.0}",
                answered as f64 / s
            );
        }
    }
    Ok(())
}
