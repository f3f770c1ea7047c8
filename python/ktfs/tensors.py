"""Tensors and state dicts as GPU keys, through the mount's ``/kt/.gpu`` control files (the one
path for GPU data: doc/gpu-abi.md describes it). The mount is found at ``KT_MOUNT``, default
``/kt``.

A tensor (torch, numpy, or anything with ``__cuda_array_interface__``) or a dict of them (a
state dict) is one key; a lone tensor is the one entry named ``tensor``. CUDA tensors are handed
over by CUDA IPC handle (taken through libcuda) and never copied on the host; CPU tensors are
copied once into a file in ``/dev/shm`` that the node's transfer worker reads or fills.

A put keeps the tensors published while this process holds them: until ``kt.rm`` of the key, a
new put of it, or the process's exit (the mount unpublishes a key whose control file closed).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import mmap
import os
import secrets
import select
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import gpu_abi as abi
from .errors import (
    BroadcastTimeoutError,
    ConflictError,
    KeyNotFoundError,
    KtError,
    PermissionDeniedError,
    TableMismatchError,
    UnavailableError,
)

#: The entry name a lone tensor takes in its key's table.
SINGLE = "tensor"
SHM_DIR = "/dev/shm"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.ioctl.restype = ctypes.c_int

_NUMPY_TYPESTR = {
    "b1": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32",
    "u4": "uint32", "i8": "int64", "u8": "uint64", "f2": "float16", "f4": "float32",
    "f8": "float64", "c8": "complex64", "c16": "complex128",
}


def mount() -> str:
    return os.environ.get("KT_MOUNT", "/kt")


def _control_path(key: str) -> str:
    key = key.strip("/")
    if not key:
        raise ValueError("a GPU key needs a name")
    return os.path.join(mount(), ".gpu", key)


def _require_mount() -> None:
    if not os.path.isdir(os.path.join(mount(), ".gpu")):
        raise UnavailableError(
            f"tensors move through the ktfs mount's control files, and {mount()}/.gpu is not "
            "there: mount ktfs (the CSI volume, or `kt mount`) and set KT_MOUNT if it is not /kt"
        )


@dataclass
class _Tensor:
    """One tensor as the ABI sees it."""

    name: str
    obj: Any
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    ptr: int
    cuda: bool
    device: int
    #: Where a CPU tensor's bytes are in its registration's /dev/shm file.
    offset: int = 0


def _describe(name: str, x: Any, writable: bool) -> _Tensor:
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not x.is_contiguous():
            raise ValueError(f"{name}: the tensor must be contiguous (call .contiguous())")
        dtype = str(x.dtype).replace("torch.", "")
        cuda = bool(x.is_cuda)
        return _Tensor(name, x, dtype, tuple(x.shape), x.numel() * x.element_size(), x.data_ptr(),
                       cuda, (x.device.index or 0) if cuda else -1)
    if mod.startswith("numpy"):
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: the array must be C-contiguous (numpy.ascontiguousarray)")
        if writable and not x.flags.writeable:
            raise ValueError(f"{name}: the array is read-only and cannot be received into")
        dtype = "bool" if x.dtype.kind == "b" else x.dtype.name
        return _Tensor(name, x, dtype, tuple(x.shape), x.nbytes, x.ctypes.data, False, -1)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None:
            raise ValueError(f"{name}: the array must be C-contiguous")
        dtype = _NUMPY_TYPESTR.get(cai["typestr"][1:])
        if dtype is None:
            raise ValueError(f"{name}: unsupported dtype {cai['typestr']}")
        shape = tuple(cai["shape"])
        n = 1
        for s in shape:
            n *= s
        size = int(cai["typestr"][2:])
        return _Tensor(name, x, dtype, shape, n * size, cai["data"][0], True, _cuda().device_of(cai["data"][0]))
    raise TypeError(f"{name}: {type(x).__name__} is not a tensor (torch, numpy or CUDA array)")


def _flatten(x: Any, writable: bool) -> List[_Tensor]:
    if isinstance(x, dict):
        if not x:
            raise ValueError("an empty state dict has nothing to move")
        return [_describe(str(k), v, writable) for k, v in x.items()]
    return [_describe(SINGLE, x, writable)]


def _table(tensors: List[_Tensor]) -> bytes:
    entries = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in tensors]
    return json.dumps({"entries": entries}).encode()


class _Cuda:
    """What of libcuda the tensor path needs: the base of an allocation and its IPC handle."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise UnavailableError(f"CUDA tensors need the CUDA driver (libcuda.so.1): {e}") from e
        self._check(self.lib.cuInit(0), "cuInit")

    def _check(self, r: int, call: str) -> None:
        if r != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(r, ctypes.byref(name))
            raise KtError(f"{call}: {(name.value or b'?').decode()} ({r})")

    def _with_context(self, device: int) -> None:
        current = ctypes.c_void_p()
        self._check(self.lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value:
            return
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def device_of(self, ptr: int) -> int:
        dev = ctypes.c_int()
        # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        self._check(self.lib.cuPointerGetAttribute(ctypes.byref(dev), 9, ctypes.c_uint64(ptr)),
                    "cuPointerGetAttribute")
        return dev.value

    def ipc(self, ptr: int, device: int) -> Tuple[bytes, int]:
        """The IPC handle of the allocation that holds ``ptr``, and ``ptr``'s offset in it."""
        self._with_context(device)
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                     ctypes.c_uint64(ptr)), "cuMemGetAddressRange")
        handle = (ctypes.c_uint8 * 64)()
        self._check(self.lib.cuIpcGetMemHandle(handle, base), "cuIpcGetMemHandle (only cuMemAlloc "
                    "memory exports: not a stream-ordered pool)")
        return bytes(handle), ptr - base.value


