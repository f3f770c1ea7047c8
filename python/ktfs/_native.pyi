"""Type stubs of the extension module (python/src/lib.rs)."""

from typing import Dict, List, Optional

# Failures are raised as the classes of ktfs.errors.

def put(
    key: str,
    src: List[str],
    locale: str = "store",
    force: bool = False,
    contents: bool = False,
    excludes: List[str] = ...,
    includes: List[str] = ...,
    window_timeout: Optional[float] = None,
    world_size: Optional[int] = None,
    ips: List[str] = ...,
    group_id: Optional[str] = None,
    fanout: Optional[int] = None,
    verbose: bool = False,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
    block_size: Optional[int] = None,
    ttl: int = 0,
) -> str:
    """Publishes ``src`` under ``key``; returns ``kt put --json``'s report."""

def get(
    key: str,
    dest: str,
    force: bool = False,
    contents: bool = False,
    excludes: List[str] = ...,
    includes: List[str] = ...,
    window_timeout: Optional[float] = None,
    world_size: Optional[int] = None,
    ips: List[str] = ...,
    group_id: Optional[str] = None,
    fanout: Optional[int] = None,
    verbose: bool = False,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
    seed: bool = True,
) -> str:
    """Copies ``key`` to ``dest``; returns ``kt get --json``'s report."""

def ls(
    key: str = "",
    recursive: bool = False,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
) -> str:
    """The entries below ``key`` as a JSON list (name, is_directory, locale, size)."""

def rm(
    key: str,
    recursive: bool = False,
    prefix: bool = False,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
) -> List[str]:
    """Removes keys; returns those removed."""

def read_range(
    key: str,
    offset: int,
    length: int,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
) -> bytes:
    """``length`` bytes of the file at ``key`` from ``offset``, fetching only the blocks that
    cover them."""

def stat(
    key: str,
    namespace: Optional[str] = None,
    server: Optional[str] = None,
    kubeconfig: Optional[str] = None,
) -> str:
    """What is at ``key``, as JSON: type (file, directory, symlink), size."""

def blocks_fetched() -> int:
    """Blocks ``read_range`` has fetched in this process."""

def gpu_abi() -> Dict[str, int]:
    """The GPU control files' struct sizes and command numbers, as the mount decodes them."""
