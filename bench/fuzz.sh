#!/usr/bin/env bash
# Fuzzing for a bounded time: builds the cargo-fuzz targets of fuzz/ once (libFuzzer, coverage
# instrumentation, debug assertions and overflow checks on, no sanitizer: the code under test is
# safe Rust), runs each for SECONDS_PER_TARGET on its seeds (fuzz/seeds/<target>), what earlier
# runs found (fuzz/corpus/<target>, not committed) and the kept regressions, and copies every
# crash, timeout or out-of-memory input into fuzz/regressions/<target>/, where
# `cargo test -p fuzz-cases` replays it from then on. Writes its section of bench/RESULTS.md and
# exits non-zero if any target found a crash.
#
#   bash bench/fuzz.sh [SECONDS_PER_TARGET]      # default 180
#
# Environment (all optional):
#   KT_FUZZ_TARGETS   the targets to run, space-separated (default: every one in fuzz/fuzz_targets)
#   KT_FUZZ_JOBS      cargo build jobs (default: cargo's)
#   KT_BENCH_RESULTS  where to write the results (default bench/RESULTS.md)
#
# libFuzzer needs nightly features of rustc; RUSTC_BOOTSTRAP=1 gives them on a stable toolchain.
# Installs cargo-fuzz (`cargo install cargo-fuzz --locked`) when it is missing. The targets
# listen on 127.0.0.240 to 127.0.0.242 only.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECS=${1:-180}
[[ $SECS =~ ^[0-9]+$ ]] && ((SECS > 0)) || { echo "usage: bench/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
export LOG_TAG=fuzz KT_BENCH_QUIET_WAIT=0
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup
ensure_tools time:/usr/bin/time || die "missing tools: time"

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
BUILD=(cargo fuzz build --sanitizer none --codegen-units 16 --target "$TRIPLE")
# cargo-fuzz takes no --jobs of its own; cargo reads the limit from the environment.
[[ -n ${KT_FUZZ_JOBS:-} ]] && export CARGO_BUILD_JOBS=$KT_FUZZ_JOBS
log "RUSTC_BOOTSTRAP=1 ${BUILD[*]}"
RUSTC_BOOTSTRAP=1 "${BUILD[@]}"
BIN=$ROOT/fuzz/target/$TRIPLE/release
REV=$(source_rev "$ROOT")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kt-fuzz.XXXXXX")
mkdir -p "$WORK/tmp"

if [[ -n ${KT_FUZZ_TARGETS:-} ]]; then
    read -r -a TARGETS <<<"$KT_FUZZ_TARGETS"
else
    TARGETS=()
    for f in fuzz/fuzz_targets/*.rs; do TARGETS+=("$(basename "$f" .rs)"); done
fi

stat_of() { # NAME LOG: a libFuzzer final statistic
    sed -n "s/^stat::$1: *//p" "$2" | tail -1
}

ROWS=()
NEW_CRASHES=0
for t in "${TARGETS[@]}"; do
    [[ -x $BIN/$t ]] || die "no fuzz target $t in $BIN"
    mkdir -p "fuzz/corpus/$t" "$WORK/artifacts/$t"
    dirs=("fuzz/corpus/$t")
    [[ -d fuzz/seeds/$t ]] && dirs+=("fuzz/seeds/$t")
    [[ -d fuzz/regressions/$t ]] && dirs+=("fuzz/regressions/$t")
    # An ioctl struct is up to 12,304 bytes; everything else fits in libFuzzer's usual 4 KiB.
    max_len=4096
    [[ $t == gpu_ioctl ]] && max_len=16384
    log "$t: ${SECS}s on ${dirs[*]}"
    t0=$EPOCHREALTIME
    # The grpc target's store lives in TMPDIR, removed with WORK. libFuzzer writes new inputs
    # into the first folder only: the seeds and regressions stay as committed.
    set +e
    TMPDIR=$WORK/tmp /usr/bin/time -v -o "$WORK/$t.time" "$BIN/$t" \
        -max_total_time="$SECS" -timeout=30 -rss_limit_mb=2048 -max_len=$max_len \
        -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$t/" "${dirs[@]}" \
        >"$WORK/$t.log" 2>&1
    rc=$?
    set -e
    elapsed=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
    read_time_file "$WORK/$t.time"
    execs=$(stat_of number_of_executed_units "$WORK/$t.log")
    rate=$(stat_of average_exec_per_sec "$WORK/$t.log")
    cov=$(grep -o 'cov: [0-9]*' "$WORK/$t.log" | tail -1 | awk '{ print $2 }')
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    found=0
    mkdir -p "fuzz/regressions/$t"
    for a in "$WORK/artifacts/$t"/*; do
        [[ -f $a ]] || continue
        name=$(basename "$a")
        if [[ ! -e fuzz/regressions/$t/$name ]]; then
            cp "$a" "fuzz/regressions/$t/$name"
            found=$((found + 1))
            log "$t: NEW $name, kept as fuzz/regressions/$t/$name"
        fi
    done
    if ((rc != 0 && found == 0)); then
        tail -40 "$WORK/$t.log" >&2
        die "$t: libFuzzer exited $rc without an artifact"
    fi
    if ((found)); then
        # The panic's message and libFuzzer's summary; the backtrace between them is long.
        grep -A2 'panicked at' "$WORK/$t.log" >&2 || true
        grep -E '^(==[0-9]+== ERROR|SUMMARY|MS:|artifact_prefix)' "$WORK/$t.log" >&2 || true
    fi
    NEW_CRASHES=$((NEW_CRASHES + found))
    ROWS+=("| \`$t\` | $elapsed | ${execs:-?} | ${rate:-?} | ${cov:-?} | $corpus | $found | $(mib "$RSS_KB") |")
    log "$t: $elapsed s, ${execs:-?} executions (${rate:-?}/s), cov ${cov:-?}, corpus $corpus, $found new crashes"
done

BEGIN_MARK="<!-- bench/fuzz.sh: begin -->"
END_MARK="<!-- bench/fuzz.sh: end -->"
{
    echo "$BEGIN_MARK"
    echo "## Fuzzing: the decoders and the gRPC handlers"
    echo
    echo "Produced by \`bash bench/fuzz.sh $SECS\` on $(date -u '+%Y-%m-%d %H:%M') UTC, source revision $REV, $(nproc) cores"
    echo "(one libFuzzer process at a time). Built with \`RUSTC_BOOTSTRAP=1 ${BUILD[*]}\`: coverage"
    echo "instrumentation, debug assertions and overflow checks on, no sanitizer. Each target ran on its"
    echo "seeds, its corpus from earlier runs and the kept regressions; *cov* is the edges libFuzzer saw"
    echo "covered, *corpus* the inputs in fuzz/corpus afterwards, *new crashes* the inputs this run"
    echo "copied to fuzz/regressions (a crash ends that target's run early)."
    echo
    echo "| target | seconds | executions | exec/s | cov | corpus | new crashes | peak RSS MiB |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS"
cat "$WORK/section.md"
if ((NEW_CRASHES)); then
    die "$NEW_CRASHES new crashing inputs in fuzz/regressions: \`cargo test -p fuzz-cases\` replays them"
fi
