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
from swarm_gdrive.storage.settings import StorageSettings

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "FileInfo",
    "FileTooLargeError",
    "LocalStorage",
    "Storage",
    "StorageError",
    "open_storage",
    "storage_for",
]


def open_storage(
    location: str,
    credentials_file: str | None = None,
    token_file: str | None = None,
    api_url: str | None = None,
    pydrive2_settings: str = "settings.yaml",
) -> Storage:
    """The backend for GDRIVE_PATH: ``gdrive://<folder-id>/path`` (Drive API), ``pydrive2://<folder-id>/path``
    (the Drive API on PyDrive2's credentials), any fsspec URL (``s3://``, ``gs://``, ``memory://``), else a
    local or mounted folder."""
    if location.startswith("gdrive://"):
        from swarm_gdrive.storage.drive import open_drive_storage

        return open_drive_storage(location, credentials_file, token_file, api_url)
    if location.startswith("pydrive2://"):
        from swarm_gdrive.storage.pydrive2_auth import open_pydrive2_storage

        return open_pydrive2_storage(pydrive2_settings, location, api_url=api_url)
    if "://" in location:
        from swarm_gdrive.storage.fsspec_storage import FsspecStorage

        return FsspecStorage(location)
    return LocalStorage(location)


def storage_for(config: StorageSettings) -> Storage:
    """The backend a node, or a reader such as ``swarm-gdrive status``, opens for ``config``."""
    return open_storage(
        config.gdrive_path,
        config.google_application_credentials,
        config.gdrive_token_file,
        config.gdrive_api_url,
        config.pydrive2_settings,
    )
