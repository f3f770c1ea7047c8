#!/usr/bin/env bash
# Code sync: a source tree of ~6,000 files (~79 MiB, sizes spread as in a source checkout) put
# with `kt put`, then put again unchanged, then again after a one-line edit of one file; each
# step against `rsync -a --stats` of the same tree to an rsync daemon on loopback, in the same
# run, on the same files (warm page cache both ways). The tree's mtimes are an hour old, as a
# checkout's are (a file changed within two seconds of kt's index is hashed again).
#
# kt's bytes are counted both ways by a relay in front of the store server (gRPC, manifests and
# patches, the data plane); rsync's are its `--stats` sent + received. Times are wall clock,
# with the client's peak RSS. Writes its section of bench/RESULTS.md with its command.
#
#   bash bench/sync.sh
#
# Environment (all optional):
#   KT_BENCH_RUNS     runs (default 3)
#   KT_BENCH_FILES    files in the tree (default 6000)
#   KT                the kt binary (default: a release build, built first)
#   KT_BENCH_IP       loopback address (default 127.0.0.76)
#   KT_BENCH_RESULTS  where to write (default bench/RESULTS.md)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${KT_BENCH_RUNS:-3}
FILES=${KT_BENCH_FILES:-6000}
IP=${KT_BENCH_IP:-127.0.0.76}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
LOG_TAG=sync
PRIME_MIB_DEFAULT=0
WORK=$(mktemp -d /tmp/kt-sync.XXXX)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup

ensure_tools rsync:rsync python3:python3 time:/usr/bin/time iproute2:ss \
    || die "missing tools: rsync python3 time iproute2"
CMD="bash bench/sync.sh"
[[ -n ${KT:-} ]] && CMD="KT=target/$(basename "$(dirname "$KT")")/kt $CMD"
((RUNS != 3)) && CMD="KT_BENCH_RUNS=$RUNS $CMD"
if [[ -z ${KT:-} ]]; then
    KT=$TARGET/release/kt
    log "cargo build --release"
    cargo build --release
fi
[[ -x $KT ]] || die "no kt binary at $KT"
BUILD=$(basename "$(dirname "$KT")")

start_server "$WORK/kt" "$IP:0"
start_counting_relay "$IP" "$SERVER_ADDR"
start_rsync_daemon "$IP"
export KT_SERVER=$RELAY KT_INDEX_DIR=$WORK/index

