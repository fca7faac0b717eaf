"""The settings storage reads: where the shared folder is, and the credentials of the Drive API backends.

:func:`swarm_gdrive.storage.storage_for` opens the backend these name. The node's whole configuration composes
them with the other layers' settings (:mod:`swarm_gdrive.config`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from swarm_gdrive.envparse import ConfigError, EnvSettings, env_field, parse_local_dir, parse_optional_text
from swarm_gdrive.names import InvalidNameError, validate_name

_URL = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)")
_DRIVE_ID = re.compile(r"[A-Za-z0-9_-]{10,128}")

#: GDRIVE_PATH's fix when it is unset or empty.
GDRIVE_PATH_FIX = "set it to the shared folder, e.g. /content/drive/MyDrive/rl-swarm"


def _parse_storage_url(var: str, raw: str, scheme: str, rest: str) -> str:
    folder, _, prefix = rest.partition("/")
    if scheme in ("gdrive", "pydrive2") and not _DRIVE_ID.fullmatch(folder):
        raise ConfigError(
            var, raw, f"{scheme}:// needs a Drive folder id (from the folder's URL): {scheme}://<id>/path"
        )
    if not folder:
        raise ConfigError(var, raw, f"{scheme}:// needs a bucket or root, e.g. {scheme}://my-bucket/rl-swarm")
    for part in [p for p in prefix.split("/") if p]:
        try:  # one folder path, chosen once: case cannot make two of its names collide
            validate_name(part, what=var, lowercase=False)
        except InvalidNameError as err:
            raise ConfigError(var, raw, f"path component {part!r} is not a safe name: {err.fix}") from None
    return f"{scheme}://{folder}/{prefix.strip('/')}".rstrip("/")


def is_url(text: str) -> bool:
    """Whether a GDRIVE_PATH is a URL (gdrive://, s3://, ...) rather than a local or mounted folder."""
    return bool(_URL.fullmatch(text.strip()))


def inside_shared_folder(path: str, gdrive_path: str) -> bool:
    """Whether the local folder ``path`` is GDRIVE_PATH or inside it, compared resolved (a symlink or ``..`` does not
    hide it); never for a GDRIVE_PATH that is a URL (gdrive://, s3://, ...), which holds no local folder."""
    if not gdrive_path or not path or is_url(gdrive_path):
        return False
    shared = Path(gdrive_path).expanduser().resolve()
    folder = Path(path).expanduser().resolve()
    return folder == shared or shared in folder.parents


def parse_gdrive_path(var: str, raw: str) -> str:
    """GDRIVE_PATH: a Drive or fsspec URL with safe path components, or an existing writable folder."""
    text = raw.strip()
    if not text:
        raise ConfigError(var, raw, GDRIVE_PATH_FIX)
    url = _URL.fullmatch(text)
    if url and url.group(1) == "file":  # file:///path is a local folder
        text, url = url.group(2), None
    if url:  # gdrive://<folder-id>/path (Drive API) or any fsspec URL (s3://, gs://, memory://, ...)
        return _parse_storage_url(var, raw, url.group(1), url.group(2))
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(var, raw, "this is a file, not a folder: point it at the shared folder")
    if not path.is_dir():
        raise ConfigError(
            var,
            raw,
            "this folder does not exist: create it, or mount Google Drive first "
            "(in Colab: from google.colab import drive; drive.mount('/content/drive'))",
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(var, raw, "this folder is not writable by this user: fix its permissions")
    return str(path.resolve())


@dataclass(frozen=True)
class StorageSettings(EnvSettings):
    """The shared folder and the credentials to open it (:func:`swarm_gdrive.storage.storage_for`)."""

    gdrive_path: str = env_field(
        "GDRIVE_PATH",
        None,
        "Shared folder that holds experiments/ and archives/: a mounted Google Drive folder "
        "(Colab: /content/drive/MyDrive/rl-swarm), a Drive-for-desktop folder or any POSIX path. "
        "Required; it must exist and be writable.",
        parse_gdrive_path,
        required=GDRIVE_PATH_FIX,
    )
    google_application_credentials: str | None = env_field(
        "GOOGLE_APPLICATION_CREDENTIALS",
        None,
        "gdrive:// only: a service account's JSON key file (share the Drive folder with its e-mail).",
        parse_optional_text,
    )
    gdrive_token_file: str | None = env_field(
        "GDRIVE_TOKEN_FILE",
        None,
        "gdrive:// only: an authorized-user token file (OAuth), instead of a service account.",
        parse_optional_text,
    )
    gdrive_api_url: str | None = env_field(
        "GDRIVE_API_URL",
        None,
        "gdrive:// and pydrive2:// only: another Drive v3 endpoint (a proxy, or the test emulator); unset: Google's. "
        "Credentials go there only over https://, or http:// on this machine's loopback.",
        parse_optional_text,
    )
    pydrive2_settings: str = env_field(
        "PYDRIVE2_SETTINGS",
        "settings.yaml",
        "pydrive2:// only: PyDrive2's settings.yaml (a service account, or credentials saved by an earlier "
        "sign-in); the Drive API is then used with those credentials.",
        parse_local_dir,
    )
