#!/usr/bin/env bash
# GPU broadcast windows on the host transport: one state dict (default 1 GiB: 64 entries of
# 16 MiB, mixed dtypes) in a /dev/shm file on node A, published through A's /kt/.gpu control file
# in a window of world size 4 and received by three getters on nodes B, C and D, each into its own
# /dev/shm file, every call through the kernel's ioctl and poll(2) (the driver is
# bench/gpu_window.py: ctypes, no extension). One `kt server` and four `kt mount` processes, each
# its own node on its own loopback address (127.0.0.230-234). Writes its section of
# bench/RESULTS.md with the command that produced it.
#
#   bash bench/gpu.sh
#
# Variants, interleaved run by run (median of KT_BENCH_RUNS runs, default 3):
#   chain, packed        fanout 0 (A -> B -> C -> D, pipelined), KT_GPU_PACK
#   tree, packed         fanout 2 (A -> B, C; B -> D, or as the server plans it), KT_GPU_PACK
#   chain, unpacked      fanout 0, entry by entry
#   point to point       one getter (B), no window: A publishes, then B's GET pulls from A's worker
#   point to point, sealed  the same between nodes E and F of a second store server, one with a
#                        token file (127.0.0.235-237): the host transport sealed (AES-256-GCM)
#   plain TCP copy       the baseline: socat -b 1048576 (as bench/e2e.sh) of the same bytes from the
#                        source /dev/shm file to another over 127.0.0.1
# Then the same nodes with every node's uplink limited (KT_BENCH_GPU_LINK_MBIT, default 2000):
# an htb qdisc on lo whose classes, one per node, take the packets sent from that node's address
# (a getter pulls its bytes from its parent's worker, which listens on its node's address, so a
# node's class holds what it sends on). There the links, not this machine's two cores, are what a
# transfer waits for, as between the machines of a cluster: chain, tree and point to point, and the
# TCP copy sent from A's address to B's; and two shards of half the state dict each, A's to C and
# B's to D, once as one window of several keys (2 putters, 2 getters, packed: issue 43) and once as
# two point-to-point transfers at once, the baseline that window is held to.
# A window's time runs from the first KT_GPU_JOIN to the last getter's DONE (seen in poll(2));
# point to point from the GET to its DONE; the TCP copy from socat's start to the receiver's exit.
# Every getter's (and socat's) bytes are compared with the source after the clock stopped.
# Every node's transfer worker (the mount's `kt gpu-worker` child) is kept running between runs by
# a holder (`gpu_window.py hold`: a one-entry key published from that node), so the runs measure
# transfers, not worker start-up. Peak RSS: VmHWM of each mount process and of each worker, reset
# right before each timed interval and read right after it; CPU: each one's user+sys seconds and
# the machine's busy CPU-seconds over the timed interval.
#
# Environment (all optional):
#   KT_BENCH_GPU_MIB     state dict size in MiB (default 1024; a multiple of 8, 64 entries)
#   KT_BENCH_RUNS        runs per variant (default 3)
#   KT_BENCH_RESULTS     where to write (default bench/RESULTS.md)
#   KT_BENCH_GPU_LINK_MBIT  each node's uplink in the limited-link runs (default 2000; 0: none)
#   KT_BENCH_PRIME_MIB   MiB written into and deleted from /dev/shm before each run (default: 3 x
#                        the state dict: what a window's getters allocate), see bench/fuse.sh
#   KT_BENCH_REV, KT_BENCH_TMP, KT_BENCH_QUIET_WAIT, KT_BENCH_QUIET_TOTAL: as for bench/e2e.sh
#   CARGO_TARGET_DIR     honoured as cargo does
#
# Needs root and /dev/fuse (and tc, with lo's root qdisc the default, for the limited links). All
# processes, mounts, /dev/shm files, lo's qdisc and its temporary directory are removed on exit, on
# failure and on Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MIB=${KT_BENCH_GPU_MIB:-1024}
RUNS=${KT_BENCH_RUNS:-3}
LINK_MBIT=${KT_BENCH_GPU_LINK_MBIT:-2000}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=$TARGET/release/kt
BYTES=$((MIB * 1024 * 1024))
BUF=1048576
DRIVER=$ROOT/bench/gpu_window.py
LOG_TAG=gpu
PRIME_MIB_DEFAULT=$((3 * MIB))
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
SHM=kt-bench-gpu-$$
declare -a HOLD_PIDS=() SEEN_WORKERS=()
LO_SHAPED=

