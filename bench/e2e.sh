#!/usr/bin/env bash
# End-to-end benchmark: `kt put` and `kt get` of one 1 GiB pseudo-random file through a release
# `kt server` on loopback, against two baselines in the same run: an rsync daemon pull and a plain
# TCP copy with socat. Every copy is checked with cmp; every measured command runs RUNS times
# (default 3) and the median is reported. Writes bench/RESULTS.md (the end-to-end table, plus the
# medians of the latest `cargo bench --bench hashing` run found under target/criterion).
#
#   bash bench/e2e.sh
#
# Environment (all optional):
#   KT_BENCH_MIB      size of the test file in MiB (default 1024)
#   KT_BENCH_RUNS     runs per measured command (default 3)
#   KT_BENCH_RESULTS  where to write the results (default bench/RESULTS.md)
#   KT_BENCH_REV      how to name the source revision in the results (default: the git commit, marked if src/ has uncommitted changes)
#   KT_BENCH_TMP      parent of the temporary directory (default: $TMPDIR or /tmp)
#   KT_BENCH_QUIET_WAIT  seconds to wait, before each measured command, for other work on the
#                     machine to stop (default 60; 0 = don't wait); KT_BENCH_QUIET_TOTAL caps the
#                     waiting over the whole run (default 240). See wait_quiet in bench/lib.sh.
#   KT_BENCH_PRIME_MIB  MiB of page cache written and freed right before each measured command
#                     (default 2048; 0 = off). See "Memory priming" below.
#   CARGO_TARGET_DIR  honoured as cargo does
#
# Everything listens on 127.0.0.1 only. All processes it starts and its temporary directory are
# removed on exit, on failure and on Ctrl-C. Nothing is dropped from the page cache: the source
# is read warm by every tool alike. Every section of RESULTS.md after its own is kept.
#
# The plain TCP baseline is socat with a 1 MiB buffer on both ends (`-b 1048576`): with its
# default 8 KiB buffer socat is bound by its own read/write syscalls, not by TCP, so that pair
# is shown as an information row only.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SIZE_MIB=${KT_BENCH_MIB:-1024}
RUNS=${KT_BENCH_RUNS:-3}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=$TARGET/release/kt
BYTES=$((SIZE_MIB * 1024 * 1024))
LOG_TAG=e2e
PRIME_MIB_DEFAULT=2048
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup

# ---- tools --------------------------------------------------------------------------------------
ensure_tools rsync:rsync socat:socat time:/usr/bin/time jq:jq diffutils:cmp \
    || die "missing tools: rsync socat time jq diffutils (install them, or run as root on Debian)"

log "cargo build --release"
cargo build --release
[[ -x $KT ]] || die "no binary at $KT"
REV=$(source_rev "$ROOT")

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-e2e.XXXXXX")
log "working in $WORK"
SRC_DIR=$WORK/src
SRC=$SRC_DIR/file.bin
mkdir -p "$SRC_DIR"
log "writing ${SIZE_MIB} MiB of pseudo-random data"
head -c "$BYTES" /dev/urandom >"$SRC"
[[ $(stat -c %s "$SRC") == "$BYTES" ]] || die "test file has the wrong size"
# No agent in this benchmark: point KT_AGENT at a socket that does not exist, so a `kt up` or an
# agent someone else runs on this machine can never join in.
export KT_AGENT=$WORK/no-agent.sock

# ---- helpers ------------------------------------------------------------------------------------
json_num() { jq -r ".$2" "$1"; }

verify() { # COPY LABEL
    cmp -s "$SRC" "$1" || die "$2: $1 differs from the source"
}

# Memory priming. On this kind of VM the guest hands free pages back to the host within a second
# or two (virtio-balloon free page reporting), and the first write to such a page costs a host
# fault: writing 1 GiB into the page cache takes 2-4 s on "cold" memory and 0.3-0.4 s on memory
# that was just freed. Every tool here writes 1 GiB of new page cache (the destination, or the
# server's blob files), so without priming the figures measure the balloon, not the tools, and
# whichever runs after a pause looks slow. Before each measured command: read the source once
# (so it is warm for everyone), then write PRIME_MIB of scratch data and delete it, so the command
# starts on warm free memory. This is the same for every tool.
prime() {
    wait_quiet
    cat "$SRC" >/dev/null
    if ((PRIME_MIB > 0)); then
        dd if=/dev/zero of="$WORK/prime.bin" bs=4M count=$((PRIME_MIB / 4)) status=none
        rm -f -- "$WORK/prime.bin"
    fi
}

