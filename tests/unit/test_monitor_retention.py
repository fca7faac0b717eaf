"""missing_rollouts under retention on a mount that syncs late: removals of each worker's oldest rounds arrive at
different times, which is not a fault; a gap in a worker's rounds is."""

from __future__ import annotations

import pandas as pd

from swarm_gdrive.observe.monitor import (
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    METRIC_COLUMNS,
    PEER_COLUMNS,
    REWARD_COLUMNS,
    ROLLOUT_COLUMNS,
    STATE_COLUMNS,
    Snapshot,
    findings,
)


def snapshot(rollout_rounds: dict[str, list[int]], rounds: int = 4) -> Snapshot:
    rewards = [
        {
            "node": n,
            "round": r,
            "stage": 0,
            "reward": 0.5,
            "local_groups": 4,
            "external_groups": 1,
            "external_requested": 1,
        }
        for n in rollout_rounds
        for r in range(rounds)
    ]
    rollouts = [
        {"round": r, "stage": 0, "node": n, "groups": 4, "bytes": 100} for n, rs in rollout_rounds.items() for r in rs
    ]
    return Snapshot(
        experiment="exp",
        now=100.0,
        state=pd.DataFrame(columns=STATE_COLUMNS),
        peers=pd.DataFrame(columns=PEER_COLUMNS),
        rewards=pd.DataFrame(rewards, columns=REWARD_COLUMNS),
        rollouts_per_round=pd.DataFrame(rollouts, columns=ROLLOUT_COLUMNS),
        evals=pd.DataFrame(columns=EVAL_COLUMNS),
        events=pd.DataFrame(columns=EVENT_COLUMNS),
        metrics=pd.DataFrame(columns=METRIC_COLUMNS),
        config={"num_transplant_trees": 1},
    )


def missing(snap: Snapshot) -> list[str]:
    return [f.message for f in findings(snap) if f.code == "missing_rollouts"]


def test_removals_of_the_oldest_rounds_arriving_at_different_times_are_not_a_fault():
    # w1's removal of round 1 has reached this replica, w2's and w3's not yet (KEEP_LAST_N_ROUNDS=2).
    snap = snapshot({"w1": [2, 3], "w2": [1, 2, 3], "w3": [0, 1, 2, 3]})
    assert missing(snap) == []


def test_a_gap_in_a_workers_rounds_is_still_reported():
    snap = snapshot({"w1": [0, 1, 3], "w2": [0, 1, 2, 3]})
    assert missing(snap) == ["worker w1: submitted rewards but shared no valid rollouts in round(s) 2"]


def test_a_worker_with_rewards_and_no_rollouts_at_all_is_reported():
    snap = snapshot({"w1": [], "w2": [0, 1, 2, 3]})
    assert missing(snap) == ["worker w1: submitted rewards but shared no valid rollouts in round(s) 0, 1, 2, 3"]
