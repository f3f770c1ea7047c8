"""put, get, ls and rm: the reference data store's API, on ktfs.

Files and directories go through the ktfs library in-process (``ktfs._native``); the store
server, the namespace and this node's agent are found as ``kt`` finds them (``KT_SERVER``,
``KT_NAMESPACE`` or the pod's namespace, ``KT_AGENT``), or given per call. With
``kubeconfig_path`` (or ``KT_KUBECONFIG``) from outside the cluster, the store server is reached
by port-forward through the Kubernetes API and a token of a ServiceAccount of the namespace is
presented; ``KT_CONTEXT``, ``KT_STORE_SERVICE`` and ``KT_SERVICE_ACCOUNT`` choose the context,
the store's Service and the ServiceAccount, as for ``kt``. Every call releases the GIL while it
transfers, and Ctrl-C ends it cleanly (no half-written destination).
"""

from __future__ import annotations

import enum
import json
import os
import shlex
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _native, tensors
from .errors import InvalidKeyError, KeyNotFoundError

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["put", "get", "ls", "rm", "BroadcastWindow", "Locale"]


class Locale(str, enum.Enum):
    """Where a publication's bytes live: copied to the store, or left on this node in place."""

    STORE = "store"
    LOCAL = "local"

    def __str__(self) -> str:
        return self.value


@dataclass
class BroadcastWindow:
    """A broadcast window: the putters and getters of one distribution join it, and its quorum
    closes when ANY of ``timeout`` (seconds), ``world_size`` (participants) or ``ips`` (all of
    them joined) is reached. Getters of files start at once and fetch from each other, each
    serving ``fanout`` fetches at once (default 1); a putter with a window waits for the quorum. ``group_id`` names the window
    (default: one per key). ``pack`` is for state dicts of tensors (uint8 buckets); files are
    never packed.
    """

    timeout: Optional[float] = None
    world_size: Optional[int] = None
    ips: Optional[List[str]] = None
    group_id: Optional[str] = None
    fanout: Optional[int] = None
    pack: bool = False

    def __post_init__(self) -> None:
        if self.timeout is None and self.world_size is None and not self.ips:
            raise InvalidKeyError(
                "a BroadcastWindow needs at least one of timeout, world_size or ips "
                "to close its quorum"
            )
        if self.timeout is not None and self.timeout < 0:
            raise InvalidKeyError("timeout must be >= 0 seconds")
        if self.world_size is not None and self.world_size < 1:
            raise InvalidKeyError("world_size must be at least 1")
        if self.fanout is not None and self.fanout < 1:
            raise InvalidKeyError("fanout must be at least 1")

    def to_dict(self) -> Dict[str, Any]:
        return {
            "timeout": self.timeout,
            "world_size": self.world_size,
            "ips": list(self.ips) if self.ips else None,
            "group_id": self.group_id,
            "fanout": self.fanout,
            "pack": self.pack,
        }

    def _kwargs(self) -> Dict[str, Any]:
        return {
            "window_timeout": self.timeout,
            "world_size": self.world_size,
            "ips": list(self.ips or []),
            "group_id": self.group_id,
            "fanout": self.fanout,
        }


def _filters(filter_options: Union[None, str, Sequence[str]]) -> Dict[str, List[str]]:
    """rsync filter options as ktfs's excludes and includes.

    Takes what rsync takes: ``--exclude=PAT``, ``--exclude PAT``, ``--include=...``,
    ``--filter='- PAT'`` / ``-f '+ PAT'``, and bare rules ``- PAT`` / ``+ PAT``, in one string
    (split as a shell would) or a list. Patterns are rsync's (gitignore-like).
    """
    if not filter_options:
        return {"excludes": [], "includes": []}
    words = shlex.split(filter_options) if isinstance(filter_options, str) else list(filter_options)
    excludes: List[str] = []
    includes: List[str] = []

    def rule(r: str) -> None:
        r = r.strip()
        if r.startswith("- ") or r.startswith("exclude "):
            excludes.append(r.split(" ", 1)[1].strip())
        elif r.startswith("+ ") or r.startswith("include "):
            includes.append(r.split(" ", 1)[1].strip())
        else:
            raise InvalidKeyError(f"unsupported filter rule {r!r}: use '- PATTERN' or '+ PATTERN'")

    i = 0
    while i < len(words):
        w = words[i]
        value = None
        for flag, out in (("--exclude", excludes), ("--include", includes)):
            if w == flag and i + 1 < len(words):
                out.append(words[i + 1])
                i += 1
                value = True
            elif w.startswith(flag + "="):
                out.append(w.split("=", 1)[1])
                value = True
        if value is None:
            if w in ("--filter", "-f") and i + 1 < len(words):
                rule(words[i + 1])
                i += 1
            elif w.startswith("--filter="):
                rule(w.split("=", 1)[1])
            elif w[:2] in ("- ", "+ ") or w in ("-", "+"):
                if w in ("-", "+") and i + 1 < len(words):
                    rule(f"{w} {words[i + 1]}")
                    i += 1
                else:
                    rule(w)
            else:
                raise InvalidKeyError(f"unsupported filter option {w!r}")
        i += 1
    return {"excludes": excludes, "includes": includes}


