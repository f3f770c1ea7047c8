#!/usr/bin/env bash
# Failover of cluster mode (issue 44): three replicas of one store on a three-member etcd (its
# data on /dev/shm, slow heartbeats so that a starved machine is not taken for a failure) and
# an S3 server (s3s-fs); CLIENTS clients doing PUTS `kt put`s of small random files in all,
# each naming every replica (KT_SERVER=a,b,c); `kill -9` of the owning replica once half the
# puts were acknowledged, then of etcd's leader at three quarters. Afterwards every
# acknowledged put is read back (`kt get` through the replicas) and compared, and the listing
# must hold no key no client put. The same load on a single RocksDB server, in the same run, is
# the baseline. Reports the longest pause between two acknowledged puts (how long writes
# stopped), failed puts, lost puts, and a replica restarted from nothing: the time to its
# ready line, and with every other replica stopped the time until it serves as the owner. A
# mount of the replicas reads throughout the kills (files it read before, and each round the
# key a client put last): failed reads and the longest stall. Appends its section to
# bench/RESULTS.md (replacing an earlier one).
#
#   bash bench/failover.sh      # KT=path/to/kt (default target/debug/kt)
#                               # KT_BENCH_FAILOVER_PUTS (default 1000)
#                               # KT_BENCH_FAILOVER_CLIENTS (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=failover
source bench/lib.sh
KT=${KT:-$PWD/target/debug/kt}
PUTS=${KT_BENCH_FAILOVER_PUTS:-1000}
CLIENTS=${KT_BENCH_FAILOVER_CLIENTS:-8}
WORK=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
# KT_BENCH_KEEP=DIR keeps the servers' and etcd's logs there.
trap 'set +e; kill -9 $(jobs -p) 2>/dev/null; pkill -9 -P $$ 2>/dev/null; wait 2>/dev/null; [ -n "${KT_BENCH_KEEP:-}" ] && mkdir -p "$KT_BENCH_KEEP" && cp "$WORK"/*.log "$WORK"/put.err "$KT_BENCH_KEEP"/ 2>/dev/null; rm -rf "$WORK" "$SHM"' EXIT
export KT_AGENT=$WORK/none.sock RUST_LOG=${KT_BENCH_LOG:-warn}
export AWS_ACCESS_KEY_ID=kt-test-access AWS_SECRET_ACCESS_KEY=kt-test-secret
IP=127.0.0.14
now() { date +%s.%N; }

# A three-member etcd on 127.0.0.141-143.
cluster=""
for m in 1 2 3; do cluster+="${cluster:+,}m$m=http://${IP}$m:2380"; done
for m in 1 2 3; do
    etcd --name "m$m" --data-dir "$SHM/m$m" \
        --listen-client-urls "http://${IP}$m:2379" --advertise-client-urls "http://${IP}$m:2379" \
        --listen-peer-urls "http://${IP}$m:2380" --initial-advertise-peer-urls "http://${IP}$m:2380" \
        --initial-cluster "$cluster" --heartbeat-interval 250 --election-timeout 2500 \
        >"$WORK/etcd$m.log" 2>&1 &
    eval "ETCD$m=$!"
done
for _ in $(seq 150); do curl -sf "http://${IP}1:2379/health" >/dev/null && break; sleep 0.2; done
META="etcd://${IP}1:2379,${IP}2:2379,${IP}3:2379/kt-failover"
start_s3 "${IP}4"
BLOCKS="s3://bucket/failover?endpoint=http://${IP}4:9000&region=us-east-1"

# A server named NAME with FLAGS (bench/lib.sh's `serve`); sets PID_<NAME> and ADDR_<NAME>.
replica() { # NAME FLAGS...
    serve "$1" "${IP}5:0" "${@:2}"
}

