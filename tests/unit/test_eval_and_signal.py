"""Held-out evaluation set, answer extraction modes on real SmolLM2 completions, curriculum steps."""

from __future__ import annotations

import random

import pytest

from swarm_gdrive.protocol.records import Provenance
from swarm_gdrive.training.curriculum import curriculum_step
from swarm_gdrive.training.rewards import extract_answer
from swarm_gdrive.training.tasks import (
    TaskBank,
    curriculum_levels,
    dataset_size,
    difficulty_config,
    held_out_size,
    parse_task_mix,
    training_limit,
)
from tests.unit.test_held_out import peer_group  # the same group, built one way


@pytest.fixture(scope="module")
def bank() -> TaskBank:
    return TaskBank(parse_task_mix("chain_sum,basic_arithmetic", None, "easy"), 42, curriculum=True)


def test_held_out_set_is_the_same_on_every_node_and_never_drawn_for_training(bank):
    other_node = TaskBank(parse_task_mix("chain_sum,basic_arithmetic", None, "easy"), 42, curriculum=True)
    for task in bank.tasks:
        mine = bank.eval_questions(task, 16)
        theirs = other_node.eval_questions(task, 16)
        assert [q.question for q in mine] == [q.question for q in theirs]
        assert all(q.provenance.index >= training_limit(task) for q in mine)
        assert held_out_size(task) == dataset_size(task) - training_limit(task) > 0
    drawn = [q.provenance.index for seed in range(50) for q in bank.draw(40, random.Random(seed))]
    assert len(drawn) == 2000 and max(drawn) < min(training_limit(t) for t in bank.tasks)


def test_a_peer_group_from_the_held_out_range_is_dropped(bank):
    q = bank.eval_questions("chain_sum", 1)[0]
    group = peer_group(q)
    assert bank.regenerate(group) is None
    ok = bank.draw(1, random.Random(0))[0]
    fine = group.model_copy(update={"task": ok.task, "question": ok.question, "provenance": ok.provenance})
    assert bank.regenerate(fine) is not None


def test_easy_preset_is_the_curriculum_floor_and_task_config_overrides_it():
    assert difficulty_config("chain_sum", "easy") == {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    assert difficulty_config("chain_sum", "paper") == {}
    (spec,) = parse_task_mix("chain_sum", '{"chain_sum": {"max_digits": 2}}', "easy")
    assert spec.config == {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
    levels = curriculum_levels("chain_sum")
    assert len(levels) == 11 and levels[1]["max_terms"] == 3


def test_curriculum_levels_change_the_training_draws_and_peers_at_any_known_level_are_accepted(bank):
    easy_q = bank.question("chain_sum", 5)
    bank.set_level("chain_sum", 3)
    try:
        hard_q = bank.question("chain_sum", 5)
        assert hard_q.provenance.config["max_terms"] == 5 and hard_q.question != easy_q.question
        for q in (easy_q, hard_q):  # a peer at another level of the same ladder is still trusted
            assert bank.regenerate(peer_group(q)) is not None
        made_up = Provenance(dataset="chain_sum", config={"min_terms": 2, "max_terms": 99}, seed=42, index=5)
        forged = peer_group(hard_q).model_copy(update={"provenance": made_up})
        assert bank.regenerate(forged) is None
    finally:
        bank.set_level("chain_sum", 0)


# Real SmolLM2-135M-Instruct completions from a demo run (assistant turn opened with <answer>). Lenient extraction
# reads the stated answer, not the last number (issue 31): the first was scored "0", zeroing its right answer 8.
REAL = [
    ("<answer> 8. This is the answer to the arithmetic problem of 8 + 0.\n\nNote: There are", None, "8"),
    ("<answer> 8 + 7 = 15", None, "15"),
    ("<answer>10", None, "10"),
    ("<answer>1. The answer to this question is 8.", None, "8"),
    ("The sum is 9.\n<answer>9</answer>", "9", "9"),
    ("To add 7 and 5, you simply add them together: 7 + 5 =", None, None),  # an unfinished equation states nothing
    ("I am not sure.", None, None),
    ("<answer>-3/4</answer> or maybe <answer> 0.75 </answer>", "0.75", "0.75"),
]


@pytest.mark.parametrize(("completion", "strict", "lenient"), REAL)
def test_extraction_modes_on_real_completions(completion, strict, lenient):
    assert extract_answer(completion, "strict") == strict
    assert extract_answer(completion, "lenient") == lenient


def test_lenient_scoring_gives_variance_where_strict_gives_none(bank):
    q = bank.eval_questions("chain_sum", 1)[0]
    right = q.entry["answer"]
    completions = [f"<answer> {q.question[-8:]} {right}", "<answer> I think 1000", "<answer>no idea", f"= {right}"]
    strict = bank.score_group(q.entry, completions, extraction="strict")
    lenient = bank.score_group(q.entry, completions, extraction="lenient")
    assert strict == (0.0, 0.0, 0.0, 0.0)
    assert lenient[0] == 1.0 and lenient[3] == 1.0 and lenient[2] == 0.0


def test_bad_extraction_mode_is_refused():
    with pytest.raises(ValueError, match="extraction mode"):
        extract_answer("<answer>1</answer>", "fuzzy")


def test_curriculum_steps_on_a_fake_accuracy_series():
    levels = {"chain_sum": 0, "basic_arithmetic": 0}
    top = {"chain_sum": 2, "basic_arithmetic": 4}
    series = [
        ({"chain_sum": 0.5, "basic_arithmetic": 0.9}, {"chain_sum": 0, "basic_arithmetic": 1}),
        ({"chain_sum": 0.8, "basic_arithmetic": 0.2}, {"chain_sum": 1, "basic_arithmetic": 1}),
        ({"chain_sum": 0.95, "basic_arithmetic": 0.79}, {"chain_sum": 2, "basic_arithmetic": 1}),
        ({"chain_sum": 1.0}, {"chain_sum": 2, "basic_arithmetic": 1}),  # at the top; no accuracy: stays
    ]
    for accuracy, expected in series:
        levels = curriculum_step(levels, accuracy, threshold=0.8, top=top)
        assert levels == expected
    assert curriculum_step({"chain_sum": 0}, {"chain_sum": 1.0}, 0.0, {"chain_sum": 2}) == {"chain_sum": 0}
