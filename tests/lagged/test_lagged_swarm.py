"""A coordinator and 3 workers as real processes, each on its own replica of a mount that shows the others' files
1-30 s late (each node its own lag, files out of order, temporaries visible, renames and deletions late: workers
remove their own old rollouts), with
SYNC_LAG declared and every timeout derived from it: every submission is kept and SAPO gets its groups. With the
plain 60/30/120 s instead (SYNC_LAG=0) the same seed closes every round on the deadline and the coordinator ends
without a reward (GDRIVE_IMPLEMENTATION.md §16), so this configuration tells the two apart; it takes about 4 min.

The 2-minute configuration runs as a script (tests/lagged/run_lagged_swarm.py --max-lag 120, figures in
GDRIVE_IMPLEMENTATION.md §16): a round there takes minutes, too long for CI.
"""

from __future__ import annotations

import pytest
from lagged_swarm import COORDINATOR, SwarmSpec, run, spread_lags

from swarm_gdrive.observe.monitor import findings, load, status_table
from swarm_gdrive.storage import LocalStorage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 11
ROUNDS = 3
J = 2
LAGS = spread_lags(3, low=1.0, high=30.0, seed=SEED)  # coordinator and w1 up to 30 s, w2 18.1 s, w3 20.4 s


@pytest.mark.timeout(600)
def test_a_swarm_on_a_lagging_mount_keeps_every_submission_and_feeds_sapo(tmp_path):
    cleanup = {"ROLLOUT_CLEANUP_ENABLED": "true", "ROLLOUT_KEEP_LAST_N_ROUNDS": "1"}  # deletions, seen late
    spec = SwarmSpec(lags=LAGS, seed=SEED, rounds=ROUNDS, transplants=J, step_seconds=1.0, env=cleanup, timeout=480)
    outcome = run(spec, tmp_path / "run")
    figures = outcome.figures()
    context = {k: v for k, v in figures.items() if k != "mount"}
    workers = spec.workers

    assert outcome.codes == {n: 0 for n in [COORDINATOR, *workers]}, context
    assert outcome.state is not None and (outcome.state.status, outcome.state.round) == ("finished", ROUNDS)

    # Every submission kept: no worker fell behind, each wrote every round's reward, and the coordinator's replica
    # held all of them when it exited; it counted every one when its round closed, none on the deadline.
    assert figures["skipped"] == {w: [] for w in workers}, context
    assert figures["rewards_written"] == {w: list(range(ROUNDS)) for w in workers}, context
    assert figures["coordinator_replica_rewards"] == {w: list(range(ROUNDS)) for w in workers}, context
    assert figures["counted_per_round"] == {r: len(workers) for r in range(ROUNDS)}, context
    assert figures["closed_on_deadline"] == 0 and not outcome.events("round_closed_on_deadline"), context

    # SAPO got its external groups: J in most worker-rounds, and none of the gathers gave up on a peer.
    external = outcome.external()
    full = [(r, w) for r, row in external.items() for w, (asked, got) in row.items() if asked == J and got == J]
    assert len(full) >= 0.75 * ROUNDS * len(workers), context
    assert figures["rollout_wait_expired"] == {w: 0 for w in workers}, context

    # The monitor, reading the coordinator's replica, finds nothing missing and shows the groups received.
    snapshot = load(LocalStorage(tmp_path / "run" / "replicas" / COORDINATOR), "lagged")
    codes = {f.code for f in findings(snapshot)}
    assert not codes & {"missing_reward", "sapo_starved", "error_events"}, codes
    assert f"{J}/{J}" in status_table(snapshot).split("external groups received/asked")[1]

    # The double did lag: each reader saw changes up to near its bound, out of order, under temporary names first.
    mount = figures["mount"]
    assert not mount["errors"], mount["errors"]
    for node, seen in mount["per_destination"].items():
        assert seen["delay_max"] >= 0.6 * LAGS[node].high and seen["delay_max"] <= LAGS[node].high + 1, (node, seen)
    assert mount["temporaries_shown"] > 100 and mount["reordered"] > 10, mount
    # Each worker removed its round-0 rollouts after round 1, a round before anyone ended: all 3 x 3 seen late.
    assert mount["deletions_delivered"] >= len(workers) * len(workers), mount
    assert not list((tmp_path / "run" / "replicas" / COORDINATOR).glob("experiments/lagged/rollouts/round_0/*/*.json"))
    assert mount["outcomes"].get("superseded", 0) > 0, mount  # heartbeats and logs overtaken by newer versions


