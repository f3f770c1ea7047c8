#!/usr/bin/env bash
# Insertions and deltas: a 100 MB pseudo-random file, put, then a one-line insertion in its
# middle, put again; the second put against `rsync --stats` of the same change to
# an rsync daemon on loopback, in the same run, on the same files (warm page cache both ways).
# Then the other way: a getter holding the first version (`kt get` of it earlier) takes the
# second with `kt get -f` (its blocks from the old copy, the changed one as a delta), against
# `rsync --stats` pulling the second version from the daemon onto a copy of the first.
#
# kt's bytes are counted both ways by a relay in front of the store server, so they are all
# the bytes on the wire: gRPC (manifests, the questions of which blocks the store lacks) and
# the data plane (signatures, deltas, whole blocks); the put's own `bytes_transferred` (payload
# only) is shown beside them. rsync's are its `--stats` "Total bytes sent" + "received". Each
# run uses fresh random bytes, so nothing from an earlier run is shared. Times are wall-clock
# times of the second put / the second rsync, with the client's peak RSS.
# Writes its section of bench/RESULTS.md with the command that produced it.
#
#   bash bench/delta.sh
#
# Environment (all optional):
#   KT_BENCH_RUNS     runs (default 3; the table shows each, the summary their medians)
#   KT_BENCH_BYTES    file size in bytes (default 100000000)
#   KT                the kt binary (default: a release build, built first)
#   KT_BENCH_IP       loopback address for the kt server, the relay and rsync (default 127.0.0.52)
#   KT_BENCH_RESULTS  where to write (default bench/RESULTS.md)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${KT_BENCH_RUNS:-3}
BYTES=${KT_BENCH_BYTES:-100000000}
IP=${KT_BENCH_IP:-127.0.0.52}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
LOG_TAG=delta
PRIME_MIB_DEFAULT=0
WORK=$(mktemp -d /tmp/kt-delta.XXXX)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup

ensure_tools rsync:rsync python3:python3 time:/usr/bin/time iproute2:ss \
    || die "missing tools: rsync python3 time iproute2"
CMD="bash bench/delta.sh"
[[ -n ${KT:-} ]] && CMD="KT=target/$(basename "$(dirname "$KT")")/kt $CMD"
((RUNS != 3)) && CMD="KT_BENCH_RUNS=$RUNS $CMD"
if [[ -z ${KT:-} ]]; then
    KT=$TARGET/release/kt
    log "cargo build --release"
    cargo build --release
fi
[[ -x $KT ]] || die "no kt binary at $KT"
# What the table says of the binary: the profile directory it was built in (a debug build has
# ktfs at opt-level 1 and its dependencies at opt-level 3).
BUILD=$(basename "$(dirname "$KT")")

start_server "$WORK/kt" "$IP:0"
start_counting_relay "$IP" "$SERVER_ADDR"
start_rsync_daemon "$IP"


export KT_SERVER=$RELAY
ROWS=()
KT_TOTAL=() RS_TOTAL=() KT_T=() RS_T=()
GROWS=() KG_TOTAL=() RG_TOTAL=() KG_T=() RG_T=()
for run in $(seq "$RUNS"); do
    src=$WORK/src/big.bin
    mkdir -p "$WORK/src"
    head -c "$BYTES" /dev/urandom >"$src"
    "$KT" put "big$run" --src "$src" >/dev/null
    rsync -a "$src" "$DST"
    # The getter's older copy (kt's and rsync's each their own): the first version.
    "$KT" get "big$run" --dest "$WORK/got$run" >/dev/null
    cp -p "$WORK/got$run" "$WORK/pulled$run"
    # The edit: one line in the middle, a new mtime.
    half=$((BYTES / 2))
    { head -c "$half" "$src"; echo "a line inserted in the middle, run $run"; tail -c +$((half + 1)) "$src"; } \
        >"$WORK/src/edited"
    mv "$WORK/src/edited" "$src"
    cat "$src" >/dev/null
    read -r up0 down0 < <(relay_bytes)
    timed "kt$run" "$KT" put "big$run" --src "$src" --json
    read -r up1 down1 < <(relay_bytes)
    kt_up=$((up1 - up0)) kt_down=$((down1 - down0))
    payload=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_transferred"])' "$WORK/kt$run.out")
    ROWS+=("| $run | kt put | $kt_up | $kt_down | $((kt_up + kt_down)) (payload $payload) | $ELAPSED | $(mib "$RSS_KB") |")
    KT_TOTAL+=($((kt_up + kt_down))) KT_T+=("$ELAPSED")
    timed "rsync$run" rsync -a --stats "$src" "$DST"
    sent=$(awk -F': ' '/^Total bytes sent/ { gsub(/,/, "", $2); print $2 }' "$WORK/rsync$run.out")
    recv=$(awk -F': ' '/^Total bytes received/ { gsub(/,/, "", $2); print $2 }' "$WORK/rsync$run.out")
    ROWS+=("| $run | rsync --stats | $sent | $recv | $((sent + recv)) | $ELAPSED | $(mib "$RSS_KB") |")
    RS_TOTAL+=($((sent + recv))) RS_T+=("$ELAPSED")
    log "run $run: kt $((kt_up + kt_down)) B in ${KT_T[-1]} s; rsync $((sent + recv)) B in $ELAPSED s"
    cmp -s "$src" "$WORK/rsync-dst/big.bin" || die "rsync's copy differs"
    # The getter's side: the second version onto its copy of the first.
    read -r up0 down0 < <(relay_bytes)
    timed "ktget$run" "$KT" get "big$run" --dest "$WORK/got$run" -f --json
    read -r up1 down1 < <(relay_bytes)
    kt_up=$((up1 - up0)) kt_down=$((down1 - down0))
    cmp -s "$src" "$WORK/got$run" || die "kt's copy differs"
    payload=$(python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); print(r["bytes_transferred"], r["bytes_reused"], r["delta_blocks"])' "$WORK/ktget$run.out")
    read -r payload reused deltas <<<"$payload"
    GROWS+=("| $run | kt get -f | $kt_up | $kt_down | $((kt_up + kt_down)) (payload $payload; $reused B from the old copy, $deltas deltas) | $ELAPSED | $(mib "$RSS_KB") |")
    KG_TOTAL+=($((kt_up + kt_down))) KG_T+=("$ELAPSED")
    timed "rsyncget$run" rsync -a --stats "${DST}big.bin" "$WORK/pulled$run"
    cmp -s "$src" "$WORK/pulled$run" || die "rsync's pulled copy differs"
    sent=$(awk -F': ' '/^Total bytes sent/ { gsub(/,/, "", $2); print $2 }' "$WORK/rsyncget$run.out")
    recv=$(awk -F': ' '/^Total bytes received/ { gsub(/,/, "", $2); print $2 }' "$WORK/rsyncget$run.out")
    GROWS+=("| $run | rsync --stats (pull) | $sent | $recv | $((sent + recv)) | $ELAPSED | $(mib "$RSS_KB") |")
    RG_TOTAL+=($((sent + recv))) RG_T+=("$ELAPSED")
    log "run $run, get: kt $((kt_up + kt_down)) B in ${KG_T[-1]} s; rsync $((sent + recv)) B in $ELAPSED s"
    rm -f "$WORK/got$run" "$WORK/pulled$run"
