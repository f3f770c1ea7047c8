#!/usr/bin/env bash
# Two builds of kt against each other, pair by pair: `kt put` of one pseudo-random file into a
# fresh store server, and `kt get` of it to a fresh destination, each build with its own server,
# the two builds taking turns (the order swapped every pair) and the page cache primed before
# every measured command, as bench/e2e.sh does. For a change that must not slow anything down
# (a refactoring, say), this says it directly, where e2e.sh's ratios also carry the noise of its
# baselines from one run to the next.
#
#   bash bench/ab.sh OLD_KT NEW_KT
#
# Environment (all optional): KT_AB_PAIRS pairs of each command (default 8), KT_AB_MIB size of
# the file in MiB (default 1024), KT_BENCH_TMP parent of the temporary directory. Everything
# listens on 127.0.0.1; the servers and the temporary directory are removed on exit. Prints each
# run and the medians; it writes no results file.
set -euo pipefail

OLD=${1:?usage: bench/ab.sh OLD_KT NEW_KT}
NEW=${2:?usage: bench/ab.sh OLD_KT NEW_KT}
PAIRS=${KT_AB_PAIRS:-8}
MIB=${KT_AB_MIB:-1024}
WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-ab.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf -- "$WORK"
}
trap cleanup EXIT
export KT_AGENT=$WORK/no-agent.sock
SRC=$WORK/src.bin
head -c $((MIB << 20)) /dev/urandom >"$SRC"

# Writing into page-cache memory the VM handed back to its host is slow (bench/e2e.sh,
# "Memory priming"): every measured command starts on memory just freed.
prime() {
    cat "$SRC" >/dev/null
    dd if=/dev/zero of="$WORK/prime.bin" bs=4M count=$((2 * MIB / 4)) status=none
    rm -f -- "$WORK/prime.bin"
}

start_server() { # KT DIR -> SERVER_ADDR, SERVER_PID
    "$1" server --listen 127.0.0.1:0 --data-dir "$2" >"$2.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    for _ in $(seq 500); do
        grep -q 'listening on' "$2.log" 2>/dev/null && break
        sleep 0.01
    done
    SERVER_ADDR=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$2.log")
    [[ -n $SERVER_ADDR ]] || { echo "no store server from $1" >&2; exit 1; }
}

elapsed() { # CMD... -> seconds
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}

put_once() { # LABEL KT
    local d t
    d=$(mktemp -d "$WORK/put.XXXX")
    start_server "$2" "$d/store"
    prime
    t=$(elapsed "$2" put ab/file.bin --src "$SRC" --server "$SERVER_ADDR")
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    rm -rf -- "$d"
    echo "put $1 $t"
}

declare -A GET_SERVER
get_once() { # LABEL KT
    local t
    rm -f -- "$WORK/got.bin"
    prime
    t=$(elapsed "$2" get ab/file.bin --dest "$WORK/got.bin" --server "${GET_SERVER[$1]}")
    cmp -s "$SRC" "$WORK/got.bin" || { echo "get $1: the copy differs" >&2; exit 1; }
    echo "get $1 $t"
}

for label in old new; do
    kt=$OLD
    [[ $label == new ]] && kt=$NEW
    start_server "$kt" "$WORK/get-$label"
    GET_SERVER[$label]=$SERVER_ADDR
    "$kt" put ab/file.bin --src "$SRC" --server "${GET_SERVER[$label]}" >/dev/null
done

RUNS=$WORK/runs
for i in $(seq "$PAIRS"); do
    for op in put get; do
        if ((i % 2)); then
            "${op}_once" new "$NEW" | tee -a "$RUNS"
            "${op}_once" old "$OLD" | tee -a "$RUNS"
        else
            "${op}_once" old "$OLD" | tee -a "$RUNS"
            "${op}_once" new "$NEW" | tee -a "$RUNS"
        fi
    done
done

median() { sort -n | awk '{ v[NR] = $1 } END { print (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2 }'; }
echo
for op in put get; do
    o=$(awk -v op="$op" '$1 == op && $2 == "old" { print $3 }' "$RUNS" | median)
    n=$(awk -v op="$op" '$1 == op && $2 == "new" { print $3 }' "$RUNS" | median)
    printf 'kt %s of %d MiB, median of %d: old %.3f s, new %.3f s, new/old %.2f\n' \
        "$op" "$MIB" "$PAIRS" "$o" "$n" "$(echo "$n / $o" | bc -l)"
done
