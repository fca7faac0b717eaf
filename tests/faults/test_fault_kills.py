"""SIGKILL of a worker and of the coordinator at precise points of a round (mid generation, mid publish,
mid update, mid submit, mid log flush, mid state write), each restarted with the same identity."""

from __future__ import annotations

import pytest
from trials import run_kill_trial

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    ("point", "round_", "publish"),
    [
        ("generate", 1, "generation"),
        ("publish", 1, "stage"),
        ("train", 2, "stage"),
        ("submit", 0, "stage"),
        ("flush", 1, "stage"),
        ("random", 1, "round"),
    ],
)
def test_a_worker_killed_mid_round_restarts_and_nothing_is_lost(tmp_path, point, round_, publish):
    result = run_kill_trial(tmp_path, "w3", point, round_, publish)
    assert result.lost == 0 and result.resumed_at is not None


@pytest.mark.parametrize(("point", "round_"), [("state", 2), ("state", 4), ("flush", 1), ("random", 1)])
def test_the_coordinator_killed_mid_write_resumes_its_round(tmp_path, point, round_):
    result = run_kill_trial(tmp_path, "coord", point, round_)
    assert result.lost == 0
