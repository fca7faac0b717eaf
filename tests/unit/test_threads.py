"""Torch's CPU threads shared among this machine's worker processes (training/threads.py), with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from swarm_gdrive.training import threads
from swarm_gdrive.training.threads import ThreadPlan, local_workers, threads_for


def test_threads_for_shares_the_cores_and_keeps_one() -> None:
    assert [threads_for(8, n) for n in (1, 2, 3, 8, 20)] == [8, 4, 2, 1, 1]
    assert threads_for(2, 0) == 2


def _sleeper(role: str | None, module: bool = True) -> subprocess.Popen:
    """A process that looks like a node (its command names the launcher module) and only sleeps."""
    env = {k: v for k, v in os.environ.items() if k != "NODE_ROLE"}
    if role is not None:
        env["NODE_ROLE"] = role
    marker = "swarm_gdrive.launcher" if module else "something.else"
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, marker], env=env)


def test_local_workers_counts_worker_processes_of_this_machine_and_this_one(monkeypatch) -> None:
    import psutil

    # Every process of the machine is listed and looked at, but only this test's own are kept: tests on the other
    # xdist workers start and stop nodes all the time, which would change the count under this test's feet.
    ours: set[int] = set()
    every = psutil.process_iter
    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: (p for p in every(*a, **k) if p.pid in ours))
    before = local_workers()
    procs = [_sleeper("worker"), _sleeper(None), _sleeper("coordinator"), _sleeper("worker", module=False)]
    ours.update(proc.pid for proc in procs)
    try:
        deadline = time.monotonic() + 20
        while local_workers() != before + 2 and time.monotonic() < deadline:  # the processes' cmdlines appear
            time.sleep(0.1)
        # Two count (an explicit worker and one without NODE_ROLE, which is a worker by default); a coordinator and
        # a process that is no node do not.
        assert local_workers() == before + 2
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert local_workers() == before


@pytest.fixture
def torch_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_a_plan_shares_the_cores_with_the_other_workers_round_by_round(monkeypatch, torch_threads) -> None:
    monkeypatch.setattr(threads, "physical_cores", lambda: 8)
    torch.set_num_threads(8)  # torch's own default: nothing set it explicitly
    workers = [1]
    monkeypatch.setattr(threads, "local_workers", lambda: workers[0])
    plan = ThreadPlan(0, torch.device("cpu"))
    assert plan.active and torch.get_num_threads() == 8
    workers[0] = 3
    assert plan.update() == 2 and torch.get_num_threads() == 2
    workers[0] = 2
    assert plan.update() == 4 and torch.get_num_threads() == 4


def test_an_explicit_count_wins(monkeypatch, torch_threads) -> None:
    monkeypatch.setattr(threads, "physical_cores", lambda: 8)
    monkeypatch.setattr(threads, "local_workers", lambda: 4)
    torch.set_num_threads(8)
    ThreadPlan(3, torch.device("cpu")).update()
    assert torch.get_num_threads() == 3  # TORCH_THREADS=3
    torch.set_num_threads(5)  # OMP_NUM_THREADS=5 at torch's import: not torch's default
    plan = ThreadPlan(0, torch.device("cpu"))
    assert not plan.active and plan.update() == 5 and torch.get_num_threads() == 5
