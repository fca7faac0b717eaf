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
    """The backend for GDRIVE_PATH: ``gdrive://<folder-id>/path`` (Drive API), ``pydrive2://...`` or any
    other fsspec URL (``s3://``, ``gs://``, ``memory://``), else a local or mounted folder."""
    if location.startswith("gdrive://"):
        from swarm_gdrive.storage.drive import DriveStorage, build_service, parse_drive_url

        folder_id, prefix = parse_drive_url(location)
        return DriveStorage(folder_id, prefix, service=build_service(credentials_file, token_file, api_url))
    if "://" in location:
        from swarm_gdrive.storage.fsspec_storage import FsspecStorage

        # PyDrive2's fsspec filesystem also calls itself gdrive://; pydrive2:// selects it.
        url = "gdrive://" + location[len("pydrive2://") :] if location.startswith("pydrive2://") else location
        return FsspecStorage(url)
    return LocalStorage(location)
