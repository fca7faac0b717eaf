"""reasoning-gym tasks: the task mix, drawing questions, regenerating peers' questions, prompts.

:class:`TaskBank` is the reasoning-gym provider of :class:`swarm_gdrive.training.task.TaskProvider`.

A node draws questions from a :class:`TaskBank`: one procedural reasoning-gym dataset per task,
all built with the experiment's dataset seed, so that a (task, config, seed, index)
:class:`~swarm_gdrive.protocol.records.Provenance` names one question on every node. Which indices a node
draws is decided by its own seeded ``random.Random`` (:func:`question_rng`), so nodes draw
different questions and a restarted node draws the same ones.

Another node's rollouts are scored only against an entry regenerated here from the
provenance, and only if the provenance names a task, config and seed of this bank and the
regenerated question text equals the group's (:meth:`TaskBank.regenerate`).

Held out means held out by content: the evaluation set of a task is the first EVAL_SAMPLES
distinct questions (normalised per task: case, spacing, and for arithmetic operand order and parentheses,
:func:`~swarm_gdrive.training.twins.normalise_question`) read down from the top of its index range, the same on
every node. Training draws skip any question whose normalised text is in that set (its near-twins too), and a
peer's group with such a question is rejected, whatever its index: on small question spaces (easy chain_sum has
200 question texts, 155 questions once normalised) the same text recurs at many indices.

Measured (reasoning-gym 0.1.25, 2-core CPU): ``import reasoning_gym`` 0.6-0.8 s (then this
module 0.07 s); creating each paper task's dataset at ``DATASET_SIZE`` under 1 ms (0.9 ms for
all nine); one entry 0.01-0.33 ms (bf the slowest); ``parse_task_mix`` plus ``TaskBank`` of the
nine, entry 0 of each included, about 5 ms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import reasoning_gym
from pydantic import ValidationError
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import SYSTEM_PROMPTS

from swarm_gdrive.protocol.records import Provenance, RolloutGroup
from swarm_gdrive.protocol.sapo import rng_for
from swarm_gdrive.training import rewards
from swarm_gdrive.training.twins import normalise_question

logger = logging.getLogger(__name__)

#: The nine reasoning-gym tasks of the SAPO paper (arXiv 2509.08721, section 4), drawn with equal weight.
PAPER_TASKS = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

#: Virtual size of every dataset: the range of indices drawn. reasoning-gym's procedural datasets
#: build ``ds[i]`` on demand from ``Random(seed + i)``, so creation does not depend on the size.
DATASET_SIZE = 1_000_000

#: Tasks whose creation does depend on the size: acre precomputes every question (213 s at
#: 1,000,000, 0.12 s at 500) and word_ladder refuses more than 20,000.
SIZE_OVERRIDES = {"acre": 2_000, "word_ladder": 20_000}

#: Tasks whose questions depend on Python's per-process hash seed (measured with reasoning-gym
#: 0.1.25 under different PYTHONHASHSEED values): peers regenerate a different question and drop
#: the group unless every node runs with the same PYTHONHASHSEED. None of the paper tasks.
HASH_SEED_DEPENDENT_TASKS = frozenset(
    {"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"}
)

#: Config keys the bank sets itself.
_RESERVED_KEYS = ("seed", "size")
#: How many indices :meth:`TaskBank.draw` tries before giving up on a generator that keeps failing.
_DRAW_ATTEMPTS = 10
#: How many held-out questions in a row a draw skips before it reports the training space as exhausted.
_HELD_OUT_SKIPS = 1_000
#: EVAL_SAMPLES's default: the held-out questions per task a :class:`TaskBank` keeps out of training.
DEFAULT_HELD_OUT = 16
_LIST_TASKS_HINT = (
    'list valid names with: python -c "import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))"'
)


@dataclass(frozen=True)
class TaskSpec:
    """One task of the mix: a reasoning-gym dataset name, its draw weight and its config."""

    name: str
    weight: float
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Question:
    """A drawn question: its task, text, the full reasoning-gym entry and its provenance."""

    task: str
    question: str
    entry: dict[str, Any]
    provenance: Provenance


def dataset_size(name: str) -> int:
    """The size a task's dataset is built with (:data:`DATASET_SIZE` unless overridden)."""
    return SIZE_OVERRIDES.get(name, DATASET_SIZE)


