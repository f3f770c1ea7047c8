#!/usr/bin/env bash
# One run of the small-file check used to compare two builds of `kt` (bench/RESULTS.md, "POSIX
# metadata"): a fresh store server and mount from the binary $1, 2,000 files of 4 KiB in 20
# directories (made once under ${KT_BENCH_SRC:-/tmp/kt-smallfiles-src}) copied in with `cp -r`, then
# `ls -lR` of the copy (a stat of every file and directory). Time it as a whole process, the two
# builds in turn, A B A B.
set -euo pipefail
BIN=${1:?usage: bench/smallfiles_ab.sh PATH_TO_KT}
SRC=${KT_BENCH_SRC:-/tmp/kt-smallfiles-src}
IP=${KT_BENCH_IP:-127.0.0.245}
if [[ ! -d $SRC ]]; then
    for d in $(seq 1 20); do
        mkdir -p "$SRC/d$d"
        for f in $(seq 1 100); do head -c 4096 /dev/urandom > "$SRC/d$d/f$f"; done
    done
fi
W=$(mktemp -d /tmp/kt-sf.XXXX)
mkdir -p "$W/mnt"
cleanup() {
    kill "${MP:-}" "${SP:-}" 2>/dev/null || true
    wait 2>/dev/null || true
    umount -l "$W/mnt" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
ready() { for _ in $(seq 200); do grep -q "listening on" "$1" && return; sleep 0.05; done; exit 1; }
"$BIN" server --listen "$IP:0" --data-dir "$W/store" > "$W/server.log" 2>&1 &
SP=$!
ready "$W/server.log"
ADDR=$(grep -o "listening on [0-9.:]*" "$W/server.log" | cut -d' ' -f3)
"$BIN" mount "$W/mnt" --server "$ADDR" --listen "$IP:0" --cache-dir "$W/cache" \
    --socket "$W/agent.sock" --node-id sf > "$W/mount.log" 2>&1 &
MP=$!
ready "$W/mount.log"
cp -r "$SRC" "$W/mnt/x"
ls -lR "$W/mnt/x" > /dev/null
