"""Stand-in for ``google.colab.auth``: ``authenticate_user`` writes an authorized_user ADC file, as Colab does."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

from google.colab._standin import record, setting

__all__ = ["authenticate_user"]


def _adc_path() -> str:
    return os.path.join(os.environ.get("DATALAB_ROOT", "/"), "content/.adc/adc.json")


def authenticate_user(clear_output: bool = True) -> None:
    """Sign in (no prompt): writes the ADC file and sets GOOGLE_APPLICATION_CREDENTIALS to it.

    The file holds the access token the sign-in obtained (COLAB_STANDIN_ACCESS_TOKEN, valid for an hour):
    google-auth refreshes an authorized_user file only at Google's token endpoint, whatever its
    ``token_uri`` says, so a test cannot serve the refresh; the Drive emulator accepts this token instead.
    """
    root = setting("COLAB_STANDIN_ROOT")
    path = _adc_path()
    if not os.path.realpath(path).startswith(os.path.realpath(root) + os.sep):
        raise ValueError(f"stand-in auth: {path} is outside COLAB_STANDIN_ROOT={root!r} (set DATALAB_ROOT)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    already = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") == path and os.path.exists(path)
    record("auth.authenticate_user", already=already)
    if already:
        return
    credentials = {
        "type": "authorized_user",
        "client_id": "colab-standin.apps.googleusercontent.com",
        "client_secret": "colab-standin-secret",
        "refresh_token": os.environ.get("COLAB_STANDIN_REFRESH_TOKEN", "colab-standin-refresh-token"),
        "token_uri": setting("COLAB_STANDIN_TOKEN_URI"),
        "token": setting("COLAB_STANDIN_ACCESS_TOKEN"),
        "expiry": (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(credentials, fh)
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = path
