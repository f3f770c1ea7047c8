#!/usr/bin/env bash
# Chaos harness: one store server, three agents and one `kt mount` on loopback, random operations
# for SECONDS, and at random moments `kill -9` of an agent, the mount or the server while an
# operation runs, then its restart (same data dir, same address). Appends its section to
# bench/RESULTS.md (replacing an earlier one).
#
#   bash bench/chaos.sh [SECONDS]      (default 300)
#
# Operations: `kt put` of a 1-8 MiB random file (key and sha256 recorded once put says it
# published; half of them in 256 KiB blocks, so that their getters, broadcasts and mount readers
# fetch through the version's swarm, which needs four blocks or more); `kt get` of a published key through a random agent, alone or as a broadcast window
# of three getters (one per agent, so a parent exists); a read of a published key through the
# mount (into sha256sum); a write of a new file through the mount (recorded once `cp`, and so
# close, returned 0). A kill lands 0-2 s after an operation started; the target is restarted
# once the operation ended.
#
# What fails the run (exit 1): an operation that succeeded with bytes other than those put; an
# operation still running at its deadline below (killed by `timeout`, exit 124); after the loop,
# a key that a put or a mount write reported as published missing from `kt ls` or getting back
# other bytes, after one more kill -9 and restart of the server. An operation that failed while
# something was killed is expected and counted as such; one that failed with nothing killed is
# counted apart (see the results).
#
# Deadlines (what the code promises; the harness allows each plus a margin):
#   - connect to a dead address (store server or peer): 5 s (rpc CONNECT_TIMEOUT, data-plane
#     CONNECT_TIMEOUT); on loopback a dead process refuses at once.
#   - a data-plane source that stops sending while requests are outstanding is dropped after 30 s
#     (IDLE_TIMEOUT) and the blocks are fetched from the next source; a killed process closes its
#     sockets, so on loopback the failover is immediate.
#   - a peer asked for a block it expects but does not hold answers "not here" after 10 s
#     (PENDING_WAIT); a window member is never sent back to a parent that failed it. A getter
#     asks its own node only for what it holds now (no wait), and a node whose getter is
#     receiving the version is no seed (a holder on the swarm's board) for the others.
#   - a control-plane call: 300 s (RPC_TIMEOUT); a killed server resets the connection at once.
#   - a mount read whose sources are all gone: EIO after the same connect/idle bounds, never a
#     hang; a read on a killed mount: ENOTCONN at once.
#   The harness deadline per operation is KT_CHAOS_OP_DEADLINE (default 75 s: connect 5 s + idle
#   30 s twice, for a source and its replacement, plus margin for a debug build on a busy machine).
#
# Environment (all optional):
#   KT_CHAOS_OP_DEADLINE  seconds an operation may take before it counts as hung (default 75)
#   KT_CHAOS_KILL_PCT     percent of operations during which something is killed (default 30)
#   KT_CHAOS_SEED         RANDOM seed (default: the time)
#   KT_CHAOS_SLOW_DIR     keep, for each operation slower than KT_CHAOS_SLOW seconds (default 20),
#                         its stderr and the logs of every process at that moment (all of them
#                         run with RUST_LOG=ktfs=debug when this is set), in this directory
#   KT_BENCH_RESULTS      where to write the results (default bench/RESULTS.md)
#   KT_BENCH_TMP          parent of the temporary directory (default: $TMPDIR or /tmp)
#   KT_BENCH_REV          how to name the source revision in the results
#   CARGO_TARGET_DIR      honoured as cargo does (debug profile)
#
# Needs root (the FUSE mount) and /dev/fuse. Listens on 127.0.0.210-214 only. Every process and
# mount it starts, and its temporary directory, are removed on exit, failure and Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DURATION=${1:-300}
DEADLINE=${KT_CHAOS_OP_DEADLINE:-75}
KILL_PCT=${KT_CHAOS_KILL_PCT:-30}
SEED=${KT_CHAOS_SEED:-$(date +%s)}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=$TARGET/debug/kt
LOG_TAG=chaos
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup
RANDOM=$SEED

