"""Coordinator decisions on a fake clock, and resume/refusal against a real local folder."""

from __future__ import annotations

import random
import threading

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol.coordinator import Coordinator, ExperimentMismatchError, Liveness, decide
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import PeerRecord, RewardRecord, StateRecord, decode, encode
from swarm_gdrive.storage import LocalStorage

INTERVAL = 60.0


def state(
    round_: int = 0, status: str = "running", max_rounds: int = 10, live: list[str] | None = None, seq: int = 0
) -> StateRecord:
    return StateRecord(
        experiment="exp",
        run_id="abcdef0123456789",
        round=round_,
        status=status,
        seq=seq,
        max_rounds=max_rounds,
        num_stages=1,
        round_opened_at=0.0,
        round_deadline=INTERVAL,
        live_workers=live or [],
        coordinator_id="coord",
        updated_at=0.0,
    )


def run_decide(s: StateRecord, live: set[str], submitted: set[str], elapsed: float, min_workers: int = 1):
    return decide(s, frozenset(live), frozenset(submitted), elapsed, INTERVAL, min_workers, now=1000.0)


def test_all_live_workers_submitted_advances_at_once():
    d = run_decide(state(3, live=["a", "b"]), {"a", "b"}, {"a", "b"}, elapsed=1.0)
    assert d.state is not None and d.state.round == 4 and d.state.status == "running"
    assert d.reason == "all_submitted" and d.state.advance_reason == "all_submitted"
    assert d.state.seq == 1 and d.restart_timer
    assert d.state.round_deadline == pytest.approx(1000.0 + INTERVAL)


def test_missing_submission_waits_until_interval_then_advances():
    s = state(3, live=["a", "b"])
    assert run_decide(s, {"a", "b"}, {"a"}, elapsed=59.9).state is None
    d = run_decide(s, {"a", "b"}, {"a"}, elapsed=60.0)
    assert d.state is not None and d.state.round == 4 and d.reason == "interval"


def test_dead_worker_holds_round_no_longer_than_interval():
    """Worker b stops heartbeating mid-round: the round closes by the interval at the latest."""
    clock = 0.0
    liveness = Liveness(timeout=120.0)
    s = state(0, live=["a", "b"])
    opened = clock
    advanced_at = None
    for step in range(200):
        clock = step * 0.5
        liveness.observe("a", step, clock)  # a keeps beating
        if clock < 5:
            liveness.observe("b", step, clock)  # b dies at t=5
        d = decide(s, liveness.live(clock), frozenset({"a"}), clock - opened, INTERVAL, 1, clock)
        if d.state is not None and d.state.round == 1:
            advanced_at = clock
            break
    assert advanced_at == pytest.approx(INTERVAL)


def test_dead_worker_past_liveness_timeout_no_longer_blocks():
    liveness = Liveness(timeout=10.0)
    liveness.observe("a", 1, 0.0)
    liveness.observe("b", 1, 0.0)
    liveness.observe("a", 2, 11.0)
    live = liveness.live(12.0)
    assert live == {"a"}
    d = decide(state(2, live=["a", "b"]), live, frozenset({"a"}), 12.0, INTERVAL, 1, 12.0)
    assert d.state is not None and d.state.round == 3 and d.reason == "all_submitted"


def test_liveness_is_judged_by_change_on_observer_clock():
    liveness = Liveness(timeout=10.0)
    liveness.observe("a", "hb-1", 0.0)
    liveness.observe("a", "hb-1", 9.0)  # same marker again: no change
    assert liveness.live(9.5) == {"a"}
    assert liveness.live(10.5) == frozenset()
    liveness.observe("a", "hb-2", 11.0)
    assert liveness.live(11.0) == {"a"}


def test_no_live_worker_holds_the_round_and_restarts_timer():
    d = run_decide(state(5), set(), set(), elapsed=500.0)
    assert d.state is None and d.restart_timer
    assert "holding" in d.reason


def test_waiting_opens_round_zero_once_min_workers_live():
    s = state(0, status="waiting")
    assert run_decide(s, {"a"}, set(), 0.0, min_workers=2).state is None
    d = run_decide(s, {"a", "b"}, set(), 0.0, min_workers=2)
    assert d.state is not None and d.state.status == "running" and d.state.round == 0
    assert d.state.live_workers == ["a", "b"]


def test_finishes_after_max_rounds():
    d = run_decide(state(9, max_rounds=10, live=["a"]), {"a"}, {"a"}, 1.0)
    assert d.state is not None and d.state.status == "finished" and d.state.round == 10
    assert run_decide(d.state, {"a"}, {"a"}, 1.0).state is None


