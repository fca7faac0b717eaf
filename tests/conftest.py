"""Fixtures shared by test folders: the tiny model and the thread setting its tests run with.

Nothing here is autouse: a module asks for ``one_thread`` with ``pytestmark = pytest.mark.usefixtures(...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """A tiny model gains nothing from threads, and OpenMP threads on busy cores make each op ~100x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model saved once per test module."""
    from swarm_gdrive.training.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