declare -a PUT_T PUT_RSS PUT_CPU PUT_SRV_RSS PUT_SRV_CPU PUT_OTHER
declare -a GET_T GET_RSS GET_CPU GET_SRV_RSS GET_SRV_CPU GET_OTHER
declare -a RS_T RS_RSS RS_CPU RS_SRV_CPU RS_OTHER
declare -a TCP_T TCP_RSS TCP_CPU TCP_SEND_CPU TCP_OTHER
declare -a TCPB_T TCPB_RSS TCPB_CPU TCPB_SEND_CPU TCPB_OTHER
# The plain TCP baseline: socat with this buffer on both ends. socat's default buffer is 8 KiB,
# which makes it syscall-bound; that pair is an information row.
BIG_BUF=1048576

# ---- kt put / kt get ----------------------------------------------------------------------------
# Blocks are deduplicated and never collected, so every put goes to a fresh server and data dir:
# each run uploads all 1 GiB. The get that follows reads it back from that server.
kt_round() { # RUN
    local run=$1 d=$WORK/kt$1 c0 sent got
    start_server "$d"
    export KT_SERVER=$SERVER_ADDR
    log "run $run/$RUNS: kt server $SERVER_ADDR"

    prime
    reset_hwm "$SERVER_PID"
    c0=$(proc_cpu "$SERVER_PID")
    timed "put$run" "$KT" put e2e/file.bin --src "$SRC" --locale store --json
    PUT_T+=("$ELAPSED") PUT_RSS+=("$RSS_KB") PUT_CPU+=("$CPU_S")
    PUT_SRV_RSS+=("$(proc_hwm_kb "$SERVER_PID")")
    PUT_SRV_CPU+=("$(awk -v a="$c0" -v b="$(proc_cpu "$SERVER_PID")" 'BEGIN { printf "%.2f", b - a }')")
    PUT_OTHER+=("$(other_s "$BUSY_S" "$CPU_S" "${PUT_SRV_CPU[-1]}")")
    sent=$(json_num "$WORK/put$run.out" bytes_transferred)
    [[ $sent == "$BYTES" ]] || die "put $run uploaded $sent bytes, expected $BYTES"
    log "  kt put ${ELAPSED}s, client ${CPU_S} CPU-s, server ${PUT_SRV_CPU[-1]} CPU-s, other ${PUT_OTHER[-1]} CPU-s"

    mkdir -p "$d/get"
    prime
    reset_hwm "$SERVER_PID"
    c0=$(proc_cpu "$SERVER_PID")
    timed "get$run" "$KT" get e2e/file.bin --dest "$d/get/file.bin" --json
    GET_T+=("$ELAPSED") GET_RSS+=("$RSS_KB") GET_CPU+=("$CPU_S")
    GET_SRV_RSS+=("$(proc_hwm_kb "$SERVER_PID")")
    GET_SRV_CPU+=("$(awk -v a="$c0" -v b="$(proc_cpu "$SERVER_PID")" 'BEGIN { printf "%.2f", b - a }')")
    GET_OTHER+=("$(other_s "$BUSY_S" "$CPU_S" "${GET_SRV_CPU[-1]}")")
    got=$(json_num "$WORK/get$run.out" bytes_transferred)
    [[ $got == "$BYTES" ]] || die "get $run transferred $got bytes, expected $BYTES"
    verify "$d/get/file.bin" "kt get $run"
    log "  kt get ${ELAPSED}s, client ${CPU_S} CPU-s, server ${GET_SRV_CPU[-1]} CPU-s, other ${GET_OTHER[-1]} CPU-s"

    stop_server
    rm -rf -- "$d"
}

# ---- rsync daemon pull --------------------------------------------------------------------------
RS_PID=
RS_PORT=
start_rsyncd() {
    RS_PORT=$(free_port)
    cat >"$WORK/rsyncd.conf" <<CONF
address = 127.0.0.1
port = $RS_PORT
pid file = $WORK/rsyncd.pid
log file = $WORK/rsyncd.log
use chroot = no
uid = $(id -un)
gid = $(id -gn)
[bench]
    path = $SRC_DIR
    read only = yes
CONF
    rsync --daemon --no-detach --address 127.0.0.1 --port "$RS_PORT" --config "$WORK/rsyncd.conf" &
    RS_PID=$!
    PIDS+=("$RS_PID")
    wait_listening "$RS_PORT" "$RS_PID"
}
rsync_round() { # RUN
    local run=$1 d=$WORK/rsync$1 c0 c1
    mkdir -p "$d"
    prime
    c0=$(proc_children_cpu "$RS_PID")
    timed "rsync$run" rsync "rsync://127.0.0.1:$RS_PORT/bench/file.bin" "$d/"
    sleep 0.2 # let the daemon reap the process that served us
    c1=$(proc_children_cpu "$RS_PID")
    RS_T+=("$ELAPSED") RS_RSS+=("$RSS_KB") RS_CPU+=("$CPU_S")
    RS_SRV_CPU+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')")
    RS_OTHER+=("$(other_s "$BUSY_S" "$CPU_S" "${RS_SRV_CPU[-1]}")")
    verify "$d/file.bin" "rsync $run"
    log "  rsync ${ELAPSED}s, client ${CPU_S} CPU-s, daemon ${RS_SRV_CPU[-1]} CPU-s, other ${RS_OTHER[-1]} CPU-s"
    rm -rf -- "$d"
}

