#!/usr/bin/env bash
# Metadata throughput against the number of replicas (issue 44): one store on etcd (one member,
# its data on /dev/shm) and S3 (s3s-fs), each replica held to 0.4 CPU by a cgroup (cgroup v2's
# cpu.max, or v1's cpu.cfs_quota_us), and a load generator in Rust (bench/load.rs `resolve`)
# resolving random keys of 4 namespaces with CONCURRENCY callers, as many `kt get`s would: a
# caller with no lease may be answered by any replica, the owner or one standing by. The same
# load against one replica, then spread over two and three, and a single RocksDB server held to
# the same 0.4 CPU as the scale. etcd's and the generator's CPU are reported to show that
# neither is what limits. Appends its section to bench/RESULTS.md (replacing an earlier one).
#
#   bash bench/replicas.sh   # KT_BENCH_REPLICAS_KEYS (per namespace, default 1000)
#                            # KT_BENCH_REPLICAS_SECONDS (each row, default 10)
#                            # KT_BENCH_REPLICAS_CONCURRENCY (default 16)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=replicas
source bench/lib.sh
KEYS=${KT_BENCH_REPLICAS_KEYS:-1000}
SECONDS_EACH=${KT_BENCH_REPLICAS_SECONDS:-10}
CONCURRENCY=${KT_BENCH_REPLICAS_CONCURRENCY:-16}
QUOTA_US=40000
PERIOD_US=100000
cargo build --quiet --bin kt --example load
KT=$PWD/target/debug/kt
LOAD=$PWD/target/debug/examples/load
WORK=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
CG=""
cleanup() {
    kill -9 $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    for g in ${CG}; do rmdir "$g" 2>/dev/null || true; done
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
export KT_AGENT=$WORK/none.sock RUST_LOG=warn
export AWS_ACCESS_KEY_ID=kt-test-access AWS_SECRET_ACCESS_KEY=kt-test-secret
IP=127.0.0.22
NAMESPACES=bench-a,bench-b,bench-c,bench-d


# A cgroup holding PID to 0.4 CPU.
limit() { # NAME PID
    local g
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        g=/sys/fs/cgroup/kt-bench-$1
        mkdir -p "$g"
        echo "$QUOTA_US $PERIOD_US" >"$g/cpu.max"
    else
        g=/sys/fs/cgroup/cpu/kt-bench-$1
        mkdir -p "$g"
        echo "$PERIOD_US" >"$g/cpu.cfs_period_us"
        echo "$QUOTA_US" >"$g/cpu.cfs_quota_us"
    fi
    echo "$2" >"$g/cgroup.procs"
    CG="$CG $g"
}

start_etcd "${IP}2" "$SHM/m1"
ETCD=$ETCD_PID
start_s3 "${IP}3"
META="etcd://${IP}2:2379/kt-replicas"
BLOCKS="s3://bucket/replicas?endpoint=http://${IP}3:9000&region=us-east-1"

# A server named NAME with FLAGS (bench/lib.sh's `serve`), held to 0.4 CPU; sets PID_<NAME>
# and ADDR_<NAME>.
replica() { # NAME FLAGS...
    serve "$1" "${IP}4:0" "${@:2}"
    eval "limit \"\$1\" \$PID_$1"
}

# Publishes KEYS keys under PREFIX in each namespace through ADDRS, the namespaces at once;
# prints the keys published a second, all namespaces together.
fill() { # ADDRS [PREFIX]
    local t0 t1 ns pids=()
    t0=$(date +%s.%N)
    for ns in ${NAMESPACES//,/ }; do
        "$LOAD" publish "$1" "$ns" "${2:-keys}" "$KEYS" 4 >/dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v n="$KEYS" 'BEGIN { printf "%.0f", 4 * n / (b - a) }'
}

# CPU seconds so far of the servers NAME... together, and of etcd: "SERVERS ETCD".
cpu_now() { # NAME...
    local n total=0
    for n in "$@"; do eval "total=\$(awk -v a=\$total -v b=\$(proc_cpu \$PID_$n) 'BEGIN { print a + b }')"; done
    echo "$total $(proc_cpu "$ETCD")"
}
# The CPU-seconds a second the servers and etcd spent between BEFORE and now, over SECONDS.
cpu_rate() { # "BEFORE" SECONDS NAME...
    local before=$1 secs=$2 now
    shift 2
    now=$(cpu_now "$@")
    awk -v a="$before" -v b="$now" -v s="$secs" 'BEGIN { split(a, x, " "); split(b, y, " ");
        printf "replicas %.2f, etcd %.2f", (y[1] - x[1]) / s, (y[2] - x[2]) / s }'
}

ROWS=""
# One row: the load against ADDRS; NAME... are the servers whose CPU is reported.
row() { # LABEL ADDRS NAME...
    local label=$1 addrs=$2; shift 2
    local before=() n e0 e1 out g
    for n in "$@"; do eval "before+=(\$(proc_cpu \$PID_$n))"; done
    e0=$(proc_cpu "$ETCD")
    out=$(python3 -c '
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], check=True, capture_output=True, text=True).stdout
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(out.strip(), "generator_cpu=%.2f" % (r.ru_utime + r.ru_stime))' \
        "$LOAD" resolve "$addrs" "$NAMESPACES" keys "$KEYS" "$SECONDS_EACH" "$CONCURRENCY")
    e1=$(proc_cpu "$ETCD")
    local rate secs gen servers="" i=0
    rate=$(sed -n 's/.*per_second=\([0-9]*\).*/\1/p' <<<"$out")
    secs=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<<"$out")
    gen=$(sed -n 's/.*generator_cpu=\([0-9.]*\).*/\1/p' <<<"$out")
    for n in "$@"; do
        eval "g=\$(proc_cpu \$PID_$n)"
        servers+="${servers:+ + }$(awk -v a="${before[$i]}" -v b="$g" -v s="$secs" 'BEGIN { printf "%.2f", (b - a) / s }')"
        i=$((i + 1))
    done
    local etcd_share gen_share
    etcd_share=$(awk -v a="$e0" -v b="$e1" -v s="$secs" 'BEGIN { printf "%.2f", (b - a) / s }')
    gen_share=$(awk -v g="$gen" -v s="$secs" 'BEGIN { printf "%.2f", g / s }')
    eval "RATE_$label=$rate"
    ROWS+="| $label | $rate | $servers | $etcd_share | $gen_share |"$'\n'
    echo "$label: $out" >&2
}