_cuda_lock = threading.Lock()
_cuda_driver: Optional[_Cuda] = None


def _cuda() -> _Cuda:
    global _cuda_driver
    with _cuda_lock:
        if _cuda_driver is None:
            _cuda_driver = _Cuda()
        return _cuda_driver


def _synchronize(tensors: List[_Tensor]) -> None:
    """Waits for the work queued on the tensors' devices: their bytes are final."""
    for d in sorted({t.device for t in tensors if t.cuda and type(t.obj).__module__.startswith("torch")}):
        import torch

        torch.cuda.synchronize(d)


_counter = itertools.count()


def _sweep_dead() -> None:
    """Removes the /dev/shm files of this user's processes that are gone: a process killed in
    the middle of a transfer could not remove its own (a publication's is unnamed as soon as
    the node's worker holds it, so only a transfer under way leaves one)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    me = os.getuid()
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "kt" or parts[1] != "py" or not parts[2].isdigit():
            continue
        if os.path.exists(f"/proc/{parts[2]}"):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            if os.stat(path).st_uid == me:
                os.unlink(path)
        except OSError:
            pass


class _Shm:
    """A file in /dev/shm holding the CPU tensors of one registration, one after the other."""

    def __init__(self, size: int) -> None:
        _sweep_dead()
        self.name = f"kt-py-{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"
        self.path = os.path.join(SHM_DIR, self.name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            self.map = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def address(self, offset: int) -> int:
        return self._base + offset

    def unname(self) -> None:
        """Removes the file's name: whoever holds it open or mapped (the node's worker, which
        serves a publication from it) keeps its bytes, and they go when the last one lets go,
        however this process ends."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.unname()
        # The ctypes view keeps the map exported until it is gone.
        self._base = 0
        try:
            self.map.close()
        except BufferError:
            pass


_ERRORS = {
    errno.ENOENT: KeyNotFoundError,
    errno.EBADMSG: TableMismatchError,
    errno.ETIMEDOUT: BroadcastTimeoutError,
    errno.EEXIST: ConflictError,
    errno.EBUSY: ConflictError,
    errno.ENODEV: UnavailableError,
    errno.EACCES: PermissionDeniedError,
    errno.EPERM: PermissionDeniedError,
}


def _error(err: int, what: str) -> Exception:
    cls = _ERRORS.get(err, KtError)
    if err == errno.EINVAL:
        return ValueError(what)
    return cls(what)


