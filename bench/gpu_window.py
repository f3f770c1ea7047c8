#!/usr/bin/env python3
"""The driver of bench/gpu.sh: moves a state dict held in /dev/shm between `kt mount` nodes through
their /kt/.gpu control files, with the ctypes ABI of python/ktfs/gpu_abi.py (no extension
needed), and prints what it measured as one JSON line. doc/gpu-abi.md describes the protocol.

    gpu_window.py hold   --mount DIR --prefix P              keep the node's worker alive
    gpu_window.py window --putter DIR --getters DIR,DIR,... --src FILE --mib N --key K
                         --fanout F [--pack] [--pids NAME=PID,...]
    gpu_window.py p2p    --putter DIR --getters DIR --src FILE --mib N --key K [--pids ...]
    gpu_window.py pairs  --pairs PUT:GET,PUT:GET,... --src FILE --mib N --key K [--window]
                         [--pack] [--pids ...]

`hold` publishes a one-entry key from the node's mount and waits (until SIGTERM):
a node's transfer worker lives while it holds a registration, so with a holder on every node
the measured transfers find their workers running (see the harness).

`window`: every member opens its control file and writes the table first; the clock starts right
before the first KT_GPU_JOIN (the getters join and commit first, the putter last, so the quorum
closes on the putter's JOIN) and stops when the last getter's transfer is DONE. Each getter
receives into its own /dev/shm file, created empty (sparse) for the run; after the clock
stopped, every getter's bytes are compared with the source's (the run fails if one differs).

`p2p`: the putter publishes without a window (the clock is not running: a PUT outside a window
is done once it is registered); then one getter opens, writes its table, and the clock runs
from its KT_GPU_GET to its DONE.

`pairs`: shard i (key K-i, the bytes of --src) goes from the i-th pair's putter to its getter.
With --window, all of them are members of one window (world size: every putter and getter) of
several keys, the getters joining and committing first; the clock runs from the first JOIN to the
last getter's DONE. Without, the putters publish first (untimed), then every getter's GET starts
at once: the same transfers as separate point-to-point ones, the clock from the first GET to the
last DONE.

While the clock runs, every getter's /dev/shm file is looked at every --sample-ms (default 20):
the moments its first bytes and half its bytes had landed (its blocks, allocated as they are
written; STATUS reports bytes_done only at the end) show whether the chain or tree is pipelined
(every getter starts within moments of the first) or store-and-forward (each starts when its
parent is done).
--pids names processes (mounts, workers) whose peak RSS (VmHWM, reset right before the clock
starts) and CPU seconds over the timed interval are reported; the machine's busy CPU-seconds
over it too.
"""

import argparse
import ctypes
import errno
import fcntl
import json
import mmap
import os
import select
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
try:
    from ktfs import gpu_abi as abi  # works once the extension is built
except ImportError:
    # ktfs/__init__.py imports the native extension; the ABI module itself is plain ctypes.
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "ktfs_gpu_abi", os.path.join(HERE, "..", "python", "ktfs", "gpu_abi.py")
    )
    abi = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(abi)

# (dtype, bytes per element), cycled over the entries: a state dict of mixed dtypes.
DTYPES = [("float32", 4), ("bfloat16", 2), ("int64", 8), ("uint8", 1), ("float16", 2)]
HZ = os.sysconf("SC_CLK_TCK")


