//! A load generator for the store server's metadata, over its gRPC API: `publish` fills a
//! prefix with keys in batches (a mount's write-back queue does the same), `list` reads a
//! prefix page by page and reports the largest answer. The benches drive it (bench/list.sh).
//!
//!   cargo build --example load
//!   load publish ADDR NAMESPACE PREFIX KEYS [CONCURRENCY]
//!   load list ADDR NAMESPACE PREFIX

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ktfs::auth::Credential;
use ktfs::proto::{
    BlockRef, FileEntry, InlineBlock, ListRequest, Manifest, PublishBatchRequest, PublishRequest,
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
    }
    Ok(())
}
