"""Every path inside the shared folder. Nothing else builds a path by concatenation.

Paths are relative POSIX strings under the storage root (GDRIVE_PATH)::

    experiments/{experiment}/experiment.json
    experiments/{experiment}/state/current_state.json
    experiments/{experiment}/peers/{node_id}.json
    experiments/{experiment}/rewards/round_{R}/stage_{S}/{node_id}.json
    experiments/{experiment}/rollouts/round_{R}/stage_{S}/{node_id}.json
    experiments/{experiment}/checkpoints/{node_id}/round_{R}/
    experiments/{experiment}/logs/{node_id}/metrics.jsonl
    experiments/{experiment}/logs/{node_id}/training_events.jsonl
    archives/{experiment}/...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swarm_gdrive.names import InvalidNameError, validate_name

# Canonical folder names only: ASCII digits, no leading zeros (as _round/_stage build them).
_ROUND = re.compile(r"round_(0|[1-9][0-9]{0,8})")
_STAGE = re.compile(r"stage_(0|[1-9][0-9]{0,3})")
JSON_SUFFIX = ".json"


def parse_round_dir(name: str) -> int | None:
    """``round_12`` -> 12; anything else -> None."""
    match = _ROUND.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_stage_dir(name: str) -> int | None:
    """``stage_0`` -> 0; anything else -> None."""
    match = _STAGE.fullmatch(name)
    return int(match.group(1)) if match else None


def node_id_from_filename(name: str) -> str | None:
    """``worker-1.json`` -> ``worker-1`` if the stem is a valid node id, else None."""
    if not name.endswith(JSON_SUFFIX):
        return None
    stem = name[: -len(JSON_SUFFIX)]
    try:
        return validate_name(stem)
    except InvalidNameError:
        return None


@dataclass(frozen=True)
class Layout:
    """Paths of one experiment, relative to the storage root."""

    experiment: str

    def __post_init__(self) -> None:
        validate_name(self.experiment, "EXPERIMENT_NAME")

    @property
    def root(self) -> str:
        return f"experiments/{self.experiment}"

    @property
    def archive_root(self) -> str:
        return f"archives/{self.experiment}"

    @property
    def experiment_file(self) -> str:
        return f"{self.root}/experiment.json"

    @property
    def state_dir(self) -> str:
        return f"{self.root}/state"

    @property
    def state_file(self) -> str:
        return f"{self.state_dir}/current_state.json"

    @property
    def peers_dir(self) -> str:
        return f"{self.root}/peers"

    def peer_file(self, node_id: str) -> str:
        return f"{self.peers_dir}/{validate_name(node_id, 'node id')}{JSON_SUFFIX}"

    @property
    def rewards_dir(self) -> str:
        return f"{self.root}/rewards"

    def rewards_stage_dir(self, round_: int, stage: int) -> str:
        return f"{self.rewards_dir}/{_round(round_)}/{_stage(stage)}"

    def reward_file(self, round_: int, stage: int, node_id: str) -> str:
        return f"{self.rewards_stage_dir(round_, stage)}/{validate_name(node_id, 'node id')}{JSON_SUFFIX}"

    @property
    def rollouts_dir(self) -> str:
        return f"{self.root}/rollouts"

    def rollouts_round_dir(self, round_: int) -> str:
        return f"{self.rollouts_dir}/{_round(round_)}"

    def rollouts_stage_dir(self, round_: int, stage: int) -> str:
        return f"{self.rollouts_round_dir(round_)}/{_stage(stage)}"

    def rollout_file(self, round_: int, stage: int, node_id: str) -> str:
        return f"{self.rollouts_stage_dir(round_, stage)}/{validate_name(node_id, 'node id')}{JSON_SUFFIX}"

    def archived_rollout_file(self, round_: int, stage: int, node_id: str) -> str:
        node = validate_name(node_id, "node id")
        return f"{self.archive_root}/rollouts/{_round(round_)}/{_stage(stage)}/{node}{JSON_SUFFIX}"

    def reset_archive_dir(self, stamp: str) -> str:
        """Where a reset moves the whole previous experiment folder."""
        return f"{self.archive_root}/reset_{validate_name(stamp, 'reset stamp', lowercase=False)}"

    @property
    def evals_dir(self) -> str:
        return f"{self.root}/evals"

    def eval_file(self, round_: int, node_id: str) -> str:
        return f"{self.evals_dir}/{_round(round_)}/{validate_name(node_id, 'node id')}{JSON_SUFFIX}"

    def checkpoint_dir(self, node_id: str, round_: int) -> str:
        return f"{self.root}/checkpoints/{validate_name(node_id, 'node id')}/{_round(round_)}"

    def logs_dir(self, node_id: str) -> str:
        return f"{self.logs_root}/{validate_name(node_id, 'node id')}"

    @property
    def logs_root(self) -> str:
        return f"{self.root}/logs"

    @property
    def shared_dirs(self) -> list[str]:
        """The folders every node writes into from its first minutes (peer files, logs, round trees): the
        coordinator creates them before experiment.json, so workers, who wait for that file, never create them
        side by side (on Drive, names are not unique: a stampede would leave duplicate folders that every
        listing then has to read)."""
        return [self.state_dir, self.peers_dir, self.logs_root, self.rewards_dir, self.rollouts_dir]

    def metrics_file(self, node_id: str) -> str:
        return f"{self.logs_dir(node_id)}/metrics.jsonl"

    def events_file(self, node_id: str) -> str:
        return f"{self.logs_dir(node_id)}/training_events.jsonl"


def _round(round_: int) -> str:
    if type(round_) is not int or round_ < 0:
        raise ValueError(f"round must be an int >= 0, got {round_!r}")
    return f"round_{round_}"


def _stage(stage: int) -> str:
    if type(stage) is not int or stage < 0:
        raise ValueError(f"stage must be an int >= 0, got {stage!r}")
    return f"stage_{stage}"
