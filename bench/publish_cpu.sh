#!/usr/bin/env bash
# Store-server CPU per publish of a small file, two builds of `kt` in the same run, and the table
# in bench/RESULTS.md ("Publishing many small files"). Two workloads, each on a fresh server:
#   mount:  `cp -r` of FILES files of 4 KiB (in 20 directories) into a `kt mount` (every close
#           is a publish, one at a time);
#   mount8: the same 20 directories, 8 `cp -r` at once (concurrent publishes through one mount);
#   put:   the same files, each its own `kt put`, CLIENTS at once (concurrent publishes);
#   wb:    `cp -r` into a `kt mount --writeback`, then an fsync of the mount's root (which waits
#          for every queued publish); a baseline without `--writeback` runs the plain mount.
# The server's CPU is utime+stime from /proc/PID/stat over the workload alone (the server and
# mount are started and ready before it), divided by the files published.
#
# KT_BENCH_DIRS (default 20) spreads the files over that many directories; KT_BENCH_WORKLOADS
# (default "mount mount8 put") picks the workloads; KT_BENCH_ROUNDS (default 2) the rounds.
#
# usage: bench/publish_cpu.sh BASELINE_KT NEW_KT [FILES] [CLIENTS]
set -Eeuo pipefail
trap 'echo "bench/publish_cpu.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
BASE=${1:?usage: bench/publish_cpu.sh BASELINE_KT NEW_KT [FILES] [CLIENTS]}
NEW=${2:?usage: bench/publish_cpu.sh BASELINE_KT NEW_KT [FILES] [CLIENTS]}
FILES=${3:-2000}
CLIENTS=${4:-8}
ROUNDS=${KT_BENCH_ROUNDS:-2}
DIRS=${KT_BENCH_DIRS:-20}
WORKLOADS=${KT_BENCH_WORKLOADS:-mount mount8 put}
IP=${KT_BENCH_IP:-127.0.0.56}
OUT=${KT_BENCH_OUT:-bench/RESULTS.md}
HZ=$(getconf CLK_TCK)
export LC_ALL=C RUST_LOG=warn
unset KT_NAMESPACE KT_SERVER

W=$(mktemp -d /tmp/kt-pubcpu.XXXX)
PIDS=()
cleanup() {
    set +e
    stop_all
    rm -rf "$W"
}
trap cleanup EXIT

SRC=$W/src
per_dir=$((FILES / DIRS))
for d in $(seq 1 "$DIRS"); do
    mkdir -p "$SRC/d$d"
    for f in $(seq 1 "$per_dir"); do head -c 4096 /dev/urandom > "$SRC/d$d/f$f"; done
done
FILES=$((per_dir * DIRS))
(cd "$SRC" && find . -type f | sed 's|^\./||') > "$W/list"