def table(total: int, entries: int):
    """The table JSON and each entry's size: `entries` entries of total/entries bytes each."""
    each = total // entries
    if each * entries != total or each % 8192:
        sys.exit(f"{total} bytes do not split into {entries} entries of a multiple of 8 KiB")
    rows, sizes = [], []
    for i in range(entries):
        dtype, size = DTYPES[i % len(DTYPES)]
        cols = 1024
        rows.append({"name": f"layer{i}.weight", "dtype": dtype, "shape": [each // size // cols, cols]})
        sizes.append(each)
    return json.dumps({"entries": rows}).encode(), sizes


def open_control(mount: str, key: str, create: bool) -> int:
    path = os.path.join(mount, ".gpu", key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)


def write_table(fd: int, data: bytes):
    n = os.write(fd, data)
    if n != len(data):
        sys.exit(f"short write of the table: {n} of {len(data)}")


def ioctl(fd: int, cmd: int, arg) -> int:
    return fcntl.ioctl(fd, cmd, arg, True)


def commit(fd: int, cmd: int, shm_name: str, sizes) -> int:
    """PUT or GET of every entry, laid out one after the other in /dev/shm/`shm_name`, in batches
    of abi.BATCH; returns the transfer id (the last batch's, which commits)."""
    handle = shm_name.encode()
    assert len(handle) < 64, shm_name
    at, t = 0, 0
    for start in range(0, len(sizes), abi.BATCH):
        chunk = sizes[start : start + abi.BATCH]
        b = abi.Buffers()
        b.version = abi.ABI_VERSION
        b.count = len(chunk)
        b.flags = abi.COMMIT if start + len(chunk) == len(sizes) else 0
        for i, n in enumerate(chunk):
            e = b.buffers[i]
            e.kind = abi.BUF_HOST_SHM
            e.device = -1
            e.entry = start + i
            e.offset = at
            e.nbytes = n
            ctypes.memmove(e.handle, handle, len(handle))
            at += n
        t = ioctl(fd, cmd, b)
    return t


def join(fd: int, world: int, fanout: int, flags: int, group: str, timeout_ms: int = 0):
    w = abi.Window()
    w.version = abi.ABI_VERSION
    w.world_size = world
    w.timeout_ms = timeout_ms
    w.fanout = fanout
    w.flags = flags
    w.group_id = group.encode()
    ioctl(fd, abi.JOIN, w)


def status(fd: int, transfer: int):
    s = abi.Status()
    s.transfer = transfer
    ioctl(fd, abi.STATUS, s)
    return s


def describe(s) -> str:
    names = {abi.PENDING: "PENDING", abi.RUNNING: "RUNNING", abi.DONE: "DONE", abi.FAILED: "FAILED"}
    msg = s.message.decode(errors="replace")
    return f"{names.get(s.state, s.state)} errno {s.error} ({errno.errorcode.get(s.error, '?')}): {msg}"


def busy_ticks() -> int:
    with open("/proc/stat") as f:
        v = f.readline().split()
    return sum(int(v[i]) for i in (1, 2, 3, 6, 7, 8))


def proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / HZ
    except OSError:
        return float("nan")


def proc_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def reset_hwm(pid: int):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def parse_pids(s: str):
    out = {}
    for part in filter(None, (s or "").split(",")):
        name, pid = part.split("=")
        out[name] = int(pid)
    return out


def make_dst(prefix: str, tag: str, size: int) -> str:
    name = f"{prefix}-{tag}"
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(size)  # sparse: its pages are allocated as the bytes land, as socat's are
    return name


def same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if os.fstat(fa.fileno()).st_size != os.fstat(fb.fileno()).st_size:
            return False
        ma = mmap.mmap(fa.fileno(), 0, prot=mmap.PROT_READ)
        mb = mmap.mmap(fb.fileno(), 0, prot=mmap.PROT_READ)
        step = 64 << 20
        try:
            return all(ma[i : i + step] == mb[i : i + step] for i in range(0, len(ma), step))
        finally:
            ma.close()
            mb.close()


def wait_all(members, t0: float, sample_ms: int, limit_s: float):
    """Polls the members' control files until each transfer finished; records when each one's
    first bytes landed (sampled) and when it finished. `members`: dicts with fd, transfer."""
    p = select.poll()
    by_fd = {}
    for m in members:
        p.register(m["fd"], select.POLLIN)
        by_fd[m["fd"]] = m
        m.setdefault("first_byte_s", None)
        m.setdefault("half_s", None)
    left = len(members)
    deadline = t0 + limit_s
    tick = sample_ms if sample_ms > 0 else 1000
    while left:
        now = time.monotonic()
        if now > deadline:
            sys.exit("timed out waiting for the transfers: " + ", ".join(
                f"{m['name']}: {describe(status(m['fd'], m['transfer']))}" for m in members if "done_s" not in m))
        for fd, ev in p.poll(tick):
            m = by_fd[fd]
            if "done_s" in m:
                continue
            m["done_s"] = time.monotonic() - t0
            p.unregister(fd)
            left -= 1
        if sample_ms > 0:
            # STATUS says bytes_done only once a transfer is over, so progress is read off the
            # getter's own /dev/shm file: created sparse, its blocks are allocated as bytes land.
            now = time.monotonic() - t0
            for m in members:
                if m.get("sample") and "done_s" not in m:
                    landed = os.stat(f"/dev/shm/{m['dst']}").st_blocks * 512
                    if m["first_byte_s"] is None and landed > 0:
                        m["first_byte_s"] = round(now, 4)
                    if m.get("half_s") is None and landed >= m["total"] // 2:
                        m["half_s"] = round(now, 4)
    for m in members:
        s = status(m["fd"], m["transfer"])
        if s.state != abi.DONE:
            sys.exit(f"{m['name']}: {describe(s)}")
        m["bytes"] = s.bytes_done if s.bytes_done else s.bytes_total


def cmd_hold(a):
    name = f"{a.prefix}-hold-{os.getpid()}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.write(b"\0" * 8192)
    stop = lambda *_: (_ for _ in ()).throw(SystemExit(0))
    signal.signal(signal.SIGTERM, stop)
    try:
        data = json.dumps({"entries": [{"name": "x", "dtype": "uint8", "shape": [8192]}]}).encode()
        fd = open_control(a.mount, f"bench-hold/{os.path.basename(a.mount.rstrip('/'))}-{os.getpid()}", True)
        write_table(fd, data)
        t = commit(fd, abi.PUT, name, [8192])
        p = select.poll()
        p.register(fd, select.POLLIN)
        if not p.poll(30_000):
            sys.exit("the holder's PUT did not finish in 30 s")
        s = status(fd, t)
        if s.state != abi.DONE:
            sys.exit(f"the holder's PUT: {describe(s)}")
        print("held", flush=True)
        while True:
            signal.pause()  # until SIGTERM
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def measure_begin(pids):
    for pid in pids.values():
        reset_hwm(pid)
    return {n: proc_cpu(p) for n, p in pids.items()}, busy_ticks()


def measure_end(pids, cpu0, b0):
    b1 = busy_ticks()
    return {
        "machine_cpu_s": round((b1 - b0) / HZ, 2),
        "cpu_s": {n: round(proc_cpu(p) - cpu0[n], 2) for n, p in pids.items()},
        "hwm_kb": {n: proc_hwm_kb(p) for n, p in pids.items()},
    }


def verified(res, src, getters):
    """After the clock: checks every getter holds the source's bytes, then prints `res`."""
    for m in getters:
        if not same_bytes(src, f"/dev/shm/{m['dst']}"):
            sys.exit(f"{m['name']} on {m['mount']}: the received bytes differ from the source")
    res["verified"] = True
    print(json.dumps(res), flush=True)


def tidy(members, made):
    """Closes the members' control files and removes the /dev/shm files made for the run."""
    for m in members:
        try:
            os.close(m["fd"])
        except (OSError, KeyError):
            pass
    for n in made:
        try:
            os.unlink(f"/dev/shm/{n}")
        except OSError:
            pass


def cmd_transfer(a, windowed: bool):
    total = a.mib << 20
    if os.path.getsize(a.src) != total:
        sys.exit(f"{a.src} is not {a.mib} MiB")
    data, sizes = table(total, a.entries)
    getters = a.getters.split(",")
    if not windowed and len(getters) != 1:
        sys.exit("p2p takes one getter")
    src_name = os.path.basename(a.src)
    pids = parse_pids(a.pids)
    made = []
    members = []
    put = None
    try:
        for i, g in enumerate(getters):
            made.append(make_dst(a.prefix, f"dst{i}", total))
        flags = abi.PACK if a.pack else 0
        world = len(getters) + 1
        put = {"name": "putter", "fd": open_control(a.putter, a.key, True)}
        write_table(put["fd"], data)
        if windowed:
            for i, g in enumerate(getters):
                m = {"name": f"getter{i}", "mount": g, "dst": made[i], "sample": True, "total": total}
                m["fd"] = open_control(g, a.key, True)
                write_table(m["fd"], data)
                members.append(m)
            cpu0, b0 = measure_begin(pids)
            t0 = time.monotonic()
            for m in members:
                join(m["fd"], world, a.fanout, flags, a.key)
                m["transfer"] = commit(m["fd"], abi.GET, m["dst"], sizes)
            join(put["fd"], world, a.fanout, flags, a.key)
            put["transfer"] = commit(put["fd"], abi.PUT, src_name, sizes)
            wait_all(members + [put], t0, a.sample_ms, a.limit_s)
            elapsed = max(m["done_s"] for m in members)
        else:
            put["transfer"] = commit(put["fd"], abi.PUT, src_name, sizes)
            tp = time.monotonic()
            wait_all([put], tp, 0, a.limit_s)
            put_s = put["done_s"]
            m = {"name": "getter0", "mount": getters[0], "dst": made[0], "sample": True, "total": total}
            m["fd"] = open_control(getters[0], a.key, False)
            write_table(m["fd"], data)
            members.append(m)
            cpu0, b0 = measure_begin(pids)
            t0 = time.monotonic()
            m["transfer"] = commit(m["fd"], abi.GET, m["dst"], sizes)
            wait_all(members, t0, a.sample_ms, a.limit_s)
            elapsed = m["done_s"]
        res = measure_end(pids, cpu0, b0)
        res["seconds"] = round(elapsed, 4)
        res["bytes"] = total
        res["getters"] = [
            {k: m.get(k) for k in ("mount", "first_byte_s", "half_s", "done_s")} for m in members
        ]
        if windowed:
            res["putter_done_s"] = round(put["done_s"], 4)
        else:
            res["publish_s"] = round(put_s, 4)
        verified(res, a.src, members)
    finally:
        tidy(members + ([put] if put else []), made)


def cmd_pairs(a):
    total = a.mib << 20
    if os.path.getsize(a.src) != total:
        sys.exit(f"{a.src} is not {a.mib} MiB")
    data, sizes = table(total, a.entries)
    pairs = [p.split(":") for p in a.pairs.split(",")]
    src_name = os.path.basename(a.src)
    pids = parse_pids(a.pids)
    flags = abi.PACK if a.pack else 0
    world = 2 * len(pairs)
    made, getters, putters = [], [], []
    try:
        for i, (putter, getter) in enumerate(pairs):
            key = f"{a.key}-{i}"
            made.append(make_dst(a.prefix, f"pair{i}", total))
            put = {"name": f"putter{i}", "fd": open_control(putter, key, True)}
            write_table(put["fd"], data)
            putters.append(put)
            getters.append({"name": f"getter{i}", "mount": getter, "dst": made[i], "sample": True,
                            "total": total, "key": key})
        def open_getters(create):
            for m in getters:
                m["fd"] = open_control(m["mount"], m["key"], create)
                write_table(m["fd"], data)

        if a.window:
            open_getters(True)
            cpu0, b0 = measure_begin(pids)
            t0 = time.monotonic()
            for m in getters:
                join(m["fd"], world, 0, flags, a.key)
                m["transfer"] = commit(m["fd"], abi.GET, m["dst"], sizes)
            for put in putters:
                join(put["fd"], world, 0, flags, a.key)
                put["transfer"] = commit(put["fd"], abi.PUT, src_name, sizes)
            wait_all(getters + putters, t0, a.sample_ms, a.limit_s)
        else:
            for put in putters:
                put["transfer"] = commit(put["fd"], abi.PUT, src_name, sizes)
            wait_all(putters, time.monotonic(), 0, a.limit_s)
            open_getters(False)
            cpu0, b0 = measure_begin(pids)
            t0 = time.monotonic()
            for m in getters:
                m["transfer"] = commit(m["fd"], abi.GET, m["dst"], sizes)
            wait_all(getters, t0, a.sample_ms, a.limit_s)
        res = measure_end(pids, cpu0, b0)
        res["seconds"] = round(max(m["done_s"] for m in getters), 4)
        res["bytes"] = total * len(pairs)
        res["getters"] = [
            {k: m.get(k) for k in ("mount", "first_byte_s", "half_s", "done_s")} for m in getters
        ]
        verified(res, a.src, getters)
    finally:
        tidy(getters + putters, made)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["hold", "window", "p2p", "pairs"])
    ap.add_argument("--pairs", help="pairs: PUTTER:GETTER mount points, comma-separated")
    ap.add_argument("--window", action="store_true", help="pairs: all in one window")
    ap.add_argument("--mount", help="hold: the node's mount point")
    ap.add_argument("--prefix", default=f"kt-bench-gpu-{os.getpid()}", help="/dev/shm names start with this")
    ap.add_argument("--putter", help="the putter's mount point")
    ap.add_argument("--getters", help="the getters' mount points, comma-separated (one per getter)")
    ap.add_argument("--src", help="the source: a file in /dev/shm of --mib MiB")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=64)
    ap.add_argument("--key", default="bench/sd", help="the GPU key (and window group)")
    ap.add_argument("--fanout", type=int, default=0)
    ap.add_argument("--pack", action="store_true")
    ap.add_argument("--pids", default="", help="NAME=PID,... whose peak RSS and CPU to report")
    ap.add_argument("--sample-ms", type=int, default=20)
    ap.add_argument("--limit-s", type=float, default=300)
    a = ap.parse_args()
    if a.mode == "hold":
        cmd_hold(a)
    elif a.mode == "pairs":
        cmd_pairs(a)
    else:
        cmd_transfer(a, a.mode == "window")


if __name__ == "__main__":
    main()
