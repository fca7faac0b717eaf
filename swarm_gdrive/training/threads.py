"""CPU threads for torch: the machine's cores shared among the worker processes running on it.

torch starts one OpenMP thread per physical core in every process. Two workers on a laptop then run twice as many
threads as there are cores, and OpenMP threads that wait for a busy core spin: each operation becomes several times
slower instead of half as fast. So a worker on the CPU counts the swarm-gdrive workers of this machine (itself
included) at its start and at every round, and runs ``cores // workers`` threads (at least 1). An explicit choice
wins: TORCH_THREADS > 0, or OMP_NUM_THREADS / MKL_NUM_THREADS, which torch read at its import (it then starts
with another count than its default, and this module leaves it).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import psutil

logger = logging.getLogger(__name__)

#: What marks a swarm-gdrive node's process: the launcher module, or the command's ``run`` (``swarm-gdrive run``).
_LAUNCHER = "swarm_gdrive.launcher"


def physical_cores() -> int:
    import psutil  # imported when used: its POSIX backend needs modules a native Windows lacks

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def _is_worker(process: psutil.Process) -> bool:
    import psutil

    try:
        cmdline = process.cmdline()
        if not any(_LAUNCHER in part for part in cmdline) and not (
            any(part.endswith("swarm-gdrive") for part in cmdline[:2]) and "run" in cmdline
        ):
            return False
        return process.environ().get("NODE_ROLE", "worker").strip().lower() == "worker"
    except (psutil.Error, OSError):  # gone, or another user's: not ours to count
        return False


def local_workers() -> int:
    """swarm-gdrive worker processes on this machine, at least 1 (this one, whatever started it)."""
    import psutil

    me = os.getpid()
    others = sum(1 for p in psutil.process_iter() if p.pid != me and _is_worker(p))
    return 1 + others


def threads_for(cores: int, workers: int) -> int:
    return max(1, cores // max(1, workers))


class ThreadPlan:
    """Sets torch's thread count for a worker on the CPU from TORCH_THREADS (0: share the cores) and keeps it so."""

    def __init__(self, requested: int, device: torch.device) -> None:
        self.active = device.type == "cpu" and requested == 0 and torch.get_num_threads() == physical_cores()
        if device.type == "cpu" and requested > 0:
            torch.set_num_threads(requested)
        if not self.active and device.type == "cpu":
            logger.info("torch threads: %d (set explicitly)", torch.get_num_threads())
        self.update()

    def update(self) -> int:
        """Re-count this machine's workers and set torch's threads to their share of the cores; the count set."""
        if not self.active:
            return torch.get_num_threads()
        cores, workers = physical_cores(), local_workers()
        threads = threads_for(cores, workers)
        if threads != torch.get_num_threads():
            logger.info(
                "torch threads: %d (%d cores shared by %d worker process%s on this machine; TORCH_THREADS sets it)",
                threads, cores, workers, "" if workers == 1 else "es",
            )  # fmt: skip
            torch.set_num_threads(threads)
        return threads
