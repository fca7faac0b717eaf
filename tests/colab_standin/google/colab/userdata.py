"""Stand-in for ``google.colab.userdata``: secrets from the JSON file COLAB_STANDIN_SECRETS."""

from __future__ import annotations

import json
import os

from google.colab import errors
from google.colab._standin import record


class NotebookAccessError(Exception):
    """The notebook was not granted access to the secret."""

    def __init__(self, key: str) -> None:
        super().__init__(f"Notebook does not have access to secret {key}")


class SecretNotFoundError(errors.Error):
    """No secret has that name."""

    def __init__(self, key: str) -> None:
        super().__init__(f"Secret {key} does not exist.")


def get(key: str) -> str:
    path = os.environ.get("COLAB_STANDIN_SECRETS")
    secrets = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            secrets = json.load(fh)
    record("userdata.get", key=key, found=key in secrets)
    if key not in secrets:
        raise SecretNotFoundError(key)
    if secrets[key] is None:
        raise NotebookAccessError(key)
    return secrets[key]
