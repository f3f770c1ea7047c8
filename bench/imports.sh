#!/usr/bin/env bash
# Python imports from /kt, cold on another node (issue 45's row): the installed pip package (its
# sources and __pycache__, some thousand files) copied through mount A, then
# `import pip._internal.commands.install` (the modules a `pip install` loads) with that copy first
# on sys.path, through a mount on another node that has never seen it, against the same import
# from the local copy after drop_caches and with the page cache warm. Writes its section into
# bench/RESULTS.md.
#
#   bash bench/imports.sh
#
# Medians of KT_BENCH_RUNS runs (default 3): each run reads through a fresh mount (a new node,
# its cache empty), and every import is checked to have come from the copy. Peak RSS of the
# reading mount beside its figure. Environment: KT_BIN (a `kt` built elsewhere), KT_BENCH_RUNS,
# KT_BENCH_RESULTS, KT_BENCH_QUIET_WAIT, KT_BENCH_QUIET_TOTAL, KT_BENCH_TMP, CARGO_TARGET_DIR.
# Needs root (FUSE, drop_caches).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${KT_BENCH_RUNS:-3}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=${KT_BIN:-$TARGET/release/kt}
LOG_TAG=imports
PRIME_MIB_DEFAULT=0
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup

[[ $(id -u) == 0 ]] || die "needs root: FUSE mounts and /proc/sys/vm/drop_caches"
ensure_tools time:/usr/bin/time util-linux:mountpoint || die "missing tools"
if [[ -z ${KT_BIN:-} ]]; then
    log "cargo build --release"
    cargo build --release --quiet --bin kt
fi
REV=$(source_rev "$ROOT")
PIP=$(python3 -c 'import os, pip; print(os.path.dirname(pip.__file__))')

WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-imports.XXXXXX")
mkdir -p "$WORK/local" "$WORK/mnt" "$WORK/cache"
cp -r "$PIP" "$WORK/local/pip"
NFILES=$(find "$WORK/local/pip" -type f | wc -l)
log "pip from $PIP: $NFILES files"

start_server "$WORK/server" 127.0.0.252:0
start_mount A 127.0.0.252
cp -r "$WORK/local/pip" "$WORK/mnt/A/pip"

# The import, with DIR first on sys.path; fails unless pip came from DIR.
IMPORT='import sys; sys.path.insert(0, sys.argv[1]); import pip._internal.commands.install, pip
assert pip.__file__.startswith(sys.argv[1]), pip.__file__'
PY=(env PYTHONDONTWRITEBYTECODE=1 python3 -I -c "$IMPORT")

declare -a LC LW M M_HWM
for run in $(seq "$RUNS"); do
    drop_caches
    wait_quiet
    timed "lcold$run" "${PY[@]}" "$WORK/local"
    LC+=("$ELAPSED")
    wait_quiet
    timed "lwarm$run" "${PY[@]}" "$WORK/local"
    LW+=("$ELAPSED")
    start_mount "B$run" 127.0.0.252
    drop_caches
    wait_quiet
    snap "B$run"
    timed "mount$run" "${PY[@]}" "$WORK/mnt/B$run"
    M+=("$ELAPSED") M_HWM+=("$(hwm_of "B$run")")
    log "  run $run: local cold ${LC[-1]} s, warm ${LW[-1]} s; a fresh node ${M[-1]} s"
    stop_mount "B$run"
done

lc=$(median "${LC[@]}")
lw=$(median "${LW[@]}")
m=$(median "${M[@]}")
SECTION=$WORK/section.md
{
    echo '<!-- bench/imports.sh: begin -->'
    echo "## Python imports from a mount, cold on another node"
    echo
    echo "Produced $(date -u '+%Y-%m-%d %H:%M UTC') by \`bash bench/imports.sh\`, release build of $REV, $(nproc) cores."
    echo "The installed pip ($NFILES files, sources and \`__pycache__\`) copied through mount A; \`import"
    echo "pip._internal.commands.install\` with the copy first on sys.path (\`python3 -I\`, no bytecode"
    echo "written), checked to load from it. Medians of $RUNS runs; each run reads through a fresh mount"
    echo "(a node that never saw the files) after drop_caches. Speed is baseline time / this time."
    echo
    echo "| import from | median s | vs local cold | vs local warm | runs s | reader's peak RSS MiB |"
    echo "|---|---|---|---|---|---|"
    echo "| local disk, after drop_caches | $lc | 1.00 | $(ratio "$lc" "$lw") | $(IFS=,; echo "${LC[*]}") | - |"
    echo "| local disk, page cache warm | $lw | $(ratio "$lw" "$lc") | 1.00 | $(IFS=,; echo "${LW[*]}") | - |"
    echo "| **a fresh mount on another node** | $m | $(ratio "$m" "$lc") | $(ratio "$m" "$lw") | $(IFS=,; echo "${M[*]}") | $(mib "$(maxof "${M_HWM[@]}")") |"
    echo
    echo "Target (issue 45): the mount at least 0.5x local."
    echo '<!-- bench/imports.sh: end -->'
} >"$SECTION"
put_section "$RESULTS" '<!-- bench/imports.sh: begin -->' '<!-- bench/imports.sh: end -->' "$SECTION"
cat "$SECTION"
