"""Tensors and state dicts through real mounts' /kt/.gpu: `kt.put(src=state_dict)` on one node,
`kt.get(dest=...)` on another, alone and in a broadcast window of separate processes. numpy
arrays on the CPU stand in for torch tensors here (no GPU, no torch on the test machines); the
path is the one CUDA tensors take, less the IPC handle."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ktfs as kt


def state_dict(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "layer0.weight": rng.standard_normal((64, 33), dtype=np.float32),
        "layer0.bias": rng.integers(-(2**40), 2**40, size=17, dtype=np.int64),
        "embed": rng.integers(0, 255, size=1000, dtype=np.uint8),
        "norm.half": rng.standard_normal((3, 5)).astype(np.float16),
        "mask": rng.integers(0, 2, size=7).astype(bool),
        "scalar": np.array(3.5, dtype=np.float64),
    }


def zeros_like(sd: dict) -> dict:
    return {k: np.zeros_like(v) for k, v in sd.items()}


def host(x) -> np.ndarray:
    # With torch installed, a get with no dest allocates torch tensors.
    return x.numpy() if hasattr(x, "numpy") else x


def same(a: dict, b: dict) -> bool:
    a, b = {k: host(v) for k, v in a.items()}, {k: host(v) for k, v in b.items()}
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def at(monkeypatch, point: str) -> None:
    monkeypatch.setenv("KT_MOUNT", point)


def test_a_state_dict_goes_from_one_node_into_anothers_buffers(cluster, mounts, monkeypatch):
    a, b = mounts
    sd = state_dict(1)
    at(monkeypatch, a)
    kt.put(key="py-gpu/model", src=sd)
    # Published while this process holds it, with the publishing node as its locale.
    entry = [e for e in kt.ls("py-gpu") if e["name"] == "model"]
    assert entry and entry[0]["locale"] == "py-mount-0"
    desc = json.loads(open(os.path.join(b, ".gpu/py-gpu/model"), "rb").read())
    assert [e["name"] for e in desc["entries"]] == list(sd)

    at(monkeypatch, b)
    dest = zeros_like(sd)
    got = kt.get(key="py-gpu/model", dest=dest)
    assert got is dest and same(dest, sd)
    # No dest: allocated from the key's table.
    fresh = kt.get(key="py-gpu/model")
    assert same(fresh, sd)

    # A lone tensor is a key of one entry, and comes back as a tensor.
    at(monkeypatch, a)
    t = np.arange(12, dtype=np.int32).reshape(3, 4)
    kt.put(key="py-gpu/one", src=t)
    at(monkeypatch, b)
    back = kt.get(key="py-gpu/one")
    assert np.array_equal(host(back), t)

    # rm stops the publication: the key is gone everywhere.
    at(monkeypatch, a)
    kt.rm("py-gpu/one")
    kt.rm("py-gpu/model")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(os.path.join(b, ".gpu/py-gpu/model")):
        time.sleep(0.05)
    assert not os.path.exists(os.path.join(b, ".gpu/py-gpu/model"))
    with pytest.raises(kt.KeyNotFoundError):
        kt.ls("py-gpu")


def test_bad_calls_raise_what_they_are(cluster, mounts, monkeypatch):
    a, b = mounts
    at(monkeypatch, a)
    sd = state_dict(2)
    kt.put(key="py-bad/sd", src=sd)
    at(monkeypatch, b)
    # A dest whose table differs from the key's: which entry, and nothing written.
    wrong = zeros_like(sd)
    wrong["layer0.weight"] = np.zeros((64, 32), dtype=np.float32)
    with pytest.raises(kt.TableMismatchError, match="layer0.weight"):
        kt.get(key="py-bad/sd", dest=wrong)
    assert not wrong["embed"].any()
    with pytest.raises(kt.KeyNotFoundError):
        kt.get(key="py-bad/nothing", dest=zeros_like(sd))
    with pytest.raises(ValueError, match="contiguous"):
        kt.get(key="py-bad/sd", dest={"x": np.zeros((4, 4), dtype=np.float32)[:, ::2]})
    with pytest.raises(ValueError, match="read-only"):
        ro = zeros_like(sd)
        ro["embed"].flags.writeable = False
        kt.get(key="py-bad/sd", dest=ro)
    monkeypatch.setenv("KT_MOUNT", "/nonexistent-kt")
    with pytest.raises(kt.UnavailableError, match="KT_MOUNT"):
        kt.put(key="py-bad/other", src=sd)
    at(monkeypatch, a)
    kt.rm("py-bad/sd")


GETTER = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    import ktfs as kt
    shapes = json.loads(sys.argv[1])
    dest = {k: np.zeros(s, dtype=d) for k, (s, d) in shapes.items()}
    w = kt.BroadcastWindow(world_size=3, group_id="py-window", pack=True, timeout=60)
    kt.get(key="py-win/sd", dest=dest, broadcast=w)
    h = hashlib.sha256()
    for v in dest.values():
        h.update(v.tobytes())
    print(h.hexdigest())
    """
)


