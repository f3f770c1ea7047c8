"""The ctypes structures of ktfs.gpu_abi are the ones the mount decodes."""

import ctypes

from ktfs import _native, gpu_abi


def test_the_ctypes_structs_match_the_mounts_abi():
    want = _native.gpu_abi()
    assert ctypes.sizeof(gpu_abi.Buffer) == want["buffer"] == 96
    assert ctypes.sizeof(gpu_abi.Buffers) == want["buffers"]
    assert ctypes.sizeof(gpu_abi.Window) == want["window"]
    assert ctypes.sizeof(gpu_abi.Status) == want["status"]
    assert (gpu_abi.PUT, gpu_abi.GET, gpu_abi.JOIN, gpu_abi.STATUS) == (
        want["put"],
        want["get"],
        want["join"],
        want["status_cmd"],
    )
    assert (gpu_abi.ABI_VERSION, gpu_abi.BATCH) == (want["version"], want["batch"])
