"""Answer extraction and scoring with a reasoning-gym task's own verifier (pure).

The reward of a completion is the verifier's score of its extracted answer, partial credit
kept, plus an optional format bonus::

    reward = dataset.score_answer(extract_answer(completion), entry) + format_weight * format_reward(completion)

``entry`` must be one that this node generated itself (see :meth:`swarm_gdrive.training.tasks.TaskBank.regenerate`);
the completion may come from another node and is treated as hostile: some reasoning-gym
verifiers ``eval`` the answer text, so those answers are screened first (:data:`LITERAL_ONLY_TASKS`),
tasks whose verifiers cannot be screened are refused (:data:`UNSAFE_VERIFIER_TASKS`), and
answers too long for a slow verifier score 0.0 (:data:`ANSWER_CHAR_LIMITS`).
"""

from __future__ import annotations

import ast
import logging
import math
import re
from typing import Any, Protocol

logger = logging.getLogger(__name__)

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

# An opening tag, then text that contains no further opening tag, then a closing tag: in
# "<answer><answer>x</answer></answer>" the pair found is the inner one. Linear time: each
# match attempt stops at the next "<answer>".
_ANSWER_RE = re.compile(f"{ANSWER_OPEN}((?:(?!{ANSWER_OPEN}).)*?){ANSWER_CLOSE}", re.DOTALL)

#: Tasks whose verifier calls ``eval(answer)`` to read a Python list (reasoning-gym 0.1.25:
#: binary_matrix.py, spiral_matrix.py, string_insertion.py, n_queens.py). An answer reaches them
#: only if it is not Python at all (then their ``eval`` fails before running anything) or is a
#: pure literal (``ast.literal_eval`` accepts it, so ``eval`` runs no code); otherwise it scores 0.0.
LITERAL_ONLY_TASKS = frozenset({"binary_matrix", "spiral_matrix", "string_insertion", "n_queens"})

#: Tasks whose verifier passes answer text to ``sympy.parse_expr``, which ``eval``s it after a
#: rewrite, so no syntactic screen makes it safe (``exit()``, ``input()``, ``9**9**9``). A swarm
#: scores other nodes' completions, so these tasks are not allowed (reasoning-gym 0.1.25).
UNSAFE_VERIFIER_TASKS = frozenset(
    {"countdown", "intermediate_integration", "polynomial_multiplication", "puzzle24", "simple_integration"}
)

#: Longest answer passed to a task's verifier; a longer one scores 0.0. propositional_logic's
#: parser is quadratic or worse: a 16,000-character answer took 30 s, 256 characters under 60 ms,
#: while its longest valid conclusion is under 100 characters even at high complexity.
#: No other task's verifier took over 50 ms on 16,000-character answers (reasoning-gym 0.1.25).
ANSWER_CHAR_LIMITS = {"propositional_logic": 256}


class Verifier(Protocol):
    """What :func:`score` needs of a dataset: reasoning-gym's ``ProceduralDataset.score_answer``."""

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float: ...


EXTRACTION_MODES = ("strict", "lenient")
#: The last number-like span (integer, decimal or fraction) of a completion without an answer tag.
_LAST_NUMBER_RE = re.compile(r"[-+]?\d+(?:[./]\d+)?")


def extract_answer(completion: str, mode: str = "strict") -> str | None:
    """The stripped content of the last ``<answer>…</answer>`` pair, or None if there is none.

    Differences from ``reasoning_gym.utils.extract_answer`` (same otherwise: last pair wins,
    case-sensitive tags, whitespace stripped): a pair never spans another opening tag, so
    ``<answer><answer>x</answer></answer>`` gives ``"x"`` where reasoning-gym gives ``"<answer>x"``.

    A final ``<answer>`` that is never closed does not count. A completion cut at the length
    limit can end mid-answer (``<answer>12`` of ``123``) and the text alone cannot tell a cut
    from a finished answer; the same rule must hold for peers' completions, which arrive
    without a stop reason. A trainer that opens the assistant turn with ``<answer>`` must
    score that prefix plus the completion.

    ``mode="lenient"`` falls back, when there is no answer pair, to the last number-like span
    (``-12``, ``3.5``, ``7/9``) of the completion: small models often state the right number
    without the tag (see the learning-signal table in docs/training.md). ``strict`` is the default, for
    replication of the SAPO paper.
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"extraction mode {mode!r} is not one of {EXTRACTION_MODES}")
    matches = _ANSWER_RE.findall(completion)
    if matches:
        return matches[-1].strip()
    if mode == "lenient":
        numbers = _LAST_NUMBER_RE.findall(completion)
        return numbers[-1] if numbers else None
    return None


def format_reward(completion: str) -> float:
    """1.0 when the completion has an ``<answer>…</answer>`` pair whose content is not blank, else 0.0.

    Exactly: :func:`extract_answer` returns a non-empty string. Text before and after the
    pair is allowed and no ``<think>`` block is required.
    """
    answer = extract_answer(completion)
    return 1.0 if answer else 0.0


def is_safe_for_eval(answer: str) -> bool:
    """True when ``eval(answer)`` cannot run code: the text is not Python, or is a pure literal."""
    try:
        tree = ast.parse(answer, mode="eval")
    except (SyntaxError, ValueError):
        return True  # eval compiles with the same parser, so it raises before running anything
    except (MemoryError, RecursionError):
        return False
    try:
        ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def verifier_score(dataset: Verifier, entry: dict[str, Any], answer: str | None) -> float:
    """The task verifier's score of ``answer`` in [0, 1]; 0.0 for None, a screened answer or a verifier error."""
    task = _task_of(entry)
    if task in UNSAFE_VERIFIER_TASKS:
        raise ValueError(f"task {task!r} has a verifier that evaluates answer text as code; it cannot be scored")
    if answer is None or len(answer) > ANSWER_CHAR_LIMITS.get(task, len(answer)):
        return 0.0
    if task in LITERAL_ONLY_TASKS and not is_safe_for_eval(answer):
        return 0.0
    try:
        raw = dataset.score_answer(answer, entry)
        value = float(raw)
    except Exception as exc:  # a verifier bug must not stop a worker; the completion just earns nothing
        logger.warning("verifier of %s raised %r on answer %.80r; scored 0.0", task, exc, answer)
        return 0.0
    if not math.isfinite(value):
        logger.warning("verifier of %s returned %r for answer %.80r; scored 0.0", task, raw, answer)
        return 0.0
    return min(1.0, max(0.0, value))


def score(
    dataset: Verifier, entry: dict[str, Any], completion: str, format_weight: float = 0.0, extraction: str = "strict"
) -> float:
    """Reward of one completion: ``verifier_score(extract_answer(c)) + format_weight * format_reward(c)``.

    The verifier's partial credit is kept (e.g. 0.1 for an unreduced fraction). ``entry`` must be
    generated locally; nothing the completion's author claimed is read.
    """
    if not math.isfinite(format_weight):
        raise ValueError(f"format_weight must be a finite number, got {format_weight!r}")
    correctness = verifier_score(dataset, entry, extract_answer(completion, extraction))
    if format_weight == 0.0:
        return correctness
    return correctness + format_weight * format_reward(completion)


def _task_of(entry: dict[str, Any]) -> str | None:
    metadata = entry.get("metadata")
    return metadata.get("source_dataset") if isinstance(metadata, dict) else None
