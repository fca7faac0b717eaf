"""The coordination benchmark at small N, through its entry point (``python -m bench coordination``).

It must run and measure what it claims to; its figures are not held to any time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.drive, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_coordination_benchmark_runs_and_reports_real_figures(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench", "coordination", "--nodes", "2,4", "--drive-nodes", "2,4",
           "--transplant", "1", "--rounds", "2", "--polls", "0.05:0.3", "--step-seconds", "0.05",
           "--latency", "0.02", "--timeout", "60", "--tag", "test", "--out-dir", str(tmp_path),
           "--completion-chars", "1000"]  # fmt: skip
    # 1000-character completions: rollout batches as large as a model's, downloaded rather than carried in listings.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    result = json.loads((tmp_path / "coordination_test.json").read_text())
    table = (tmp_path / "coordination_test.md").read_text()
    assert result["machine"]["cores"] and result["machine"]["cpu"]
    runs = {(r["spec"]["backend"], r["spec"]["workers"]): r for r in result["runs"]}
    assert sorted(runs) == [("drive", 2), ("drive", 4), ("local", 2), ("local", 4)]
    for (backend, _), run in runs.items():
        assert run["all_reached_last_round"], run["name"]
        assert not run["timed_out"] and not run["errors"] and not run["exit_codes"], run["name"]
        assert [t["complete"] for t in run["transitions"]] == [True], run["name"]
        overhead = run["transitions"][0]
        for key in ("overhead_s", "coordinator_s", "pickup_s"):
            assert math.isfinite(overhead[key]), (run["name"], key)
        # The next round cannot start before the coordinator saw the last submission and announced the round.
        assert overhead["overhead_s"] > 0 and overhead["coordinator_s"] > 0, run["name"]
        worker = run["worker_per_round"]
        assert worker["calls"] > 0 and worker["bytes_written"] > 0, run["name"]
        # J = 1: every worker submitted a reward and read other nodes' rollouts in the counted round.
        assert worker["by_kind"]["rewards"] >= 1 and worker["reads_by_kind"]["rollouts"] >= 1, run["name"]
        assert run["coordinator_per_round"]["calls"] > 0, run["name"]
        assert 0 < run["cpu_per_wall"] <= os.cpu_count(), run["name"]  # the harness's load, beside the figures
        if backend == "drive":
            assert worker["api_calls"] > 0, run["name"]  # Drive requests behind the storage calls
            assert run["emulator_requests"] > 0
            # Each request is charged to the storage call of the thread that made it: the breakdown adds up.
            assert sum(worker["api_by_call"].values()) == pytest.approx(worker["api_calls"]), run["name"]
        else:
            assert worker["api_calls"] == 0 and "emulator_requests" not in run
        assert run["name"] in table
    growth = {(g["backend"], g["transplant"]): g for g in result["growth"]}
    assert sorted(growth) == [("drive", 1), ("local", 1)]
    assert all(g["workers"] == [2, 4] for g in growth.values())