def test_live_worker_change_updates_state_without_advancing():
    d = run_decide(state(2, live=["a"]), {"a", "b"}, set(), 1.0)
    assert d.state is not None and d.state.round == 2 and d.state.live_workers == ["a", "b"]
    assert d.state.seq == 1


def test_round_never_decreases_over_random_histories():
    rng = random.Random(7)
    s = state(0, status="waiting", max_rounds=50)
    previous = s
    for _ in range(2000):
        live = {n for n in "abcd" if rng.random() < 0.7}
        submitted = {n for n in "abcd" if rng.random() < 0.5}
        d = run_decide(s, live, submitted, rng.uniform(0, 120), min_workers=rng.randint(1, 3))
        if d.state is not None:
            assert d.state.round >= s.round
            assert d.state.is_newer_than(previous)
            previous = s = d.state
    assert s.round > 0


# -- against a real folder -----------------------------------------------------------------


def make_config(tmp_path, **extra):
    env = {
        "GDRIVE_PATH": str(tmp_path),
        "EXPERIMENT_NAME": "exp",
        "NODE_ROLE": "coordinator",
        "SWARM_LOCAL_DIR": f"{tmp_path}-local",  # beside the shared folder, never in it
        "COORDINATOR_ROUND_INTERVAL": "60",
    }
    return from_env({**env, **{k: str(v) for k, v in extra.items()}})


def peer(node_id: str, run_id: str, heartbeat: int, role: str = "worker", status: str = "alive") -> PeerRecord:
    return PeerRecord(
        node_id=node_id,
        role=role,
        run_id=run_id,
        registered_at=1.0,
        heartbeat=heartbeat,
        heartbeat_at=1.0,
        status=status,
    )


def submit_round(tmp_path, run_id: str, round_: int, workers: list[str]) -> None:
    ex = Exchange(LocalStorage(tmp_path), Layout("exp"), "writer", run_id)
    for w in workers:
        ex.write_peer(peer(w, run_id, round_ + 1))
        ex.write_reward(
            RewardRecord(
                node_id=w,
                run_id=run_id,
                round=round_,
                stage=0,
                reward=0.5,
                num_local_groups=1,
                num_external_groups=0,
                external_requested=0,
                submitted_at=1.0,
            )
        )


def test_restart_resumes_the_running_round(tmp_path):
    config = make_config(tmp_path)
    first = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event())
    s = first.open_experiment()
    assert (s.round, s.status) == (0, "waiting")
    run_id = s.run_id
    # Drive three rounds through the real loop pieces.
    submit_round(tmp_path, run_id, 0, ["w1"])
    s = decide(s, first.observe(0.0), frozenset({"w1"}), 0.0, 60.0, 1, 1.0).state  # waiting -> running 0
    first.exchange.write_state(s)
    for r in range(3):
        submit_round(tmp_path, run_id, r, ["w1"])
        submitted = frozenset(first.exchange.read_rewards(r, 0))
        s = decide(s, first.observe(float(r)), submitted, 1.0, 60.0, 1, 2.0).state
        first.exchange.write_state(s)
    assert s.round == 3

    second = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event())
    resumed = second.open_experiment()
    assert resumed.round == 3 and resumed.status == "running" and resumed.run_id == run_id
    assert resumed.seq > s.seq and resumed.advance_reason == "resume"
    on_disk = Exchange(LocalStorage(tmp_path), Layout("exp"), "reader").read_state()
    assert on_disk == resumed


def test_changed_configuration_is_refused_with_a_clear_message(tmp_path):
    Coordinator(make_config(tmp_path, SEED=1), LocalStorage(tmp_path), "coord", threading.Event()).open_experiment()
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "experiments").rglob("*"))
    with pytest.raises(ExperimentMismatchError) as info:
        Coordinator(make_config(tmp_path, SEED=2), LocalStorage(tmp_path), "coord", threading.Event()).open_experiment()
    message = str(info.value)
    assert "SEED=1 (now 2)" in message and "RESET_EXPERIMENT=true" in message and "\n" not in message
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "experiments").rglob("*")) == before


def test_reset_archives_the_old_experiment_and_starts_round_zero(tmp_path):
    old = Coordinator(
        make_config(tmp_path, SEED=1), LocalStorage(tmp_path), "coord", threading.Event()
    ).open_experiment()
    new = Coordinator(
        make_config(tmp_path, SEED=2, RESET_EXPERIMENT="true"), LocalStorage(tmp_path), "coord", threading.Event()
    ).open_experiment()
    assert new.run_id != old.run_id and new.round == 0
    archived = list((tmp_path / "archives" / "exp").glob("reset_*/experiment.json"))
    assert len(archived) == 1


