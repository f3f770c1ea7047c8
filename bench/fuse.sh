#!/usr/bin/env bash
# The filesystem part of the end-to-end harness: `kt mount` against the local disk and `kt get`,
# in one run, on loopback. Writes its section ("The filesystem at /kt") into bench/RESULTS.md
# between the markers in bench/lib.sh, leaving the rest of the file (bench/e2e.sh's) as it is.
#
#   bash bench/fuse.sh
#
# What it measures (median of KT_BENCH_RUNS runs, default 3, unless marked as one run):
#   a. cached sequential read: a 2 GiB file written through mount A (locale store), read once
#      through mount B to fill B's block cache; then `dd bs=1M` of it through B after
#      `echo 3 > /proc/sys/vm/drop_caches` (cold page cache, warm block cache), against `dd` of the
#      same file on local disk after drop_caches and `fio --direct=1` of it. Target: >= 0.6x disk.
#   b. cold read from a peer: a 1 GiB file written through A, read once through B (so B holds it
#      and is registered as a source); then a fresh mount C (new node, empty cache) reads it with
#      `dd bs=1M`, against `kt get` of the same key to a fresh destination. Both are served by B.
#      Target: >= 0.8x kt get.
#   c. 10,000 small files (1-4 KiB, 100 directories): `cp -r` of a local tree into mount A, then
#      everything read back through mount B (cold block cache: fetched from the store, then again
#      after drop_caches with the blocks cached), against `cp -r` and the same read on local disk.
#      Issue 18's targets. The same with a mount W started with `--writeback` (its own trees, so
#      nothing it writes is deduplicated against A's): the time until `cp -r` returns, and until
#      an fsync of W's root (which waits for every queued publish) returns. And `ls -lR` of the
#      tree through W (which never looked at it) and through B (which read it), against local;
#      and through B again 2 s later with the kernel's caches kept (the names and attributes it
#      holds 30 s under the watch's lease), against a warm local `ls -lR`.
#      Beside the creates, the same `cp -r` into bench/nullfs, a FUSE filesystem that does
#      nothing but gets the same seven requests per file: the most any FUSE create path gets on
#      the machine. Every `cp -r` reads a source tree already in the page cache.
# Peak RSS of each mount process (VmHWM, reset before each measured command) is recorded beside
# each figure, with the CPU time of every process involved.
#
# Needs root (FUSE mounts, drop_caches) and /dev/fuse. Installs fio with apt-get if it is missing
# (the fio baseline is skipped if that fails). Everything listens on 127.0.0.x. All processes and
# mounts it starts, and its temporary directory, are removed on exit, on failure and on Ctrl-C;
# mounts are stopped with SIGTERM (and detached with `umount -l` if that fails).
#
# Environment (all optional):
#   KT_FUSE_BIG_MIB   size of the file for (a) in MiB (default 2048)
#   KT_FUSE_COLD_MIB  size of the file for (b) in MiB (default 1024)
#   KT_FUSE_FILES     small files per tree for (c) (default 10000), in KT_FUSE_DIRS directories (100)
#   KT_BENCH_RUNS     runs per measured command (default 3)
#   KT_BENCH_RESULTS  where to write the results (default bench/RESULTS.md)
#   KT_BENCH_REV, KT_BENCH_TMP, KT_BENCH_QUIET_WAIT, KT_BENCH_QUIET_TOTAL: as for bench/e2e.sh
#   KT_BENCH_PRIME_MIB  MiB of memory touched and freed before each large measured read (default 4096)
#   CARGO_TARGET_DIR  honoured as cargo does
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BIG_MIB=${KT_FUSE_BIG_MIB:-2048}
COLD_MIB=${KT_FUSE_COLD_MIB:-1024}
NFILES=${KT_FUSE_FILES:-10000}
NDIRS=${KT_FUSE_DIRS:-100}
RUNS=${KT_BENCH_RUNS:-3}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KT=$TARGET/release/kt
BIG_BYTES=$((BIG_MIB * 1024 * 1024))
COLD_BYTES=$((COLD_MIB * 1024 * 1024))
LOG_TAG=fuse
PRIME_MIB_DEFAULT=4096
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup
T_START=$SECONDS

# ---- preconditions and tools ----------------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "needs root: FUSE mounts and /proc/sys/vm/drop_caches"
[[ -c /dev/fuse ]] || die "no /dev/fuse"
ensure_tools time:/usr/bin/time jq:jq diffutils:cmp util-linux:mountpoint findutils:xargs \
    || die "missing tools: time jq diffutils util-linux findutils"
command -v python3 >/dev/null || die "needs python3 (to write the small-file trees)"
HAVE_FIO=1
ensure_tools fio:fio || { HAVE_FIO=; log "no fio (apt-get install fio failed); the fio baseline is skipped"; }

log "cargo build --release"
cargo build --release
[[ -x $KT ]] || die "no binary at $KT"
NULLFS=$TARGET/nullfs/release/nullfs
cargo build --release --quiet --manifest-path bench/nullfs/Cargo.toml --target-dir "$TARGET/nullfs"
[[ -x $NULLFS ]] || die "no binary at $NULLFS"
REV=$(source_rev "$ROOT")
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

WORK=$(mktemp -d "${KT_BENCH_TMP:-${TMPDIR:-/tmp}}/kt-fuse.XXXXXX")
log "working in $WORK"
LOCAL=$WORK/local
mkdir -p "$LOCAL" "$WORK/mnt" "$WORK/cache"
# `kt get` here runs without an agent of its own: KT_AGENT names a socket that does not exist.
export KT_AGENT=$WORK/no-agent.sock

