"""The drive-budget bench (bench/drive_budget.py): its byte counter and the worker environment it builds from the
worker notebook as shipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.drive_budget import ROOT, WriteCounter, notebook_env  # noqa: E402


def test_the_counter_counts_a_node_s_writes_checkpoints_apart(tmp_path: Path) -> None:
    experiment = tmp_path / "exp"
    checkpoint = experiment / "checkpoints" / "worker-1" / "round_3"
    logs = experiment / "logs" / "worker-1"
    for folder in (checkpoint, logs, experiment / "peers"):
        folder.mkdir(parents=True)
    counter = WriteCounter(experiment, "worker-1")
    counter.stop()  # scans on demand only from here on
    (checkpoint / "model.safetensors").write_bytes(b"x" * 1000)
    (logs / "metrics.jsonl").write_text("a" * 10)
    (experiment / "peers" / "worker-1.json").write_text("p" * 50)
    (experiment / "peers" / "worker-2.json").write_text("q" * 70)  # another node's: not counted
    counter.scan()
    assert (counter.checkpoint_bytes, counter.other_bytes, counter.largest_checkpoint) == (1000, 60, 1000)
    with (logs / "metrics.jsonl").open("a") as f:  # an append counts what it added
        f.write("b" * 5)
    peer = experiment / "peers" / "worker-1.json"
    os.utime(peer, ns=(1, 1))  # a rewrite with no more bytes (a heartbeat) counts the whole file again
    counter.scan()
    assert counter.other_bytes == 60 + 5 + 50
    (checkpoint / "model.safetensors").unlink()  # a pruned checkpoint stays counted as written
    counter.scan()
    assert counter.checkpoint_bytes == 1000 and counter.checkpoint_folders == {"round_3"}
    assert [entry[1:] for entry in counter.timeline] == [(1000, 60), (1000, 115)]


def test_the_worker_environment_is_the_worker_notebook_s_as_shipped(tmp_path: Path) -> None:
    drive = tmp_path / "drive"
    folder = drive / "MyDrive" / "rl-swarm"
    folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    built = notebook_env(
        ROOT,
        {
            "STORAGE": "mount",
            "GDRIVE_PATH": str(folder),
            "DRIVE_MOUNT": str(drive),
            "NODE_ID": "worker-1",
            "DEVICE": "cpu",
            "EXTRA_ENV": {"SYNC_LAG": "0"},
        },
        {**env, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home")},
    )
    worker = built["env"]
    assert built["parameters"]["MODEL_NAME"] == worker["MODEL_NAME"] == "SmolLM2-135M-Instruct"
    assert worker["CHECKPOINT_MINUTES"] == str(built["parameters"]["CHECKPOINT_MINUTES"])
    assert worker["GDRIVE_PATH"] == str(folder) and worker["NODE_ID"] == "worker-1"
    assert worker["SYNC_LAG"] == "0" and worker["NODE_ROLE"] == "worker"
    assert worker["MAX_NEW_TOKENS"] == "24"  # the notebook's SMALL_MODEL_SETTINGS preset applied
