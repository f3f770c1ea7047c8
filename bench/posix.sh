#!/usr/bin/env bash
# POSIX conformance of a ktfs mount: runs pjdfstest (the suite of pjd/pjdfstest: every .t file
# under its tests/, with `prove`) inside a fresh `kt mount`, and the same suite on a tmpfs in the
# same run as the baseline, then prints each one's totals and the failing files of the mount.
#
#   PJDFSTEST=/path/to/a/built/pjdfstest bash bench/posix.sh [PATH_TO_KT]
#
# With PJDFSTEST_RS=/path/to/its/rust/port/target/release/pjdfstest (saidsay-so/pjdfstest,
# `rust/`, `cargo build --release`), that suite runs too, on both, with the opt-in features
# posix_fallocate, rename_ctime, utime_now and utimensat, and the users nobody:nogroup and
# daemon:daemon for its cases run as another user; PJDFSTEST=skip runs only it.
#
# The suite is not fetched here (no network for it in CI): build a checkout once with
# `autoreconf -ifs && ./configure && make pjdfstest` (apt: autoconf automake gcc) and point
# PJDFSTEST at it. Run as root: the suite switches uids and makes device nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
PJD=${PJDFSTEST:?set PJDFSTEST to a built pjdfstest checkout, or to skip}
PJD_RS=${PJDFSTEST_RS:-}
BIN=${1:-target/debug/kt}
IP=${KT_BENCH_IP:-127.0.0.248}
[[ $PJD == skip || -x $PJD/pjdfstest ]] || { echo "no $PJD/pjdfstest: build it first" >&2; exit 2; }
[[ -z $PJD_RS || -x $PJD_RS ]] || { echo "no $PJD_RS: build it first" >&2; exit 2; }
BIN=$(realpath "$BIN")
W=$(mktemp -d /tmp/kt-posix.XXXX)
# mktemp makes it 0700: the cases run as another user must reach through it, as they would
# through any directory users share (under 0700 the Rust port fails 23 cases on tmpfs too).
chmod 755 "$W"
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
# The Rust port in DIR; its summary line and failed case names in $W/NAME-rs.out.
suite_rs() { # NAME DIR
    cat >"$W/pjdfstest.toml" <<'EOF'
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
EOF
    mkdir -p "$2/rs"
    (cd "$2/rs" && "$PJD_RS" -c "$W/pjdfstest.toml" -p "$2/rs" > "$W/$1-rs.full" 2>&1) || true
    grep -E '^Summary:|FAILED$' "$W/$1-rs.full" > "$W/$1-rs.out" || true
}
if [[ -n $PJD_RS ]]; then
    suite_rs tmpfs "$W/tmpfs"
    suite_rs ktfs "$W/mnt"
    echo "pjdfstest's Rust port ($("$PJD_RS" --version 2>/dev/null || echo '?')), kt $(git rev-parse --short HEAD)"
    echo
    echo '| file system | test cases | failed | skipped | passed |'
    echo '|---|---|---|---|---|'
    for fs in tmpfs ktfs; do
        sed -nE "s/^Summary: ([0-9]+) failed, ([0-9]+) skipped, ([0-9]+) passed.* ([0-9]+) total/| $fs | \4 | \1 | \2 | \3 |/p" "$W/$fs-rs.out"
    done
    echo
    echo "Failing on ktfs:"
    grep FAILED "$W/ktfs-rs.out" | awk '{ print "- " $1 }' || echo "- none"
    echo
fi
[[ $PJD == skip ]] && exit 0

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
