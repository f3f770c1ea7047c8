#!/usr/bin/env bash
# First reads of many small files in one directory (issue 45's row): N files of 4 KiB (default
# 3,000) written through mount A with `cp -r`, then `cat *` of the directory through mount B, a
# node that has never seen it (its cache empty), against the same `cat *` on local disk (page
# cache warm) and through bench/nullfs (a FUSE filesystem that answers from memory: the
# ceiling of any FUSE read of these files here, with the same three requests a file: open,
# read, release), and through the same in the kernel's no-open mode (NULLFS_NO_OPEN: neither
# open nor release is sent, nor flush; the ceiling of a filesystem that keeps nothing per open
# file, which ktfs's mount is not). Then B again with its blocks cached: with the kernel's caches kept, and after
# drop_caches. Writes its section into bench/RESULTS.md.
#
#   bash bench/smallfiles.sh
#
# Medians of KT_BENCH_RUNS runs (default 3), each on a tree of its own (fresh bytes, so B's
# first read is cold). B's peak RSS (VmHWM, reset before each read) and its and the store
# server's CPU are recorded beside each figure, and B's requests to the store server
# (`kt_mount_metadata_requests_total` on its /metrics).
#
# Environment: KT_SMALL_FILES (default 3000), KT_BIN, KT_BENCH_RUNS, KT_BENCH_RESULTS, KT_BENCH_QUIET_WAIT,
# KT_BENCH_QUIET_TOTAL, KT_BENCH_TMP, CARGO_TARGET_DIR. Needs root (FUSE, drop_caches).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
NFILES=${KT_SMALL_FILES:-3000}
RUNS=${KT_BENCH_RUNS:-3}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# KT_BIN: a `kt` built elsewhere (an A/B of two builds); else the release build here.
KT=${KT_BIN:-$TARGET/release/kt}
LOG_TAG=smallfiles
PRIME_MIB_DEFAULT=0
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup

[[ $(id -u) == 0 ]] || die "needs root: FUSE mounts and /proc/sys/vm/drop_caches"
ensure_tools time:/usr/bin/time curl:curl util-linux:mountpoint || die "missing tools"
if [[ -z ${KT_BIN:-} ]]; then
    log "cargo build --release"
    cargo build --release --quiet --bin kt
fi
NULLFS=$TARGET/nullfs/release/nullfs
cargo build --release --quiet --manifest-path bench/nullfs/Cargo.toml --target-dir "$TARGET/nullfs"
REV=$(source_rev "$ROOT")

WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-small.XXXXXX")
LOCAL=$WORK/local
MN=$WORK/mnt/null
MO=$WORK/mnt/null-no-open
mkdir -p "$LOCAL" "$MN" "$MO" "$WORK/cache"
log "working in $WORK; $RUNS trees of $NFILES files of 4 KiB"
for run in $(seq "$RUNS"); do
    mkdir -p "$LOCAL/t$run"
    (cd "$LOCAL/t$run" && for i in $(seq "$NFILES"); do head -c 4096 /dev/urandom >"f$i"; done)
done

start_server "$WORK/server" 127.0.0.253:0
start_mount A 127.0.0.253
start_mount B 127.0.0.254
"$NULLFS" "$MN" >"$WORK/nullfs.log" 2>&1 &
PIDS+=("$!")
MOUNT_DIRS+=("$MN")
NULLFS_NO_OPEN=1 "$NULLFS" "$MO" >"$WORK/nullfs-no-open.log" 2>&1 &
PIDS+=("$!")
MOUNT_DIRS+=("$MO")
for _ in $(seq 100); do mountpoint -q "$MN" && mountpoint -q "$MO" && break; sleep 0.1; done
mountpoint -q "$MN" || die "bench/nullfs did not mount: $(cat "$WORK/nullfs.log")"
mountpoint -q "$MO" || die "bench/nullfs (no-open) did not mount: $(cat "$WORK/nullfs-no-open.log")"
B_METRICS=http://$(sed -n 's/^kt agent B listening on \([0-9.:]*\).*/\1/p' "$WORK/mount-B.out")/metrics
asked() { curl -sf "$B_METRICS" | awk '/^kt_mount_metadata_requests_total / { print $2 }'; }

