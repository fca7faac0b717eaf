"""The settings the protocol reads: the experiment, this node's role, rounds, the exchange of rollouts, the
timeouts and their derivation from SYNC_LAG, evaluation's schedule, and the trackers a node reports to.

They extend :class:`~swarm_gdrive.storage.settings.StorageSettings` (the protocol reads the store's location to
choose a round mode); training's settings extend these, and :mod:`swarm_gdrive.config` composes the node's whole
configuration. The relations between them are checked here (:func:`check_relations`, :func:`check_lag`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from swarm_gdrive.envparse import (
    ConfigError,
    env_field,
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_local_dir,
    parse_name,
    parse_seconds,
)
from swarm_gdrive.storage.settings import StorageSettings, inside_shared_folder

ROLES = ("coordinator", "worker")
PUBLISH_FREQUENCIES = ("generation", "stage", "round")
#: The modes of a run: the coordinator's round clock (sync), or each worker's own rounds (async).
ROUND_MODES = ("sync", "async")
#: ROUND_MODE's values: a mode, or auto (:func:`auto_round_mode`).
ROUND_MODE_CHOICES = ("auto", *ROUND_MODES)
#: REPORT_TO's trackers (:mod:`swarm_gdrive.protocol.tracking`), each the package it needs and its extra's name.
TRACKERS = ("tensorboard", "wandb", "trackio")


def auto_round_mode(gdrive_path: str, sync_lag: float) -> str:
    """The mode ROUND_MODE=auto gives a new experiment, from measurement (bench/README.md §12): ``async`` on a folder
    that lags (SYNC_LAG > 0: a Drive mount, Drive for desktop), where a synchronous round took 190 s for 1 s of work
    and an asynchronous one 1 s; ``sync`` on a store every node sees at once (a local folder, the Drive API), where a
    round's wait costs a second or two between nodes of like speed and a study's rounds stay aligned."""
    del gdrive_path  # the same rule for every store: see bench/README.md §12
    return "async" if sync_lag > 0 else "sync"


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


@dataclass(frozen=True)
class ProtocolSettings(StorageSettings):
    """What the coordinator and the workers' protocol read (:mod:`swarm_gdrive.protocol`)."""

    #: The fields whose values define an experiment (:meth:`fingerprint_fields`): the protocol's own here; the
    #: node's configuration (:class:`swarm_gdrive.config.Config`) names those of every layer.
    FINGERPRINT_FIELDS: ClassVar[tuple[str, ...]] = (
        "experiment_name",
        "seed",
        "num_train_samples",
        "num_transplant_trees",
        "num_stages",
    )

    experiment_name: str = env_field(
        "EXPERIMENT_NAME",
        "swarm-experiment",
        "Name of the experiment folder under experiments/; lowercase letters, digits, '.', '_' and '-'.",
        parse_name,
    )
    node_role: str = env_field(
        "NODE_ROLE", "worker", "coordinator (owns the round clock, never trains) or worker.", parse_choice(ROLES)
    )
    seed: int = env_field("SEED", 42, "Base seed; every random draw is seeded by (SEED, node, round).", parse_int(0))
    max_rounds: int = env_field(
        "MAX_ROUNDS", 2000, "Rounds 0..MAX_ROUNDS-1 are played, then the experiment finishes.", parse_int(1)
    )
    num_train_samples: int = env_field(
        "NUM_TRAIN_SAMPLES", 8, "I: questions a worker draws and answers per stage.", parse_int(1)
    )
    num_transplant_trees: int = env_field(
        "NUM_TRANSPLANT_TREES", 0, "J: groups taken from other nodes per stage (SAPO); 0 is plain GRPO.", parse_int(0)
    )
    sapo_max_peers: int = env_field(
        "SAPO_MAX_PEERS",
        8,
        "Workers only: with more live peers than this, the J external groups are drawn from every live peer's "
        "groups in a seeded random order, and only the peers the draw lands on are read (about J when most groups "
        "have reward variance), at most this many per stage. Keeps each worker's reads per round independent of the "
        "swarm's size; 0 reads every peer.",
        parse_int(0),
    )
    num_stages: int = env_field(
        "NUM_STAGES", 1, "Stages per round; each stage generates, shares and trains once.", parse_int(1)
    )
    min_workers: int = env_field(
        "MIN_WORKERS",
        1,
        "Coordinator only: round 0 opens once this many workers are live, so that a study's nodes start together.",
        parse_int(1),
    )
    sync_lag: float = env_field(
        "SYNC_LAG",
        0.0,
        "Seconds a file written by one node may take to reach another: 0 for a local folder or the Drive API "
        "(gdrive://), about 60-120 for Colab's Drive mount or Drive for desktop. Unset timeouts are derived from it: "
        "COORDINATOR_ROUND_INTERVAL = 60 + 4 x SYNC_LAG, ROLLOUT_WAIT_TIMEOUT = 30 + 2 x SYNC_LAG, LIVENESS_TIMEOUT "
        "= 120 + 2 x SYNC_LAG; explicit ones too short for it are refused. The coordinator also waits up to SYNC_LAG "
        "after the last round for rewards still on their way.",
        _parse_lag,
    )
    round_mode: str = env_field(
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
        parse_choice(ROUND_MODE_CHOICES),
    )
    max_staleness_seconds: float = env_field(
        "MAX_STALENESS_SECONDS",
        1800.0,
        "ROUND_MODE=async: a worker takes no external group from a batch created more than this many seconds ago "
        "(the writer's clock against the reader's); 0 is no bound. 1800 s: HeteroRL/GEPO (arXiv 2508.17850) "
        "reports under 3 % loss at that staleness.",
        parse_float(0.0),
    )
    max_staleness_rounds: int = env_field(
        "MAX_STALENESS_ROUNDS",
        0,
        "ROUND_MODE=async: a worker takes no external group from a batch created before more than this many of "
        "its own rounds started; 0 is no bound in rounds.",
        parse_int(0),
    )
    coordinator_round_interval: float = env_field(
        "COORDINATOR_ROUND_INTERVAL",
        60.0,
        "Seconds after which the coordinator closes a round even if a live worker has not submitted. "
        "Unset: 60 + 4 x SYNC_LAG; at least 3 x SYNC_LAG.",
        parse_seconds,
    )
    experiment_deadline_minutes: float = env_field(
        "EXPERIMENT_DEADLINE_MINUTES",
        0.0,
        "Coordinator only: minutes after the experiment was created (experiment.json's created_at, on the "
        "coordinator's clock; a restart does not extend it) after which the coordinator finishes the experiment. "
        "ROUND_MODE=async: at once, each worker ending after the round it is playing (its reward and checkpoint kept); "
        "sync: when the open round ends. 0 is no deadline; raise it and restart the coordinator to play on.",
        parse_float(0.0, 1e6),
    )
    rollout_publish_frequency: str = env_field(
        "ROLLOUT_PUBLISH_FREQUENCY",
        "stage",
        "When a worker writes its rollouts: generation (after every group), stage (once per stage, "
        "before gathering) or round (every stage's batch at once, after the last stage has generated).",
        parse_choice(PUBLISH_FREQUENCIES),
    )
    rollout_cleanup_enabled: bool = env_field(
        "ROLLOUT_CLEANUP_ENABLED", False, "Remove this node's rollouts older than the last N rounds.", parse_bool
    )
    rollout_keep_last_n_rounds: int = env_field(
        "ROLLOUT_KEEP_LAST_N_ROUNDS", 10, "N: rounds of rollouts kept when cleanup is enabled.", parse_int(1)
    )
    rollout_archive_old: bool = env_field(
        "ROLLOUT_ARCHIVE_OLD", False, "Move old rollouts to archives/ instead of deleting them.", parse_bool
    )
    heartbeat_interval: float = env_field(
        "HEARTBEAT_INTERVAL", 10.0, "Seconds between a node's heartbeats.", parse_seconds
    )
    liveness_timeout: float = env_field(
        "LIVENESS_TIMEOUT",
        120.0,
        "A node whose heartbeat has not changed for this many seconds (observer's clock) is dead. "
        "Unset: 120 + 2 x SYNC_LAG; must exceed 2 x HEARTBEAT_INTERVAL + SYNC_LAG.",
        parse_seconds,
    )
    rollout_wait_timeout: float = env_field(
        "ROLLOUT_WAIT_TIMEOUT",
        30.0,
        "Longest a worker waits for other nodes' rollouts of its stage; then it goes on with what it has. "
        "Unset: 30 + 2 x SYNC_LAG; with NUM_TRANSPLANT_TREES > 0, at least 2 x SYNC_LAG.",
        parse_seconds,
    )
    coordinator_wait_timeout: float = env_field(
        "COORDINATOR_WAIT_TIMEOUT",
        3600.0,
        "Longest a worker waits for the round state to change before it gives up (exit code 3). "
        "With SYNC_LAG > 0, more than COORDINATOR_ROUND_INTERVAL + SYNC_LAG.",
        parse_seconds,
    )
    poll_interval_min: float = env_field(
        "POLL_INTERVAL_MIN", 0.5, "First delay of a polling backoff, seconds.", parse_seconds
    )
    poll_interval_max: float = env_field("POLL_INTERVAL_MAX", 10.0, "Cap of a polling backoff, seconds.", parse_seconds)
    eval_interval: int = env_field(
        "EVAL_INTERVAL",
        10,
        "Rounds between held-out evaluations (before rounds 0, N, 2N, ... and after the last); 0 is off.",
        parse_int(0),
    )
    eval_before_training: bool = env_field(
        "EVAL_BEFORE_TRAINING",
        True,
        "Evaluate the untrained model before round 0 (the baseline every later evaluation is compared with; about "
        "2 minutes of a CPU runtime with the notebooks' model). false starts training at once; the evaluations "
        "every EVAL_INTERVAL rounds and after the last stay.",
        parse_bool,
    )
    local_dir: str = env_field(
        "SWARM_LOCAL_DIR",
        "~/.cache/swarm-gdrive",
        "Node-local folder that keeps generated node identities and restored checkpoints; refused inside "
        "GDRIVE_PATH (every participant writes there).",
        parse_local_dir,
    )
    reset_experiment: bool = env_field(
        "RESET_EXPERIMENT",
        False,
        "Coordinator only: move an existing experiment with a different configuration to "
        "archives/ and start afresh, instead of refusing.",
        parse_bool,
    )
    coordinator_takeover: bool = env_field(
        "COORDINATOR_TAKEOVER",
        False,
        "Coordinator only: take over an experiment whose coordinator (another NODE_ID) is still running, instead of "
        "refusing to start (exit code 2); the other one sees this one's state and exits with code 2. See "
        "docs/operations.md, 'Two coordinators'.",
        parse_bool,
    )
    coordinator_key_file: str | None = env_field(
        "COORDINATOR_KEY_FILE",
        None,
        "Coordinator only: the file of its Ed25519 private key, which signs experiment.json and every state "
        "(created, mode 0600, when absent); unset: {SWARM_LOCAL_DIR}/{EXPERIMENT_NAME}/coordinator_key.pem. Refused "
        "inside GDRIVE_PATH. Keep it across restarts (the notebooks put it in your own Drive): a coordinator without "
        "the key of its experiment refuses to resume it (docs/operations.md, 'The coordinator key').",
        parse_local_dir,
    )
    repin_coordinator_key: bool = env_field(
        "REPIN_COORDINATOR_KEY",
        False,
        "Worker only: pin the coordinator key that experiment.json names now, replacing the one this node pinned. "
        "Only after you reset an experiment whose coordinator key was lost; a pinned worker otherwise ignores an "
        "experiment.json and states its key did not sign.",
        parse_bool,
    )
    report_to: str = env_field(
        "REPORT_TO",
        "none",
        "Experiment trackers, as TRL's report_to: none, all, or a comma list of tensorboard, wandb and trackio, "
        "each installed with its extra (pip install 'swarm-gdrive[wandb]'). Every node is a run named by NODE_ID, "
        "grouped by EXPERIMENT_NAME, with TRL's metric names; W&B without an API key logs offline "
        "(docs/tracking.md).",
        _parse_report_to,
    )
    tracking_dir: str | None = env_field(
        "TRACKING_DIR",
        None,
        "Node-local folder for the trackers' files (TensorBoard event files, W&B runs, trackio's database); "
        "unset: {SWARM_LOCAL_DIR}/runs. Refused inside GDRIVE_PATH.",
        parse_local_dir,
    )
    tracking_project: str = env_field(
        "TRACKING_PROJECT", "swarm-gdrive", "The W&B and trackio project of the runs.", parse_name
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
        """The fields that define the experiment (:attr:`FINGERPRINT_FIELDS`), as JSON-ready values: a coordinator
        refuses to resume an experiment whose fingerprint differs, and a worker to join it."""
        return {name: getattr(self, name) for name in self.FINGERPRINT_FIELDS}

    def differing_fields(self, other: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """``(field, this node's value, other's)`` for every field of :meth:`fingerprint_fields` whose value
        differs from ``other`` (an experiment.json's ``config``), then every field only ``other`` has; a field this
        node's fingerprint leaves out (at its default) is shown with that default."""
        mine = self.fingerprint_fields()
        keys = list(mine) + [k for k in other if k not in mine]
        return [(k, mine.get(k, getattr(self, k, None)), other.get(k)) for k in keys if other.get(k) != mine.get(k)]

    def fingerprint(self) -> str:
        """sha256 over :meth:`fingerprint_fields`, canonical JSON."""
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def derive_from_lag(values: dict[str, Any], env: Mapping[str, str]) -> None:
    """The LAG_DERIVED timeouts that are not set explicitly, from SYNC_LAG (their plain defaults at 0)."""
    lag = values.get("sync_lag", 0.0)
    for var, (name, base, multiple) in LAG_DERIVED.items():
        if var not in env:
            values[name] = base + multiple * lag


def _derived(var: str, lag: float) -> float:
    _, base, multiple = LAG_DERIVED[var]
    return base + multiple * lag


def check_lag(config: ProtocolSettings) -> None:
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


def check_relations(config: ProtocolSettings) -> None:
    """The protocol's settings that contradict each other (SYNC_LAG's bounds: :func:`check_lag`)."""
    for var, folder, what in (
        ("SWARM_LOCAL_DIR", config.local_dir, "its identities and their locks, and restored checkpoints"),
        ("TRACKING_DIR", config.tracking_dir, "its tracker runs"),
        ("COORDINATOR_KEY_FILE", config.coordinator_key_file, "its private key, which every participant could read"),
    ):
        if folder and inside_shared_folder(folder, config.gdrive_path):
            raise ConfigError(
                var,
                folder,
                f"it is inside the shared folder GDRIVE_PATH={config.gdrive_path!r}, where every participant can "
                f"write, and this node writes {what} there in place: set {var} to a folder outside GDRIVE_PATH "
                "(unset: the default, under ~/.cache/swarm-gdrive)",
            )
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
    if config.rollout_archive_old and not config.rollout_cleanup_enabled:
        raise ConfigError(
            "ROLLOUT_ARCHIVE_OLD", "true", "archiving happens during cleanup: also set ROLLOUT_CLEANUP_ENABLED=true"
        )
