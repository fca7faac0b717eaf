"""The coordinator's end of a run and its record of the swarm's progress (issue #28): the deadline in both modes, a
stalled worker, the asynchronous progress (one reward listing a pass, rewards validated as in sync), on pure
decisions and against a real local folder."""

from __future__ import annotations

import threading

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol.coordinator import Coordinator, decide, decide_async
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.progress import SwarmProgress
from swarm_gdrive.protocol.records import (
    EventRecord,
    MetricRecord,
    PeerRecord,
    RewardRecord,
    StateRecord,
    decode,
    decode_lines,
    encode,
)
from swarm_gdrive.storage import LocalStorage

NOW = 1_000_000.0
JOINED = frozenset({"w1", "w2"})


def state(status: str = "running", round_: int = 0, mode: str = "async", max_rounds: int = 5) -> StateRecord:
    return StateRecord(
        experiment="exp",
        run_id="abcdef0123456789",
        round=round_,
        status=status,
        seq=3,
        max_rounds=max_rounds,
        num_stages=1,
        round_opened_at=NOW,
        round_deadline=NOW + 60,
        live_workers=sorted(JOINED),
        coordinator_id="coord",
        updated_at=NOW,
        mode=mode,
    )


# -- pure decisions ------------------------------------------------------------------------


def test_past_the_deadline_an_async_experiment_finishes_at_once_with_its_round_unchanged():
    playing = decide_async(state(), JOINED, JOINED, frozenset(), 60.0, 1, NOW)
    assert playing.state is None  # both still play: no end
    ended = decide_async(state(), JOINED, JOINED, frozenset(), 60.0, 1, NOW, past_deadline=True)
    assert ended.reason == "deadline" and ended.state is not None
    assert (ended.state.status, ended.state.round, ended.state.advance_reason, ended.state.seq) == (
        "finished",
        0,
        "deadline",
        4,
    )
    assert decode(encode(ended.state), StateRecord) == ended.state, "a state the workers accept"
    # waiting for MIN_WORKERS when the deadline passes: finished too (nobody came in time)
    waited = decide_async(state("waiting"), frozenset(), JOINED, frozenset(), 60.0, 2, NOW, past_deadline=True)
    assert (waited.state.status, waited.state.advance_reason) == ("finished", "deadline")
    assert decide_async(state("finished"), JOINED, JOINED, frozenset(), 60.0, 1, NOW, past_deadline=True).state is None


def test_a_stalled_worker_does_not_hold_the_end_of_an_async_experiment():
    done = frozenset({"w1"})
    assert decide_async(state(), JOINED, JOINED, done, 60.0, 1, NOW).state is None  # w2 plays on: wait for it
    ended = decide_async(state(), JOINED, JOINED, done, 60.0, 1, NOW, stalled=frozenset({"w2"}))
    assert (ended.state.status, ended.state.round, ended.reason) == ("finished", 5, "all_done")
    # stalled and none done: no end (the deadline is what ends it)
    assert decide_async(state(), JOINED, JOINED, frozenset(), 60.0, 1, NOW, stalled=JOINED).state is None


def test_past_the_deadline_a_sync_experiment_finishes_when_the_open_round_ends():
    s = state(round_=3, mode="sync", max_rounds=10)
    # the round is not over: the deadline does not cut it short
    assert decide(s, JOINED, frozenset({"w1"}), 10.0, 60.0, 1, NOW, past_deadline=True).state is None
    # every live worker submitted: the round ends and the experiment with it, instead of round 4 opening
    ended = decide(s, JOINED, JOINED, 10.0, 60.0, 1, NOW, past_deadline=True)
    assert (ended.state.status, ended.state.round, ended.state.advance_reason, ended.reason) == (
        "finished",
        4,
        "deadline",
        "deadline",
    )
    # on the interval, likewise
    ended = decide(s, JOINED, frozenset({"w1"}), 60.0, 60.0, 1, NOW, past_deadline=True)
    assert (ended.state.status, ended.state.round) == ("finished", 4)
    # a round held for want of live workers finishes, unplayed, once past the deadline
    assert decide(s, frozenset(), frozenset(), 60.0, 60.0, 1, NOW).state is None
    held = decide(s, frozenset(), frozenset(), 60.0, 60.0, 1, NOW, past_deadline=True)
    assert (held.state.status, held.state.round, held.state.advance_reason) == ("finished", 3, "deadline")
    # the last round ends as it always did (not "deadline")
    last = decide(state(round_=9, mode="sync", max_rounds=10), JOINED, JOINED, 1.0, 60.0, 1, NOW, past_deadline=True)
    assert (last.state.round, last.state.advance_reason) == (10, "finished")


