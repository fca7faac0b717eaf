"""The defaults sweep (bench/defaults.py): each cell's settings, and the held-out gain with its SE."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import defaults  # noqa: E402
from swarm_gdrive.config import from_env  # noqa: E402


def _args(**kw: object) -> argparse.Namespace:
    return defaults.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


@pytest.mark.parametrize("cell", list(defaults.CELLS))
def test_each_cell_changes_only_its_settings_and_parses(tmp_path: Path, cell: str) -> None:
    env = defaults.cell_env(_args(), tmp_path, cell)
    changed = {k for k in defaults.BASELINE if env[k] != defaults.BASELINE[k]}
    assert changed == set(defaults.CELLS[cell])
    config = from_env(env)
    assert config.num_transplant_trees == 0 and config.node_role == "worker"
    assert config.warmup_steps == int(env["WARMUP_STEPS"]) and config.weight_decay == float(env["WEIGHT_DECAY"])


def test_unknown_cell_is_refused() -> None:
    with pytest.raises(SystemExit):
        defaults.parse_args(["--cells", "base,nope"])


def _evals(p1: float, p2: float, n: int = 50) -> list[dict]:
    return [
        {"task": "chain_sum", "level": 0, "n": n, "pass1": p1, "mean_score": p1},
        {"task": "basic_arithmetic", "level": 0, "n": n, "pass1": p2, "mean_score": p2},
        {"task": "chain_sum", "level": 1, "n": n, "pass1": 0.0, "mean_score": 0.0},  # not level 0: left out
    ]


def test_summary_gives_gain_and_binomial_standard_errors() -> None:
    cell = {"rewards": [0.2, 0.4], "zero_variance": [0.5, 0.5], "wall_s": 1.0}
    study = {
        "eval_before": _evals(0.5, 0.5),
        "cells": {
            "base": {**cell, "settings": dict(defaults.BASELINE), "eval_after": _evals(0.6, 0.6)},
            "wd0": {**cell, "settings": {**defaults.BASELINE, "WEIGHT_DECAY": "0"}, "eval_after": _evals(0.9, 0.9)},
        },
    }
    rows = {r["cell"]: r for r in defaults.summarise(study)}
    assert rows["base"]["gain"] == pytest.approx(0.1)
    assert rows["base"]["held_out_se"] == pytest.approx(math.sqrt(0.6 * 0.4 / 100))
    assert rows["base"]["gain_se"] == pytest.approx(math.sqrt(0.24 / 100 + 0.25 / 100))
    assert rows["wd0"]["vs_base"] == pytest.approx(0.3)
    assert rows["wd0"]["reward_mean"] == pytest.approx(0.3)
    study.update(tag="t", rounds=2, groups=2, generations=4, seed=42, machine="m", command="c", written_at="w")
    assert "by more than 2 SE: wd0." in defaults.markdown(study)
