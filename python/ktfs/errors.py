"""The exceptions of ktfs: one class per kind of failure, all of them ``DataStoreError`` (the
name the reference data store gave its base; ``KtError`` is the same class); the message is the
one ``kt`` prints, and ``kt``'s exit code tells the same kinds apart (see the README).

Where the reference raised a builtin exception, the class is that builtin too, so code written
against it catches what it caught: a missing key is a ``KeyError``, a bad key or a missing source
a ``ValueError``, a window that ran out of time a ``TimeoutError``, a refused caller a
``PermissionError``, a server that cannot be reached a ``ConnectionError``.
"""


class DataStoreError(Exception):
    """A ktfs call failed."""


KtError = DataStoreError


class KeyNotFoundError(DataStoreError, KeyError):
    """The key or prefix does not exist."""

    def __str__(self) -> str:
        # KeyError would show its message quoted, as it shows a missing dict key.
        return Exception.__str__(self)


class InvalidKeyError(DataStoreError, ValueError):
    """A bad key, namespace, source or argument, refused before anything changed."""


class UnreachableError(DataStoreError, ConnectionError):
    """The store server or this node's agent cannot be reached."""


class ConflictError(DataStoreError):
    """The key exists, a destination differs, or the key changed meanwhile."""


class BroadcastTimeoutError(DataStoreError, TimeoutError):
    """A broadcast window or a call ran out of time."""


class TableMismatchError(DataStoreError, ValueError):
    """A participant's tensor table differs from the publisher's."""


class UnavailableError(DataStoreError):
    """No source could give every block."""


class PermissionDeniedError(DataStoreError, PermissionError):
    """The caller is not allowed."""


__all__ = [
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
