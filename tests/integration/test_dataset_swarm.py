"""TASK_SOURCE=datasets with REWARD_FUNCTIONS: a coordinator and two workers as real processes train the tiny model
on a GSM8K-format JSONL file built here, each from its own copy, taking and re-scoring each other's groups (J > 0);
a worker whose copy differs by one answer is refused with the difference named; a reward function that fails on
some groups does not stop a round."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    RolloutBatch,
    decode,
    decode_lines,
)

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "integration"))
from test_training_swarm import training_env, wait_until  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LAYOUT = Layout("train")
ROUNDS, N_LOCAL, N_GEN, N_EXT = 2, 4, 4, 1
REWARDS = "task_rewards:brevity:0.5,task_rewards:mentions_answer,task_rewards:odd_length_fails"


def gsm8k_rows(n: int = 40) -> list[dict[str, str]]:
    return [
        {
            "question": f"Sam has {a} pens and buys {b} more. How many pens?",
            "answer": f"Sam has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} pens.\n#### {a + b}",
        }
        for a, b in ((1 + i % 7, 2 + i // 7) for i in range(n))
    ]


def write_copy(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def dataset_env(folder: Path, model: Path, node: str, data: Path) -> dict[str, str]:
    env = training_env(folder, model, MAX_ROUNDS=ROUNDS, MIN_WORKERS=2, CHECKPOINT_INTERVAL=ROUNDS)
    for var in ("TASKS", "TASK_CONFIG"):
        env.pop(var)
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])  # task_rewards: each node's own code
    return {
        **env,
        "NODE_ID": node,
        "NODE_ROLE": "coordinator" if node == "coordinator" else "worker",
        "SWARM_LOCAL_DIR": str(folder.parent / "local" / node),
        "TASK_SOURCE": "datasets",
        "DATASET_PATH": str(data),
        "EVAL_SAMPLES": "4",
        "REWARD_FUNCTIONS": REWARDS,
        "PYTHONPATH": path,
        "HF_HUB_OFFLINE": "1",
    }


def test_two_workers_train_on_a_dataset_and_rescore_each_other(tmp_path, taught_tiny_folder):
    folder = tmp_path / "drive"
    folder.mkdir()
    rows = gsm8k_rows()
    copies = {n: write_copy(tmp_path / "own" / n / "gsm8k.jsonl", rows) for n in ("coordinator", "w1", "w2")}
    nodes = [NodeProcess(n, dataset_env(folder, taught_tiny_folder, n, copies[n])) for n in copies]
    edited = [dict(r) for r in rows]
    edited[3]["answer"] = edited[3]["answer"].replace("####", "#### 1")
    other = write_copy(tmp_path / "own" / "w3" / "gsm8k.jsonl", edited)
    try:
        wait_until((folder / LAYOUT.experiment_file).exists, 120, "experiment.json", nodes)
        odd = NodeProcess("w3", dataset_env(folder, taught_tiny_folder, "w3", other))
        nodes.append(odd)
        assert odd.wait(timeout=120) == 2, odd.lines[-10:]
        codes = {n.name: n.wait(timeout=400) for n in nodes[:3]}
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == {"coordinator": 0, "w1": 0, "w2": 0}, [n.lines[-10:] for n in nodes]

    experiment = decode((folder / LAYOUT.experiment_file).read_bytes(), ExperimentRecord)
    from swarm_gdrive.training.dataset_task import DatasetTask, dataset_fingerprint

    assert experiment.config["task_source"] == "datasets"
    assert experiment.config["dataset_rows_hash"] == dataset_fingerprint(rows, "question", "answer", "math")
    assert experiment.config["reward_functions"] == (
        "task_rewards:brevity:0.5,task_rewards:mentions_answer:1,task_rewards:odd_length_fails:1"
    )
    # A function that fails on some groups during a round: named in a WARNING, the round goes on (exit codes 0).
    said_flaky = [
        line for n in nodes[1:3] for line in n.lines if "reward function task_rewards:odd_length_fails" in line
    ]
    assert said_flaky and all("WARNING" in line and "scores 0.0" in line for line in said_flaky)
    # The worker with another copy: refused before it wrote a rollout, the difference named.
    said = "\n".join(odd.lines)
    assert "DATASET_ROWS_HASH=" in said and f"(experiment: {experiment.config['dataset_rows_hash']!r})" in said
    assert not (folder / LAYOUT.rollout_file(0, 0, "w3")).exists()
    events, _ = decode_lines((folder / LAYOUT.events_file("w3")).read_bytes(), EventRecord)
    assert [e.data.get("differing") for e in events if e.event == "worker_refused"] == [["DATASET_ROWS_HASH"]]

    initial = load_file(str(taught_tiny_folder / "model.safetensors"))
    task = DatasetTask(rows, 42, held_out=4)
    for w, peer in (("w1", "w2"), ("w2", "w1")):
        final = load_file(str(folder / LAYOUT.checkpoint_dir(w, ROUNDS - 1) / "model.safetensors"))
        assert any(not torch.equal(t, final[name]) for name, t in initial.items()), f"{w} never trained"
        metrics, problems = decode_lines((folder / LAYOUT.metrics_file(w)).read_bytes(), MetricRecord)
        assert not problems
        stages = {m.round: m.values for m in metrics if "swarm/local_groups" in m.values}
        assert sorted(stages) == list(range(ROUNDS))
        for round_, v in stages.items():
            # The peer's groups were regenerated from this node's own copy and re-scored: none dropped.
            assert v["swarm/external_used"] == N_EXT, (w, round_, v)
            assert v["swarm/external_dropped_invalid"] == 0, (w, round_, v)
        # Re-scoring is deterministic: this test's own reward gives the peer's groups the rewards the peer gave.
        from swarm_gdrive.training.reward_terms import build_reward

        reward = build_reward(task, 0.5, REWARDS, str(folder))
        batch = decode((folder / LAYOUT.rollout_file(0, 0, peer)).read_bytes(), RolloutBatch)
        for group in batch.groups:
            entry = task.regenerate(group)
            assert entry is not None and entry["metadata"]["index"] == group.provenance.index
            assert list(reward.score(entry, group.completions)) == pytest.approx(group.rewards), group.group_id
        assert all(g.task == "dataset" for g in batch.groups)


def test_the_worked_example_of_docs_tasks_md_runs_as_written(tmp_path):
    """docs/tasks.md's worked example, its bash block run as written (the JSONL file written by the page's own
    script, then ``swarm-gdrive demo --tiny`` on it), only the file's path moved into this test's folder."""
    text = (TESTS.parent / "docs" / "tasks.md").read_text(encoding="utf-8")
    block = text.split("## Worked example", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    data = tmp_path / "apples.jsonl"
    script = block.replace("/tmp/apples.jsonl", str(data))
    assert script.count(str(data)) == 2, block  # the page writes the file, then trains on it
    bin_dir = str(Path(sys.executable).parent)  # this venv's python and swarm-gdrive, as after the README's install
    env = {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert len(data.read_text().splitlines()) == 30
    assert re.search(r"\(dataset [0-9.]+ ± [0-9.]+ of 4\)", out), out[-4000:]  # EVAL_SAMPLES=4 of the file held out
    assert "exit codes {'coordinator': 0, 'worker-1': 0, 'worker-2': 0}" in out, out[-4000:]
    assert "external groups from 1 peers" in out, out[-4000:]