def test_max_rounds_can_be_raised_to_extend_a_finished_run(tmp_path):
    config = make_config(tmp_path, MAX_ROUNDS=2)
    c = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event())
    s = c.open_experiment()
    for round_ in (0, 1):  # the rounds it played (a finished state past rounds without rewards is not resumed from)
        submit_round(tmp_path, s.run_id, round_, ["w1"])
    c.exchange.write_state(s.model_copy(update={"status": "finished", "round": 2, "seq": 9}))
    again = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event()).open_experiment()
    assert again.status == "finished"
    extended = Coordinator(
        make_config(tmp_path, MAX_ROUNDS=4), LocalStorage(tmp_path), "coord", threading.Event()
    ).open_experiment()
    assert (extended.status, extended.round, extended.max_rounds) == ("running", 2, 4)
    finished = decode(encode(s.model_copy(update={"status": "finished", "round": 2, "seq": 9})), StateRecord)
    assert extended.is_newer_than(finished), "a reader that saw the finished state follows the extension"


def test_a_reward_from_an_unregistered_node_does_not_count(tmp_path):
    c = Coordinator(make_config(tmp_path), LocalStorage(tmp_path), "coord", threading.Event())
    s = c.open_experiment().model_copy(update={"status": "running"})
    submit_round(tmp_path, s.run_id, 0, ["w1"])
    ghost = Exchange(LocalStorage(tmp_path), Layout("exp"), "ghost", s.run_id)
    ghost.write_reward(
        RewardRecord(
            node_id="ghost",
            run_id=s.run_id,
            round=0,
            stage=0,
            reward=1.0,
            num_local_groups=1,
            num_external_groups=0,
            external_requested=0,
            submitted_at=1.0,
        )
    )
    assert c.observe(0.0) == {"w1"}
    assert c.submissions(s) == {"w1"}
    assert decide(s, frozenset(), frozenset(), 1.0, 60.0, 1, 1.0).state is None


def test_reader_keeps_the_newest_state_when_an_older_one_reappears(tmp_path):
    storage = LocalStorage(tmp_path)
    writer = Exchange(storage, Layout("exp"), "coord")
    reader = Exchange(storage, Layout("exp"), "w1")
    writer.write_state(state(5, seq=10))
    assert reader.read_state().round == 5
    writer.write_state(state(4, seq=8))  # a lagging sync brings back an older file
    assert reader.read_state().round == 5
    writer.write_state(state(6, seq=11))
    assert reader.read_state().round == 6


def test_a_reader_frees_the_batches_of_rounds_it_has_moved_past(tmp_path):
    from swarm_gdrive.protocol.records import RolloutBatch

    run = "abcdef12"
    storage, layout = LocalStorage(tmp_path), Layout("exp")
    writer, reader = Exchange(storage, layout, "w1", run_id=run), Exchange(storage, layout, "w2", run_id=run)
    for round_ in range(20):
        batch = RolloutBatch(node_id="w1", run_id=run, round=round_, stage=0, groups=[], complete=True, created_at=1.0)
        writer.write_rollouts(batch)
        first = reader.read_rollouts(round_, 0)["w1"]
        assert reader.read_rollouts(round_, 0)["w1"] is first  # within a round an unchanged file is not re-read
    assert len(reader._cache) == 1  # not one parsed batch per round of the run


def test_the_coordinator_makes_the_round_folders_two_rounds_ahead_and_none_past_the_last(tmp_path):
    c = Coordinator(
        make_config(tmp_path, MAX_ROUNDS=3, NUM_STAGES=2), LocalStorage(tmp_path), "coord", threading.Event()
    )
    s = c.open_experiment()
    c.prepare_rounds(s)
    layout = Layout("exp")
    for round_ in (0, 1, 2):
        for stage in (0, 1):
            assert (tmp_path / layout.rewards_stage_dir(round_, stage)).is_dir()
            assert (tmp_path / layout.rollouts_stage_dir(round_, stage)).is_dir()
    c.prepare_rounds(s.model_copy(update={"round": 2, "status": "running"}))
    assert not (tmp_path / layout.rewards_dir / "round_3").exists(), "MAX_ROUNDS=3: rounds 0 to 2 only"


def test_a_beating_worker_costs_a_listing_and_a_silent_one_is_read_again(tmp_path):
    config = make_config(tmp_path, HEARTBEAT_INTERVAL=1)
    c = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event())
    s = c.open_experiment()
    writer = Exchange(LocalStorage(tmp_path), Layout("exp"), "w1", s.run_id)

    def beat(n: int, status: str = "alive") -> None:
        writer.write_peer(peer("w1", s.run_id, n, status=status))

    beat(1)
    assert c.observe(0.0, every=False) == {"w1"}  # new: read once
    reads = c.exchange.stats["reads"]
    for n, now in [(2, 0.3), (3, 0.6), (4, 0.9)]:  # beats on: live from the listing alone
        beat(n)
        assert c.observe(now, every=False) == {"w1"}
    assert c.exchange.stats["reads"] == reads
    beat(5, status="stopped")
    assert c.observe(1.0, every=False) == {"w1"}, "just changed: not read yet"
    assert c.observe(2.9, every=False) == {"w1"}, "a beat may come late: not read before two intervals"
    assert c.observe(3.1, every=False) == frozenset(), "silent for two heartbeats: read, and it said stopped"
    assert c.exchange.stats["reads"] == reads + 1