#: The top of each dataset's index range is where the held-out set is read from: training never
#: draws an index there and a peer's group from there is dropped. The range alone does not keep
#: the sets apart (a question's text recurs at other indices): the content rule does.
HELD_OUT_MAX = 10_000
DIFFICULTIES = ("paper", "easy")


def held_out_size(name: str) -> int:
    """How many of a task's top indices are reserved for evaluation (scanned for distinct questions)."""
    return min(HELD_OUT_MAX, dataset_size(name) // 10)


class QuestionSpaceTooSmall(ValueError):
    """A task's settings give too few distinct questions to hold out EVAL_SAMPLES of them."""


def training_limit(name: str) -> int:
    """Training draws indices in ``[0, training_limit)``; evaluation uses the indices above."""
    return dataset_size(name) - held_out_size(name)


def curriculum_levels(name: str) -> list[dict[str, Any]]:
    """The config of each difficulty level of a task's reasoning-gym curriculum, easiest first.

    Level g sets every curriculum attribute to its level min(g, last); only the attribute fields
    appear in the dicts. A task without a curriculum has one level, ``{}`` (its defaults).
    """
    if not reasoning_gym.factory.has_curriculum(name):
        return [{}]
    curriculum = reasoning_gym.factory.create_curriculum(name)
    top = max(len(a.levels) for a in curriculum.attributes.values()) - 1
    levels = []
    for g in range(top + 1):
        for attr_name, attr in curriculum.attributes.items():
            curriculum.set_attr_level(attr_name, min(g, len(attr.levels) - 1))
        config = curriculum.generate_configuration({"seed": 0, "size": 1})
        fields: list[str] = []
        for attr in curriculum.attributes.values():
            fields += [
                f
                for f in (
                    getattr(attr, "lower_field_name", None),
                    getattr(attr, "upper_field_name", None),
                    getattr(attr, "field_name", None),
                )
                if f
            ]
        levels.append({f: _jsonable(getattr(config, f)) for f in fields})
    return levels


def difficulty_config(name: str, difficulty: str) -> dict[str, Any]:
    """TASK_DIFFICULTY's preset: ``paper`` = reasoning-gym's defaults, ``easy`` = the curriculum's level 0."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"TASK_DIFFICULTY={difficulty!r}: use one of {', '.join(DIFFICULTIES)}")
    return {} if difficulty == "paper" else curriculum_levels(name)[0]


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def question_rng(seed: int, node_id: str, round_: int, stage: int) -> random.Random:
    """The generator that decides which questions a node draws in a stage."""
    return rng_for(seed, node_id, round_, stage, purpose="questions")


def parse_task_mix(tasks: str | None, task_config: str | None, difficulty: str = "paper") -> tuple[TaskSpec, ...]:
    """Parse TASKS (``"chain_sum:2,basic_arithmetic"``) and TASK_CONFIG (a JSON object per task).

    TASKS None or blank means :data:`PAPER_TASKS`, weight 1 each. Every dataset is built once
    here, so a config that reasoning-gym rejects fails now, with a ``ValueError`` whose one-line
    message names the variable, the value and the fix.
    """
    weights = _parse_tasks(tasks)
    configs = _parse_task_config(task_config, weights)
    specs = tuple(
        TaskSpec(name, weight, {**difficulty_config(name, difficulty), **configs.get(name, {})})
        for name, weight in weights.items()
    )
    for spec in specs:
        _build(spec, seed=0)
        if spec.name in HASH_SEED_DEPENDENT_TASKS:
            logger.warning(
                "task %s generates questions that depend on PYTHONHASHSEED: peers will drop its rollouts "
                "unless every node runs with the same PYTHONHASHSEED",
                spec.name,
            )
    return specs


class TaskBank:
    """The datasets of a task mix, built once with one dataset seed shared by the whole swarm."""

    def __init__(
        self,
        specs: Sequence[TaskSpec],
        dataset_seed: int,
        curriculum: bool = False,
        held_out: int = DEFAULT_HELD_OUT,
        extraction: str = "strict",
        partial_credit: bool = True,
    ) -> None:
        """``held_out`` (EVAL_SAMPLES): the distinct questions per task (and level) kept out of training;
        ``extraction`` (ANSWER_EXTRACTION): how :meth:`correctness` reads a completion's answer;
        ``partial_credit`` (PARTIAL_CREDIT): whether :meth:`correctness` keeps a verifier's partial score."""
        rewards.check_extraction(extraction)
        if not specs:
            raise ValueError("TaskBank needs at least one TaskSpec")
        if isinstance(dataset_seed, bool) or not isinstance(dataset_seed, int) or not 0 <= dataset_seed <= 2**63:
            raise ValueError(f"dataset_seed must be an integer in [0, 2**63], got {dataset_seed!r}")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"TaskBank: each task may appear once, got {names}")
        if isinstance(held_out, bool) or not isinstance(held_out, int) or held_out < 1:
            raise ValueError(f"held_out (EVAL_SAMPLES) must be a positive integer, got {held_out!r}")
        self.specs = tuple(specs)
        self.extraction = extraction
        self.partial_credit = partial_credit
        self.dataset_seed = dataset_seed
        self.held_out = held_out
        self._held_out: dict[tuple[str, int], tuple[list[Question], frozenset[str]]] = {}
        self._specs = {spec.name: spec for spec in self.specs}
        self._weights = [spec.weight for spec in self.specs]
        self._datasets: dict[str, ProceduralDataset] = {}
        # Curriculum: the configs a task may take, easiest first (level 0 = the spec's own config).
        # Peers' groups are accepted at any of these known levels, never at a config a peer made up.
        self.levels: dict[str, list[dict[str, Any]]] = {
            spec.name: [
                {**level, **spec.config} if i == 0 else {**spec.config, **level}
                for i, level in enumerate(curriculum_levels(spec.name) if curriculum else [{}])
            ]
            for spec in self.specs
        }
        self.current_level = dict.fromkeys(self._specs, 0)
        # Canonical JSON of each level's config, for matching a peer group's provenance.
        self._level_keys = {
            name: [_canonical(self.level_config(name, i)) for i in range(len(levels))]
            for name, levels in self.levels.items()
        }
        self._level_datasets: dict[tuple[str, str], ProceduralDataset] = {}
        started = time.perf_counter()
        for spec in self.specs:
            _check_weight(spec.name, spec.weight)
            self._datasets[spec.name] = _build(spec, seed=dataset_seed)
        logger.info(
            "built %d reasoning-gym datasets (%s) in %.2f s",
            len(self.specs),
            ", ".join(names),
            time.perf_counter() - started,
        )

    @property
    def tasks(self) -> tuple[str, ...]:
        """The task names, in mix order."""
        return tuple(self._specs)

    def provenance_of(self, task: str, index: int, level: int | None = None) -> Provenance:
        """What names question ``index`` of ``task`` (at a curriculum level) on every node."""
        return Provenance(dataset=task, config=self.level_config(task, level), seed=self.dataset_seed, index=index)

    def level_config(self, task: str, level: int | None = None) -> dict[str, Any]:
        """The config of ``task`` at ``level`` (default: this node's current level)."""
        level = self.current_level[task] if level is None else level
        return self._specs[task].config if level == 0 else self.levels[task][level]

    def set_level(self, task: str, level: int) -> None:
        """Move ``task`` to a curriculum level (0 .. len(levels) - 1)."""
        if not 0 <= level < len(self.levels[task]):
            raise ValueError(f"{task} has curriculum levels 0..{len(self.levels[task]) - 1}, not {level}")
        self.current_level[task] = level

    def _dataset_at(self, task: str, level: int) -> ProceduralDataset:
        if level == 0:
            return self._datasets[task]
        config = self.levels[task][level]
        key = (task, _canonical(config))
        if key not in self._level_datasets:
            spec = self._specs[task]
            self._level_datasets[key] = _build(TaskSpec(task, spec.weight, config), seed=self.dataset_seed)
        return self._level_datasets[key]

    def question(self, task: str, index: int, level: int | None = None) -> Question:
        """Question ``index`` of ``task`` at a curriculum level (default: the current one)."""
        if not 0 <= index < dataset_size(task):
            raise IndexError(f"index {index} out of range for {task} (size {dataset_size(task)})")
        level = self.current_level[task] if level is None else level
        entry = _generate(self._dataset_at(task, level), index)
        return Question(task, entry["question"], entry, self.provenance_of(task, index, level))

    def eval_questions(self, task: str, n: int, level: int = 0) -> list[Question]:
        """The held-out set: ``n`` distinct questions read down from ``task``'s top index (the same on every node).

        Never trained on, by content: ``n`` may not exceed the ``held_out`` this bank keeps out of training.
        """
        if not 0 < n <= self.held_out:
            raise ValueError(
                f"{task}: this bank keeps {self.held_out} held-out questions out of training (EVAL_SAMPLES), asked "
                f"for {n}; build the TaskBank with held_out >= {n}"
            )
        return self._held_out_set(task, level)[0][:n]

    def is_held_out(self, task: str, question: str, level: int = 0) -> bool:
        """Whether ``question``'s text is a held-out question of ``task`` at level 0, ``level`` or the current level."""
        key = normalise_question(question, task)
        levels = {0, level, self.current_level[task]}
        return any(key in self._held_out_set(task, lv)[1] for lv in levels)

    def distinct_questions(self, task: str, want: int, level: int = 0) -> tuple[list[Question], int]:
        """Up to ``want`` distinct questions read down from the top index, and how many indices were read.

        Reads at most :func:`held_out_size` indices; fewer than ``want`` back means the question space
        (at this config) is smaller than ``want`` or close to it.
        """
        seen: set[str] = set()
        out: list[Question] = []
        top = dataset_size(task) - 1
        read = 0
        for read in range(1, held_out_size(task) + 1):  # noqa: B007 - read is reported
            try:
                q = self.question(task, top - (read - 1), level)
            except Exception as exc:  # noqa: BLE001 - a generator that fails on one index: take the next
                logger.warning("%s failed to generate held-out index %d: %r", task, top - (read - 1), exc)
                continue
            key = normalise_question(q.question, task)
            if key not in seen:
                seen.add(key)
                out.append(q)
                if len(out) == want:
                    break
        return out, read

    def _held_out_set(self, task: str, level: int) -> tuple[list[Question], frozenset[str]]:
        cached = self._held_out.get((task, level))
        if cached is None:
            found, read = self.distinct_questions(task, self.held_out, level)
            if len(found) < self.held_out:
                raise QuestionSpaceTooSmall(
                    too_small_message(task, self.level_config(task, level), self.held_out, len(found), read)
                )
            cached = (found, frozenset(normalise_question(q.question, task) for q in found))
            self._held_out[(task, level)] = cached
        return cached

    def draw(self, n: int, rng: random.Random) -> list[Question]:
        """``n`` questions: a task by weight, then a uniform index; the same ``rng`` state gives the same list."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self._draw_one(rng) for _ in range(n)]

    def regenerate(self, group: RolloutGroup) -> dict[str, Any] | None:
        """The locally generated entry for a peer's group, or None when the group cannot be trusted.

        Accepted only if the provenance names a task of this bank with exactly its config and
        seed, the index is in range, and the regenerated question text equals the group's.
        Nothing is built from a peer's config: the peer can only point at questions this bank has.
        """
        entry, reason = self._regenerate(group)
        if entry is None:
            logger.debug("dropping group %s (%s): %s", group.group_id, group.task, reason)
        return entry

    def score_group(
        self,
        entry: dict[str, Any],
        completions: Sequence[str],
        format_weight: float = 0.0,
        extraction: str = "strict",
        partial_credit: bool = True,
    ) -> tuple[float, ...]:
        """Rewards of ``completions`` against a locally generated ``entry``, one per completion."""
        dataset = self._dataset_of(entry)
        return tuple(
            rewards.score(dataset, entry, completion, format_weight, extraction, partial_credit)
            for completion in completions
        )

    def _dataset_of(self, entry: dict[str, Any]) -> ProceduralDataset:
        """The dataset of this bank that generated ``entry`` (its metadata's ``source_dataset``)."""
        task = rewards.task_of(entry)
        if task not in self._datasets:
            raise ValueError(f"entry of task {task!r} does not come from this bank (tasks: {', '.join(self.tasks)})")
        return self._datasets[task]

    def correctness(self, entry: dict[str, Any], completion: str) -> float:
        """The task verifier's score of ``completion``'s extracted answer (ANSWER_EXTRACTION), in [0, 1]: the
        correctness term of :class:`~swarm_gdrive.training.reward_terms.Reward`."""
        answer = rewards.extract_answer(completion, self.extraction)
        value = rewards.verifier_score(self._dataset_of(entry), entry, answer)
        return rewards.credit(value, self.partial_credit)

    def columns(self, entry: dict[str, Any]) -> dict[str, Any]:
        """What a REWARD_FUNCTIONS function receives of a question besides prompts and completions: the entry's
        ``answer`` and ``metadata`` (reasoning-gym's own keys)."""
        return {"answer": entry.get("answer"), "metadata": entry.get("metadata")}

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages of ``question``: reasoning-gym's default system prompt, then the question."""
        return build_messages(question)

    def _draw_one(self, rng: random.Random) -> Question:
        """A task by weight, then uniform indices until one generates and is not a held-out question."""
        (spec,) = rng.choices(self.specs, weights=self._weights)
        failures = skipped = 0
        while True:
            index = rng.randrange(training_limit(spec.name))
            try:
                question = self.question(spec.name, index)
            except Exception as exc:  # a generator that fails on one index should not stop a worker
                failures += 1
                logger.warning("%s failed to generate index %d (attempt %d): %r", spec.name, index, failures, exc)
                if failures >= _DRAW_ATTEMPTS:
                    raise RuntimeError(f"{spec.name}: {_DRAW_ATTEMPTS} indices failed to generate") from None
                continue
            if not self.is_held_out(spec.name, question.question):
                return question
            skipped += 1
            if skipped >= _HELD_OUT_SKIPS:
                raise RuntimeError(
                    f"{spec.name}: {skipped} draws in a row were held-out questions; its question space "
                    f"{_canonical(self.level_config(spec.name))} is too small for {self.held_out} held out "
                    "(EVAL_SAMPLES): lower EVAL_SAMPLES or make the task harder in TASK_CONFIG"
                )

    def _regenerate(self, group: RolloutGroup) -> tuple[dict[str, Any] | None, str]:
        prov = group.provenance
        spec = self._specs.get(prov.dataset)
        if spec is None or group.task != prov.dataset:
            return None, f"task {prov.dataset!r} (group says {group.task!r}) is not in this node's mix"
        claimed = _canonical(prov.config)
        known = [i for i, key in enumerate(self._level_keys[spec.name]) if key == claimed]
        if not known:
            return None, f"config {prov.config} differs from this node's {spec.config}"
        if prov.seed != self.dataset_seed:
            return None, f"seed {prov.seed} differs from this node's {self.dataset_seed}"
        if not 0 <= prov.index < dataset_size(spec.name):
            return None, f"index {prov.index} is out of range (size {dataset_size(spec.name)})"
        if prov.index >= training_limit(spec.name):
            return None, f"index {prov.index} is in the held-out evaluation range"
        try:
            entry = _generate(self._dataset_at(spec.name, known[0]), prov.index)
        except Exception as exc:
            return None, f"index {prov.index} failed to generate: {exc!r}"
        if entry["question"] != group.question:
            logger.warning(
                "group %s claims a question that %s[%d] does not have", group.group_id, spec.name, prov.index
            )
            return None, "question text differs from the regenerated one"
        try:
            held_out = self.is_held_out(spec.name, entry["question"], known[0])
        except QuestionSpaceTooSmall as exc:  # a curriculum level too small to hold out: nothing is safe to take
            return None, str(exc)
        if held_out:
            return None, f"index {prov.index} is a held-out evaluation question (same text)"
        return entry, ""


def too_small_message(task: str, config: dict[str, Any], wanted: int, found: int, read: int) -> str:
    """The error for a question space that cannot hold out ``wanted`` distinct questions."""
    return (
        f"task {task!r} with config {_canonical(config)} (from TASK_DIFFICULTY and TASK_CONFIG) has only {found} "
        f"distinct questions in {read} held-out indices, too few to hold out EVAL_SAMPLES={wanted} and still "
        f"train on as many others; lower EVAL_SAMPLES to at most {found // 2}, or widen the task's question space "
        "in TASK_CONFIG (more digits or terms) or with TASK_DIFFICULTY=paper"
    )


def check_held_out_space(specs: Sequence[TaskSpec], eval_samples: int, dataset_seed: int) -> None:
    """Raise :class:`QuestionSpaceTooSmall` unless each task (level 0) has ``2 * eval_samples`` distinct questions.

    The held-out set takes ``eval_samples`` of them; training keeps at least as many others. Reads about
    ``2 * eval_samples`` entries per task (milliseconds) when the space is large, up to :func:`held_out_size`
    (about 0.3-0.6 s for easy arithmetic) when it is not.
    """
    bank = TaskBank(specs, dataset_seed, held_out=eval_samples)
    for task in bank.tasks:
        found, read = bank.distinct_questions(task, 2 * eval_samples)
        if len(found) < 2 * eval_samples:
            raise QuestionSpaceTooSmall(
                too_small_message(task, bank.level_config(task), eval_samples, len(found), read)
            )


def system_prompt() -> str:
    """reasoning-gym's default system prompt: think step by step, answer in ``<answer></answer>``."""
    return SYSTEM_PROMPTS["default"]


def build_messages(question: str, system: str | None = None) -> list[dict[str, str]]:
    """Chat messages (``system``, by default reasoning-gym's system prompt, then the question as the user turn) for a
    tokenizer's chat template."""
    return [
        {"role": "system", "content": system_prompt() if system is None else system},
        {"role": "user", "content": question},
    ]


def _generate(dataset: ProceduralDataset, index: int) -> dict[str, Any]:
    # bf's compiler prints a "." per question to stdout, which would flood a worker's console.
    # redirect_stdout swaps sys.stdout process-wide for the milliseconds of generation.
    with contextlib.redirect_stdout(io.StringIO()):
        return dataset[index]


def _canonical(config: dict[str, Any]) -> str:
    # json, not ==: True == 1 == 1.0 in Python, but they are different configs for a generator.
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value))


