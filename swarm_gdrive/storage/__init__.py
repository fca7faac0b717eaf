"""Storage backends behind one narrow interface."""

from __future__ import annotations

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    Storage,
    StorageError,
)
from swarm_gdrive.storage.local import LocalStorage

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "FileInfo",
    "FileTooLargeError",
    "LocalStorage",
    "Storage",
    "StorageError",
    "open_storage",
]


def open_storage(location: str) -> Storage:
    """The backend for GDRIVE_PATH. Today: a local or mounted folder."""
    return LocalStorage(location)