# CLIENTS clients putting PUTS small files in all to SERVERS; each acknowledged put is a line
# "acknowledged-at started-at key sha256" in $WORK/acked.N, each failed one in $WORK/failed.N.
load() { # SERVERS TAG
    local servers=$1 tag=$2
    rm -f "$WORK"/acked.* "$WORK"/failed.*
    for c in $(seq "$CLIENTS"); do
        (
            for j in $(seq $((PUTS / CLIENTS))); do
                f="$WORK/src.$c"
                head -c 4096 /dev/urandom >"$f"
                key="$tag/c$c/k$j"
                began=$(now)
                if KT_SERVER=$servers "$KT" put "$key" --src "$f" >/dev/null 2>>"$WORK/put.err"; then
                    echo "$(now) $began $key $(sha256sum <"$f" | cut -d' ' -f1)" >>"$WORK/acked.$c"
                else
                    echo "$key" >>"$WORK/failed.$c"
                fi
            done
        ) &
    done
}
acked() { { cat "$WORK"/acked.* 2>/dev/null || true; } | wc -l; }
failed() { { cat "$WORK"/failed.* 2>/dev/null || true; } | wc -l; }
# The longest pause between two acknowledged puts, in seconds (from FROM to TO only).
longest_pause() { # [FROM TO]
    cat "$WORK"/acked.* | sort -n | awk -v from="${1:-0}" -v to="${2:-1e12}" \
        '$1 >= from && $1 <= to { if (n++ && $1 - p > m) m = $1 - p; p = $1 } END { printf "%.2f", m }'
}
# How long after AT the first put begun after it was acknowledged.
resumed_after() { # AT
    cat "$WORK"/acked.* | awk -v at="$1" '$2 >= at && (m == "" || $1 < m) { m = $1 } END { printf "%.2f", m - at }'
}
# Reads every acknowledged put back through SERVERS: prints "lost wrong".
check() { # SERVERS TAG
    local servers=$1 tag=$2 lost=0 wrong=0
    while read -r _ _ key sha; do
        if KT_SERVER=$servers "$KT" get "$key" --dest "$WORK/back" >/dev/null 2>&1; then
            [ "$(sha256sum <"$WORK/back" | cut -d' ' -f1)" = "$sha" ] || wrong=$((wrong + 1))
        else
            lost=$((lost + 1))
        fi
        rm -f "$WORK/back"
    done < <(cat "$WORK"/acked.*)
    # No key at a version no client put: every listed key was one a client tried.
    local stray
    stray=$(KT_SERVER=$servers "$KT" ls -r "$tag" --json | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if not e["is_directory"]:
        print(e["name"])' | while read -r k; do
        grep -q " $tag/$k " "$WORK"/acked.* || grep -qsx "$tag/$k" "$WORK"/failed.* || echo "$k"
    done | wc -l)
    echo "$lost $wrong $stray"
}

# The baseline: the same load on a single RocksDB server.
replica single
start=$(now)
load "$ADDR_single" base
while [ $(( $(acked) + $(failed) )) -lt $(( PUTS / CLIENTS * CLIENTS )) ]; do sleep 0.2; done
base_time=$(python3 -c "print('%.1f' % ($(now) - $start))")
base_pause=$(longest_pause)
base_failed=$(failed)
read -r base_lost base_wrong base_stray < <(check "$ADDR_single" base)
kill "$PID_single"

# Three replicas on etcd and S3.
for r in a b c; do replica "$r" --meta "$META" --blocks "$BLOCKS"; done
ALL="$ADDR_a,$ADDR_b,$ADDR_c"
owner=""
for r in a b c; do
    eval "addr=\$ADDR_$r"
    # A write: standbys answer reads too.
    echo "$r" >"$WORK/probe"
    KT_SERVER=$addr "$KT" put "probe/$r" --src "$WORK/probe" >/dev/null 2>&1 && owner=$r
done
# A mount of the three replicas reading throughout: a few files it read once (its cache
# holds them) and, each round, the key a client put last (a lookup the owner answers). A
# round's time is logged when every read gave the right bytes, a failed read when one did not.
for k in $(seq 8); do
    head -c 262144 /dev/urandom >"$WORK/read$k"
    KT_SERVER=$ALL "$KT" put "read/k$k" --src "$WORK/read$k" >/dev/null
done
mkdir -p "$WORK/mnt" "$WORK/mcache"
"$KT" mount "$WORK/mnt" --server "$ALL" --listen "${IP}6:0" --cache-dir "$WORK/mcache" \
    --socket "$WORK/m.sock" --node-id reader >"$WORK/mount.log" 2>&1 &
MOUNT=$!
for _ in $(seq 300); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
mountpoint -q "$WORK/mnt" || { tail "$WORK/mount.log" >&2; exit 1; }
trap 'set +e; touch "$WORK/stop"; fusermount3 -uz "$WORK/mnt" 2>/dev/null; kill -9 $(jobs -p) 2>/dev/null; pkill -9 -P $$ 2>/dev/null; wait 2>/dev/null; [ -n "${KT_BENCH_KEEP:-}" ] && mkdir -p "$KT_BENCH_KEEP" && cp "$WORK"/*.log "$WORK"/put.err "$WORK"/reads.* "$KT_BENCH_KEEP"/ 2>/dev/null; rm -rf "$WORK" "$SHM"' EXIT
reads() {
    local k line key sha ok
    while [ ! -e "$WORK/stop" ]; do
        ok=1
        for k in $(seq 8); do
            cmp -s "$WORK/mnt/read/k$k" "$WORK/read$k" || ok=0
        done
        line=$({ cat "$WORK"/acked.* 2>/dev/null || true; } | tail -1)
        if [ -n "$line" ]; then
            read -r _ _ key sha <<<"$line"
            [ "$(sha256sum <"$WORK/mnt/$key" 2>/dev/null | cut -d' ' -f1)" = "$sha" ] || ok=0
        fi
        if [ "$ok" = 1 ]; then now >>"$WORK/reads.ok"; else echo "$(now) ${key:-}" >>"$WORK/reads.failed"; fi
        sleep 0.1
    done
}
reads &
READER=$!
start=$(now)
load "$ALL" chaos
total=$(( PUTS / CLIENTS * CLIENTS ))
while [ "$(acked)" -lt $((total / 2)) ]; do sleep 0.05; done
eval "kill -9 \$PID_$owner"
killed_at=$(now)
echo "$killed_at the owner" >>"$WORK/kills.log"
while [ "$(acked)" -lt $((total * 3 / 4)) ] && [ $(( $(acked) + $(failed) )) -lt "$total" ]; do sleep 0.05; done
# The worst case: the member that leads.
leader=3
for m in 1 2 3; do
    curl -s -X POST -d '{}' "http://${IP}$m:2379/v3/maintenance/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
