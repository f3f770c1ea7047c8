#!/usr/bin/env bash
# The device check's second part: the whole tensor path on a GPU machine. A `kt server`, an agent
# and two `kt mount`s (FUSE) on loopback addresses, and torch in separate processes putting and
# getting CUDA state dicts through the mounts' /kt/.gpu control files (python/tests/test_cuda.py,
# then python/tests/test_tensors.py for host buffers on the same machine). Keeps under $OUT:
# stack.log (pytest's output), cuda-rate.jsonl (the rates of the large gets, beside a
# device-to-device copy) and stack-env.txt (FUSE, the Python found, and the communicators the
# workers' NCCL formed, from its debug logs). With NCCL found (KT_NCCL_LIBRARY or where pip and
# distributions put it), the windows of one member per node must go over NCCL: each mount is
# its own host to NCCL (conftest.py), over sockets, since both ranks share the one GPU; and so
# must a window whose getter runs in PID, IPC and mount namespaces of its own (as a pod's
# process does: its worker enters them and loads the getter's NCCL from there), and a GET without
# a window between GPU buffers (a communicator of the two workers, formed by the first GET only).
#
#   OUT=/tmp/out KT_BIN=path/to/kt bash scripts/device-stack.sh path/to/ktfs-*.whl
#
# Built elsewhere and carried: `kt` (a release build; with its shared libraries on
# LD_LIBRARY_PATH where the machine lacks them) and the package's wheel. Needs root, FUSE in the
# kernel, and a python3 with torch. KT_STACK_TIMEOUT (seconds, default 300) bounds the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory for the results}"
: "${KT_BIN:?set KT_BIN to the kt binary}"
wheel=${1:?give the ktfs wheel}
mkdir -p "$OUT"

{
    echo "kernel: $(uname -r)"
    grep -w fuse /proc/filesystems || echo "fuse: not in /proc/filesystems"
    ls -l /dev/fuse 2>&1
    python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count())' 2>&1
} >"$OUT/stack-env.txt"

# A kernel with FUSE but no device node (a bare VM image): make the node.
if [[ ! -e /dev/fuse ]]; then
    modprobe fuse 2>/dev/null || true
    mknod -m 666 /dev/fuse c 10 229 2>>"$OUT/stack-env.txt" || true
fi
if ! grep -qw fuse /proc/filesystems; then
    echo "device-stack: this kernel has no FUSE; the stack cannot be checked here" >&2
    exit 3
fi

site=$(mktemp -d /tmp/kt-site.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" \
    || { echo "device-stack: the wheel did not install" >&2; exit 1; }

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" KT_BIN PYTHONUNBUFFERED=1
export KT_CUDA_REPORT="$OUT/cuda-rate.jsonl"
nccl_logs=$(mktemp -d /tmp/kt-nccl-logs.XXXXXX)
export NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$nccl_logs/nccl.%h.%p" NCCL_SOCKET_IFNAME=lo
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
if [[ -n ${KT_NCCL_LIBRARY:-} ]] || compgen -G "/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2" >/dev/null; then
    export KT_EXPECT_NCCL=1
fi
timeout --kill-after=15 "${KT_STACK_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
    -o addopts= python/tests/test_cuda.py python/tests/test_tensors.py >"$OUT/stack.log" 2>&1
status=$?
{
    echo "NCCL debug logs: $(find "$nccl_logs" -type f | wc -l) files"
    grep -h "Init COMPLETE\|NCCL WARN\|Bootstrap\|Using network" "$nccl_logs"/* 2>/dev/null | head -40
} >>"$OUT/stack-env.txt"
tail -n 40 "$OUT/stack.log"
[[ -s $KT_CUDA_REPORT ]] && cat "$KT_CUDA_REPORT"
echo "device-stack: pytest exited $status" >&2
exit "$status"
