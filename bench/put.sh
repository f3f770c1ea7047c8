#!/usr/bin/env bash
# A put of one large file to a fresh store server, against the disk's durable baselines in the
# same run: `rsync --fsync` of the file to a local directory and `dd conv=fdatasync` of it (the
# disk's synced-write floor), and optionally an earlier build of `kt` (A B A B). The store
# answers a put only once its blocks are durable, so these are the fair floors. Each command
# runs RUNS times, interleaved; medians are reported with the client's peak RSS. Writes its
# section of bench/RESULTS.md.
#
#   bash bench/put.sh NEW_KT [BASELINE_KT]
#
# Environment (optional): KT_BENCH_MIB (default 512), KT_BENCH_RUNS (default 5),
# KT_BENCH_RESULTS (default bench/RESULTS.md), KT_BENCH_TMP (parent of the temporary directory;
# it must be on the disk being measured, not tmpfs).
set -Eeuo pipefail
NEW=$(realpath "${1:?usage: bench/put.sh NEW_KT [BASELINE_KT]}")
BASE=${2:+$(realpath "$2")}
MIB=${KT_BENCH_MIB:-512}
RUNS=${KT_BENCH_RUNS:-5}
RESULTS=${KT_BENCH_RESULTS:-bench/RESULTS.md}
LOG_TAG=put
KT_BENCH_QUIET_WAIT=0
KT_BENCH_PRIME_MIB=0
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-put.XXXX")
PIDS=()
install_cleanup
ensure_tools rsync:rsync time:/usr/bin/time || die "missing tools: rsync time"
unset KT_NAMESPACE KT_SERVER KT_TOKEN
export KT_INDEX_DIR="$WORK/index" RUST_LOG=warn

SRC="$WORK/src.bin"
head -c $((MIB << 20)) /dev/urandom >"$SRC"
log "$MIB MiB of random bytes in $SRC; $RUNS runs"

# One put to a fresh server: sets ELAPSED, RSS_KB, CPU_S (the client's).
kt_put() { # KT TAG
    local kt=$1 tag=$2
    rm -rf "$WORK/store" "$WORK/index"
    KT=$kt start_server "$WORK/store" 127.0.0.117:0
    timed "$tag" env KT_SERVER="$SERVER_ADDR" "$kt" put big --src "$SRC" --json
    grep -q '"bytes_transferred":'"$((MIB << 20))" "$WORK/$tag.out" \
        || die "$tag sent other than the file: $(cat "$WORK/$tag.out")"
    stop_server
}

declare -A T R
add() { T[$1]+="$ELAPSED "; R[$1]+="$RSS_KB "; }
for ((i = 1; i <= RUNS; i++)); do
    kt_put "$NEW" new; add new
    if [[ -n $BASE ]]; then kt_put "$BASE" base; add base; fi
    rm -rf "$WORK/rsync"; mkdir "$WORK/rsync"
    timed rsync rsync --fsync "$SRC" "$WORK/rsync/"; add rsync
    timed dd dd if="$SRC" of="$WORK/dd.bin" bs=4M conv=fdatasync status=none; add dd
    rm -f "$WORK/dd.bin"
    log "run $i: new ${ELAPSED}s (dd), medians so far: new $(median ${T[new]}) rsync $(median ${T[rsync]})"
done

row() { # NAME KEY
    local t
    t=$(median ${T[$2]})
    printf '| %s | %s | %s | %s | %s |\n' "$1" "$t" "$(ratio "$t" "$(median ${T[rsync]})")" \
        "$(ratio "$t" "$(median ${T[dd]})")" "$(mib "$(maxof ${R[$2]})")"
}
BEGIN_MARK='<!-- bench/put.sh: begin -->'
END_MARK='<!-- bench/put.sh: end -->'
{
    echo "$BEGIN_MARK"
    echo "## A put of one large file (issue 45)"
    echo
    echo "Produced by \`bash bench/put.sh NEW_KT${BASE:+ BASELINE_KT}\` on $(date -u '+%Y-%m-%d %H:%M') UTC, source $(source_rev .),"
    echo "$MIB MiB of random bytes, $RUNS runs each, interleaved; medians. A fresh store server on loopback for"
    echo "every put (its blocks synced before it answers). Speed relative to a baseline is its time"
    echo "over this one's (above 1: faster than it). Peak RSS is the client's."
    echo
    echo "| command | median s | vs \`rsync --fsync\` | vs \`dd conv=fdatasync\` | peak RSS MiB |"
    echo "|---|---|---|---|---|"
    row "\`kt put\` (this build)" new
    [[ -n $BASE ]] && row "\`kt put\` (baseline build)" base
    row "\`rsync --fsync\` to a local directory" rsync
    row "\`dd conv=fdatasync\`" dd
    echo
    echo "Runs (s): new ${T[new]}${BASE:+; baseline ${T[base]}}; rsync ${T[rsync]}; dd ${T[dd]}."
    echo "$END_MARK"
} >"$WORK/section.md"
cat "$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
