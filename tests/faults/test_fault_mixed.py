"""The randomised mix of issue 14 in CI: a few trials, each a hostile class planted at a random moment of a real swarm
while a random node is SIGKILLed and restarted (trials.run_mixed_trial), two of them in the asynchronous mode; the
long run is ``python tests/faults/run_trials.py --kinds mixed --trials 100 --seed 16`` (and 17)."""

from __future__ import annotations

import pytest
from trials import run_mixed_trial

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    ("cls", "seed", "round_mode"),
    [
        ("forged_state", 1, "sync"),
        ("twin", 2, "sync"),
        ("huge_int:metrics", 3, "sync"),
        ("symlink:events_file", 4, "sync"),
        ("type_confusion:dir_for_reward", 5, "sync"),
        ("bad_manifest", 6, "sync"),
        # Async (ROUND_MODE=async): a forged state the workers read between their own rounds, and a worker's own
        # events log replaced by a link out of the folder while it plays its rounds (the others never wait for it).
        ("forged_state", 7, "async"),
        ("symlink:events_file", 8, "async"),
        # Issue 30: a hard link out of the folder at a node's log, names that are not UTF-8 where readers list, a
        # second coordinator with RESET_EXPERIMENT=true beside the live one (it must exit 2), experiment.json and the
        # state rewritten with another run (signed by nobody: no worker follows it).
        ("hard_link:metrics", 9, "sync"),
        ("hard_link:events", 10, "async"),
        ("names_not_utf8", 11, "sync"),
        ("rival_coordinator", 12, "sync"),
        ("forged_run", 13, "sync"),
    ],
)
def test_a_hostile_class_at_a_random_moment_with_a_kill_costs_nothing(tmp_path, cls, seed, round_mode):
    result = run_mixed_trial(tmp_path, cls, seed, round_mode=round_mode)
    assert result.planted and "not planted" not in result.planted, result.planted
    report = f"{result.planted}; victim {result.victim}: {result}"
    assert not result.crashes, report
    assert result.lost == 0, report
    assert result.outside_bytes == 0, report
    assert not result.early_exits, report
    assert not result.unable_to_restart, report
    assert not result.problems, report
