"""The learning study's summary (bench/learning.py) on reward and eval files written into a real folder."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import Provenance, RolloutBatch, RolloutGroup
from swarm_gdrive.storage import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_analysis import RUN, write_experiment  # noqa: E402

from bench import learning  # noqa: E402

BASE = {"worker-1": [0.1, 0.2, 0.3], "worker-2": [0.0, 0.0, 0.5], "worker-3": [0.2, 0.2, 0.2]}
SAPO = {"worker-1": [0.3, 0.3, 0.3], "worker-2": [0.2, 0.4, 0.6], "worker-3": [0.1, 0.1, 0.4]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    storage = LocalStorage(tmp_path)
    write_experiment(storage, "t-i4-j0", BASE, {("worker-1", 0): 0.5, ("worker-1", 3): 0.75})
    write_experiment(storage, "t-i2-j2", SAPO)
    return tmp_path


def test_summary_sums_each_workers_per_round_reward(folder: Path) -> None:
    s = learning.summarise(folder, "t-i4-j0")
    assert s["rounds_completed"] == 3
    assert s["cumulative"] == pytest.approx({"worker-1": 0.6, "worker-2": 0.5, "worker-3": 0.6})
    assert s["cumulative_mean"] == pytest.approx(1.7 / 3)
    assert s["cumulative_sd"] == pytest.approx(statistics.stdev([0.6, 0.5, 0.6]))
    assert (s["cumulative_min"], s["cumulative_max"]) == pytest.approx((0.5, 0.6))
    assert s["per_round"]["worker-2"] == pytest.approx([0.0, 0.0, 0.5])
    assert (s["eval_pass1_first"], s["eval_pass1_last"]) == pytest.approx((0.5, 0.75))
    # Records without an SE (written before it existed) get the binomial sqrt(p (1 - p) / n), n = 16.
    assert (s["eval_pass1_first_se"], s["eval_pass1_last_se"]) == pytest.approx((0.125, (0.75 * 0.25 / 16) ** 0.5))
    assert (s["first_third_mean"], s["last_third_mean"]) == pytest.approx((0.1, (0.3 + 0.5 + 0.2) / 3))
    assert learning.summarise(folder, "t-i4-j0", rounds=2)["cumulative"]["worker-2"] == pytest.approx(0.0)


NAMES = ["I4-J0", "I2-J2"]
EXPERIMENTS = {n: f"t-{n}".lower() for n in NAMES}


def study(configurations: dict) -> dict:
    machine = {k: "x" for k in ("host_cpu", "cpu_count", "memory_gb", "platform", "python", "torch", "transformers")}
    return {
        "tag": "t",
        "workers": 3,
        "rounds": 3,
        "groups": 4,
        "seed": 42,
        "baseline": "I4-J0",
        "command": "python bench/learning.py --tag t",
        "machine": machine | {"load_average_at_start": [0.0]},
        "configurations": configurations,
    }


def finished(folder: Path, name: str) -> dict:
    summary = learning.summarise(folder, EXPERIMENTS[name])
    return {"status": "finished", "I": int(name[1]), "env": {}, "wall_s": 1.0, "summary": summary}


def write_rollouts(folder: Path, experiment: str, node: str, round_: int, groups: list[tuple[str, list[float]]]):
    """A node's local groups of a round: (question, rewards) each, as group g0, g1, ... of that round."""
    batch = RolloutBatch(
        node_id=node,
        run_id=RUN,
        round=round_,
        stage=0,
        created_at=1.0,
        groups=[
            RolloutGroup(
                group_id=f"r{round_}-s0-g{i}",
                task="chain_sum",
                question=question,
                provenance=Provenance(dataset="chain_sum", seed=1, index=i),
                completions=["x"] * len(rewards),
                rewards=rewards,
            )
            for i, (question, rewards) in enumerate(groups)
        ],
    )
    Exchange(LocalStorage(folder), Layout(experiment), node, RUN).write_rollouts(batch)