CAT='cd "$1" && cat * | md5sum | cut -d" " -f1'
declare -a L_T N_T O_T F_T F_B F_S F_HWM F_Q K_T K_HWM D_T D_B D_HWM
for run in $(seq "$RUNS"); do
    log "run $run/$RUNS"
    cp -r "$LOCAL/t$run" "$WORK/mnt/A/s$run"
    cp -r "$LOCAL/t$run" "$MN/s$run"
    cp -r "$LOCAL/t$run" "$MO/s$run"
    want=$(bash -c "$CAT" _ "$LOCAL/t$run")

    wait_quiet
    timed "local$run" bash -c "$CAT" _ "$LOCAL/t$run"
    L_T+=("$ELAPSED")

    drop_caches
    wait_quiet
    timed "null$run" bash -c "$CAT" _ "$MN/s$run"
    N_T+=("$ELAPSED")

    drop_caches
    wait_quiet
    timed "noopen$run" bash -c "$CAT" _ "$MO/s$run"
    O_T+=("$ELAPSED")

    drop_caches
    wait_quiet
    q0=$(asked)
    snap B server
    timed "first$run" bash -c "$CAT" _ "$WORK/mnt/B/s$run"
    [[ $(cat "$WORK/first$run.out") == "$want" ]] || die "the files read through B differ"
    F_T+=("$ELAPSED") F_B+=("$(cpu_of B)") F_S+=("$(cpu_of server)") F_HWM+=("$(hwm_of B)")
    F_Q+=($(($(asked) - q0)))
    log "  local ${L_T[-1]} s, nullfs ${N_T[-1]} s (no-open ${O_T[-1]} s), B first ${ELAPSED} s (${F_Q[-1]} requests)"

    wait_quiet
    snap B server
    timed "kept$run" bash -c "$CAT" _ "$WORK/mnt/B/s$run"
    [[ $(cat "$WORK/kept$run.out") == "$want" ]] || die "the files re-read through B differ"
    K_T+=("$ELAPSED") K_HWM+=("$(hwm_of B)")

    drop_caches
    wait_quiet
    snap B server
    timed "dropped$run" bash -c "$CAT" _ "$WORK/mnt/B/s$run"
    [[ $(cat "$WORK/dropped$run.out") == "$want" ]] || die "the files re-read through B differ"
    D_T+=("$ELAPSED") D_B+=("$(cpu_of B)") D_HWM+=("$(hwm_of B)")
    log "  B re-read: kernel caches kept ${K_T[-1]} s, dropped ${ELAPSED} s"
done

lt=$(median "${L_T[@]}")
nt=$(median "${N_T[@]}")
row() { # WHAT TIMES... (RUNS of them), then the rest of the row
    local what=$1 m
    shift
    m=$(median "${@:1:RUNS}")
    echo "| $what | $m | $(ratio "$m" "$lt") | $(ratio "$m" "$nt") | ${*:RUNS+1} |"
}
SECTION=$WORK/section.md
{
    echo '<!-- bench/smallfiles.sh: begin -->'
    echo "## First reads of $NFILES small files in one directory (\`cat *\`)"
    echo
    echo "Produced $(date -u '+%Y-%m-%d %H:%M UTC') by \`bash bench/smallfiles.sh\`, release build of $REV,"
    echo "$(nproc) cores. $NFILES files of 4 KiB written through mount A (\`cp -r\`), read with \`cat * | md5sum\`"
    echo "(checked against the original) through mount B, another node. Medians of $RUNS runs, each on a"
    echo "tree of its own. Baselines in the same run: local disk, page cache warm; bench/nullfs, a FUSE"
    echo "filesystem answering from memory after drop_caches (the ceiling of a FUSE read here: the same"
    echo "open, read and release a file). Speed is baseline time / this time (above 1: faster)."
    echo
    echo "| read | median s | vs local | vs nullfs | runs s | B CPU s | server CPU s | B peak RSS MiB | B's requests to the store |"
    echo "|---|---|---|---|---|---|---|---|---|"
    row "local disk, page cache warm" "${L_T[@]}" "$(IFS=,; echo "${L_T[*]}") | - | - | - | -"
    row "bench/nullfs, after drop_caches (FUSE ceiling)" "${N_T[@]}" "$(IFS=,; echo "${N_T[*]}") | - | - | - | -"
    row "(info) bench/nullfs in no-open mode, after drop_caches (no open, flush or release sent)" "${O_T[@]}" "$(IFS=,; echo "${O_T[*]}") | - | - | - | -"
    row "**B, first read** (cold: nothing of the directory on B)" "${F_T[@]}" \
        "$(IFS=,; echo "${F_T[*]}") | $(median "${F_B[@]}") | $(median "${F_S[@]}") | $(mib "$(maxof "${F_HWM[@]}")") | $(median "${F_Q[@]}")"
    row "B again, kernel caches kept" "${K_T[@]}" "$(IFS=,; echo "${K_T[*]}") | - | - | $(mib "$(maxof "${K_HWM[@]}")") | -"
    row "**B again, after drop_caches** (blocks in B's cache)" "${D_T[@]}" \
        "$(IFS=,; echo "${D_T[*]}") | $(median "${D_B[@]}") | - | $(mib "$(maxof "${D_HWM[@]}")") | -"
    echo
    echo "Targets (issue 45): first read >= 0.4x local, cached re-read >= 0.6x local."
    echo '<!-- bench/smallfiles.sh: end -->'
} >"$SECTION"
put_section "$RESULTS" '<!-- bench/smallfiles.sh: begin -->' '<!-- bench/smallfiles.sh: end -->' "$SECTION"
cat "$SECTION"
