#!/usr/bin/env bash
# One tenant's work against another's publishes (issue 42): a 1-byte publish in namespace B,
# timed as a whole `kt put` process, alone, while namespace A puts 1 GiB of fresh bytes, and
# while A publishes keys of 256 segments one after another; and the publish of a key of 256
# segments against one of 2. Appends its table to bench/RESULTS.md.
#
#   bash bench/tenants.sh            # KT=path/to/kt (default target/debug/kt)
set -euo pipefail
cd "$(dirname "$0")/.."
KT=${KT:-$PWD/target/debug/kt}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
"$KT" server --listen 127.0.0.41:0 --data-dir "$WORK/store" >"$WORK/server.log" 2>&1 &
for _ in $(seq 100); do grep -q listening "$WORK/server.log" && break; sleep 0.1; done
export KT_SERVER=$(sed -n 's/.*listening on //p' "$WORK/server.log") KT_AGENT=$WORK/none.sock
echo x >"$WORK/one"
deep=$(python3 -c "print('/'.join(['a'] * 254))")

# Latencies of 1-byte publishes in namespace tenant-b for SECONDS: "n median p99 max" (ms).
publishes() {
    python3 - "$1" "$KT" "$WORK/one" <<'PY'
import subprocess, sys, time, random
secs, kt, src = float(sys.argv[1]), sys.argv[2], sys.argv[3]
lat, t0 = [], time.time()
while time.time() - t0 < secs:
    key = "b%d" % random.getrandbits(40)
    s = time.time()
    subprocess.run([kt, "put", key, "--src", src, "-n", "tenant-b"], stdout=subprocess.DEVNULL, check=True)
    lat.append((time.time() - s) * 1000)
lat.sort()
print(len(lat), "%.0f %.0f %.0f" % (lat[len(lat) // 2], lat[int(len(lat) * .99)], lat[-1]))
PY
}
# Latencies of publishes of keys of DEPTH segments: "n median p99 max" (ms).
deep_publishes() {
    python3 - "$KT" "$WORK/one" "$1" <<'PY'
import subprocess, sys, random
kt, src, depth = sys.argv[1], sys.argv[2], int(sys.argv[3])
lat = []
import time
for _ in range(30):
    key = "/".join(["d%d" % random.getrandbits(40)] + ["a"] * (depth - 2) + ["f"])[: 16000]
    s = time.time()
    subprocess.run([kt, "put", key, "--src", src], stdout=subprocess.DEVNULL, check=True)
    lat.append((time.time() - s) * 1000)
lat.sort()
print(len(lat), "%.0f %.0f %.0f" % (lat[len(lat) // 2], lat[int(len(lat) * .99)], lat[-1]))
PY
}

# The store's own time per publish (its histogram), in buckets, counted since the last call:
# "<=5ms <=10ms <=50ms <=100ms more".
SCRAPED=
server_share() {
    local now
    now=$(curl -s "http://$KT_SERVER/metrics" | sed -n 's/^kt_store_publish_seconds_bucket{le="\([^"]*\)"} \(.*\)/\1 \2/p')
    python3 - "$SCRAPED" "$now" <<'PY'
import sys
def parse(t): return {l.split()[0]: float(l.split()[1]) for l in t.splitlines() if l.strip()}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
d = {k: b[k] - a.get(k, 0) for k in b}
edges = ["0.005", "0.01", "0.05", "0.1", "+Inf"]
prev, out = 0, []
for e in edges:
    out.append("%d" % (d.get(e, 0) - prev)); prev = d.get(e, 0)
print(" ".join(out))
PY
    SCRAPED=$now
}
alone=$(publishes 3)
head -c 1G /dev/urandom >"$WORK/big"
server_share >/dev/null
/usr/bin/time -f "%e" -o "$WORK/big.time" "$KT" put big --src "$WORK/big" -n tenant-a >/dev/null &
during=$(publishes 3)
wait %2 2>/dev/null || wait
during_server=$(server_share)
# A publishes 256-deep keys back to back (two at once) while B's publishes are timed.
deep_loop() {
    python3 - "$KT" "$WORK/one" "$1" <<'PY'
import subprocess, sys, random, time
kt, src, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
n, t0 = 0, time.time()
while time.time() - t0 < secs:
    key = "/".join(["d%d" % random.getrandbits(40)] + ["a"] * 254 + ["f"])
    subprocess.run([kt, "put", key, "--src", src, "-n", "tenant-a"], stdout=subprocess.DEVNULL, check=True)
    n += 1
print(n)
PY
}
deep_loop 4 >"$WORK/deep1" &
d1=$!
deep_loop 4 >"$WORK/deep2" &
d2=$!
sleep 0.5
during_deep=$(publishes 3)
wait "$d1" "$d2"
deep_count=$(($(cat "$WORK/deep1") + $(cat "$WORK/deep2")))
flat=$(deep_publishes 2)
deep=$(deep_publishes 256)
deeper=$("$KT" put "$(python3 -c "print('/'.join(['a'] * 257))")" --src "$WORK/one" 2>&1 || true)

table="
### Tenants: one namespace's publishes while another works ($(date -u +%F), \`bash bench/tenants.sh\`)

Every figure is a whole \`kt put\` process (start-up included), in ms: count, median, p99, max.

| what | n | median | p99 | max |
|---|---|---|---|---|
| 1-byte publish in B, alone | $(echo "$alone" | tr ' ' '|') |
| 1-byte publish in B, while A puts 1 GiB ($(cat "$WORK/big.time") s) | $(echo "$during" | tr ' ' '|') |
| 1-byte publish in B, while A publishes keys of 256 segments, two at a time ($deep_count in 4 s) | $(echo "$during_deep" | tr ' ' '|') |
| publish of a key of 2 segments | $(echo "$flat" | tr ' ' '|') |
| publish of a key of 256 segments | $(echo "$deep" | tr ' ' '|') |

A key of 257 segments: \`$(echo "$deeper" | head -1)\`

The store's own time for the publishes while A put 1 GiB (B's and A's one, from its
\`kt_store_publish_seconds\` histogram): up to 5 ms, 5-10, 10-50, 50-100, over 100 ms:
$(echo "$during_server" | tr ' ' '/').
"
echo "$table"
echo "$table" >>bench/RESULTS.md