def reward(node: str, round_: int, value: float, run_id: str = "abcdef0123456789") -> RewardRecord:
    return RewardRecord(
        node_id=node,
        run_id=run_id,
        round=round_,
        stage=0,
        reward=value,
        num_local_groups=1,
        num_external_groups=0,
        external_requested=0,
        submitted_at=NOW,
    )


def test_progress_serves_each_worker_in_turn_from_the_round_before_its_record_and_counts_each_reward_once():
    p = SwarmProgress(max_rounds=10)
    rounds: dict[str, int | None] = {"fast": 7, "slow": None}
    both = frozenset({"fast", "slow"})
    assert p.target(both, rounds, both) == 6  # fast: plays 7, so 6 is its newest reward
    assert p.add(6, {"fast": reward("fast", 6, 1.0)}) == []
    assert p.target(both, rounds, both) == 0  # slow's turn: its first round
    p.add(0, {"slow": reward("slow", 0, 0.0), "fast": reward("fast", 0, 0.5)})
    assert p.target(both, rounds, both) == 7  # fast again: the round after its last seen
    p.add(6, {"fast": reward("fast", 6, 1.0)})  # listed again: not counted twice
    assert p.pending == 3
    line = p.line()
    assert line["swarm/rewards_counted"] == 3 and line["swarm/reward_mean"] == pytest.approx(0.5)
    assert (line["swarm/rounds_done_min"], line["swarm/rounds_done_max"]) == (1, 7)
    assert p.line()["swarm/reward_mean"] is None and p.pending == 0  # forgotten once written
    rounds["slow"] = 30  # a record past the last round: its last round, never beyond
    assert p.target({"slow"}, rounds, both) == 9
    assert p.add(9, {"slow": reward("slow", 9, 1.0)}) == ["slow"]
    assert p.target({"slow"}, rounds, both) is None  # done: no listing for it any more


def test_a_worker_no_longer_live_gets_one_listing_for_the_round_its_last_record_names():
    p = SwarmProgress(max_rounds=10)
    rounds: dict[str, int | None] = {"gone": 4, "on": 2}
    assert p.target({"gone", "on"}, rounds, frozenset({"on"})) == 4  # it may have played round 4: looked at once
    assert p.target({"gone", "on"}, rounds, frozenset({"on"})) == 1
    assert p.target({"gone", "on"}, rounds, frozenset({"on"})) == 1  # only the live one now, its reward not in yet
    rounds["gone"] = 5  # back, and further (a record read again)
    assert p.target({"gone", "on"}, rounds, frozenset({"on"})) == 5


# -- against a real folder -----------------------------------------------------------------


def make_coordinator(tmp_path, **extra) -> Coordinator:
    env = {
        "GDRIVE_PATH": str(tmp_path),
        "EXPERIMENT_NAME": "exp",
        "NODE_ROLE": "coordinator",
        "SWARM_LOCAL_DIR": f"{tmp_path}-local",  # beside the shared folder, never in it
        "ROUND_MODE": "async",
        "MAX_ROUNDS": "40",
        "HEARTBEAT_INTERVAL": "1",
        **{k: str(v) for k, v in extra.items()},
    }
    return Coordinator(from_env(env), LocalStorage(tmp_path), "coord", threading.Event())


def beat(tmp_path, run_id: str, node: str, n: int, round_: int | None) -> None:
    record = PeerRecord(
        node_id=node,
        role="worker",
        run_id=run_id,
        registered_at=1.0,
        heartbeat=n,
        heartbeat_at=1.0,
        status="alive",
        round=round_,
    )
    Exchange(LocalStorage(tmp_path), Layout("exp"), node, run_id).write_peer(record)


def events(tmp_path, name: str) -> list[EventRecord]:
    found, problems = decode_lines((tmp_path / Layout("exp").events_file("coord")).read_bytes(), EventRecord)
    assert not problems
    return [e for e in found if e.event == name]