[[ $(id -u) == 0 ]] || die "needs root: the FUSE mount"
[[ -c /dev/fuse ]] || die "no /dev/fuse"
[[ $DURATION =~ ^[0-9]+$ ]] || die "usage: bench/chaos.sh [SECONDS]"
ensure_tools coreutils:timeout coreutils:sha256sum util-linux:mountpoint || die "missing tools"

log "cargo build --bins"
cargo build --bins
[[ -x $KT ]] || die "no binary at $KT"
REV=$(source_rev "$ROOT")

WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-chaos.XXXXXX")
log "working in $WORK (seed $SEED)"
mkdir -p "$WORK/src" "$WORK/dest"

# ---- the cluster --------------------------------------------------------------------------------
# Fixed addresses and ports, so a restarted process is found where the others remember it.
AGENTS=(a1 a2 a3)
declare -A IP=([server]=127.0.0.210 [a1]=127.0.0.211 [a2]=127.0.0.212 [a3]=127.0.0.213 [m1]=127.0.0.214)
declare -A PORT PID
for n in server "${AGENTS[@]}" m1; do PORT[$n]=$(free_port); done
SERVER=${IP[server]}:${PORT[server]}
export KT_SERVER=$SERVER
MNT=$WORK/mnt
mkdir -p "$MNT"

wait_line() { # NAME FILE PATTERN
    local i
    for i in $(seq 300); do
        grep -q -- "$3" "$2" 2>/dev/null && return 0
        kill -0 "${PID[$1]}" 2>/dev/null || { tail -5 "$WORK/$1.err" >&2; die "$1 exited on start"; }
        sleep 0.1
    done
    die "$1 not ready within 30 s"
}

# start NAME: starts (or restarts) a process with its data dir and address; logs are appended.
start() {
    local n=$1
    mkdir -p "$WORK/$n"
    : >"$WORK/$n.out"
    case $n in
    server)
        "$KT" server --listen "$SERVER" --data-dir "$WORK/server/data" \
            >>"$WORK/$n.out" 2>>"$WORK/$n.err" &
        PID[$n]=$!
        PIDS+=("${PID[$n]}")
        wait_line "$n" "$WORK/$n.out" "listening on"
        ;;
    m1)
        "$KT" mount "$MNT" --server "$SERVER" --listen "${IP[$n]}:${PORT[$n]}" \
            --cache-dir "$WORK/$n/cache" --socket "$WORK/$n.sock" --node-id "$n" \
            --locale store >>"$WORK/$n.out" 2>>"$WORK/$n.err" &
        PID[$n]=$!
        MOUNT_PIDS=("${PID[$n]}")
        MOUNT_DIRS=("$MNT")
        wait_line "$n" "$WORK/$n.out" "listening on"
        local i
        for i in $(seq 100); do is_mounted "$MNT" && return 0; sleep 0.1; done
        die "mount not mounted within 10 s"
        ;;
    *)
        "$KT" agent --server "$SERVER" --listen "${IP[$n]}:${PORT[$n]}" \
            --cache-dir "$WORK/$n/cache" --cache-size 1G --socket "$WORK/$n.sock" \
            --node-id "$n" --heartbeat-secs 2 >>"$WORK/$n.out" 2>>"$WORK/$n.err" &
        PID[$n]=$!
        PIDS+=("${PID[$n]}")
        wait_line "$n" "$WORK/$n.out" "listening on"
        ;;
    esac
}

# kill9 NAME: SIGKILL, reaped; a killed mount leaves a dead FUSE connection, detached here.
kill9() {
    local n=$1
    kill -KILL "${PID[$n]}" 2>/dev/null || true
    wait "${PID[$n]}" 2>/dev/null || true
    if [[ $n == m1 ]]; then
        MOUNT_PIDS=()
        if is_mounted "$MNT"; then umount -l -- "$MNT"; fi
    else
        forget_pid "${PID[$n]}"
    fi
}