class _Control:
    """One open control file and what its registration holds."""

    def __init__(self, key: str, create: bool) -> None:
        self.key = key
        path = _control_path(key)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        if create:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            self.fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            raise KeyNotFoundError(f"no GPU key {key!r} is published") from None
        except OSError as e:
            raise _error(e.errno or 0, f"opening {path}: {e.strerror}") from None
        self.shm: Optional[_Shm] = None
        self.keep: List[_Tensor] = []

    def ioctl(self, cmd: int, arg: ctypes.Structure, what: str) -> int:
        r = _libc.ioctl(self.fd, cmd, ctypes.addressof(arg))
        if r < 0:
            e = ctypes.get_errno()
            raise _error(e, f"{what} of {self.key!r}: {os.strerror(e)}")
        return r

    def write_table(self, table: bytes) -> None:
        done = 0
        while done < len(table):
            done += os.pwrite(self.fd, table[done:], done)

    def describe(self) -> Dict[str, Any]:
        out = b""
        while True:
            chunk = os.pread(self.fd, 1 << 16, len(out))
            if not chunk:
                break
            out += chunk
        return json.loads(out or b"{}")

    def join(self, window: Any, pg_mode: Optional[str]) -> None:
        w = abi.Window()
        w.version = abi.ABI_VERSION
        w.world_size = window.world_size or 0
        w.timeout_ms = int(round((window.timeout or 0) * 1000))
        w.fanout = window.fanout or 0
        w.flags = (abi.PACK if window.pack else 0) | _pg_flag(pg_mode)
        group = (window.group_id or "").encode()
        ips = ",".join(window.ips or []).encode()
        if len(group) >= 128 or len(ips) >= 1024:
            raise ValueError("group_id must be under 128 bytes and the ips under 1024 in all")
        w.group_id = group
        w.ips = ips
        self.ioctl(abi.JOIN, w, "joining the window")

    def commit(self, cmd: int, tensors: List[_Tensor]) -> int:
        """Hands over every tensor's buffer, in batches; the transfer's id."""
        buffers: List[abi.Buffer] = []
        for i, t in enumerate(tensors):
            b = abi.Buffer()
            b.entry, b.nbytes = i, t.nbytes
            if t.cuda:
                handle, offset = _cuda().ipc(t.ptr, t.device)
                b.kind, b.device, b.offset = abi.BUF_CUDA_IPC, t.device, offset
                ctypes.memmove(b.handle, handle, 64)
            else:
                b.kind, b.device, b.offset = abi.BUF_HOST_SHM, -1, t.offset
                name = self.shm.name.encode()  # type: ignore[union-attr]
                ctypes.memmove(b.handle, name, len(name))
            buffers.append(b)
        transfer = 0
        for start in range(0, len(buffers), abi.BATCH):
            batch = buffers[start:start + abi.BATCH]
            arg = abi.Buffers()
            arg.version, arg.count = abi.ABI_VERSION, len(batch)
            arg.flags = abi.COMMIT if start + abi.BATCH >= len(buffers) else 0
            for j, b in enumerate(batch):
                arg.buffers[j] = b
            transfer = self.ioctl(cmd, arg, "PUT" if cmd == abi.PUT else "GET")
        return transfer

    def wait(self, transfer: int) -> abi.Status:
        """Waits in poll(2), a fraction of a second at a time so that Ctrl-C ends it, for the
        transfer to finish; its status, or the failure raised."""
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        while not p.poll(250):
            pass
        st = abi.Status()
        st.transfer = transfer
        self.ioctl(abi.STATUS, st, "STATUS")
        if st.state != abi.DONE:
            msg = st.message.decode(errors="replace") or os.strerror(st.error)
            raise _error(st.error, f"{self.key!r}: {msg}")
        return st

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.shm is not None:
            self.shm.close()
            self.shm = None


def _pg_flag(mode: Optional[str]) -> int:
    if mode in (None, "", "per_transfer", "local"):
        return 0
    if mode in ("global", "single"):
        return abi.PG_GLOBAL
    raise ValueError(f"nccl_pg_mode {mode!r}: use None (a group per transfer) or 'global' "
                     "(one transfer at a time per worker)")


def _stage(ctl: _Control, tensors: List[_Tensor]) -> None:
    """Places the CPU tensors in a /dev/shm file of the control file's, each at its offset."""
    at = 0
    for t in tensors:
        if not t.cuda:
            t.offset = at
            at += t.nbytes
    if any(not t.cuda for t in tensors):
        ctl.shm = _Shm(at)


_held_lock = threading.Lock()
#: What this process publishes, by (mount, key): the control files that keep it published.
_held: Dict[Tuple[str, str], _Control] = {}


