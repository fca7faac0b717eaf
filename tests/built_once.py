"""What several test modules build once per test session and share across xdist workers.

A module of its own, not conftest.py: a test module that imports ``conftest`` gets whichever conftest.py pytest
imported last under that name (tests/contract has one too), so the import would depend on collection order."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(folder)`` run once per test session and shared by every xdist worker: a file lock, in the session's
    own base temporary folder (so each run builds anew, from the code under test). Only for what tests read."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' base folders are siblings inside the session's
    target = root / f"built-once-{name}"
    with FileLock(f"{target}.lock"):
        if not (target / "READY").exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target / "model")
            (target / "READY").touch()
    return target / "model"
