#!/usr/bin/env bash
# A caller with no ticket against the store's data port (issue 42, item 4): from 127.0.0.3,
# 2,000 connections that say their hello and nothing more, and 8 that announce a 64 MiB
# upload and send half of it; meanwhile a caller with the token gets 256 MiB from 127.0.0.2's
# side. Reports the server's RSS before and during, how many of the abusive connections the
# server kept, and the get's time against the same get alone. Appends its table to
# bench/RESULTS.md.
#
#   bash bench/abuse.sh              # KT=path/to/kt (default target/debug/kt)
set -euo pipefail
cd "$(dirname "$0")/.."
KT=${KT:-$PWD/target/debug/kt}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
ulimit -n 8192
echo s3cret >"$WORK/token"
"$KT" server --listen 127.0.0.43:0 --data-dir "$WORK/store" --token-file "$WORK/token" \
    >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do grep -q listening "$WORK/server.log" && break; sleep 0.1; done
ADDR=$(sed -n 's/.*listening on //p' "$WORK/server.log")
export KT_SERVER=$ADDR KT_AGENT=$WORK/none.sock KT_TOKEN_FILE=$WORK/token
rss() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$SERVER_PID/status"; }
head -c 256M /dev/urandom >"$WORK/data"
"$KT" put data --src "$WORK/data" >/dev/null
get_time() {
    rm -rf "$WORK/got"
    /usr/bin/time -f "%e" -o "$WORK/get.time" "$KT" get data --dest "$WORK/got" >/dev/null
    cat "$WORK/get.time"
}
alone=$(get_time)
rss_before=$(rss)
python3 - "$ADDR" "$WORK/kept" <<'PY' &
import asyncio, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
async def idle():
    try:
        r, w = await asyncio.open_connection(host, int(port), local_addr=("127.0.0.3", 0))
        w.write(b"KTDP\x01"); await w.drain()
        return r, w
    except OSError:
        return None
async def half_frame():
    try:
        r, w = await asyncio.open_connection(host, int(port), local_addr=("127.0.0.3", 0))
        w.write(b"KTDP\x01" + bytes([2]) + struct.pack(">I", 64 << 20) + bytes(32))
        for _ in range(32):
            w.write(bytes(1 << 20)); await w.drain()
        return r, w
    except OSError:
        return None
async def alive(c):
    if c is None: return False
    try:
        return await asyncio.wait_for(c[0].read(1), 0.5) != b""
    except asyncio.TimeoutError:
        return True
    except OSError:
        return False
async def main():
    conns = await asyncio.gather(*[idle() for _ in range(2000)], *[half_frame() for _ in range(8)])
    await asyncio.sleep(1)
    kept = sum(await asyncio.gather(*[alive(c) for c in conns]))
    open(sys.argv[2], "w").write(str(kept))
    await asyncio.sleep(30)
asyncio.run(main())
PY
for _ in $(seq 300); do [[ -s $WORK/kept ]] && break; sleep 0.1; done
rss_during=$(rss)
during=$(get_time)
rss_after_get=$(rss)
table="
### A caller with no ticket against the store's data port ($(date -u +%F), \`bash bench/abuse.sh\`)

From 127.0.0.3: 2,000 connections that send the hello and nothing more, and 8 that announce a
64 MiB upload (no ticket) and send 32 MiB of it. A caller with the token gets 256 MiB meanwhile.

| what | figure |
|---|---|
| abusive connections the server kept open | $(cat "$WORK/kept") of 2,008 |
| server RSS before, during, after the get | ${rss_before} / ${rss_during} / ${rss_after_get} MiB |
| the 256 MiB get alone / during | ${alone} s / ${during} s |
"
echo "$table"
echo "$table" >>bench/RESULTS.md