def test_the_same_questions_are_compared_from_the_rollout_files(folder: Path) -> None:
    base = [("1+1", [1.0, 0.0]), ("2+2", [0.0, 0.0]), ("3+3", [1.0, 1.0]), ("4+4", [1.0, 1.0])]
    write_rollouts(folder, "t-i4-j0", "worker-1", 0, base)
    write_rollouts(folder, "t-i4-j0", "worker-1", 1, base)
    write_rollouts(folder, "t-i2-j2", "worker-1", 0, [("1+1", [1.0, 1.0]), ("2+2", [1.0, 0.0])])
    write_rollouts(folder, "t-i2-j2", "worker-1", 1, [("1+1", [0.0, 0.0]), ("5+5", [1.0, 0.0])])
    m = learning.matched(folder, EXPERIMENTS, "I4-J0", k=2, rounds=2)
    assert m["configurations"]["I4-J0"]["cumulative"] == pytest.approx({"worker-1": 0.5})  # 0.25 a round
    sapo = m["configurations"]["I2-J2"]
    assert sapo["cumulative"] == pytest.approx({"worker-1": 0.75 + 0.25})
    assert sapo["paired_difference_mean"] == pytest.approx(1.0 - 0.5)
    assert sapo["same_questions_fraction"] == pytest.approx(3 / 4)  # "5+5" is not "2+2"


def test_study_files_state_the_ratio_against_the_baseline(folder: Path, tmp_path_factory) -> None:
    files = learning.save_study(
        study({n: finished(folder, n) for n in NAMES}), NAMES, EXPERIMENTS, folder, tmp_path_factory.mktemp("r")
    )
    assert [f.suffix for f in files] == [".json", ".md", ".png"] and files[2].stat().st_size > 0
    saved = json.loads(files[0].read_text())
    assert saved["partial"] is False
    sapo = next(c for c in saved["comparison"] if c["experiment"] == "t-i2-j2")
    assert sapo["difference"] == pytest.approx(2.7 / 3 - 1.7 / 3)
    page = files[1].read_text()
    assert "| I2-J2 | finished | 3 | 3 | 0.900 | 1.200 | 0.600 | 0.900 ± 0.300 |" in page  # per worker
    assert f"{2.7 / 1.7:.2f}x" in page  # mean 0.9 against 0.567
    assert "| 0.500 ± 0.125 -> 0.750 ± 0.108 |" in page  # held-out pass@1 with its standard error
    assert "| I4-J0 | 0.500 ± 0.125 | 0.750 ± 0.108 |" in page


def test_partial_when_a_configuration_is_missing(folder: Path, tmp_path_factory) -> None:
    only_baseline = study({"I4-J0": finished(folder, "I4-J0")})
    files = learning.save_study(only_baseline, NAMES, EXPERIMENTS, folder, tmp_path_factory.mktemp("r"))
    assert json.loads(files[0].read_text())["partial"] is True
    assert "(PARTIAL)" in files[1].read_text()


def test_a_run_stopped_early_is_compared_over_the_rounds_both_completed(tmp_path: Path, tmp_path_factory) -> None:
    storage = LocalStorage(tmp_path)
    write_experiment(storage, "t-i4-j0", BASE)
    write_experiment(storage, "t-i2-j2", {node: rewards[:2] for node, rewards in SAPO.items()})
    confs = {n: finished(tmp_path, n) for n in NAMES}
    confs["I2-J2"]["status"] = "partial"
    files = learning.save_study(study(confs), NAMES, EXPERIMENTS, tmp_path, tmp_path_factory.mktemp("r"))
    saved = json.loads(files[0].read_text())
    assert saved["partial"] is True
    base = saved["configurations"]["I4-J0"]["summary_common"]
    assert base["rounds_summed"] == 2 and base["cumulative"]["worker-1"] == pytest.approx(0.3)
    assert all(c["rounds"] == 2 for c in saved["comparison"])
    assert f"{(0.6 + 0.6 + 0.2) / (0.3 + 0.0 + 0.4):.2f}x" in files[1].read_text()


def test_the_sparse_preset_and_100_held_out_questions_reach_the_nodes(tmp_path: Path) -> None:
    from swarm_gdrive.config import SMALL_MODEL_PRESET, SPARSE_SIGNAL_PRESET

    sparse = learning.node_env(learning.parse_args(["--preset", "sparse"]), tmp_path, "x", 2, str(tmp_path / "l"))
    demo = learning.node_env(learning.parse_args([]), tmp_path, "x", 2, str(tmp_path / "l"))
    assert sparse["TASK_CONFIG"] == SPARSE_SIGNAL_PRESET["TASK_CONFIG"] != demo["TASK_CONFIG"]
    assert demo["TASK_CONFIG"] == SMALL_MODEL_PRESET["TASK_CONFIG"]
    assert sparse["EVAL_SAMPLES"] == demo["EVAL_SAMPLES"] == "100"
    assert learning.settings_digest(sparse) != learning.settings_digest(demo)
