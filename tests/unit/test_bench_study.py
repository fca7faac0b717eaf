"""The replicated SAPO study's statistics (bench/study.py): t-intervals, p-values and the detectable difference."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import study  # noqa: E402


@pytest.mark.parametrize(
    ("t", "df", "expected"),  # scipy.stats.t.sf(t, df) * 2
    [(2.0, 2, 0.183503), (1.3, 5, 0.250301), (4.303, 2, 0.05), (0.0, 3, 1.0), (12.706, 1, 0.05)],
)
def test_t_two_sided_p_matches_scipy(t: float, df: int, expected: float) -> None:
    assert study.t_two_sided_p(t, df) == pytest.approx(expected, abs=2e-4)


def test_sign_flip_p_cannot_go_below_two_over_two_to_the_n() -> None:
    assert study.sign_flip_p([1.0, 2.0, 3.0]) == 0.25  # every difference positive: the smallest p for n = 3
    assert study.sign_flip_p([1.0, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(2 / 32)
    assert study.sign_flip_p([1.0, -1.0]) == 1.0


def test_paired_gives_a_t_interval_and_the_minimal_detectable_difference() -> None:
    treated, baseline = [10.0, 12.0, 11.0], [9.0, 10.0, 10.5]
    out = study.paired(treated, baseline)
    d = [1.0, 2.0, 0.5]
    sd = 0.763763
    assert out["differences"] == d and out["n"] == 3
    assert out["mean"] == pytest.approx(7 / 6)
    assert out["sd"] == pytest.approx(sd, abs=1e-6)
    half = 4.303 * sd / math.sqrt(3)
    assert out["ci"] == pytest.approx([7 / 6 - half, 7 / 6 + half], abs=1e-4)
    assert out["mdd"] == pytest.approx((4.303 + 1.061) * sd / math.sqrt(3), abs=1e-4)
    assert out["mdd_per_sd"] == pytest.approx(3.097, abs=1e-3)
    assert out["p_sign_flip"] == 0.25 and out["p_sign_flip_floor"] == 0.25
    assert 0.05 < out["p_t"] < 0.2  # t = 2.65 on 2 df


def test_paired_leaves_out_a_seed_with_a_missing_figure() -> None:
    out = study.paired([1.0, math.nan, 3.0, 2.0], [0.0, 1.0, 1.0, 1.0])
    assert out["n"] == 3 and out["differences"] == [1.0, 2.0, 1.0]


def test_interval_of_replicates() -> None:
    out = study.interval([1.0, 2.0, 3.0])
    assert out["mean"] == 2.0 and out["sd"] == 1.0
    assert out["ci"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)])
    assert math.isnan(study.interval([1.0])["ci"][0])


def test_every_swarm_of_a_seed_shares_its_seed_and_node_names(tmp_path: Path) -> None:
    args = study.parse_args(["--seeds", "3", "--transplants", "0,4", "--workers", "4", "--groups", "8"])
    plan = study.swarms(args)
    assert [(s["seed"], s["J"]) for s in plan] == [(1, 0), (1, 4), (2, 0), (2, 4), (3, 0), (3, 4)]
    envs = [study.swarm_env(args, tmp_path, s) for s in plan]
    assert {e["SEED"] for e in envs[:2]} == {"1"} and envs[2]["SEED"] == "2"
    assert [e["NUM_TRANSPLANT_TREES"] for e in envs[:2]] == ["0", "4"]
    assert [e["NUM_TRAIN_SAMPLES"] for e in envs[:2]] == ["8", "4"]
    assert len({e["EXPERIMENT_NAME"] for e in envs}) == 6


class _Node:
    def __init__(self, name: str, code: str) -> None:
        import subprocess

        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)


def test_stop_together_stops_every_node_within_one_grace_period() -> None:
    import time

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    nodes = [_Node(f"n{i}", "import time; time.sleep(60)") for i in range(3)] + [_Node("stubborn", stubborn)]
    time.sleep(0.5)  # let the stubborn one install its handler
    started = time.monotonic()
    codes = study.stop_together(nodes, grace=2.0)
    assert time.monotonic() - started < 6.0
    assert all(codes[f"n{i}"] == -15 for i in range(3))  # SIGTERM
    assert codes["stubborn"] == -9  # SIGKILL after the grace period


def test_seeds_in_turn_runs_each_seeds_swarms_together_with_a_share_of_the_time(monkeypatch, tmp_path) -> None:
    args = study.parse_args(["--seeds", "3", "--transplants", "0,4", "--timeout", "900", "--seeds-in-turn"])
    batches = []

    def run_all(args, folder, plan, timeout=None):
        batches.append(([(s["seed"], s["J"]) for s in plan], timeout))
        return {"exit_codes": {f"s{plan[0]['seed']}": 0}, "wall_s": 10.0, "timed_out": plan[0]["seed"] == 2}

    monkeypatch.setattr(study, "run_all", run_all)
    run = study.run_in_turn(args, tmp_path, study.swarms(args))
    assert batches == [([(1, 0), (1, 4)], 300.0), ([(2, 0), (2, 4)], 300.0), ([(3, 0), (3, 4)], 300.0)]
    assert run["exit_codes"] == {"s1": 0, "s2": 0, "s3": 0} and run["wall_s"] == 30.0 and run["timed_out"]


def test_each_preset_gives_its_task_settings(tmp_path: Path) -> None:
    from swarm_gdrive.config import SMALL_MODEL_PRESET, SPARSE_SIGNAL_PRESET

    for preset, expected in (("demo", SMALL_MODEL_PRESET), ("sparse", SPARSE_SIGNAL_PRESET)):
        args = study.parse_args(["--seeds", "2", "--transplants", "0,1", "--preset", preset])
        env = study.swarm_env(args, tmp_path, study.swarms(args)[0])
        assert env["TASK_CONFIG"] == expected["TASK_CONFIG"]


@pytest.mark.parametrize("moment", ["starting", "waiting"])
def test_a_study_stopped_with_sigterm_stops_every_node_it_started(monkeypatch, tmp_path, moment: str) -> None:
    """`timeout`, a scheduler or `kill` sends SIGTERM while the nodes start (at the fifth) or while the study waits
    for them: every node started is stopped on the way out, none is left running."""
    import os
    import signal

    import swarm_gdrive.procs

    started: list[_Node] = []

    class Node(_Node):
        def wait(self, timeout: float | None = None) -> int:
            if moment == "waiting" and not getattr(os, "_sigterm_sent", False):
                os._sigterm_sent = True  # once
                os.kill(os.getpid(), signal.SIGTERM)
            return super().wait(timeout)

    def node(name, env, sink):
        started.append(Node(name, "import time; time.sleep(120)"))
        if moment == "starting" and len(started) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return started[-1]

    monkeypatch.setattr(swarm_gdrive.procs, "NodeProcess", node)
    monkeypatch.setattr(os, "_sigterm_sent", False, raising=False)
    args = study.parse_args(["--seeds", "2", "--transplants", "0,1", "--workers", "2", "--timeout", "100"])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        study.learning.exit_on_sigterm()
        with pytest.raises(SystemExit) as info:
            study.run_all(args, tmp_path, study.swarms(args))
    finally:
        signal.signal(signal.SIGTERM, previous)
        for n in started:
            if n.returncode is None:
                n.proc.kill()
    assert info.value.code == 128 + signal.SIGTERM
    # Starting: the SIGTERM waits until the swarm's nodes are listed (6 = 2 swarms' 3), then stops them all.
    assert len(started) == (6 if moment == "starting" else 12)
    assert all(n.returncode == -signal.SIGTERM for n in started), [n.returncode for n in started]


def test_a_study_uses_at_least_100_held_out_questions_per_task() -> None:
    assert study.parse_args(["--seeds", "3"]).eval_samples == 100
    with pytest.raises(SystemExit):
        study.parse_args(["--seeds", "3", "--eval-samples", "32"])
    assert study.parse_args(["--seeds", "3", "--eval-samples", "4", "--tiny"]).eval_samples == 4  # a smoke test


def _experiment_with_rollouts(folder: Path, experiment: str, rewards: dict[str, list[list[list[float]]]]) -> None:
    """An experiment.json and, per worker, per round, a batch of own groups with the given rewards (in order)."""
    import time

    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.protocol.records import ExperimentRecord, Provenance, RolloutBatch, RolloutGroup
    from swarm_gdrive.storage import LocalStorage

    exchange = Exchange(LocalStorage(folder), Layout(experiment), "coordinator")
    exchange.write_experiment(
        ExperimentRecord(experiment=experiment, run_id="0123456789abcdef", fingerprint="0" * 16,
                         config={"num_stages": 1}, coordinator_id="coordinator", created_at=time.time())
    )  # fmt: skip
    exchange.run_id = "0123456789abcdef"
    for node, rounds in rewards.items():
        for round_, groups in enumerate(rounds):
            made = [
                RolloutGroup(group_id=f"g{i}", task="chain_sum", question=f"q{i}", completions=["x"] * len(r),
                             rewards=r, provenance=Provenance(dataset="chain_sum", seed=0, index=i))
                for i, r in enumerate(groups)
            ]  # fmt: skip
            exchange.write_rollouts(
                RolloutBatch(node_id=node, run_id="0123456789abcdef", round=round_, stage=0, groups=made,
                             created_at=time.time())
            )  # fmt: skip


def test_same_question_rewards_read_only_the_first_k_own_groups_of_every_worker(tmp_path: Path) -> None:
    # I = 4 (J = 0): the first 2 groups are the questions an I = 2 worker of the same seed draws; the other two
    # are easy ones that lift the whole-batch mean.
    easy = [[1.0, 1.0], [1.0, 1.0]]
    _experiment_with_rollouts(
        tmp_path,
        "s1-j0",
        {
            "worker-1": [[[0.0, 1.0], [0.0, 0.0], *easy], [[1.0, 1.0], [0.0, 0.0], *easy]],
            "worker-2": [[[0.0, 0.0], [0.0, 0.0], *easy], [[0.5, 0.5], [0.5, 0.5], *easy]],
        },
    )
    assert study.same_question_rewards(tmp_path, "s1-j0", 2, 2) == [0.125, 0.5]  # means of (0.25, 0), (0.5, 0.5)
    assert study.same_question_rewards(tmp_path, "s1-j0", 2, 4) == [0.5625, 0.75]  # the whole batch
    assert math.isnan(study.same_question_rewards(tmp_path, "s1-j0", 3, 2)[2])  # a round without rollout files
    assert all(math.isnan(x) for x in study.same_question_rewards(tmp_path, "absent", 2, 2))
