"""CUDA tensors through real mounts' /kt/.gpu: the path of test_tensors.py with torch tensors on
a GPU, handed over by CUDA IPC handle. These need torch and a GPU, so they skip on the CPU-only
test machines and run in the device check (scripts/device-stack.sh), where one is lent."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ktfs as kt

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here: the device check runs these", allow_module_level=True)


def state_dict(seed: int, device: str = "cuda") -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    sd = {
        "layer0.weight": torch.randn(64, 33, generator=g),
        "layer0.bias": torch.randint(-(2**40), 2**40, (17,), generator=g, dtype=torch.int64),
        "embed": torch.randint(0, 255, (1000,), generator=g, dtype=torch.uint8),
        "norm.half": torch.randn(3, 5, generator=g).half(),
        "norm.bf16": torch.randn(7, 9, generator=g).bfloat16(),
        "mask": torch.randint(0, 2, (7,), generator=g).bool(),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        # Larger than one 4 MiB chunk of the transport, so a tensor crosses chunk boundaries.
        "big": torch.randn(3 * 1024 * 1024 + 5, generator=g),
    }
    return {k: v.to(device) for k, v in sd.items()}


def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k].cpu(), b[k].cpu())
        for k in a
    )


def at(monkeypatch, point: str) -> None:
    monkeypatch.setenv("KT_MOUNT", point)


def test_a_cuda_state_dict_goes_from_one_node_into_anothers_gpu_buffers(cluster, mounts, monkeypatch):
    a, b = mounts
    sd = state_dict(1)
    at(monkeypatch, a)
    kt.put(key="cuda/model", src=sd)
    at(monkeypatch, b)
    dest = {k: torch.zeros_like(v) for k, v in sd.items()}
    got = kt.get(key="cuda/model", dest=dest)
    assert got is dest and same(dest, sd)
    assert all(v.is_cuda for v in dest.values())
    # Into host tensors from GPU ones, and the other way round.
    host = kt.get(key="cuda/model")
    assert not any(v.is_cuda for v in host.values()) and same(host, sd)
    at(monkeypatch, a)
    cpu_sd = state_dict(2, device="cpu")
    kt.put(key="cuda/from-host", src=cpu_sd)
    at(monkeypatch, b)
    into_gpu = {k: torch.zeros_like(v, device="cuda") for k, v in cpu_sd.items()}
    kt.get(key="cuda/from-host", dest=into_gpu)
    assert same(into_gpu, cpu_sd)
    # A lone tensor, a slice of a larger allocation (at an offset in its IPC handle's memory).
    at(monkeypatch, a)
    whole = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    part = whole[4096:8192]
    kt.put(key="cuda/part", src=part)
    at(monkeypatch, b)
    back = torch.full((4096,), -1, dtype=torch.int32, device="cuda")
    kt.get(key="cuda/part", dest=back)
    assert torch.equal(back.cpu(), part.cpu())
    at(monkeypatch, a)
    for k in ("cuda/model", "cuda/from-host", "cuda/part"):
        kt.rm(k)


GETTER = textwrap.dedent(
    """
    import hashlib, json, sys
    import torch
    import ktfs as kt
    shapes, pack = json.loads(sys.argv[1]), sys.argv[2] == "1"
    dest = {k: torch.zeros(s, dtype=getattr(torch, d), device="cuda") for k, (s, d) in shapes.items()}
    w = kt.BroadcastWindow(world_size=4, group_id="cuda-window-" + sys.argv[2], pack=pack, timeout=120)
    kt.get(key="cuda-win/sd" + sys.argv[2], dest=dest, broadcast=w)
    h = hashlib.sha256()
    for v in dest.values():
        h.update(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    print(h.hexdigest())
    """
)


def digest(sd: dict) -> str:
    h = hashlib.sha256()
    for v in sd.values():
        h.update(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("pack", [True, False])
def test_a_window_fills_every_getters_gpu_buffers(cluster, mounts, monkeypatch, pack):
    a, b = mounts
    sd = state_dict(3)
    shapes = {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in sd.items()}
    flag = "1" if pack else "0"
    # Three getters, separate processes (each with its own CUDA context) on both nodes.
    getters = [
        subprocess.Popen(
            [sys.executable, "-c", GETTER, json.dumps(shapes), flag],
            env={**os.environ, "KT_MOUNT": point},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for point in (b, a, b)
    ]
    at(monkeypatch, a)
    w = kt.BroadcastWindow(world_size=4, group_id="cuda-window-" + flag, pack=pack, timeout=120)
    start = time.monotonic()
    kt.put(key="cuda-win/sd" + flag, src=sd, broadcast=w)
    want = digest(sd)
    for g in getters:
        out, err = g.communicate(timeout=120)
        assert g.returncode == 0, err
        assert out.strip() == want
    assert time.monotonic() - start < 120
    kt.rm("cuda-win/sd" + flag)


NCCL_GETTER = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import ktfs as kt
    n, pack = int(sys.argv[1]), sys.argv[2].endswith("1")
    dest = {"big": torch.zeros(n, dtype=torch.uint8, device="cuda"),
            "small": torch.zeros(1000, dtype=torch.float32, device="cuda"),
            "half": torch.zeros(33, dtype=torch.float16, device="cuda")}
    fanout = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    w = kt.BroadcastWindow(world_size=2, group_id="nccl-" + sys.argv[2], pack=pack, timeout=120,
                           fanout=fanout)
    t0 = time.monotonic()
    kt.get(key="cuda-nccl/sd" + sys.argv[2], dest=dest, broadcast=w)
    took = time.monotonic() - t0
    print(json.dumps({"sum": int(dest["big"].sum().item()), "small": dest["small"].sum().item(),
                      "half": dest["half"].float().sum().item(), "s": took}))
    """
)


