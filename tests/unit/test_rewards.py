"""Answer extraction, the format reward and scoring with real reasoning-gym verifiers."""

from __future__ import annotations

import inspect
import logging
import math
import re
import sys
import time
from typing import Any

import pytest
import reasoning_gym
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer as rg_extract_answer

from swarm_gdrive.training import rewards
from swarm_gdrive.training.rewards import extract_answer, format_reward, is_safe_for_eval, score, verifier_score
from swarm_gdrive.training.tasks import PAPER_TASKS

SEED = 11


@pytest.fixture(scope="module")
def datasets() -> dict[str, Any]:
    return {name: reasoning_gym.create_dataset(name, size=100, seed=SEED) for name in PAPER_TASKS}


def tagged(answer: str) -> str:
    return f"<think>Let me work through this step by step.</think>\n<answer>{answer}</answer>"


def correct_answer(name: str, entry: dict[str, Any]) -> str:
    if entry["answer"] is not None:
        return entry["answer"]
    # propositional_logic has no single answer; its metadata carries one valid conclusion.
    assert name == "propositional_logic"
    return entry["metadata"]["example_answer"]


# --- extraction -----------------------------------------------------------------------------


def test_extract_takes_the_last_tag() -> None:
    completion = "First guess <answer>12</answer>, but checking again 7 + 6 = 13.\n<answer>13</answer>"
    assert extract_answer(completion) == "13"


def test_extract_after_an_echoed_format_example() -> None:
    completion = "The format is <answer>answer here</answer>. 2 * 21 = 42.\n<answer>42</answer>"
    assert extract_answer(completion) == "42"


def test_extract_strips_whitespace_and_keeps_inner_newlines() -> None:
    assert extract_answer("<answer>\n  1 0 1\n0 1 2  \n</answer>") == "1 0 1\n0 1 2"
    assert extract_answer("<answer>   </answer>") == ""


def test_extract_nested_tags_takes_the_inner_pair() -> None:
    completion = "<answer><answer>x</answer></answer>"
    assert extract_answer(completion) == "x"
    assert rg_extract_answer(completion) == "<answer>x"  # reasoning-gym's own reading


def test_extract_agrees_with_reasoning_gym_on_plain_completions() -> None:
    for completion in ["no tags at all", "<answer>5</answer>", "a <answer> 1 </answer> b <answer>2</answer> c"]:
        assert extract_answer(completion) == rg_extract_answer(completion)


def test_extract_none_without_a_closed_tag() -> None:
    assert extract_answer("The answer is 42.") is None
    assert extract_answer("Thinking... <answer>42") is None  # cut at the length limit, or not: not counted
    assert extract_answer("<answer>7</answer> then <answer>8") == "7"  # the last closed pair
    assert extract_answer("</answer>42<answer>") is None
    assert extract_answer("<Answer>42</Answer>") is None


def test_extract_is_fast_on_hostile_input() -> None:
    assert extract_answer("<answer>" * 2000 + "x" * 8000) is None
    assert extract_answer("<answer>" * 2000 + "1</answer>") == "1"


def test_format_reward() -> None:
    assert format_reward(tagged("42")) == 1.0
    assert format_reward("text <answer>42</answer> more text") == 1.0
    assert format_reward("<answer> </answer>") == 0.0
    assert format_reward("<answer>42") == 0.0
    assert format_reward("42") == 0.0


# --- scoring on the nine paper tasks ----------------------------------------------------------

