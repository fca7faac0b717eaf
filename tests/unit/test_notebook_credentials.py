"""The notebook reaches the Drive API with the credentials and the endpoint a node would use: GOOGLE_APPLICATION_
CREDENTIALS, GDRIVE_TOKEN_FILE and GDRIVE_API_URL go through the settings' parsers, not straight from the
environment."""

from __future__ import annotations

import pytest

from swarm_gdrive import notebook
from swarm_gdrive.config import from_env

CASES = [
    {},
    {"GOOGLE_APPLICATION_CREDENTIALS": "", "GDRIVE_TOKEN_FILE": "", "GDRIVE_API_URL": ""},
    {"GOOGLE_APPLICATION_CREDENTIALS": " /keys/sa.json ", "GDRIVE_TOKEN_FILE": "   "},
    {"GDRIVE_TOKEN_FILE": "/home/me/token.json", "GDRIVE_API_URL": "http://127.0.0.1:8765/"},
]


@pytest.mark.parametrize("environ", CASES)
def test_the_drive_settings_are_those_a_node_reads(environ, tmp_path):
    node = from_env({**environ, "GDRIVE_PATH": str(tmp_path), "NODE_ROLE": "coordinator"})
    expected = (node.google_application_credentials, node.gdrive_token_file, node.gdrive_api_url)
    assert notebook._drive_api_settings(environ) == expected


def test_only_the_drive_settings_are_read():
    """No GDRIVE_PATH yet (the notebook is resolving it), and another variable's bad value is not this step's error."""
    environ = {"GDRIVE_TOKEN_FILE": "/t.json", "MAX_ROUNDS": "not a number"}
    assert notebook._drive_api_settings(environ) == (None, "/t.json", None)


def test_the_client_is_built_with_the_parsed_settings(monkeypatch):
    from swarm_gdrive.storage import drive

    seen = []
    monkeypatch.setattr(drive, "build_service", lambda *args: seen.append(args) or "service")
    environ = {"GOOGLE_APPLICATION_CREDENTIALS": " /keys/sa.json ", "GDRIVE_TOKEN_FILE": ""}
    assert notebook._drive_service(environ) == "service"
    assert seen == [("/keys/sa.json", None, None)]
