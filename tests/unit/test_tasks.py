"""The task mix, drawing questions, regenerating peers' questions and the prompts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from reasoning_gym.utils import SYSTEM_PROMPTS

from swarm_gdrive.protocol.records import Provenance, RolloutGroup
from swarm_gdrive.training import tasks
from swarm_gdrive.training.tasks import (
    DATASET_SIZE,
    PAPER_TASKS,
    Question,
    TaskBank,
    TaskSpec,
    build_messages,
    dataset_size,
    parse_task_mix,
    question_rng,
    system_prompt,
)

SEED = 1234
EASY = '{"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}'


@pytest.fixture(scope="module")
def paper_bank() -> TaskBank:
    return TaskBank(parse_task_mix(None, None), dataset_seed=SEED)


@pytest.fixture(scope="module")
def easy_bank() -> TaskBank:
    return TaskBank(parse_task_mix("chain_sum:3,basic_arithmetic", EASY), dataset_seed=SEED)


def group_of(source: Question, completions: list[str] | None = None, **changes: Any) -> RolloutGroup:
    """A peer's group for ``source`` as it arrives over the wire (JSON round trip), with ``changes``."""
    completions = completions or ["<answer>0</answer>"]
    provenance = source.provenance.model_copy(update=changes.pop("provenance", {}))
    fields = {
        "group_id": "peer-1-g0",
        "task": source.task,
        "question": source.question,
        "provenance": provenance,
        "completions": completions,
        "rewards": [1.0] * len(completions),
    } | changes
    return RolloutGroup.model_validate_json(RolloutGroup(**fields).model_dump_json())


# --- parse_task_mix ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "  "])
def test_default_mix_is_the_paper_tasks(text: str | None) -> None:
    specs = parse_task_mix(text, None)
    assert tuple(s.name for s in specs) == PAPER_TASKS
    assert {s.weight for s in specs} == {1.0}
    assert all(s.config == {} for s in specs)


