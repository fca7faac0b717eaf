"""``pydrive2://``: PyDrive2's own sign-in (saved OAuth credentials or a service account) feeding the Drive
backend, through the emulator's API and its OAuth token endpoint; and ``gdrive://`` with a service-account
key whose token is fetched the same way. Every credential here is real of its kind (an oauth2client
credentials file, an RSA service-account key); only Google's servers are replaced by the emulator."""

from __future__ import annotations

import json
import os
import sys

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.storage import open_storage, storage_for
from swarm_gdrive.storage.drive import DriveAuthError, DriveStorage
from swarm_gdrive.storage.pydrive2_auth import open_pydrive2_storage

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from drive_emulator import DriveEmulator  # noqa: E402
from google_credentials import SAVED_TOKEN, oauth_settings, service_account_key  # noqa: E402

pytest.importorskip("pydrive2.auth", reason="PyDrive2 is installed by the README's test command")
pytestmark = pytest.mark.drive


@pytest.fixture
def emu():
    with DriveEmulator() as emulator:
        yield emulator


def round_trip(storage) -> None:
    storage.write_bytes("exp/a.json", b'{"x": 1}')
    storage.write_bytes("exp/a.json", b'{"x": 2}')
    assert storage.read_bytes("exp/a.json") == b'{"x": 2}'
    assert [f.name for f in storage.list("exp")] == ["a.json"]


def test_saved_sign_in_is_used_for_every_request(emu, tmp_path):
    emu.accept_token(SAVED_TOKEN)  # and nothing else: a request without it gets 401
    settings = oauth_settings(tmp_path, emu.token_uri)
    storage = open_storage(f"pydrive2://{emu.root_id}/swarm", pydrive2_settings=str(settings), api_url=emu.root_url)
    assert isinstance(storage, DriveStorage) and storage.prefix == ["swarm"]
    round_trip(storage)
    assert emu.authorizations and set(emu.authorizations) == {f"Bearer {SAVED_TOKEN}"}
    assert emu.token_grants == []  # the saved token was still valid: no refresh


def test_an_expired_saved_token_is_refreshed_before_the_first_call(emu, tmp_path):
    emu.require_tokens()  # the saved token is not accepted: only one the endpoint grants
    settings = oauth_settings(tmp_path, emu.token_uri, expired=True)
    round_trip(open_pydrive2_storage(str(settings), f"pydrive2://{emu.root_id}/swarm", api_url=emu.root_url))
    assert emu.token_grants == ["refresh_token"]
    assert set(emu.authorizations) == {"Bearer emulated-token-1"}
    saved = json.loads((tmp_path / "credentials.json").read_text())
    assert saved["access_token"] == "emulated-token-1"  # PyDrive2 stored the refreshed token, as it does on Drive


def test_pydrive2_service_account(emu, tmp_path):
    emu.require_tokens()
    key = service_account_key(tmp_path / "sa.json", emu.token_uri)
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"client_config_backend: service\nservice_config:\n  client_json_file_path: {key}\n")
    round_trip(open_pydrive2_storage(str(settings), f"{emu.root_id}/swarm", api_url=emu.root_url))
    assert emu.token_grants == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    assert set(emu.authorizations) == {"Bearer emulated-token-1"}


def test_gdrive_service_account_key_from_the_config(emu, tmp_path):
    """The same end to end for gdrive:// and GOOGLE_APPLICATION_CREDENTIALS (google-auth, not PyDrive2)."""
    emu.require_tokens()
    key = service_account_key(tmp_path / "sa.json", emu.token_uri)
    config = from_env(
        {
            "GDRIVE_PATH": f"gdrive://{emu.root_id}/swarm",
            "GOOGLE_APPLICATION_CREDENTIALS": str(key),
            "GDRIVE_API_URL": emu.root_url,
            "SWARM_LOCAL_DIR": str(tmp_path / "local"),
            "WORKLOAD": "synthetic",
        }
    )
    round_trip(storage_for(config))
    assert emu.token_grants == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    assert set(emu.authorizations) == {"Bearer emulated-token-1"}


def test_a_signed_in_gdrive_filesystem_lends_its_credentials(emu, tmp_path):
    from pydrive2.auth import GoogleAuth
    from pydrive2.fs import GDriveFileSystem

    emu.accept_token(SAVED_TOKEN)
    gauth = GoogleAuth(settings_file=str(oauth_settings(tmp_path, emu.token_uri)))
    gauth.LoadCredentials()
    fs = GDriveFileSystem(f"{emu.root_id}/swarm", google_auth=gauth)  # no request is made until used
    round_trip(open_pydrive2_storage(fs, f"{emu.root_id}/swarm", api_url=emu.root_url))
    assert set(emu.authorizations) == {f"Bearer {SAVED_TOKEN}"}


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("missing", "no such file"),
        ("unsaved", "no saved PyDrive2 credentials"),
        ("refresh-refused", "PyDrive2 could not authenticate"),
        ("bad-yaml", "PyDrive2 could not authenticate"),
    ],
)
def test_sign_in_problems_say_what_to_do(tmp_path, setup, needle):
    refused = "http://127.0.0.1:9/token"  # the discard port: nothing listens
    settings = tmp_path / "settings.yaml"
    if setup == "unsaved":
        settings = oauth_settings(tmp_path, refused, save=False)
    elif setup == "refresh-refused":
        settings = oauth_settings(tmp_path, refused, expired=True)
    elif setup == "bad-yaml":
        settings.write_text("client_config_backend: [unclosed\n")
    with pytest.raises(DriveAuthError) as info:
        open_storage("pydrive2://1AbCdEfGhIjKlMnOp/swarm", pydrive2_settings=str(settings))
    assert needle in str(info.value)
    if setup != "bad-yaml":
        assert "LocalWebserverAuth" in str(info.value) or "could not authenticate" in str(info.value)


def test_without_pydrive2_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    settings = oauth_settings(tmp_path, "http://127.0.0.1:9/token")
    monkeypatch.setitem(sys.modules, "pydrive2.auth", None)  # import fails as if it were not installed
    with pytest.raises(DriveAuthError, match="pip install PyDrive2"):
        open_storage("pydrive2://1AbCdEfGhIjKlMnOp/swarm", pydrive2_settings=str(settings))


def test_a_refresh_token_never_reaches_the_logs(emu, tmp_path, caplog):
    emu.require_tokens()
    settings = oauth_settings(tmp_path, emu.token_uri, expired=True)
    with caplog.at_level("DEBUG"):
        round_trip(open_pydrive2_storage(str(settings), f"pydrive2://{emu.root_id}/swarm", api_url=emu.root_url))
    assert "refresh-1" not in caplog.text and "emulated-token-1" not in caplog.text