# Diagnosis: every process and operation logs at debug level, and slow operations keep them.
SLOW_DIR=${KT_CHAOS_SLOW_DIR:-}
SLOW_S=${KT_CHAOS_SLOW:-20}
if [[ -n $SLOW_DIR ]]; then
    mkdir -p "$SLOW_DIR"
    export RUST_LOG=${RUST_LOG:-ktfs=debug}
fi

start server
for n in "${AGENTS[@]}"; do start "$n"; done
start m1
mkdir "$MNT/cw"
log "server $SERVER, agents ${AGENTS[*]}, mount m1 at $MNT"

# ---- bookkeeping --------------------------------------------------------------------------------
KEYS=()                 # published keys, in order
declare -A SHA          # key -> sha256 of what was put
declare -A RUNS OK FAILK FAILX MAXW MAXF KILLS
VERIFIED=0
HARNESS_FAIL=0
SEQ=0
KINDS=(put get bcast read write)
for k in "${KINDS[@]}"; do RUNS[$k]=0 OK[$k]=0 FAILK[$k]=0 FAILX[$k]=0 MAXW[$k]=0 MAXF[$k]=0; done
for n in server agent m1; do KILLS[$n]=0; done

bad() { log "HARNESS FAILURE: $*"; HARNESS_FAIL=$((HARNESS_FAIL + 1)); }
fmax() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > a ? b : a) }'; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
pick_key() { echo "${KEYS[RANDOM % ${#KEYS[@]}]}"; }

# run_op ID CMD...: runs CMD under the deadline in the background; rc and seconds to WORK/ID.res.
run_op() {
    local id=$1
    shift
    (
        t0=$EPOCHREALTIME
        rc=0
        timeout -k 5 "$DEADLINE" "$@" >"$WORK/$id.out" 2>"$WORK/$id.err" || rc=$?
        echo "$rc $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')" >"$WORK/$id.res"
    ) &
    OPS+=($!)
}

# account KIND ID KILLED CHECK: reads WORK/ID.res; CHECK (a command) verifies a success.
account() {
    local kind=$1 id=$2 killed=$3 rc t
    shift 3
    read -r rc t <"$WORK/$id.res"
    MAXW[$kind]=$(fmax "${MAXW[$kind]}" "$t")
    if [[ -n $SLOW_DIR ]] && awk -v t="$t" -v s="$SLOW_S" 'BEGIN { exit !(t > s) }'; then
        mkdir -p "$SLOW_DIR/$id"
        cp "$WORK/$id.err" "$SLOW_DIR/$id/cli.err"
        for n in server "${AGENTS[@]}" m1; do cp "$WORK/$n.err" "$SLOW_DIR/$id/$n.err" 2>/dev/null || true; done
        echo "$kind $id: ${t}s, rc $rc, killed: ${killed:-nothing}" >"$SLOW_DIR/$id/what"
        log "  $kind $id took ${t}s: logs kept in $SLOW_DIR/$id"
    fi
    if ((rc == 124 || rc == 137)); then
        bad "$kind $id still running after ${DEADLINE}s: $(tail -1 "$WORK/$id.err")"
        return 1
    fi
    if ((rc != 0)); then
        MAXF[$kind]=$(fmax "${MAXF[$kind]}" "$t")
        if [[ -n $killed ]]; then
            FAILK[$kind]=$((FAILK[$kind] + 1))
        else
            FAILX[$kind]=$((FAILX[$kind] + 1))
            log "  $kind $id failed with nothing killed (rc $rc, ${t}s): $(tail -1 "$WORK/$id.err")"
        fi
        return 1
    fi
    OK[$kind]=$((OK[$kind] + 1))
    "$@" || return 1
}

verify() { # FILE KEY
    if [[ $(sha_of "$1") == "${SHA[$2]}" ]]; then
        VERIFIED=$((VERIFIED + 1))
    else
        bad "$1 (key $2) differs from what was put"
        return 1
    fi
}
publish() { # KEY FILE
    SHA[$1]=$(sha_of "$2")
    KEYS+=("$1")
}

