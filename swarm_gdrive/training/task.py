"""The task interface: a provider of questions and the correctness of a completion, whatever the source.

A :class:`TaskProvider` draws questions deterministically from the experiment's seed, keeps its own held-out split
(never trained on), regenerates a peer's question from its provenance alone (or refuses it), and scores a
completion against an entry it produced itself, deterministically, so that every node re-scores any peer's group
the same way (GDRIVE_IMPLEMENTATION.md §5.7). Two providers (TASK_SOURCE): reasoning-gym's procedural tasks
(:class:`~swarm_gdrive.training.tasks.TaskBank`) and a Hugging Face dataset
(:class:`~swarm_gdrive.training.dataset_task.DatasetTask`). The reward built on a provider's correctness is
:class:`~swarm_gdrive.training.reward_terms.Reward`.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Protocol

from swarm_gdrive.protocol.records import RolloutGroup

if TYPE_CHECKING:
    from swarm_gdrive.training.settings import TrainingSettings
    from swarm_gdrive.training.tasks import Question


class TaskProvider(Protocol):
    """What the GRPO workload needs of a source of questions."""

    #: Task names, in mix order (a dataset provider has one).
    tasks: tuple[str, ...]
    #: Each task's curriculum levels (configs, easiest first) and the level trained now; one level where none.
    levels: dict[str, list[dict[str, Any]]]
    current_level: dict[str, int]

    def set_level(self, task: str, level: int) -> None: ...

    def draw(self, n: int, rng: random.Random) -> list[Question]:
        """``n`` training questions (never held-out ones); the same ``rng`` state gives the same list."""
        ...

    def regenerate(self, group: RolloutGroup) -> dict[str, Any] | None:
        """This node's own entry for a peer's group, or None when its provenance does not check out."""
        ...

    def eval_questions(self, task: str, n: int, level: int = 0) -> list[Question]:
        """The held-out set of ``task``: the same ``n`` questions on every node."""
        ...

    def correctness(self, entry: dict[str, Any], completion: str) -> float:
        """The completion's correctness in [0, 1] against a locally produced ``entry``; deterministic."""
        ...

    def columns(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry's columns that REWARD_FUNCTIONS receive as keyword arguments (TRL's convention)."""
        ...

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages (system prompt, user turn) of a question, for the chat template."""
        ...


def build_task(config: TrainingSettings) -> TaskProvider:
    """The provider TASK_SOURCE names, from this node's settings (a dataset from this node's own copy)."""
    if config.task_source == "datasets":
        from swarm_gdrive.training.dataset_task import DatasetTask  # datasets and math-verify: only when used

        return DatasetTask.from_settings(config)
    from swarm_gdrive.training.tasks import TaskBank, parse_task_mix

    return TaskBank(
        parse_task_mix(config.tasks, config.task_config, config.task_difficulty),
        config.seed,
        curriculum=config.curriculum_threshold > 0,
        held_out=config.eval_samples,
        extraction=config.answer_extraction,
        partial_credit=config.partial_credit,
    )
