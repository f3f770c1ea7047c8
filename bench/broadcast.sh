#!/usr/bin/env bash
# Broadcast benchmark: one pseudo-random file (default 256 MiB) from the store server to N node
# agents (default N = 4, 8, 16, 32), every node in its own network namespace whose uplink tc
# limits (default 50 MB/s), three ways in one run:
#   herd      every getter at once, all from the store (fanout above N): the thundering herd;
#   saf       a store-and-forward tree, as rsync-based trees do: rounds in which every node that
#             holds the whole file serves one new node, each round waiting for the whole file;
#   pipelined every getter at once in one broadcast window with an explicit fanout: each joins at
#             once under a parent that is still receiving, and takes block k from it as soon as
#             the parent verified it;
#   swarm     every getter at once with no flags at all (what a user gets): each block from any
#             member that holds it, the store asked only for what no member has.
# The first three are switches of this benchmark (window flags), not what a user is expected to pick.
# and, as the yardstick, one single point-to-point transfer (one getter alone, from the store).
# Writes its section of bench/RESULTS.md with the command that produced it.
#
#   bash bench/broadcast.sh
#
# Environment (all optional):
#   KT_BENCH_NODES    the values of N (default "4 8 16 32")
#   KT_BENCH_MIB      file size in MiB (default 256)
#   KT_BENCH_MBIT     uplink of every namespace in Mbit/s (default 400 = 50 MB/s)
#   KT_BENCH_BLOCK    block size in bytes (default 1048576: the pipeline's latency per level is
#                     one block's time on a link)
#   KT_BENCH_FANOUT   fanout of the pipelined tree (default 1: with egress-limited links a chain
#                     gives every node the full link rate; 2 halves it at every parent)
#   KT_BENCH_WAYS     which ways to run (default "herd saf pipelined swarm")
#   KT_BENCH_HERD_MAX the largest N the herd runs at (default 8: it grows linearly, N transfers)
#   KT_BENCH_RESULTS  where to write (default bench/RESULTS.md)
#   KT_BENCH_SECTION  name of this run's section in it (default broadcast; a run with other settings
#                     can keep its own section beside the default one, e.g. broadcast-slow-links)
#   KT_BENCH_QUIET_WAIT / KT_BENCH_QUIET_TOTAL  see bench/lib.sh
#   KT_BENCH_PIECES   "blocks": the store server's swarms trade whole blocks only, never pieces
#                     smaller than blocks (a switch of this benchmark, to measure what they give)
#   KT_BENCH_GET_LOG  RUST_LOG of every `kt get` (e.g. ktfs=debug), and KT_BENCH_KEEP_LOGS a
#                     directory where each way's getters' stderr and end times are kept (WAY-N/):
#                     a timeline of where a broadcast's time goes
#
# Needs root (network namespaces, tc). Addresses exist only inside the namespaces it creates;
# everything it starts and creates is removed on exit, failure and Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
NODES=${KT_BENCH_NODES:-4 8 16 32}
SIZE_MIB=${KT_BENCH_MIB:-256}
LINK_MBIT=${KT_BENCH_MBIT:-400}
BLOCK=${KT_BENCH_BLOCK:-1048576}
FANOUT=${KT_BENCH_FANOUT:-1}
WAYS=${KT_BENCH_WAYS:-herd saf pipelined swarm}
HERD_MAX=${KT_BENCH_HERD_MAX:-8}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=$TARGET/release/kt
LOG_TAG=broadcast
PRIME_MIB_DEFAULT=0
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
# shellcheck source=bench/netns.sh
source "$ROOT/bench/netns.sh"
# The herd, store-and-forward and pipelined ways name a fanout to pick the tree; users who name
# one get the swarm (fanout as each member's uploads), so the store server is started with the
# benchmarks' switch that keeps the tree for them. The swarm way names none.
export KT_BENCH_TOPOLOGY=tree
cleanup_all() {
    netns_cleanup
    cleanup
}
trap cleanup_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ $(id -u) == 0 ]] || die "needs root (network namespaces and tc)"
ensure_tools iproute2:tc jq:jq diffutils:cmp time:/usr/bin/time || die "missing tools: iproute2 jq diffutils time"
log "cargo build --release"
cargo build --release
[[ -x $KT ]] || die "no binary at $KT"
REV=$(source_rev "$ROOT")
T_START=$SECONDS
WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-broadcast.XXXXXX")
log "working in $WORK"
MAXN=$(printf '%s\n' $NODES | sort -n | tail -1)