# ---- plain TCP copy (socat) ---------------------------------------------------------------------
# tcp_round RUN TAG [SOCAT OPTIONS...]: sets ELAPSED, RSS_KB and CPU_S (receiver), SEND_CPU.
SEND_CPU=
tcp_round() {
    local run=$1 tag=$2 d=$WORK/$2$1 port recv t0 t1 b0 b1
    shift 2
    mkdir -p "$d"
    port=$(free_port)
    /usr/bin/time -v -o "$WORK/$tag-recv$run.time" \
        socat "$@" -u "TCP-LISTEN:$port,reuseaddr,bind=127.0.0.1" "OPEN:$d/file.bin,creat,trunc" \
        2>"$WORK/$tag-recv$run.err" &
    recv=$!
    PIDS+=("$recv")
    wait_listening "$port" "$recv"
    prime
    b0=$(busy_ticks)
    t0=$EPOCHREALTIME
    /usr/bin/time -v -o "$WORK/$tag-send$run.time" socat "$@" -u "OPEN:$SRC" "TCP:127.0.0.1:$port" \
        || die "socat sender $tag $run"
    wait "$recv" || die "socat receiver $tag $run"
    t1=$EPOCHREALTIME
    b1=$(busy_ticks)
    forget_pid "$recv"
    ELAPSED=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    read_time_file "$WORK/$tag-send$run.time"
    SEND_CPU=$CPU_S
    read_time_file "$WORK/$tag-recv$run.time"
    OTHER=$(other_s "$(busy_s "$b0" "$b1")" "$CPU_S" "$SEND_CPU")
    verify "$d/file.bin" "socat $tag $run"
    log "  socat $* ${ELAPSED}s, receiver ${CPU_S} CPU-s, sender ${SEND_CPU} CPU-s, other ${OTHER} CPU-s"
    rm -rf -- "$d"
}

# ---- the runs: interleaved, so drift in the machine's load reaches every tool alike -------------
start_rsyncd
for run in $(seq "$RUNS"); do
    kt_round "$run"
    rsync_round "$run"
    tcp_round "$run" tcp
    TCP_T+=("$ELAPSED") TCP_RSS+=("$RSS_KB") TCP_CPU+=("$CPU_S") TCP_SEND_CPU+=("$SEND_CPU") TCP_OTHER+=("$OTHER")
    tcp_round "$run" tcpbig -b "$BIG_BUF"
    TCPB_T+=("$ELAPSED") TCPB_RSS+=("$RSS_KB") TCPB_CPU+=("$CPU_S") TCPB_SEND_CPU+=("$SEND_CPU") TCPB_OTHER+=("$OTHER")
done
kill -TERM "$RS_PID"
wait "$RS_PID" || true
forget_pid "$RS_PID"

# ---- results ------------------------------------------------------------------------------------
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
put_m=$(median "${PUT_T[@]}")
get_m=$(median "${GET_T[@]}")
rs_m=$(median "${RS_T[@]}")
# The plain TCP baseline is the 1 MiB-buffer socat pair; the default-buffer pair is information.
tcp_m=$(median "${TCPB_T[@]}")
tcpdef_m=$(median "${TCP_T[@]}")
mbs() { awk -v b="$BYTES" -v t="$1" 'BEGIN { printf "%.0f", b / 1e6 / t }'; }
get_vs_rs=$(ratio "$get_m" "$rs_m")
get_vs_tcp=$(ratio "$get_m" "$tcp_m")
get_vs_tcpdef=$(ratio "$get_m" "$tcpdef_m")

row() { # NAME SECONDS RSS_TEXT CPU_TEXT RUNS...
    local name=$1 t=$2 rss=$3 cpu=$4
    shift 4
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$t" "$(mbs "$t")" \
        "$(ratio "$t" "$tcp_m")" "$(ratio "$t" "$rs_m")" "$rss" "$cpu" "$(runs_of "$RUNS" "$@")"
}