def _is_tensor_like(x: Any) -> bool:
    if isinstance(x, dict):
        return bool(x) and all(_is_tensor_like(v) for v in x.values())
    t = type(x)
    return t.__module__.startswith(("torch", "numpy", "cupy", "jax")) or hasattr(
        x, "__cuda_array_interface__"
    )


def _listify(key: Union[str, Sequence[str]]) -> List[str]:
    return [key] if isinstance(key, str) else list(key)


def _common(namespace: Optional[str], kubeconfig_path: Optional[PathLike]) -> Dict[str, Any]:
    return {
        "namespace": namespace,
        "kubeconfig": os.fspath(kubeconfig_path) if kubeconfig_path is not None else None,
    }


def put(
    key: Union[str, Sequence[str]],
    src: Any = None,
    locale: Union[str, Locale] = "store",
    broadcast: Optional[BroadcastWindow] = None,
    contents: bool = False,
    filter_options: Union[None, str, Sequence[str]] = None,
    force: bool = False,
    verbose: bool = False,
    namespace: Optional[str] = None,
    kubeconfig_path: Optional[PathLike] = None,
    start_rsyncd: bool = True,
    base_path: PathLike = "/",
    nccl_port: int = 29500,
    nccl_pg_mode: Optional[str] = None,
) -> None:
    """Publish a file or a directory under ``key``.

    ``src`` is a path: a directory is published itself (``src/`` or ``contents=True``: its
    contents), a file becomes the key. A second put of a key updates it to what ``src`` holds
    now, as rsync would. ``locale="store"`` copies the bytes to the store server;
    ``"local"`` registers them with this node's agent, which serves them in place (``src`` must
    lie below ``base_path``). With ``broadcast`` the putter joins that window and waits for its
    quorum. ``key`` may be a list, with ``src`` a list of the same length; one key with a list
    of sources is a directory holding each of them (as ``kt put KEY --src a --src b``).
    ``contents=True`` with one file makes the key a directory holding that file by its name.

    ``force``: as rsync's ``--checksum``, trust neither size nor mtime and hash every file
    (without it, files whose size and mtime are unchanged since this machine's last put of the
    key, or since the key's version, are not read again). ``start_rsyncd`` has no effect (the node agent serves
    publications in place; there is no rsync daemon). ``nccl_port`` has no effect either: a
    window's NCCL group is set up from the unique id its putter's worker made (NCCL picks that
    port) and the store server handed to every member. ``nccl_pg_mode`` is for tensors.

    A tensor or a state dict (``src=model.state_dict()``; torch, numpy or CUDA arrays) is
    published as a GPU key through the mount's ``/kt/.gpu`` (``KT_MOUNT``, default ``/kt``):
    CUDA memory stays where it is and is read by CUDA IPC, CPU tensors are copied once to
    ``/dev/shm``. The key stays published while this process lives (or until ``rm``); with
    ``broadcast`` the put returns once every getter of the window holds the tensors.
    ``nccl_pg_mode="global"`` runs one transfer at a time per node's worker.
    """
    del start_rsyncd, nccl_port
    keys = _listify(key)
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    if len(keys) == 1 and len(srcs) > 1 and not any(_is_tensor_like(s) for s in srcs):
        # One key from several sources: the key is a directory holding each of them.
        groups = [(keys[0], srcs)]
    elif len(keys) != len(srcs):
        raise InvalidKeyError(
            f"{len(keys)} keys but {len(srcs)} sources: give one source per key, or one key"
        )
    else:
        groups = [(k, [s]) for k, s in zip(keys, srcs)]
    locale = Locale(str(locale))
    filters = _filters(filter_options)
    base = os.path.abspath(os.fspath(base_path))
    window = broadcast._kwargs() if broadcast is not None else {}
    for k, group in groups:
        if any(s is None for s in group):
            raise InvalidKeyError(f"put of {k!r} needs a src")
        if len(group) == 1 and _is_tensor_like(group[0]):
            tensors.put(k, group[0], window=broadcast, pg_mode=nccl_pg_mode)
            continue
        paths = [os.fspath(s) for s in group]
        for path in paths:
            if locale is Locale.LOCAL:
                absolute = os.path.abspath(path)
                if os.path.commonpath([base, absolute]) != base:
                    raise InvalidKeyError(f"{path} is not below base_path {base}")
        _native.put(
            k,
            paths,
            locale=locale.value,
            force=force,
            contents=contents,
            verbose=verbose,
            **filters,
            **window,
            **_common(namespace, kubeconfig_path),
        )