newfile() { # PATH: 1-8 MiB of random bytes, not a multiple of a block
    head -c $(((1 + RANDOM % 8) * 1048576 + RANDOM)) /dev/urandom >"$1"
}

# ---- the loop -----------------------------------------------------------------------------------
END=$((SECONDS + DURATION))
T0=$SECONDS
while ((SECONDS < END)); do
    SEQ=$((SEQ + 1))
    OPS=()
    if ((${#KEYS[@]} < 2)); then kind=put; else kind=${KINDS[RANDOM % ${#KINDS[@]}]}; fi
    RUNS[$kind]=$((RUNS[$kind] + 1))
    ag=${AGENTS[RANDOM % ${#AGENTS[@]}]}
    id=op$SEQ
    case $kind in
    put)
        key=cp/p$SEQ
        newfile "$WORK/src/$id"
        small=()
        ((RANDOM % 2)) && small=(--block-size 262144)
        run_op "$id" env KT_AGENT="$WORK/$ag.sock" "$KT" put "$key" --src "$WORK/src/$id" "${small[@]}"
        ;;
    get)
        key=$(pick_key)
        run_op "$id" env KT_AGENT="$WORK/$ag.sock" "$KT" get "$key" -d "$WORK/dest/$id"
        ;;
    bcast)
        key=$(pick_key)
        for a in "${AGENTS[@]}"; do
            run_op "$id-$a" env KT_AGENT="$WORK/$a.sock" "$KT" get "$key" -d "$WORK/dest/$id-$a" \
                --broadcast-timeout 2
        done
        ;;
    read)
        key=$(pick_key)
        run_op "$id" cp "$MNT/$key" "$WORK/dest/$id"
        ;;
    write)
        key=cw/w$SEQ
        newfile "$WORK/src/$id"
        run_op "$id" cp "$WORK/src/$id" "$MNT/$key"
        ;;
    esac

    victim=
    if ((RANDOM % 100 < KILL_PCT)); then
        case $((RANDOM % 3)) in
        0) victim=server ;;
        1) victim=${AGENTS[RANDOM % ${#AGENTS[@]}]} ;;
        2) victim=m1 ;;
        esac
        sleep "$((RANDOM % 2)).$((RANDOM % 10))"
        kill9 "$victim"
        KILLS[${victim//a[0-9]/agent}]=$((KILLS[${victim//a[0-9]/agent}] + 1))
        log "op $SEQ ($kind): killed $victim"
    fi
    for p in "${OPS[@]}"; do wait "$p" || true; done
    if [[ -n $victim ]]; then
        sleep "0.$((RANDOM % 10))"
        start "$victim"
        # The mount's directory may have been made by a write that the kill lost.
        [[ $victim == m1 ]] && { mkdir -p "$MNT/cw" 2>/dev/null || true; }
    fi

    case $kind in
    put | write) if account "$kind" "$id" "$victim" true; then publish "$key" "$WORK/src/$id"; fi ;;
    get) account get "$id" "$victim" verify "$WORK/dest/$id" "$key" || true ;;
    read) account read "$id" "$victim" verify "$WORK/dest/$id" "$key" || true ;;
    bcast)
        for a in "${AGENTS[@]}"; do
            account bcast "$id-$a" "$victim" verify "$WORK/dest/$id-$a" "$key" || true
        done
        ;;
    esac
    rm -rf "$WORK/dest/$id"* "$WORK/src/$id"
done
LOOP_S=$((SECONDS - T0))
log "loop done after ${LOOP_S}s: $SEQ operations, ${#KEYS[@]} keys published"

