#!/usr/bin/env bash
# A replica restarted from nothing (issue 44's row "a replica restarted from nothing serves
# within 2 s"): a store on etcd (one member, its data on /dev/shm) and s3s-fs, with
# authentication (a shared token, a ticket secret), holding FILES keys of 4 KiB written through
# a mount and one key of BIG_MIB MiB. Its replica is stopped (SIGTERM: it gives its claim up),
# then, RUNS times, a replica starts on an empty data directory (a pod of a Deployment with no
# volume) and is timed from its start: until it says it listens, until a `kt ls` of the store
# answers through it, and until a `kt put` through it succeeds (it owns the store: it claimed
# it, found the namespaces' block references complete in etcd, and serves writes). Then it is
# stopped and its directory removed. Medians and the largest; the replica's peak RSS.
#
#   bash bench/restart.sh   # KT_BENCH_FILES (2000), KT_BENCH_BIG_MIB (64), KT_BENCH_RUNS (5)
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${KT_BENCH_FILES:-2000}
BIG_MIB=${KT_BENCH_BIG_MIB:-64}
RUNS=${KT_BENCH_RUNS:-5}
LOG_TAG=restart
PRIME_MIB_DEFAULT=0
KT_BENCH_QUIET_WAIT=${KT_BENCH_QUIET_WAIT:-0}
source bench/lib.sh
if [[ -z ${KT_BIN:-} ]]; then
    cargo build --release --quiet --bin kt
fi
KT=${KT_BIN:-$PWD/target/release/kt}
WORK=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
install_cleanup
trap 'cleanup; rm -rf "$SHM"' EXIT
export KT_AGENT=$WORK/none.sock RUST_LOG=info
export AWS_ACCESS_KEY_ID=kt-test-access AWS_SECRET_ACCESS_KEY=kt-test-secret
IP=127.0.0.10
printf 'restart-bench-token\n' >"$WORK/token"
head -c 48 /dev/urandom >"$WORK/secret"
export KT_TOKEN_FILE=$WORK/token

start_etcd "${IP}2" "$SHM/m1"
start_s3 "${IP}3"
FLAGS=(--meta "etcd://${IP}2:2379/kt-restart"
    --blocks "s3://bucket/restart?endpoint=http://${IP}3:9000&region=us-east-1"
    --token-file "$WORK/token" --ticket-secret "$WORK/secret")

# The store as its first replica leaves it.
start_server "$WORK/first" "${IP}4:0" "${FLAGS[@]}"
mkdir -p "$WORK/src/files"
for i in $(seq "$FILES"); do head -c 4096 /dev/urandom >"$WORK/src/files/f$i"; done
head -c $((BIG_MIB << 20)) /dev/urandom >"$WORK/src/big"
KT_SERVER=$SERVER_ADDR "$KT" put restart/big --src "$WORK/src/big" >/dev/null
mount_node writer "${IP}6" "$SERVER_ADDR" restart-writer --token-file "$WORK/token"
mkdir -p "${MDIR[writer]}/restart"
cp -r "$WORK/src/files" "${MDIR[writer]}/restart/files"
stop_mount writer
[[ $(KT_SERVER=$SERVER_ADDR "$KT" ls restart/files | wc -l) -eq $FILES ]] || die "files missing"
stop_server
log "the store holds $FILES small keys and one of $BIG_MIB MiB; its replica stopped"

ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
declare -a LISTEN READ WRITE RSS
# time_replica RUN: one replica from nothing, timed; sets listen, read_ms, write_ms, rss, rebuilt.
time_replica() {
    local run=$1 dir=$WORK/replica-$1 t0 pid addr=
    mkdir -p "$dir"
    t0=$EPOCHREALTIME
    "$KT" server --listen "${IP}5:0" --data-dir "$dir/data" "${FLAGS[@]}" >"$dir/out" 2>"$dir/err" &
    pid=$!
    PIDS+=("$pid")
    while [[ -z $addr ]]; do
        addr=$(sed -n 's/^kt server listening on //p' "$dir/out")
        kill -0 "$pid" 2>/dev/null || { cat "$dir/err" >&2; die "kt server exited"; }
        [[ -n $addr ]] || sleep 0.01
    done
    listen=$(ms_since "$t0")
    until KT_SERVER=$addr "$KT" ls restart >/dev/null 2>&1; do sleep 0.01; done
    read_ms=$(ms_since "$t0")
    printf 'run %s\n' "$run" >"$dir/probe"
    until KT_SERVER=$addr "$KT" put "restart/probe-$run" --src "$dir/probe" >/dev/null 2>&1; do
        sleep 0.01
    done
    write_ms=$(ms_since "$t0")
    rss=$(proc_hwm_kb "$pid")
    rebuilt=$(grep -c "rebuilt the namespaces' references" "$dir/err" || true)
    kill -TERM "$pid"
    wait "$pid" || true
    forget_pid "$pid"
    rm -rf "$dir/data"
}
for run in $(seq "$RUNS"); do
    time_replica "$run"
    [[ $rebuilt -eq 0 ]] || die "run $run rebuilt the references"
    LISTEN+=("$listen") READ+=("$read_ms") WRITE+=("$write_ms") RSS+=("$rss")
    log "run $run: listening ${listen} ms, first read ${read_ms} ms, first write ${write_ms} ms, peak RSS $(mib "$rss") MiB"