def test_weights_and_config() -> None:
    specs = parse_task_mix(" chain_sum:2 , basic_arithmetic,leg_counting:0.5", EASY)
    assert specs == (
        TaskSpec("chain_sum", 2.0, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        TaskSpec("basic_arithmetic", 1.0, {}),
        TaskSpec("leg_counting", 0.5, {}),
    )


def test_config_of_a_paper_task_without_tasks() -> None:
    specs = parse_task_mix(None, '{"bf": {"difficulty": 2}}')
    assert {s.name: s.config for s in specs}["bf"] == {"difficulty": 2}


@pytest.mark.parametrize(
    ("tasks_text", "config_text", "expected"),
    [
        ("chain_summ", None, ["TASKS", "'chain_summ'", "did you mean chain_sum", "reasoning_gym.factory.DATASETS"]),
        ("no_such_task_at_all", None, ["TASKS", "unknown task", "print(sorted("]),
        ("composite", None, ["TASKS", "'composite'"]),
        ("countdown", None, ["TASKS", "'countdown'", "not allowed", "parse_expr"]),
        ("chain_sum,,basic_arithmetic", None, ["TASKS", "empty entry", "chain_sum:2,basic_arithmetic"]),
        ("chain_sum:0", None, ["TASKS", "'0'", "'chain_sum'", "weight > 0"]),
        ("chain_sum:-1", None, ["TASKS", "'-1'", "weight > 0"]),
        ("chain_sum:abc", None, ["TASKS", "'abc'", "chain_sum:2"]),
        ("chain_sum:", None, ["TASKS", "''", "weight > 0"]),
        ("chain_sum:inf", None, ["TASKS", "'inf'"]),
        ("chain_sum,basic_arithmetic,chain_sum", None, ["TASKS", "appears twice", "weight (name:2)"]),
        ("chain_sum", "{not json", ["TASK_CONFIG", "not valid JSON", "{not json", '{"chain_sum": {"min_terms"']),
        ("chain_sum", "[1, 2]", ["TASK_CONFIG", "JSON object", "got list", "[1, 2]"]),
        ("chain_sum", '{"chain_sum": 3}', ["TASK_CONFIG", "'chain_sum'", "must be a JSON object", "got 3"]),
        ("chain_sum", '{"leg_counting": {}}', ["TASK_CONFIG", "'leg_counting'", "not in TASKS", "add the task"]),
        (None, '{"chain_sum": {}}', ["TASK_CONFIG", "'chain_sum'", "not in TASKS"]),
        ("chain_sum", '{"chain_sum": {"seed": 5}}', ["TASK_CONFIG", "'seed'", "remove it"]),
        ("chain_sum", '{"chain_sum": {"size": 5}}', ["TASK_CONFIG", "'size'", "remove it"]),
        ("chain_sum", '{"chain_sum": {"min_terms": 0}}', ["TASK_CONFIG", '{"min_terms":0}', "min_terms must be"]),
        ("chain_sum", '{"chain_sum": {"bogus": 1}}', ["TASK_CONFIG", "bogus", "valid keys: min_terms, max_terms"]),
        ("chain_sum", '{"chain_sum": {"min_terms": {"a": 1}}}', ["TASK_CONFIG", "chain_sum.min_terms", "flat lists"]),
        ("chain_sum", '{"chain_sum": {"min_terms": NaN}}', ["TASK_CONFIG", "chain_sum.min_terms = NaN"]),
        ("chain_sum", '{"chain_sum": {"%s": 1}}' % ("k" * 200), ["TASK_CONFIG", "at most 128 characters"]),
    ],
)
def test_errors_name_the_variable_the_value_and_the_fix(
    tasks_text: str | None, config_text: str | None, expected: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        parse_task_mix(tasks_text, config_text)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(expected[0] + ":")
    for part in expected[1:]:
        assert part in message


def test_hash_seed_dependent_task_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.tasks"):
        parse_task_mix("ransom_note", None)
    assert "ransom_note" in caplog.text and "PYTHONHASHSEED" in caplog.text


def test_task_bank_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TaskBank((), dataset_seed=0)
    with pytest.raises(ValueError, match="dataset_seed"):
        TaskBank((TaskSpec("chain_sum", 1.0),), dataset_seed=-1)
    with pytest.raises(ValueError, match="once"):
        TaskBank((TaskSpec("chain_sum", 1.0), TaskSpec("chain_sum", 2.0)), dataset_seed=0)
    with pytest.raises(ValueError, match="weight"):
        TaskBank((TaskSpec("chain_sum", 0.0),), dataset_seed=0)
    with pytest.raises(ValueError, match="not allowed"):
        TaskBank((TaskSpec("puzzle24", 1.0),), dataset_seed=0)


def test_dataset_size() -> None:
    assert dataset_size("bf") == DATASET_SIZE == 1_000_000
    assert dataset_size("acre") == 2_000
    assert dataset_size("word_ladder") == 20_000


# --- drawing ----------------------------------------------------------------------------------


def keys(questions: list[Question]) -> list[tuple[str, int, str]]:
    return [(q.task, q.provenance.index, q.question) for q in questions]


def test_draw_is_determined_by_seed_node_round_and_stage(paper_bank: TaskBank) -> None:
    first = paper_bank.draw(8, question_rng(SEED, "node-a", 3, 0))
    assert keys(first) == keys(paper_bank.draw(8, question_rng(SEED, "node-a", 3, 0)))
    restarted = TaskBank(parse_task_mix(None, None), dataset_seed=SEED)
    assert keys(first) == keys(restarted.draw(8, question_rng(SEED, "node-a", 3, 0)))
    for other in [("node-b", 3, 0), ("node-a", 4, 0), ("node-a", 3, 1)]:
        assert keys(first) != keys(paper_bank.draw(8, question_rng(SEED, *other)))


def test_drawn_questions_carry_their_entry_and_provenance(paper_bank: TaskBank) -> None:
    for question in paper_bank.draw(20, question_rng(SEED, "node-a", 0, 0)):
        assert question.task in PAPER_TASKS
        assert question.question == question.entry["question"]
        assert question.entry["metadata"]["source_dataset"] == question.task
        assert question.provenance == Provenance(
            dataset=question.task, config={}, seed=SEED, index=question.provenance.index
        )
        assert 0 <= question.provenance.index < DATASET_SIZE
        assert paper_bank.question(question.task, question.provenance.index).question == question.question


def test_draw_counts(paper_bank: TaskBank) -> None:
    assert paper_bank.draw(0, question_rng(SEED, "n", 0, 0)) == []
    with pytest.raises(ValueError, match="n must be"):
        paper_bank.draw(-1, question_rng(SEED, "n", 0, 0))


def test_weights_are_respected(easy_bank: TaskBank) -> None:
    counts = Counter(q.task for q in easy_bank.draw(2000, question_rng(SEED, "node-a", 0, 0)))
    assert counts["chain_sum"] + counts["basic_arithmetic"] == 2000
    assert abs(counts["chain_sum"] / 2000 - 0.75) < 0.04


def test_every_paper_task_is_drawn(paper_bank: TaskBank) -> None:
    counts = Counter(q.task for q in paper_bank.draw(450, question_rng(SEED, "node-a", 0, 0)))
    assert set(counts) == set(PAPER_TASKS)
    assert all(25 <= count <= 75 for count in counts.values()), counts


def test_config_reaches_the_generator(easy_bank: TaskBank) -> None:
    for question in easy_bank.draw(50, question_rng(SEED, "node-a", 0, 0)):
        if question.task == "chain_sum":
            assert question.entry["metadata"]["num_terms"] == 2
            assert question.provenance.config == {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_question_index_out_of_range(paper_bank: TaskBank) -> None:
    with pytest.raises(IndexError):
        paper_bank.question("bf", DATASET_SIZE)


def test_bf_chatter_is_kept_off_stdout(paper_bank: TaskBank, capsys: pytest.CaptureFixture[str]) -> None:
    paper_bank.question("bf", 5)
    assert capsys.readouterr().out == ""


HASH_SCRIPT = """
import hashlib
from swarm_gdrive.training.tasks import TaskBank, parse_task_mix, question_rng
bank = TaskBank(parse_task_mix(None, None), dataset_seed=7)
text = "|".join(q.question for q in bank.draw(45, question_rng(7, "node-a", 0, 0)))
print(hashlib.sha256(text.encode()).hexdigest())
"""


def test_paper_questions_do_not_depend_on_the_hash_seed() -> None:
    """Peers regenerate questions in other processes: the text must not depend on PYTHONHASHSEED."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HASH_SCRIPT],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hash_seed in (1, 2)
    ]
    digests = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(digests[0]) == 64 and digests[0] == digests[1]


# --- regenerating peers' groups ---------------------------------------------------------------


def test_regenerate_accepts_an_honest_group(paper_bank: TaskBank) -> None:
    for question in paper_bank.draw(9, question_rng(SEED, "peer-1", 0, 0)):
        assert paper_bank.regenerate(group_of(question)) == question.entry


def test_regenerate_accepts_a_configured_task_after_json(easy_bank: TaskBank) -> None:
    question = easy_bank.question("chain_sum", 17)
    assert easy_bank.regenerate(group_of(question)) == question.entry


def test_regenerate_rejects_a_forged_question(paper_bank: TaskBank, caplog: pytest.LogCaptureFixture) -> None:
    question = paper_bank.question("basic_arithmetic", 42)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.tasks"):
        assert paper_bank.regenerate(group_of(question, question=question.question + " ")) is None
    assert "peer-1-g0" in caplog.text
    other = paper_bank.question("basic_arithmetic", 43)
    assert paper_bank.regenerate(group_of(question, question=other.question)) is None


def test_regenerate_rejects_a_task_not_in_the_mix(paper_bank: TaskBank, easy_bank: TaskBank) -> None:
    honest_elsewhere = easy_bank.question("chain_sum", 5)
    assert paper_bank.regenerate(group_of(honest_elsewhere)) is None


def test_regenerate_rejects_a_task_field_that_disagrees(paper_bank: TaskBank) -> None:
    question = paper_bank.question("bf", 5)
    assert paper_bank.regenerate(group_of(question, task="basic_arithmetic")) is None


@pytest.mark.parametrize(
    "config",
    [
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2.0, "max_terms": 2, "min_digits": 1, "max_digits": 1},  # equal in Python, not the same config
        {"min_terms": 2, "max_terms": 2, "min_digits": 1},
        {},
    ],
)
def test_regenerate_rejects_a_different_config(easy_bank: TaskBank, config: dict[str, Any]) -> None:
    question = easy_bank.question("chain_sum", 5)
    assert easy_bank.regenerate(group_of(question, provenance={"config": config})) is None


def test_regenerate_never_builds_a_dataset(easy_bank: TaskBank, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("regenerate built a dataset")

    monkeypatch.setattr(tasks.reasoning_gym, "create_dataset", refuse)
    question = easy_bank.question("chain_sum", 5)
    assert easy_bank.regenerate(group_of(question, provenance={"config": {"min_terms": 3}})) is None
    assert easy_bank.regenerate(group_of(question)) == question.entry


def test_regenerate_rejects_a_different_seed(paper_bank: TaskBank) -> None:
    question = paper_bank.question("bf", 5)
    # Random(seed + index): seed + 1 at index - 1 is the same question, and still refused.
    shifted = group_of(question, provenance={"seed": SEED + 1, "index": 4})
    assert TaskBank((TaskSpec("bf", 1.0),), dataset_seed=SEED + 1).regenerate(shifted) == question.entry | {
        "metadata": question.entry["metadata"] | {"source_index": 4}
    }
    assert paper_bank.regenerate(shifted) is None


@pytest.mark.parametrize("index", [DATASET_SIZE, 2**31])
def test_regenerate_rejects_an_out_of_range_index(paper_bank: TaskBank, index: int) -> None:
    question = paper_bank.question("bf", 5)
    assert paper_bank.regenerate(group_of(question, provenance={"index": index})) is None


# --- scoring ----------------------------------------------------------------------------------


def test_score_group_uses_the_local_verifier_not_the_claims(easy_bank: TaskBank) -> None:
    question = easy_bank.question("chain_sum", 11)
    answer = question.entry["answer"]
    completions = [f"<answer>{answer}</answer>", "<answer>banana</answer>", f"the answer is {answer}"]
    group = group_of(question, completions=completions, rewards=[0.0, 1.0, 1.0])
    entry = easy_bank.regenerate(group)
    assert entry is not None
    assert easy_bank.score_group(entry, group.completions) == (1.0, 0.0, 0.0)
    assert easy_bank.score_group(entry, group.completions, format_weight=0.5) == (1.5, 0.5, 0.0)


def test_score_group_refuses_an_entry_from_elsewhere(easy_bank: TaskBank, paper_bank: TaskBank) -> None:
    entry = paper_bank.question("bf", 1).entry
    with pytest.raises(ValueError, match="'bf'"):
        easy_bank.score_group(entry, ["<answer>x</answer>"])


def test_provenance_of(easy_bank: TaskBank) -> None:
    assert easy_bank.provenance_of("chain_sum", 9) == Provenance(
        dataset="chain_sum", config=json.loads(EASY)["chain_sum"], seed=SEED, index=9
    )
    assert easy_bank.tasks == ("chain_sum", "basic_arithmetic")


# --- prompts ----------------------------------------------------------------------------------


def test_prompts() -> None:
    assert system_prompt() == SYSTEM_PROMPTS["default"]
    assert "<answer>" in system_prompt()
    assert build_messages("What is 2 + 3?") == [
        {"role": "system", "content": SYSTEM_PROMPTS["default"]},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
