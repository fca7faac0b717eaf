"""The worker's state trust rule (protocol/trust.py) and the NODE_ID twin checks (protocol/heartbeat.py), on a local
folder with a clock the test moves."""

from __future__ import annotations

import threading
import time

import pytest

from swarm_gdrive.protocol.exchange import Exchange, RunChangedError
from swarm_gdrive.protocol.heartbeat import Heartbeat, live_twin
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import ExperimentRecord, PeerRecord, RewardRecord, StateRecord
from swarm_gdrive.protocol.trust import StateFollower
from swarm_gdrive.storage import LocalStorage

RUN, OTHER = "a" * 16, "b" * 16
LAYOUT = Layout("exp")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def experiment(run: str = RUN) -> ExperimentRecord:
    return ExperimentRecord(
        experiment="exp", run_id=run, fingerprint="0" * 16, config={}, coordinator_id="coord", created_at=1.0
    )


def state(round_: int, seq: int, **change) -> StateRecord:
    fields = dict(
        experiment="exp",
        run_id=RUN,
        round=round_,
        status="running",
        seq=seq,
        max_rounds=10,
        num_stages=1,
        round_opened_at=1.0,
        round_deadline=2.0,
        coordinator_id="coord",
        updated_at=1.0,
    )
    return StateRecord(**{**fields, **change})


@pytest.fixture
def setup(tmp_path):
    """A coordinator's exchange writing states, and a worker's follower reading them."""
    storage = LocalStorage(tmp_path)
    writer = Exchange(storage, LAYOUT, "coord")
    writer.write_experiment(experiment())
    rejected: list[str] = []
    clock = Clock()
    reader = Exchange(storage, LAYOUT, "w1", run_id=RUN)
    follower = StateFollower(reader, experiment(), None, 2.0, lambda path, why: rejected.append(why), clock)
    return writer, follower, rejected, clock


def test_the_next_round_is_played_at_once_a_jump_only_once_it_stayed(setup):
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 1))
    assert follower.read(0).round == 0
    writer.write_state(state(1, 2))
    assert follower.read(1).round == 1
    writer.write_state(state(5, 9))  # honest too (the worker was away), but it cannot tell: it waits
    assert follower.read(2).round == 1
    clock.now += 1.0
    assert follower.read(2).round == 1
    clock.now += 1.0
    assert follower.read(2).round == 5 and not rejected


def test_a_jump_that_goes_away_within_the_window_is_rejected_and_never_trusted(setup):
    writer, follower, rejected, clock = setup
    writer.write_state(state(3, 4))
    follower.read(0)
    clock.now += 2.5  # the first state of a process: round 3 with no progress yet must stay too
    assert follower.read(0).round == 3
    writer.write_state(state(999, 10**6))
    assert follower.read(4).round == 3
    writer.write_state(state(3, 5))
    clock.now += 5
    assert follower.read(4).seq == 5
    assert rejected == [
        "round 999 seq 1000000: round 999 is more than one round ahead of round 3, and it went away within 2 s "
        "(a forged or transient state): not played"
    ]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"status": "finished", "round": 2}, "it finishes the experiment"),
        ({"status": "stopped"}, "it says the coordinator stopped"),
        ({"round": 2, "max_rounds": 2}, "round 2 is beyond MAX_ROUNDS (2)"),
        ({"coordinator_id": "mallory"}, "written by coordinator 'mallory', not experiment.json's 'coord'"),
    ],
)
def test_a_finish_or_another_coordinator_must_stay_too(setup, change, reason):
    writer, follower, rejected, clock = setup
    writer.write_state(state(1, 2, max_rounds=2))
    clock.now += 2
    follower.read(0)
    clock.now += 2  # the first state of a process is round 1 with no progress yet: it had to stay too
    assert follower.read(0).seq == 2
    writer.write_state(state(1, 3, **change))
    assert follower.read(1).seq == 2
    writer.write_state(state(1, 2, max_rounds=2))  # gone: rejected with its reason
    follower.read(1)
    assert len(rejected) == 1 and reason in rejected[0], rejected
    writer.write_state(state(1, 3, **change))  # back, and this time it stays
    follower.read(1)
    clock.now += 2
    assert follower.read(1).seq == 3
    if "coordinator_id" in change:  # confirmed once, that coordinator's next states are played at once
        writer.write_state(state(2, 4, coordinator_id="mallory"))
        assert follower.read(2).round == 2


