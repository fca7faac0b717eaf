"""Question identity for the held-out split: normalisation per task, near-twin counts, question-space size.

Two questions are *twins* when their normalised texts (:func:`normalise_question`) are equal. The held-out set
of a task holds distinct normalised questions and training skips every twin of one (training/tasks.py), so a
question that differs from a held-out one only by spacing, case, operand order or redundant parentheses is
never trained on. What each task's normalisation covers:

- every task: Unicode NFC, case folded, whitespace runs collapsed, ends stripped;
- :data:`ARITHMETIC_TASKS` (chain_sum, basic_arithmetic): besides, each arithmetic expression of the text
  (integers and decimals with ``+ - * /`` and parentheses) is replaced by a canonical form: parsed (redundant
  parentheses vanish), chains of ``+`` and of ``*`` flattened and their operands sorted (both commutative
  and associative), ``-`` and ``/`` kept in order. ``4 + 3`` and ``3 + 4`` are twins; ``7 - 2`` and
  ``2 - 7`` are not; ``-( ( 4 + -9 ) )`` and ``-(-9 + 4)`` are.

A task's normalisation may only merge questions with the same answer (then a twin is a question the model could
answer from memory); it is conservative: over-merging only keeps more questions out of training.

The split's report (:func:`split_report`, logged by a worker at start): per task, how many held-out questions
have near-twins (another text, the same normalised question) among a scan of training indices, all of which
training skips; the size of the task's question space estimated from the same scan; and a warning when the
swarm's draws over MAX_ROUNDS exceed :data:`EXHAUST_FRACTION` of the training space (questions then repeat and
the training reward measures recall more than reasoning).
"""

from __future__ import annotations

import ast
import logging
import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: Tasks whose questions are arithmetic expressions, normalised for operand order and parentheses too.
ARITHMETIC_TASKS = frozenset({"chain_sum", "basic_arithmetic"})

#: A candidate expression: digits, spaces, ``+ - * /``, parentheses, and a dot only before a digit (so the
#: full stop of "Calculate 5 * 5." stays out: ``5.`` would parse as a float).
_EXPRESSION_RE = re.compile(r"(?:[\d\s+\-*/()]|\.(?=\d))+")
#: Longest expression parsed; a longer span is only whitespace-normalised (generated questions are far shorter).
_MAX_EXPRESSION = 2_000

#: Training indices a split report reads per task: 6 s for the paper's nine tasks on a loaded 2-core machine.
SCAN_INDICES = 2_000
#: Warn when a run's draws of a task exceed this fraction of its training space: with D draws from S questions
#: a share 1 - exp(-D/S) is seen, 39 % at D = S/2, and the rest of the draws are repeats.
EXHAUST_FRACTION = 0.5


class TaskBank(Protocol):
    """What the split's report needs of :class:`swarm_gdrive.training.tasks.TaskBank` (which imports this module)."""

    held_out: int
    specs: tuple[Any, ...]

    @property
    def tasks(self) -> tuple[str, ...]: ...

    def eval_questions(self, task: str, n: int, level: int = 0) -> list[Any]: ...

    def question(self, task: str, index: int, level: int | None = None) -> Any: ...

    def is_held_out(self, task: str, question: str, level: int = 0) -> bool: ...


def normalise_question(text: str, task: str | None = None) -> str:
    """A question's identity for the held-out rule: NFC, case folded, whitespace collapsed, and per ``task``
    its expressions in canonical form (:data:`ARITHMETIC_TASKS`)."""
    flat = " ".join(unicodedata.normalize("NFC", text).casefold().split())
    if task not in ARITHMETIC_TASKS:
        return flat
    return _EXPRESSION_RE.sub(_canonical_span, flat)


