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


def open_storage(
    location: str, credentials_file: str | None = None, token_file: str | None = None, api_url: str | None = None
) -> Storage:
    """The backend for GDRIVE_PATH: ``gdrive://<folder-id>/path`` (Drive API), any fsspec URL (``s3://``,
    ``gs://``, ``memory://``), else a local or mounted folder. PyDrive2's filesystem is not wired yet."""
    if location.startswith("gdrive://"):
        from swarm_gdrive.storage.drive import DriveStorage, build_service, parse_drive_url

        folder_id, prefix = parse_drive_url(location)
        return DriveStorage(folder_id, prefix, service=build_service(credentials_file, token_file, api_url))
    if "://" in location:
        from swarm_gdrive.storage.fsspec_storage import FsspecStorage

        if location.startswith("pydrive2://"):
            raise StorageError("GDRIVE_PATH=pydrive2://...: PyDrive2's filesystem is not supported yet; use gdrive://")
        return FsspecStorage(location)
    return LocalStorage(location)
