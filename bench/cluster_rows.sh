#!/usr/bin/env bash
# Issue 44's rows of cluster mode against the single server, in one run: a store on etcd (one
# member, its data on /dev/shm) and S3 (s3s-fs over a directory) against a single RocksDB
# server, both in the dev-profile build (the one the tests use) on this machine:
#   small files: `cp -r` of one directory of FILES files of 4 KiB into a `kt mount` (each close
#                a publish), then an fsync of the directory; target: cluster at most 2x single;
#   get:         `kt get` of one BIG_MIB MiB pseudo-random key from the store (no agent: the
#                blocks come from the store's data port), page cache dropped first; baseline:
#                the same blocks fetched straight from the S3 server (curl with AWS signatures,
#                4 at once, as `kt get` fetches); target: cluster at least 0.8x the lower of
#                the single server and the raw GETs.
# Each row KT_BENCH_RUNS times (default 3), single and cluster interleaved; medians, with peak
# RSS of the client (`kt get`) and of the servers. Appends its section to bench/RESULTS.md
# (replacing an earlier one).
#
#   bash bench/cluster_rows.sh   # KT_BENCH_FILES (default 2000), KT_BENCH_BIG_MIB (default 512)
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${KT_BENCH_FILES:-2000}
BIG_MIB=${KT_BENCH_BIG_MIB:-512}
RUNS=${KT_BENCH_RUNS:-3}
LOG_TAG=cluster-rows
PRIME_MIB_DEFAULT=0
KT_BENCH_QUIET_WAIT=${KT_BENCH_QUIET_WAIT:-0}
source bench/lib.sh
cargo build --quiet --bin kt
KT=${KT_BIN:-$PWD/target/debug/kt}
WORK=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
install_cleanup
trap 'cleanup; rm -rf "$SHM"' EXIT
export KT_AGENT=$WORK/none.sock RUST_LOG=warn
export AWS_ACCESS_KEY_ID=kt-test-access AWS_SECRET_ACCESS_KEY=kt-test-secret
IP=127.0.0.23

start_etcd "${IP}2" "$SHM/m1"
start_s3 "${IP}3"
S3_PID=${PIDS[-1]}
S3="http://${IP}3:9000"

# The two stores: a single server, and a replica on etcd and S3.
mkdir -p "$WORK/single" "$WORK/cluster"
start_server "$WORK/single" "${IP}4:0"
SINGLE_ADDR=$SERVER_ADDR SINGLE_PID=$SERVER_PID
start_server "$WORK/cluster" "${IP}5:0" --meta "etcd://${IP}2:2379/kt-rows" \
    --blocks "s3://bucket/rows?endpoint=$S3&region=us-east-1"
CLUSTER_ADDR=$SERVER_ADDR CLUSTER_PID=$SERVER_PID

# The files.
mkdir -p "$WORK/src/files"
for i in $(seq "$FILES"); do head -c 4096 /dev/urandom >"$WORK/src/files/f$i"; done
head -c $((BIG_MIB << 20)) /dev/urandom >"$WORK/src/big"
for s in single cluster; do
    eval "addr=\$${s^^}_ADDR"
    KT_SERVER=$addr "$KT" put rows/big --src "$WORK/src/big" >/dev/null
done
ls "$WORK/s3/bucket/rows/blocks" >"$WORK/objects"
[ -s "$WORK/objects" ] || die "no block objects in the bucket"

# One `cp -r` into a fresh mount of STORE: sets ELAPSED, and CPU_<STORE>_<PROCESS> gets the
# CPU seconds each process spent over the copy.
small_files() { # STORE RUN
    local store=$1 run=$2 addr server_pid
    eval "addr=\$${store^^}_ADDR server_pid=\$${store^^}_PID"
    mount_node "$store$run" "${IP}6" "$addr" "rows-$store$run"
    local dir=${MDIR[$store$run]}
    local -A pids=([server]=$server_pid [mount]=${MPID[$store$run]} [etcd]=$ETCD_PID [s3]=$S3_PID)
    local -A c0
    local p
    for p in "${!pids[@]}"; do c0[$p]=$(proc_cpu "${pids[$p]}"); done
    local t0=$EPOCHREALTIME
    cp -r "$WORK/src/files" "$dir/files-$run"
    python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$dir/files-$run"
    ELAPSED=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
    for p in "${!pids[@]}"; do
        eval "CPU_${store}_$p+=($(sub_s "${c0[$p]}" "$(proc_cpu "${pids[$p]}")"))"
    done
    [ "$(ls "$dir/files-$run" | wc -l)" -eq "$FILES" ] || die "$store: files missing"
    stop_mount "$store$run"
}

