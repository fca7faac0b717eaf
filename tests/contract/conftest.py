"""Backends the storage contract suite runs against.

Each test in this folder takes ``storage`` (the backend under test) and, where a test needs
to know what kind of store it is, ``backend``. Backends:

- ``local``: LocalStorage on tmp_path.
- ``file``: FsspecStorage on ``file://tmp_path`` (the temporary-name-then-move write path).
- ``memory``: FsspecStorage on a unique ``memory://`` root per test.
- ``s3``: FsspecStorage against moto's server (started once per session, loopback only),
  a fresh bucket per test.
- ``drive``: DriveStorage against tests/drive_emulator.py.
- ``pydrive2``: the same, opened from PyDrive2's settings and saved credentials (``pydrive2://``); the
  emulator refuses any request without that token.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from swarm_gdrive.storage.base import Storage
from swarm_gdrive.storage.drive import DriveStorage
from swarm_gdrive.storage.fsspec_storage import FsspecStorage
from swarm_gdrive.storage.local import LocalStorage
from swarm_gdrive.storage.pydrive2_auth import open_pydrive2_storage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drive_emulator import DriveEmulator  # noqa: E402
from google_credentials import SAVED_TOKEN, oauth_settings  # noqa: E402

RETRY_WAIT = 0.01


@dataclass
class Backend:
    """A backend under test and what the contract allows it to do differently."""

    name: str
    storage: Storage
    #: A second, independent handle on the same location: another node, with its own caches.
    reopen: Callable[[], Storage]
    #: Folders exist on their own (local, Drive): an emptied folder stays until remove_empty_dir.
    #: Object stores have only keys: a "folder" is a prefix and vanishes with its last object.
    real_dirs: bool
    #: Listings carry a modification time (> 0) for files.
    knows_mtime: bool = True


# -- s3 (moto) -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto S3 server for the whole session, on loopback only."""
    server_module = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_options(endpoint: str) -> dict[str, Any]:
    return {
        "key": "testing",  # dummy credentials: moto accepts any
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def _s3_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    endpoint = request.getfixturevalue("moto_endpoint")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = s3_options(endpoint)
    bucket = f"contract-{uuid.uuid4().hex[:16]}"
    storage = FsspecStorage(f"s3://{bucket}/swarm", options, retry_max_wait=RETRY_WAIT)
    storage.fs.call_s3("create_bucket", Bucket=bucket)

    def reopen() -> Storage:  # its own s3fs instance, so its own listing cache
        return FsspecStorage(
            f"s3://{bucket}/swarm", {**options, "skip_instance_cache": True}, retry_max_wait=RETRY_WAIT
        )

    return Backend("s3", storage, reopen, real_dirs=False)


# -- the others ------------------------------------------------------------------------------


def _memory_backend(request: pytest.FixtureRequest) -> Backend:
    url = f"memory://contract-{uuid.uuid4().hex[:16]}/swarm"
    storage = FsspecStorage(url, retry_max_wait=RETRY_WAIT)

    def cleanup() -> None:
        root = storage.fs._strip_protocol(url).rsplit("/", 1)[0]
        for key in [k for k in storage.fs.store if k.startswith(root + "/")]:
            storage.fs.store.pop(key, None)

    request.addfinalizer(cleanup)
    return Backend("memory", storage, lambda: FsspecStorage(url, retry_max_wait=RETRY_WAIT), real_dirs=False)


def _emulator(request: pytest.FixtureRequest) -> DriveEmulator:
    emu = DriveEmulator().start()
    request.addfinalizer(emu.stop)
    return emu


def _drive_backend(request: pytest.FixtureRequest) -> Backend:
    emu = _emulator(request)

    def make() -> Storage:
        return DriveStorage(root_folder_id=emu.root_id, service=emu.service(), retry_max_wait=0.05)

    return Backend("drive", make(), make, real_dirs=True)


def _pydrive2_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """DriveStorage signed in through PyDrive2's saved credentials; the emulator accepts only that token."""
    pytest.importorskip("pydrive2.auth", reason="PyDrive2 is installed by the README's test command")
    emu = _emulator(request)
    emu.accept_token(SAVED_TOKEN)
    settings = str(oauth_settings(tmp_path, emu.token_uri))

    def make() -> Storage:
        return open_pydrive2_storage(settings, emu.root_id, api_url=emu.root_url, retry_max_wait=0.05)

    return Backend("pydrive2", make(), make, real_dirs=True)


BACKENDS = [
    "local",
    "file",
    "memory",
    "s3",
    pytest.param("drive", marks=pytest.mark.drive),
    pytest.param("pydrive2", marks=pytest.mark.drive),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    name = request.param
    if name == "local":
        return Backend(
            "local",
            LocalStorage(tmp_path, retry_max_wait=RETRY_WAIT),
            lambda: LocalStorage(tmp_path, retry_max_wait=RETRY_WAIT),
            real_dirs=True,
        )
    if name == "file":
        url = f"file://{tmp_path}"
        return Backend(
            "file",
            FsspecStorage(url, retry_max_wait=RETRY_WAIT),
            lambda: FsspecStorage(url, retry_max_wait=RETRY_WAIT),
            real_dirs=True,
        )
    if name == "memory":
        return _memory_backend(request)
    if name == "s3":
        return _s3_backend(request, monkeypatch)
    if name == "pydrive2":
        return _pydrive2_backend(request, tmp_path)
    return _drive_backend(request)


@pytest.fixture
def storage(backend: Backend) -> Storage:
    return backend.storage
