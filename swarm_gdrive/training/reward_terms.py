"""The reward: one object of weighted terms, built once per node, and reward functions in TRL's signature.

For a group's completions ``c_1..c_G`` of one question (``entry``, produced on this node)::

    reward(c_i) = correctness(entry, c_i) + FORMAT_REWARD_WEIGHT * format(c_i) + sum_k w_k * f_k(...)[i]

where ``correctness`` is the task provider's check (:meth:`~swarm_gdrive.training.task.TaskProvider.correctness`),
``format`` is :func:`~swarm_gdrive.training.rewards.format_reward`, and each ``f_k`` is a REWARD_FUNCTIONS
function ``module:function[:w_k]`` called as TRL's GRPOTrainer calls its ``reward_funcs``::

    f_k(prompts=[question] * G, completions=[c_1, ..., c_G], **{column: [value] * G}) -> list of G floats

(``prompts`` and ``completions`` are plain strings; the columns are the provider's :meth:`columns` of the entry).
A function is imported from this node's own installed code, never from a module file inside GDRIVE_PATH (refused
before it is imported), so every node that re-scores a peer's group runs its own copy of the same named functions
(their names are part of the experiment's fingerprint, :mod:`swarm_gdrive.config`).

A function that raises, or returns other than G finite numbers, raises :class:`RewardFunctionError` naming it: at
start, a probe call refuses the worker (:meth:`Reward.probe`); during a round, the group's term is 0.0 for every
completion (no advantage from it) and a WARNING names the function, so that one bad question does not stop the swarm.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from swarm_gdrive.storage.settings import inside_shared_folder
from swarm_gdrive.training import rewards
from swarm_gdrive.training.task import TaskProvider

logger = logging.getLogger(__name__)

#: A term's values for one group: (entry, completions) -> one float per completion.
TermFn = Callable[[dict[str, Any], Sequence[str]], Sequence[float]]
#: Keyword names TRL's reward functions receive besides the dataset's columns; a column of that name is not passed.
RESERVED_KEYWORDS = ("prompts", "completions")
#: The completions of :meth:`Reward.probe`'s call: an answer in the tag, and an empty completion.
PROBE_COMPLETIONS = ("<answer>0</answer>", "")


class RewardFunctionError(ValueError):
    """A REWARD_FUNCTIONS function that cannot be used: the message names it and says what it did."""


@dataclass(frozen=True)
class Term:
    """One weighted term of the reward; ``user``: a REWARD_FUNCTIONS function (its failures are contained)."""

    name: str
    weight: float
    values: TermFn
    user: bool = False


def parse_reward_functions(text: str | None) -> list[tuple[str, str, float]]:
    """REWARD_FUNCTIONS ``module:function[:weight],...`` into (module, function, weight); ValueError names it."""
    if text is None or not text.strip():
        return []
    out: list[tuple[str, str, float]] = []
    for item in text.split(","):
        parts = [p.strip() for p in item.strip().split(":")]
        if len(parts) not in (2, 3) or not all(parts[:2]):
            raise ValueError(
                f"REWARD_FUNCTIONS: {item.strip()!r} is not module:function[:weight]; write e.g. "
                "'my_rewards:length_penalty:0.1,my_rewards:has_units'"
            )
        weight = 1.0
        if len(parts) == 3:
            try:
                weight = float(parts[2])
            except ValueError:
                weight = math.nan
            if not math.isfinite(weight):
                raise ValueError(f"REWARD_FUNCTIONS: weight {parts[2]!r} of {parts[0]}:{parts[1]} is not a number")
        if any((m, f) == (parts[0], parts[1]) for m, f, _ in out):
            raise ValueError(f"REWARD_FUNCTIONS: {parts[0]}:{parts[1]} appears twice; list it once with its weight")
        out.append((parts[0], parts[1], weight))
    return out


def load_reward_function(module_name: str, function: str, gdrive_path: str) -> Callable[..., Any]:
    """``module_name.function`` from this node's installed code; ValueError when it is not found, not callable,
    or its module (or a package above it) lives inside GDRIVE_PATH, checked before anything there is imported."""
    label = f"{module_name}:{function}"
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        try:
            spec = importlib.util.find_spec(name)  # imports the parents, each checked at the step before
        except (ImportError, ValueError) as exc:
            raise ValueError(f"REWARD_FUNCTIONS: {label}: module {name!r} cannot be found ({exc})") from None
        if spec is None:
            raise ValueError(
                f"REWARD_FUNCTIONS: {label}: no module {name!r} on this node's path; install it (pip install -e) "
                "or put its folder on PYTHONPATH"
            )
        places = [spec.origin] if spec.origin and spec.has_location else []
        places += list(spec.submodule_search_locations or [])
        for place in places:
            if inside_shared_folder(place, gdrive_path):
                raise ValueError(
                    f"REWARD_FUNCTIONS: {label}: {place} is inside the shared folder GDRIVE_PATH={gdrive_path!r}, "
                    "where every participant can write: a node never runs code from there. Install the module on "
                    "each node (its own copy) instead"
                )
    module = importlib.import_module(module_name)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"REWARD_FUNCTIONS: {label}: module {module_name!r} has no function {function!r}")
    return fn


def call_reward_function(
    name: str, fn: Callable[..., Any], question: str, completions: Sequence[str], columns: dict[str, Any]
) -> list[float]:
    """``fn``'s values for one group in TRL's signature, checked: G finite numbers, or RewardFunctionError."""
    n = len(completions)
    kwargs = {k: [v] * n for k, v in columns.items() if k not in RESERVED_KEYWORDS}
    try:
        raw = fn(prompts=[question] * n, completions=list(completions), **kwargs)
    except Exception as exc:
        raise RewardFunctionError(f"reward function {name} raised {type(exc).__name__}: {exc}") from exc
    try:
        values = [float(v) for v in raw]
    except (TypeError, ValueError):
        raise RewardFunctionError(
            f"reward function {name} returned {type(raw).__name__} {str(raw)[:80]!r}, not a list of {n} numbers"
        ) from None
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name} returned {len(values)} values for {n} completions (one per completion wanted)"
        )
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise RewardFunctionError(f"reward function {name} returned non-finite values {bad[:3]}")
    return values


class Reward:
    """The weighted terms of a node's reward (see the module's formula), built once by :func:`build_reward`."""

    def __init__(self, task: TaskProvider, terms: Sequence[Term]) -> None:
        self.task = task
        self.terms = tuple(terms)

    @property
    def names(self) -> list[str]:
        """``name:weight`` of every term, in order."""
        return [f"{t.name}:{t.weight:g}" for t in self.terms]

    def score(self, entry: dict[str, Any], completions: Sequence[str]) -> tuple[float, ...]:
        """One reward per completion of a group, against this node's own ``entry`` (deterministic)."""
        totals = [0.0] * len(completions)
        for term in self.terms:
            try:
                values = term.values(entry, completions)
            except RewardFunctionError as exc:
                logger.warning("%s; this group's %s term scores 0.0", exc, term.name)
                continue
            totals = [t + term.weight * v for t, v in zip(totals, values, strict=True)]
        return tuple(totals)

    def probe(self, entry: dict[str, Any]) -> None:
        """Call every REWARD_FUNCTIONS term once on :data:`PROBE_COMPLETIONS`; RewardFunctionError names the first
        that fails (a worker refuses to start with it)."""
        for term in self.terms:
            if term.user:
                term.values(entry, list(PROBE_COMPLETIONS))


def build_reward(task: TaskProvider, format_weight: float, reward_functions: str | None, gdrive_path: str) -> Reward:
    """The reward from the settings: correctness (weight 1), the format term when FORMAT_REWARD_WEIGHT > 0, then each
    REWARD_FUNCTIONS function with its weight."""
    terms = [Term("correctness", 1.0, lambda entry, cs: [task.correctness(entry, c) for c in cs])]
    if format_weight:
        terms.append(Term("format", format_weight, lambda entry, cs: [rewards.format_reward(c) for c in cs]))
    for module_name, function, weight in parse_reward_functions(reward_functions):
        label = f"{module_name}:{function}"
        fn = load_reward_function(module_name, function, gdrive_path)
        terms.append(Term(label, weight, _user_term(label, fn, task), user=True))
    return Reward(task, terms)


def _user_term(label: str, fn: Callable[..., Any], task: TaskProvider) -> TermFn:
    def values(entry: dict[str, Any], completions: Sequence[str]) -> list[float]:
        return call_reward_function(label, fn, str(entry.get("question", "")), completions, task.columns(entry))

    return values
