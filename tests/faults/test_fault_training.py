"""With a real (tiny) model: a worker SIGKILLed in the middle of saving a checkpoint, checkpoints planted by a
peer that are pickles with a payload, and a peer's forged questions and rewards. The restarted worker resumes
from its last complete checkpoint, nothing is unpickled, and only locally verified groups reach the update."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from faultkit import (
    HOOK_DIR,
    LAYOUT,
    PACKAGE_ROOT,
    Swarm,
    Watcher,
    events,
    faults,
    kill_parked,
    leftovers,
    played_rounds,
    read_record,
    rewards_present,
    wait_until,
)
from hostile import stopped_worker
from safetensors.torch import load_file

from swarm_gdrive.protocol.records import ExperimentRecord, Provenance, RolloutBatch, RolloutGroup, encode
from swarm_gdrive.training.checkpoint import param_digest
from swarm_gdrive.training.tasks import TaskBank, parse_task_mix, training_limit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASKS = "basic_arithmetic"
TASK_CONFIG = '{"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}'
SEED, FORMAT_WEIGHT, ROUNDS = 42, 0.5, 4
TRUE, FORGED_QUESTION, HELD_OUT = "true-completions", "forged-question", "held-out"


class Payload:
    """Unpickling this creates ``path``: proof that something unpickled a file from the folder."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def model_dir(taught_tiny_folder) -> Path:
    return taught_tiny_folder  # tests/conftest.py: built once per session, for every worker


def test_a_worker_killed_mid_checkpoint_resumes_from_its_last_whole_one_and_trusts_no_planted_file(tmp_path, model_dir):
    folder = tmp_path / "drive"
    folder.mkdir()
    marker, spy, pwned = tmp_path / "marker", tmp_path / "spy", tmp_path / "pwned"
    env = {
        **_env(folder, model_dir),
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(PACKAGE_ROOT)]),  # the package under test
    }
    watch = {"spy": str(spy), "grpo": True}
    extra = {"w1": faults(**watch, park={"point": "checkpoint", "round": 2, "dir": str(marker)})}
    swarm = Swarm(folder, env, ["w1"], extra)
    watcher = Watcher(folder, planted := set())
    bank = TaskBank(parse_task_mix(TASKS, TASK_CONFIG), SEED)
    try:
        swarm.start("coord")
        wait_until((folder / LAYOUT.experiment_file).exists, 60, "experiment.json", swarm.procs)
        run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id
        # The forger registers as a worker of this run (a gather reads only registered workers' batches) that has
        # stopped (so the coordinator does not wait for it), then publishes its batches.
        (folder / LAYOUT.peer_file("forger")).parent.mkdir(parents=True, exist_ok=True)
        (folder / LAYOUT.peer_file("forger")).write_bytes(encode(stopped_worker("forger", run_id)))
        for round_ in range(ROUNDS):
            rel = LAYOUT.rollout_file(round_, 0, "forger")
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(encode(_forged_batch(bank, run_id, round_)))
        watcher.start()
        killed = swarm.start("w1")
        assert kill_parked(swarm, killed, marker, timeout=240) == "checkpoint"
        killed_at = time.time()
        planted.update(_plant_pickle_checkpoints(folder, pwned))
        swarm.start("w1#2", node="w1", **faults(**watch))
        codes = swarm.wait(timeout=300)
    finally:
        swarm.stop()
        watcher.stop()
    assert codes == {"coord": 0, "w1#2": 0}, swarm.tails()
    watcher.assert_clean()
    output = "\n".join(swarm.procs[-1].lines)

    # Nothing from the folder was unpickled: the payload never ran, and no pickle loader was even called.
    assert not pwned.exists()
    assert not (spy / "unpickle.jsonl").exists(), (spy / "unpickle.jsonl").read_text()
    # The planted checkpoints were refused, each with its reason; the half-written one was skipped too.
    assert "skipping checkpoint experiments/faults/checkpoints/w1/round_4: file 'model.bin' is not an allowed" in output
    assert "checkpoint of round 5 does not load" in output
    # The save killed mid-way had written its manifest first, marked incomplete.
    assert "skipping checkpoint experiments/faults/checkpoints/w1/round_2: an interrupted save" in output

    # It resumed from round 1's checkpoint, the last whole one: exactly those weights, then the next round.
    (resumed,) = [e for e in events(folder, "w1") if e.event == "resumed_from_checkpoint"]
    saved = load_file(str(folder / LAYOUT.checkpoint_dir("w1", 1) / "model.safetensors"))
    assert resumed.data["checkpoint_round"] == 1 and resumed.data["params"] == _digest(saved)
    skipped = [e for e in events(folder, "w1") if e.event == "round_skipped" and e.ts > killed_at]
    assert [(e.data["skipped_from"], e.data["skipped_to"]) for e in skipped] == [(2, 2)]
    assert played_rounds(folder, "w1", after=resumed.ts) == [3]
    assert sorted(rewards_present(folder, "w1")) == list(range(ROUNDS))  # round 2's, sent before the kill, kept
    assert not leftovers(folder), leftovers(folder)

    # Only the forger's true group reached an update, with the rewards this worker computed itself.
    batches = [json.loads(line) for line in (spy / "train.jsonl").read_text().splitlines()]
    assert [b["round"] for b in batches] == [0, 1, 2, 3]
    for batch in batches:
        (external,) = batch["external"]
        assert (external["source"], external["group_id"]) == ("forger", TRUE)
        entry = bank.question("basic_arithmetic", external["provenance"]["index"]).entry
        expected = list(bank.score_group(entry, external["completions"], FORMAT_WEIGHT, "strict"))
        assert external["rewards"] == expected and expected[0] == 1.0 + FORMAT_WEIGHT
        assert external["claimed_rewards"] != expected
    dropped = {(e.round, e.data["group_id"]) for e in events(folder, "w1") if e.event == "group_rejected"}
    assert {(r, g) for r in (0, 1, 3) for g in (FORGED_QUESTION, HELD_OUT)} <= dropped


