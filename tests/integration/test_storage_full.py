"""A worker stops, saying why, before a checkpoint its Drive has no room for (issue #27, build point 1).

The real launcher runs a coordinator and a tiny-model ``grpo`` worker as threads of the test process, on the Drive
emulator through the unmodified Google client (``GDRIVE_API_URL``), with an account quota that holds the swarm's
small files but not a checkpoint: the worker reads the quota (``about.get``) before its first checkpoint, writes
nothing of it and exits 3 with a ``worker_gave_up`` event naming the account, the free space and the fixes.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm_gdrive.launcher import run_node
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, decode_lines
from swarm_gdrive.protocol.worker import EXIT_GAVE_UP, Worker
from swarm_gdrive.storage.drive import DriveStorage
from swarm_gdrive.training.checkpoint import StorageFullError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from drive_emulator import DriveEmulator  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LAYOUT = Layout("full")
FREE = 32 * 1024**2  # what the account has left: the swarm's JSON files fit, a checkpoint and its reserve do not


def env_for(emu: DriveEmulator, tmp_path: Path, model: Path, **extra: str) -> dict[str, str]:
    return {
        "GDRIVE_PATH": f"gdrive://{emu.root_id}/swarm",
        "GDRIVE_API_URL": emu.root_url,
        "EXPERIMENT_NAME": "full",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_NAME": str(model),
        "WORKLOAD": "grpo",
        "TASKS": "basic_arithmetic",
        "TASK_CONFIG": '{"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}',
        "NUM_TRAIN_SAMPLES": "2",
        "NUM_GENERATIONS": "4",
        "NUM_TRANSPLANT_TREES": "0",
        "MAX_NEW_TOKENS": "8",
        "EVAL_SAMPLES": "2",
        "CHECKPOINT_INTERVAL": "1",  # a checkpoint after round 0
        "DEVICE": "cpu",
        "MIN_WORKERS": "1",
        "MAX_ROUNDS": "3",
        "HEARTBEAT_INTERVAL": "0.5",
        "LIVENESS_TIMEOUT": "120",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.5",
        "COORDINATOR_ROUND_INTERVAL": "300",
        **extra,
    }


def test_a_worker_stops_before_a_checkpoint_its_drive_has_no_room_for(tmp_path: Path, tiny_folder: Path) -> None:
    with DriveEmulator() as emu:
        emu.set_storage_quota(10**10, used_elsewhere=10**10 - FREE)
        env = env_for(emu, tmp_path, tiny_folder)
        coordinator_stop = threading.Event()
        codes: dict[str, int] = {}

        def node(name: str, role: str, stop: threading.Event) -> None:
            codes[name] = run_node({**env, "NODE_ROLE": role, "NODE_ID": name}, stop=stop)

        coordinator = threading.Thread(target=node, args=("coord", "coordinator", coordinator_stop), daemon=True)
        worker = threading.Thread(target=node, args=("w1", "worker", threading.Event()), daemon=True)
        coordinator.start()
        worker.start()
        worker.join(300)
        coordinator_stop.set()
        coordinator.join(60)
        assert not worker.is_alive() and codes["w1"] == EXIT_GAVE_UP

        names = {f["name"] for f in emu.files()}
        assert "round_0" in names  # it played and rewarded round 0
        assert not names & {"model.safetensors", "optimizer.safetensors", "checkpoint.json"}  # nothing of the save
        storage = DriveStorage(emu.root_id, "swarm", service=emu.service(), retry_max_wait=0.02)
        events, problems = decode_lines(storage.read_bytes(LAYOUT.events_file("w1"), 1 << 24), EventRecord)
    assert not problems
    (gave_up,) = [e for e in events if e.event == "worker_gave_up"]
    assert "checkpoint of round 0 not written" in gave_up.message
    assert "Google Drive of" in gave_up.message and "free" in gave_up.message
    assert "CHECKPOINT_OPTIMIZER=none" in gave_up.message and "resumes from its latest checkpoint" in gave_up.message


def test_a_stop_checkpoint_without_room_does_not_turn_the_stop_into_a_crash() -> None:
    """The stop button's checkpoint (Worker._checkpoint_on_stop) meets a full storage: the stop goes on and says so."""

    class FullWorkload:
        def checkpoint_on_stop(self) -> int:
            raise StorageFullError("checkpoint of round 4 not written: it takes 1.08 GB and the Drive has 10 MB free")

    worker = SimpleNamespace(workload=FullWorkload(), log=None, _part_played=None)
    said = Worker._checkpoint_on_stop(worker)  # type: ignore[arg-type]
    assert said.startswith(", without a stop checkpoint (checkpoint of round 4 not written")