# The scale: a single RocksDB server, held the same.
replica single
WRITES_single=$(fill "$ADDR_single")
row single "$ADDR_single" single
kill "$PID_single"

for r in a b c; do replica "$r" --meta "$META" --blocks "$BLOCKS"; done
WRITES_one=$(fill "$ADDR_a")
# Writes through all three: each goes to the store's one owner.
before=$(cpu_now a b c)
t0=$(date +%s.%N)
WRITES_three=$(fill "$ADDR_a,$ADDR_b,$ADDR_c" more)
CPU_three=$(cpu_rate "$before" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" a b c)
row one "$ADDR_a" a
row two "$ADDR_a,$ADDR_b" a b
row three "$ADDR_a,$ADDR_b,$ADDR_c" a b c

# A store in 8 shards on three more replicas (the first three stopped): each commits the
# namespaces of the shards it holds. Four namespaces chosen so that every replica owns one
# or two of them (which replica holds a shard depends on the replicas' ids).
kill "$PID_a" "$PID_b" "$PID_c"
META_SHARDED="etcd://${IP}2:2379/kt-sharded"
for r in d e f; do replica "$r" --meta "$META_SHARDED" --blocks "$BLOCKS" --shards 8; done
owners() {
    ETCDCTL_API=3 etcdctl --endpoints "${IP}2:2379" get --prefix kt-sharded/owner/ 2>/dev/null
}
for _ in $(seq 200); do
    [ "$(owners | awk 'NR % 2 == 0 { print $1 }' | sort -u | wc -l)" = 3 ] \
        && [ "$(owners | awk 'NR % 2 == 1' | wc -l)" = 8 ] && break
    sleep 0.1
done
SHARDED_NS=$("$LOAD" shards 8 $(seq -f 'bench-s%g' 0 63) | python3 -c '
import sys
owners = dict(zip(*[iter(sys.argv[1].split())] * 2))
by = {}
for line in sys.stdin:
    ns, shard = line.split()
    owner = owners.get("kt-sharded/owner/" + shard, "?")
    by.setdefault(owner, []).append(ns)
picked = []
while len(picked) < 4 and any(by.values()):
    for o in sorted(by):
        if by[o] and len(picked) < 4:
            picked.append(by[o].pop(0))
print(",".join(picked))' "$(owners | awk 'NR % 2 == 1 { k = $1 } NR % 2 == 0 { print k, $1 }')")
SPREAD=$(owners | awk 'NR % 2 == 0 { print $1 }' | sort | uniq -c | awk '{ printf "%s%s", (NR > 1 ? ", " : ""), $1 }')
NAMESPACES_WHOLE=$NAMESPACES
NAMESPACES=$SHARDED_NS
before=$(cpu_now d e f)
t0=$(date +%s.%N)
WRITES_sharded=$(fill "$ADDR_d,$ADDR_e,$ADDR_f")
CPU_sharded=$(cpu_rate "$before" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" d e f)
NAMESPACES=$NAMESPACES_WHOLE

two_x=$(awk -v a="$RATE_one" -v b="$RATE_two" 'BEGIN { printf "%.2f", b / a }')
three_x=$(awk -v a="$RATE_one" -v b="$RATE_three" 'BEGIN { printf "%.2f", b / a }')
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
section=$(cat <<EOF
## Metadata throughput against replicas (issue 44)

\`bash bench/replicas.sh\` at $rev ($(date -u +%F), dev-profile build (the tests' one), 2 cores): resolves of random keys of 4
namespaces ($KEYS keys each) by $CONCURRENCY callers of bench/load.rs (\`load resolve\`, no lease: any
replica answers), for ${SECONDS_EACH} s a row, each store server held to 0.4 CPU by a cgroup; etcd one
member on /dev/shm, blocks and manifests on s3s-fs. CPU columns are CPU-seconds a second of wall time.

| replicas | resolves/s | replicas' CPU | etcd's CPU | generator's CPU |
|---|---|---|---|---|
${ROWS}
Two replicas: **${two_x}x** one (target 1.6x); three: ${three_x}x.

Writes (bench/load.rs \`load publish\`, $KEYS one-byte keys a namespace in batches of 256, the 4 namespaces at once):
the single server ${WRITES_single} keys/s; the replicated store through one replica ${WRITES_one} keys/s, through all three
${WRITES_three} keys/s (one owner commits every namespace's writes; CPU-s/s: ${CPU_three}); a store in 8 shards (\`--shards 8\`, shards held
${SPREAD} by its three replicas, 4 namespaces in shards of all three: ${SHARDED_NS}) through all three
**${WRITES_sharded} keys/s**, each replica committing its own shards' writes (CPU-s/s: ${CPU_sharded}; doc/cluster.md, "Shards").
EOF
)
replace_section "$section"
echo "$section"