def test_an_async_coordinator_lists_one_reward_folder_a_pass_and_counts_only_valid_rewards(tmp_path):
    c = make_coordinator(tmp_path)
    s = c.open_experiment().model_copy(update={"status": "running"})
    run, layout = s.run_id, Layout("exp")
    for node, played in (("w1", 30), ("w2", 12)):
        beat(tmp_path, run, node, 1, played)
        writer = Exchange(LocalStorage(tmp_path), layout, node, run)
        for round_ in range(played):
            writer.write_reward(reward(node, round_, 1.0 if node == "w1" else 0.0, run))
    beat(tmp_path, run, "w3", 1, 12)  # registered, no reward of its own
    # what must not count: another run's reward, a file whose name is not its node, an oversized one, a stranger's
    Exchange(LocalStorage(tmp_path), layout, "w1", "0123456789abcdef").write_reward(
        reward("w1", 11, 1.0, "0123456789abcdef")
    )
    (tmp_path / layout.reward_file(11, 0, "w3")).write_bytes(
        (tmp_path / layout.reward_file(11, 0, "w2")).read_bytes()  # w2's reward under w3's name
    )
    (tmp_path / layout.reward_file(29, 0, "w2")).write_bytes(b'{"kind":"reward"' + b" " * 10_000_000 + b"}")
    Exchange(LocalStorage(tmp_path), layout, "ghost", run).write_reward(reward("ghost", 29, 1.0, run))
    live = c.observe(0.0)
    assert live == {"w1", "w2", "w3"}

    lists = c.exchange.stats["lists"]
    c.count_progress(s, live)  # w1's turn: round 29, the round before the one its record says it plays
    c.count_progress(s, live)  # w2's turn: round 11, where w1's file is of another run and w3's holds w2's reward
    assert c.exchange.stats["lists"] - lists == 2, "one listing a pass, however many rounds were played"
    assert c.progress.rounds_done == {"w1": 30, "w2": 12}
    line = c.progress.line()
    assert line["swarm/rewards_counted"] == 2 and line["swarm/reward_mean"] == pytest.approx(0.5)
    c.log.flush()
    rejected = sorted(e.data["path"].split("rewards/")[1] for e in events(tmp_path, "file_rejected"))
    assert rejected == ["round_11/stage_0/w1.json", "round_11/stage_0/w3.json", "round_29/stage_0/w2.json"]
    # nothing new: a pass lists one folder still, and downloads nothing
    reads = c.exchange.stats["reads"]
    c.count_progress(s, live)
    assert c.exchange.stats["reads"] == reads


def test_a_live_worker_whose_round_stays_is_reported_stalled_and_no_longer_holds_the_end(tmp_path):
    c = make_coordinator(tmp_path, COORDINATOR_WAIT_TIMEOUT=100, LIVENESS_TIMEOUT=50)
    s = c.open_experiment().model_copy(update={"status": "running"})
    for n, now in enumerate((0.0, 50.0, 99.0, 101.0)):
        beat(tmp_path, s.run_id, "w1", n, n)  # plays on
        beat(tmp_path, s.run_id, "w2", n, 3)  # beats, stays at round 3
        live = c.observe(now)
        stalled = c.stalled_workers(live, now)
    assert live == JOINED and stalled == {"w2"}
    c.log.flush()
    said = events(tmp_path, "worker_stalled")
    assert [(e.data["node"], e.data["stuck_round"], e.level) for e in said] == [("w2", 3, "warning")]
    assert "COORDINATOR_WAIT_TIMEOUT" in said[0].message
    beat(tmp_path, s.run_id, "w2", 9, 4)  # it moves again
    assert c.stalled_workers(c.observe(102.0), 102.0) == frozenset()
    c.log.flush()
    assert [e.data["node"] for e in events(tmp_path, "worker_progressing")] == ["w2"]


def test_a_coordinator_restarted_past_the_deadline_does_not_extend_a_finished_run(tmp_path):
    config = {"ROUND_MODE": "sync", "MAX_ROUNDS": "4"}
    first = make_coordinator(tmp_path, **config)
    s = first.open_experiment()
    Exchange(LocalStorage(tmp_path), Layout("exp"), "w1", s.run_id).write_reward(reward("w1", 1, 1.0, s.run_id))
    first.exchange.write_state(s.model_copy(update={"status": "finished", "round": 2, "seq": 9}))
    # the deadline not reached (or none): a finished run short of MAX_ROUNDS is extended, as before
    again = make_coordinator(tmp_path, **config, EXPERIMENT_DEADLINE_MINUTES=60).open_experiment()
    assert (again.status, again.round) == ("running", 2)
    again_state = again.model_copy(update={"status": "finished", "seq": again.seq + 1})
    first.exchange.write_state(again_state)
    # past it (0.006 s after experiment.json's created_at): the run stays finished; a restart does not extend it
    late = make_coordinator(tmp_path, **config, EXPERIMENT_DEADLINE_MINUTES=0.0001)
    assert late.open_experiment().status == "finished" and late.past_deadline()


