"""Configuration from environment variables: the one place that composes a node's settings from them.

Each layer declares the settings it reads, typed, documented and validated: storage
(:mod:`swarm_gdrive.storage.settings`), the protocol (:mod:`swarm_gdrive.protocol.settings`) and training
(:mod:`swarm_gdrive.training.settings`), each extending the one below, with the machinery they share in
:mod:`swarm_gdrive.envparse`. :class:`Config` composes them with the settings of the node itself (its identity,
workload and logging), and :func:`from_env` builds it, the one place that does: it parses and validates every
field up front, then the relations between them, and raises :class:`ConfigError` with a one-line message that
names the variable, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from swarm_gdrive.envparse import (
    ConfigError,
    env_field,
    parse_bool,
    parse_choice,
    parse_local_dir,
    parse_optional_name,
    parse_seconds,
    read_env,
)
from swarm_gdrive.presets import load as load_preset
from swarm_gdrive.progress import MODES as PROGRESS_MODES
from swarm_gdrive.protocol import settings as protocol_settings
from swarm_gdrive.protocol.settings import (
    LAG_DERIVED,
    MAX_SYNC_LAG,
    PUBLISH_FREQUENCIES,
    ROLES,
    ROUND_MODE_CHOICES,
    ROUND_MODES,
    TRACKERS,
    auto_round_mode,
)
from swarm_gdrive.training import settings as training_settings
from swarm_gdrive.training import task_check
from swarm_gdrive.training.settings import (
    CHECKPOINT_OPTIMIZERS,
    LOSS_TYPES,
    PRECISIONS,
    SCALE_REWARDS,
    WEIGHT_DTYPES,
    TrainingSettings,
    check_model_cache_dir,
)

#: The names this module has always offered, now defined by the layer that owns them.
__all__ = [
    "CHECKPOINT_OPTIMIZERS",
    "FINGERPRINT_FIELDS",
    "LAG_DERIVED",
    "LOCAL_SWARM_PRESET",
    "LOG_LEVELS",
    "LOSS_TYPES",
    "MAX_SYNC_LAG",
    "PRECISIONS",
    "PUBLISH_FREQUENCIES",
    "ROLES",
    "ROUND_MODES",
    "ROUND_MODE_CHOICES",
    "SCALE_REWARDS",
    "SMALL_MODEL_PRESET",
    "SPARSE_SIGNAL_PRESET",
    "TEST_MODE_PRESET",
    "TRACKERS",
    "WEIGHT_DTYPES",
    "WORKLOADS",
    "Config",
    "ConfigError",
    "_parse_bool",
    "auto_round_mode",
    "check_model_cache_dir",
    "env_fields",
    "env_values",
    "from_env",
    "settings_markdown",
    "swarm_env",
]

WORKLOADS = ("grpo", "synthetic")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_parse_bool = parse_bool  # TEST_MODE's parser, which the notebooks read before a node starts

#: The presets, kept as data in swarm_gdrive/presets/ (each file says what it is for and why its values):
#: applied by TEST_MODE to every variable of this table that is not set explicitly (test-mode.json);
TEST_MODE_PRESET: dict[str, str] = load_preset("test-mode")
#: a learning signal on the packaged small model within minutes on CPU cores, as in ``swarm-gdrive demo`` and the
#: notebooks' SMALL_MODEL_SETTINGS (small-model.json);
SMALL_MODEL_PRESET: dict[str, str] = load_preset("small-model")
#: the sparse-signal regime, SMALL_MODEL_PRESET on harder task settings (sparse-signal.json);
SPARSE_SIGNAL_PRESET: dict[str, str] = load_preset("sparse-signal")
#: protocol settings for nodes that share one machine's CPU cores (local-swarm.json).
LOCAL_SWARM_PRESET: dict[str, str] = load_preset("local-swarm")

#: Fields that define an experiment, of every layer: a coordinator refuses to resume an experiment
#: whose fingerprint differs. MAX_ROUNDS is left out so that a run can be extended.
FINGERPRINT_FIELDS = (
    "experiment_name",
    "model_name",
    "seed",
    "num_train_samples",
    "num_generations",
    "num_transplant_trees",
    "num_stages",
    "workload",
    "tasks",
    "task_config",
    "answer_extraction",
    "answer_prefix",
    "format_reward_weight",
    "task_difficulty",
    "curriculum_threshold",
)

#: Fields whose default is a node-local folder under the home, resolved when the configuration is built.
_LOCAL_DIR_FIELDS = ("local_dir", "model_cache_dir")


@dataclass(frozen=True)
class Config(TrainingSettings):
    """The resolved configuration of one node: every layer's settings (storage's, the protocol's, training's) and
    the node's own. Build it with :func:`from_env`."""

    FINGERPRINT_FIELDS: ClassVar[tuple[str, ...]] = FINGERPRINT_FIELDS

    node_id: str | None = env_field(
        "NODE_ID",
        None,
        "Identity of this node in the swarm: lowercase letters, digits, '.', '_' and '-'. Unset: a generated one, "
        "persisted in SWARM_LOCAL_DIR so that a restarted node keeps it.",
        parse_optional_name,
    )
    test_mode: bool = env_field(
        "TEST_MODE",
        False,
        "Preset for a quick check: MAX_ROUNDS=3, NUM_TRAIN_SAMPLES=4, NUM_GENERATIONS=4, "
        "EVAL_BEFORE_TRAINING=false, each unless set explicitly.",
        parse_bool,
    )
    workload: str = env_field(
        "WORKLOAD",
        "grpo",
        "What a worker does each stage. grpo: generate with MODEL_NAME on reasoning-gym tasks and train "
        "it with GRPO. synthetic: a named stand-in (sum questions, random answers, an exact verifier, "
        "no model) for protocol tests and load benchmarks.",
        parse_choice(WORKLOADS),
    )
    synthetic_step_seconds: float = env_field(
        "SYNTHETIC_STEP_SECONDS", 0.01, "Simulated compute per synthetic stage, seconds.", parse_seconds
    )
    log_level: str = env_field("LOG_LEVEL", "INFO", "Logging level.", parse_choice(LOG_LEVELS, lower=False))
    log_settings: str = env_field(
        "LOG_SETTINGS",
        "short",
        "What a node logs of its settings when it starts: short (one line: role, node, experiment, storage, "
        "model, rounds, I/J/G and how many settings differ from their defaults) or full (every setting too; "
        "LOG_LEVEL=DEBUG logs them as well). Secrets appear only as <set> or <unset>.",
        parse_choice(("short", "full")),
    )
    progress: str = env_field(
        "PROGRESS",
        "auto",
        "Progress of generation, training, evaluation and checkpoints: bars (tqdm), lines (a log line every 30 s "
        "and a summary), off, or auto: bars when standard error is a terminal, else lines.",
        parse_choice(PROGRESS_MODES),
    )

    def fingerprint_fields(self) -> dict[str, Any]:
        """:attr:`FINGERPRINT_FIELDS`' values, and the task's when it is not reasoning-gym's defaults
        (:func:`swarm_gdrive.training.task_check.fingerprint_fields`: a dataset's settings and rows' hash, the
        reward functions' names)."""
        return task_check.fingerprint_fields(self, super().fingerprint_fields())

    def changed(self) -> dict[str, Any]:
        """The settings whose value is not their default (as :meth:`describe` shows them): what a node was given,
        and what SYNC_LAG derived from it. GDRIVE_PATH, which has no default, is not among them."""
        described = self.describe()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            var = f.metadata["env"]
            if f.metadata["required"]:
                continue
            default = parse_local_dir(var, f.default) if f.name in _LOCAL_DIR_FIELDS else f.default
            if getattr(self, f.name) != default:
                out[var] = described[var]
        return out

    def summary(self) -> str:
        """The settings a person checks first, in one line (no secret's value); the rest by LOG_SETTINGS=full."""
        parts = [
            f"model {self.model_name}",
            f"{self.max_rounds} round{'' if self.max_rounds == 1 else 's'}",
            f"I={self.num_train_samples} J={self.num_transplant_trees} G={self.num_generations}",
        ]
        if self.test_mode:
            parts.append("TEST_MODE")
        if self.huggingface_access_token:
            parts.append("HUGGINGFACE_ACCESS_TOKEN=<set>")
        changed = len(self.changed())
        more = "LOG_SETTINGS=full lists every setting" if self.log_settings == "short" else "every setting follows"
        parts.append(f"{changed} non-default setting{'' if changed == 1 else 's'} ({more})")
        return ", ".join(parts)