# ---- every published key after a server restart ------------------------------------------------
# Let the mount publish what it holds, then take the server down the hard way.
sleep 2
kill9 server
start server
sleep 3 # agents re-register on their next heartbeat
timeout "$DEADLINE" "$KT" ls cp >"$WORK/ls.cp" 2>&1 || bad "kt ls cp after the restart: $(tail -1 "$WORK/ls.cp")"
timeout "$DEADLINE" "$KT" ls cw >"$WORK/ls.cw" 2>&1 || bad "kt ls cw after the restart: $(tail -1 "$WORK/ls.cw")"
FINAL=0
for key in "${KEYS[@]}"; do
    grep -qw -- "${key#*/}" "$WORK/ls.${key%%/*}" || bad "$key not listed after the restart"
    rm -rf "$WORK/dest/final"
    if timeout "$DEADLINE" env KT_AGENT="$WORK/a1.sock" "$KT" get "$key" -d "$WORK/dest/final" \
        >/dev/null 2>"$WORK/final.err"; then
        verify "$WORK/dest/final" "$key" && FINAL=$((FINAL + 1))
    else
        bad "kt get $key after the restart: $(tail -1 "$WORK/final.err")"
    fi
done
log "after the restart: $FINAL of ${#KEYS[@]} published keys listed and verified"

# ---- results ------------------------------------------------------------------------------------
TOTAL_KILLS=$((KILLS[server] + KILLS[agent] + KILLS[m1]))
ALLFK=0 ALLFX=0
for k in "${KINDS[@]}"; do ALLFK=$((ALLFK + FAILK[$k])) ALLFX=$((ALLFX + FAILX[$k])); done
log "kills: server ${KILLS[server]}, agent ${KILLS[agent]}, mount ${KILLS[m1]}; verified $VERIFIED; failed during kills $ALLFK, otherwise $ALLFX; harness failures $HARNESS_FAIL"

BEGIN_M='<!-- bench/chaos.sh: begin -->'
END_M='<!-- bench/chaos.sh: end -->'
section() {
    echo "$BEGIN_M"
    echo "## Chaos: kill -9 of agents, the mount and the server under load"
    echo
    echo "Produced $(date -u '+%Y-%m-%d %H:%M') UTC by \`bash bench/chaos.sh $DURATION\` (seed $SEED) at $REV,"
    echo "dev-profile build, on loopback: one store server, three agents, one \`kt mount\`. ${LOOP_S} s of"
    echo "operations, one at a time (a broadcast is three getters at once); during ${KILL_PCT}% of them"
    echo "a random target was killed with SIGKILL 0-2 s after the operation started and restarted once"
    echo "it ended. Then the server was killed and restarted once more and every published key listed"
    echo "and got back."
    echo
    echo "| operation | runs | succeeded | failed during a kill | failed otherwise | max wait s | max wait of a failure s | deadline s |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    local k
    for k in "${KINDS[@]}"; do
        echo "| $k | ${RUNS[$k]} | ${OK[$k]} | ${FAILK[$k]} | ${FAILX[$k]} | ${MAXW[$k]} | ${MAXF[$k]} | $DEADLINE |"
    done
    echo
    echo "(bcast: runs are windows, the other columns count getters.) Kills during operations:"
    echo "$TOTAL_KILLS (server ${KILLS[server]}, agents ${KILLS[agent]}, mount ${KILLS[m1]}), then the last"
    echo "server restart. Copies verified (sha256 of a successful get or mount read, and the final"
    echo "gets): $VERIFIED. Keys published: ${#KEYS[@]}; after the last server restart $FINAL of them"
    echo "listed and verified. Harness failures: **$HARNESS_FAIL**."
    echo "$END_M"
}
if [[ -f $RESULTS ]]; then
    awk -v b="$BEGIN_M" -v e="$END_M" '$0 == b { on = 1 } !on { print } $0 == e { on = 0 }' "$RESULTS" >"$WORK/results"
    # No blank line left at the end where the old section was.
    sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$WORK/results" >"$RESULTS"
fi
{ echo; section; } >>"$RESULTS"
log "results in $RESULTS"
((HARNESS_FAIL == 0)) || die "$HARNESS_FAIL harness failures"