def nccl_inits() -> int:
    """Communicators NCCL formed so far in this machine's workers, as their debug logs say
    (the device check sets NCCL_DEBUG_FILE for the mounts; 0 where it does not)."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return 0
    d = os.path.dirname(pattern)
    n = 0
    for f in os.listdir(d) if os.path.isdir(d) else []:
        with open(os.path.join(d, f), errors="replace") as fh:
            n += sum("Init COMPLETE" in line for line in fh)
    return n


def nccl_window(monkeypatch, a, b, flag, pack, n, wrap=(), fanout=0):
    """A putter on mount `a` and NCCL_GETTER on mount `b` (its command after `wrap`) in a
    window of two, every buffer in GPU memory: the getter's report, checked, and how many
    communicators NCCL formed meanwhile."""
    sd = {"big": torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"),
          "small": torch.arange(1000, dtype=torch.float32, device="cuda"),
          "half": torch.full((33,), 0.5, dtype=torch.float16, device="cuda")}
    before = nccl_inits()
    getter = subprocess.Popen([*wrap, sys.executable, "-c", NCCL_GETTER, str(n), flag, str(fanout)],
                              env={**os.environ, "KT_MOUNT": b}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    at(monkeypatch, a)
    w = kt.BroadcastWindow(world_size=2, group_id="nccl-" + flag, pack=pack, timeout=120,
                           fanout=fanout)
    kt.put(key="cuda-nccl/sd" + flag, src=sd, broadcast=w)
    out, err = getter.communicate(timeout=120)
    assert getter.returncode == 0, err
    got = json.loads(out)
    assert got["sum"] == int(sd["big"].sum().item())
    assert got["small"] == sd["small"].sum().item() and got["half"] == 33 * 0.5
    kt.rm("cuda-nccl/sd" + flag)
    return got, nccl_inits() - before


@pytest.mark.parametrize("pack", [True, False])
def test_a_window_of_one_member_per_node_goes_over_nccl(cluster, mounts, monkeypatch, pack):
    """A putter and a getter on two nodes, every buffer in GPU memory: one NCCL broadcast from
    worker to worker (each node its own host to NCCL, over sockets on one machine)."""
    a, b = mounts
    n = 256 << 20
    got, inits = nccl_window(monkeypatch, a, b, "1" if pack else "0", pack, n)
    if os.environ.get("KT_EXPECT_NCCL") == "1":
        # Both workers formed a communicator for this window.
        assert inits >= 2, "the window did not go over NCCL"
    report = os.environ.get("KT_CUDA_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"window": "nccl", "pack": pack, "bytes": n, "get_s": got["s"],
                                "get_gib_s": n / got["s"] / 2**30}) + "\n")


@pytest.mark.parametrize("pack", [True, False])
def test_a_window_with_a_fanout_goes_down_a_tree_of_nccl_sends(cluster, mounts, monkeypatch, pack):
    """An explicit fanout over NCCL: the bytes go down a pipelined tree of that degree, chunk by
    chunk in sends and receives (here one hop, putter to getter), packed or in place, and
    arrive whole (the big entry is many chunks, the small ones share a bucket)."""
    a, b = mounts
    n = (64 << 20) + 12345
    got, inits = nccl_window(monkeypatch, a, b, "tree" + ("1" if pack else "0"), pack, n, fanout=1)
    if os.environ.get("KT_EXPECT_NCCL") == "1":
        assert inits >= 2, "the window with a fanout did not go over NCCL"


def test_a_getter_in_namespaces_of_its_own_loads_its_own_nccl(cluster, mounts, monkeypatch):
    """A getter in PID, IPC and mount namespaces of its own, as a pod's process is: its worker
    enters them and loads the NCCL the getter mapped (torch's) from there, through the link
    directory the agent hands it open, so the window still goes over NCCL."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to give the getter namespaces of its own")
    a, b = mounts
    wrap = ("unshare", "--pid", "--fork", "--ipc", "--mount", "--mount-proc")
    _, inits = nccl_window(monkeypatch, a, b, "pod", False, 64 << 20, wrap)
    if os.environ.get("KT_EXPECT_NCCL") == "1":
        assert inits >= 2, "the window with the namespaced getter did not go over NCCL"