netns_bridge
netns_store "$WORK/store"
for i in $(seq "$MAXN"); do netns_agent "$i" "$WORK"; done
netns_wait_agents "$WORK" "$MAXN"
log "store and $MAXN agents up, uplinks ${LINK_MBIT} Mbit/s"

KEYNO=0
# A fresh key with fresh content, so that no node holds any of it yet.
publish() {
    KEYNO=$((KEYNO + 1))
    KEY=bench/f$KEYNO
    SRC=$WORK/src.bin
    head -c "$((SIZE_MIB << 20))" /dev/urandom >"$SRC"
    in_ns store env KT_SERVER="$STORE_ADDR" "$KT" put "$KEY" --src "$SRC" --block-size "$BLOCK" >/dev/null \
        || die "put $KEY"
}

# Runs `kt get KEY` on the given nodes at once; per node, seconds from the common start to its end
# go to WORK/ends. Extra get flags follow `--`.
wave() { # NODE... -- FLAGS...
    local nodes=() flags=() i
    while (($#)); do
        [[ $1 == -- ]] && { shift; flags=("$@"); break; }
        nodes+=("$1")
        shift
    done
    local t0=$EPOCHREALTIME pids=()
    for i in "${nodes[@]}"; do
        rm -rf "$WORK/dest/n$i"
        mkdir -p "$WORK/dest/n$i"
        (
            in_ns "n$i" env KT_SERVER="$STORE_ADDR" KT_AGENT="$WORK/n$i/agent.sock" \
                ${KT_BENCH_GET_LOG:+RUST_LOG=$KT_BENCH_GET_LOG} \
                /usr/bin/time -v -o "$WORK/get-n$i.time" \
                "$KT" get "$KEY" -d "$WORK/dest/n$i/f" --json "${flags[@]}" \
                >"$WORK/get-n$i.json" 2>"$WORK/get-n$i.err"
            echo "$i $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }') $?" >>"$WORK/ends"
        ) &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    for i in "${nodes[@]}"; do
        [[ -s $WORK/get-n$i.json ]] || { cat "$WORK/get-n$i.err" >&2; die "get on n$i failed"; }
    done
}

# Checks every copy, tallies bytes by source and peak memory, and clears the copies.
settle() { # NODE...
    local i
    for i in "$@"; do
        cmp -s "$SRC" "$WORK/dest/n$i/f" || die "n$i: the copy differs from the source"
        jq -r '.sources[] | "\(.source) \(.bytes)"' "$WORK/get-n$i.json" >>"$WORK/served"
        read_time_file "$WORK/get-n$i.time"
        ((RSS_KB > CLI_RSS)) && CLI_RSS=$RSS_KB
        rm -rf "$WORK/dest/n$i"
    done
}

agents_hwm() {
    local m=0 pid v
    for pid in "${AGENT_PIDS[@]}"; do
        v=$(proc_hwm_kb "$pid")
        ((v > m)) && m=$v
    done
    echo "$m"
}

# One way for N nodes; sets TOTAL (s until every node has the file), STORE_MIB, CPU (machine busy s).
run_way() { # WAY N
    local way=$1 n=$2 holders rest round k i
    publish
    wait_quiet
    : >"$WORK/ends"
    : >"$WORK/served"
    CLI_RSS=0
    for pid in "${AGENT_PIDS[@]}"; do reset_hwm "$pid"; done
    local b0 t0
    b0=$(busy_ticks)
    t0=$EPOCHREALTIME
    case $way in
        single)
            wave 1 -- --fanout 1
            ;;
        herd)
            wave $(seq "$n") -- --group-id "herd-$KEYNO" --fanout $((n + 1))
            ;;
        saf)
            # Round r: as many new nodes as there are holders (the store and every finished node),
            # each given its own holder (fanout 1 over the version's sources), all waiting for the
            # whole file before the next round starts.
            holders=1
            rest=$n
            i=1
            round=0
            while ((rest > 0)); do
                k=$((holders < rest ? holders : rest))
                wave $(seq "$i" $((i + k - 1))) -- --fanout 1
                i=$((i + k))
                rest=$((rest - k))
                holders=$((holders + k))
                round=$((round + 1))
            done
            ;;
        pipelined)
            wave $(seq "$n") -- --group-id "pipe-$KEYNO" --fanout "$FANOUT"
            ;;
        swarm)
            wave $(seq "$n") --
            ;;
    esac
    TOTAL=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
    CPU=$(busy_s "$b0" "$(busy_ticks)")
    if [[ -n ${KT_BENCH_KEEP_LOGS:-} ]]; then
        local kept=$KT_BENCH_KEEP_LOGS/$way-$n
        mkdir -p "$kept"
        cp "$WORK"/get-n*.err "$WORK/ends" "$kept/"
        # The wall clock of the common start, to set the getters' log lines against.
        date -u -d "@$t0" '+%Y-%m-%dT%H:%M:%S.%6NZ' >"$kept/start"
        rm -f "$WORK"/get-n*.err
    fi
    settle $( [[ $way == single ]] && echo 1 || seq "$n")
    STORE_MIB=$(awk '$1 == "store" { s += $2 } END { printf "%.0f", s / 1048576 }' "$WORK/served")
    AGENT_RSS=$(agents_hwm)
    log "  $way N=$n: ${TOTAL}s, store sent ${STORE_MIB} MiB, machine CPU ${CPU}s, agent peak $(mib "$AGENT_RSS") MiB, get peak $(mib "$CLI_RSS") MiB"
}