done
# The same with the references' completion marker taken out of etcd: the replica rebuilds them
# from every key before it serves, as every new owner on an empty data directory did before
# they were kept in etcd.
marker=$(ETCDCTL_API=3 etcdctl --endpoints "http://${IP}2:2379" get --prefix --keys-only "" |
    grep -a 'rcomplete$' || true)
[[ -n $marker ]] || die "no completion marker of the references in etcd"
ETCDCTL_API=3 etcdctl --endpoints "http://${IP}2:2379" del "$marker" >/dev/null
time_replica rebuild
[[ $rebuilt -eq 1 ]] || die "the replica did not rebuild the references"
log "with a rebuild: listening ${listen} ms, first read ${read_ms} ms, first write ${write_ms} ms"
REBUILD_WRITE=$write_ms
row() { # NAME VALUES...
    local name=$1
    shift
    printf '| %s | %s | %s | %s |\n' "$name" "$(median "$@")" "$(maxof "$@")" "$*"
}
section=$(
    cat <<EOF
## A replica restarted from nothing (issue 44)

Produced by \`bash bench/restart.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, source $(source_rev .),
release build, 2 cores, loopback: a store on etcd (one member on /dev/shm) and s3s-fs with
authentication (a shared token and ticket secret), holding $FILES keys of 4 KiB written through a
mount and one of $BIG_MIB MiB; its replica stopped (it gives its claim up). Then $RUNS times a
replica on an empty data directory, timed from its start; it then stops and its directory goes.
None of them rebuilt the namespaces' block references (they are in etcd). The last row is one
run more with the references' completion marker deleted from etcd: that replica rebuilds them
from every key before it serves, as every new owner on an empty data directory did before they
were kept in etcd. Milliseconds.

| from the replica's start until | median ms | largest ms | runs ms |
|---|---|---|---|
$(row "it listens" "${LISTEN[@]}")
$(row "a \`kt ls\` through it answers" "${READ[@]}")
$(row "a \`kt put\` through it succeeds (it owns the store)" "${WRITE[@]}")
| the same, the references to rebuild first (every new owner before they were in etcd) | $REBUILD_WRITE | | one run |

The rebuild held the replica's first write $(awk -v r="$REBUILD_WRITE" -v w="$(median "${WRITE[@]}")" 'BEGIN { printf "%.0f", r - w }') ms longer, about $(awk -v r="$REBUILD_WRITE" -v w="$(median "${WRITE[@]}")" -v n="$((FILES + 1))" 'BEGIN { printf "%.2f", (r - w) / n }') ms a key: a
takeover of a store of a million keys would have held writes for minutes. The replica's peak
RSS: $(mib "$(maxof "${RSS[@]}")") MiB at most. Target (issue 44): a replica restarted from
nothing serves within 2 s.
EOF
)
replace_section "$section"
printf '%s\n' "$section"
