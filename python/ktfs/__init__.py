"""ktfs from Python, with the API of the data store it replaces.

    import ktfs as kt
    kt.put(key="my-service/weights", src="./trained_model/")
    kt.get(key="my-service/weights", dest="./local_model/")
    kt.ls("my-service")
    kt.rm("my-service/temp-data", recursive=True)

and ``kt://`` URLs for fsspec (``ktfs.fsspec.KtFileSystem``).
"""

from .api import BroadcastWindow, Locale, get, ls, put, rm
from .errors import (
    BroadcastTimeoutError,
    ConflictError,
    DataStoreError,
    InvalidKeyError,
    KeyNotFoundError,
    KtError,
    PermissionDeniedError,
    TableMismatchError,
    UnavailableError,
    UnreachableError,
)

__all__ = [
    "put",
    "get",
    "ls",
    "rm",
    "BroadcastWindow",
    "Locale",
    "DataStoreError",
    "KtError",
    "KeyNotFoundError",
    "InvalidKeyError",
    "UnreachableError",
    "ConflictError",
    "BroadcastTimeoutError",
    "TableMismatchError",
    "UnavailableError",
    "PermissionDeniedError",
]