declare -A T S C AR GR
log "single point-to-point transfer"
run_way single 1
SINGLE=$TOTAL
SINGLE_CPU=$CPU
for n in $NODES; do
    for way in $WAYS; do
        [[ $way == herd ]] && ((n > HERD_MAX)) && continue
        log "$way, N=$n"
        run_way "$way" "$n"
        T[$way,$n]=$TOTAL
        S[$way,$n]=$STORE_MIB
        C[$way,$n]=$CPU
        AR[$way,$n]=$AGENT_RSS
        GR[$way,$n]=$CLI_RSS
    done
done
log "single again (drift check)"
run_way single 1
SINGLE2=$TOTAL

# ---- results ------------------------------------------------------------------------------------
# The plot: completion time (x single) against N, one line per way, as a small SVG.
SVG=$(dirname "$RESULTS")/${KT_BENCH_SECTION:-broadcast}.svg
for n in $NODES; do
    for way in $WAYS; do
        [[ -n ${T[$way,$n]:-} ]] || continue
        echo "$way $n $(awk -v t="${T[$way,$n]}" -v s="$SINGLE" 'BEGIN { printf "%.3f", t / s }')"
    done
done | awk -v ns="$NODES" '
    { w[$1] = 1; y[$1, $2] = $3; if ($3 > ymax) ymax = $3; order[$1] = ++k }
    END {
        W = 560; H = 360; L = 60; R = 120; T = 20; B = 50
        split(ns, N, " "); nn = length(N)
        ytop = (ymax < 2) ? 2 : int(ymax + 0.999)
        col["herd"] = "#c0392b"; col["saf"] = "#e67e22"; col["pipelined"] = "#2471a3"; col["swarm"] = "#27ae60"
        printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
        printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
        for (i = 0; i <= 4; i++) {
            v = ytop * i / 4; yy = H - B - (H - T - B) * i / 4
            printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, yy, W - R, yy
            printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1fx</text>\n", L - 6, yy + 4, v
        }
        ty = H - B - (H - T - B) * 1.3 / ytop
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#27ae60\" stroke-dasharray=\"4 3\"/>\n", L, ty, W - R, ty
        printf "<text x=\"%d\" y=\"%.1f\" fill=\"#27ae60\">target 1.3x</text>\n", W - R + 10, ty + 4
        for (i = 1; i <= nn; i++) {
            xx = L + (W - L - R) * (nn == 1 ? 0.5 : (i - 1) / (nn - 1))
            x[N[i]] = xx
            printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", xx, H - B + 18, N[i]
        }
        printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">N (nodes)</text>\n", (L + W - R) / 2, H - 10
        printf "<text x=\"14\" y=\"%d\" transform=\"rotate(-90 14 %d)\" text-anchor=\"middle\">time until all have it / one transfer</text>\n", (T + H - B) / 2, (T + H - B) / 2
        ly = T + 10
        for (way in w) {
            pts = ""
            for (i = 1; i <= nn; i++) {
                if ((way, N[i]) in y) pts = pts sprintf("%.1f,%.1f ", x[N[i]], H - B - (H - T - B) * y[way, N[i]] / ytop)
            }
            printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", col[way], pts
            printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", W - R + 10, ly, col[way], way
            ly += 16
        }
        print "</svg>"
    }' >"$SVG"

