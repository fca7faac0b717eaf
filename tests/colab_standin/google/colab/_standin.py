"""What the stand-in modules share: the test's settings and the record of calls."""

from __future__ import annotations

import json
import os
import time


def setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"the google.colab stand-in needs {name} in the environment (see google/colab/__init__.py)")
    return value


def record(call: str, **details: object) -> None:
    """Append ``{"call": call, **details}`` to the file named by COLAB_STANDIN_CALLS, if set."""
    path = os.environ.get("COLAB_STANDIN_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"call": call, "time": time.time(), "pid": os.getpid(), **details}) + "\n")