sys.exit(0 if s["leader"] == s["header"]["member_id"] else 1)' && leader=$m
done
eval "kill -9 \$ETCD$leader"
etcd_killed_at=$(now)
echo "$etcd_killed_at etcd's leader" >>"$WORK/kills.log"
while [ $(( $(acked) + $(failed) )) -lt "$total" ]; do sleep 0.2; done
chaos_time=$(python3 -c "print('%.1f' % ($(now) - $start))")
touch "$WORK/stop"
wait "$READER" || true
read_rounds=$(wc -l <"$WORK/reads.ok")
read_failed=$({ cat "$WORK/reads.failed" 2>/dev/null || true; } | wc -l)
read_stall=$(sort -n "$WORK/reads.ok" | awk '{ if (n++ && $1 - p > m) m = $1 - p; p = $1 } END { printf "%.2f", m }')
fusermount3 -u "$WORK/mnt" 2>/dev/null || fusermount3 -uz "$WORK/mnt" 2>/dev/null || true
kill "$MOUNT" 2>/dev/null || true
chaos_pause=$(longest_pause)
resumed=$(resumed_after "$killed_at")
etcd_resumed=$(resumed_after "$etcd_killed_at")
owner_pause=$(longest_pause "$(python3 -c "print($killed_at - 1)")" "$etcd_killed_at")
etcd_pause=$(longest_pause "$etcd_killed_at" 1e12)
read -r lost wrong stray < <(check "$ALL" chaos)
chaos_failed=$(failed)

# A replica restarted from nothing (an empty data directory): the time to its ready line.
s=$(now)
replica fresh --meta "$META" --blocks "$BLOCKS"
fresh=$(python3 -c "print('%.2f' % ($(now) - $s))")

# Every replica stopped (a stop gives its claim up), then one from nothing: the time until it
# serves its first call, as the owner (at most 30 s).
for r in a b c fresh; do
    eval "pid=\$PID_$r"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
done
s=$(now)
replica alone --meta "$META" --blocks "$BLOCKS"
for _ in $(seq 1500); do
    KT_SERVER=$ADDR_alone "$KT" ls >/dev/null 2>&1 && break
    sleep 0.02
done
alone=$(python3 -c "print('%.2f' % ($(now) - $s))")

section=$(cat <<EOF
## Failover (issue 44): three replicas on a three-member etcd and S3, kill -9 of the owner and of etcd's leader

\`bash bench/failover.sh\` ($(date -u +%Y-%m-%d), $(git rev-parse --short HEAD), debug build, loopback, 2 cores; etcd 3.4 on /dev/shm with
250 ms heartbeats and a 2.5 s election timeout; s3s-fs; $CLIENTS clients, $total \`kt put\`s of 4 KiB each, every client naming the three
replicas; the owner killed at put $((total / 2)), the etcd member that leads at put $((total * 3 / 4)); claims of 3 s).

| run | wall time | longest pause between acknowledged puts | failed puts | acknowledged puts lost | read back other bytes | keys no client put |
|---|---|---|---|---|---|---|
| single RocksDB server, no kills | ${base_time} s | ${base_pause} s | $base_failed | $base_lost | $base_wrong | $base_stray |
| 3 replicas, the owner and etcd's leader killed | ${chaos_time} s | ${chaos_pause} s | $chaos_failed | $lost | $wrong | $stray |

The owner's kill: the longest pause between acknowledged puts around it ${owner_pause} s, and the first put begun after it was
acknowledged ${resumed} s after it (target: writes resume within 5 s). The etcd leader's kill: ${etcd_pause} s and ${etcd_resumed} s.
A mount of the three replicas read throughout ($read_rounds rounds of 8 files it had read and the key a client put last, every
0.1 s): $read_failed rounds read wrong bytes or failed (target 0), and the longest time between two good rounds was ${read_stall} s
(target: a stall of at most 5 s).
A replica started from an empty data directory printed its ready line after ${fresh} s (target 2 s), as a standby; with every
replica stopped, one started from an empty data directory served its first call, as the owner, ${alone} s after its start.
EOF
)
replace_section "$section"
echo "$section"
if [ "$lost" != 0 ] || [ "$wrong" != 0 ] || [ "$stray" != 0 ] || [ "$read_failed" != 0 ]; then
    echo "failover: lost=$lost wrong=$wrong stray=$stray failed_reads=$read_failed" >&2
    exit 1
fi
