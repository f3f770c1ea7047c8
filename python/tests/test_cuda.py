"""CUDA tensors through real mounts' /kt/.gpu: the path of test_tensors.py with torch tensors on
a GPU, handed over by CUDA IPC handle. These need torch and a GPU, so they skip on the CPU-only
test machines and run in the device check (scripts/device-stack.sh), where one is lent."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
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
