"""Answer extraction and scoring with a reasoning-gym task's own verifier (pure).

The reward of a completion is the verifier's score of its extracted answer (its partial credit kept, or
with PARTIAL_CREDIT=false rounded down to 0 unless full) plus an optional format bonus::

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
#: A number-like span: integer (thousands grouped by commas too: "1,200", never "3, 4" or "1,2"), decimal or
#: fraction, with its sign; :func:`_plain` drops the grouping commas.
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:[./]\d+)?")
#: Where an answer statement ends: a line break, or ".", "!" or "?" before a space (not the dot of "3.5").
_SENTENCE_END_RE = re.compile(r"\n|(?<=[.!?])\s")
#: What a result follows in a statement: "=" or "equals" ("is" is not one: "-2 is multiplied by 0, so ...").
_RESULT_MARKER_RE = re.compile(r"=|\bequals\b", re.IGNORECASE)
#: An explicit answer cue with a number right after it, any case: "answer", up to 40 characters without a digit, full
#: stop or line break, then "is", "equals", ":" or "=", then only spaces, quotes, "*" or "$" before the number: "The
#: answer is 13", "answer: 13", "The answer to this question is 8"; not "the answer is calculated to 1 decimal place".
_ANSWER_CUE_RE = re.compile(r"\banswer\b[^\d.\n]{0,40}?(?:\bis\b|\bequals\b|:|=)[\s\"'*$]*(?=[-+]?\d)", re.IGNORECASE)


def lenient_answer(completion: str) -> str | None:
    """One number a completion without an answer pair states as its answer, chosen by position alone.

    The text read is what follows the last ``<answer>`` (the model was answering there: ANSWER_PREFIX), else the
    whole completion; it is cut into statements (sentences and lines, :data:`_SENTENCE_END_RE`). A statement's
    answer is the first number after its last result marker (``=``, ``equals``) that has one after it
    (``9 - 6 = 3``, ``2 = 2 + 1 = 3``, ``-9 + 5, which equals -4``), else its first number (``12, because``); a
    statement that ends in a marker with no number after it (``7 + 5 =``, an unfinished equation) states nothing.
    The answer is that of the statement after the first explicit cue followed by a number (``answer is 7``,
    ``answer: 7``, ``the answer to this question is 7``; the number right after the cue if that statement states
    none), else that of the first statement that states one.

    Text after the stated answer (more lines, other numbers, an explanation) never changes it, which the last
    number of the completion, the rule before issue 31, did: ``4 * 5 = 20\nApostrophe: 4, 5 = 5, 2`` scored
    "2". It cannot be gamed by listing numbers: exactly one candidate is passed to the verifier, picked by its
    position and never by comparing it with the reference answer, so a completion that sprays numbers (``1 2 3
    ... 99``) is scored on one of them, as if it had guessed that one; "any number equals the answer" would
    instead reward the spray with certainty.
    """
    cut = completion.rfind(ANSWER_OPEN)
    text = completion[cut + len(ANSWER_OPEN) :] if cut >= 0 else completion
    # Linear time on hostile text (peers' completions): one cue, each statement read once.
    cue = _ANSWER_CUE_RE.search(text)
    if cue is not None:
        end = _SENTENCE_END_RE.search(text, cue.end())
        stated = _stated(text[cue.end() : end.start() if end else len(text)])
        if stated is not None:
            return stated
        right_after = _NUMBER_RE.match(text, cue.end())  # the cue's lookahead guarantees one
        return _plain(right_after.group(0)) if right_after else None
    for statement in _SENTENCE_END_RE.split(text):
        stated = _stated(statement)
        if stated is not None:
            return stated
    return None


def _plain(number: str) -> str:
    """A number as the verifiers read it: "1,200" is 1200."""
    return number.replace(",", "")


def _stated(statement: str) -> str | None:
    """The number one statement gives as its result (see :func:`lenient_answer`), or None."""
    numbers = list(_NUMBER_RE.finditer(statement))
    if not numbers:
        return None
    last_start = numbers[-1].start()
    markers = [m.end() for m in _RESULT_MARKER_RE.finditer(statement)]
    before_a_number = [end for end in markers if end <= last_start]
    if before_a_number:
        return _plain(next(n.group(0) for n in numbers if n.start() >= before_a_number[-1]))
    if markers and not statement[markers[-1] :].strip(" \t.,;:!?"):
        return None  # "7 + 5 =": an unfinished equation states no result
    return _plain(numbers[0].group(0))


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

    ``mode="lenient"`` falls back, when there is no answer pair, to the one number the completion states as its
    answer (:func:`lenient_answer`): small models often state the right number without the tag (see the
    learning-signal table in docs/training.md). ``strict`` is the default, for replication of the SAPO paper.
    """
    check_extraction(mode)
    matches = _ANSWER_RE.findall(completion)
    if matches:
        return matches[-1].strip()
    if mode == "lenient":
        return lenient_answer(completion)
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
    task = task_of(entry)
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
    dataset: Verifier,
    entry: dict[str, Any],
    completion: str,
    format_weight: float = 0.0,
    extraction: str = "strict",
    partial_credit: bool = True,
) -> float:
    """Reward of one completion: ``correctness(extract_answer(c)) + format_weight * format_reward(c)``.

    ``partial_credit`` (PARTIAL_CREDIT): True keeps the verifier's score in [0, 1] (the paper's: 0.1 for an
    unreduced fraction, but also ``len(answer) / len(given)`` when the answer is a substring of what was given,
    0.5 for "12" against "2"); False gives 1.0 for a full score and 0.0 for anything less. ``entry`` must be
    generated locally; nothing the completion's author claimed is read.
    """
    if not math.isfinite(format_weight):
        raise ValueError(f"format_weight must be a finite number, got {format_weight!r}")
    correctness = credit(verifier_score(dataset, entry, extract_answer(completion, extraction)), partial_credit)
    if format_weight == 0.0:
        return correctness
    return correctness + format_weight * format_reward(completion)


def check_extraction(mode: str) -> None:
    """ValueError unless ``mode`` is one of :data:`EXTRACTION_MODES` (ANSWER_EXTRACTION)."""
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"extraction mode {mode!r} is not one of {EXTRACTION_MODES}")


def credit(correctness: float, partial_credit: bool) -> float:
    """A verifier's score as the correctness term: kept (PARTIAL_CREDIT=true), or 1.0 for a full score and 0.0 for
    anything less."""
    return correctness if partial_credit else float(correctness >= 1.0)


def task_of(entry: dict[str, Any]) -> str | None:
    """The reasoning-gym task that generated ``entry`` (its metadata's ``source_dataset``); None when not said."""
    metadata = entry.get("metadata")
    return metadata.get("source_dataset") if isinstance(metadata, dict) else None