@pytest.mark.drive
def test_workers_joining_together_on_drive_share_one_peers_folder_made_by_the_coordinator(tmp_path):
    """On Drive names are not unique: workers that create ``peers/`` side by side leave one folder each, and every
    listing of it then costs a request per copy. The coordinator makes the shared folders before experiment.json,
    which workers wait for; the same stampede without it (a second experiment) shows the copies it prevents."""
    import os
    import sys

    from swarm_gdrive.storage.drive import DriveStorage

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from drive_emulator import DriveEmulator

    def stampede(emu: DriveEmulator, experiment: str) -> None:
        start = threading.Barrier(12)

        def join(n: int) -> None:
            storage = DriveStorage(emu.root_id, "swarm", service=emu.service())
            start.wait()
            storage.write_bytes(f"experiments/{experiment}/peers/w{n}.json", b"{}")

        threads = [threading.Thread(target=join, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    def copies(emu: DriveEmulator, name: str) -> int:
        return sum(f["name"] == name and not f.get("trashed") for f in emu.files())

    with DriveEmulator() as emu:
        storage = DriveStorage(emu.root_id, "swarm", service=emu.service())
        Coordinator(make_config(tmp_path), storage, "coord", threading.Event()).open_experiment()
        assert copies(emu, "peers") == 1 and copies(emu, "logs") == 1 and copies(emu, "rollouts") == 1
        stampede(emu, "exp")
        assert copies(emu, "peers") == 1
        assert len(DriveStorage(emu.root_id, "swarm", service=emu.service()).list("experiments/exp/peers")) == 12
        before = copies(emu, "peers")
        # No coordinator made this experiment's folders, and Drive's listings lag behind a create (here by 30 s, so
        # that every lookup of the stampede misses the others' copies however loaded the machine: a 50 ms latency
        # alone let a loaded CI machine serialise it).
        emu.list_lag_s = 30
        stampede(emu, "other")
        assert copies(emu, "peers") - before > 1, "the instrument: a stampede into a missing folder duplicates it"


def test_the_coordinator_never_downloads_its_own_peer_file(tmp_path):
    """Its heartbeat rewrites it every HEARTBEAT_INTERVAL; it is not a worker's, so each change would cost a download
    for nothing."""
    c = Coordinator(make_config(tmp_path, HEARTBEAT_INTERVAL=1), LocalStorage(tmp_path), "coord", threading.Event())
    s = c.open_experiment()
    own = Exchange(LocalStorage(tmp_path), Layout("exp"), "coord", s.run_id)
    reads = c.exchange.stats["reads"]
    for n in range(1, 4):
        own.write_peer(peer("coord", s.run_id, n, role="coordinator"))
        assert c.observe(float(n), every=True) == frozenset()
    assert c.exchange.stats["reads"] == reads


def test_a_stopped_coordinator_writes_stopped_and_a_restart_resumes_its_round(tmp_path):
    """Its stop (stop button, SIGTERM) before the end is a state the workers read: ``stopped`` at the same round,
    a newer seq; started again, the coordinator plays that round (round 0 with no reward waits for workers again)."""
    config = make_config(tmp_path)
    stop = threading.Event()
    stop.set()  # stopped at once: while round 0 waits for workers
    assert Coordinator(config, LocalStorage(tmp_path), "coord", stop).run() == 0
    reader = Exchange(LocalStorage(tmp_path), Layout("exp"), "reader")
    stopped = reader.read_state()
    assert (stopped.status, stopped.round, stopped.seq) == ("stopped", 0, 1)  # the waiting state it created: seq 0
    again = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event()).open_experiment()
    assert (again.status, again.round) == ("waiting", 0) and again.seq > stopped.seq

    submit_round(tmp_path, again.run_id, 0, ["w1"])
    submit_round(tmp_path, again.run_id, 1, ["w1"])
    reader.write_state(again.model_copy(update={"status": "stopped", "round": 2, "seq": again.seq + 5}))
    resumed = Coordinator(config, LocalStorage(tmp_path), "coord", threading.Event()).open_experiment()
    assert (resumed.status, resumed.round, resumed.advance_reason) == ("running", 2, "resume")