WRONG = "§"
#: What each verifier gives the wrong answer: fraction_simplification and propositional_logic
#: pay a little for any answer.
WRONG_SCORE = {"fraction_simplification": 0.01, "propositional_logic": 0.05}


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_own_answer_scores_one(datasets: dict[str, Any], name: str) -> None:
    dataset = datasets[name]
    for index in range(3):
        entry = dataset[index]
        assert score(dataset, entry, tagged(correct_answer(name, entry))) == 1.0


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_wrong_answer_scores_below_one(datasets: dict[str, Any], name: str) -> None:
    dataset = datasets[name]
    entry = dataset[0]
    assert score(dataset, entry, tagged(WRONG)) == WRONG_SCORE.get(name, 0.0)


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_no_tag_scores_zero_even_with_the_right_text(datasets: dict[str, Any], name: str) -> None:
    dataset = datasets[name]
    entry = dataset[0]
    assert score(dataset, entry, f"The answer is {correct_answer(name, entry)}") == 0.0
    assert score(dataset, entry, f"<answer>{correct_answer(name, entry)}", format_weight=0.5) == 0.0


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_format_weight_adds(datasets: dict[str, Any], name: str) -> None:
    dataset = datasets[name]
    entry = dataset[0]
    assert score(dataset, entry, tagged(correct_answer(name, entry)), format_weight=0.5) == 1.5
    assert score(dataset, entry, tagged(WRONG), format_weight=0.5) == WRONG_SCORE.get(name, 0.0) + 0.5


def test_format_weight_must_be_finite(datasets: dict[str, Any]) -> None:
    dataset = datasets["basic_arithmetic"]
    with pytest.raises(ValueError, match="format_weight"):
        score(dataset, dataset[0], tagged("1"), format_weight=math.nan)


def test_missing_answer_is_zero_without_asking_the_verifier(datasets: dict[str, Any]) -> None:
    dataset = datasets["fraction_simplification"]
    entry = dataset[0]
    assert dataset.score_answer(None, entry) == 0.01  # the verifier itself pays for nothing
    assert score(dataset, entry, "I do not know") == 0.0


def test_partial_credit_is_kept(datasets: dict[str, Any]) -> None:
    fractions = datasets["fraction_simplification"]
    entry = fractions[0]
    meta = entry["metadata"]
    unreduced = f"{meta['numerator']}/{meta['denominator']}"
    assert score(fractions, entry, tagged(unreduced)) == 0.1
    assert score(fractions, entry, tagged(f"{meta['simplified_numerator']}/{meta['simplified_denominator']}")) == 1.0

    arithmetic = datasets["basic_arithmetic"]
    entry = arithmetic[0]
    oracle = entry["answer"]
    # The default verifier pays len(oracle) / len(answer) when the oracle is inside the answer.
    assert score(arithmetic, entry, tagged(oracle + ".0")) == pytest.approx(len(oracle) / (len(oracle) + 2))

    calendar = datasets["calendar_arithmetic"]
    entry = calendar[6]
    assert entry["metadata"]["task"] == "count_days"
    oracle = int(entry["answer"])
    assert score(calendar, entry, tagged(str(oracle + 1))) == pytest.approx(math.exp(-5 / oracle))
    weekday = calendar[3]
    assert weekday["metadata"]["task"] == "weekday_offset"
    other_day = "Sunday" if weekday["answer"] != "Sunday" else "Monday"
    assert score(calendar, weekday, tagged(other_day)) == 0.1
    assert score(calendar, weekday, tagged(weekday["answer"].lower())) == 0.05  # right day, wrong case

    logic = datasets["propositional_logic"]
    entry = logic[0]
    variable = entry["metadata"]["variables"][0]
    assert score(logic, entry, tagged(f"({variable} ∨ ¬{variable})")) == 0.25  # a tautology follows, trivially
    premises = entry["metadata"]["premises"]
    assert max(score(logic, entry, tagged(premise)) for premise in premises) == 1.0  # restating a premise counts


def test_binary_matrix_as_python_list_gets_partial_credit(datasets: dict[str, Any]) -> None:
    dataset = datasets["binary_matrix"]
    entry = dataset[0]
    assert score(dataset, entry, tagged(str(entry["metadata"]["solution"]))) == 0.1


# --- hostile answers --------------------------------------------------------------------------

PROBE = "swarm_gdrive_test_probe"
PAYLOAD = f"__import__('sys').modules.__setitem__('{PROBE}', 1)"


def test_eval_payload_never_reaches_an_eval_verifier(datasets: dict[str, Any]) -> None:
    dataset = datasets["binary_matrix"]
    entry = dataset[0]
    try:
        dataset.score_answer(PAYLOAD, entry)
        assert PROBE in sys.modules  # the hazard: reasoning-gym's verifier runs the answer as code
        del sys.modules[PROBE]
        assert score(dataset, entry, tagged(PAYLOAD)) == 0.0
        assert PROBE not in sys.modules
    finally:
        sys.modules.pop(PROBE, None)


