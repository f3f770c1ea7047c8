#!/usr/bin/env bash
# Issue 45's rows in one run, one bench after another on the same build and the same machine,
# each against the baselines of its own run (every script writes its own section of
# bench/RESULTS.md, stamped with the same source revision):
#   put.sh         a put of 512 MiB against `rsync --fsync` and the disk's synced-write floor;
#   e2e.sh         `kt get` of 512 MiB against a plain TCP copy and an rsync pull;
#   smallfiles.sh  first and cached reads of 3,000 files of 4 KiB against local disk and nullfs;
#   imports.sh     Python imports from a fresh mount against local disk;
#   broadcast.sh   64 MiB to 8 getters at 400 Mbit/s and to 32 at 100 Mbit/s, default flags.
#
#   bash bench/issue45.sh      # KT_BENCH_RUNS for the first four (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${KT_BENCH_RUNS:-5}
started=$(date -u +%s)
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

cargo build --release --quiet --bin kt
step "put"
KT_BENCH_RUNS=$RUNS bash bench/put.sh "$PWD/target/release/kt"
step "e2e (get)"
KT_BENCH_MIB=512 KT_BENCH_RUNS=$RUNS bash bench/e2e.sh
step "small files"
KT_BENCH_RUNS=$RUNS bash bench/smallfiles.sh
step "imports"
KT_BENCH_RUNS=$RUNS bash bench/imports.sh
broadcast() { # N MBIT SECTION
    KT_BENCH_NODES="$1" KT_BENCH_MIB=64 KT_BENCH_MBIT="$2" KT_BENCH_BLOCK=4194304 \
        KT_BENCH_FANOUT=1 KT_BENCH_WAYS="swarm" KT_BENCH_SECTION="$3" bash bench/broadcast.sh
}
step "broadcast N=8 at 400 Mbit/s"
broadcast 8 400 broadcast-fast-links
step "broadcast N=32 at 100 Mbit/s"
broadcast 32 100 broadcast-32-at-100mbit
step "done in $(($(date -u +%s) - started)) s"
