#!/usr/bin/env bash
# What per-namespace block references cost (issue 42): the rebuild a store does when it first
# starts with authentication, against reading its keys back (`kt ls -r`); the store's disk when
# the same 100 MiB is put in two namespaces; and the hashing an agent does of the files a caller
# registers in place, against reading them (`cat`). Appends its table to bench/RESULTS.md.
#
#   bash bench/refs.sh            # KT=path/to/kt (default target/debug/kt)
set -euo pipefail
cd "$(dirname "$0")/.."
KT=${KT:-$PWD/target/debug/kt}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
FILES=${KT_BENCH_REFS_FILES:-20000}
KEYS=${KT_BENCH_REFS_KEYS:-200}

# Starts `kt server` on 127.0.0.44 with the flags given, logging to $WORK/server.log.
serve() {
    RUST_LOG=info "$KT" server --listen 127.0.0.44:0 --data-dir "$WORK/store" "$@" >"$WORK/server.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do grep -q listening "$WORK/server.log" && break; sleep 0.1; done
    export KT_SERVER=$(sed -n 's/.*listening on //p' "$WORK/server.log" | head -1)
}
export KT_AGENT=$WORK/none.sock

# A store without authentication: a tree of $FILES files of 4 KiB in one key, 100 MiB in 4 MiB
# blocks, and $KEYS single-file keys, in namespace tenant-a.
serve
mkdir -p "$WORK/tree"
python3 - "$WORK/tree" "$FILES" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    sub = os.path.join(d, "d%03d" % (i % 100))
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, "f%06d" % i), "wb") as f:
        f.write(os.urandom(4096))
PY
head -c 100M /dev/urandom >"$WORK/big"
"$KT" put tree --src "$WORK/tree" -c -n tenant-a >/dev/null
"$KT" put big --src "$WORK/big" -n tenant-a >/dev/null
echo one >"$WORK/one"
for i in $(seq "$KEYS"); do "$KT" put "k/$i" --src "$WORK/one" -n tenant-a >/dev/null; done
kill $SERVER; wait $SERVER 2>/dev/null || true

# The same store with authentication: references rebuilt once, before it serves.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/token"
export KT_TOKEN_FILE=$WORK/token
serve --token-file "$WORK/token"
for _ in $(seq 600); do grep -q "rebuilt the namespaces" "$WORK/server.log" && break; sleep 0.1; done
rebuild=$(grep "rebuilt the namespaces" "$WORK/server.log" | sed 's/\x1b\[[0-9;]*m//g')
hwm() { awk '/VmHWM/ {printf "%d MiB", $2 / 1024}' "/proc/$1/status"; }
server_rss=$(hwm $SERVER)
rebuild_ms=$(echo "$rebuild" | sed -n 's/.* ms=\([0-9]*\).*/\1/p')
references=$(echo "$rebuild" | sed -n 's/.*references=\([0-9]*\).*/\1/p')
keys=$(echo "$rebuild" | sed -n 's/.* keys=\([0-9]*\).*/\1/p')
s=$(date +%s.%N)
"$KT" ls -r -n tenant-a >/dev/null
ls_ms=$(python3 -c "import time; print('%.0f' % ((time.time() - $s) * 1000))")

# The same 100 MiB in a second namespace: uploaded whole again, kept once.
before=$(du -sk "$WORK/store" | cut -f1)
put_b=$("$KT" put big --src "$WORK/big" -n tenant-b --json)
after=$(du -sk "$WORK/store" | cut -f1)
sent_b=$(echo "$put_b" | python3 -c "import json,sys; print(json.load(sys.stdin)['bytes_transferred'])")

# An agent publishing 512 MiB in place hashes it once more (the client hashed it to make the
# manifest); `cat` of the same file from the page cache is the baseline.
RUST_LOG=info "$KT" agent --server "$KT_SERVER" --listen 127.0.0.45:0 --cache-dir "$WORK/cache" \
    --socket "$WORK/agent.sock" --node-id n1 --heartbeat-secs 1 --token-file "$WORK/token" \
    >"$WORK/agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 100); do grep -q listening "$WORK/agent.log" && break; sleep 0.1; done
head -c 512M /dev/urandom >"$WORK/local"
cat "$WORK/local" >/dev/null
s=$(date +%s.%N)
cat "$WORK/local" >/dev/null
cat_ms=$(python3 -c "import time; print('%.0f' % ((time.time() - $s) * 1000))")
s=$(date +%s.%N)
KT_AGENT=$WORK/agent.sock "$KT" put local --src "$WORK/local" --locale local -n tenant-a >/dev/null
put_ms=$(python3 -c "import time; print('%.0f' % ((time.time() - $s) * 1000))")
agent_rss=$(hwm $AGENT)
registered_ms=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/agent.log" | sed -n 's/.*published in place.*registered_ms=\([0-9]*\).*/\1/p' | tail -1)

table="
### Per-namespace block references ($(date -u +%F), \`bash bench/refs.sh\`)

| what | figure | baseline | ratio | peak RSS |
|---|---|---|---|---|
| rebuild at the first start with authentication: $keys keys, $references references | ${rebuild_ms} ms | \`kt ls -r\` of the namespace ${ls_ms} ms | $(python3 -c "print('%.2fx' % ($rebuild_ms / max($ls_ms, 1)))") | server $server_rss |
| the same 100 MiB put in a second namespace: store grows by | $(( (after - before) / 1024 )) MiB (sent $(( sent_b >> 20 )) MiB) | 100 MiB the first time | $(python3 -c "print('%.3fx' % (($after - $before) / 1024 / 100))") of one copy's bytes | |
| agent's hashing of 512 MiB registered in place | ${registered_ms} ms (the whole \`kt put --locale local\`: ${put_ms} ms) | \`cat\` of the file from the page cache ${cat_ms} ms | $(python3 -c "print('%.2fx' % ($registered_ms / max($cat_ms, 1)))") | agent $agent_rss |
"
echo "$table"
echo "$table" >>bench/RESULTS.md