def test_another_runs_state_is_rejected_unless_experiment_json_names_that_run(setup):
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 2))
    follower.read(0)
    writer.write_state(state(7, 8, run_id=OTHER))
    assert follower.read(2).round == 0
    assert follower.read(2).round == 0
    assert rejected == [f"run_id {OTHER} is not experiment.json's ({RUN}): not played"]  # said once
    writer.write_experiment(experiment(OTHER))  # a real reset: it ends the worker once both files kept it a while
    assert follower.read(2).round == 0
    clock.now += 1.9
    assert follower.read(2).round == 0
    clock.now += 0.1
    with pytest.raises(RunChangedError):
        follower.read(2)


def test_a_run_change_in_both_files_that_the_coordinator_reverts_within_the_window_ends_no_worker(setup):
    """A participant rewrote experiment.json and the state with another run: the coordinator writes its own back
    (its read-back), and the worker, which saw the other run for less than the window, goes on."""
    writer, follower, _, clock = setup
    writer.write_state(state(0, 2))
    follower.read(0)
    writer.write_experiment(experiment(OTHER))
    writer.write_state(state(0, 3, run_id=OTHER))
    assert follower.read(1).round == 0
    clock.now += 1.5
    writer.write_state(state(0, 4))  # the coordinator's state back first: the other run's window starts again
    assert follower.read(1).round == 0
    writer.write_state(state(0, 5, run_id=OTHER))
    clock.now += 1.5
    assert follower.read(1).round == 0
    writer.write_experiment(experiment())
    clock.now += 1.5
    assert follower.read(1).round == 0  # experiment.json back: rejected, no window
    writer.write_state(state(0, 6))
    clock.now += 5
    assert follower.read(1).seq == 6


def test_a_run_change_whose_state_names_another_coordinator_than_experiment_json_ends_no_worker(setup):
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 2))
    follower.read(0)
    writer.write_experiment(experiment(OTHER))
    writer.write_state(state(0, 3, run_id=OTHER, coordinator_id="mallory"))
    for _ in range(5):
        clock.now += 1.0
        assert follower.read(1).round == 0
    assert rejected == [f"run_id {OTHER} by coordinator 'mallory', but experiment.json names 'coord': not played"]


def test_a_forged_state_that_stayed_is_dropped_once_the_coordinators_own_go_on_behind_it(setup):
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 1))
    follower.read(0)
    writer.write_state(state(1, 2))
    follower.read(1)
    writer.write_state(state(50, 10**6))
    follower.read(2)
    clock.now += 2
    assert follower.read(2).round == 50  # it stayed: played
    writer.write_state(state(2, 3))  # the coordinator's next state: older than the forged one
    assert follower.read(51).round == 50 and not follower.overdue
    clock.now += 2
    assert follower.read(51).round == 2 and follower.overdue
    assert "round 50 seq 1000000, played earlier, was not the coordinator's" in rejected[-1]
    assert follower.next_target(follower.trusted, 51) == 2 and not follower.overdue


def submit(storage: LocalStorage, *rounds: int) -> None:
    for round_ in rounds:
        Exchange(storage, LAYOUT, "w1").write_reward(
            RewardRecord(
                node_id="w1",
                run_id=RUN,
                round=round_,
                stage=0,
                reward=0.5,
                num_local_groups=1,
                num_external_groups=0,
                external_requested=0,
                submitted_at=1.0,
            )
        )


@pytest.mark.parametrize(
    ("last_round", "submitted", "expected"),
    [
        (999, (0, 1, 2, 3, 4, 999), 5),  # an older version stored a forged round: on from the first gap
        (6, (0, 1, 2, 3, 4, 5, 6), 7),  # the coordinator went back to round 4: rounds 4-6 are not played again
    ],
)
def test_progress_ahead_of_the_coordinator_is_reconciled_without_replaying_a_submitted_round(
    tmp_path, last_round, submitted, expected
):
    storage = LocalStorage(tmp_path)
    writer = Exchange(storage, LAYOUT, "coord")
    writer.write_experiment(experiment())
    writer.write_state(state(4, 7))
    submit(storage, *submitted)
    clock = Clock()
    follower = StateFollower(Exchange(storage, LAYOUT, "w1", run_id=RUN), experiment(), last_round, 2.0, clock=clock)
    target = last_round + 1
    follower.read(target)
    assert not follower.overdue
    clock.now += 2
    trusted = follower.read(target)
    assert follower.overdue and trusted.round == 4
    target = follower.next_target(trusted, target)
    assert target == expected
    clock.now += 10  # backed by its own rewards, that progress is not questioned again
    follower.read(target)
    clock.now += 10
    follower.read(target)
    assert not follower.overdue


