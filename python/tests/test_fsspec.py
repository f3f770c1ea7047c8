"""`kt://` through fsspec: ranges fetch only the blocks they touch, writes publish on close,
and pandas reads a parquet key by URL."""

import os
import subprocess

import fsspec
import pandas as pd
import pytest

import ktfs as kt
from ktfs import _native

BLOCK = 64 * 1024


def test_a_range_read_fetches_only_the_blocks_it_touches(cluster, tmp_path):
    data = os.urandom(1 << 20)  # 16 blocks of 64 KiB, none alike
    src = tmp_path / "ranged.bin"
    src.write_bytes(data)
    subprocess.run(
        [cluster["kt"], "put", "fs/ranged.bin", "--src", str(src), "--block-size", str(BLOCK)],
        check=True,
        capture_output=True,
    )
    fs = fsspec.filesystem("kt")
    assert fs.info("kt://fs/ranged.bin")["size"] == len(data)
    before = _native.blocks_fetched()
    with fs.open("kt://fs/ranged.bin", "rb", cache_type="none") as f:
        f.seek(300_000)
        assert f.read(1000) == data[300_000:301_000]
        assert _native.blocks_fetched() - before == 1
        f.seek(5 * BLOCK - 500)
        assert f.read(1000) == data[5 * BLOCK - 500 : 5 * BLOCK + 500]
        assert _native.blocks_fetched() - before == 3
    assert fs.cat_file("kt://fs/ranged.bin", start=-10) == data[-10:]


def test_writes_publish_on_close_and_listings_show_them(cluster, tmp_path):
    fs = fsspec.filesystem("kt")
    with fs.open("kt://fs/written/hello.txt", "wb") as f:
        f.write(b"hello ")
        f.write(b"world")
    assert fs.cat("kt://fs/written/hello.txt") == b"hello world"
    assert [e["name"] for e in kt.ls("fs/written")] == ["hello.txt"]
    listed = fs.ls("kt://fs", detail=True)
    assert {"name": "fs/written", "type": "directory"}.items() <= next(
        e for e in listed if e["name"] == "fs/written"
    ).items()
    assert fs.isdir("kt://fs/written") and fs.isfile("kt://fs/written/hello.txt")
    fs.rm("kt://fs/written/hello.txt")
    with pytest.raises(FileNotFoundError):
        fs.info("kt://fs/written/hello.txt")
    # A local file put by path, and fetched back by path.
    local = tmp_path / "up.txt"
    local.write_bytes(b"uploaded")
    fs.put_file(str(local), "kt://fs/written/up.txt")
    fs.get_file("kt://fs/written/up.txt", str(tmp_path / "down.txt"))
    assert (tmp_path / "down.txt").read_bytes() == b"uploaded"


def test_pandas_reads_a_parquet_key_by_url(cluster, tmp_path):
    df = pd.DataFrame({"a": range(1000), "b": [f"row {i}" for i in range(1000)]})
    local = tmp_path / "part-0.parquet"
    df.to_parquet(local)
    kt.put(key="my-service/data/part-0.parquet", src=str(local))
    got = pd.read_parquet("kt://my-service/data/part-0.parquet")
    pd.testing.assert_frame_equal(got, df)
