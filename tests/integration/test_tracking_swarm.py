"""REPORT_TO=tensorboard,wandb,trackio in a real swarm: a coordinator and a worker as processes on a local folder,
each with its own node-local TRACKING_DIR, W&B offline (no key, no network). Every tracker's files are read back
with that tracker's own formats (tests/tracking_readers.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from swarm_gdrive.config import env_fields
from swarm_gdrive.procs import NodeProcess, stop_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracking_readers import tensorboard_scalars, trackio_rows, wandb_run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "hf_notARealTokenButSecret123"


def test_each_node_is_a_run_of_its_experiment_in_every_tracker(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in {f.metadata["env"] for f in env_fields()}}
    clean = {k: v for k, v in clean.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    common = {
        **clean,
        "GDRIVE_PATH": str(shared),
        "EXPERIMENT_NAME": "tracked",
        "WORKLOAD": "synthetic",
        "MAX_ROUNDS": "2",
        "HEARTBEAT_INTERVAL": "0.2",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.3",
        "REPORT_TO": "tensorboard,wandb,trackio",
        "TRACKING_PROJECT": "swarm-test",
        "HUGGINGFACE_ACCESS_TOKEN": SECRET,
        "HF_HUB_OFFLINE": "1",
        "WANDB_SILENT": "true",
    }
    nodes = {}
    for role, node in (("coordinator", "coord"), ("worker", "w1")):
        local = tmp_path / node
        env = {**common, "NODE_ROLE": role, "NODE_ID": node, "SWARM_LOCAL_DIR": str(local), "HOME": str(local)}
        env["TRACKING_DIR"] = str(local / "runs")
        nodes[node] = NodeProcess(node, env)
    try:
        codes = {name: proc.wait(timeout=180) for name, proc in nodes.items()}
    finally:
        stop_all(list(nodes.values()))
    assert codes == {"coord": 0, "w1": 0}, {n: p.lines[-20:] for n, p in nodes.items()}

    for node, role in (("coord", "coordinator"), ("w1", "worker")):
        runs = tmp_path / node / "runs"
        scalars = tensorboard_scalars(runs / "tensorboard" / "tracked" / node)
        run, history = wandb_run(runs / "wandb")
        assert run == {"project": "swarm-test", "group": "tracked", "name": node, "job_type": role}
        rows = trackio_rows(runs / "trackio", "swarm-test")
        (name,) = {name for name, _, _ in rows}  # one run, named by experiment, node and run id
        assert name.startswith(f"tracked-{node}-"), name
        logged = [{k: v for k, v in h.items() if not k.startswith("_")} for h in history]
        if role == "worker":
            # Rounds 0 and 1, each with its reward under TRL's name, in all three.
            assert [step for step, _ in scalars["train/reward"]] == [0, 1]
            assert sorted(h["round"] for h in logged if "train/reward" in h) == [0, 1]
            assert sorted(step for _, step, m in rows if "train/reward" in m) == [0, 1]
            assert "swarm/round/seconds" in scalars and "swarm/storage/reads" in scalars
        else:
            assert any(k.startswith("swarm/") for k in scalars)
            assert any(k.startswith("swarm/") for h in logged for k in h)
        assert not any(k.split("/")[0] in ("reward", "storage", "round", "completion", "external") for k in scalars)
    # Tokens never reach the trackers' files (nor does anything else of the environment's secrets).
    for path in tmp_path.rglob("*"):
        if path.is_file() and "shared" not in path.parts:
            assert SECRET.encode() not in path.read_bytes(), path
