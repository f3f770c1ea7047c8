#!/usr/bin/env bash
# A broadcast in cluster mode (issue 44): three `kt get` of one BIG_MIB MiB key at once, on a
# store of two replicas on etcd (one member, its data on /dev/shm) and s3s-fs, each getter
# through an agent of its own (a node: the getters trade pieces in the window's swarm), in
# three ways, each KT_BENCH_RUNS times (default 3) on a fresh store and fresh nodes:
#   direct: the same three gets without agents, each from the store's data port (the baseline:
#           what the store sends when nothing is shared);
#   swarm:  the three through their agents, undisturbed;
#   killed: the same, the owning replica killed (SIGKILL) KILL_AT seconds in (default 0.4): the
#           standby takes over (`--owner-ttl-secs 2`), the getters' syncs find no window there
#           and they join it again (`broadcast::member::rejoin`).
# For each: the slowest get's time (the broadcast's), what the store sent to the three in all
# (their `sources` of "store"), and the joins again; every copy checked with cmp. Appends its
# section to bench/RESULTS.md (replacing an earlier one).
#
#   bash bench/cluster_broadcast.sh   # KT_BENCH_BIG_MIB (default 512), KT_BENCH_RUNS, KILL_AT
set -euo pipefail
cd "$(dirname "$0")/.."
BIG_MIB=${KT_BENCH_BIG_MIB:-512}
RUNS=${KT_BENCH_RUNS:-3}
KILL_AT=${KILL_AT:-0.4}
LOG_TAG=cluster-broadcast
PRIME_MIB_DEFAULT=0
KT_BENCH_QUIET_WAIT=${KT_BENCH_QUIET_WAIT:-0}
source bench/lib.sh
ensure_tools jq:jq curl:curl || die "missing tools: jq curl"
cargo build --quiet --release --bin kt
KT=${KT_BIN:-$PWD/target/release/kt}
ROOT_WORK=$(mktemp -d)
WORK=$ROOT_WORK
install_cleanup
trap 'WORK=$ROOT_WORK; rm -rf /dev/shm/kt-cluster-broadcast.*; cleanup' EXIT
export RUST_LOG=warn AWS_ACCESS_KEY_ID=kt-test-access AWS_SECRET_ACCESS_KEY=kt-test-secret
IP=127.0.0.24
head -c $((BIG_MIB << 20)) /dev/urandom >"$ROOT_WORK/big"