# ---- helpers ------------------------------------------------------------------------------------
# Memory priming (see bench/e2e.sh): this VM hands free pages back to its host within a second or
# two, and the first touch of such a page is slow, so a command that fills gigabytes of page cache
# pays for the balloon, not for itself. Before each large measured read, PRIME MiB of anonymous
# memory are touched and freed (no disk I/O, and the page cache is left as it was).
prime() { # [MIB]
    local m=${1:-$PRIME_MIB}
    wait_quiet
    ((m > 0)) || return 0
    python3 -c "bytearray(b'\\1') * ($m << 20)"
}

# (b) reads 1 GiB into C's cache (and `kt get` writes 1 GiB): there the page cache is primed the
# way bench/e2e.sh does it, by writing and deleting a file. Measured at b8e4eed, outside this
# harness, alternating a fresh mount's cold read and `kt get` from the same peer: right after
# 3 GiB of anonymous memory were touched and freed, both ran 1.5-2.5x slower than right after a
# 3 GiB file was written and deleted (mount 3.1-3.3 s against 1.4-2.2 s; `kt get` 1.5-3.6 s
# against 1.1-1.5 s, its extra time all in the kernel), which buried the comparison in noise.
COLD_PRIME=$((PRIME_MIB < 3072 ? PRIME_MIB : 3072))
prime_page_cache() { # MIB
    wait_quiet
    (($1 > 0)) || return 0
    dd if=/dev/zero of="$WORK/prime.bin" bs=4M count=$(($1 / 4)) status=none
    rm -f -- "$WORK/prime.bin"
}

mbs() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.0f", b / 1e6 / t }'; }
fps() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }

# The read of a small-file tree: every file, in a fixed order, hashed (which also checks it).
TREE_READ='cd "$1" && find . -type f -print0 | sort -z | xargs -0 cat | md5sum | cut -d" " -f1'
# `ls -l` of every directory of a tree (a stat of every name); its lines counted, as a check.
TREE_LS='cd "$1" && ls -lR . | wc -l'
declare -A TREE_LS_LINES

# ---- test data ----------------------------------------------------------------------------------
log "writing ${BIG_MIB} MiB and ${COLD_MIB} MiB of pseudo-random data, and $RUNS trees of $NFILES small files"
head -c "$BIG_BYTES" /dev/urandom >"$LOCAL/big.bin"
head -c "$COLD_BYTES" /dev/urandom >"$LOCAL/cold.bin"
python3 - "$LOCAL" "$RUNS" "$NFILES" "$NDIRS" <<'PY'
import os, random, sys
root, runs, nfiles, ndirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for r, name in [(r, f"tree{r}") for r in range(1, runs + 1)] + [(100 + r, f"wtree{r}") for r in range(1, runs + 1)]:
    rng = random.Random(r)
    for i in range(nfiles):
        d = os.path.join(root, name, f"d{i % ndirs:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}"), "wb") as f:
            f.write(os.urandom(rng.randint(1024, 4096)))
