//! Micro-benchmarks of the hot paths of `put` and `get`: hashing a block, and reading plus
//! chunking plus hashing a file. Baselines: plain `blake3::hash` of the same bytes, plain
//! blake3 over fixed 4 MiB blocks in memory (what a put did before content-defined blocks),
//! and a plain `std::fs::read` of the same file, so the cost of our own code shows as the gap
//! between them.
//!
//! `cargo bench --bench hashing`; the whole run takes about a minute (sample size 10, short
//! measurement). Medians land in `target/criterion/<group>/<bench>/new/estimates.json`, which
//! `bench/e2e.sh` reads for `bench/RESULTS.md`.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ktfs::hash::BlockHash;
use ktfs::manifest::DEFAULT_BLOCK_SIZE;
use ktfs::transfer::put::chunk::{hash_blocks, Chunking};
use ktfs::transfer::put::scan::hash_file;

const BLOCK: usize = 4 << 20;
const FILE: usize = 64 << 20;

/// Deterministic pseudo-random bytes (xorshift64*), so blake3 sees no easy patterns and runs repeat.
fn pseudo_random(len: usize) -> Vec<u8> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        v.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(len);
    v
}

fn block_hash(c: &mut Criterion) {
    assert_eq!(
        BLOCK, DEFAULT_BLOCK_SIZE as usize,
        "bench the block size put uses"
    );
    let block = pseudo_random(BLOCK);
    let mut g = c.benchmark_group("block");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Bytes(BLOCK as u64));
    g.bench_function("BlockHash::of 4MiB", |b| {
        b.iter(|| BlockHash::of(black_box(&block)))
    });
    g.finish();
}

fn file_hash(c: &mut Criterion) {
    let data = pseudo_random(FILE);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("64MiB.bin");
    {
        let mut f = std::fs::File::create(&path).expect("create temp file");
        f.write_all(&data).expect("write temp file");
        f.sync_all().ok();
    }
    // The file is read warm (from the page cache) in every bench below: this measures our CPU
    // cost, not the disk.
    let mut buf = Vec::new();
    let cdc = Chunking::for_block_size(DEFAULT_BLOCK_SIZE);
    let fixed = Chunking::Fixed(DEFAULT_BLOCK_SIZE);

    let mut g = c.benchmark_group("file64MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(FILE as u64));
    g.bench_function("scan::hash_file content-defined", |b| {
        b.iter(|| {
            let (size, blocks) = hash_file(black_box(&path), &cdc, &mut buf).expect("hash_file");
            assert_eq!(size as usize, FILE);
            blocks
        })
    });
    g.bench_function("scan::hash_file fixed 4MiB", |b| {
        b.iter(|| {
            let (size, blocks) = hash_file(black_box(&path), &fixed, &mut buf).expect("hash_file");
            assert_eq!(blocks.len(), FILE / BLOCK);
            assert_eq!(size as usize, FILE);
            blocks
        })
    });
    // The chunker alone against the baseline it replaced, both in memory: FastCDC's cuts plus
    // blake3 of each block, and blake3 of each fixed 4 MiB block.
    let mut mem_buf = vec![0u8; cdc.buffer_len(FILE as u64)];
    g.bench_function("chunk::hash_blocks content-defined in memory", |b| {
        b.iter(|| {
            let (size, blocks) =
                hash_blocks(&mut black_box(&data[..]), &cdc, &mut mem_buf).expect("chunk");
            assert_eq!(size as usize, FILE);
            blocks
        })
    });
    g.bench_function("blake3 fixed 4MiB blocks in memory", |b| {
        b.iter(|| {
            black_box(&data)
                .chunks(BLOCK)
                .map(blake3::hash)
                .collect::<Vec<_>>()
        })
    });
    g.bench_function("blake3::hash in memory", |b| {
        b.iter(|| blake3::hash(black_box(&data)))
    });
    g.bench_function("std::fs::read", |b| {
        b.iter(|| {
            let v = std::fs::read(black_box(&path)).expect("read");
            assert_eq!(v.len(), FILE);
            v
        })
    });
    g.finish();
    drop(dir);
}

criterion_group!(benches, block_hash, file_hash);
criterion_main!(benches);
