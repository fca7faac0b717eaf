"""Test support: the real coordinator and workers as threads of the test process (synthetic workload)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from swarm_gdrive.config import Config, from_env
from swarm_gdrive.protocol.coordinator import Coordinator
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.identity import claim_identity
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import ExperimentRecord
from swarm_gdrive.protocol.worker import Worker
from swarm_gdrive.protocol.workload import SyntheticWorkload
from swarm_gdrive.storage import LocalStorage


class Node(threading.Thread):
    """One node of the swarm, configured from an environment mapping, run in a thread."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.config = from_env(env)
        self.stop = threading.Event()
        self.code: int | None = None

    def run(self) -> None:
        storage = LocalStorage(self.config.gdrive_path)
        if self.config.is_coordinator:
            self.code = Coordinator(self.config, storage, self.config.node_id, self.stop).run()
            return
        identity = claim_identity(self.config.local_dir, self.config.experiment_name, "worker", self.config.node_id)
        workload = self.make_workload()
        try:
            self.code = Worker(self.config, storage, identity, workload, self.stop).run()
        finally:
            identity.release()

    def make_workload(self) -> SyntheticWorkload:
        """The worker's workload (a test may subclass Node to give another)."""
        return SyntheticWorkload(
            self.config.num_train_samples, self.config.num_generations, self.config.synthetic_step_seconds, self.stop
        )


def define_experiment(storage: LocalStorage, config: Config, coordinator: str) -> None:
    """experiment.json as ``coordinator`` would write it for ``config`` (run 0123456789abcdef), for a test that drives
    a workload without a coordinator."""
    Exchange(storage, Layout(config.experiment_name), coordinator).write_experiment(
        ExperimentRecord(
            experiment=config.experiment_name,
            run_id="0123456789abcdef",
            fingerprint=config.fingerprint(),
            config=config.fingerprint_fields(),
            coordinator_id=coordinator,
            created_at=time.time(),
        )
    )


def fast_env(folder: Path, experiment: str, **extra: object) -> dict[str, str]:
    """A synthetic swarm with short intervals, on ``folder``."""
    env = {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": experiment,
        "WORKLOAD": "synthetic",
        "SWARM_LOCAL_DIR": str(folder.parent / f"{folder.name}-local"),
        "HEARTBEAT_INTERVAL": "0.2",
        "LIVENESS_TIMEOUT": "5",
        "POLL_INTERVAL_MIN": "0.02",
        "POLL_INTERVAL_MAX": "0.2",
        "NUM_TRAIN_SAMPLES": "3",
        "NUM_GENERATIONS": "4",
        "SYNTHETIC_STEP_SECONDS": "0.01",
        "ROLLOUT_WAIT_TIMEOUT": "10",
        "COORDINATOR_ROUND_INTERVAL": "30",
    }
    return {**env, **{k: str(v) for k, v in extra.items()}}


def run_threads(env: dict[str, str], workers: int, timeout: float = 60) -> list[Node]:
    """A coordinator ``coord`` and workers ``w1..wN`` to completion; asserts every one exited 0."""
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})]
    nodes += [Node({**env, "NODE_ROLE": "worker", "NODE_ID": f"w{i}"}) for i in range(1, workers + 1)]
    for n in nodes:
        n.start()
    for n in nodes:
        n.join(timeout)
    assert [n.code for n in nodes] == [0] * len(nodes)
    return nodes
