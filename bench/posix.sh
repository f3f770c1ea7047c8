#!/usr/bin/env bash
# POSIX conformance of a ktfs mount: runs pjdfstest (the suite of pjd/pjdfstest: every .t file
# under its tests/, with `prove`) inside a fresh `kt mount`, and the same suite on a tmpfs in the
# same run as the baseline, then prints each one's totals and the failing files of the mount.
#
#   PJDFSTEST=/path/to/a/built/pjdfstest bash bench/posix.sh [PATH_TO_KT]
#
# The suite is not fetched here (no network for it in CI): build a checkout once with
# `autoreconf -ifs && ./configure && make pjdfstest` (apt: autoconf automake gcc) and point
# PJDFSTEST at it. Run as root: the suite switches uids and makes device nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
PJD=${PJDFSTEST:?set PJDFSTEST to a built pjdfstest checkout}
BIN=${1:-target/debug/kt}
IP=${KT_BENCH_IP:-127.0.0.248}
[[ -x $PJD/pjdfstest ]] || { echo "no $PJD/pjdfstest: build it first" >&2; exit 2; }
BIN=$(realpath "$BIN")
W=$(mktemp -d /tmp/kt-posix.XXXX)
mkdir -p "$W/mnt" "$W/tmpfs"
cleanup() {
    kill "${MP:-}" 2>/dev/null || true
    wait "${MP:-}" 2>/dev/null || true
    kill "${SP:-}" 2>/dev/null || true
    wait 2>/dev/null || true
    umount -l "$W/mnt" 2>/dev/null || true
    umount -l "$W/tmpfs" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
ready() { for _ in $(seq 200); do grep -q "listening on" "$1" && return; sleep 0.05; done; exit 1; }
"$BIN" server --listen "$IP:0" --data-dir "$W/store" > "$W/server.log" 2>&1 &
SP=$!
ready "$W/server.log"
ADDR=$(grep -o "listening on [0-9.:]*" "$W/server.log" | cut -d' ' -f3)
"$BIN" mount "$W/mnt" --server "$ADDR" --listen "$IP:0" --cache-dir "$W/cache" \
    --socket "$W/agent.sock" --node-id posix > "$W/mount.log" 2>&1 &
MP=$!
ready "$W/mount.log"
mount -t tmpfs -o size=256m tmpfs "$W/tmpfs"

# One run of the suite in DIR; its output in $W/NAME.out.
suite() { # NAME DIR
    mkdir -p "$2/t"
    (cd "$2/t" && prove -r "$PJD/tests" > "$W/$1.out" 2>&1) || true
}
summary() { # NAME
    local out=$W/$1.out files tests failed
    # (grep finds nothing where nothing failed: not an error here.)
    files=$(grep -oE 'Files=[0-9]+' "$out" | cut -d= -f2 || true)
    tests=$(grep -oE 'Tests=[0-9]+' "$out" | cut -d= -f2 || true)
    failed=$(grep -oE 'Failed: [0-9]+\)' "$out" | tr -dc '0-9\n' | awk '{ s += $1 } END { print s + 0 }' || true)
    printf '| %s | %s | %s | %s | %s |\n' "$1" "$files" "$tests" "$failed" "$(grep -oE '^Result: \S+' "$out" | cut -d' ' -f2 || true)"
}
START=$(date +%s)
suite tmpfs "$W/tmpfs"
T_TMPFS=$(( $(date +%s) - START ))
START=$(date +%s)
suite ktfs "$W/mnt"
T_KTFS=$(( $(date +%s) - START ))

echo "pjdfstest $(git -C "$PJD" rev-parse --short HEAD 2>/dev/null || echo '?'), kt $(git rev-parse --short HEAD)"
echo
echo '| file system | test files | test cases | failed cases | result |'
echo '|---|---|---|---|---|'
summary tmpfs
summary ktfs
echo
echo "time: tmpfs ${T_TMPFS} s, ktfs ${T_KTFS} s"
echo
echo "Failing on ktfs (prove's summary: each file, then its failed case numbers):"
sed -n '/^Test Summary Report/,/^Files=/p' "$W/ktfs.out" | sed -e '1,2d' -e '$d' -e "s|$PJD/tests/||"
if [[ -n ${KT_POSIX_KEEP:-} ]]; then
    cp "$W/ktfs.out" "$W/tmpfs.out" "$KT_POSIX_KEEP"/
fi
