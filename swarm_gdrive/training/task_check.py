"""The checks of a node's task settings that build the task: a dataset read from this node's copy, reward
functions imported and probed, and the task's part of the experiment's fingerprint.

:mod:`swarm_gdrive.config` calls them when it builds a node's configuration (:func:`check_task`) and when a node
states the experiment's fingerprint (:func:`fingerprint_fields`); they sit beside the task modules they build,
above :mod:`.settings`, which only declares the variables.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from swarm_gdrive.envparse import ConfigError
from swarm_gdrive.storage.settings import inside_shared_folder
from swarm_gdrive.training.settings import DATASET_FINGERPRINT_FIELDS, TrainingSettings


def fingerprint_fields(config: TrainingSettings, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (the protocol's and :class:`~swarm_gdrive.config.Config`'s), with the task's added when it is not
    the default: with TASK_SOURCE=datasets its settings and :func:`dataset_rows_hash` (this node's copy read), with
    REWARD_FUNCTIONS their canonical names and weights, with CHAT_TEMPLATE its text's sha256 (the coordinator needs
    its own copy, as of the dataset), with PARTIAL_CREDIT=false that; WORKLOAD=synthetic has no task fields. Absent
    otherwise, so that an experiment created before them keeps its fingerprint."""
    if not config.partial_credit:
        fields["partial_credit"] = False
    if config.workload != "grpo":  # the synthetic stand-in has no task to read: its settings do not define it
        return fields
    if config.task_source != "reasoning_gym":
        fields.update({name: getattr(config, name) for name in DATASET_FINGERPRINT_FIELDS})
        fields["dataset_rows_hash"] = dataset_rows_hash(config)
    if config.reward_functions:
        fields["reward_functions"] = reward_function_names(config.reward_functions)
    if config.chat_template:
        try:
            template = read_chat_template(config.chat_template, config.gdrive_path)
        except ValueError as exc:
            raise ConfigError("CHAT_TEMPLATE", config.chat_template, str(exc)) from None
        fields["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()[:16]
    return fields


def read_chat_template(path: str, gdrive_path: str) -> str:
    """CHAT_TEMPLATE's Jinja text from this node's own file (at most 256 KiB); ValueError names the setting."""
    if inside_shared_folder(path, gdrive_path):
        raise ValueError(
            f"CHAT_TEMPLATE={path!r} is inside the shared folder GDRIVE_PATH={gdrive_path!r}, where every participant "
            "can write: keep the template on this node, outside GDRIVE_PATH"
        )
    file = Path(path).expanduser()
    if not file.is_file() or file.stat().st_size > 256 * 1024:
        raise ValueError(f"CHAT_TEMPLATE={path!r}: not a file of at most 256 KiB holding a Jinja chat template")
    return file.read_text(encoding="utf-8")


def reward_function_names(text: str) -> str:
    """REWARD_FUNCTIONS in canonical form, ``module:function:weight`` joined by commas (ValueError names it)."""
    from swarm_gdrive.training.reward_terms import parse_reward_functions

    return ",".join(f"{m}:{f}:{w:g}" for m, f, w in parse_reward_functions(text))


def dataset_rows_hash(config: TrainingSettings) -> str:
    """The content hash of the rows this node's copy of the dataset gives (TASK_SOURCE=datasets), read once."""
    if not (config.dataset_path or "").strip():
        raise ConfigError("DATASET_PATH", None, "TASK_SOURCE=datasets needs this node's copy of the dataset: set it")
    return _rows_hash(
        config.dataset_path, config.dataset_config, config.dataset_split, config.dataset_max_rows,
        config.gdrive_path, config.local_dir, config.dataset_question_column, config.dataset_answer_column,
        config.dataset_answer_check,
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _rows_hash(
    path: str, name: str | None, split: str, max_rows: int, gdrive_path: str, local_dir: str, *columns_and_check: str
) -> str:
    from swarm_gdrive.training import dataset_task  # datasets: only when used

    rows = dataset_task.load_rows(path, name, split, max_rows, gdrive_path, dataset_task.cache_dir(local_dir))
    return dataset_task.dataset_fingerprint(list(rows), *columns_and_check)


def check_task(config: TrainingSettings, probe: bool) -> None:
    """TASK_SOURCE=datasets: the dataset loads from this node's copy and holds EVAL_SAMPLES held-out questions and as
    many others; REWARD_FUNCTIONS import from this node's code and, with ``probe`` (a worker), answer a probe call
    in TRL's signature. ConfigError names the variable."""
    from swarm_gdrive.training.tasks import QuestionSpaceTooSmall

    task = None
    if config.task_source == "datasets":
        from swarm_gdrive.training.dataset_task import DatasetTask

        try:
            task = DatasetTask.from_settings(config)
        except QuestionSpaceTooSmall as exc:
            raise ConfigError("EVAL_SAMPLES", config.eval_samples, str(exc)) from None
        except ValueError as exc:
            raise ConfigError.named("DATASET_PATH", config.dataset_path, str(exc)) from None
    if not config.reward_functions:
        return
    if not probe:  # a coordinator: the names alone enter the fingerprint, their code runs on the workers
        try:
            reward_function_names(config.reward_functions)
        except ValueError as exc:
            raise ConfigError.named("REWARD_FUNCTIONS", config.reward_functions, str(exc)) from None
        return
    from swarm_gdrive.training.reward_terms import RewardFunctionError, build_reward
    from swarm_gdrive.training.task import build_task

    try:
        reward = build_reward(
            task or build_task(config), config.format_reward_weight, config.reward_functions, config.gdrive_path
        )
        from swarm_gdrive.training.tasks import question_rng

        reward.probe(reward.task.draw(1, question_rng(config.seed, "probe", 0, 0))[0].entry)
    except RewardFunctionError as exc:
        raise ConfigError(
            "REWARD_FUNCTIONS", config.reward_functions, f"{exc} on a probe call (docs/tasks.md: the contract)"
        ) from None
    except ValueError as exc:
        raise ConfigError.named("REWARD_FUNCTIONS", config.reward_functions, str(exc)) from None
