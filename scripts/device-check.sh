#!/usr/bin/env bash
# The device check: runs kt-gpu-check (crates/gpu-check) on a GPU machine and keeps what it
# found under $OUT: gpu-check.json (its report), gpu-check.stderr, nvidia-smi.txt and
# nvidia-smi-topo.txt. Exits with kt-gpu-check's status: 0 every check passed, 1 one failed,
# 2 no CUDA here, 124 it ran past the timeout.
#
#   OUT=/tmp/out bash scripts/device-check.sh [PATH/TO/kt-gpu-check] [-- CHECK ARGS...]
#
# Without a path it takes target/{release,debug}/kt-gpu-check, or builds it when cargo is
# there. KT_GPU_CHECK_TIMEOUT (seconds, default 420) bounds the whole run.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory for the results}"
mkdir -p "$OUT"

bin=
if [[ $# -gt 0 && $1 != -- ]]; then bin=$1; shift; fi
if [[ ${1:-} == -- ]]; then shift; fi
if [[ -z $bin ]]; then
    for b in target/release/kt-gpu-check target/debug/kt-gpu-check; do
        [[ -x $b ]] && bin=$b && break
    done
fi
if [[ -z $bin ]] && command -v cargo >/dev/null; then
    cargo build --release --offline -p gpu-check >&2 && bin=target/release/kt-gpu-check
fi
[[ -x $bin ]] || { echo "device-check: no kt-gpu-check binary (give its path)" >&2; exit 1; }

{ nvidia-smi && nvidia-smi -L; } >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >&2
nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1 || true

timeout --kill-after=15 "${KT_GPU_CHECK_TIMEOUT:-420}" "$bin" "$@" \
    >"$OUT/gpu-check.json" 2>"$OUT/gpu-check.stderr"
status=$?
cat "$OUT/gpu-check.json"
tail -n 20 "$OUT/gpu-check.stderr" >&2
echo "device-check: kt-gpu-check exited $status" >&2
exit "$status"