NCCL_SHARD = textwrap.dedent(
    """
    import json, sys, torch, ktfs as kt
    role, shard, pack = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    g = torch.Generator(device="cpu").manual_seed(shard)
    # Shards of different tables: the check is per key.
    sd = {"w": torch.randn((16 << 20) + shard * 4097, generator=g).cuda(),
          "bias": torch.randn(100 + shard, generator=g).cuda()}
    w = kt.BroadcastWindow(world_size=4, group_id="nccl-tp-%d" % pack, pack=pack, timeout=120)
    key = "cuda-tp/shard-%d" % shard
    if role == "put":
        kt.put(key=key, src=sd, broadcast=w)
        out = sd
    else:
        out = {k: torch.zeros_like(v) for k, v in sd.items()}
        kt.get(key=key, dest=out, broadcast=w)
    print(json.dumps([t.double().sum().item() for t in out.values()]))
    """
)


@pytest.mark.parametrize("pack", [True, False])
def test_a_window_of_two_putters_and_two_getters_goes_over_one_nccl_communicator(cluster, mounts, pack):
    """The many-to-many window of issue 43: two shards put on two nodes, each got on the other,
    in one window of four. Each node's getter runs in namespaces of its own, so the four
    members are four workers (a rank each) and the window goes over NCCL: one communicator,
    each key down its own tree of sends and receives."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for four workers on two nodes")
    a, b = mounts
    wrap = ("unshare", "--pid", "--fork", "--ipc", "--mount", "--mount-proc")
    flag = "1" if pack else "0"
    members = [((), "put", 0, a), (wrap, "get", 1, a), ((), "put", 1, b), (wrap, "get", 0, b)]
    before = nccl_inits()
    procs = [subprocess.Popen([*w, sys.executable, "-c", NCCL_SHARD, role, str(shard), flag],
                              env={**os.environ, "KT_MOUNT": point}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for w, role, shard, point in members]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert outs[0] == outs[3] and outs[2] == outs[1] and outs[0] != outs[2]
    if os.environ.get("KT_EXPECT_NCCL") == "1":
        assert nccl_inits() - before >= 4, "the window of four did not go over NCCL"
    # The putters have exited: their keys went with their control files.


NCCL_MANY = textwrap.dedent(
    """
    import json, sys, torch, ktfs as kt
    dtypes = [torch.float32, torch.bfloat16, torch.int64]
    dest = {"t%d" % i: torch.zeros((3 << 20) // dtypes[i % 3].itemsize, dtype=dtypes[i % 3],
                                   device="cuda") for i in range(int(sys.argv[1]))}
    w = kt.BroadcastWindow(world_size=2, group_id="nccl-many", pack=True, timeout=120)
    kt.get(key="cuda-many/sd", dest=dest, broadcast=w)
    print(json.dumps([t.double().sum().item() for t in dest.values()]))
    """
)


def test_many_packed_entries_go_through_both_buckets_in_turn(cluster, mounts, monkeypatch):
    """A packed window of 24 entries of 3 MiB in mixed dtypes: ten to a 32 MiB bucket, so
    the buckets are filled, moved and emptied in turn, a bucket used again only once its last
    use is over; every entry arrives with its own values."""
    a, b = mounts
    n = 24
    getter = subprocess.Popen([sys.executable, "-c", NCCL_MANY, str(n)],
                              env={**os.environ, "KT_MOUNT": b}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    dtypes = [torch.float32, torch.bfloat16, torch.int64]
    sd = {"t%d" % i: torch.full(((3 << 20) // dtypes[i % 3].itemsize,), i + 1, dtype=dtypes[i % 3],
                                device="cuda") for i in range(n)}
    at(monkeypatch, a)
    kt.put(key="cuda-many/sd", src=sd,
           broadcast=kt.BroadcastWindow(world_size=2, group_id="nccl-many", pack=True, timeout=120))
    out, err = getter.communicate(timeout=120)
    assert getter.returncode == 0, err
    assert json.loads(out) == [t.double().sum().item() for t in sd.values()]
    kt.rm("cuda-many/sd")


NCCL_SYNCS = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import ktfs as kt
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    dest = {"w": torch.zeros(n, dtype=torch.float32, device="cuda")}
    out = []
    for i in range(rounds):
        w = kt.BroadcastWindow(world_size=2, group_id="nccl-sync-%d" % i, timeout=120)
        t0 = time.monotonic()
        kt.get(key="cuda-sync/w", dest=dest, broadcast=w)
        out.append({"sum": dest["w"].sum().item(), "s": time.monotonic() - t0})
    print(json.dumps(out))
    """
)