ASYNC_ROUNDS = 12


@pytest.mark.timeout(300)
def test_an_async_swarm_on_a_lagging_mount_plays_every_round_without_waiting_for_the_lag(tmp_path):
    """ROUND_MODE=async on the coordinator, the same mount (1-30 s late): each worker plays its own rounds back to
    back, each far shorter than the lag, none lost or played twice; the groups it takes from peers are recorded with
    their age and staleness; the coordinator sees every worker done and finishes the run."""
    spec = SwarmSpec(
        lags=LAGS, seed=SEED, rounds=ASYNC_ROUNDS, transplants=J, step_seconds=1.0, round_mode="async", timeout=240
    )
    outcome = run(spec, tmp_path / "run")
    figures = outcome.figures()
    context = {k: v for k, v in figures.items() if k != "mount"}
    workers = spec.workers

    assert outcome.codes == {n: 0 for n in [COORDINATOR, *workers]}, context
    assert outcome.state is not None and outcome.mode == "async", context
    assert (outcome.state.status, outcome.state.round, outcome.state.advance_reason) == (
        "finished",
        ASYNC_ROUNDS,
        "finished",
    )
    # Each worker played each of its rounds once, in order, and ended on its own after the last.
    assert figures["rewards_written"] == {w: list(range(ASYNC_ROUNDS)) for w in workers}, context
    assert figures["skipped"] == {w: [] for w in workers}, context
    assert outcome.stages_played() == {w: list(range(ASYNC_ROUNDS)) for w in workers}, context
    for w in workers:
        done = outcome.events("rounds_completed", w)
        assert len(done) == 1 and done[0].data["max_rounds"] == ASYNC_ROUNDS, (w, done)
    # The coordinator saw every worker's last reward through its own lag, and closed no round of its own.
    assert figures["workers_done"] == workers, context
    assert {w: ASYNC_ROUNDS - 1 in rounds for w, rounds in outcome.coordinator_has.items()} == dict.fromkeys(
        workers, True
    )
    finished = outcome.events("experiment_finished")
    assert [(e.data["reason"], e.data["done"]) for e in finished] == [("all_done", len(workers))], context
    assert not outcome.events("round_advanced") and figures["counted_per_round"] == {}, context

    # No worker round waited for the lag: each took a few seconds where a peer's file takes up to 30 s to arrive.
    slowest = max(figures["worker_round_seconds_max"].values())
    assert slowest < LAGS["w1"].high / 3, context
    assert figures["rollout_wait_expired"] == {w: 0 for w in workers}, context

    # The groups taken from peers: only other workers', each once, never more than J a round, age and staleness
    # recorded; once the lag had let the peers' files through, groups did arrive.
    taken = outcome.taken()
    for w, groups in taken.items():
        keys = [(g["source"], g["source_round"], g["group_id"]) for g in groups]
        assert len(keys) == len(set(keys)), (w, groups)
        assert all(g["source"] in workers and g["source"] != w for g in groups), (w, groups)
        assert all(g["age_s"] >= 0 and g["staleness_rounds"] >= 0 for g in groups), (w, groups)
        per_round = {r: sum(1 for g in groups if g["round"] == r) for r in range(ASYNC_ROUNDS)}
        got = {r: rec.num_external_groups for r, rec in outcome.rewards[w].items()}
        assert per_round == got and max(got.values()) <= J, (w, per_round, got)
    assert figures["externals_taken"] > 0, context

    mount = figures["mount"]
    assert not mount["errors"], mount["errors"]
    assert mount["temporaries_shown"] > 0 and mount["reordered"] > 0, mount