PY
declare -A TREE_MD5 TREE_BYTES
for r in $(seq "$RUNS"); do
    TREE_MD5[$r]=$(bash -c "$TREE_READ" _ "$LOCAL/tree$r")
    TREE_LS_LINES[$r]=$(bash -c "$TREE_LS" _ "$LOCAL/tree$r")
    TREE_BYTES[$r]=$(find "$LOCAL/tree$r" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
done
sync

# ---- processes ----------------------------------------------------------------------------------
start_server "$WORK/server" 127.0.0.1:0
export KT_SERVER=$SERVER_ADDR
log "kt server $SERVER_ADDR (pid $SERVER_PID)"
start_mount A 127.0.0.2 --locale store
start_mount B 127.0.0.3 --locale store
start_mount W 127.0.0.4 --locale store --writeback
MA=${MDIR[A]}
MB=${MDIR[B]}
MW=${MDIR[W]}
MN=$WORK/mnt/null
mkdir -p "$MN"
"$NULLFS" "$MN" > "$WORK/nullfs.log" 2>&1 &
MOUNT_PIDS+=($!) MOUNT_DIRS+=("$MN")
for _ in $(seq 100); do mountpoint -q "$MN" && break; sleep 0.1; done
mountpoint -q "$MN" || die "bench/nullfs did not mount: $(cat "$WORK/nullfs.log")"
mkdir "$MA/fuse"

# ============================== (a) cached sequential read ======================================
log "(a) writing big.bin through mount A"
prime
snap A server
timed wbig dd if="$LOCAL/big.bin" of="$MA/fuse/big.bin" bs=1M
W_BIG_T=$ELAPSED W_BIG_CPU=$CPU_S W_BIG_A=$(cpu_of A) W_BIG_AUS=$(us_of A) W_BIG_S=$(cpu_of server) W_BIG_HWM=$(hwm_of A)
W_BIG_O=$(other_s "$BUSY_S" "$CPU_S" "$W_BIG_A" "$W_BIG_S")
log "  write through A: ${ELAPSED}s; dd ${CPU_S}, A ${W_BIG_A} ($W_BIG_AUS), server ${W_BIG_S} CPU-s; A peak $(mib "$W_BIG_HWM") MiB"

log "(a) first read of big.bin through mount B (fills B's cache from the store)"
sleep 1.1 # B's view of the directory may be a listing older than the file
prime
snap B server
timed rbig0 dd if="$MB/fuse/big.bin" of=/dev/null bs=1M
R0_BIG_T=$ELAPSED R0_BIG_CPU=$CPU_S R0_BIG_B=$(cpu_of B) R0_BIG_BUS=$(us_of B) R0_BIG_S=$(cpu_of server) R0_BIG_HWM=$(hwm_of B)
R0_BIG_O=$(other_s "$BUSY_S" "$CPU_S" "$R0_BIG_B" "$R0_BIG_S")
log "  first read through B: ${ELAPSED}s; dd ${CPU_S}, B ${R0_BIG_B} ($R0_BIG_BUS), server ${R0_BIG_S} CPU-s; B peak $(mib "$R0_BIG_HWM") MiB"
cmp "$MB/fuse/big.bin" "$LOCAL/big.bin" || die "big.bin read through B differs from the original"

declare -a CA_T CA_CPU CA_B CA_BUS CA_S CA_HWM CA_O LD_T LD_CPU LD_O FIO_T FIO_O
for run in $(seq "$RUNS"); do
    log "(a) run $run/$RUNS"
    drop_caches
    prime
    snap B server
    timed "cached$run" dd if="$MB/fuse/big.bin" of=/dev/null bs=1M
    CA_T+=("$ELAPSED") CA_CPU+=("$CPU_S") CA_B+=("$(cpu_of B)") CA_BUS+=("$(us_of B)") CA_S+=("$(cpu_of server)") CA_HWM+=("$(hwm_of B)")
    CA_O+=("$(other_s "$BUSY_S" "$CPU_S" "${CA_B[-1]}" "${CA_S[-1]}")")
    log "  cached read through B: ${ELAPSED}s ($(mbs "$BIG_BYTES" "$ELAPSED") MB/s); dd ${CPU_S}, B ${CA_B[-1]} (${CA_BUS[-1]}), server ${CA_S[-1]} CPU-s, other ${CA_O[-1]}; B peak $(mib "${CA_HWM[-1]}") MiB"

    drop_caches
    prime
    timed "local$run" dd if="$LOCAL/big.bin" of=/dev/null bs=1M
    LD_T+=("$ELAPSED") LD_CPU+=("$CPU_S") LD_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    log "  local dd (cold page cache): ${ELAPSED}s ($(mbs "$BIG_BYTES" "$ELAPSED") MB/s), other ${LD_O[-1]}"

    if [[ -n $HAVE_FIO ]]; then
        wait_quiet
        timed "fio$run" fio --name=seq --rw=read --bs=1M --size="${BIG_MIB}M" --filename="$LOCAL/big.bin" \
            --direct=1 --readonly --output-format=json
        bw=$(jq -r '.jobs[0].read.bw_bytes' "$WORK/fio$run.out")
        FIO_T+=("$(awk -v b="$BIG_BYTES" -v bw="$bw" 'BEGIN { printf "%.3f", b / bw }')")
        FIO_O+=("$(other_s "$BUSY_S" "$CPU_S")")
        log "  fio --direct=1: $(awk -v bw="$bw" 'BEGIN { printf "%.0f", bw / 1e6 }') MB/s (${FIO_T[-1]}s), other ${FIO_O[-1]}"
    fi
done

# ============================== (b) cold read from a peer =======================================
log "(b) writing cold.bin through mount A"
prime
snap A server
timed wcold dd if="$LOCAL/cold.bin" of="$MA/fuse/cold.bin" bs=1M
W_COLD_T=$ELAPSED W_COLD_A=$(cpu_of A) W_COLD_S=$(cpu_of server) W_COLD_HWM=$(hwm_of A)
W_COLD_O=$(other_s "$BUSY_S" "$CPU_S" "$W_COLD_A" "$W_COLD_S")
log "  write through A: ${ELAPSED}s; A ${W_COLD_A}, server ${W_COLD_S} CPU-s"
sleep 1.1
prime
snap B server
timed rcold0 dd if="$MB/fuse/cold.bin" of=/dev/null bs=1M
R0_COLD_T=$ELAPSED R0_COLD_B=$(cpu_of B) R0_COLD_S=$(cpu_of server) R0_COLD_HWM=$(hwm_of B)
R0_COLD_O=$(other_s "$BUSY_S" "$CPU_S" "$R0_COLD_B" "$R0_COLD_S")
log "  first read through B (from the store; B becomes a source): ${ELAPSED}s; B ${R0_COLD_B}, server ${R0_COLD_S} CPU-s"
cmp "$MB/fuse/cold.bin" "$LOCAL/cold.bin" || die "cold.bin read through B differs from the original"
sleep 1 # B registers itself as a source in the background

declare -a CM_T CM_CPU CM_C CM_CUS CM_B CM_S CM_HWM CM_BHWM CM_O KG_T KG_CPU KG_RSS KG_B KG_S KG_BHWM KG_O KG_SRC
for run in $(seq "$RUNS"); do
    c=C$run # node ids sort after B, so B is the first peer in everyone's source list
    log "(b) run $run/$RUNS"
    start_mount "$c" "127.0.0.$((10 + run))" --locale store
    prime_page_cache "$COLD_PRIME"
    snap "$c" B server
    timed "coldmount$run" dd if="${MDIR[$c]}/fuse/cold.bin" of=/dev/null bs=1M
    CM_T+=("$ELAPSED") CM_CPU+=("$CPU_S") CM_C+=("$(cpu_of "$c")") CM_CUS+=("$(us_of "$c")") CM_B+=("$(cpu_of B)") CM_S+=("$(cpu_of server)")
    CM_HWM+=("$(hwm_of "$c")") CM_BHWM+=("$(hwm_of B)")
    CM_O+=("$(other_s "$BUSY_S" "$CPU_S" "${CM_C[-1]}" "${CM_B[-1]}" "${CM_S[-1]}")")
    log "  fresh mount $c read: ${ELAPSED}s ($(mbs "$COLD_BYTES" "$ELAPSED") MB/s); dd ${CPU_S}, $c ${CM_C[-1]} (${CM_CUS[-1]}), B ${CM_B[-1]}, server ${CM_S[-1]} CPU-s, other ${CM_O[-1]}; $c peak $(mib "${CM_HWM[-1]}") MiB"
    cmp "${MDIR[$c]}/fuse/cold.bin" "$LOCAL/cold.bin" || die "cold.bin read through $c differs from the original"
    stop_mount "$c"
    rm -rf -- "${WORK:?}/cache/$c"

    mkdir -p "$WORK/get$run"
    prime_page_cache "$COLD_PRIME"
    snap B server
    timed "ktget$run" "$KT" get fuse/cold.bin --dest "$WORK/get$run/cold.bin" --json
    KG_T+=("$ELAPSED") KG_CPU+=("$CPU_S") KG_RSS+=("$RSS_KB") KG_B+=("$(cpu_of B)") KG_S+=("$(cpu_of server)") KG_BHWM+=("$(hwm_of B)")
    KG_O+=("$(other_s "$BUSY_S" "$CPU_S" "${KG_B[-1]}" "${KG_S[-1]}")")
    KG_SRC+=("$(jq -r '[.sources[] | "\(.source) \(.bytes)"] | join(", ")' "$WORK/ktget$run.out")")
    log "  kt get: ${ELAPSED}s ($(mbs "$COLD_BYTES" "$ELAPSED") MB/s); kt ${CPU_S}, B ${KG_B[-1]}, server ${KG_S[-1]} CPU-s, other ${KG_O[-1]}; sources: ${KG_SRC[-1]}"
    cmp "$WORK/get$run/cold.bin" "$LOCAL/cold.bin" || die "kt get $run differs from the original"
    rm -rf -- "${WORK:?}/get$run"
done

# ============================== (c) small files =================================================
declare -a SN_CP_T SN_CP_O SL_CP_T SL_CP_O SM_CP_T SM_CP_A SM_CP_S SM_CP_HWM SM_CP_O
declare -a SM_R_T SM_R_B SM_R_S SM_R_HWM SM_R_O SM_RR_T SM_RR_B SM_RR_S SM_RR_HWM SM_RR_O
declare -a SL_R_T SL_R_O SL_RW_T SL_RW_O SW_CP_T SW_CP_W SW_CP_S SW_CP_HWM SW_CP_O SW_SYNC_T
declare -a SM_LS1_T SM_LS1_S SM_LS1_O SM_LS_T SM_LS_S SM_LS_O SL_LS_T SL_LS_O SL_LSW_T SM_LSK_T SM_LSK_B
WSYNC='import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' 
# Every create copies a tree in the page cache (its bytes, names and inodes), so each side
# reads the same warm source: without this the local copy, the first to read a tree, paid
# for reading it from disk and the mounts after it did not.
warm_tree() { find "$1" -type f -print0 | xargs -0 cat >/dev/null; }
for run in $(seq "$RUNS"); do
    log "(c) run $run/$RUNS: $NFILES files"
    warm_tree "$LOCAL/tree$run"
    warm_tree "$LOCAL/wtree$run"
    wait_quiet
    timed "lcp$run" cp -r "$LOCAL/tree$run" "$LOCAL/copy$run"
    SL_CP_T+=("$ELAPSED") SL_CP_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    log "  local cp -r: ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s)"
    rm -rf -- "${LOCAL:?}/copy$run"

    wait_quiet
    timed "ncp$run" cp -r "$LOCAL/tree$run" "$MN/t$run"
    SN_CP_T+=("$ELAPSED") SN_CP_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    log "  cp -r into bench/nullfs: ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s)"

    wait_quiet
    snap A server
    timed "mcp$run" cp -r "$LOCAL/tree$run" "$MA/fuse/small$run"
    SM_CP_T+=("$ELAPSED") SM_CP_A+=("$(cpu_of A)") SM_CP_S+=("$(cpu_of server)") SM_CP_HWM+=("$(hwm_of A)")
    SM_CP_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SM_CP_A[-1]}" "${SM_CP_S[-1]}")")
    log "  cp -r into mount A: ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s); cp ${CPU_S}, A ${SM_CP_A[-1]} ($(us_of A)), server ${SM_CP_S[-1]} CPU-s, other ${SM_CP_O[-1]}"

    wait_quiet
    snap W server
    timed "wcp$run" cp -r "$LOCAL/wtree$run" "$MW/wb$run"
    SW_CP_T+=("$ELAPSED")
    timed "wsync$run" python3 -c "$WSYNC" "$MW"
    SW_SYNC_T+=("$(awk -v a="${SW_CP_T[-1]}" -v b="$ELAPSED" 'BEGIN { printf "%.3f", a + b }')")
    SW_CP_W+=("$(cpu_of W)") SW_CP_S+=("$(cpu_of server)") SW_CP_HWM+=("$(hwm_of W)")
    SW_CP_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SW_CP_W[-1]}" "${SW_CP_S[-1]}")")
    log "  cp -r into write-back mount W: ${SW_CP_T[-1]}s; every publish landed after ${SW_SYNC_T[-1]}s; W ${SW_CP_W[-1]}, server ${SW_CP_S[-1]} CPU-s"

    # `ls -lR` of the tree A wrote, through W, which has never looked at it (every listing
    # from the store), and its line count checked against the local tree's.
    drop_caches
    wait_quiet
    snap W server
    timed "wls$run" bash -c "$TREE_LS" _ "$MW/fuse/small$run"
    [[ $(cat "$WORK/wls$run.out") == "${TREE_LS_LINES[$run]}" ]] || die "ls -lR through W lists another tree"
    SM_LS1_T+=("$ELAPSED") SM_LS1_S+=("$(cpu_of server)")
    SM_LS1_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SM_LS1_S[-1]}")")
    log "  ls -lR through W, first look: ${ELAPSED}s; ls ${CPU_S}, W $(cpu_of W), server ${SM_LS1_S[-1]} CPU-s"

    sleep 1.1
    wait_quiet
    snap B server
    timed "mread$run" bash -c "$TREE_READ" _ "$MB/fuse/small$run"
    [[ $(cat "$WORK/mread$run.out") == "${TREE_MD5[$run]}" ]] || die "small files read through B differ from the originals"
    SM_R_T+=("$ELAPSED") SM_R_B+=("$(cpu_of B)") SM_R_S+=("$(cpu_of server)") SM_R_HWM+=("$(hwm_of B)")
    SM_R_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SM_R_B[-1]}" "${SM_R_S[-1]}")")
    log "  read through B (from the store): ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s); readers ${CPU_S}, B ${SM_R_B[-1]} ($(us_of B)), server ${SM_R_S[-1]} CPU-s, other ${SM_R_O[-1]}"

    drop_caches
    wait_quiet
    timed "lread$run" bash -c "$TREE_READ" _ "$LOCAL/tree$run"
    SL_R_T+=("$ELAPSED") SL_R_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    log "  local read (cold page cache): ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s)"
    wait_quiet
    timed "lreadw$run" bash -c "$TREE_READ" _ "$LOCAL/tree$run"
    SL_RW_T+=("$ELAPSED") SL_RW_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    log "  local read (warm page cache): ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s)"

    drop_caches
    wait_quiet
    snap B server
    timed "mreread$run" bash -c "$TREE_READ" _ "$MB/fuse/small$run"
    [[ $(cat "$WORK/mreread$run.out") == "${TREE_MD5[$run]}" ]] || die "small files re-read through B differ from the originals"
    SM_RR_T+=("$ELAPSED") SM_RR_B+=("$(cpu_of B)") SM_RR_S+=("$(cpu_of server)") SM_RR_HWM+=("$(hwm_of B)")
    SM_RR_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SM_RR_B[-1]}" "${SM_RR_S[-1]}")")
    log "  re-read through B (blocks cached, page cache dropped): ${ELAPSED}s ($(fps "$NFILES" "$ELAPSED") files/s); B ${SM_RR_B[-1]}, server ${SM_RR_S[-1]} CPU-s"

    # `ls -lR` of a tree B has read (its listings held under the watch's lease), and of the
    # local tree, both with the kernel's dentry and inode caches dropped.
    drop_caches
    wait_quiet
    snap B server
    timed "mls$run" bash -c "$TREE_LS" _ "$MB/fuse/small$run"
    [[ $(cat "$WORK/mls$run.out") == "${TREE_LS_LINES[$run]}" ]] || die "ls -lR through B lists another tree"
    SM_LS_T+=("$ELAPSED") SM_LS_S+=("$(cpu_of server)")
    SM_LS_O+=("$(other_s "$BUSY_S" "$CPU_S" "${SM_LS_S[-1]}")")
    log "  ls -lR through B (listings cached): ${ELAPSED}s; ls ${CPU_S}, B $(cpu_of B), server ${SM_LS_S[-1]} CPU-s"
    # The same 2 s later, the kernel's caches kept: past the 1 s the kernel keeps a name or its
    # attributes without a lease, within the 30 s it keeps them under one, so the kernel answers
    # without asking B (B's CPU says how much it was asked).
    sleep 2
    snap B
    timed "mlsk$run" bash -c "$TREE_LS" _ "$MB/fuse/small$run"
    [[ $(cat "$WORK/mlsk$run.out") == "${TREE_LS_LINES[$run]}" ]] || die "ls -lR through B lists another tree"
    SM_LSK_T+=("$ELAPSED") SM_LSK_B+=("$(cpu_of B)")
    log "  ls -lR through B again 2 s later (kernel caches kept): ${ELAPSED}s; B ${SM_LSK_B[-1]} CPU-s"
    drop_caches
    wait_quiet
    timed "lls$run" bash -c "$TREE_LS" _ "$LOCAL/tree$run"
    SL_LS_T+=("$ELAPSED") SL_LS_O+=("$(other_s "$BUSY_S" "$CPU_S")")
    wait_quiet
    timed "llsw$run" bash -c "$TREE_LS" _ "$LOCAL/tree$run"
    SL_LSW_T+=("$ELAPSED")
    log "  local ls -lR: ${SL_LS_T[-1]}s cold, ${SL_LSW_T[-1]}s warm"