def _forget(key: str) -> None:
    with _held_lock:
        ctl = _held.pop((mount(), key.strip("/")), None)
    if ctl is not None:
        ctl.close()


def release(key: str, prefix: bool = False, recursive: bool = False) -> bool:
    """Stops publishing what this process published at ``key`` (and below it, or every key
    starting with it); whether there was any."""
    k = key.strip("/")
    with _held_lock:
        doomed = [
            hk for hk in _held
            if hk[0] == mount()
            and (hk[1] == k or (recursive and hk[1].startswith(k + "/")) or (prefix and hk[1].startswith(k)))
        ]
        ctls = [_held.pop(hk) for hk in doomed]
    for c in ctls:
        c.close()
    return bool(ctls)


def put(key: str, src: Any, window: Any = None, pg_mode: Optional[str] = None) -> None:
    """Publishes ``src`` at ``key``; with ``window``, returns once every getter holds it."""
    _require_mount()
    tensors = _flatten(src, writable=False)
    _forget(key)
    ctl = _Control(key, create=True)
    try:
        ctl.write_table(_table(tensors))
        if window is not None:
            ctl.join(window, pg_mode)
        _stage(ctl, tensors)
        for t in tensors:
            if not t.cuda and t.nbytes:
                ctypes.memmove(ctl.shm.address(t.offset), t.ptr, t.nbytes)  # type: ignore[union-attr]
        _synchronize(tensors)
        ctl.wait(ctl.commit(abi.PUT, tensors))
        # Published: the worker holds the /dev/shm file open, so its name can go now, and the
        # bytes go with the publication, even if this process is killed.
        if ctl.shm is not None:
            ctl.shm.unname()
        # The worker reads CUDA tensors where they are: they must outlive the publication,
        # even when the caller kept no reference (`src=torch.randn(..., device="cuda")`).
        ctl.keep = tensors
    except BaseException:
        ctl.close()
        raise
    with _held_lock:
        _held[(mount(), key.strip("/"))] = ctl


def _allocate(desc: Dict[str, Any]) -> Any:
    """Tensors for a key's table, on the CPU (torch if it is there, else numpy)."""
    entries = desc.get("entries") or []
    try:
        import torch

        def make(e: Dict[str, Any]) -> Any:
            return torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
    except ImportError:
        import numpy

        def make(e: Dict[str, Any]) -> Any:
            try:
                dt = numpy.dtype(e["dtype"])
            except TypeError:
                raise TypeError(f"entry {e['name']}: numpy has no {e['dtype']}; install torch or "
                                "pass dest") from None
            return numpy.empty(e["shape"], dtype=dt)

    out = {e["name"]: make(e) for e in entries}
    if list(out) == [SINGLE]:
        return out[SINGLE]
    return out


def get(key: str, dest: Any = None, window: Any = None, pg_mode: Optional[str] = None) -> Any:
    """Receives ``key`` into ``dest`` (a tensor or a state dict of the key's table; ``None``:
    allocated on the CPU from the key's description); returns ``dest``."""
    _require_mount()
    if dest is None:
        if window is not None:
            raise ValueError("a getter in a window must bring its buffers (dest): the putter "
                             "may not have published the table yet")
        probe = _Control(key, create=False)
        try:
            desc = probe.describe()
        finally:
            probe.close()
        if not desc.get("entries"):
            raise KeyNotFoundError(f"no GPU key {key!r} is published")
        dest = _allocate(desc)
    tensors = _flatten(dest, writable=True)
    ctl = _Control(key, create=window is not None)
    try:
        ctl.write_table(_table(tensors))
        if window is not None:
            ctl.join(window, pg_mode)
        _stage(ctl, tensors)
        ctl.wait(ctl.commit(abi.GET, tensors))
        for t in tensors:
            if not t.cuda and t.nbytes:
                ctypes.memmove(t.ptr, ctl.shm.address(t.offset), t.nbytes)  # type: ignore[union-attr]
        _synchronize(tensors)
    finally:
        ctl.close()
    return dest


def is_gpu_key(key: str) -> bool:
    """Whether ``key`` names a published GPU key, as the mount here sees it."""
    try:
        return os.path.isfile(_control_path(key))
    except (OSError, ValueError):
        return False
