"""Reward fidelity (issue 31 part 6): lenient extraction scores the answer a completion states, text after it never
zeroes it, listing numbers is not rewarded, and partial credit is an explicit option (PARTIAL_CREDIT)."""

from __future__ import annotations

import re

import pytest
import reasoning_gym

from swarm_gdrive.training import rewards
from swarm_gdrive.training.rewards import extract_answer, lenient_answer, score
from swarm_gdrive.training.tasks import TaskBank, parse_task_mix


@pytest.fixture(scope="module")
def chain_sum():
    dataset = reasoning_gym.create_dataset("chain_sum", size=50, seed=3, min_terms=2, max_terms=2)
    entry = next(dataset[i] for i in range(50) if len(dataset[i]["answer"]) >= 2 and dataset[i]["answer"] != "10")
    return dataset, entry


@pytest.mark.parametrize(
    "template",
    [
        "<answer>{a}\nThe sum of 4 and 3 is 7.",  # seen: "4 * 5 = 20\nApostrophe: 4, 5 = 5, 2" scored "2"
        "<answer> {a}. Let me check: 2 + 2 = 4",
        "<answer>{a}, and 100 more words with 3 numbers 5 6",
        "<answer> 9 - 6 = {a}\n\nThis is a classic example, 1 of 2",
        "The answer is {a}. Checking with 12 + 1 = 13 and 7.",
        "<answer>\n\nThe answer is: {a} (not 3, not 999)",
    ],
)
def test_a_correct_answer_followed_by_other_numbers_scores_correct(chain_sum, template):
    dataset, entry = chain_sum
    completion = template.format(a=entry["answer"])
    assert extract_answer(completion, "lenient") == entry["answer"]
    assert score(dataset, entry, completion, extraction="lenient") == 1.0


def spray_reward(dataset, entry, extract, separator: str, k: int = 10) -> float:
    """Mean reward of a k-number spray over the k positions the right answer can take in it."""
    answer = int(entry["answer"])
    others = [n for n in range(answer + 1, answer + 200) if str(answer) not in str(n)][: k - 1]
    total = 0.0
    for position in range(k):
        numbers = [*others[:position], answer, *others[position:]]
        completion = "<answer>" + separator.join(str(n) for n in numbers)
        total += rewards.verifier_score(dataset, entry, extract(completion))
    return total / k


@pytest.mark.parametrize("separator", [" ", ", ", "\n", " or ", " = ", "; the answer is "])
def test_spraying_numbers_is_not_rewarded(chain_sum, separator):
    """One candidate per completion, chosen by position: a spray of k numbers earns 1/k on average, a single guess's
    chance; the gameable rule "any number equals the answer" would earn 1 (checked here, so the test can fail)."""
    dataset, entry = chain_sum
    assert spray_reward(dataset, entry, lambda c: extract_answer(c, "lenient"), separator) == pytest.approx(0.1)

    def any_number_equals(completion: str) -> str | None:
        numbers = re.findall(r"-?\d+", completion)
        return entry["answer"] if entry["answer"] in numbers else None

    assert spray_reward(dataset, entry, any_number_equals, separator) == 1.0


def test_partial_credit_off_gives_zero_for_a_partial_answer():
    bank = TaskBank(parse_task_mix("basic_arithmetic", None), 5)
    dataset = bank._datasets["basic_arithmetic"]  # noqa: SLF001 - the verifier under test
    questions = (bank.question("basic_arithmetic", i) for i in range(200))
    entry = next(q.entry for q in questions if len(q.entry["answer"]) == 1)
    padded = f"<answer>1{entry['answer']}</answer>"  # "12" against "2": reasoning-gym's substring credit
    assert score(dataset, entry, padded) == 0.5  # PARTIAL_CREDIT=true, the default: the verifier's 0.5
    assert score(dataset, entry, padded, partial_credit=False) == 0.0
    assert score(dataset, entry, f"<answer>{entry['answer']}</answer>", partial_credit=False) == 1.0
    assert bank.score_group(entry, [padded], partial_credit=False) == (0.0,)
    assert score(dataset, entry, padded, format_weight=0.5, partial_credit=False) == 0.5  # the format term stays
    # the correctness term of a node's reward object (training/reward_terms.py) reads it from the bank
    strict_bank = TaskBank(parse_task_mix("basic_arithmetic", None), 5, partial_credit=False)
    assert bank.correctness(entry, padded) == 0.5 and strict_bank.correctness(entry, padded) == 0.0


