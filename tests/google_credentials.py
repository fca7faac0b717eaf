"""Google credentials of each kind a user has, made on the spot for tests: the file PyDrive2 saves after an
interactive sign-in, PyDrive2's settings.yaml, and a service account's JSON key with a fresh RSA key. Their
``token_uri`` points wherever the test says (the Drive emulator's token endpoint)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

SAVED_TOKEN = "saved-access-token"


def saved_credentials(path: Path, token_uri: str, expired: bool) -> None:
    """The credentials file PyDrive2 saves after an interactive sign-in (oauth2client's JSON form)."""
    from oauth2client.client import OAuth2Credentials

    expiry = datetime.datetime.utcnow() + datetime.timedelta(hours=-1 if expired else 1)
    creds = OAuth2Credentials(SAVED_TOKEN, "client-id", "client-secret", "refresh-1", expiry, token_uri, "test")
    path.write_text(creds.to_json())


def oauth_settings(tmp_path: Path, token_uri: str, expired: bool = False, save: bool = True) -> Path:
    creds = tmp_path / "credentials.json"
    if save:
        saved_credentials(creds, token_uri, expired)
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        "client_config_backend: settings\n"
        "client_config:\n  client_id: client-id\n  client_secret: client-secret\n"
        f"  token_uri: {token_uri}\n"
        "save_credentials: True\nsave_credentials_backend: file\n"
        f"save_credentials_file: {creds}\n"
        "get_refresh_token: True\n"
    )
    return settings


def service_account_key(path: Path, token_uri: str) -> Path:
    """A service account's JSON key with a fresh RSA key, as the Cloud console hands it out."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "swarm-test",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "swarm@swarm-test.iam.gserviceaccount.com",
                "client_id": "1234",
                "token_uri": token_uri,
            }
        )
    )
    return path