# One broadcast on a fresh store and fresh nodes: WAY is direct, swarm or killed. Sets T (the
# slowest get's seconds), STORE_MB (what the store sent the three) and REJOINS (in all).
broadcast() { # WAY RUN
    local way=$1 run=$2 i k t0 shm
    WORK=$ROOT_WORK/$way$run
    mkdir -p "$WORK"
    shm=$(mktemp -d -p /dev/shm kt-cluster-broadcast.XXXXXX)
    start_etcd "${IP}2" "$shm/m1"
    start_s3 "${IP}3"
    local flags=(--meta "etcd://${IP}2:2379/kt-bc" --owner-ttl-secs 2
        --blocks "s3://bucket/bc?endpoint=http://${IP}3:9000&region=us-east-1")
    serve ra "${IP}4:0" "${flags[@]}"
    PIDS+=("$PID_ra")
    # The first replica owns the store before the second starts.
    KT_SERVER=$ADDR_ra KT_AGENT=$WORK/none "$KT" put bc/first --src "$0" >/dev/null
    serve rb "${IP}5:0" "${flags[@]}"
    PIDS+=("$PID_rb")
    local both=$ADDR_ra,$ADDR_rb
    KT_SERVER=$both KT_AGENT=$WORK/none "$KT" put bc/big --src "$ROOT_WORK/big" --locale store >/dev/null
    local socks=()
    for i in 0 1 2; do
        if [[ $way == direct ]]; then
            socks+=("$WORK/none")
            continue
        fi
        mkdir -p "$WORK/n$i"
        "$KT" agent --server "$both" --listen "${IP}$((6 + i)):0" --cache-dir "$WORK/n$i/cache" \
            --socket "$WORK/n$i/agent.sock" --node-id "n$i" --heartbeat-secs 1 >"$WORK/n$i/log" 2>&1 &
        PIDS+=("$!")
        socks+=("$WORK/n$i/agent.sock")
    done
    for i in 0 1 2; do
        [[ $way == direct ]] && continue
        for k in $(seq 100); do [[ -S ${socks[$i]} ]] && break; sleep 0.1; done
        [[ -S ${socks[$i]} ]] || die "agent n$i did not start: $(cat "$WORK/n$i/log")"
    done
    drop_caches
    t0=$EPOCHREALTIME
    local gets=()
    for i in 0 1 2; do
        (
            KT_SERVER=$both KT_AGENT=${socks[$i]} "$KT" get bc/big -d "$WORK/got$i" --json \
                >"$WORK/get$i.json" 2>"$WORK/get$i.err"
            echo "$EPOCHREALTIME" >"$WORK/end$i"
        ) &
        gets+=("$!")
    done
    if [[ $way == killed ]]; then
        sleep "$KILL_AT"
        kill -9 "$PID_ra"
    fi
    wait "${gets[@]}"
    T=0 STORE_MB=0 REJOINS=0
    for i in 0 1 2; do
        cmp -s "$WORK/got$i" "$ROOT_WORK/big" || die "$way $run: get $i differs: $(cat "$WORK/get$i.err")"
        T=$(awk -v a="$t0" -v b="$(cat "$WORK/end$i")" -v m="$T" 'BEGIN { t = b - a; printf "%.2f", (t > m ? t : m) }')
        STORE_MB=$(jq -r --argjson s "$STORE_MB" '([.sources[] | select(.source == "store") | .bytes] | add // 0) / 1e6 + $s' "$WORK/get$i.json")
        REJOINS=$((REJOINS + $(jq -r '.broadcast[0].rejoins // 0' "$WORK/get$i.json")))
        rm -f "$WORK/got$i"
    done
    STORE_MB=$(printf '%.0f' "$STORE_MB")
    log "$way $run: ${T} s, the store sent ${STORE_MB} MB, ${REJOINS} joins again"
    stop_run
    rm -rf "$shm" "$WORK"
}

# Stops this run's processes (cleanup's way, without its exit).
stop_run() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}

declare -A TIMES SENT JOINED
for run in $(seq "$RUNS"); do
    for way in direct swarm killed; do
        broadcast "$way" "$run"
        TIMES[$way]+="$T " SENT[$way]+="$STORE_MB " JOINED[$way]+="$REJOINS "
    done
done

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
row() { # WAY WHAT
    # shellcheck disable=SC2086
    echo "| $2 | $(median ${TIMES[$1]}) (${TIMES[$1]% }) | $(median ${SENT[$1]}) (${SENT[$1]% }) | ${JOINED[$1]% } |"
}
section=$(cat <<EOF
## A broadcast in cluster mode, and its owner's death (issue 44)

\`bash bench/cluster_broadcast.sh\` at $rev ($(date -u +%F), release build, 2 cores, loopback): three
\`kt get\` of one $BIG_MIB MiB key at once from a store of two replicas on etcd (one member on
/dev/shm) and s3s-fs, each run on a fresh store and fresh nodes, page cache dropped first;
medians of $RUNS runs (each run's figure in brackets). The time is the slowest get's; the store's
share is what the three got from it in all (one copy: $((BIG_MIB * 1048576 / 1000000)) MB).

| way | time, s | the store sent, MB | joins again (each run) |
|---|---|---|---|
$(row direct "three gets without agents, each from the store (baseline)")
$(row swarm "three gets through their agents, in one window's swarm")
$(row killed "the same, the owning replica killed ${KILL_AT} s in")
EOF
)
replace_section "$section"
echo "$section"
