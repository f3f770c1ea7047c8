"""A real ktfs for the Python tests: a `kt server` and a `kt agent`, separate processes on
127.0.0.201, started once per session; the package finds them through KT_SERVER and KT_AGENT,
as it would in a pod. `kt` is the workspace's build (target/debug/kt, or KT_BIN)."""

import os
import pathlib
import re
import signal
import subprocess
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
IP = "127.0.0.201"


def kt_bin() -> str:
    kt = os.environ.get("KT_BIN") or str(ROOT / "target" / "debug" / "kt")
    if not os.access(kt, os.X_OK):
        pytest.exit(f"{kt} is missing: build it first (`cargo build --bin kt`)", returncode=2)
    return kt


class Proc:
    """A process that printed its ready line (`... listening on ADDR ...`)."""

    def __init__(self, args, env=None):
        self.p = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=None,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn", **(env or {})},
            text=True,
        )
        ready = threading.Event()
        self.addr = None

        def watch():
            for line in self.p.stdout:
                m = re.search(r"listening on ([0-9.:]+)", line)
                if m and not ready.is_set():
                    self.addr = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=watch, daemon=True).start()
        if not ready.wait(60) or self.addr is None:
            self.p.kill()
            raise RuntimeError(f"{args} did not become ready")

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The store server and this node's agent; yields what tests need of them."""
    kt = kt_bin()
    d = tmp_path_factory.mktemp("kt")
    # With KT_TEST_META=etcd://HOST:PORT (the test command's second pass), the metadata in etcd.
    meta = os.environ.get("KT_TEST_META")
    meta_args = ["--meta", f"{meta}/py-{d.name}-{os.getpid()}"] if meta else []
    server = Proc([kt, "server", "--listen", f"{IP}:0", "--data-dir", str(d / "store"), "--lease-secs", "10"]
                  + meta_args)
    sock = d / "agent.sock"
    agent = Proc(
        [kt, "agent", "--server", server.addr, "--listen", f"{IP}:0", "--cache-dir", str(d / "cache"),
         "--socket", str(sock), "--node-id", "py-node", "--heartbeat-secs", "1"]
    )
    old = {k: os.environ.get(k) for k in ("KT_SERVER", "KT_AGENT", "KT_NAMESPACE")}
    os.environ.update({"KT_SERVER": server.addr, "KT_AGENT": str(sock), "KT_NAMESPACE": "default"})
    try:
        yield {"kt": kt, "server": server, "agent": agent, "socket": str(sock), "node": "py-node"}
    finally:
        agent.stop()
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def mounts(cluster, tmp_path_factory):
    """Two more nodes of the cluster with the filesystem mounted (root and /dev/fuse, as in CI):
    their mount points, for the tensor path through /kt/.gpu."""
    kt = cluster["kt"]
    points, procs = [], []
    try:
        for i, ip in enumerate(("127.0.0.202", "127.0.0.203")):
            d = tmp_path_factory.mktemp(f"node{i}")
            point = d / "kt"
            procs.append(
                Proc(
                    [kt, "mount", str(point), "--server", cluster["server"].addr, "--listen", f"{ip}:0",
                     "--cache-dir", str(d / "cache"), "--socket", str(d / "agent.sock"),
                     "--node-id", f"py-mount-{i}", "--heartbeat-secs", "1"],
                    # Each node its own host to NCCL: on a machine of one GPU, ranks of separate
                    # nodes would otherwise be refused as one GPU used twice (see GPU.md).
                    env={"NCCL_HOSTID": f"py-mount-{i}"},
                )
            )
            points.append(str(point))
        yield points
    finally:
        for p in procs:
            p.stop()
        for point in points:
            subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL, check=False)


def tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    """Writes `files` (relative path -> bytes) below `root`."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def read_tree(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
