"""SAPO starvation in the monitor: external groups received vs asked per worker and round, in the status table
and as findings (a warning when workers were short in a share of their rounds)."""

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
    external_per_round,
    findings,
    status_table,
)


def snapshot(rewards: list[tuple], events: list[str] = ()) -> Snapshot:
    """Rewards as (node, round, stage, got, asked); ``events`` names events of w1."""
    reward_rows = [
        {
            "node": n,
            "round": r,
            "stage": s,
            "reward": 0.5,
            "local_groups": 4,
            "external_groups": got,
            "external_requested": asked,
        }
        for n, r, s, got, asked in rewards
    ]
    peers = [
        {
            "node": n,
            "role": "worker",
            "status": "alive",
            "heartbeat": 3,
            "heartbeat_at": 100.0,
            "round": 3,
            "registered_at": 1.0,
            "alive": True,
        }
        for n in sorted({row[0] for row in rewards})
    ]
    event_rows = [
        {"node": "w1", "ts": float(i), "round": 1, "event": e, "level": "warning", "message": ""}
        for i, e in enumerate(events)
    ]
    return Snapshot(
        experiment="exp",
        now=100.0,
        state=pd.DataFrame(columns=STATE_COLUMNS),
        peers=pd.DataFrame(peers, columns=PEER_COLUMNS),
        rewards=pd.DataFrame(reward_rows, columns=REWARD_COLUMNS),
        rollouts_per_round=pd.DataFrame(columns=ROLLOUT_COLUMNS),
        evals=pd.DataFrame(columns=EVAL_COLUMNS),
        events=pd.DataFrame(event_rows, columns=EVENT_COLUMNS),
        metrics=pd.DataFrame(columns=METRIC_COLUMNS),
    )


def starved() -> list[tuple]:
    """Two workers, four rounds, J = 2: w2 got 1 of 2 in rounds 1 and 2, w1 none in round 2."""
    got = {("w1", 2): 0, ("w2", 1): 1, ("w2", 2): 1}
    return [(w, r, 0, got.get((w, r), 2), 2) for w in ("w1", "w2") for r in range(4)]


def by_code(snap: Snapshot) -> dict:
    return {f.code: f for f in findings(snap)}


def test_the_status_table_shows_external_groups_received_and_asked_per_round():
    text = status_table(snapshot(starved()))
    workers, external = text.split("\n\n")
    assert workers.splitlines()[0].startswith("worker")
    lines = external.splitlines()
    assert lines[0] == "external groups received/asked (J) per round, last 4 round(s); short in 3 of 8 worker-rounds"
    assert lines[1].split() == ["round", "w1", "w2"]
    assert lines[2].split() == ["0", "2/2", "2/2"]
    assert lines[3].split() == ["1", "2/2", "1/2", "!"]
    assert lines[4].split() == ["2", "0/2", "!", "1/2", "!"]


def test_a_shortfall_in_a_share_of_rounds_is_a_warning_naming_counts_and_rounds():
    found = by_code(snapshot(starved()))
    warning = found["sapo_starved"]
    assert warning.severity == "warning"
    assert warning.message.startswith(
        "SAPO got fewer external groups than asked in 3 of 8 worker-rounds "
        "(38%; 12 of 16 groups received; round(s) 1, 2; short rounds by worker: w2 2, w1 1)"
    )
    assert "too few groups with reward variance" in warning.message
    assert findings(snapshot(starved()))[0].code == "sapo_starved"  # warnings come before infos


def test_late_rollouts_point_at_sync_lag():
    found = by_code(snapshot(starved(), events=["rollout_wait_expired", "rollout_wait_expired"]))
    assert "2 gather(s) gave up waiting for peers' rollouts" in found["sapo_starved"].message
    assert "set SYNC_LAG" in found["sapo_starved"].message


def test_a_rare_shortfall_is_an_info_and_none_is_silent():
    rare = [(w, r, 0, 1 if (w, r) == ("w1", 3) else 2, 2) for w in ("w1", "w2") for r in range(4)]
    found = by_code(snapshot(rare))
    assert "sapo_starved" not in found and found["sapo_shortfall"].severity == "info"
    assert "1 of 8 worker-rounds (12%" in found["sapo_shortfall"].message
    full = [(w, r, 0, 2, 2) for w in ("w1", "w2") for r in range(4)]
    assert not {"sapo_starved", "sapo_shortfall"} & set(by_code(snapshot(full)))
    plain_grpo = [(w, r, 0, 0, 0) for w in ("w1", "w2") for r in range(4)]
    assert not {"sapo_starved", "sapo_shortfall"} & set(by_code(snapshot(plain_grpo)))
    assert "external groups" not in status_table(snapshot(plain_grpo))


def test_stages_of_a_round_are_summed():
    table = external_per_round(snapshot([("w1", 0, 0, 2, 2), ("w1", 0, 1, 0, 2)]))
    assert table.to_dict("records") == [{"node": "w1", "round": 0, "asked": 4, "got": 2}]