def _canonical_span(match: re.Match[str]) -> str:
    span = match.group(0)
    core = span.strip()
    if not core or len(core) > _MAX_EXPRESSION or not any(op in core for op in "+-*/"):
        return span
    try:
        tree = ast.parse(core, mode="eval").body
        canonical = _canonical(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return span
    lead = " " if span[:1].isspace() else ""
    tail = " " if span[-1:].isspace() else ""
    return f"{lead}{canonical}{tail}"


_COMMUTATIVE = {ast.Add: "+", ast.Mult: "*"}
_ORDERED = {ast.Sub: "-", ast.Div: "/"}


def _canonical(node: ast.expr) -> str:
    """Prefix form of an arithmetic AST: ``+(3,4)``, ``-(2,7)``, ``neg(9)``; ValueError for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return repr(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _canonical(node.operand)
        return f"neg({inner})" if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _COMMUTATIVE:
        operands = sorted(_canonical(n) for n in _flatten(node, type(node.op)))
        return f"{_COMMUTATIVE[type(node.op)]}({','.join(operands)})"
    if isinstance(node, ast.BinOp) and type(node.op) in _ORDERED:
        return f"{_ORDERED[type(node.op)]}({_canonical(node.left)},{_canonical(node.right)})"
    raise ValueError(f"not an arithmetic expression: {ast.dump(node)[:80]}")


def _flatten(node: ast.expr, op: type) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, op):
        return _flatten(node.left, op) + _flatten(node.right, op)
    return [node]


def estimate_space(draws: int, distinct: int) -> float:
    """The number S of equally likely questions for which ``draws`` uniform draws show ``distinct`` on average.

    Solves ``distinct = S (1 - (1 - 1/S) ** draws)`` by bisection; ``inf`` when no draw repeated (then S is
    likely above draws² / 2, the birthday bound). Questions are not equally likely (``3 + 4`` and ``4 + 3`` are
    one normalised question drawn twice as often), so this estimate is low: a cautious side for a warning.
    """
    if draws < 1 or not 0 < distinct <= draws:
        raise ValueError(f"estimate_space needs 0 < distinct <= draws, got draws={draws}, distinct={distinct}")
    if distinct == draws:
        return math.inf
    low, high = float(distinct), 2.0 * distinct
    while _expected_distinct(high, draws) < distinct:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _expected_distinct(mid, draws) < distinct else (low, mid)
    return (low + high) / 2


def _expected_distinct(space: float, draws: int) -> float:
    return space * -math.expm1(draws * math.log1p(-1 / space)) if space > 1 else 1.0


@dataclass(frozen=True)
class TaskSplit:
    """One task's held-out split as a worker reports it at start."""

    task: str
    held_out: int
    near_twins: int  # held-out questions with another text of the same normalised question among the scan
    crossing: int  # held-out questions whose normalised form a training draw of the scan has (0 unless a bug)
    scanned: int
    distinct: int  # normalised questions among the scanned training indices
    space: float  # estimated distinct normalised questions of the task (inf: too many to tell)
    draws: int  # the swarm's expected draws of this task over MAX_ROUNDS

    @property
    def exhausts(self) -> bool:
        """Whether the run's draws exceed :data:`EXHAUST_FRACTION` of the questions training may draw."""
        return self.draws > EXHAUST_FRACTION * max(self.space - self.held_out, 1.0)


def scan_split(bank: TaskBank, task: str, draws: int = 0, scan: int = SCAN_INDICES) -> TaskSplit:
    """Read ``scan`` training indices of ``task`` (level 0) and count its held-out set's twins among them."""
    held = bank.eval_questions(task, bank.held_out)
    held_keys = {normalise_question(q.question, task): q.question for q in held}
    scanned: list[str] = []
    for index in range(scan):
        try:
            scanned.append(bank.question(task, index, 0).question)
        except Exception as exc:  # noqa: BLE001 - a generator that fails on one index: the rest still count
            logger.debug("%s failed to generate index %d: %r", task, index, exc)
    keys = [normalise_question(text, task) for text in scanned]
    twins = {key for key, text in zip(keys, scanned, strict=True) if key in held_keys and text != held_keys[key]}
    trainable = {key for key, text in zip(keys, scanned, strict=True) if not bank.is_held_out(task, text)}
    distinct = len(set(keys))
    return TaskSplit(
        task=task,
        held_out=len(held),
        near_twins=len(twins),
        crossing=len(trainable & held_keys.keys()),
        scanned=len(scanned),
        distinct=distinct,
        space=estimate_space(len(scanned), distinct) if scanned else math.inf,
        draws=draws,
    )


def expected_draws(bank: TaskBank, workers: int, rounds: int, per_stage: int, stages: int) -> dict[str, int]:
    """Each task's share of the swarm's training draws: workers x rounds x I x stages x the task's weight share."""
    total = sum(spec.weight for spec in bank.specs)
    return {
        spec.name: round(max(workers, 1) * rounds * per_stage * stages * spec.weight / total) for spec in bank.specs
    }


def split_report(bank: TaskBank, draws: dict[str, int], scan: int = SCAN_INDICES) -> list[TaskSplit]:
    """Scan every task of ``bank``, log one line per task and a warning for each question space a run exhausts."""
    return log_splits([scan_split(bank, task, draws.get(task, 0), scan) for task in bank.tasks])


def log_splits(splits: list[TaskSplit]) -> list[TaskSplit]:
    """One INFO line per task's split, and a WARNING for each question space the run exhausts; returns ``splits``."""
    for s in splits:
        space = "too large to estimate" if math.isinf(s.space) else f"about {s.space:,.0f} distinct questions"
        logger.info(
            "held-out split of %s: %d questions, %d with near-twins (same question after normalisation, other text) "
            "among %d training indices, all kept out of training; %d held-out questions reachable by training; "
            "question space %s",
            s.task,
            s.held_out,
            s.near_twins,
            s.scanned,
            s.crossing,
            space,
        )
        if s.exhausts:
            logger.warning(
                "%s: the swarm draws about %d training questions of this task over MAX_ROUNDS, more than %.0f%% of "
                "the about %.0f it can draw (%d held out): questions will repeat and the training reward will "
                "measure recall more than reasoning; widen the task's question space in TASK_CONFIG (more digits or "
                "terms) or lower MAX_ROUNDS",
                s.task,
                s.draws,
                100 * EXHAUST_FRACTION,
                max(s.space - s.held_out, 1.0),
                s.held_out,
            )
    return splits


def twins_across(held: Iterable[str], training: Iterable[str], task: str) -> int:
    """How many of the ``held`` questions have a twin (equal normalised text) among ``training``."""
    keys = {normalise_question(t, task) for t in training}
    return sum(normalise_question(h, task) in keys for h in held)