gpu_cleanup() {
    local rc=$? pid i
    set +e
    # Holders first (their control files keep the mounts busy), then the mounts while the server
    # still runs; a worker ends with its mount (it is let go with its last registration, and its
    # control socket closes with the mount), any left over is ended here; then lib.sh's cleanup
    # (the server, WORK), which exits with rc.
    for pid in "${HOLD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${HOLD_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    for i in "${!MOUNT_PIDS[@]}"; do stop_mount_pid "${MOUNT_PIDS[i]}" "${MOUNT_DIRS[i]}"; done
    MOUNT_PIDS=()
    for pid in "${SEEN_WORKERS[@]}"; do
        [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *gpu-worker* ]] && kill -TERM "$pid" 2>/dev/null
    done
    rm -f /dev/shm/"$SHM"-* 2>/dev/null
    [[ -n $LO_SHAPED ]] && tc qdisc del dev lo root 2>/dev/null
    (exit "$rc")
    cleanup
}
trap gpu_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
T_START=$SECONDS

# ---- preconditions, tools, build ----------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "needs root (FUSE mounts)"
[[ -c /dev/fuse ]] || die "no /dev/fuse"
ensure_tools socat:socat time:/usr/bin/time jq:jq diffutils:cmp util-linux:mountpoint procps:pgrep \
    || die "missing tools: socat time jq diffutils util-linux procps"
command -v python3 >/dev/null || die "needs python3 (the driver, bench/gpu_window.py)"
((MIB % 8 == 0 && MIB >= 8)) || die "KT_BENCH_GPU_MIB must be a multiple of 8"
if ((LINK_MBIT > 0)); then
    ensure_tools iproute2:tc || die "missing tools: iproute2 (tc, for the limited links)"
    # Someone else's qdisc on lo is theirs: replacing it, or deleting it at the end, would not do.
    [[ $(tc qdisc show dev lo) == "qdisc noqueue 0: root "* ]] \
        || die "lo has a qdisc already ($(tc qdisc show dev lo | head -1)); set KT_BENCH_GPU_LINK_MBIT=0 to run without limited links"
fi
shm_free=$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')
((shm_free > (6 * MIB + PRIME_MIB) * 1024)) || die "/dev/shm has $((shm_free / 1024)) MiB free; needs $((6 * MIB + PRIME_MIB))"

log "cargo build --release --bin kt"
cargo build --release --bin kt
[[ -x $KT ]] || die "no binary at $KT"
REV=$(source_rev "$ROOT")
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-gpu.XXXXXX")
log "working in $WORK"
mkdir -p "$WORK/mnt" "$WORK/cache"

