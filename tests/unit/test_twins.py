"""Near-twins never cross the held-out split (issue 31 part 5): normalisation per task, the split's report, the
warning for a question space a run exhausts."""

from __future__ import annotations

import logging
import math

import pytest

from swarm_gdrive.config import SMALL_MODEL_PRESET, SPARSE_SIGNAL_PRESET
from swarm_gdrive.training.tasks import TaskBank, parse_task_mix, question_rng
from swarm_gdrive.training.twins import (
    estimate_space,
    expected_draws,
    normalise_question,
    scan_split,
    split_report,
    twins_across,
)

SEED = 42
CHAIN = "State the final answer to the following arithmetic problem:"


def preset_bank(preset: dict[str, str]) -> TaskBank:
    return TaskBank(parse_task_mix(preset["TASKS"], preset["TASK_CONFIG"]), SEED, held_out=int(preset["EVAL_SAMPLES"]))


@pytest.mark.parametrize(
    ("task", "one", "other", "twins"),
    [
        ("chain_sum", f"{CHAIN} 4 + 3 =", f"{CHAIN.lower()}  3 +4 =", True),
        ("chain_sum", f"{CHAIN} 7 - 2 =", f"{CHAIN} 2 - 7 =", False),
        ("basic_arithmetic", "Calculate -( ( 4 + -9 ) ).", "Calculate -(-9 + 4).", True),
        ("basic_arithmetic", "Calculate 5 * 3 * 2.", "Calculate 2 * (5 * 3).", True),
        ("basic_arithmetic", "Calculate 5 * 3.", "Calculate 3 * 5.", True),
        ("basic_arithmetic", "Calculate 6 / 3.", "Calculate 3 / 6.", False),
        ("basic_arithmetic", "Calculate 2 * 3 + 4.", "Calculate 2 * (3 + 4).", False),
        ("basic_arithmetic", "What is 1.5 + 2?", "What is 2 + 1.5?", True),
        ("bf", "Run  this: +++.", "run this: +++.", True),  # case and spacing only
        ("bf", "Run this: 1 + 2.", "Run this: 2 + 1.", False),  # no operand order outside arithmetic tasks
    ],
)
def test_normalisation_merges_only_questions_with_the_same_answer(task, one, other, twins):
    assert (normalise_question(one, task) == normalise_question(other, task)) is twins


@pytest.mark.parametrize("preset", [SMALL_MODEL_PRESET, SPARSE_SIGNAL_PRESET], ids=["demo", "sparse"])
def test_twins_of_held_out_questions_never_reach_training(preset):
    """Before issue 31 the demo's chain_sum had 4 of 8 held-out questions with an operand-swapped twin in training."""
    bank = preset_bank(preset)
    for task in bank.tasks:
        held = [q.question for q in bank.eval_questions(task, bank.held_out)]
        scanned = [bank.question(task, i).question for i in range(3000)]
        trainable = [t for t in scanned if not bank.is_held_out(task, t)]
        assert twins_across(held, trainable, task) == 0
        assert twins_across(held, scanned, task) > 0  # the twins exist: the split is what keeps them out
        draws = [bank.draw(4, question_rng(SEED, node, r, 0)) for node in ("w1", "w2") for r in range(40)]
        drawn = [q.question for batch in draws for q in batch if q.task == task]
        assert drawn and twins_across(held, drawn, task) == 0


def test_a_peer_group_with_a_near_twin_of_a_held_out_question_is_rejected():
    from tests.unit.test_held_out import peer_group  # the same group, built one way

    bank = preset_bank(SMALL_MODEL_PRESET)
    held = {normalise_question(q.question, "chain_sum"): q.question for q in bank.eval_questions("chain_sum", 8)}
    twin = next(
        q
        for q in (bank.question("chain_sum", i) for i in range(3000))
        if normalise_question(q.question, "chain_sum") in held and q.question not in held.values()
    )
    group = peer_group(twin)
    assert bank.regenerate(group) is None


def test_the_space_estimate_and_the_split_report_with_its_warning(caplog):
    assert estimate_space(2000, 2000) == math.inf
    assert estimate_space(3000, 155) == pytest.approx(155, rel=0.01)
    assert 900 < estimate_space(1000, 630) < 1100  # 1000 draws from 1000 show 632 on average
    bank = preset_bank(SMALL_MODEL_PRESET)
    demo = expected_draws(bank, workers=2, rounds=3, per_stage=4, stages=1)
    assert demo == {"chain_sum": 12, "basic_arithmetic": 12}
    study = expected_draws(bank, workers=3, rounds=24, per_stage=4, stages=1)
    with caplog.at_level(logging.INFO, logger="swarm_gdrive.training.twins"):
        quiet = split_report(bank, demo, scan=1000)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(s.crossing == 0 for s in quiet) and quiet[0].near_twins > 0
    assert "near-twins" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="swarm_gdrive.training.twins"):
        loud = split_report(bank, study, scan=1000)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [s.task for s in loud if s.exhausts] == ["chain_sum"]  # 144 draws of about 150 trainable questions
    assert len(warned) == 1 and "chain_sum" in warned[0] and "MAX_ROUNDS" in warned[0] and "TASK_CONFIG" in warned[0]
    one = scan_split(bank, "basic_arithmetic", scan=500)
    assert one.scanned == 500 and one.distinct <= 500


def test_a_worker_reports_the_split_at_start_and_warns_of_an_exhausted_space(tmp_path, tiny_folder, caplog):
    import threading

    from swarm_gdrive.config import from_env
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    (tmp_path / "drive").mkdir()
    env = {
        **SMALL_MODEL_PRESET,
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "MODEL_NAME": str(tiny_folder),
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "MAX_ROUNDS": "100",  # 2 workers x 100 rounds x 4 draws / 2 tasks: 400 chain_sum draws of ~150 questions
        "MIN_WORKERS": "2",
    }
    with caplog.at_level(logging.INFO, logger="swarm_gdrive.training.twins"):
        workload = GRPOWorkload(from_env(env), LocalStorage(env["GDRIVE_PATH"]), "w1", threading.Event())
    assert {s.task: s.draws for s in workload.splits} == {"chain_sum": 400, "basic_arithmetic": 400}
    assert all(s.crossing == 0 for s in workload.splits)
    assert caplog.text.count("held-out split of") == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("chain_sum: the swarm draws about 400")