def get(
    key: Union[str, Sequence[str]],
    dest: Any = None,
    broadcast: Optional[BroadcastWindow] = None,
    contents: bool = False,
    filter_options: Union[None, str, Sequence[str]] = None,
    force: bool = False,
    verbose: bool = False,
    namespace: Optional[str] = None,
    kubeconfig_path: Optional[PathLike] = None,
    nccl_pg_mode: Optional[str] = None,
) -> Any:
    """Copy ``key`` to ``dest`` (default: the current directory).

    A directory lands as ``dest/NAME`` (``contents=True``: its contents straight in ``dest``);
    a file lands at ``dest`` (or ``dest/NAME`` when ``dest`` is a directory or ends in ``/``).
    Files already there with the same size and mtime are kept; one that differs is replaced
    only with ``force=True``. With ``broadcast`` the getter joins that window and fetches from
    the other members. ``key`` may be a list: ``dest`` is then one directory (each key lands
    below it) or a list of the same length.

    A GPU key (published from tensors) is received into ``dest``, a tensor or a state dict
    whose names, dtypes and shapes match the key's (``model.state_dict()``: received in
    place, on the GPU or the CPU), and returned; with ``dest=None`` it is allocated on the CPU
    from the key's table. With ``broadcast`` every getter and the putter join one window and
    one coordinated transfer fills them all (``pack=True``: mixed dtypes in bounded buckets).
    """
    keys = _listify(key)
    if len(keys) == 1 and (_is_tensor_like(dest) or (dest is None and tensors.is_gpu_key(keys[0]))):
        return tensors.get(keys[0], dest, window=broadcast, pg_mode=nccl_pg_mode)
    if isinstance(dest, (list, tuple)):
        if len(dest) != len(keys):
            raise InvalidKeyError(f"{len(keys)} keys but {len(dest)} destinations")
        dests = [os.fspath(d) for d in dest]
    else:
        d = "." if dest is None else os.fspath(dest)
        if len(keys) > 1 and not d.endswith("/"):
            d += "/"
        dests = [d] * len(keys)
    filters = _filters(filter_options)
    window = broadcast._kwargs() if broadcast is not None else {}
    for k, d in zip(keys, dests):
        _native.get(
            k,
            d,
            force=force,
            contents=contents,
            verbose=verbose,
            **filters,
            **window,
            **_common(namespace, kubeconfig_path),
        )


def ls(
    key: str = "",
    verbose: bool = False,
    namespace: Optional[str] = None,
    kubeconfig_path: Optional[PathLike] = None,
) -> List[Dict[str, Any]]:
    """The keys and directories directly below ``key`` (or the namespace's root): each a dict
    with ``name`` (ending in ``/`` for a directory), ``is_directory`` and ``locale`` (``store``,
    or the node that published it in place). ``verbose`` adds each entry's ``size``."""
    entries = json.loads(_native.ls(key, **_common(namespace, kubeconfig_path)))
    if not verbose:
        for e in entries:
            e.pop("size", None)
    return entries


def rm(
    key: Union[str, Sequence[str]],
    recursive: bool = False,
    prefix: bool = False,
    verbose: bool = False,
    namespace: Optional[str] = None,
    kubeconfig_path: Optional[PathLike] = None,
) -> None:
    """Remove ``key``: a directory only with ``recursive=True`` (and everything below it);
    with ``prefix=True`` every key whose name starts with ``key``. ``verbose`` prints what was
    removed. Tensors this process published at ``key`` stop being published."""
    for k in _listify(key):
        held = tensors.release(k, prefix=prefix, recursive=recursive)
        try:
            removed = _native.rm(k, recursive=recursive, prefix=prefix, **_common(namespace, kubeconfig_path))
        except KeyNotFoundError:
            # Closing this process's control files unpublished them first.
            if not held:
                raise
            removed = [k]
        if verbose:
            for r in removed:
                print(f"removed {r}")
