"""When a stopped worker checkpoints before it exits: grpo_workload.stop_checkpoint_due."""

from __future__ import annotations

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.training.grpo_workload import stop_checkpoint_due


@pytest.mark.parametrize(
    ("trained", "saved", "age_s", "due"),
    [
        (None, None, None, False),  # it trained nothing (stopped while joining, or restored and stopped)
        (13, None, None, True),  # trained rounds, no checkpoint written by this process: the round 13
        (13, 9, 600.0, True),  # the latest checkpoint is of an older round and old enough
        (13, 9, 30.0, False),  # ... younger than a minute: not written again so soon
        (13, 13, 600.0, False),  # the latest checkpoint holds the round already
        (13, 12, 60.0, True),  # exactly the minimum is old enough
    ],
)
def test_a_stop_checkpoints_the_last_round_trained_unless_the_latest_is_younger_than_a_minute(
    trained, saved, age_s, due, tmp_path
):
    minimum = from_env({"GDRIVE_PATH": str(tmp_path)}).stop_checkpoint_min_seconds
    assert minimum == 60.0  # the default: a minute
    assert stop_checkpoint_due(trained, saved, age_s, minimum) is due
    assert stop_checkpoint_due(trained, saved, age_s, 0.0) is (trained is not None and trained != saved)
