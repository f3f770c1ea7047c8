#!/usr/bin/env bash
# Listings of a million keys (issue 44): KEYS one-byte keys under one prefix, published in
# batches by the load generator (bench/load.rs) to the single RocksDB server, read back by
# `kt ls -r` in pages; then the same store migrated into etcd (data on /dev/shm) and a
# file:// object store (`kt server migrate`) and read back by a server over them, in the same
# run. Reports each listing's time, its largest answer (the load generator's own paged read),
# each server's peak RSS, and the rate of publishes on either (PUBLISHES more keys).
#
#   bash bench/list.sh        # KT=path/to/kt LOAD=path/to/load (default target/debug/...)
#                             # KT_BENCH_LIST_KEYS (default 1000000)
#                             # KT_BENCH_LIST_PUBLISHES (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
KT=${KT:-$PWD/target/debug/kt}
LOAD=${LOAD:-$PWD/target/debug/examples/load}
KEYS=${KT_BENCH_LIST_KEYS:-1000000}
PUBLISHES=${KT_BENCH_LIST_PUBLISHES:-2000}
WORK=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK" "$SHM"' EXIT
export KT_AGENT=$WORK/none.sock
hwm() { awk '/VmHWM/ {printf "%d MiB", $2 / 1024}' "/proc/$1/status"; }
now() { date +%s.%N; }
since() { python3 -c "import time; print('%.1f' % (time.time() - $1))"; }

# Starts a server (flags as given) and sets SERVER and ADDR.
serve() { # NAME FLAGS...
    local name=$1; shift
    RUST_LOG=warn,ktfs=info "$KT" server --listen 127.0.0.131:0 --data-dir "$WORK/$name" "$@" \
        >"$WORK/$name.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 200); do grep -q listening "$WORK/$name.log" && break; sleep 0.1; done
    ADDR=$(sed -n 's/.*listening on //p' "$WORK/$name.log" | head -1)
}

# Lists prefix big of the server at ADDR: prints "seconds|pages|largest KiB".
list() {
    local s n out
    s=$(now)
    n=$(KT_SERVER=$ADDR "$KT" ls -r big | wc -l)
    local took
    took=$(since "$s")
    [ "$n" = "$KEYS" ] || { echo "kt ls -r listed $n of $KEYS" >&2; exit 1; }
    out=$("$LOAD" list "$ADDR" default big)
    echo "$took|$(echo "$out" | sed -n 's/.*pages=\([0-9]*\).*/\1/p')|$(( $(echo "$out" | sed -n 's/.*largest_answer_bytes=\([0-9]*\).*/\1/p') / 1024 ))"
}

# Publishes PUBLISHES keys under prefix fresh: prints the rate a second.
rate() {
    "$LOAD" publish "$ADDR" default fresh "$PUBLISHES" | sed -n 's/.*per_second=\([0-9]*\).*/\1/p'
}

etcd --name kt --data-dir "$SHM/etcd" --listen-client-urls http://127.0.0.131:23790 \
    --advertise-client-urls http://127.0.0.131:23790 --listen-peer-urls http://127.0.0.131:23800 \
    --initial-advertise-peer-urls http://127.0.0.131:23800 \
    --initial-cluster kt=http://127.0.0.131:23800 --heartbeat-interval 250 \
    --election-timeout 2500 --quota-backend-bytes 8589934592 >"$WORK/etcd.log" 2>&1 &
for _ in $(seq 100); do grep -q "ready to serve client requests" "$WORK/etcd.log" && break; sleep 0.1; done

serve rocks
s=$(now)
"$LOAD" publish "$ADDR" default big "$KEYS" >&2
fill=$(since "$s")
IFS='|' read -r r_ls r_pages r_largest <<<"$(list)"
r_rss=$(hwm $SERVER)
r_rate=$(rate)
kill $SERVER; wait $SERVER 2>/dev/null || true

META=etcd://127.0.0.131:23790/bench
BLOCKS=file://$WORK/objects
mkdir -p "$WORK/objects"
s=$(now)
"$KT" server migrate --from "$WORK/rocks" --meta "$META" --blocks "$BLOCKS" >&2
migrate=$(since "$s")
serve etcd --meta "$META" --blocks "$BLOCKS"
IFS='|' read -r e_ls e_pages e_largest <<<"$(list)"
e_rss=$(hwm $SERVER)
e_rate=$(rate)
ratio() { python3 -c "print('%.2fx' % ($1 / max($2, 0.001)))"; }

table="
### Listings in pages: $KEYS keys under one prefix ($(date -u +%F), \`bash bench/list.sh\`)

Filled by $KEYS publishes in batches of 256 to the RocksDB server (${fill} s), then migrated
into etcd and a file:// object store by \`kt server migrate\` (${migrate} s).

| server | \`kt ls -r\` of them | ratio to RocksDB | pages | largest answer | server peak RSS | publishes a second (batches of 256, $PUBLISHES more keys) |
|---|---|---|---|---|---|---|
| single, RocksDB | ${r_ls} s | 1.00x | $r_pages | ${r_largest} KiB | $r_rss | $r_rate |
| over etcd (one member, /dev/shm) | ${e_ls} s | $(ratio "$e_ls" "$r_ls") | $e_pages | ${e_largest} KiB | $e_rss | $e_rate |
"
echo "$table"
echo "$table" >>bench/RESULTS.md
