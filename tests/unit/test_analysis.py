"""Comparing configurations of a study on reward files and eval records written into a real folder."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from swarm_gdrive.observe.analysis import (
    bootstrap_ci,
    compare,
    cumulative_rewards,
    format_table,
    hedges_g,
    permutation_p,
)
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EvalRecord, RewardRecord, TaskEval
from swarm_gdrive.storage import LocalStorage

RUN = "0123456789abcdef"


def write_experiment(storage: LocalStorage, name: str, rewards: dict[str, list[float]], evals=None) -> None:
    ex = Exchange(storage, Layout(name), "writer", RUN)
    for node, per_round in rewards.items():
        for round_, reward in enumerate(per_round):
            ex.write_reward(
                RewardRecord(
                    node_id=node,
                    run_id=RUN,
                    round=round_,
                    stage=0,
                    reward=reward,
                    num_local_groups=4,
                    num_external_groups=0,
                    external_requested=0,
                    submitted_at=1.0,
                )
            )
    for (node, round_), pass1 in (evals or {}).items():
        ex.write_eval(
            EvalRecord(
                node_id=node,
                run_id=RUN,
                round=round_,
                created_at=1.0,
                results=[TaskEval(task="chain_sum", n=16, pass1=pass1, mean_score=pass1)],
            )
        )


def test_cumulative_reward_sums_per_round_means_over_common_rounds(tmp_path):
    storage = LocalStorage(tmp_path)
    write_experiment(storage, "base", {"a": [0.1, 0.2, 0.3], "b": [0.0, 0.0, 0.5]})
    assert cumulative_rewards(storage, "base") == pytest.approx({"a": 0.6, "b": 0.5})
    assert cumulative_rewards(storage, "base", rounds=2) == pytest.approx({"a": 0.3, "b": 0.0})


def test_compare_reports_difference_interval_p_value_and_eval_change(tmp_path):
    storage = LocalStorage(tmp_path)
    rng = random.Random(1)
    base = {f"w{i}": [0.1 + rng.uniform(-0.02, 0.02) for _ in range(10)] for i in range(8)}
    better = {f"w{i}": [0.3 + rng.uniform(-0.02, 0.02) for _ in range(12)] for i in range(8)}
    write_experiment(storage, "sapo-8-0", base, {("w0", 0): 0.25, ("w0", 10): 0.25})
    write_experiment(storage, "sapo-4-4", better, {("w0", 0): 0.25, ("w1", 0): 0.25, ("w0", 12): 0.5})
    rows = compare(storage, ["sapo-4-4"], baseline="sapo-8-0")
    baseline, sapo = rows
    assert baseline.experiment == "sapo-8-0" and baseline.difference == 0.0 and sapo.rounds == 10  # common rounds
    assert sapo.difference == pytest.approx(2.0, abs=0.1)
    assert sapo.difference_ci[0] > 1.8 and sapo.difference_ci[1] < 2.2
    assert sapo.cumulative_ci[0] <= sapo.cumulative_mean <= sapo.cumulative_ci[1]
    assert sapo.p_value < 0.01 and sapo.hedges_g > 5
    assert sapo.eval_first == 0.25 and sapo.eval_last == 0.5 and sapo.eval_change == 0.25
    # Two workers, one task, 16 questions, no SE recorded: binomial sqrt(p (1 - p) / 16), mean over workers.
    assert sapo.eval_first_se == pytest.approx((0.25 * 0.75 / 16) ** 0.5)
    assert sapo.eval_last_se == pytest.approx(0.125)
    table = format_table(rows)
    assert "| sapo-4-4 | 8 | 10 |" in table and "+2.0" in table
    assert "0.250 ± 0.108 (round 0) -> 0.500 ± 0.125 (round 12) |" in table
    assert (sapo.eval_first_round, sapo.eval_last_round) == (0, 12)


def test_a_single_evaluation_reports_no_change(tmp_path):
    """TEST_MODE's 3 rounds with EVAL_INTERVAL = 10 and no evaluation before round 0: the one after the last
    round is the only one, so there is no first evaluation to measure a change from (not +0.000)."""
    storage = LocalStorage(tmp_path)
    write_experiment(storage, "quick", {"a": [0.1, 0.2, 0.3]}, {("a", 3): 0.5})
    write_experiment(storage, "full", {"a": [0.1, 0.2, 0.3]}, {("a", 0): 0.25, ("a", 3): 0.5})
    quick, full = compare(storage, ["full"], baseline="quick")
    assert (quick.eval_first, quick.eval_last, quick.eval_change) == (None, 0.5, None)
    assert (quick.eval_first_round, quick.eval_last_round) == (None, 3) and quick.eval_first_se is None
    assert full.eval_change == 0.25 and (full.eval_first_round, full.eval_last_round) == (0, 3)
    table = format_table([quick, full])
    assert "| - -> 0.500 ± 0.125 (round 3) |" in table
    assert "| 0.250 ± 0.108 (round 0) -> 0.500 ± 0.125 (round 3) |" in table


def test_no_difference_gives_a_large_p_value_and_an_interval_around_zero():
    rng = random.Random(3)
    a = [rng.gauss(1.0, 0.1) for _ in range(8)]
    b = [rng.gauss(1.0, 0.1) for _ in range(8)]
    assert permutation_p(a, b, np.random.default_rng(0)) > 0.05
    low, high = bootstrap_ci(a, np.random.default_rng(0))
    assert low < sum(a) / len(a) < high
    assert abs(hedges_g(a, b)) < 1.5
    assert math.isnan(hedges_g([1.0], [2.0]))


def test_compare_command_prints_the_table(tmp_path):
    storage = LocalStorage(tmp_path)
    write_experiment(storage, "base", {"a": [0.1, 0.2], "b": [0.2, 0.2]})
    write_experiment(storage, "other", {"a": [0.5, 0.5], "b": [0.4, 0.6]})
    result = subprocess.run(
        ["swarm-gdrive", "compare", "other", "--baseline", "base", "--folder", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "| base | 2 | 2 |" in result.stdout and "| other | 2 | 2 |" in result.stdout


def _every_relabelling_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided permutation p, by enumerating every split of the pooled values: what scipy must give."""
    pooled, observed = a + b, abs(sum(a) / len(a) - sum(b) / len(b))
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    hits = 0
    for chosen in splits:
        x = [pooled[i] for i in chosen]
        y = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += abs(sum(x) / len(x) - sum(y) / len(y)) >= observed - 1e-12
    return hits / len(splits)