# ready LOG [LINE]: waits for LINE (default "listening on") in LOG.
ready() { for _ in $(seq 600); do grep -q "${2:-listening on}" "$1" && return; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hwm_mib() { awk '/VmHWM/ {printf "%d", $2 / 1024}' "/proc/$1/status"; }
gauge() { { curl -s "http://$1/metrics" || true; } | awk -v s="$2" '$1 == s {print $2}'; }

# start_server BIN: sets SP and ADDR.
start_server() {
    rm -rf "$W/store" "$W/cache" "$W/mnt"
    mkdir -p "$W/mnt"
    "$1" server --listen "$IP:0" --data-dir "$W/store" > "$W/server.log" 2>&1 &
    SP=$!
    PIDS+=("$SP")
    ready "$W/server.log"
    ADDR=$(grep -o "listening on [0-9.:]*" "$W/server.log" | head -1 | cut -d' ' -f3)
}

# The mount first (it unmounts on SIGTERM), then the server.
stop_all() {
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill "${PIDS[$i]}" 2>/dev/null || true
        wait "${PIDS[$i]}" 2>/dev/null || true
    done
    umount -l "$W/mnt" 2>/dev/null || true
    PIDS=()
}

# measure BIN WORKLOAD: sets R to "ms_per_publish wall_s peak_rss_mib syncs_per_publish" (run in
# this shell, not a subshell, so the EXIT trap knows its processes).
measure() {
    local bin=$1 how=$2 t0 t1 s0 s1 syncs
    start_server "$bin"
    if [[ $how == mount* || $how == wb ]]; then
        local wb=()
        [[ $how == wb ]] && "$bin" mount --help | grep -q -- --writeback && wb=(--writeback)
        "$bin" mount "$W/mnt" --server "$ADDR" --listen "$IP:0" --cache-dir "$W/cache" \
            --socket "$W/agent.sock" --node-id pubcpu "${wb[@]}" > "$W/mount.log" 2>&1 &
        PIDS+=("$!")
        # The agent listens before the filesystem is mounted.
        ready "$W/mount.log" "mounted at"
        # Until the mount answers a lookup (right after it starts, one may fail with EIO).
        for _ in $(seq 200); do ls "$W/mnt" > /dev/null 2>&1 && break; sleep 0.05; done
    fi
    t0=$(ticks "$SP")
    s0=$(date +%s.%N)
    if [[ $how == mount ]]; then
        cp -r "$SRC" "$W/mnt/x"
    elif [[ $how == wb ]]; then
        cp -r "$SRC" "$W/mnt/x"
        python3 -c 'import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))' "$W/mnt"
    elif [[ $how == mount8 ]]; then
        # Each into a directory of the mount's root of its own: no cp waits on a directory
        # another one makes.
        ls "$SRC" | xargs -P 8 -I{} cp -r "$SRC/{}" "$W/mnt/{}"
    else
        KT_AGENT=$W/no-agent.sock xargs -P "$CLIENTS" -I{} "$bin" put "x/{}" --src "$SRC/{}" --server "$ADDR" < "$W/list" > /dev/null
    fi
    s1=$(date +%s.%N)
    t1=$(ticks "$SP")
    # The baseline has no such gauge: "-".
    syncs=$(gauge "$ADDR" kt_meta_wal_syncs)
    local rss
    rss=$(hwm_mib "$SP")
    stop_all
    R=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v n="$FILES" -v s0="$s0" -v s1="$s1" -v r="$rss" -v y="${syncs:--}" \
        'BEGIN { printf "%.3f %.2f %s %s\n", (b - a) * 1000 / hz / n, s1 - s0, r, (y == "-" ? "-" : sprintf("%.3f", y / n)) }')
}

declare -A RES
for round in $(seq 1 "$ROUNDS"); do
    for how in $WORKLOADS; do
        for which in base new; do
            bin=$BASE
            [[ $which == new ]] && bin=$NEW
            measure "$bin" "$how"
            echo "round $round $how $which: $R" >&2
            RES[$how.$which]+="$R"$'\n'
        done
    done
done

# Medians over the rounds (lower middle for an even count), per column.
med() { printf '%s' "${RES[$1]}" | awk -v c="$2" 'NF {print $c}' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
peak() { printf '%s' "${RES[$1]}" | awk 'NF {print $3}' | sort -g | tail -1; }

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo
    echo "## Publishing many small files: store-server CPU per publish (issue 18)"
    echo
    echo "Produced by \`bash bench/publish_cpu.sh BASELINE_KT NEW_KT $FILES $CLIENTS\` on $(date -u '+%Y-%m-%d %H:%M') UTC,"
    echo "source revision $rev, $(nproc) cores; median of $ROUNDS rounds, the two builds interleaved."
    echo "Baseline: ${KT_BENCH_BASE_NAME:-$BASE}; new: ${KT_BENCH_NEW_NAME:-$NEW}."
    echo "CPU is the store server's utime+stime (/proc/PID/stat) over the workload, divided by the"
    echo "$FILES files of 4 KiB published; \`mount\` is \`cp -r\` of $DIRS directories into a \`kt mount\`"
    echo "(one publish per close, one at a time), \`mount8\` the same with 8 \`cp -r\` of one directory"
    echo "each at once; \`put\` is one \`kt put\` per file, $CLIENTS at once"
    echo "(each a new process and connection, so the server's CPU includes a connection per publish);"
    echo "\`wb\` is \`cp -r\` into a \`kt mount --writeback\` and an fsync of its root (every publish"
    echo "landed; a baseline without the flag runs the plain mount)."
    echo "Syncs per publish: WAL fsyncs of metadata batches. Peak RSS is the server's VmHWM, largest over the rounds."
    echo
    echo "| workload | baseline ms CPU/publish | new ms CPU/publish | new / baseline | wall s baseline | wall s new | syncs/publish (new) | peak RSS baseline / new |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
    for how in $WORKLOADS; do
        b=$(med "$how.base" 1)
        n=$(med "$how.new" 1)
        ratio=$(awk -v b="$b" -v n="$n" 'BEGIN { printf "%.2f", (b > 0 ? n / b : 0) }')
        echo "| $how | $b | $n | ${ratio}x | $(med "$how.base" 2) | $(med "$how.new" 2) | $(med "$how.new" 4) | $(peak "$how.base") / $(peak "$how.new") MiB |"
    done
} | tee -a "$OUT"
