"""``GDRIVE_PATH=pydrive2://<folder-id>/<path>``: the Drive backend on a PyDrive2 user's credentials.

People who already use PyDrive2 have a ``settings.yaml`` and saved credentials (or a service
account) that PyDrive2 knows how to load. This module loads them with PyDrive2's own
``GoogleAuth``, without any prompt, and hands the authorized HTTP transport to the Drive v3
backend (:class:`~swarm_gdrive.storage.drive.DriveStorage`), which meets the storage contract.

PyDrive2's ``GDriveFileSystem`` (its fsspec filesystem) is deliberately not used for the file
operations, because it cannot meet the contract (pydrive2/fs/spec.py, 1.21.3):

- every write uploads a new file (``_gdrive_upload_fobj`` calls ``CreateFile`` without an id), so
  rewriting ``state.json`` or a heartbeat leaves one more same-named file each time;
- a path with duplicate names resolves to ``min(item_ids)``, the smallest id rather than the
  newest file, so a reader can keep reading a stale copy for ever;
- ``mv`` onto an existing path treats the target as a folder.

A ``GDriveFileSystem``, a ``GoogleDrive`` or a ``GoogleAuth`` built in a notebook can be passed
to :func:`open_pydrive2_storage`: only its credentials are used.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from swarm_gdrive.storage.drive import DriveAuthError, DriveStorage, build_service, parse_drive_url
from swarm_gdrive.storage.drive_errors import describe_account

logger = logging.getLogger(__name__)

SCHEME = "pydrive2://"
_HOW = (
    "PyDrive2 needs either a service account (client_config_backend: service) or credentials saved "
    "once by an interactive sign-in: GoogleAuth(settings_file=...).LocalWebserverAuth() with "
    "save_credentials: True in the settings"
)


def _google_auth_class() -> Any:
    try:
        from pydrive2.auth import GoogleAuth
    except ImportError as exc:
        raise DriveAuthError(
            f"GDRIVE_PATH=pydrive2://... needs PyDrive2, which is not importable ({exc}): "
            "pip install PyDrive2, or use gdrive:// with GOOGLE_APPLICATION_CREDENTIALS / GDRIVE_TOKEN_FILE"
        ) from None
    return GoogleAuth


def load_google_auth(settings_file: str) -> Any:
    """PyDrive2's ``GoogleAuth`` from ``settings_file``, authenticated without a prompt."""
    if not os.path.isfile(settings_file):
        # GoogleAuth silently falls back to its defaults (an interactive flow) when the file is missing.
        raise DriveAuthError(
            f"PYDRIVE2_SETTINGS={settings_file}: no such file; point it at your PyDrive2 settings.yaml. {_HOW}"
        )
    google_auth = _google_auth_class()
    try:
        from pydrive2.settings import LoadSettingsFile

        LoadSettingsFile(settings_file)  # GoogleAuth would swallow a broken file and fall back to its defaults
        auth = google_auth(settings_file=settings_file)
        if auth.settings.get("client_config_backend") == "service":
            auth.ServiceAuth()
        elif auth.settings.get("save_credentials_backend"):
            auth.LoadCredentials()
        if auth.credentials is None:
            raise DriveAuthError(f"PYDRIVE2_SETTINGS={settings_file}: no saved PyDrive2 credentials found. {_HOW}")
        if auth.access_token_expired and auth.auth_method != "service":  # service tokens are fetched on first use
            auth.Refresh()
    except DriveAuthError:
        raise
    except Exception as exc:  # PyDrive2's SettingsError, InvalidConfigError, RefreshError, a bad key file...
        raise DriveAuthError(f"PYDRIVE2_SETTINGS={settings_file}: PyDrive2 could not authenticate: {exc}") from None
    return auth


def authorized_http(source: Any) -> Any:
    """An authorized ``httplib2.Http`` from a PyDrive2 ``GoogleAuth``, ``GoogleDrive`` or ``GDriveFileSystem``."""
    return google_auth_of(source).Get_Http_Object()


def google_auth_of(source: Any) -> Any:
    """The signed-in PyDrive2 ``GoogleAuth`` of a ``GoogleAuth``, ``GoogleDrive`` or ``GDriveFileSystem``."""
    auth = source
    if hasattr(auth, "client"):  # GDriveFileSystem -> its GoogleDrive
        auth = auth.client
    if hasattr(auth, "auth") and not hasattr(auth, "Get_Http_Object"):  # GoogleDrive -> its GoogleAuth
        auth = auth.auth
    if not hasattr(auth, "Get_Http_Object"):
        raise TypeError(f"expected PyDrive2's GoogleAuth, GoogleDrive or GDriveFileSystem, got {type(source)!r}")
    if auth.credentials is None:
        raise DriveAuthError(f"this PyDrive2 GoogleAuth has no credentials yet. {_HOW}")
    return auth


def open_pydrive2_storage(source: Any, location: str, api_url: str | None = None, **options: Any) -> DriveStorage:
    """A :class:`DriveStorage` on ``location`` (``pydrive2://<folder-id>/<path>`` or ``<folder-id>/<path>``),
    its root checked first (a wrong or unshared folder id is one DriveError naming GDRIVE_PATH).

    ``source`` is a PyDrive2 ``GoogleAuth``, ``GoogleDrive`` or ``GDriveFileSystem`` that is already
    signed in, or the path of a PyDrive2 settings file to sign in from. Every thread gets its own
    authorized connection from ``GoogleAuth.Get_Http_Object`` (PyDrive2's own thread-safety rule).
    """
    rest = location[len(SCHEME) :] if location.startswith(SCHEME) else location
    folder_id, prefix = parse_drive_url("gdrive://" + rest)
    if not folder_id:
        raise DriveAuthError(f"GDRIVE_PATH={location}: expected pydrive2://<folder-id>/<path>")
    if isinstance(source, str | os.PathLike):
        source = load_google_auth(os.fspath(source))
    auth = google_auth_of(source)
    service = build_service(api_url=api_url, http=auth.Get_Http_Object())
    logger.info("Drive folder %s through PyDrive2's credentials", folder_id)
    where = location if location.startswith(SCHEME) else SCHEME + location
    options.setdefault("location", f"GDRIVE_PATH={where}")
    options.setdefault("account", describe_account(auth.credentials))
    storage = DriveStorage(folder_id, prefix, service=service, http_factory=auth.Get_Http_Object, **options)
    storage.check_root()
    return storage