def test_weights_synced_again_to_the_same_workers_reuse_their_communicator(cluster, mounts, monkeypatch):
    """A trainer putting weights into a window of the same inference process, round after
    round (each round its own window): the first round forms a communicator in each worker,
    the later ones run on it (the workers keep it, and outlive a round while their callers
    live), so no later round pays NCCL's set-up again."""
    a, b = mounts
    n, rounds = 1 << 20, 3
    before = nccl_inits()
    getter = subprocess.Popen([sys.executable, "-c", NCCL_SYNCS, str(n), str(rounds)],
                              env={**os.environ, "KT_MOUNT": b}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    at(monkeypatch, a)
    for i in range(rounds):
        w = kt.BroadcastWindow(world_size=2, group_id="nccl-sync-%d" % i, timeout=120)
        kt.put(key="cuda-sync/w", src={"w": torch.full((n,), float(i + 1), device="cuda")},
               broadcast=w)
    out, err = getter.communicate(timeout=180)
    assert getter.returncode == 0, err
    got = json.loads(out)
    assert [g["sum"] for g in got] == [float(n * (i + 1)) for i in range(rounds)]
    kt.rm("cuda-sync/w")
    if os.environ.get("KT_EXPECT_NCCL") == "1":
        # One communicator in each of the two workers, for the first round only.
        assert nccl_inits() - before == 2, "a later round formed a communicator again"
    report = os.environ.get("KT_CUDA_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"window": "nccl-rounds", "bytes": 4 * n,
                                "round_s": [g["s"] for g in got]}) + "\n")