def _one_line(text: object, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _parse_tasks(tasks: str | None) -> dict[str, float]:
    if tasks is None or not tasks.strip():
        return dict.fromkeys(PAPER_TASKS, 1.0)
    weights: dict[str, float] = {}
    for item in tasks.split(","):
        name, sep, weight_text = (part.strip() for part in item.partition(":"))
        if not name:
            raise ValueError(
                f"TASKS: empty entry in {tasks!r}; write comma-separated names like 'chain_sum:2,basic_arithmetic'"
            )
        _check_name(name)
        weight = _parse_weight(name, weight_text) if sep else 1.0
        if name in weights:
            raise ValueError(
                f"TASKS: task {name!r} appears twice in {tasks!r}; list it once and give it a weight (name:2)"
            )
        weights[name] = weight
    return weights


def _parse_weight(name: str, text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    _check_weight(name, weight, text)
    return weight


def _check_weight(name: str, weight: float, text: str | None = None) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
        shown = repr(text) if text is not None else repr(weight)
        raise ValueError(
            f"TASKS: weight {shown} of task {name!r} is not a positive number; "
            f"write name:weight with a weight > 0, e.g. '{name}:2', or leave the task out"
        )


def _check_name(name: str) -> None:
    if name in rewards.UNSAFE_VERIFIER_TASKS:
        raise ValueError(
            f"TASKS: task {name!r} is not allowed: its verifier passes answer text to sympy.parse_expr (eval), "
            "which would run code written by other nodes; choose another task"
        )
    if name not in DATASETS or name == "composite":
        close = difflib.get_close_matches(name, [n for n in DATASETS if n != "composite"], n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"TASKS: unknown task {name!r}; {hint}{_LIST_TASKS_HINT}")


def _parse_task_config(task_config: str | None, weights: dict[str, float]) -> dict[str, dict[str, Any]]:
    if task_config is None or not task_config.strip():
        return {}
    example = 'write a JSON object like \'{"chain_sum": {"min_terms": 2, "max_terms": 2}}\''
    try:
        raw = json.loads(task_config)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"TASK_CONFIG: not valid JSON ({exc.msg} at column {exc.colno}) in {_one_line(task_config)!r}; {example}"
        ) from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"TASK_CONFIG: expected a JSON object of task name to config, got {type(raw).__name__} "
            f"{_one_line(task_config)!r}; {example}"
        )
    for name, config in raw.items():
        if name not in weights:
            raise ValueError(
                f"TASK_CONFIG: config for {name!r}, which is not in TASKS ({', '.join(weights)}); "
                "add the task to TASKS or remove its config"
            )
        if not isinstance(config, dict):
            raise ValueError(
                f"TASK_CONFIG: config of {name!r} must be a JSON object, got {_one_line(json.dumps(config))}; {example}"
            )
    return raw


