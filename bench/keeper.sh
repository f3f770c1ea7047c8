#!/bin/bash
# Reads of one 1 GiB file through a mount kept by `kt keeper` (hosted in the agent, its FUSE
# threads sharing the one device the keeper holds) and through a plain `kt mount` (a cloned
# device per FUSE thread), in the same run: does keeping the device cost read speed?
# Prints a table; usage: bash bench/keeper.sh [rounds]   (root, /dev/fuse)
set -euo pipefail
ROUNDS=${1:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --manifest-path "$ROOT/Cargo.toml" -q
KT=$ROOT/target/release/kt
W=$(mktemp -d)
PIDS=()
cleanup() {
    kill "${PIDS[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    umount -l "$W/mnt-kept" "$W/mnt-plain" 2>/dev/null || true
    [ -n "${KEEP_W:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
SRV_ADDR=127.0.0.150:7447
mkdir -p "$W/mnt-kept" "$W/mnt-plain"
head -c 1G /dev/urandom > "$W/data.bin"
"$KT" server --listen $SRV_ADDR --data-dir "$W/store" > "$W/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do KT_SERVER=$SRV_ADDR "$KT" ls >/dev/null 2>&1 && break; sleep 0.1; done
KT_SERVER=$SRV_ADDR "$KT" put data.bin --src "$W/data.bin" > /dev/null
secs() { local s; s=$(date +%s.%N); cat "$1" > /dev/null; echo "$(date +%s.%N) - $s" | bc; }
echo "| round | kept cold s | plain cold s | kept cached s | plain cached s |"
echo "|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
    "$KT" keeper --socket "$W/k$r/keeper.sock" -- "$KT" agent --host-mounts --server $SRV_ADDR \
        --listen 127.0.0.151:0 --cache-dir "$W/k$r/cache" --socket "$W/k$r/agent.sock" \
        --node-id kept > "$W/kept.log" 2>&1 &
    KEEP=$!
    "$KT" mount "$W/mnt-plain" --server $SRV_ADDR --listen 127.0.0.152:0 \
        --cache-dir "$W/p$r/cache" --socket "$W/p$r/agent.sock" --node-id plain > "$W/plain.log" 2>&1 &
    PLAIN=$!
    PIDS+=("$KEEP" "$PLAIN")
    for _ in $(seq 100); do [ -S "$W/k$r/agent.sock" ] && mountpoint -q "$W/mnt-plain" && break; sleep 0.1; done
    KT_SERVER=$SRV_ADDR "$KT" attach "$W/mnt-kept" -n default --agent "$W/k$r/agent.sock" > /dev/null
    # Alternate which mount reads first, so neither always meets the server's colder cache.
    if (( r % 2 )); then kc=$(secs "$W/mnt-kept/data.bin"); pc=$(secs "$W/mnt-plain/data.bin")
    else pc=$(secs "$W/mnt-plain/data.bin"); kc=$(secs "$W/mnt-kept/data.bin"); fi
    secs "$W/mnt-kept/data.bin" > /dev/null; secs "$W/mnt-plain/data.bin" > /dev/null
    kw=$(secs "$W/mnt-kept/data.bin"); pw=$(secs "$W/mnt-plain/data.bin")
    echo "| $r | $kc | $pc | $kw | $pw |"
    kill "$KEEP" "$PLAIN"; wait "$KEEP" "$PLAIN" || true
done
