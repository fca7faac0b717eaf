"""Clock skew: nodes whose clocks are minutes off. Liveness is judged on the observer's clock, so a node in the
past is not taken for dead, and a node in the future that dies is still dropped after LIVENESS_TIMEOUT; in both
round modes (ROUND_MODE=async: the dead node no longer holds the end of the run, and the age of each group taken
from a peer is measured against the peer's clock, never below 0)."""

from __future__ import annotations

import time

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    Watcher,
    assert_every_round_submitted,
    assert_swarm_finished,
    events,
    faults,
    kill_parked,
    read_record,
    rejections,
    swarm_env,
    wait_until,
)

from swarm_gdrive.protocol.records import PeerRecord, StateRecord

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = ["w1", "w2", "w3"]
SKEW = {"coord": 300.0, "w1": -600.0, "w2": 600.0, "w3": 0.0}
LIVENESS = 4.0


@pytest.mark.parametrize("round_mode", ["sync", "async"])
def test_nodes_minutes_apart_keep_the_round_clock_and_a_dead_future_node_is_dropped_on_time(tmp_path, round_mode):
    folder = tmp_path / "drive"
    folder.mkdir()
    marker = tmp_path / "marker"
    env = swarm_env(folder, MAX_ROUNDS=4, MIN_WORKERS=3, LIVENESS_TIMEOUT=LIVENESS, ROLLOUT_WAIT_TIMEOUT=30)
    extra = {node: faults(clock_skew_s=skew) for node, skew in SKEW.items()}
    # w2, ten minutes in the future, dies for good inside its round-2 update (its rollouts are already out).
    extra["w2"] = faults(clock_skew_s=SKEW["w2"], park={"point": "train", "round": 2, "dir": str(marker)})
    swarm = Swarm(folder, env, WORKERS, extra, round_mode=round_mode)
    watcher = Watcher(folder)
    try:
        watcher.start()
        swarm.start_all()
        wait_until(lambda: len(_peers(folder)) == 4, 60, "every node registered", swarm.procs)
        now, peers = time.time(), _peers(folder)
        kill_parked(swarm, swarm.procs[2], marker)
        killed = time.monotonic()
        # Sync: the round after the one w2 died in opens; async: the run ends (w1 and w3 done, w2 gone).
        wait_until(lambda: _round(folder) >= 3, 60, "round 3 (async: the end)", swarm.procs)
        dropped_after = time.monotonic() - killed
        codes = swarm.wait(timeout=120)
    finally:
        swarm.stop()
        watcher.stop()
    # The skew was real: each node stamps its records with its own clock.
    for node, skew in SKEW.items():
        assert abs(peers[node].heartbeat_at - (now + skew)) < 30, (node, peers[node].heartbeat_at - now)

    assert codes == {"coord": 0, "w1": 0, "w3": 0}, swarm.tails()
    watcher.assert_clean()
    assert_swarm_finished(folder, 4, round_mode)
    for w in ("w1", "w3"):
        assert_every_round_submitted(folder, w, range(4))
    for node in ("coord", "w1", "w3"):
        assert not rejections(folder, node)
    # Rounds 0-1: everyone live (w1, ten minutes behind, was never taken for dead) and everyone submitted.
    # Round 2: w2 died; the coordinator dropped it LIVENESS_TIMEOUT after its heartbeat stopped changing,
    # on its own clock (w2's timestamps, ten minutes ahead, did not keep it alive), and went on at once.
    # Async: w1 and w3 played their rounds without w2; the run ended once w2, never done, was dropped.
    coordinator = events(folder, "coord")
    advanced = [e for e in coordinator if e.event in ("round_advanced", "experiment_finished")]
    if round_mode == "sync":
        assert [(e.data["reason"], e.data["live"], e.data["submitted"]) for e in advanced] == [
            ("all_submitted", 3, 3),
            ("all_submitted", 3, 3),
            ("all_submitted", 2, 2),
            ("all_submitted", 2, 2),
        ]
    else:
        assert [(e.data["reason"], e.data["done"]) for e in advanced] == [("all_done", 2)], advanced
        assert sorted(e.data["node"] for e in coordinator if e.event == "worker_completed") == ["w1", "w3"]
        ages = [
            a for w in ("w1", "w3") for e in events(folder, w) if e.event == "externals_taken" for a in e.data["age_s"]
        ]
        assert ages and min(ages) >= 0, ages
    assert LIVENESS - 1.0 <= dropped_after < LIVENESS + 10, dropped_after


def _peers(folder) -> dict[str, PeerRecord]:
    base = folder / LAYOUT.peers_dir
    return {p.stem: read_record(folder, str(p.relative_to(folder)), PeerRecord) for p in base.glob("*.json")}


def _round(folder) -> int:
    try:
        return read_record(folder, LAYOUT.state_file, StateRecord).round
    except (FileNotFoundError, ValueError):
        return -1