done

# ---- stop everything before writing (so a failure to unmount fails the run) ----------------------
stop_mount W
stop_mount B
stop_mount A
stop_server
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- results ------------------------------------------------------------------------------------
ca_m=$(median "${CA_T[@]}")
ld_m=$(median "${LD_T[@]}")
cm_m=$(median "${CM_T[@]}")
kg_m=$(median "${KG_T[@]}")
ca_vs_ld=$(ratio "$ca_m" "$ld_m")
cm_vs_kg=$(ratio "$cm_m" "$kg_m")
if [[ -n $HAVE_FIO ]]; then
    fio_m=$(median "${FIO_T[@]}")
    ca_vs_fio=$(ratio "$ca_m" "$fio_m")
fi
sl_cp_m=$(median "${SL_CP_T[@]}")
sn_cp_m=$(median "${SN_CP_T[@]}")
sm_cp_m=$(median "${SM_CP_T[@]}")
sw_cp_m=$(median "${SW_CP_T[@]}")
sw_sync_m=$(median "${SW_SYNC_T[@]}")
sm_r_m=$(median "${SM_R_T[@]}")
sm_rr_m=$(median "${SM_RR_T[@]}")
sl_r_m=$(median "${SL_R_T[@]}")
sm_ls1_m=$(median "${SM_LS1_T[@]}")
sm_ls_m=$(median "${SM_LS_T[@]}")
sl_ls_m=$(median "${SL_LS_T[@]}")
sl_lsw_m=$(median "${SL_LSW_T[@]}")
sm_lsk_m=$(median "${SM_LSK_T[@]}")
sl_rw_m=$(median "${SL_RW_T[@]}")
mibmax() { mib "$(maxof "$@")"; }
R=$RUNS