@pytest.mark.parametrize(
    "a, b",
    [
        ([9.125, 10.458, 10.198], [9.901, 9.733, 8.802]),  # 3 against 3: 20 splits, p >= 0.10
        ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
        ([1.0, 5.0, 3.0], [4.0, 2.0, 6.0, 7.0]),
        ([1.0], [2.0, 3.0, 4.0]),  # a group of one: scipy's two-sample test refuses it, the pooled shuffle does not
        ([2.0, 3.0, 4.0], [1.0]),
        ([1.0], [2.0]),
    ],
)
def test_the_permutation_p_is_exact_where_every_relabelling_fits(a, b):
    expected = _every_relabelling_p(a, b)
    for seed in (0, 1, 2):  # exact: no draw, so no seed changes it
        assert permutation_p(a, b, np.random.default_rng(seed)) == pytest.approx(expected, abs=1e-12)


def test_the_committed_learning_study_reads_the_same(tmp_path):
    """bench/results/learning_smollm2.json rebuilt as reward files and compared again: the means, differences and
    Hedges' g are the committed ones; the percentile intervals of 3 workers' means are exactly their min and max
    (BCa would not be); the p-values are the exact permutation ones (0.5, 0.4), the committed Monte-Carlo estimates
    within 3 SE; the difference bounds within 3 seed-to-seed SD of n = 2000 resamples (at most 0.04 here)."""
    study = json.loads((Path(__file__).resolve().parents[2] / "bench/results/learning_smollm2.json").read_text())
    storage = LocalStorage(tmp_path)
    names = [c["experiment"].lower() for c in study["configurations"].values()]
    for config, name in zip(study["configurations"].values(), names, strict=True):
        write_experiment(storage, name, config["summary"]["per_round"])
    rows = compare(storage, names[1:], baseline=names[0])
    assert [r.experiment for r in rows] == [c["experiment"].lower() for c in study["comparison"]]
    exact_p = {"smollm2-i4-j0": 1.0, "smollm2-i2-j2": 0.5, "smollm2-i3-j1": 0.4}
    for row, committed in zip(rows, study["comparison"], strict=True):
        assert row.cumulative_mean == pytest.approx(committed["cumulative_mean"], abs=1e-12)
        assert row.difference == pytest.approx(committed["difference"], abs=1e-12)
        assert row.hedges_g == pytest.approx(committed["hedges_g"], abs=1e-12)
        assert row.cumulative_ci == pytest.approx(tuple(committed["cumulative_ci"]), abs=1e-12)
        assert row.p_value == pytest.approx(exact_p[row.experiment], abs=1e-12)
        assert abs(row.p_value - committed["p_value"]) < 3 * math.sqrt(0.25 / 5000)
        assert row.difference_ci == pytest.approx(tuple(committed["difference_ci"]), abs=0.12)
        assert row.difference_ci[0] < 0 < row.difference_ci[1]  # the conclusion: no difference stands out