done

kt_b=$(median "${KT_TOTAL[@]}") rs_b=$(median "${RS_TOTAL[@]}")
kt_t=$(median "${KT_T[@]}") rs_t=$(median "${RS_T[@]}")
bytes_ratio=$(awk -v a="$kt_b" -v b="$rs_b" 'BEGIN { printf "%.2f", a / b }')
time_ratio=$(awk -v a="$kt_t" -v b="$rs_t" 'BEGIN { printf "%.2f", a / b }')
bytes_ok=$(awk -v r="$bytes_ratio" 'BEGIN { print (r <= 1.2) ? "**met**" : "**NOT met**" }')
time_ok=$(awk -v r="$time_ratio" 'BEGIN { print (r <= 1.0) ? "**met**" : "**NOT met**" }')
kg_b=$(median "${KG_TOTAL[@]}") rg_b=$(median "${RG_TOTAL[@]}")
kg_t=$(median "${KG_T[@]}") rg_t=$(median "${RG_T[@]}")
gbytes_ratio=$(awk -v a="$kg_b" -v b="$rg_b" 'BEGIN { printf "%.2f", a / b }')
gtime_ratio=$(awk -v a="$kg_t" -v b="$rg_t" 'BEGIN { printf "%.2f", a / b }')

BEGIN_MARK="<!-- bench/delta.sh: begin -->"
END_MARK="<!-- bench/delta.sh: end -->"
{
    echo "$BEGIN_MARK"
    echo "## A one-line insertion in the middle of a $((BYTES / 1000000)) MB file: the next put vs rsync"
    echo
    echo "\`$CMD\` ($RUNS runs; kt at $(source_rev "$ROOT"), a $BUILD build of kt;"
    echo "$(rsync --version | head -1 | awk '{ print $1, $2, $3 }'); $(nproc) cores; $(date -u +%F)). Bytes: kt's all"
    echo "bytes on the wire both ways (gRPC and data plane, counted by a relay in front of the store"
    echo "server; the put's payload in brackets), rsync's \`--stats\` sent + received; time: the second"
    echo "put / rsync, wall clock, kt's through the relay; RSS: the client's peak. kt's bytes down are"
    echo "mostly the store's signatures of the one or two changed blocks (12 bytes per 2 KiB of block)."
    echo
    echo "| run | tool | bytes up | bytes down | total bytes | time s | peak RSS MiB |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Medians: kt $kt_b bytes in $kt_t s, rsync $rs_b bytes in $rs_t s."
    echo
    echo "### The getter's side: \`kt get -f\` onto the first version vs \`rsync\` pulling onto it"
    echo
    echo "The same files: the getter held the first version, and takes the second. kt's bytes as"
    echo "above (the relay); rsync's \`--stats\` of the pull."
    echo
    echo "| run | tool | bytes up | bytes down | total bytes | time s | peak RSS MiB |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    printf '%s\n' "${GROWS[@]}"
    echo
    echo "Medians: kt $kg_b bytes in $kg_t s, rsync $rg_b bytes in $rg_t s: ${gbytes_ratio}x the bytes, ${gtime_ratio}x the time."
    echo
    echo "### Targets (issue)"
    echo
    echo "- bytes both ways at most 1.2x rsync's: ${bytes_ratio}x — $bytes_ok."
    echo "- time at most rsync's: ${time_ratio}x — $time_ok."
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS"
