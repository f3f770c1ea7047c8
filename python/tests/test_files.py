"""The reference data store's file examples, verbatim but for `import ktfs as kt` and shorter
window timeouts, against a real store server and agent; then what surrounds them: lists of
keys, filters, errors, the GIL released during a transfer, Ctrl-C ending one cleanly."""

import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

import ktfs as kt

from conftest import read_tree, tree

MODEL = {"config.json": b'{"layers": 2}', "shard-0.bin": os.urandom(300_000), "tok/vocab.txt": b"a\nb\n"}
WEIGHTS = {"w.bin": os.urandom(200_000), "meta.json": b"{}"}


def test_the_reference_examples_run_with_only_the_import_changed(cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree(tmp_path / "trained_model", MODEL)
    tree(tmp_path / "weights", WEIGHTS)
    # The reference's example publishes /app/data in place; a test makes it (as root in CI).
    app = pathlib.Path("/app/data")
    made_app = not app.exists()
    tree(app, {"rows.csv": b"a,b\n1,2\n"})
    try:
        kt.put(key="my-service/weights", src="./trained_model/")
        kt.put(key="my-service/data", src="/app/data", locale="local")
        kt.put(key="my-service/weights", src="./weights/", locale="local", broadcast=kt.BroadcastWindow(timeout=0.5))
        kt.get(key="my-service/weights", dest="./local_model/")
        kt.get(key="my-service/weights", dest="./weights/", broadcast=kt.BroadcastWindow(timeout=0.5))
        listed = kt.ls("my-service")
        kt.put(key="my-service/temp-data", src="./trained_model/")
        kt.put(key="gpu-test/a", src="./weights/meta.json")
        kt.put(key="gpu-test-b", src="./weights/meta.json")
        kt.rm("my-service/temp-data", recursive=True); kt.rm("gpu-test", prefix=True)
    finally:
        if made_app:
            for p in sorted(app.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            app.rmdir()
            if not any(app.parent.iterdir()):
                app.parent.rmdir()

    # The second put updated the key to what ./weights/ holds, served in place by this node.
    assert listed == [
        {"name": "data/", "is_directory": True, "locale": cluster["node"]},
        {"name": "weights/", "is_directory": True, "locale": cluster["node"]},
    ]
    assert read_tree(tmp_path / "local_model" / "weights") == WEIGHTS
    assert read_tree(tmp_path / "weights" / "weights") == WEIGHTS
    names = [e["name"] for e in kt.ls("my-service")]
    assert "temp-data/" not in names
    assert not [e for e in kt.ls() if e["name"].startswith("gpu-test")]


def test_lists_of_keys_go_pairwise_or_below_one_destination(cluster, tmp_path):
    a = tree(tmp_path / "a", {"x": b"1"})
    b = tree(tmp_path / "b", {"y": b"2"})
    # `dir/` publishes the directory's contents (rsync's rule), `dir` the directory itself.
    kt.put(key=["batch/a", "batch/b"], src=[f"{a}/", str(b)])
    kt.get(key=["batch/a", "batch/b"], dest=str(tmp_path / "both"))
    assert read_tree(tmp_path / "both") == {"a/x": b"1", "b/b/y": b"2"}
    kt.get(key=["batch/a", "batch/b"], dest=[str(tmp_path / "p"), str(tmp_path / "q")], contents=True)
    assert read_tree(tmp_path / "p") == {"x": b"1"}
    assert read_tree(tmp_path / "q") == {"b/y": b"2"}
    with pytest.raises(ValueError):
        kt.put(key=["batch/c", "batch/d"], src=[str(a)])


def test_a_prefix_is_one_tree_and_a_put_updates_its_key(cluster, tmp_path):
    src = tree(tmp_path / "src", {"a/one.txt": b"one", "top.txt": b"top"})
    extra = tree(tmp_path / "extra", {"two.txt": b"two"})
    kt.put(key="tree", src=f"{src}/")
    # Single-file keys below the directory key and below a prefix of keys alone.
    kt.put(key="tree/a/two.txt", src=str(extra / "two.txt"))
    kt.put(key="tree/b/three.txt", src=str(extra / "two.txt"))
    kt.get(key="tree", dest=str(tmp_path / "got"), contents=True)
    assert read_tree(tmp_path / "got") == {
        "a/one.txt": b"one", "a/two.txt": b"two", "b/three.txt": b"two", "top.txt": b"top"
    }
    assert [e["name"] for e in kt.ls("tree/a")] == ["one.txt", "two.txt"]
    # Without force, a put onto the key updates it to what the source holds now: an edit is
    # sent, a deleted file is gone.
    (src / "top.txt").write_bytes(b"top, edited")
    (src / "a" / "one.txt").unlink()
    kt.put(key="tree", src=f"{src}/")
    kt.get(key="tree", dest=str(tmp_path / "again"), contents=True)
    assert read_tree(tmp_path / "again") == {"top.txt": b"top, edited"}


def test_filter_options_are_rsync_rules(cluster, tmp_path):
    src = tree(tmp_path / "src", {"keep.py": b"k", "drop.log": b"d", "cache/x.pyc": b"c", "logs/keep.log": b"l"})
    kt.put(
        key="filtered/tree",
        src=str(src) + "/",
        filter_options="--exclude='*.log' --exclude cache/ --include=logs/keep.log",
    )
    kt.get(key="filtered/tree", dest=str(tmp_path / "out"), contents=True)
    assert read_tree(tmp_path / "out") == {"keep.py": b"k", "logs/keep.log": b"l"}
    kt.get(key="filtered/tree", dest=str(tmp_path / "only"), contents=True, filter_options=["- *.py"])
    assert read_tree(tmp_path / "only") == {"logs/keep.log": b"l"}
    with pytest.raises(ValueError):
        kt.put(key="filtered/bad", src=str(src), filter_options="--delete")


def test_each_failure_is_its_exception_with_the_clis_message(cluster, tmp_path, monkeypatch):
    with pytest.raises(kt.KeyNotFoundError, match="not found"):
        kt.get(key="no/such/key", dest=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    with pytest.raises(kt.KeyNotFoundError):
        kt.ls("no/such")
    with pytest.raises(kt.InvalidKeyError, match="empty segment"):
        kt.put(key="a//b", src=__file__)
    f = tmp_path / "f"
    f.write_bytes(b"one")
    kt.put(key="errs/f", src=str(f))
    f.write_bytes(b"two, longer")
    with pytest.raises(kt.ConflictError, match="--force"):
        kt.get(key="errs/f", dest=str(f))
    kt.get(key="errs/f", dest=str(f), force=True)
    assert f.read_bytes() == b"one"
    with pytest.raises(ValueError, match="timeout, world_size or ips"):
        kt.BroadcastWindow()
    assert kt.BroadcastWindow(world_size=4, pack=True).to_dict()["world_size"] == 4
    # Tensors need the mount (test_tensors.py has it); without one, that is what the error says.
    monkeypatch.setenv("KT_MOUNT", "/nonexistent-kt")
    with pytest.raises(kt.UnavailableError, match="/nonexistent-kt/.gpu"):
        kt.put(key="t", src={"w": __import__("numpy").zeros(3)})
    assert issubclass(kt.KeyNotFoundError, kt.KtError)
    monkeypatch.setenv("KT_SERVER", "127.0.0.1:1")
    t = time.monotonic()
    with pytest.raises(kt.UnreachableError, match="cannot reach the store server"):
        kt.ls()
    assert time.monotonic() - t < 15


def test_code_written_against_the_reference_catches_what_it_caught(cluster, tmp_path):
    """Its base class, the builtins it raised, one key from several sources, and a single file
    put with contents=True (issue 43, items 2 to 4)."""
    # Every failure is a DataStoreError, and the builtin the reference raised for it.
    with pytest.raises(kt.DataStoreError):
        kt.ls("no/such")
    with pytest.raises(KeyError) as missing:
        kt.get(key="no/such/key", dest=str(tmp_path / "x"))
    assert "not found" in str(missing.value) and not str(missing.value).startswith("'")
    with pytest.raises(ValueError):
        kt.put(key="ref/missing", src=str(tmp_path / "no-such-file"))
    with pytest.raises(ValueError):
        kt.put(key="a//b", src=__file__)
    assert kt.KtError is kt.DataStoreError
    assert issubclass(kt.BroadcastTimeoutError, TimeoutError)
    assert issubclass(kt.PermissionDeniedError, PermissionError)
    assert issubclass(kt.UnreachableError, ConnectionError)
    with pytest.raises(kt.DataStoreError):
        kt.BroadcastWindow()

    # One key, three sources: a directory holding each of them.
    files = [tmp_path / n for n in ("f1.txt", "f2.txt", "f3.txt")]
    for i, f in enumerate(files):
        f.write_bytes(b"file %d" % i)
    kt.put(key="svc/multi-files", src=[str(f) for f in files])
    assert [e["name"] for e in kt.ls("svc/multi-files")] == ["f1.txt", "f2.txt", "f3.txt"]
    kt.get(key="svc/multi-files", dest=str(tmp_path / "multi"), contents=True)
    assert read_tree(tmp_path / "multi") == {"f1.txt": b"file 0", "f2.txt": b"file 1", "f3.txt": b"file 2"}

    # contents=True with one file: the key is a directory holding the file by its name.
    kt.put(key="svc/dir", src=str(files[0]), contents=True)
    kt.get(key="svc/dir", dest=str(tmp_path / "got"))
    assert read_tree(tmp_path / "got") == {"dir/f1.txt": b"file 0"}


def _pause(pid: int, seconds: float) -> subprocess.Popen:
    """Stops `pid` for `seconds`, from another process (this one may not hold the GIL)."""
    return subprocess.Popen(["sh", "-c", f"kill -STOP {pid}; sleep {seconds}; kill -CONT {pid}"])


def test_the_gil_is_released_while_a_transfer_waits(cluster, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(8 << 20))
    kt.put(key="gil/big.bin", src=str(src))
    pause = _pause(cluster["server"].pid, 1.0)
    time.sleep(0.1)
    done = []
    t = threading.Thread(target=lambda: done.append(kt.get(key="gil/big.bin", dest=str(tmp_path / "got.bin"))))
    t.start()
    spins = 0
    while t.is_alive():
        spins += 1
    t.join()
    pause.wait()
    assert done == [None]
    assert (tmp_path / "got.bin").read_bytes() == src.read_bytes()
    # Held through the call, the GIL would let this thread run a handful of times at most.
    assert spins > 10_000, spins


def test_ctrl_c_ends_a_transfer_cleanly(cluster, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(1 << 20))
    kt.put(key="sigint/f.bin", src=str(src))
    server = cluster["server"].pid
    # A runner started in the background inherits SIGINT ignored, and Python then raises no
    # KeyboardInterrupt: this test is of what Ctrl-C does, so it puts Python's handler in place.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(server, signal.SIGSTOP)
    try:
        interrupt = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -INT {os.getpid()}"])
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            kt.get(key="sigint/f.bin", dest=str(tmp_path / "got.bin"))
        assert time.monotonic() - t < 5
        interrupt.wait()
    finally:
        os.kill(server, signal.SIGCONT)
        signal.signal(signal.SIGINT, previous)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".got.bin", "got.bin"))]
    kt.get(key="sigint/f.bin", dest=str(tmp_path / "got.bin"))
    assert (tmp_path / "got.bin").read_bytes() == src.read_bytes()
