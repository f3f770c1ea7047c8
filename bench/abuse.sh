#!/usr/bin/env bash
# A caller with no ticket against a data port (issue 42, item 4), the store's and then a node
# agent's: from 127.0.0.3, 2,000 connections that say their hello and nothing more, and 8 that
# announce a 64 MiB upload and send half of it; meanwhile a caller with the token gets 256 MiB
# from that server (the store, or the agent serving a key it published in place). Reports the
# server's RSS before and during, how many of the abusive connections it kept, and the get's
# time against the same get alone. Appends its table to bench/RESULTS.md.
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
"$KT" agent --server "$ADDR" --listen 127.0.0.42:0 --cache-dir "$WORK/cache" \
    --socket "$WORK/agent.sock" --node-id abused --heartbeat-secs 1 --token-file "$WORK/token" \
    >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 100); do grep -q listening "$WORK/agent.log" && break; sleep 0.1; done
AGENT_ADDR=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$WORK/agent.log" | head -1)
rss() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$1/status"; }
head -c 256M /dev/urandom >"$WORK/data"
"$KT" put data --src "$WORK/data" >/dev/null
KT_AGENT=$WORK/agent.sock "$KT" put local-data --src "$WORK/data" --locale local >/dev/null
get_time() { # KEY
    rm -rf "$WORK/got"
    /usr/bin/time -f "%e" -o "$WORK/get.time" "$KT" get "$1" --dest "$WORK/got" >/dev/null
    cat "$WORK/get.time"
}
# Abuses ADDR (the data port of process PID) while KEY is got: "kept rss_before rss_during
# rss_after alone during".
abuse() { # ADDR PID KEY
    rm -f "$WORK/kept"
    local alone rss_before rss_during during rss_after_get
    alone=$(get_time "$3")
    rss_before=$(rss "$2")
    python3 - "$1" "$WORK/kept" <<'PY' >/dev/null &
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
    local abuser=$!
    for _ in $(seq 300); do [[ -s $WORK/kept ]] && break; sleep 0.1; done
    rss_during=$(rss "$2")
    during=$(get_time "$3")
    rss_after_get=$(rss "$2")
    kill $abuser 2>/dev/null; wait $abuser 2>/dev/null || true
    echo "$(cat "$WORK/kept") $rss_before $rss_during $rss_after_get $alone $during"
}
row() { # WHAT "kept rss_before rss_during rss_after alone during"
    set -- "$1" $2
    echo "| $1 | $2 of 2,008 | $3 / $4 / $5 MiB | $6 s / $7 s | $(python3 -c "print('%.2fx' % ($7 / $6))") |"
}
store=$(abuse "$ADDR" "$SERVER_PID" data)
agent=$(abuse "$AGENT_ADDR" "$AGENT_PID" local-data)
table="
### A caller with no ticket against a data port ($(date -u +%F), \`bash bench/abuse.sh\`)

From 127.0.0.3: 2,000 connections that send the hello and nothing more, and 8 that announce a
64 MiB upload (no ticket) and send 32 MiB of it. A caller with the token gets 256 MiB from the
abused server meanwhile (from the agent: a key it published in place, which only it serves).
Targets: at most 64 MiB more RSS, the get within 1.5x its time alone.

| abused | connections kept | RSS before / during / after the get | the get alone / during | ratio |
|---|---|---|---|---|
$(row "the store" "$store")
$(row "a node agent" "$agent")
"
echo "$table"
echo "$table" >>bench/RESULTS.md
