"""SIGKILL of a worker and of the coordinator at precise points of a round (mid generation, mid publish,
mid update, mid submit, mid log flush, mid state write), each restarted with the same identity; a few of them in
the asynchronous mode too (ROUND_MODE=async, GDRIVE_IMPLEMENTATION.md §5.10), where the other workers play on
while the victim is down and the coordinator writes its state only at the start and at the finish."""

from __future__ import annotations

import pytest
from trials import ROUNDS, run_kill_trial

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    ("point", "round_", "publish", "round_mode"),
    [
        ("generate", 1, "generation", "sync"),
        ("publish", 1, "stage", "sync"),
        ("train", 2, "stage", "sync"),
        ("submit", 0, "stage", "sync"),
        ("flush", 1, "stage", "sync"),
        ("random", 1, "round", "sync"),
        ("publish", 1, "stage", "async"),
        ("random", 1, "round", "async"),
    ],
)
def test_a_worker_killed_mid_round_restarts_and_nothing_is_lost(tmp_path, point, round_, publish, round_mode):
    result = run_kill_trial(tmp_path, "w3", point, round_, publish, round_mode=round_mode)
    assert result.lost == 0 and result.resumed_at is not None


@pytest.mark.parametrize(
    ("point", "round_", "round_mode"),
    [
        ("state", 2, "sync"),
        ("state", 4, "sync"),
        ("flush", 1, "sync"),
        ("random", 1, "sync"),
        ("state", ROUNDS, "async"),  # mid the finishing write: the restarted coordinator finishes the run
        ("random", 1, "async"),
    ],
)
def test_the_coordinator_killed_mid_write_resumes_its_round(tmp_path, point, round_, round_mode):
    result = run_kill_trial(tmp_path, "coord", point, round_, round_mode=round_mode)
    assert result.lost == 0
