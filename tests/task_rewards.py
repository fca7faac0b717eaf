"""Reward functions in TRL's signature for the tests of TASK_SOURCE=datasets and REWARD_FUNCTIONS (docs/tasks.md).

Importable as ``task_rewards`` with tests/ on PYTHONPATH, as a node imports its own installed reward module.
"""

from __future__ import annotations

CALLS: list[dict] = []


def brevity(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """1.0 for a completion of at most 40 characters, falling linearly to 0.0 at 200."""
    CALLS.append({"prompts": prompts, "completions": completions, **columns})
    return [max(0.0, min(1.0, (200 - len(c)) / 160)) for c in completions]


def mentions_answer(prompts: list[str], completions: list[str], answer: list[str], **columns: list) -> list[float]:
    """1.0 when the reference answer's last line (GSM8K's '#### n') appears anywhere in the completion: reads a
    column of the dataset, as TRL passes them."""
    return [float(a.rpartition("####")[2].strip() in c) for a, c in zip(answer, completions, strict=True)]


def raises(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    raise KeyError("no column 'solution' in this dataset")


def wrong_length(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [1.0] * (len(completions) + 1)


def not_finite(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [float("nan")] * len(completions)


def odd_length_fails(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Raises on a group with a completion of odd length: passes the start probe (lengths 18 and 0), then fails on
    some groups of a round, which must go on (the term scores 0.0 for such a group, with a WARNING naming it)."""
    if any(len(c) % 2 for c in completions):
        raise ValueError("a completion of odd length")
    return [0.0] * len(completions)