{
    echo "$FUSE_BEGIN"
    echo "## The filesystem at /kt"
    echo
    echo "Produced by \`bash bench/fuse.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), source revision $REV,"
    echo "$(nproc) cores, $(uname -sr), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM, in $((SECONDS - T_START)) s."
    echo "Load average at the start: $LOAD_START; at the end: $LOAD_END (it counts this benchmark's own processes)."
    echo "One \`kt server\` on 127.0.0.1 and \`kt mount\` processes, each its own node on its own address:"
    echo "A (127.0.0.2, the writer), B (127.0.0.3, the reader whose cache is measured), and C1..C$R"
    echo "(127.0.0.11.., fresh nodes with empty caches); all with \`--locale store\` and the default 10 GiB"
    echo "cache budget, and \`kt mount MOUNTPOINT --server ADDR --listen IP:0 --cache-dir DIR --socket PATH --node-id ID\`."
    echo "Median of $R runs, interleaved; rows marked (info) ran once. Every file read through a mount was"
    echo "checked against the original (\`cmp\`, or an md5 of all the small files in order)."
    echo "\"Cold page cache\" means \`sync; echo 3 > /proc/sys/vm/drop_caches\` right before the command."
    echo "Before each large read ${PRIME_MIB} MiB of anonymous memory were touched and freed (in (b): ${COLD_PRIME} MiB of file written and deleted), so"
    echo "page-cache growth does not pay for this VM's balloon (see the end-to-end section); machine waited"
    echo "idle for a second before each command where it could (${QUIET_SPENT} s spent waiting)."
    echo "MB/s is 10^6 bytes/s; ratios are speed ratios (baseline seconds / these seconds; above 1 is"
    echo "faster). Peak RSS is \`VmHWM\` of the mount process, reset before each measured command (largest"
    echo "over the runs). CPU is user+sys seconds, median over the runs; the last column gives each run's"
    echo "seconds and, in parentheses, the CPU-seconds the machine spent on anything but the processes named."
    echo
    echo "### (a) Cached sequential read, ${BIG_MIB} MiB: \`dd bs=1M\` through mount B, its blocks in B's cache"
    echo
    echo "| operation | median s | MB/s | vs local dd | vs fio | peak RSS | CPU s | runs: s (other CPU-s) |"
    echo "|---|---:|---:|---:|---:|---|---|---|"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "cached read through mount B (cold page cache)" "$ca_m" "$(mbs "$BIG_BYTES" "$ca_m")" "$ca_vs_ld" "${ca_vs_fio:--}" \
        "B $(mibmax "${CA_HWM[@]}") MiB" "dd $(median "${CA_CPU[@]}"); B $(median "${CA_B[@]}"); server $(median "${CA_S[@]}")" \
        "$(runs_of "$R" "${CA_T[@]}" "${CA_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "local disk: \`dd bs=1M\` of the same file (cold page cache)" "$ld_m" "$(mbs "$BIG_BYTES" "$ld_m")" "1.00" \
        "$([[ -n $HAVE_FIO ]] && ratio "$ld_m" "$fio_m" || echo -)" "-" "dd $(median "${LD_CPU[@]}")" \
        "$(runs_of "$R" "${LD_T[@]}" "${LD_O[@]}")"
    if [[ -n $HAVE_FIO ]]; then
        printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' \
            "local disk: \`fio --rw=read --bs=1M --direct=1\`" "$fio_m" "$(mbs "$BIG_BYTES" "$fio_m")" "$(ratio "$fio_m" "$ld_m")" "1.00" \
            "-" "-" "$(runs_of "$R" "${FIO_T[@]}" "${FIO_O[@]}")"
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) first read through B: blocks fetched from the store" "$R0_BIG_T" "$(mbs "$BIG_BYTES" "$R0_BIG_T")" \
        "$(ratio "$R0_BIG_T" "$ld_m")" "-" "B $(mib "$R0_BIG_HWM") MiB" "dd $R0_BIG_CPU; B $R0_BIG_B; server $R0_BIG_S" "$R0_BIG_T ($R0_BIG_O)"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) write through mount A, \`dd bs=1M\`, published (uploaded) on close" "$W_BIG_T" "$(mbs "$BIG_BYTES" "$W_BIG_T")" \
        "-" "-" "A $(mib "$W_BIG_HWM") MiB" "dd $W_BIG_CPU; A $W_BIG_A; server $W_BIG_S" "$W_BIG_T ($W_BIG_O)"
    echo
    echo "B's CPU in the measured runs: $(printf '%s; ' "${CA_BUS[@]}" | sed 's/; $//'). The server's CPU shows the"
    echo "cached reads needed no network."
    echo
    echo "### (b) Cold read from a peer, ${COLD_MIB} MiB: a fresh mount against \`kt get\`"
    echo
    echo "B holds the file (it read it once) and is registered as a source; each fresh node C reads it"
    echo "through its mount (\`dd bs=1M\` to /dev/null; the blocks land in C's cache), and \`kt get\` (no"
    echo "agent) writes it to a fresh destination file. The sources \`kt get\` reported: $(printf '%s; ' "${KG_SRC[@]}" | sed 's/; $//')."
    echo
    echo "| operation | median s | MB/s | vs kt get | peak RSS | CPU s | runs: s (other CPU-s) |"
    echo "|---|---:|---:|---:|---|---|---|"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "fresh mount C reads through the mount (empty cache)" "$cm_m" "$(mbs "$COLD_BYTES" "$cm_m")" "$cm_vs_kg" \
        "C $(mibmax "${CM_HWM[@]}") MiB; B $(mibmax "${CM_BHWM[@]}") MiB" \
        "dd $(median "${CM_CPU[@]}"); C $(median "${CM_C[@]}"); B $(median "${CM_B[@]}"); server $(median "${CM_S[@]}")" \
        "$(runs_of "$R" "${CM_T[@]}" "${CM_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "\`kt get fuse/cold.bin --dest D/cold.bin\`" "$kg_m" "$(mbs "$COLD_BYTES" "$kg_m")" "1.00" \
        "kt $(mibmax "${KG_RSS[@]}") MiB; B $(mibmax "${KG_BHWM[@]}") MiB" \
        "kt $(median "${KG_CPU[@]}"); B $(median "${KG_B[@]}"); server $(median "${KG_S[@]}")" \
        "$(runs_of "$R" "${KG_T[@]}" "${KG_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) write through mount A, published on close" "$W_COLD_T" "$(mbs "$COLD_BYTES" "$W_COLD_T")" "-" \
        "A $(mib "$W_COLD_HWM") MiB" "A $W_COLD_A; server $W_COLD_S" "$W_COLD_T ($W_COLD_O)"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) B's first read, from the store" "$R0_COLD_T" "$(mbs "$COLD_BYTES" "$R0_COLD_T")" "$(ratio "$R0_COLD_T" "$kg_m")" \
        "B $(mib "$R0_COLD_HWM") MiB" "B $R0_COLD_B; server $R0_COLD_S" "$R0_COLD_T ($R0_COLD_O)"
    echo
    echo "C's CPU in the measured runs: $(printf '%s; ' "${CM_CUS[@]}" | sed 's/; $//')."
    echo
    echo "### (c) $NFILES small files (1-4 KiB, $NDIRS directories, $(awk -v b="${TREE_BYTES[1]}" 'BEGIN { printf "%.1f", b / 1e6 }') MB)"
    echo
    echo "Each run has its own tree (different contents, so nothing is deduplicated). Create: \`cp -r TREE DIR\`"
    echo "(into mount A: every file is published on close — staged (in A's memory, each at most 64 KiB), hashed, sent inside its publish;"
    echo "on local disk: into the page cache, not synced). Every create reads its source tree from the page cache (read once before). Read: \`find . -type f -print0 | sort -z | xargs -0 cat | md5sum\`."
    echo
    echo "| operation | median s | files/s | vs local | peak RSS | CPU s | runs: s (other CPU-s) |"
    echo "|---|---:|---:|---:|---|---|---|"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "create through mount A" "$sm_cp_m" "$(fps "$NFILES" "$sm_cp_m")" "$(ratio "$sm_cp_m" "$sl_cp_m")" \
        "A $(mibmax "${SM_CP_HWM[@]}") MiB" "A $(median "${SM_CP_A[@]}"); server $(median "${SM_CP_S[@]}")" \
        "$(runs_of "$R" "${SM_CP_T[@]}" "${SM_CP_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "create through write-back mount W (until \`cp -r\` returns)" "$sw_cp_m" "$(fps "$NFILES" "$sw_cp_m")" "$(ratio "$sw_cp_m" "$sl_cp_m")" \
        "W $(mibmax "${SW_CP_HWM[@]}") MiB" "W $(median "${SW_CP_W[@]}"); server $(median "${SW_CP_S[@]}") (cp and the drain)" \
        "$(runs_of "$R" "${SW_CP_T[@]}" "${SW_CP_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) the same, until every publish landed (\`cp -r\`, then fsync of W's root)" "$sw_sync_m" "$(fps "$NFILES" "$sw_sync_m")" "$(ratio "$sw_sync_m" "$sl_cp_m")" \
        "-" "-" "$(printf '%s ' "${SW_SYNC_T[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "create on local disk" "$sl_cp_m" "$(fps "$NFILES" "$sl_cp_m")" "1.00" "-" "-" \
        "$(runs_of "$R" "${SL_CP_T[@]}" "${SL_CP_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) create through bench/nullfs, a FUSE filesystem that does nothing with the same seven requests a file (the ceiling)" "$sn_cp_m" "$(fps "$NFILES" "$sn_cp_m")" "$(ratio "$sn_cp_m" "$sl_cp_m")" "-" "-" \
        "$(runs_of "$R" "${SN_CP_T[@]}" "${SN_CP_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "read through mount B, first time (blocks from the store)" "$sm_r_m" "$(fps "$NFILES" "$sm_r_m")" "$(ratio "$sm_r_m" "$sl_r_m")" \
        "B $(mibmax "${SM_R_HWM[@]}") MiB" "B $(median "${SM_R_B[@]}"); server $(median "${SM_R_S[@]}")" \
        "$(runs_of "$R" "${SM_R_T[@]}" "${SM_R_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "read through mount B again (blocks cached, cold page cache)" "$sm_rr_m" "$(fps "$NFILES" "$sm_rr_m")" "$(ratio "$sm_rr_m" "$sl_r_m")" \
        "B $(mibmax "${SM_RR_HWM[@]}") MiB" "B $(median "${SM_RR_B[@]}"); server $(median "${SM_RR_S[@]}")" \
        "$(runs_of "$R" "${SM_RR_T[@]}" "${SM_RR_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "read on local disk (cold page cache)" "$sl_r_m" "$(fps "$NFILES" "$sl_r_m")" "1.00" "-" "-" \
        "$(runs_of "$R" "${SL_R_T[@]}" "${SL_R_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) read on local disk (warm page cache)" "$sl_rw_m" "$(fps "$NFILES" "$sl_rw_m")" "$(ratio "$sl_rw_m" "$sl_r_m")" "-" "-" \
        "$(runs_of "$R" "${SL_RW_T[@]}" "${SL_RW_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "\`ls -lR\` through mount B (its listings cached; kernel caches dropped)" "$sm_ls_m" "$(fps "$NFILES" "$sm_ls_m")" "$(ratio "$sm_ls_m" "$sl_ls_m")" \
        "-" "server $(median "${SM_LS_S[@]}")" "$(runs_of "$R" "${SM_LS_T[@]}" "${SM_LS_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) \`ls -lR\` through mount B again 2 s later (kernel caches kept, names and attributes under the lease; vs local warm)" "$sm_lsk_m" "$(fps "$NFILES" "$sm_lsk_m")" "$(ratio "$sm_lsk_m" "$sl_lsw_m")" \
        "-" "B $(median "${SM_LSK_B[@]}")" "$(printf '%s ' "${SM_LSK_T[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "\`ls -lR\` through mount W, first look (every listing from the store)" "$sm_ls1_m" "$(fps "$NFILES" "$sm_ls1_m")" "$(ratio "$sm_ls1_m" "$sl_ls_m")" \
        "-" "server $(median "${SM_LS1_S[@]}")" "$(runs_of "$R" "${SM_LS1_T[@]}" "${SM_LS1_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "\`ls -lR\` on local disk (cold dentry and inode caches)" "$sl_ls_m" "$(fps "$NFILES" "$sl_ls_m")" "1.00" "-" "-" \
        "$(runs_of "$R" "${SL_LS_T[@]}" "${SL_LS_O[@]}")"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' \
        "(info) \`ls -lR\` on local disk (warm)" "$sl_lsw_m" "$(fps "$NFILES" "$sl_lsw_m")" "$(ratio "$sl_lsw_m" "$sl_ls_m")" "-" "-" \
        "$(printf '%s ' "${SL_LSW_T[@]}")"
    echo
    echo "### Targets (issue)"
    echo
    echo "- Cached sequential read at least 0.6x the local disk: ${ca_vs_ld}x of \`dd\` from the local disk — $(verdict "$ca_vs_ld" 0.6)$(
        [[ -n $HAVE_FIO ]] && echo "; ${ca_vs_fio}x of \`fio --direct=1\` — $(verdict "$ca_vs_fio" 0.6)")."
    echo "- Cold read through the mount from a peer at least 0.8x \`kt get\`: ${cm_vs_kg}x — $(verdict "$cm_vs_kg" 0.8)."
    echo "- Small files: no target; creating through the mount runs at $(ratio "$sm_cp_m" "$sl_cp_m")x of local \`cp -r\`, reading at"
    echo "  $(ratio "$sm_r_m" "$sl_r_m")x (first read) and $(ratio "$sm_rr_m" "$sl_r_m")x (cached) of a cold local read."
    echo "- Issue 18's targets for them: first read on another node at least 0.3x: $(ratio "$sm_r_m" "$sl_r_m")x — $(verdict "$(ratio "$sm_r_m" "$sl_r_m")" 0.3);"
    echo "  cached re-read at least 0.5x: $(ratio "$sm_rr_m" "$sl_r_m")x — $(verdict "$(ratio "$sm_rr_m" "$sl_r_m")" 0.5);"
    echo "  \`cp -r\` into the mount at least 0.3x: $(ratio "$sm_cp_m" "$sl_cp_m")x — $(verdict "$(ratio "$sm_cp_m" "$sl_cp_m")" 0.3);"
    echo "  with \`--writeback\` at least 0.7x: $(ratio "$sw_cp_m" "$sl_cp_m")x — $(verdict "$(ratio "$sw_cp_m" "$sl_cp_m")" 0.7)"
    echo "  (a FUSE filesystem that does nothing, bench/nullfs: $(ratio "$sn_cp_m" "$sl_cp_m")x; the mounts reach $(ratio "$sm_cp_m" "$sn_cp_m")x and $(ratio "$sw_cp_m" "$sn_cp_m")x of it);"
    echo "  \`ls -l\` of the tree at least 0.5x: $(ratio "$sm_ls_m" "$sl_ls_m")x with B's listings cached — $(verdict "$(ratio "$sm_ls_m" "$sl_ls_m")" 0.5),"
    echo "  $(ratio "$sm_ls1_m" "$sl_ls_m")x on a node's first look — $(verdict "$(ratio "$sm_ls1_m" "$sl_ls_m")" 0.5)."
    echo "$FUSE_END"
} >"$WORK/section.md"

{
    # Everything else in RESULTS.md as it was, without trailing blank lines, then this section.
    without_fuse_block "$RESULTS" | awk '{ l[NR] = $0 } NF { last = NR } END { for (i = 1; i <= last; i++) print l[i] }'
    [[ -s $RESULTS ]] && echo
    cat "$WORK/section.md"
} >"$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
log "wrote $RESULTS ($((SECONDS - T_START)) s)"
cat "$WORK/section.md"
