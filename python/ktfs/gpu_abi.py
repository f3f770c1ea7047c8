"""The ioctl ABI of ktfs's GPU control files (/kt/.gpu/<key>) as ctypes structures: what
include/ktfs_gpu.h declares for C, for Python callers and for the package's tensor path.
doc/gpu-abi.md describes the protocol; the sizes and command numbers here are checked against
the ones the control files decode (``ktfs._native.gpu_abi()``) by the package's tests."""

import ctypes

ABI_VERSION = 1
MAGIC = ord("k")
BATCH = 128

BUF_CUDA_IPC = 1
BUF_HOST_SHM = 2
COMMIT = 1
PACK = 1
PG_GLOBAL = 2
PENDING, RUNNING, DONE, FAILED = 0, 1, 2, 3


class Buffer(ctypes.Structure):
    """Where the bytes of one table entry are (PUT), or go (GET)."""

    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("entry", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("handle", ctypes.c_uint8 * 64),
    ]


class Buffers(ctypes.Structure):
    """The argument of PUT and GET: one batch of at most BATCH buffers."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("buffers", Buffer * BATCH),
    ]


class Window(ctypes.Structure):
    """The argument of JOIN."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_uint64),
        ("fanout", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("group_id", ctypes.c_char * 128),
        ("ips", ctypes.c_char * 1024),
    ]


class Status(ctypes.Structure):
    """The argument of STATUS: ``transfer`` in, the rest out."""

    _fields_ = [
        ("transfer", ctypes.c_uint64),
        ("state", ctypes.c_uint32),
        ("error", ctypes.c_int32),
        ("bytes_done", ctypes.c_uint64),
        ("bytes_total", ctypes.c_uint64),
        ("message", ctypes.c_char * 256),
    ]


_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (MAGIC << 8) | nr


PUT = _ioc(_IOC_WRITE, 1, ctypes.sizeof(Buffers))
GET = _ioc(_IOC_WRITE, 2, ctypes.sizeof(Buffers))
JOIN = _ioc(_IOC_WRITE, 3, ctypes.sizeof(Window))
STATUS = _ioc(_IOC_READ | _IOC_WRITE, 4, ctypes.sizeof(Status))