# The tree: FILES text files in nested directories, sizes log-normal around 13 KiB.
make_tree() { # DIR SEED
    python3 - "$1" "$FILES" "$2" <<'EOF'
import os, random, sys
root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
words = [("".join(r.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(r.randint(2, 10)))) for _ in range(4000)]
dirs = [""]
for i in range(n // 20):
    dirs.append(os.path.join(r.choice(dirs), f"pkg{i}"))
for i in range(n):
    d = os.path.join(root, r.choice(dirs))
    os.makedirs(d, exist_ok=True)
    size = min(int(r.lognormvariate(8.8, 1.1)), 2 << 20)
    out, have = [], 0
    while have < size:
        line = " ".join(r.choice(words) for _ in range(r.randint(3, 12))) + "\n"
        out.append(line)
        have += len(line)
    with open(os.path.join(d, f"mod{i}.py"), "w") as f:
        f.write("".join(out))
EOF
    find "$1" -exec touch -h -d '1 hour ago' {} +
}

ROWS=()
declare -A T B
for run in $(seq "$RUNS"); do
    src=$WORK/src$run
    make_tree "$src" "$run"
    cat $(find "$src" -type f) >/dev/null
    mkdir -p "$WORK/rsync-dst/code$run"
    edit=$(find "$src" -name 'mod*.py' | sort | sed -n "$((FILES / 2))p")
    for step in first unchanged edited; do
        if [[ $step == edited ]]; then
            sed -i '5a a_line_inserted_by_the_benchmark = 1' "$edit"
        fi
        read -r up0 down0 < <(relay_bytes)
        timed "kt-$run-$step" "$KT" put "code$run" --src "$src/" --json
        read -r up1 down1 < <(relay_bytes)
        kt_bytes=$(((up1 - up0) + (down1 - down0)))
        kt_t=$ELAPSED kt_rss=$RSS_KB
        hashed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["files_hashed"])' "$WORK/kt-$run-$step.out")
        timed "rs-$run-$step" rsync -a --stats "$src/" "${DST}code$run/"
        sent=$(awk -F': ' '/^Total bytes sent/ { gsub(/,/, "", $2); print $2 }' "$WORK/rs-$run-$step.out")
        recv=$(awk -F': ' '/^Total bytes received/ { gsub(/,/, "", $2); print $2 }' "$WORK/rs-$run-$step.out")
        rs_bytes=$((sent + recv))
        ROWS+=("| $run | $step | $kt_t | $ELAPSED | $(awk -v a="$kt_t" -v b="$ELAPSED" 'BEGIN { printf "%.2f", a / b }') | $kt_bytes | $rs_bytes | $hashed | $(mib "$kt_rss") | $(mib "$RSS_KB") |")
        T[kt-$step]+="$kt_t " T[rs-$step]+="$ELAPSED "
        B[kt-$step]+="$kt_bytes " B[rs-$step]+="$rs_bytes "
        log "run $run $step: kt ${kt_t}s ${kt_bytes}B (hashed $hashed); rsync ${ELAPSED}s ${rs_bytes}B"
    done
    "$KT" get "code$run" --dest "$WORK/got$run" -c >/dev/null
    diff -r "$src" "$WORK/got$run" >/dev/null || die "kt's copy of run $run differs"
    rm -rf "$WORK/got$run" "$src"
done

summary() { # STEP TIME_TARGET -> a line
    local kt_t rs_t kt_b rs_b tr br
    kt_t=$(median ${T[kt-$1]}) rs_t=$(median ${T[rs-$1]})
    kt_b=$(median ${B[kt-$1]}) rs_b=$(median ${B[rs-$1]})
    tr=$(awk -v a="$kt_t" -v b="$rs_t" 'BEGIN { printf "%.2f", a / b }')
    br=$(awk -v a="$kt_b" -v b="$rs_b" 'BEGIN { printf "%.2f", a / b }')
    local verdict=""
    if [[ -n $2 ]]; then
        verdict=$(awk -v r="$tr" -v w="$2" -v b="$br" 'BEGIN { print (r <= w && b <= 1) ? "**met**" : "**NOT met**" }')
        verdict=" (target: time at most ${2}x and bytes at most rsync's: $verdict)"
    fi
    echo "- $1: kt ${kt_t} s vs rsync ${rs_t} s (${tr}x its time); bytes ${kt_b} vs ${rs_b} (${br}x)$verdict."
}

BEGIN_MARK="<!-- bench/sync.sh: begin -->"
END_MARK="<!-- bench/sync.sh: end -->"
{
    echo "$BEGIN_MARK"
    echo "## Code sync: a $FILES-file tree put, put unchanged, put after a one-line edit, vs rsync"
    echo
    echo "\`$CMD\` ($RUNS runs; kt at $(source_rev "$ROOT"), a $BUILD build of kt;"
    echo "$(rsync --version | head -1 | awk '{ print $1, $2, $3 }') to a daemon on loopback; $(nproc) cores; $(date -u +%F))."
    echo "Times: wall clock of the client; bytes: kt's all bytes both ways through a relay in front of"
    echo "the store server, rsync's \`--stats\` sent + received; hashed: files kt read and hashed."
    echo
    echo "| run | step | kt s | rsync s | kt/rsync time | kt bytes | rsync bytes | hashed | kt RSS MiB | rsync RSS MiB |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Medians:"
    echo
    summary first ""
    summary unchanged 0.2
    summary edited 0.25
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS"
