"""Fixtures shared by test folders: the tiny model and the thread setting its tests run with; the order tests start in.

Nothing here is autouse: a module asks for ``one_thread`` with ``pytestmark = pytest.mark.usefixtures(...)``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from built_once import built_once

#: pyproject's addopts run the suite on pytest-xdist workers, each handed the next test as it gets free
#: (``--dist loadgroup --no-loadscope-reorder``: in collection order). These start first, longest first (from the
#: durations table of a serial run), so that no long test starts when the rest are nearly done; the others keep
#: their order. A prefix of a node id names a test or a whole file.
LONG_FIRST = (
    "tests/integration/test_readme.py::test_the_readme_first_command_on_a_fresh_machine",  # ~410 s
    "tests/lagged/test_lagged_swarm.py",  # ~270 s, mostly waiting for the mount's lag
    "tests/integration/test_notebooks.py",  # ~270 s in one group (the Colab-like venv, built first when missing)
    "tests/integration/test_training_swarm.py",  # ~100 s
    "tests/faults/test_fault_kills.py",
    "tests/faults/test_fault_mixed.py",
    "tests/unit/test_plots_and_dashboard.py",
    "tests/faults/test_fault_trust.py",
    "tests/integration/test_smollm2.py",
    "tests/faults/test_fault_storage.py",
    "tests/faults/test_fault_training.py",
    "tests/integration/test_drive_swarm.py",
    "tests/unit/test_listing_decisions.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Several workers share the cores: one OpenMP thread per process (the nodes a test starts inherit it), since
        # torch's threads spinning on busy cores cost far more than they gain. A test that sets it keeps its own.
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: collection order within a rank, the same on every worker


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """SWARM_TEST_CPU_REPORT=file: one JSON line per test with its wall time and the CPU seconds of the test process
    and of the processes it started and waited for: what the suite's time on few cores is made of."""
    report = os.environ.get("SWARM_TEST_CPU_REPORT")
    if not report:
        return (yield)

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    started, used = time.monotonic(), cpu()
    try:
        return (yield)
    finally:
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - started, 2), "cpu_s": round(cpu() - used, 2)}
        with open(report, "a", encoding="utf-8") as f:  # one short line per append: whole lines from every worker
            f.write(json.dumps(line) + "\n")


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


@pytest.fixture(scope="session")
def taught_tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after teach_answer_format (~20 s of training), built once for every worker: tests only read it."""
    from swarm_gdrive.training.tiny_model import build_tiny_model, teach_answer_format

    return built_once(tmp_path_factory, "taught-tiny", lambda folder: teach_answer_format(build_tiny_model(folder)))