def test_a_window_fills_every_getter_in_one_broadcast(cluster, mounts, monkeypatch):
    a, b = mounts
    sd = state_dict(3)
    shapes = {k: [list(v.shape), v.dtype.name] for k, v in sd.items()}
    # Two getters, separate processes on both nodes, come first and wait for the putter.
    getters = [
        subprocess.Popen(
            [sys.executable, "-c", GETTER, json.dumps(shapes)],
            env={**os.environ, "KT_MOUNT": point},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for point in (b, a)
    ]
    at(monkeypatch, a)
    w = kt.BroadcastWindow(world_size=3, group_id="py-window", pack=True, timeout=60)
    start = time.monotonic()
    kt.put(key="py-win/sd", src=sd, broadcast=w)
    # The put returned once both getters were filled.
    want = hashlib.sha256(b"".join(v.tobytes() for v in sd.values())).hexdigest()
    for g in getters:
        out, err = g.communicate(timeout=60)
        assert g.returncode == 0, err
        assert out.strip() == want
    assert time.monotonic() - start < 60
    kt.rm("py-win/sd")


MEMBER = textwrap.dedent(
    """
    import hashlib, sys
    import numpy as np
    import ktfs as kt
    role, key, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(seed)
    # Shards of different tables: the check is per key.
    sd = {"w": rng.standard_normal((seed * 8 + 5, 16), dtype=np.float32), "step": np.array(seed)}
    w = kt.BroadcastWindow(world_size=4, group_id="py-tp", timeout=60)
    if role == "put":
        kt.put(key=key, src=sd, broadcast=w)
        print(hashlib.sha256(b"".join(v.tobytes() for v in sd.values())).hexdigest())
    else:
        dest = {k: np.zeros_like(v) for k, v in sd.items()}
        kt.get(key=key, dest=dest, broadcast=w)
        print(hashlib.sha256(b"".join(v.tobytes() for v in dest.values())).hexdigest())
    """
)


def test_a_window_of_two_putters_and_two_getters_moves_each_shard_to_its_getter(cluster, mounts):
    """The reference's many-to-many window (issue 43, item 1): tensor-parallel ranks each put
    their shard into one window while consumer ranks each get theirs, in one coordinated
    transfer whose quorum counts all four."""
    a, b = mounts
    members = [
        ("put", "py-tp/shard-0", 1, a),
        ("get", "py-tp/shard-1", 2, a),
        ("put", "py-tp/shard-1", 2, b),
        ("get", "py-tp/shard-0", 1, b),
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MEMBER, role, key, str(seed)],
            env={**os.environ, "KT_MOUNT": point},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role, key, seed, point in members
    ]
    out = []
    for p in procs:
        o, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        out.append(o.strip())
    # Each getter holds its shard's putter's bytes, not the other shard's.
    assert out[1] == out[2] and out[3] == out[0] and out[0] != out[2]


def test_tensors_of_a_killed_process_leave_nothing_in_dev_shm(cluster, mounts):
    """A process that publishes tensors and is killed leaves no /dev/shm file behind, and its
    key goes with it (issue 43, item 5): the file's name goes as soon as the node's worker
    holds it, and the publication with the control file the kernel closes."""
    a, b = mounts
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys, numpy as np, ktfs as kt
            os.environ["KT_MOUNT"] = {a!r}
            kt.put(key="py-gpu/killed", src={{"w": np.arange(100000, dtype=np.float32)}})
            print("published", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "published"
        mine = [n for n in os.listdir("/dev/shm") if n.startswith(f"kt-py-{child.pid}-")]
        assert mine == [], mine
        assert os.path.exists(os.path.join(b, ".gpu/py-gpu/killed"))
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(os.path.join(b, ".gpu/py-gpu/killed")):
        time.sleep(0.05)
    assert not os.path.exists(os.path.join(b, ".gpu/py-gpu/killed"))
    # A file a dead process left (killed in the middle of a transfer) goes with the next one.
    stale = f"/dev/shm/kt-py-{child.pid}-0-deadbeef"
    open(stale, "wb").close()
    at_a = os.environ.get("KT_MOUNT")
    os.environ["KT_MOUNT"] = a
    try:
        kt.put(key="py-gpu/after", src={"w": np.zeros(3, dtype=np.float32)})
        kt.rm("py-gpu/after")
    finally:
        if at_a is None:
            del os.environ["KT_MOUNT"]
        else:
            os.environ["KT_MOUNT"] = at_a
    assert not os.path.exists(stale)