criterion_table() {
    local dir=$TARGET/criterion
    [[ -d $dir ]] || { echo "_No criterion results under \`${dir#"$ROOT"/}\`: run \`cargo bench --bench hashing\` first._"; return; }
    local when
    when=$(TZ=UTC find "$dir" -path '*/new/estimates.json' -printf '%TY-%Tm-%Td %TH:%TM UTC\n' | sort | tail -1)
    echo "Measured $when by \`cargo bench --bench hashing\` (sample size 10; warm page cache for the file benches)."
    echo "\`std::fs::read\` allocates a fresh 64 MiB buffer on every call and pays its page faults (dear on"
    echo "this VM, see memory priming above); \`scan::hash_file\` reuses one 4 MiB buffer, so it reads and"
    echo "hashes faster than the plain read alone."
    echo
    echo "| benchmark | bytes per iteration | median time | median throughput |"
    echo "|---|---:|---:|---:|"
    local b
    find "$dir" -path '*/new/benchmark.json' | sort | while read -r b; do
        local e=${b%benchmark.json}estimates.json
        [[ -f $e ]] || continue
        jq -r --slurpfile est "$e" '
            (.throughput.Bytes // .throughput.BytesDecimal // 0) as $b
            | ($est[0].median.point_estimate) as $ns
            | "| `\(.full_id)` | \($b) | \($ns / 1e6 * 100 | round / 100) ms | "
              + (if $b > 0 then "\($b / $ns * 1e9 / 1e6 | round) MB/s (\($b / $ns * 1e9 / 1073741824 * 100 | round / 100) GiB/s)" else "-" end)
              + " |"' "$b"
    done
}

# What FILE holds after its micro-benchmarks table: from the first section that follows it.
after_micro_benchmarks() { # FILE
    [[ -f $1 ]] || return 0
    awk 'seen && (/^<!-- bench\// || /^## /) { keep = 1 } keep { print } /^## Micro-benchmarks/ { seen = 1 }' "$1"
}

{
    echo "# Benchmark results"
    echo
    echo "Produced by \`bash bench/e2e.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), source revision $REV,"
    echo "$(nproc) cores, $(uname -sr), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM."
    echo
    echo "Absolute numbers on a shared 2-core machine are noise: every process here (client, server,"
    echo "rsync, socat, the kernel's loopback) competes for the same two cores, and other work on the"
    echo "machine moves them by tens of percent between runs. The ratios, measured in the same run under"
    echo "the same conditions, are what count. Load average (1, 5, 15 min; it counts this benchmark's own"
    echo "processes too) at the start: $LOAD_START; at the end: $LOAD_END."
    echo
    echo "## End to end: one ${SIZE_MIB} MiB pseudo-random file over 127.0.0.1"
    echo
    echo "Median of $RUNS runs each, the tools interleaved run by run. Warm page cache: nothing was"
    echo "dropped from the cache and the source is read once right before every measured command, so"
    echo "every tool reads it from memory; destinations are fresh directories on the same ext4 disk"
    echo "(written into the page cache, not synced). Every copy was checked with \`cmp\` against the source."
    if ((PRIME_MIB > 0)); then
        echo "Memory priming: right before every measured command ${PRIME_MIB} MiB of scratch data was written and"
        echo "deleted. This VM returns free pages to its host within a second or two (virtio-balloon free"
        echo "page reporting) and the first write to such a page is slow: writing 1 GiB into the page cache"
        echo "took 2-4 s on returned memory and 0.3-0.4 s on memory freed just before. Priming puts every"
        echo "tool on the same footing, closer to a machine without a balloon; a command that runs for"
        echo "seconds still meets some returned memory towards its end, so slow tools pay a little extra."
    else
        echo "No memory priming (KT_BENCH_PRIME_MIB=0): each tool's first writes to memory the VM has given"
        echo "back to its host cost it 2-4 s per GiB, so these figures depend on what ran just before."
    fi
    echo "MB/s is 10^6 bytes per second. Ratios are speed ratios,"
    echo "baseline seconds / these seconds: above 1 is faster than the baseline. Peak RSS is the largest"
    echo "over the runs (\`/usr/bin/time -v\` for the CLI processes, \`VmHWM\` of the server reset before"
    echo "each phase). CPU is user+sys seconds, median over the runs. In the last column each run's seconds"
    echo "are followed, in parentheses, by the CPU-seconds the machine spent meanwhile on anything but the"
    echo "measured processes (kernel threads, loopback softirqs, other people's work): a few tenths is the"
    echo "floor; more marks a disturbed run. Before each measured command the harness waited for the"
    echo "machine to be idle for a second (up to ${QUIET_WAIT} s each, ${QUIET_TOTAL} s in all; ${QUIET_SPENT} s were spent waiting)."
    echo
    echo "| operation | median s | MB/s | vs plain TCP | vs rsync | peak RSS | CPU s | runs: s (other CPU-s) |"
    echo "|---|---:|---:|---:|---:|---|---|---|"
    row "\`kt put\` (locale store, fresh server)" "$put_m" \
        "kt $(mib "$(maxof "${PUT_RSS[@]}")") MiB; server $(mib "$(maxof "${PUT_SRV_RSS[@]}")") MiB" \
        "kt $(median "${PUT_CPU[@]}"); server $(median "${PUT_SRV_CPU[@]}")" "${PUT_T[@]}" "${PUT_OTHER[@]}"
    row "\`kt get\` (store → fresh dest)" "$get_m" \
        "kt $(mib "$(maxof "${GET_RSS[@]}")") MiB; server $(mib "$(maxof "${GET_SRV_RSS[@]}")") MiB" \
        "kt $(median "${GET_CPU[@]}"); server $(median "${GET_SRV_CPU[@]}")" "${GET_T[@]}" "${GET_OTHER[@]}"
    row "rsync daemon pull (default options)" "$rs_m" \
        "rsync client $(mib "$(maxof "${RS_RSS[@]}")") MiB" \
        "client $(median "${RS_CPU[@]}"); daemon $(median "${RS_SRV_CPU[@]}")" "${RS_T[@]}" "${RS_OTHER[@]}"
    row "plain TCP copy (socat -b $BIG_BUF)" "$tcp_m" \
        "socat receiver $(mib "$(maxof "${TCPB_RSS[@]}")") MiB" \
        "receiver $(median "${TCPB_CPU[@]}"); sender $(median "${TCPB_SEND_CPU[@]}")" "${TCPB_T[@]}" "${TCPB_OTHER[@]}"
    row "(info) socat, default 8 KiB buffer" "$tcpdef_m" \
        "socat receiver $(mib "$(maxof "${TCP_RSS[@]}")") MiB" \
        "receiver $(median "${TCP_CPU[@]}"); sender $(median "${TCP_SEND_CPU[@]}")" "${TCP_T[@]}" "${TCP_OTHER[@]}"
    echo
    echo "Commands: \`kt server --listen 127.0.0.1:0 --data-dir D\`;"
    echo "\`kt put e2e/file.bin --src F --locale store --json\`; \`kt get e2e/file.bin --dest D/file.bin --json\`"
    echo "(no agent: \`KT_AGENT\` names a socket that does not exist);"
    echo "\`rsync --daemon --no-detach --port P --config rsyncd.conf\` and \`rsync rsync://127.0.0.1:P/bench/file.bin D/\`;"
    echo "\`socat -b $BIG_BUF -u TCP-LISTEN:P,reuseaddr,bind=127.0.0.1 OPEN:D/file.bin,creat,trunc\` receiving and"
    echo "\`socat -b $BIG_BUF -u OPEN:F TCP:127.0.0.1:P\` sending, timed from the sender's start until the receiver exits:"
    echo "this pair is the plain TCP baseline. The last row is for information only and is not a baseline"
    echo "in the ratio columns: the same pair with socat's default 8 KiB buffer, which makes it bound by its"
    echo "own read/write syscalls (about 260,000 of them for the file, on each end) rather than by TCP."
    echo
    echo "### Targets (issue)"
    echo
    echo "- \`kt get\` at least 2x faster than rsync (target set for 1 GiB; measured with ${SIZE_MIB} MiB): ${get_vs_rs}x — $(verdict "$get_vs_rs" 2)."
    echo "- \`kt get\` at least 0.7x the speed of the plain TCP copy (socat with a $BIG_BUF-byte buffer, same file): ${get_vs_tcp}x — $(verdict "$get_vs_tcp" 0.7)."
    echo "  Against socat with its default 8 KiB buffer (information only) the ratio is ${get_vs_tcpdef}x."
    echo
    echo "## Micro-benchmarks"
    echo
    criterion_table
    # Every section after this one, as the other bench scripts and the notes by hand last wrote
    # them (keeping only the marked ones lost the unmarked: a rerun here dropped 330 lines).
    blocks=$(after_micro_benchmarks "$RESULTS")
    if [[ -n $blocks ]]; then
        echo
        printf '%s\n' "$blocks"
    fi
} >"$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
log "wrote $RESULTS"
cat "$RESULTS"
