"""The learning comparison of the two round modes (bench/modes.py): its plan, its pairing and its staleness figure."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import modes, study  # noqa: E402


def test_each_seed_has_one_swarm_per_mode_with_the_same_j_and_its_round_mode_in_the_nodes_environment(tmp_path):
    args = modes.parse_args(["--seeds", "1,5", "--transplants", "1", "--groups", "3", "--tag", "t"])
    swarms = modes.plan(args)
    assert [(s["seed"], s["mode"], s["J"]) for s in swarms] == [(1, "sync", 1), (1, "async", 1), (5, "sync", 1)] + [
        (5, "async", 1)
    ]
    assert len({s["experiment"] for s in swarms}) == 4
    envs = [study.swarm_env(args, tmp_path, s) for s in swarms]
    assert [e["ROUND_MODE"] for e in envs] == ["sync", "async", "sync", "async"]
    assert {(e["NUM_TRANSPLANT_TREES"], e["NUM_TRAIN_SAMPLES"]) for e in envs} == {("1", "2")}
    assert envs[0]["SEED"] == envs[1]["SEED"] == "1" and envs[2]["SEED"] == "5"  # paired by seed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "1"], "at least 2 swarm seeds"),
        (["--workers", "1"], "at least 2"),
        (["--transplants", "0"], "J in 1..3"),
        (["--transplants", "4"], "J in 1..3"),
    ],
)
def test_a_comparison_that_could_not_show_the_modes_apart_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        modes.parse_args(argv)
    assert message in capsys.readouterr().err


def test_median_age_reads_every_workers_externals_taken_and_skips_other_events(tmp_path):
    logs = tmp_path / "experiments" / "x" / "logs"
    for node, ages in (("worker-1", [1.0, 9.0]), ("worker-2", [4.0])):
        (logs / node).mkdir(parents=True)
        lines = [
            {"event": "externals_taken", "data": {"age_s": ages}},
            {"event": "rollout_published", "data": {"age_s": [1000.0]}},
        ]
        (logs / node / "training_events.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    assert modes.median_age(tmp_path, "x") == 4.0
    assert math.isnan(modes.median_age(tmp_path, "absent"))


def test_analysis_pairs_async_against_sync_by_seed(tmp_path, monkeypatch):
    cumulative = {("s1", "sync"): 1.0, ("s1", "async"): 1.5, ("s2", "sync"): 2.0, ("s2", "async"): 2.25}
    cumulative |= {("s3", "sync"): 0.5, ("s3", "async"): 1.5}

    def figures(_folder, swarm, _rounds):  # the per-swarm reading is bench.study's, tested with it
        seed, mode = swarm["experiment"].split("-")
        return {"cumulative": cumulative[(seed, mode)], "rounds_completed": 3, "external_groups_mean": 1.0}

    monkeypatch.setattr(study, "swarm_figures", figures)
    swarms = [{"seed": s, "mode": m, "J": 1, "experiment": f"s{s}-{m}"} for s in (1, 2, 3) for m in modes.MODES]
    out = modes.analyse(tmp_path, swarms, 3)
    assert out["modes"]["sync"]["values"] == [1.0, 2.0, 0.5] and out["modes"]["async"]["values"] == [1.5, 2.25, 1.5]
    d = out["async_minus_sync"]
    assert d["differences"] == [0.5, 0.25, 1.0] and d["n"] == 3
    assert d["mean"] == pytest.approx(1.75 / 3)
    text = modes.markdown(
        {
            "analysis": out,
            "swarms": swarms,
            "tag": "t",
            "workers": 2,
            "groups": 4,
            "J": 1,
            "generations": 4,
            "rounds": 3,
            "preset": "demo",
            "model": "m",
            "machine": {"host_cpu": "cpu", "cpu_count": 2},
            "run": {"wall_s": 1.0, "exit_codes": {"s1-sync/worker-1": 0}},
        }
    )
    assert "**async − sync, paired by seed**: +0.583" in text
    assert "| 1 | sync | 3 | 1.000 | 1.00 | — | — | 0 |" in text