def _env(folder: Path, model: Path) -> dict[str, str]:
    return {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "faults",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "MODEL_NAME": str(model),
        "WORKLOAD": "grpo",
        "SEED": str(SEED),
        "TASKS": TASKS,
        "TASK_CONFIG": TASK_CONFIG,
        "NUM_TRAIN_SAMPLES": "2",
        "NUM_GENERATIONS": "4",
        "NUM_TRANSPLANT_TREES": "1",
        "FORMAT_REWARD_WEIGHT": str(FORMAT_WEIGHT),
        "MAX_NEW_TOKENS": "12",
        "LEARNING_RATE": "1e-4",
        "CHECKPOINT_INTERVAL": "1",
        "KEEP_CHECKPOINTS": "3",
        "EVAL_INTERVAL": "0",
        "DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "MAX_ROUNDS": str(ROUNDS),
        "MIN_WORKERS": "1",
        "HEARTBEAT_INTERVAL": "0.5",
        "LIVENESS_TIMEOUT": "120",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.5",
        "COORDINATOR_ROUND_INTERVAL": "300",
        "ROLLOUT_WAIT_TIMEOUT": "5",
    }


def _forged_batch(bank: TaskBank, run_id: str, round_: int) -> RolloutBatch:
    """A peer's batch: a true question with its right answer first and claims inverted; a question that its
    provenance does not give; and a question from the held-out evaluation range."""
    true = bank.question("basic_arithmetic", 100 + round_)
    held = bank.question("basic_arithmetic", training_limit("basic_arithmetic"))
    answers = [f"<answer>{true.entry['answer']}</answer>", "<answer>-1</answer>", "-1", "<answer>-2</answer>"]

    def group(group_id: str, question: str, provenance: Provenance, completions: list[str], rewards: list[float]):
        return RolloutGroup(
            group_id=group_id,
            task="basic_arithmetic",
            question=question,
            provenance=provenance,
            completions=completions,
            rewards=rewards,
        )

    groups = [
        group(TRUE, true.question, true.provenance, answers, [0.0, 1.5, 1.5, 1.5]),
        group(FORGED_QUESTION, "What is 2 + 2?", true.provenance, ["<answer>5</answer>", "4"], [1.5, 0.0]),
        group(HELD_OUT, held.question, held.provenance, [f"<answer>{held.entry['answer']}</answer>", "0"], [1.5, 0]),
    ]
    return RolloutBatch(node_id="forger", run_id=run_id, round=round_, stage=0, groups=groups, created_at=time.time())


def _plant_pickle_checkpoints(folder: Path, pwned: Path) -> set[str]:
    """Checkpoints under w1's name that are pickles with a payload: one whose manifest names ``model.bin``
    (round 4), and one that passes every manifest check but whose 'safetensors' are pickles (round 5)."""
    payload = pickle.dumps(Payload(str(pwned)))
    whole = folder / LAYOUT.checkpoint_dir("w1", 1)
    planted = set()
    for round_, names in ((4, {"model.bin": payload}), (5, {"model.safetensors": payload})):
        files = {
            "config.json": (whole / "config.json").read_bytes(),
            "optimizer.safetensors": payload,
            "trainer_state.json": json.dumps({"round": round_}).encode(),
            **names,
        }
        target = folder / LAYOUT.checkpoint_dir("w1", round_)
        target.mkdir(parents=True)
        manifest = {"kind": "checkpoint", "schema_version": 1, "node_id": "w1", "round": round_, "files": {}}
        for name, data in files.items():
            (target / name).write_bytes(data)
            manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            planted.add(str((target / name).relative_to(folder)))
        (target / "checkpoint.json").write_text(json.dumps(manifest))
    return planted


def _digest(state: dict[str, torch.Tensor]) -> str:
    class Holder(torch.nn.Module):
        def state_dict(self, *args, **kwargs):
            return state

    return param_digest(Holder())