SECTION=${KT_BENCH_SECTION:-broadcast}
BEGIN_MARK="<!-- bench/$SECTION.sh: begin -->"
END_MARK="<!-- bench/$SECTION.sh: end -->"
xof() { awk -v t="$1" -v s="$SINGLE" 'BEGIN { printf "%.2f", t / s }'; }
bar() { awk -v t="$1" -v s="$SINGLE" 'BEGIN { n = int(t / s * 4 + 0.5); if (n > 60) n = 60; b = ""; for (i = 0; i < n; i++) b = b "#"; print b }'; }
{
    echo "$BEGIN_MARK"
    echo "## Broadcast: one ${SIZE_MIB} MiB file to N nodes over ${LINK_MBIT} Mbit/s uplinks"
    echo
    echo "Produced by \`KT_BENCH_NODES=\"$NODES\" KT_BENCH_MIB=$SIZE_MIB KT_BENCH_MBIT=$LINK_MBIT KT_BENCH_BLOCK=$BLOCK KT_BENCH_FANOUT=$FANOUT"
    echo "KT_BENCH_WAYS=\"$WAYS\" KT_BENCH_SECTION=$SECTION${KT_BENCH_PIECES:+ KT_BENCH_PIECES=$KT_BENCH_PIECES} bash bench/broadcast.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, source revision $REV, $(nproc) cores."
    echo "Every node (the store server and each agent with its \`kt get\`) runs in its own network namespace"
    echo "on one bridge; tc (tbf) limits each namespace's egress to ${LINK_MBIT} Mbit/s. Times are until every node"
    echo "has a verified copy (all copies checked with \`cmp\`), from one start. \`x single\` is that time over one"
    echo "point-to-point transfer of the same file alone (${SINGLE} s at the start of the run, ${SINGLE2} s at its end)."
    echo "Store MiB: what the store server sent. Machine CPU: CPU-seconds the whole machine was busy during"
    echo "the way (2 cores: a way that needs more than 2 x its seconds is bound by CPU, not by the links)."
    echo "Peak RSS: the largest agent (VmHWM, reset before each way) and the largest \`kt get\`."
    echo
    echo "| N | way | seconds | x single | store MiB | machine CPU s | agent peak RSS MiB | get peak RSS MiB |"
    echo "|---|---|---|---|---|---|---|---|"
    for n in $NODES; do
        for way in $WAYS; do
            [[ -n ${T[$way,$n]:-} ]] || continue
            echo "| $n | $way | ${T[$way,$n]} | $(xof "${T[$way,$n]}") | ${S[$way,$n]} | ${C[$way,$n]} | $(mib "${AR[$way,$n]}") | $(mib "${GR[$way,$n]}") |"
        done
    done
    echo
    echo "Completion time vs N, in units of one single transfer ([plot]($(basename "$SVG")); below, each # is a quarter):"
    echo
    echo '```'
    for way in $WAYS; do
        for n in $NODES; do
            [[ -n ${T[$way,$n]:-} ]] || continue
            printf '%-10s N=%-3s %6sx %s\n' "$way" "$n" "$(xof "${T[$way,$n]}")" "$(bar "${T[$way,$n]}")"
        done
    done
    echo '```'
    echo
    last=$(printf '%s\n' $NODES | sort -n | tail -1)
    if ((HERD_MAX < last)) && [[ $WAYS == *herd* ]]; then
        echo "The herd runs up to N = $HERD_MAX only: every getter's parent is the store, so it takes about N transfers."
    fi
    if [[ -n ${T[swarm,$last]:-} ]]; then
        r=$(xof "${T[swarm,$last]}")
        echo "Target (issue): with default flags, every node done within 1.2x of one single transfer at N = $last: ${r}x — $(awk -v r="$r" 'BEGIN { if (r <= 1.2) print "**met**"; else print "**NOT met**" }'); the store sent ${S[swarm,$last]} MiB of ${SIZE_MIB}."
    fi
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS ($((SECONDS - T_START)) s)"
cat "$WORK/section.md"
