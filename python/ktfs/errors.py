"""The exceptions of ktfs: one class per kind of failure, all of them ``KtError``; the message
is the one ``kt`` prints, and ``kt``'s exit code tells the same kinds apart (see the README)."""

from ._native import (
    BroadcastTimeoutError,
    ConflictError,
    InvalidKeyError,
    KeyNotFoundError,
    KtError,
    PermissionDeniedError,
    TableMismatchError,
    UnavailableError,
    UnreachableError,
)

__all__ = [
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