def test_a_deadline_metric_line_and_event_name_the_setting(tmp_path):
    """The sync loop's publication of a deadline finish: an experiment_finished event with reason deadline."""
    c = make_coordinator(tmp_path, ROUND_MODE="sync", EXPERIMENT_DEADLINE_MINUTES=5)
    s = c.open_experiment().model_copy(update={"status": "running", "round": 2})
    decision = decide(s, JOINED, JOINED, 1.0, 60.0, 1, NOW, past_deadline=True)
    c._publish(s, decision, JOINED, JOINED, 0.0)
    c.log.flush()
    [finished] = events(tmp_path, "experiment_finished")
    assert finished.data["reason"] == "deadline" and "EXPERIMENT_DEADLINE_MINUTES=5 has passed" in finished.message
    assert "finished after round 2" in finished.message
    metrics, _ = decode_lines((tmp_path / Layout("exp").metrics_file("coord")).read_bytes(), MetricRecord)
    assert metrics[-1].values["swarm/live_workers"] == 2


def test_with_cleanup_the_emptied_rollout_folders_behind_the_slowest_live_worker_are_removed(tmp_path):
    c = make_coordinator(tmp_path, ROLLOUT_CLEANUP_ENABLED="true", ROLLOUT_KEEP_LAST_N_ROUNDS=2)
    s = c.open_experiment()
    for round_ in range(8):
        c.exchange.prepare_round(round_, 1)
    kept = tmp_path / Layout("exp").rollout_file(0, 0, "w2")
    kept.write_bytes(b"{}")  # a file in round 0: its folder is not empty, so it stays
    beat(tmp_path, s.run_id, "w1", 1, 7)
    beat(tmp_path, s.run_id, "w2", 1, 5)  # the slowest: rounds below 5 - 2 go
    c.prune_async(c.observe(0.0))
    left = sorted(p.name for p in (tmp_path / Layout("exp").rollouts_dir).iterdir())
    assert left == ["round_0", "round_3", "round_4", "round_5", "round_6", "round_7"] and kept.exists()


def test_round_folders_are_made_ahead_of_the_newest_round_folder_present_not_only_of_the_peer_records(tmp_path):
    """A beating worker's record is read seldom: a coordinator that made folders only ahead of the records' rounds
    fell behind fast workers, which raced to create each round's folders (on the Drive emulator, 86 folders for 52
    paths in a 6-round run of 16 workers). It keeps ahead of the newest round folder in rewards/ too, and makes
    rounds 0..ROUNDS_AHEAD before it writes the first running state."""
    from swarm_gdrive.protocol.coordinator import ROUNDS_AHEAD

    c = make_coordinator(tmp_path)
    waiting = c.open_experiment()
    layout = Layout("exp")
    c._prepare_async_rounds(waiting, listed=False)  # as the run starts: nothing listed
    for _ in range(4):  # the folders it made itself do not move its lead (it ran away to MAX_ROUNDS once)
        c._prepare_async_rounds(waiting.model_copy(update={"status": "running"}))
    assert sorted(p.name for p in (tmp_path / layout.rewards_dir).iterdir()) == [
        f"round_{r}" for r in range(ROUNDS_AHEAD + 1)
    ]
    running = waiting.model_copy(update={"status": "running"})
    beat(tmp_path, running.run_id, "w1", 1, 1)  # its record says round 1, but it has written round 9 already
    c.observe(0.0)
    (tmp_path / layout.reward_file(9, 0, "w1")).parent.mkdir(parents=True)
    lists = c.exchange.stats["lists"]
    c._prepare_async_rounds(running)
    assert c.exchange.stats["lists"] - lists == 1  # one listing of rewards/ a pass
    for round_ in range(9, 9 + ROUNDS_AHEAD + 1):
        for stage_dir in (layout.rewards_stage_dir(round_, 0), layout.rollouts_stage_dir(round_, 0)):
            assert (tmp_path / stage_dir).is_dir(), stage_dir


def test_a_worker_whose_last_round_was_listed_while_it_played_it_is_counted_done_once_its_reward_appears():
    """The last round listed while the worker still played it (no reward yet), then the worker stops: its reward
    reaches the folder after its stopped record (a lagging folder) or after that listing. Its last round keeps its
    turns until the reward is seen: once counted done, the experiment can finish (it never did, and a coordinator
    whose workers all ended so ran for ever)."""
    p = SwarmProgress(max_rounds=5)
    rounds: dict[str, int | None] = {"w": 4}
    assert p.target({"w"}, rounds, frozenset({"w"})) == 3  # live, playing round 4: the round before
    p.add(3, {"w": reward("w", 3, 1.0)})
    assert p.target({"w"}, rounds, frozenset({"w"})) == 4  # its last round, listed while it plays it: nothing there
    assert p.add(4, {}) == [] and p.done == set()
    for _ in range(3):  # stopped, its reward still on its way: the last round is listed again each turn
        assert p.target({"w"}, rounds, frozenset()) == 4
    assert p.add(4, {"w": reward("w", 4, 1.0)}) == ["w"] and p.done == {"w"}
    assert p.target({"w"}, rounds, frozenset()) is None  # done: no more listings