def _build(spec: TaskSpec, seed: int) -> ProceduralDataset:
    """Build a task's dataset and its entry 0; ValueError for a config peers cannot share or reasoning-gym rejects."""
    _check_name(spec.name)
    for key, value in spec.config.items():
        if not (_is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value))):
            raise ValueError(
                f"TASK_CONFIG: {spec.name}.{key} = {_one_line(json.dumps(value))} cannot be shared with peers; "
                "use numbers, strings, booleans, null and flat lists of them"
            )
    try:
        Provenance(dataset=spec.name, config=spec.config, seed=seed, index=0)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _one_line(".".join(map(str, first["loc"])), 80)
        raise ValueError(
            f"TASK_CONFIG: config of {spec.name!r} cannot be shared with peers ({where}: {first['msg']}); "
            "use at most 64 keys of at most 128 characters"
        ) from None
    for key in _RESERVED_KEYS:
        if key in spec.config:
            raise ValueError(
                f"TASK_CONFIG: config of {spec.name!r} sets {key!r}, which the swarm sets itself "
                "(seed from the experiment seed, size fixed); remove it"
            )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            dataset = reasoning_gym.create_dataset(spec.name, size=dataset_size(spec.name), seed=seed, **spec.config)
            dataset[0]  # some generators fail only when asked for an entry
            return dataset
    except Exception as exc:  # reasoning-gym validates with assert, TypeError and ValueError alike
        config_cls = DATASETS[spec.name][1]
        keys = ", ".join(f.name for f in dataclasses.fields(config_cls) if f.name not in _RESERVED_KEYS)
        if not spec.config:
            raise ValueError(
                f"TASKS: task {spec.name!r} cannot be built with its default config "
                f"({type(exc).__name__}: {_one_line(exc)}); give it a config in TASK_CONFIG (keys: {keys}) "
                "or choose another task"
            ) from None
        raise ValueError(
            f"TASK_CONFIG: reasoning-gym rejected the config of {spec.name!r} {_one_line(_canonical(spec.config))} "
            f"({type(exc).__name__}: {_one_line(exc)}); valid keys: {keys}"
        ) from None