def test_is_safe_for_eval() -> None:
    assert is_safe_for_eval("1 0 1\n0 1 2")  # not Python: eval fails before running anything
    assert is_safe_for_eval("[[1, 0], [0, 1]]")
    assert is_safe_for_eval("['a', 'b']")
    assert is_safe_for_eval("")
    assert not is_safe_for_eval(PAYLOAD)
    assert not is_safe_for_eval("exit")
    assert not is_safe_for_eval("[c for c in 'ab' for d in 'cd']")
    assert is_safe_for_eval("[" * 5000 + "]" * 5000)  # too deep for the parser: eval raises SyntaxError too


def test_long_answer_to_a_slow_verifier_scores_zero_fast(datasets: dict[str, Any]) -> None:
    dataset = datasets["propositional_logic"]
    entry = dataset[0]
    variable = entry["metadata"]["premises"][1]  # 'P', a premise: any even number of negations of it follows
    assert len(variable) == 1
    short = "¬¬" * 60 + variable
    assert len(short) <= rewards.ANSWER_CHAR_LIMITS["propositional_logic"]
    assert score(dataset, entry, tagged(short)) == 1.0  # the verifier pays a padded restatement in full
    # This thread's CPU seconds: wall time on CI's loaded cores says nothing, and the process's counts other threads.
    started = time.thread_time()
    assert score(dataset, entry, tagged("¬¬" * 8000 + variable)) == 0.0  # 30 s in the verifier itself
    assert time.thread_time() - started < 0.5


class RecordingVerifier:
    def __init__(self, result: Any = 1.0) -> None:
        self.result = result
        self.calls: list[str | None] = []

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        self.calls.append(answer)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_unsafe_task_is_never_scored() -> None:
    verifier = RecordingVerifier()
    entry = {"question": "q", "answer": "1", "metadata": {"source_dataset": "countdown"}}
    with pytest.raises(ValueError, match="countdown"):
        score(verifier, entry, tagged("1"))
    assert verifier.calls == []


def test_verifier_that_raises_scores_zero_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    verifier = RecordingVerifier(RuntimeError("boom"))
    entry = {"question": "q", "answer": "1", "metadata": {"source_dataset": "chain_sum"}}
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.rewards"):
        assert score(verifier, entry, tagged("1"), format_weight=0.25) == 0.25
    assert verifier.calls == ["1"]
    assert "chain_sum" in caplog.text and "boom" in caplog.text


@pytest.mark.parametrize(
    ("result", "expected"), [(math.nan, 0.0), (math.inf, 0.0), (2.0, 1.0), (-1.0, 0.0), (0.3, 0.3)]
)
def test_verifier_result_is_clamped(result: float, expected: float) -> None:
    entry = {"question": "q", "answer": "1", "metadata": {"source_dataset": "chain_sum"}}
    assert verifier_score(RecordingVerifier(result), entry, "1") == expected


# --- audit of reasoning-gym's verifiers -------------------------------------------------------

#: Modules that call eval/exec/parse_expr only on data they generated, never on an answer
#: (audited against reasoning-gym 0.1.25); propositional_logic defines its own parse_expr.
AUDITED_TRUSTED = {"basic_arithmetic", "bitwise_arithmetic", "codeio", "number_sorting", "propositional_logic"}


def test_every_verifier_that_evaluates_text_is_screened_or_refused() -> None:
    """A tripwire for reasoning-gym upgrades: a new task whose module evaluates text must be audited."""
    dangerous = re.compile(r"\b(eval|exec|parse_expr|sympify)\(")
    flagged = set()
    for name, (dataset_cls, _config_cls) in DATASETS.items():
        if name != "composite" and dangerous.search(inspect.getsource(inspect.getmodule(dataset_cls))):
            flagged.add(name)
    known = rewards.LITERAL_ONLY_TASKS | rewards.UNSAFE_VERIFIER_TASKS | AUDITED_TRUSTED
    assert flagged - known == set()
    assert flagged >= rewards.LITERAL_ONLY_TASKS | rewards.UNSAFE_VERIFIER_TASKS