def test_partial_credit_is_part_of_the_experiment_fingerprint(tmp_path):
    from swarm_gdrive.config import from_env

    (tmp_path / "shared").mkdir()
    env = {"GDRIVE_PATH": str(tmp_path / "shared"), "SWARM_LOCAL_DIR": str(tmp_path / "local")}
    on, off = from_env(env), from_env({**env, "PARTIAL_CREDIT": "false"})
    assert on.partial_credit is True and off.partial_credit is False
    assert on.fingerprint() != off.fingerprint()


@pytest.mark.parametrize(
    ("completion", "stated"),
    [  # real SmolLM2-135M completions of the demo (bench/results/extraction-rollouts.json)
        ("<answer>4 * 5 = 20\nApostrophe: 4, 5 = 5, 2", "20"),  # the last number, "2", was scored before
        ("<answer>Step 1: Calculate: 9 + 0 = 9\nStep 2: Add 0 to both", "9"),
        ("<answer>6 + 0 = 6\n\nJustification: 6 is the sum of 0, which is the", "6"),
        ("<answer>The answer to the question is -7 * 5 = -35.", "-35"),
        ("<answer>\nNote: The answer is 7, which is the result of the sum of 0 and 7.\n", "7"),
        ("<answer> 1 + 2 = \n1 + 2 = 3\n\nThis is the answer to the original problem", "3"),
        ("<answer> 5 - 0 = 4\n\nThis is the final answer to the arithmetic problem where 5 is subtract", "4"),
        ("<answer> 9 - 0 =", None),  # an echo of the question states no answer (the last number scored it right)
        ("<answer>3.5 is the result", "3.5"),
    ],
)
def test_lenient_extraction_reads_the_stated_answer_of_real_completions(completion, stated):
    assert lenient_answer(completion) == stated


@pytest.mark.parametrize(
    "hostile",
    ["= " * 20_000, "answer is 5 = " * 3_000, "1 = " * 10_000 + "x", "answer: 1 " * 5_000, "1/" * 20_000],
)
def test_lenient_extraction_of_a_hostile_completion_is_fast(hostile):
    """Peers' completions are hostile: the rule reads each statement once (linear time). Measured in the calling
    thread's CPU seconds, not wall time (CI's loaded cores once stretched 10 ms of work to 1.3 s) nor the process's
    (which counts its other threads: 0.52 s once on CI's cores): the rule takes 5-20 ms on these inputs, a quadratic
    one 1.7 s of CPU on the third (``(?:\\d+ = )+y`` measured on this machine)."""
    import time

    started = time.thread_time()
    lenient_answer("<answer>" + hostile)
    assert time.thread_time() - started < 0.5


@pytest.mark.parametrize(
    ("completion", "stated"),
    [
        ("The answer is 1,200 dollars.", "1200"),  # GSM8K's thousands: "1" was scored before
        ("So 3 * 400 = 1,200", "1200"),
        ("The answer is 1,200, which is right", "1200"),
        ("= 1,000,000", "1000000"),
        ("3, 4, 5", "3"),  # a list, not a grouped number
        ("1,2", "1"),
        ("total 1,2345", "1"),
    ],
)
def test_lenient_extraction_reads_thousands_separators_whole(completion: str, stated: str) -> None:
    assert extract_answer(completion, "lenient") == stated