# ---- processes ----------------------------------------------------------------------------------
declare -A MPID MDIR WPID
start_mount() { # NAME IP [SERVER [MORE MOUNT ARGS...]]
    mount_node "$1" "$2" "${3:-$SERVER_ADDR}" "gpu-bench-$1" --heartbeat-secs 1 "${@:4}"
}
worker_of() { # MOUNT-PID: the pid of its `kt gpu-worker` child, or nothing
    local c
    for c in $(pgrep -P "$1" 2>/dev/null); do
        [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$c/cmdline") == *gpu-worker* ]] && { echo "$c"; return 0; }
    done
    return 0
}
start_holder() { # NAME: keeps node NAME's worker running
    local name=$1 i pid
    python3 "$DRIVER" hold --mount "${MDIR[$name]}" --prefix "$SHM" \
        </dev/null >"$WORK/hold-$name.out" 2>"$WORK/hold-$name.err" &
    pid=$!
    HOLD_PIDS+=("$pid")
    for i in $(seq 300); do
        grep -qs '^held$' "$WORK/hold-$name.out" && break
        kill -0 "$pid" 2>/dev/null || { cat "$WORK/hold-$name.err" >&2; die "the holder on $name exited"; }
        sleep 0.1
    done
    grep -qs '^held$' "$WORK/hold-$name.out" || die "the holder on $name did not publish within 30 s"
    for i in $(seq 100); do
        WPID[$name]=$(worker_of "${MPID[$name]}")
        [[ -n ${WPID[$name]} ]] && break
        sleep 0.1
    done
    [[ -n ${WPID[$name]} ]] || die "no gpu-worker child of mount $name"
    SEEN_WORKERS+=("${WPID[$name]}")
    log "holder on $name (pid $pid); worker pid ${WPID[$name]}"
}
pids_check() { # every node's worker still the one its holder keeps (or say which changed)
    local n w
    for n in "${NODES[@]}"; do
        w=$(worker_of "${MPID[$n]}")
        [[ -n $w ]] || die "node $n's worker is gone"
        [[ $w == "${WPID[$n]}" ]] || { log "  node $n's worker changed: ${WPID[$n]} -> $w"; WPID[$n]=$w; SEEN_WORKERS+=("$w"); }
    done
}
pids_arg() { # NAME=PID,... for the driver: mounts and their workers
    local n out=
    for n in "${NODES[@]}"; do out+="${out:+,}$n=${MPID[$n]},w$n=${WPID[$n]}"; done
    echo "$out"
}

log "writing ${MIB} MiB of pseudo-random data to /dev/shm/$SHM-src"
SRC=/dev/shm/$SHM-src
head -c "$BYTES" /dev/urandom >"$SRC"
HALF=/dev/shm/$SHM-half
head -c "$((BYTES / 2))" "$SRC" >"$HALF"

NODES=(A B C D E F)
# The sealed cluster first (start_server keeps the last server's pid and address).
echo "gpu-bench-token-$$" >"$WORK/token"
start_server "$WORK/sealed-server" 127.0.0.235:0 --token-file "$WORK/token"
SEALED_PID=$SERVER_PID SEALED_ADDR=$SERVER_ADDR
log "kt server with a token $SEALED_ADDR (pid $SEALED_PID)"
start_server "$WORK/server" 127.0.0.230:0
log "kt server $SERVER_ADDR (pid $SERVER_PID)"
start_mount A 127.0.0.231
start_mount B 127.0.0.232
start_mount C 127.0.0.233
start_mount D 127.0.0.234
start_mount E 127.0.0.236 "$SEALED_ADDR" --token-file "$WORK/token"
start_mount F 127.0.0.237 "$SEALED_ADDR" --token-file "$WORK/token"
for n in "${NODES[@]}"; do start_holder "$n"; done

# Before each run: wait for a quiet machine, then write and delete PRIME_MIB in /dev/shm, so the
# getters' (and socat's) fresh shm pages do not pay for this VM's balloon (see bench/fuse.sh).
prime() {
    wait_quiet
    ((PRIME_MIB > 0)) || return 0
    dd if=/dev/zero of="/dev/shm/$SHM-prime" bs=4M count=$((PRIME_MIB / 4)) status=none
    rm -f -- "/dev/shm/$SHM-prime"
}

# ---- the runs -----------------------------------------------------------------------------------
VARIANTS=(chain tree unpacked p2p sealed)
declare -A VLABEL=(
    [chain]="window to 3, chain (fanout 0), packed"
    [tree]="window to 3, tree (fanout 2), packed"
    [unpacked]="window to 3, chain (fanout 0), unpacked"
    [p2p]="point to point, 1 getter, no window"
    [sealed]="point to point, sealed (a store server with a token)"
    [link-chain]="window to 3, chain (fanout 0), packed"
    [link-tree]="window to 3, tree (fanout 2), packed"
    [link-p2p]="point to point, 1 getter, no window"
    [link-mm]="window of 2 putters and 2 getters, a shard of half each (A to C, B to D), packed"
    [link-pairs]="the same 2 shards as 2 point-to-point transfers at once"
)
declare -A VARGS=(
    [chain]="window --fanout 0 --pack"
    [tree]="window --fanout 2 --pack"
    [unpacked]="window --fanout 0"
    [p2p]="p2p"
    [sealed]="p2p"
    [link-chain]="window --fanout 0 --pack"
    [link-tree]="window --fanout 2 --pack"
    [link-p2p]="p2p"
    [link-mm]="pairs --window --pack"
    [link-pairs]="pairs"
)
LINK_VARIANTS=(link-chain link-tree link-p2p link-mm link-pairs)
declare -A T O MC MH WH GT UP # per VARIANT,RUN: seconds, other CPU-s, machine CPU-s, peak mount, peak worker, getters, uplinks
GETTERS="${MDIR[B]},${MDIR[C]},${MDIR[D]}"
node_of() { # mount point -> node name
    local n
    for n in "${NODES[@]}"; do [[ ${MDIR[$n]} == "$1" ]] && { echo "$n"; return; }; done
    echo "?"
}

gpu_round() { # VARIANT RUN
    local v=$1 run=$2 out=$WORK/$1-$2.json getters=$GETTERS putter=${MDIR[A]} pids
    [[ $v == p2p || $v == link-p2p ]] && getters=${MDIR[B]}
    [[ $v == sealed ]] && putter=${MDIR[E]} getters=${MDIR[F]}
    prime
    pids_check
    pids=$(pids_arg)
    local what=(--putter "$putter" --getters "$getters" --src "$SRC" --mib "$MIB")
    [[ $v == link-mm || $v == link-pairs ]] \
        && what=(--pairs "${MDIR[A]}:${MDIR[C]},${MDIR[B]}:${MDIR[D]}" --src "$HALF" --mib "$((MIB / 2))")
    # shellcheck disable=SC2086
    python3 "$DRIVER" ${VARGS[$v]} "${what[@]}" \
        --key "bench/$v-$run-$$" --prefix "$SHM" --pids "$pids" >"$out" 2>"$WORK/$v-$run.err" \
        || { cat "$WORK/$v-$run.err" >&2; die "$v run $run"; }
    T[$v,$run]=$(jq -r .seconds "$out")
    MC[$v,$run]=$(jq -r .machine_cpu_s "$out")
    O[$v,$run]=$(jq -r '[.machine_cpu_s - ([.cpu_s[]] | add), 0] | max | . * 10 | round / 10' "$out")
    MH[$v,$run]=$(jq -r '[.hwm_kb | to_entries[] | select(.key | test("^[A-F]$")) | .value] | max' "$out")
    WH[$v,$run]=$(jq -r '[.hwm_kb | to_entries[] | select(.key | test("^w")) | .value] | max' "$out")
    local g=
    while read -r m f h d; do
        g+="${g:+, }$(node_of "$m") ${f}/${h}/${d}"
    done < <(jq -r '.getters[] | "\(.mount) \(.first_byte_s // "-") \(.half_s // "-") \(.done_s | . * 1000 | round / 1000)"' "$out")
    GT[$v,$run]=$g
    log "  $v: ${T[$v,$run]}s ($(awk -v b="$BYTES" -v t="${T[$v,$run]}" 'BEGIN { printf "%.0f", b / 1e6 / t }') MB/s); machine ${MC[$v,$run]} CPU-s (other ${O[$v,$run]}); getters first byte/half/done s: $g; peak mount $(mib "${MH[$v,$run]}") MiB, worker $(mib "${WH[$v,$run]}") MiB; cpu $(jq -c .cpu_s "$out")"
}

tcp_round() { # RUN [VARIANT]: socat -b BUF of the source into another /dev/shm file over lo
    # tcp: 127.0.0.1 to itself; link-tcp: from A's address (its class on lo) to B's.
    local run=$1 v=${2:-tcp} port recv t0 t1 b0 b1 dst=/dev/shm/$SHM-tcpdst send_cpu to=127.0.0.1 from=
    [[ $v == link-tcp ]] && to=127.0.0.232 from=,bind=127.0.0.231
    rm -f -- "$dst"
    port=$(free_port)
    /usr/bin/time -v -o "$WORK/tcp-recv$run.time" \
        socat -b "$BUF" -u "TCP-LISTEN:$port,reuseaddr,bind=$to" "OPEN:$dst,creat,trunc" \
        2>"$WORK/tcp-recv$run.err" &
    recv=$!
    PIDS+=("$recv")
    wait_listening "$port" "$recv"
    prime
    b0=$(busy_ticks)
    t0=$EPOCHREALTIME
    /usr/bin/time -v -o "$WORK/tcp-send$run.time" socat -b "$BUF" -u "OPEN:$SRC" "TCP:$to:$port$from" \
        || die "socat sender $run"
    wait "$recv" || die "socat receiver $run"
    t1=$EPOCHREALTIME
    b1=$(busy_ticks)
    forget_pid "$recv"
    T[$v,$run]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    read_time_file "$WORK/tcp-send$run.time"
    send_cpu=$CPU_S
    read_time_file "$WORK/tcp-recv$run.time"
    MC[$v,$run]=$(busy_s "$b0" "$b1")
    O[$v,$run]=$(other_s "${MC[$v,$run]}" "$CPU_S" "$send_cpu")
    MH[$v,$run]=$RSS_KB
    WH[$v,$run]=0
    GT[$v,$run]=
    cmp "$dst" "$SRC" || die "socat's copy $run differs from the source"
    rm -f -- "$dst"
    log "  $v: ${T[$v,$run]}s ($(awk -v b="$BYTES" -v t="${T[$v,$run]}" 'BEGIN { printf "%.0f", b / 1e6 / t }') MB/s); machine ${MC[$v,$run]} CPU-s (receiver $CPU_S, sender $send_cpu, other ${O[$v,$run]})"
}

for run in $(seq "$RUNS"); do
    log "run $run/$RUNS"
    tcp_round "$run"
    for v in "${VARIANTS[@]}"; do gpu_round "$v" "$run"; done
done

# ---- the same with limited links ----------------------------------------------------------------
# One htb class per node A-D on lo, fed by a u32 filter on the packets' source address; all else
# (the server, ACKs, the rest of the machine) goes to a class it never fills.
lo_shape() {
    local i
    tc qdisc add dev lo root handle 1: htb default 99 || die "tc qdisc add dev lo"
    LO_SHAPED=1
    tc class add dev lo parent 1: classid 1:99 htb rate 100gbit ceil 100gbit burst 4mb cburst 4mb quantum 200000 \
        || die "tc class 1:99"
    for i in 1 2 3 4; do
        tc class add dev lo parent 1: classid "1:1$i" htb rate "${LINK_MBIT}mbit" ceil "${LINK_MBIT}mbit" \
            burst 1mb cburst 1mb quantum 65536 || die "tc class 1:1$i"
        tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip src "127.0.0.23$i/32" flowid "1:1$i" \
            || die "tc filter for 127.0.0.23$i"
    done
}
lo_unshape() {
    tc qdisc del dev lo root || die "tc qdisc del dev lo root"
    LO_SHAPED=
}
uplinks() { # bytes each of A-D has sent through its class so far
    local i
    for i in 1 2 3 4; do
        tc -s class show dev lo classid "1:1$i" | awk '/ Sent / { print $2; exit }'
    done | paste -sd' '
}
link_round() { # VARIANT RUN: a round, with what each node sent through its uplink
    local before after
    before=$(uplinks)
    if [[ $1 == link-tcp ]]; then tcp_round "$2" link-tcp; else gpu_round "$1" "$2"; fi
    after=$(uplinks)
    UP[$1,$2]=$(paste -d' ' <(tr ' ' '\n' <<<"$before") <(tr ' ' '\n' <<<"$after") \
        | awk '{ printf "%s%.0f", (NR > 1 ? "/" : ""), ($2 - $1) / 1048576 }')
    log "  $1: MiB sent by A/B/C/D: ${UP[$1,$2]}"
}
if ((LINK_MBIT > 0)); then
    lo_shape
    log "lo shaped: each of A-D sends at most $LINK_MBIT Mbit/s"
    for run in $(seq "$RUNS"); do
        log "limited links, run $run/$RUNS"
        link_round link-tcp "$run"
        for v in "${LINK_VARIANTS[@]}"; do link_round "$v" "$run"; done
    done
    lo_unshape
fi

# ---- stop everything before writing (a failure to stop fails the run) ---------------------------
for pid in "${HOLD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${HOLD_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
HOLD_PIDS=()
for n in "${NODES[@]}"; do
    stop_mount_pid "${MPID[$n]}" "${MDIR[$n]}"
    is_mounted "${MDIR[$n]}" && die "${MDIR[$n]} is still mounted"
done
MOUNT_PIDS=() MOUNT_DIRS=()
stop_server
SERVER_PID=$SEALED_PID
stop_server
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- results ------------------------------------------------------------------------------------
col() { # KIND VARIANT: that value of every run
    local -n arr=$1
    local r
    for r in $(seq "$RUNS"); do echo "${arr[$2,$r]}"; done
}
med() { median $(col T "$1"); }
tcp_m=$(med tcp)
mbs() { awk -v b="$BYTES" -v t="$1" 'BEGIN { printf "%.0f", b / 1e6 / t }'; }
xof() { awk -v t="$1" -v s="$tcp_m" 'BEGIN { printf "%.2f", t / s }'; }
runs_col() { # VARIANT: "s (machine CPU-s, other CPU-s)" per run
    local r out=
    for r in $(seq "$RUNS"); do out+="${out:+, }${T[$1,$r]} (${MC[$1,$r]}, ${O[$1,$r]})"; done
    echo "$out"
}
median_run() { # VARIANT: the run whose time is the median (the lower middle one for an even count)
    local r
    for r in $(seq "$RUNS"); do echo "${T[$1,$r]} $r"; done | sort -g | awk -v n="$RUNS" 'NR == int((n + 1) / 2) { print $2 }'
}
tcp_cpu_m=$(median $(col MC tcp))
floor=$(awk -v c="$tcp_cpu_m" -v s="$tcp_m" -v n="$(nproc)" 'BEGIN { printf "%.2f", 3 * c / n / s }')

SECTION=gpu
BEGIN_MARK="<!-- bench/$SECTION.sh: begin -->"
END_MARK="<!-- bench/$SECTION.sh: end -->"
CMD="bash bench/gpu.sh"
[[ $MIB != 1024 ]] && CMD="KT_BENCH_GPU_MIB=$MIB $CMD"
[[ $RUNS != 3 ]] && CMD="KT_BENCH_RUNS=$RUNS $CMD"
{
    echo "$BEGIN_MARK"
    echo "## GPU windows on the host transport: a ${MIB} MiB state dict from one node to three"
    echo
    echo "Produced by \`$CMD\` on $(date -u '+%Y-%m-%d %H:%M UTC'), source revision $REV,"
    echo "$(nproc) cores, $(uname -sr), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM, in $((SECONDS - T_START)) s."
    echo "Load average at the start: $LOAD_START; at the end: $LOAD_END (it counts this benchmark's own processes;"
    echo "the machine is shared, and ${QUIET_SPENT} s were spent waiting for it to be idle for a second before runs)."
    echo "One \`kt server\` (127.0.0.230) and four \`kt mount\` nodes A-D (127.0.0.231-234), driven through"
    echo "\`/kt/.gpu\` by \`bench/gpu_window.py\` (ctypes ABI of \`python/ktfs/gpu_abi.py\`, real ioctl and poll(2)):"
    echo "64 entries of $((MIB / 64)) MiB (float32, bfloat16, int64, uint8, float16 in turn) in one /dev/shm file on"
    echo "A, each getter (B, C, D) receiving into its own fresh /dev/shm file; every getter's bytes compared"
    echo "with the source after the clock stopped. A window's time: first \`KT_GPU_JOIN\` to the last getter's"
    echo "DONE (world size 4, getters join first); point to point: B's \`KT_GPU_GET\` to its DONE (A published"
    echo "first, untimed); TCP: \`socat -b $BUF\` of the source file into another /dev/shm file over 127.0.0.1."
    echo "Every node's worker was kept running between runs (a one-entry key held on each node), so worker"
    echo "start-up is not in the times. Before every run ${PRIME_MIB} MiB were written into /dev/shm and deleted."
    echo "Median of $RUNS runs, the variants interleaved run by run. MB/s is 10^6 bytes of one copy per second;"
    echo "**x TCP** is time / the TCP copy's median time (a window that costs one transfer is 1.00; three"
    echo "transfers one after another, 3.00). Peak RSS: VmHWM, reset right before the timed interval, the"
    echo "largest mount process and the largest \`kt gpu-worker\` over nodes and runs (socat: its receiver)."
    echo "Machine CPU: CPU-seconds the whole machine was busy over the timed interval (median); in the last"
    echo "column each run's seconds, then (machine CPU-s, CPU-s of anything but the mounts and workers, or"
    echo "socat)."
    echo
    echo "| variant | median s | MB/s | x TCP | machine CPU s | peak RSS mount | peak RSS worker | runs: s (machine, other CPU-s) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
    m=$tcp_m
    echo "| plain TCP copy (socat -b $BUF), baseline | $m | $(mbs "$m") | 1.00 | $tcp_cpu_m | socat $(mib "$(maxof $(col MH tcp))") MiB | - | $(runs_col tcp) |"
    for v in "${VARIANTS[@]}"; do
        m=$(med "$v")
        echo "| ${VLABEL[$v]} | $m | $(mbs "$m") | $(xof "$m") | $(median $(col MC "$v")) | $(mib "$(maxof $(col MH "$v"))") MiB | $(mib "$(maxof $(col WH "$v"))") MiB | $(runs_col "$v") |"
    done
    echo
    echo "When each getter's first bytes and half its bytes had landed, and when it was done: s from the start,"
    echo "first/half/done (the first two read off the getter's sparse /dev/shm file, its allocated blocks, every"
    echo "20 ms: \`KT_GPU_STATUS\` reports \`bytes_done\` only once the transfer is over; - = not seen before the"
    echo "end), in each variant's median run. Pipelined, every getter starts and ends within moments of the"
    echo "others; store and forward, each would start when its parent was done:"
    echo
    for v in "${VARIANTS[@]}"; do
        r=$(median_run "$v")
        echo "- ${VLABEL[$v]} (run $r, ${T[$v,$r]} s): ${GT[$v,$r]}"
    done
    echo
    c=$(med chain)
    echo "Goal: a pipelined window to 3 costs about one transfer, not three: the packed chain took"
    echo "**$(xof "$c")x** one TCP copy, $(awk -v a="$c" -v b="$(med p2p)" 'BEGIN { printf "%.2f", a / b }')x kt's own point-to-point transfer."
    echo "On this loopback machine the links are the CPU: one TCP copy kept the machine busy for $tcp_cpu_m CPU-s"
    echo "(of $(nproc) cores), so three copies' worth of bytes (every hop is a loopback send and receive) cannot take"
    echo "less than about 3 x that / $(nproc) cores = ${floor}x the TCP copy's time however well they are pipelined"
    echo "(machine CPU counts whatever else ran meanwhile). kt's own cost per copy, the same way: point to point kept"
    echo "the machine busy for $(median $(col MC p2p)) CPU-s; the packed chain for $(median $(col MC chain)) CPU-s,"
    echo "$(awk -v w="$(median $(col MC chain))" -v p="$(median $(col MC p2p))" 'BEGIN { printf "%.2f", w / (3 * p) }')x three point-to-point copies' worth."
    echo
    echo "Sealing's cost (issue 17): where the store server authenticates, the host transport seals every"
    echo "frame (AES-256-GCM under the keys of a Noise NNpsk0 handshake on the registration's secret). Point to point"
    echo "between E and F of a second server, one with a token file: $(med sealed) s against $(med p2p) s unsealed,"
    echo "**$(awk -v a="$(med sealed)" -v b="$(med p2p)" 'BEGIN { printf "%.2f", a / b }')x**; machine CPU $(median $(col MC sealed)) CPU-s against $(median $(col MC p2p))."
    if ((LINK_MBIT > 0)); then
        lt=$(med link-tcp)
        lx() { awk -v t="$1" -v s="$lt" 'BEGIN { printf "%.2f", t / s }'; }
        echo
        echo "### The same nodes, each node's uplink limited to $LINK_MBIT Mbit/s"
        echo
        echo "An htb qdisc on lo with one class per node, fed by the packets sent from its address: a getter"
        echo "pulls its bytes from its parent's worker, which listens on its node's address, so what a node passes"
        echo "on goes through its own class. Here the links are what a transfer waits for, not this machine's"
        echo "cores, as between the machines of a cluster. The TCP copy: socat from A's address to B's. **x TCP**"
        echo "against that copy's median; MiB sent by A/B/C/D: what each node's class carried in the run (a chain:"
        echo "A, B and C each send the state dict once; a tree of degree 2: A twice, B once). Median of $RUNS runs."
        echo
        echo "| variant | median s | MB/s | x TCP | machine CPU s | peak RSS mount | peak RSS worker | MiB sent by A/B/C/D | runs: s (machine, other CPU-s) |"
        echo "|---|---:|---:|---:|---:|---:|---:|---|---|"
        m=$lt
        echo "| plain TCP copy A to B (socat -b $BUF), baseline | $m | $(mbs "$m") | 1.00 | $(median $(col MC link-tcp)) | socat $(mib "$(maxof $(col MH link-tcp))") MiB | - | ${UP[link-tcp,$(median_run link-tcp)]} | $(runs_col link-tcp) |"
        for v in "${LINK_VARIANTS[@]}"; do
            m=$(med "$v")
            echo "| ${VLABEL[$v]} | $m | $(mbs "$m") | $(lx "$m") | $(median $(col MC "$v")) | $(mib "$(maxof $(col MH "$v"))") MiB | $(mib "$(maxof $(col WH "$v"))") MiB | ${UP[$v,$(median_run "$v")]} | $(runs_col "$v") |"
        done
        echo
        echo "First/half/done per getter, as above, in each variant's median run:"
        echo
        for v in "${LINK_VARIANTS[@]}"; do
            r=$(median_run "$v")
            echo "- ${VLABEL[$v]} (run $r, ${T[$v,$r]} s): ${GT[$v,$r]}"
        done
        echo
        echo "Target (issue 43): a window of several keys costs what its transfers cost side by side: 2 putters"
        echo "and 2 getters, a $((MIB / 2)) MiB shard each, took **$(awk -v a="$(med link-mm)" -v b="$(med link-pairs)" 'BEGIN { printf "%.2f", a / b }')x** the same two point-to-point"
        echo "transfers run at once ($(awk -v a="$(med link-mm)" -v b="$(med link-pairs)" 'BEGIN { if (a / b <= 1.2) print "met"; else print "not met" }'): at most 1.2x)."
        echo
        echo "Target (issue 14 item 8): all three getters filled within 1.5x of one plain TCP copy's time: the"
        echo "packed chain over these links took **$(lx "$(med link-chain)")x** one copy over them"
        echo "($(awk -v r="$(lx "$(med link-chain)")" 'BEGIN { if (r <= 1.5) print "met"; else print "not met" }') where the links are the bottleneck; over bare loopback above, where this machine's two cores are,"
        echo "$(xof "$c")x against a floor of ${floor}x)."
    fi
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS ($((SECONDS - T_START)) s)"
cat "$WORK/section.md"