# The blocks of rows/big as the cluster's bucket holds them (listed right after its put, the
# only key then), fetched straight from S3: sets ELAPSED.
raw_get() { # RUN
    drop_caches
    # (S3 wants the payload's hash named, which curl leaves out by itself.)
    timed "raw$1" bash -c "xargs -P 4 -I{} curl -sf --aws-sigv4 aws:amz:us-east-1:s3 \
        --user $AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
        -o /dev/null $S3/bucket/rows/blocks/{} <$WORK/objects"
}

declare -a SF_single SF_cluster GET_single GET_cluster GET_raw RSS_single RSS_cluster
declare -a CPU_single_server CPU_single_mount CPU_single_etcd CPU_single_s3
declare -a CPU_cluster_server CPU_cluster_mount CPU_cluster_etcd CPU_cluster_s3
for run in $(seq "$RUNS"); do
    for s in single cluster; do
        small_files "$s" "$run"
        eval "SF_$s+=($ELAPSED)"
        eval "addr=\$${s^^}_ADDR"
        rm -f "$WORK/got"
        drop_caches
        timed "get-$s$run" env KT_SERVER="$addr" "$KT" get rows/big --dest "$WORK/got"
        cmp -s "$WORK/got" "$WORK/src/big" || die "$s: the got file differs"
        eval "GET_$s+=($ELAPSED)"
        eval "RSS_$s+=($RSS_KB)"
    done
    raw_get "$run"
    GET_raw+=("$ELAPSED")
done
rm -f "$WORK/got"

sf_single=$(median "${SF_single[@]}")
sf_cluster=$(median "${SF_cluster[@]}")
get_single=$(median "${GET_single[@]}")
get_cluster=$(median "${GET_cluster[@]}")
get_raw=$(median "${GET_raw[@]}")
sf_ratio=$(awk -v a="$sf_single" -v b="$sf_cluster" 'BEGIN { printf "%.2f", b / a }')
lower=$(awk -v a="$get_single" -v b="$get_raw" 'BEGIN { print (a > b ? a : b) }')
get_ratio=$(awk -v l="$lower" -v c="$get_cluster" 'BEGIN { printf "%.2f", l / c }')
rss() { mib "$(maxof "$@")"; }
cpu_row() { # STORE
    local p out=""
    for p in server mount etcd s3; do
        eval "out+=\" | \$(median \"\${CPU_$1_$p[@]}\")\""
    done
    echo "$out"
}
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
section=$(cat <<EOF
## Cluster mode against the single server: small files through a mount, a 512 MiB get (issue 44)

\`bash bench/cluster_rows.sh\` at $rev ($(date -u +%F), dev-profile build (the tests' one), 2 cores, loopback): a store
on etcd (one member on /dev/shm) and s3s-fs against a single RocksDB server, $RUNS runs each,
interleaved; medians (each run's figure in brackets). The get comes from the store's data port
(no agent), the page cache dropped before each; the raw GETs fetch the same block objects
straight from s3s-fs (curl with AWS signatures, 4 at once).

| row | single server | etcd + S3 | raw S3 GETs | ratio | target |
|---|---|---|---|---|---|
| \`cp -r\` of $FILES files of 4 KiB into a mount, s | $sf_single (${SF_single[*]}) | $sf_cluster (${SF_cluster[*]}) | | **${sf_ratio}x** the single server's time | at most 2x |
| \`kt get\` of $BIG_MIB MiB, s | $get_single (${GET_single[*]}) | $get_cluster (${GET_cluster[*]}) | $get_raw (${GET_raw[*]}) | **${get_ratio}x** the lower speed of the other two | at least 0.8x |
| \`kt get\` peak RSS, MiB | $(rss "${RSS_single[@]}") | $(rss "${RSS_cluster[@]}") | | | |

CPU seconds of each process over the \`cp -r\` (medians; etcd and s3s-fs serve only the cluster
store, so the single server's columns for them show what they spent idle):

| store | server | mount | etcd | s3s-fs |
|---|---|---|---|---|
| single server$(cpu_row single) |
| etcd + S3$(cpu_row cluster) |

Agents read a cluster store's blocks through a replica's data port, not from the object store:
tickets and the checks of the data plane stay in one place, and nodes need no credentials of
the bucket.
EOF
)
replace_section "$section"
echo "$section"