def test_a_point_to_point_get_of_gpu_buffers_goes_over_nccl_on_a_kept_communicator(cluster, mounts, monkeypatch):
    """A GET without a window, both sides' buffers in GPU memory: the bytes go over NCCL
    between the two nodes' workers (not staged through host memory and TCP), and the next GET
    between the same workers runs on the communicator the first one formed."""
    a, b = mounts
    n = 64 << 20
    src = {"w": torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"),
           "bias": torch.arange(4097, dtype=torch.float32, device="cuda")}
    at(monkeypatch, a)
    kt.put(key="cuda-p2p/w", src=src)
    at(monkeypatch, b)
    before = nccl_inits()
    took = []
    for i in range(3):
        dest = {k: torch.zeros_like(v) for k, v in src.items()}
        t0 = time.monotonic()
        kt.get(key="cuda-p2p/w", dest=dest)
        took.append(time.monotonic() - t0)
        assert same(dest, src), f"GET {i}"
        if os.environ.get("KT_EXPECT_NCCL") == "1":
            # One communicator in each worker, formed by the first GET only.
            assert nccl_inits() - before == 2, f"GET {i}: {nccl_inits() - before} formed"
    at(monkeypatch, a)
    kt.rm("cuda-p2p/w")
    report = os.environ.get("KT_CUDA_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"p2p": "nccl", "bytes": n + 4 * 4097, "get_s": took}) + "\n")


KILLED_GETTER = textwrap.dedent(
    """
    import sys, torch, ktfs as kt
    dest = {"big": torch.zeros(int(sys.argv[1]), dtype=torch.uint8, device="cuda")}
    w = kt.BroadcastWindow(world_size=2, group_id="nccl-kill", timeout=120)
    kt.get(key="cuda-kill/sd", dest=dest, broadcast=w)
    """
)


def test_a_getter_killed_mid_nccl_broadcast_fails_the_putter_in_time(cluster, mounts, monkeypatch):
    """kill -9 of a getter once both ranks' communicators formed: the putter fails within
    seconds (not at the 60 s deadline), naming the member, and the next window works."""
    if os.environ.get("KT_EXPECT_NCCL") != "1" or not os.environ.get("NCCL_DEBUG_FILE"):
        pytest.skip("needs NCCL and its debug logs (the device check sets both)")
    a, b = mounts
    n = 4 << 30
    before = nccl_inits()
    getter = subprocess.Popen([sys.executable, "-c", KILLED_GETTER, str(n)],
                              env={**os.environ, "KT_MOUNT": b}, stderr=subprocess.PIPE, text=True)

    def kill_once_formed():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and nccl_inits() - before < 2:
            time.sleep(0.05)
        time.sleep(0.5)
        getter.kill()

    killer = threading.Thread(target=kill_once_formed, daemon=True)
    killer.start()
    at(monkeypatch, a)
    sd = {"big": torch.ones(n, dtype=torch.uint8, device="cuda")}
    t0 = time.monotonic()
    with pytest.raises(kt.KtError) as failed:
        kt.put(key="cuda-kill/sd", src=sd, broadcast=kt.BroadcastWindow(world_size=2, group_id="nccl-kill", timeout=120))
    took = time.monotonic() - t0
    killer.join()
    getter.wait()
    assert nccl_inits() - before >= 2, "the window did not go over NCCL"
    assert took < 40, f"the putter failed after {took:.1f} s"
    assert "py-mount-1" in str(failed.value) or "member" in str(failed.value), str(failed.value)
    report = os.environ.get("KT_CUDA_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"killed_getter": True, "putter_failed_after_s": took,
                                "error": str(failed.value)}) + "\n")
    # Both workers are fine: the next window between the nodes goes through.
    del sd
    getter = subprocess.Popen([sys.executable, "-c", NCCL_GETTER, str(1 << 20), "1"],
                              env={**os.environ, "KT_MOUNT": b}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    small = {"big": torch.full((1 << 20,), 3, dtype=torch.uint8, device="cuda"),
             "small": torch.ones(1000, dtype=torch.float32, device="cuda"),
             "half": torch.full((33,), 0.5, dtype=torch.float16, device="cuda")}
    kt.put(key="cuda-nccl/sd1", src=small, broadcast=kt.BroadcastWindow(world_size=2, group_id="nccl-1", pack=True, timeout=120))
    out, err = getter.communicate(timeout=120)
    assert getter.returncode == 0, err
    assert json.loads(out)["sum"] == 3 << 20
    kt.rm("cuda-nccl/sd1")


def test_the_reference_gpu_examples_run_as_written(cluster, mounts, monkeypatch):
    a, b = mounts
    at(monkeypatch, a)
    torch.manual_seed(7)
    kt.put(key="model/layer1", src=torch.randn(1000, 1000, device="cuda"))
    # The put holds the tensor: memory the caller let go of is not handed to the next one.
    junk = torch.zeros(1000, 1000, device="cuda")
    torch.manual_seed(7)
    want = torch.randn(1000, 1000, device="cuda")
    at(monkeypatch, b)
    assert torch.equal(kt.get(key="model/layer1").cuda(), want)
    del junk

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)).cuda()
    getter = textwrap.dedent(
        """
        import torch, ktfs as kt, hashlib
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)).cuda()
        kt.get(key="model/weights", dest=model.state_dict(), broadcast=kt.BroadcastWindow(world_size=4, pack=True))
        print(hashlib.sha256(b"".join(v.cpu().reshape(-1).view(torch.uint8).numpy().tobytes() for v in model.state_dict().values())).hexdigest())
        """
    )
    getters = [subprocess.Popen([sys.executable, "-c", getter], env={**os.environ, "KT_MOUNT": p},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for p in (b, a, b)]
    at(monkeypatch, a)
    kt.put(key="model/weights", src=model.state_dict(), broadcast=kt.BroadcastWindow(world_size=4, pack=True))
    want = hashlib.sha256(b"".join(v.cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
                                   for v in model.state_dict().values())).hexdigest()
    for g in getters:
        out, err = g.communicate(timeout=120)
        assert g.returncode == 0, err
        assert out.strip() == want
    kt.rm("model", prefix=True)


def test_a_large_gpu_tensor_round_trips_and_reports_its_rate(cluster, mounts, monkeypatch):
    """1 GiB from one node's GPU memory into another's; the rate goes to the device check's
    report beside a device-to-device copy of the same bytes."""
    a, b = mounts
    n = int(os.environ.get("KT_CUDA_BIG_MIB", "1024")) << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    at(monkeypatch, a)
    kt.put(key="cuda/big", src=src)
    at(monkeypatch, b)
    t0 = time.monotonic()
    kt.get(key="cuda/big", dest=dst)
    took = time.monotonic() - t0
    assert torch.equal(src, dst)
    copy = torch.empty_like(src)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    copy.copy_(src)
    torch.cuda.synchronize()
    d2d = time.monotonic() - t1
    report = os.environ.get("KT_CUDA_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"bytes": n, "get_s": took, "d2d_s": d2d,
                                "get_gib_s": n / took / 2**30, "d2d_gib_s": n / d2d / 2**30}) + "\n")
    at(monkeypatch, a)
    kt.rm("cuda/big")