def env_values(**values: object) -> dict[str, str]:
    """Keyword values as environment variables: names upper-cased, None and "" left out, booleans lower-case."""
    env: dict[str, str] = {}
    for key, value in values.items():
        if value is None or value == "":
            continue
        env[key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def swarm_env(gdrive_path: str, experiment: str, *presets: Mapping[str, str], **values: object) -> dict[str, str]:
    """The environment a swarm's nodes share: GDRIVE_PATH and EXPERIMENT_NAME, then each preset in order (e.g.
    :data:`LOCAL_SWARM_PRESET`, :data:`SMALL_MODEL_PRESET`), then ``values`` (see :func:`env_values`).

    The one builder of node environments: ``swarm-gdrive demo``, the notebooks and the benchmarks all use it;
    each node adds its NODE_ROLE and NODE_ID.
    """
    env = {"GDRIVE_PATH": str(gdrive_path), "EXPERIMENT_NAME": experiment}
    for preset in presets:
        env.update(preset)
    env.update(env_values(**values))
    return env


def settings_markdown() -> str:
    """docs/settings.md: every variable with its default and meaning, from the fields of :class:`Config`."""
    lines = [
        "# Settings",
        "",
        "Every setting of a node is an environment variable. This page is generated from `swarm_gdrive/config.py`",
        "(`swarm-gdrive env --markdown > docs/settings.md`); `swarm-gdrive env` prints the same in a terminal.",
        f"`TEST_MODE=true` applies {', '.join(f'{k}={v}' for k, v in TEST_MODE_PRESET.items())} to those not set.",
        "",
        "| variable | default | meaning |",
        "|---|---|---|",
    ]
    for f in env_fields():
        default = "required" if f.metadata["required"] else "unset" if f.default is None else f.default
        meaning = f.metadata["help"].replace("|", "\\|")
        lines.append(f"| `{f.metadata['env']}` | `{default}` | {meaning} |")
    return "\n".join(lines) + "\n"


def env_fields() -> list[dataclasses.Field]:
    """The fields of :class:`Config`, each with ``metadata['env']`` and ``metadata['help']``."""
    return list(dataclasses.fields(Config))


def from_env(environ: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from ``environ`` (default: ``os.environ``): TEST_MODE's preset, then
    every layer's fields read and parsed (:func:`~swarm_gdrive.envparse.read_env`), then the relations."""
    env = dict(os.environ if environ is None else environ)
    if parse_bool("TEST_MODE", env.get("TEST_MODE", "")):
        for var, value in TEST_MODE_PRESET.items():
            env.setdefault(var, value)
    values = read_env(Config, env)
    for f in env_fields():
        if f.name in _LOCAL_DIR_FIELDS and f.name not in values:
            values[f.name] = parse_local_dir(f.metadata["env"], f.default)
    protocol_settings.derive_from_lag(values, env)
    config = Config(**values)
    _check_relations(config)
    return config


def _check_relations(config: Config) -> None:
    """Each layer's relations, and the one that spans them: a GRPO worker's task mix (training's check, for the node
    that trains). SYNC_LAG's bounds come last, as they always did."""
    protocol_settings.check_relations(config)
    if config.workload == "grpo" and not config.is_coordinator:
        training_settings.check_task_mix(config)
    if config.workload == "grpo" and (config.task_source != "reasoning_gym" or config.reward_functions):
        # A worker's dataset and probed reward functions; a coordinator's dataset, read for the fingerprint.
        task_check.check_task(config, probe=not config.is_coordinator)
    training_settings.check_relations(config)
    protocol_settings.check_lag(config)