def peer(registered_at: float, heartbeat: int, status: str = "alive") -> PeerRecord:
    return PeerRecord(
        node_id="w1",
        role="worker",
        run_id=RUN,
        registered_at=registered_at,
        heartbeat=heartbeat,
        heartbeat_at=registered_at,
        status=status,
    )


def test_two_heartbeats_of_one_node_id_see_each_other_and_only_the_later_one_steps_down(tmp_path):
    storage = LocalStorage(tmp_path)
    said: dict[str, list] = {"a": [], "b": []}
    a = Heartbeat(Exchange(storage, LAYOUT, "w1", RUN), "worker", RUN, 60, on_twin=lambda m, s: said["a"].append(s))
    time.sleep(0.01)  # registered_at: b is the later one
    b = Heartbeat(Exchange(storage, LAYOUT, "w1", RUN), "worker", RUN, 60, on_twin=lambda m, s: said["b"].append(s))
    a.beat()
    b.beat()  # sees a's record before its own first write: not yet proof
    a.beat()  # b's registration appeared after a wrote: a says so, and stays
    b.beat()  # a's heartbeat rose: b says so, and steps down
    assert said == {"a": [False], "b": [True]}
    assert b.stepped_down and not a.stepped_down
    before = Exchange(storage, LAYOUT, "w1", RUN).read_peer("w1")
    b.beat()
    b.stop()  # a process that stepped down leaves the file to the other one
    assert Exchange(storage, LAYOUT, "w1", RUN).read_peer("w1") == before


def test_a_killed_predecessors_frozen_record_is_not_a_twin(tmp_path):
    storage = LocalStorage(tmp_path)
    Exchange(storage, LAYOUT, "w1", RUN).write_peer(peer(1.0, 7))
    said = []
    heartbeat = Heartbeat(Exchange(storage, LAYOUT, "w1", RUN), "worker", RUN, 60, on_twin=lambda m, s: said.append(m))
    for _ in range(3):
        heartbeat.beat()
    Exchange(storage, LAYOUT, "w1", RUN).write_peer(peer(1.0, 7))  # a lagging folder delivers the old one again
    heartbeat.beat()
    assert not said and not heartbeat.stepped_down


def test_live_twin_waits_on_an_alive_peer_file_and_says_whether_it_moved(tmp_path):
    storage = LocalStorage(tmp_path)
    exchange = Exchange(storage, LAYOUT, "w1", RUN)
    stop = threading.Event()
    assert live_twin(exchange, 0.05, 0.0, stop) is None  # no file: nothing to wait for
    exchange.write_peer(peer(1.0, 3, status="stopped"))
    assert live_twin(exchange, 0.05, 0.0, stop) is None
    exchange.write_peer(peer(1.0, 3))
    started = time.monotonic()
    assert live_twin(exchange, 0.05, 0.0, stop) is None  # frozen: a killed predecessor
    assert time.monotonic() - started >= 0.1
    beating = threading.Timer(0.03, lambda: exchange.write_peer(peer(1.0, 4)))
    beating.start()
    found = live_twin(exchange, 0.05, 0.0, stop)
    beating.join()
    assert found is not None and "went from heartbeat 3 to 4" in found


def test_a_state_of_the_other_round_mode_is_never_played(setup):
    """A planted state of this run with ``mode: async`` in a synchronous run (experiment.json says sync) is
    rejected however long it stays: it cannot switch the workers into their own rounds (review of issue #28)."""
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 1))
    assert follower.read(0).round == 0
    writer.write_state(state(0, 2, mode="async"))
    for _ in range(3):
        clock.now += 5.0
        assert follower.read(1) == state(0, 1)
    assert rejected and all("mode async is not experiment.json's (sync)" in why for why in rejected)


def test_a_changed_max_rounds_is_played_only_once_it_stayed(setup):
    """MAX_ROUNDS changes only at a coordinator's restart: a state that changes it is confirmed first, so a forged
    ``max_rounds: 1`` shown for a moment does not end an asynchronous worker's rounds."""
    writer, follower, rejected, clock = setup
    writer.write_state(state(0, 1))
    assert follower.read(0).max_rounds == 10
    writer.write_state(state(0, 2, max_rounds=1))
    assert follower.read(0).max_rounds == 10
    writer.write_state(state(0, 3))  # gone before it was confirmed
    clock.now += 5.0
    assert follower.read(0).max_rounds == 10
    writer.write_state(state(0, 4, max_rounds=20))  # an honest extension stays: played once confirmed
    assert follower.read(0).max_rounds == 10
    clock.now += 5.0
    assert follower.read(0).max_rounds == 20
