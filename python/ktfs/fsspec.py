"""``kt://`` for fsspec: ktfs keys as a filesystem for pandas, pyarrow, datasets and anything
else that opens URLs through fsspec.

``kt://my-service/data/part-0.parquet`` is the key ``my-service/data/part-0.parquet`` of the
namespace the environment names (``KT_NAMESPACE`` or the pod's); the store server comes from
``KT_SERVER`` as for ``kt``. Files open lazily: a read fetches only the blocks it touches (the
same verified block fetches as everywhere in ktfs). A file opened for writing is published when
it is closed. Directories are key prefixes and published directories; making one is a no-op.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Optional

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from . import _native
from .errors import KeyNotFoundError

__all__ = ["KtFileSystem", "KtFile"]


class KtFileSystem(AbstractFileSystem):
    """ktfs keys of one namespace as an fsspec filesystem."""

    protocol = "kt"
    root_marker = ""

    def __init__(
        self,
        namespace: Optional[str] = None,
        server: Optional[str] = None,
        kubeconfig_path: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._where = {
            "namespace": namespace,
            "server": server,
            "kubeconfig": os.fspath(kubeconfig_path) if kubeconfig_path else None,
        }

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        path = str(path)
        if path.startswith("kt://"):
            path = path[len("kt://") :]
        return path.strip("/")

    def _info_of(self, parent: str, e: Dict[str, Any]) -> Dict[str, Any]:
        name = e["name"].rstrip("/")
        full = f"{parent}/{name}" if parent else name
        return {
            "name": full,
            "size": 0 if e["is_directory"] else e.get("size", 0),
            "type": "directory" if e["is_directory"] else "file",
            "locale": e["locale"],
        }

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        path = self._strip_protocol(path)
        try:
            entries = json.loads(_native.ls(path, **self._where))
        except KeyNotFoundError as e:
            raise FileNotFoundError(path) from e
        if not entries:
            info = self.info(path)
            if info["type"] == "file":
                return [info] if detail else [info["name"]]
        out = [self._info_of(path, e) for e in entries]
        return out if detail else [o["name"] for o in out]

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        path = self._strip_protocol(path)
        if not path:
            return {"name": "", "size": 0, "type": "directory"}
        try:
            st = json.loads(_native.stat(path, **self._where))
        except KeyNotFoundError as e:
            raise FileNotFoundError(path) from e
        kind = "file" if st["type"] in ("file", "symlink") else "directory"
        return {"name": path, "size": st.get("size", 0), "type": kind, "mtime": st.get("mtime")}

    def cat_file(
        self, path: str, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        start = 0 if start is None else (start if start >= 0 else max(0, size + start))
        end = size if end is None else (end if end >= 0 else max(0, size + end))
        if end <= start:
            return b""
        try:
            return _native.read_range(path, start, end - start, **self._where)
        except KeyNotFoundError as e:
            raise FileNotFoundError(path) from e

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> "KtFile":
        return KtFile(
            self,
            self._strip_protocol(path),
            mode=mode,
            block_size=block_size or "default",
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        _native.put(self._strip_protocol(rpath), [os.fspath(lpath)], **self._where)

    def get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        _native.get(self._strip_protocol(rpath), os.fspath(lpath), force=True, **self._where)

    def rm_file(self, path: str) -> None:
        try:
            _native.rm(self._strip_protocol(path), **self._where)
        except KeyNotFoundError as e:
            raise FileNotFoundError(path) from e

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Optional[int] = None) -> None:
        for p in path if isinstance(path, list) else [path]:
            try:
                _native.rm(self._strip_protocol(p), recursive=recursive, **self._where)
            except KeyNotFoundError as e:
                raise FileNotFoundError(p) from e

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories are prefixes of keys: one exists once a key is below it."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """See :meth:`mkdir`."""


class KtFile(AbstractBufferedFile):
    """A key opened through fsspec: reads fetch the blocks of the ranges asked for; writes are
    staged in a local temporary file and published when the file is closed."""

    fs: KtFileSystem

    def _fetch_range(self, start: int, end: int) -> bytes:
        return _native.read_range(self.path, start, end - start, **self.fs._where)

    def _initiate_upload(self) -> None:
        fd, self._staged = tempfile.mkstemp(prefix=".kt-upload-")
        os.close(fd)

    def _upload_chunk(self, final: bool = False) -> bool:
        with open(self._staged, "ab") as f:
            f.write(self.buffer.getvalue())
        if final:
            try:
                _native.put(self.path, [self._staged], **self.fs._where)
            finally:
                os.unlink(self._staged)
        return True
