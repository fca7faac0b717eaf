"""Asynchronous rounds (ROUND_MODE=async, issue #28): the real coordinator and workers as threads on a local folder,
synthetic workload. Each worker plays every one of its rounds once without waiting on another node, the slow
worker's groups reach the fast one, the coordinator finishes the experiment when the workers are done and its stop
reaches them, and the synchronous default writes the state it always did."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.coordinator import Coordinator, ExperimentMismatchError
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    RewardRecord,
    StateRecord,
    decode,
    decode_lines,
)
from swarm_gdrive.protocol.workload import SyntheticWorkload
from swarm_gdrive.storage import LocalStorage

pytestmark = pytest.mark.integration
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import Node, fast_env, run_threads  # noqa: E402

LAYOUT = Layout("async")


def env_for(folder: Path, **extra: object) -> dict[str, str]:
    return fast_env(folder, "async", **extra)


def start(env: dict[str, str], workers: dict[str, dict[str, str]], node: type[Node] = Node) -> list[Node]:
    """An asynchronous coordinator ``coord`` and the ``workers`` (each with its own extra settings), started. Only
    the coordinator is given ROUND_MODE=async: the workers follow the experiment's mode."""
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "async"})]
    nodes += [node({**env, "NODE_ROLE": "worker", "NODE_ID": w, **extra}) for w, extra in workers.items()]
    for n in nodes:
        n.start()
    return nodes


def join(nodes: list[Node], timeout: float = 120) -> list[int | None]:
    for n in nodes:
        n.join(timeout)
    return [n.code for n in nodes]


def state_of(folder: Path) -> StateRecord:
    return decode((folder / LAYOUT.state_file).read_bytes(), StateRecord)


def events_of(folder: Path, node: str) -> list[EventRecord]:
    events, problems = decode_lines((folder / LAYOUT.events_file(node)).read_bytes(), EventRecord)
    assert not problems
    return events


def stage_rounds(folder: Path, node: str) -> list[int]:
    """The round of each stage metric line of ``node``, in the order written (one stage a round here)."""
    metrics, problems = decode_lines((folder / LAYOUT.metrics_file(node)).read_bytes(), MetricRecord)
    assert not problems
    return [m.round for m in metrics if "swarm/external_used" in m.values]


def rewarded(folder: Path, node: str) -> list[int]:
    """The rounds ``node`` has submitted a reward for, from the folder."""
    found = (folder / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{node}.json")
    return sorted(decode(p.read_bytes(), RewardRecord).round for p in found)


def test_an_async_swarm_plays_every_round_of_every_worker_once_and_finishes(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="swarm_gdrive.protocol.worker")
    rounds = 6
    env = env_for(tmp_path, MAX_ROUNDS=rounds, MIN_WORKERS=3, NUM_TRANSPLANT_TREES=2, SYNTHETIC_STEP_SECONDS=0.05)
    # w1 and w2 are given ROUND_MODE=sync, w3 keeps the default (auto): all three follow the experiment's mode.
    nodes = start(env, {"w1": {"ROUND_MODE": "sync"}, "w2": {"ROUND_MODE": "sync"}, "w3": {}})

    assert join(nodes) == [0, 0, 0, 0]

    state = state_of(tmp_path)
    assert (state.status, state.round, state.mode, state.advance_reason) == ("finished", rounds, "async", "finished")
    assert b'"mode":"async"' in (tmp_path / LAYOUT.state_file).read_bytes()
    for w in ("w1", "w2", "w3"):
        assert stage_rounds(tmp_path, w) == list(range(rounds)), w  # each round once, in order, none skipped
        assert rewarded(tmp_path, w) == list(range(rounds)), w
        done = [e for e in events_of(tmp_path, w) if e.event == "rounds_completed"]
        assert len(done) == 1 and done[0].data["max_rounds"] == rounds
        assert not any(e.event in ("round_skipped", "worker_gave_up") for e in events_of(tmp_path, w))
    # The workers given ROUND_MODE=sync follow the experiment's mode and say so once each; auto says nothing.
    followed = [r for r in caplog.records if "plays asynchronous rounds" in r.getMessage()]
    assert len(followed) == 2 and all("ROUND_MODE=sync" in r.getMessage() for r in followed)
    coordinator = events_of(tmp_path, "coord")
    assert sorted(e.data["node"] for e in coordinator if e.event == "worker_completed") == ["w1", "w2", "w3"]
    assert [e.event for e in coordinator if e.event in ("round_advanced", "experiment_finished")] == [
        "experiment_finished"
    ]


def test_a_worker_back_after_an_async_run_ended_without_it_says_which_rounds_it_did_not_play(tmp_path):
    """An async run ends once the live workers are done, without a worker that is down; that one, back, finds the
    experiment finished: it exits 0 and logs ``round_skipped`` for the rounds it never played."""
    env = env_for(tmp_path, MAX_ROUNDS=3, MIN_WORKERS=2, SYNTHETIC_STEP_SECONDS=0.02)
    assert join(start(env, {"w1": {}, "w2": {}})) == [0, 0, 0]
    late = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w3"})
    late.start()
    late.join(60)
    assert late.code == 0
    skipped = [e for e in events_of(tmp_path, "w3") if e.event == "round_skipped"]
    assert [(e.data["skipped_from"], e.data["skipped_to"]) for e in skipped] == [(0, 2)]
    assert skipped[0].message == "the experiment finished before rounds 0..2 of this worker"
    assert rewarded(tmp_path, "w3") == []


def test_the_fast_worker_never_waits_for_the_slow_one_and_takes_its_groups(tmp_path):
    """A worker with 0.5 s of compute a stage beside one with 3 s: the fast one plays all its rounds while the
    slow one is still in its first ones, and trains on the slow one's groups, recorded with their staleness. (The
    fast worker's rounds last longer than the pickup reuses a listing, 2 s: with 0.2 s a round it could play them
    all on one listing made before the slow worker's first batch.)"""
    rounds = 5
    env = env_for(tmp_path, MAX_ROUNDS=rounds, MIN_WORKERS=2, NUM_TRANSPLANT_TREES=1)
    nodes = start(env, {"fast": {"SYNTHETIC_STEP_SECONDS": "0.5"}, "slow": {"SYNTHETIC_STEP_SECONDS": "3"}})
    coordinator, fast, slow = nodes

    fast.join(60)
    slow_rounds_then = rewarded(tmp_path, "slow")
    assert fast.code == 0 and slow.is_alive()
    assert len(slow_rounds_then) <= 2, slow_rounds_then  # the fast worker did not wait for the slow one's rounds
    assert join(nodes) == [0, 0, 0]

    assert stage_rounds(tmp_path, "fast") == list(range(rounds))
    assert stage_rounds(tmp_path, "slow") == list(range(rounds))
    taken = [e for e in events_of(tmp_path, "fast") if e.event == "externals_taken"]
    from_slow = [
        (source_round, staleness)
        for e in taken
        for source, source_round, staleness in zip(
            e.data["sources"], e.data["source_rounds"], e.data["staleness_rounds"], strict=True
        )
        if source == "slow"
    ]
    assert from_slow, [e.data for e in taken]
    assert all(r <= max(slow_rounds_then, default=0) + 1 for r, _ in from_slow)
    # The slow worker's batch stays the freshest it has while it trains: later fast rounds take the rest of its
    # groups, and never one twice.
    keys = [
        (s, r, g)
        for e in taken
        for s, r, g in zip(e.data["sources"], e.data["source_rounds"], e.data["group_ids"], strict=True)
    ]
    assert len(keys) == len(set(keys))
    metrics, _ = decode_lines((tmp_path / LAYOUT.metrics_file("fast")).read_bytes(), MetricRecord)
    with_age = [m.values for m in metrics if "swarm/external_age_s_max" in m.values]
    assert len(with_age) == len(taken)
    assert all(v["swarm/external_used"] >= 1 and v["swarm/external_age_s_max"] >= 0 for v in with_age)


class Keeping(Node):
    """A worker whose stand-in workload says it keeps a stop checkpoint of the last round it ended."""

    def make_workload(self) -> SyntheticWorkload:
        class Workload(SyntheticWorkload):
            stateless = False
            ended: int | None = None

            def end_round(self, round_: int, final: bool) -> dict[str, float]:
                self.ended = round_
                return {}

            def checkpoint_on_stop(self) -> int | None:
                return self.ended

        return Workload(
            self.config.num_train_samples, self.config.num_generations, self.config.synthetic_step_seconds, self.stop
        )


def test_the_coordinators_stop_reaches_async_workers_and_a_restarted_swarm_plays_on_from_where_each_was(tmp_path):
    rounds = 30
    env = env_for(tmp_path, MAX_ROUNDS=rounds, MIN_WORKERS=2, NUM_TRANSPLANT_TREES=1, SYNTHETIC_STEP_SECONDS=0.2)
    nodes = start(env, {"w1": {}, "w2": {}}, node=Keeping)
    deadline = time.monotonic() + 60
    while 2 not in rewarded(tmp_path, "w1") and time.monotonic() < deadline:
        time.sleep(0.05)
    nodes[0].stop.set()

    assert join(nodes) == [0, 0, 0]
    state = state_of(tmp_path)
    assert (state.status, state.mode) == ("stopped", "async")
    played = {}
    for w in ("w1", "w2"):
        events = events_of(tmp_path, w)
        stopped = [e for e in events if e.event == "coordinator_stopped"]
        assert len(stopped) == 1 and "coordinator coord stopped the experiment" in stopped[0].message
        played[w] = rewarded(tmp_path, w)
        assert played[w] == list(range(len(played[w]))) and len(played[w]) < rounds
        saved = [e for e in events if e.event == "checkpoint_on_stop"]
        assert [e.data["checkpoint_round"] for e in saved] == [played[w][-1]]

    # Started again, the coordinator keeps the run and its mode; each worker goes on after its last round.
    again = start(env, {"w1": {}, "w2": {}})
    assert join(again) == [0, 0, 0]
    state = state_of(tmp_path)
    assert (state.status, state.mode, state.round) == ("finished", "async", rounds)
    for w in ("w1", "w2"):
        assert stage_rounds(tmp_path, w) == list(range(rounds)), w  # nothing played twice, nothing skipped
        assert not any(e.event == "progress_reconciled" for e in events_of(tmp_path, w))
    resumed = [e for e in events_of(tmp_path, "coord") if e.event == "coordinator_resumed"]
    assert len(resumed) == 1


def test_a_coordinator_restarted_with_the_other_round_mode_refuses_the_experiment(tmp_path):
    env = env_for(tmp_path, MAX_ROUNDS=2, MIN_WORKERS=1)
    assert join(start(env, {"w1": {}})) == [0, 0]

    config = from_env({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "sync"})
    coordinator = Coordinator(config, LocalStorage(config.gdrive_path), "coord", threading.Event())
    with pytest.raises(ExperimentMismatchError) as refused:
        coordinator.open_experiment()
    assert "ROUND_MODE='async' (now 'sync')" in str(refused.value)
    assert "RESET_EXPERIMENT=true" in str(refused.value)
    assert state_of(tmp_path).mode == "async"  # nothing written


def test_round_mode_auto_resumes_an_experiment_in_its_mode_and_picks_one_for_a_new_one_by_store_and_lag(
    tmp_path, caplog
):
    """ROUND_MODE=auto (the default) never refuses an experiment for its mode: it resumes it in the mode it has. A
    new experiment gets sync on a folder without lag, async on one that lags (SYNC_LAG > 0)."""
    caplog.set_level(logging.INFO, logger="swarm_gdrive.protocol.coordinator")
    env = env_for(tmp_path, MAX_ROUNDS=2, MIN_WORKERS=1)
    assert join(start(env, {"w1": {}})) == [0, 0]  # an async experiment (its coordinator had ROUND_MODE=async)

    config = from_env({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "MAX_ROUNDS": "3"})
    assert config.round_mode == "auto" and config.resolved_round_mode() == "sync"  # what a new one would get here
    coordinator = Coordinator(config, LocalStorage(config.gdrive_path), "coord", threading.Event())
    state = coordinator.open_experiment()  # extended by a round: resumed, in its mode
    assert (state.mode, state.status, coordinator.config.round_mode) == ("async", "running", "async")
    assert "ROUND_MODE=auto: async rounds (the experiment's mode)" in caplog.text

    for lag, mode in (("0", "sync"), ("5", "async")):
        folder = tmp_path / f"new-{lag}"
        folder.mkdir()
        fresh = {**env_for(folder, SYNC_LAG=lag, LIVENESS_TIMEOUT=20), "NODE_ROLE": "coordinator", "NODE_ID": "coord"}
        coordinator = Coordinator(from_env(fresh), LocalStorage(folder), "coord", threading.Event())
        assert coordinator.open_experiment().mode == mode
        assert decode((folder / LAYOUT.experiment_file).read_bytes(), ExperimentRecord).mode == mode
        assert f"ROUND_MODE=auto: {mode} rounds (SYNC_LAG={lag})" in caplog.text


def test_a_coordinator_that_lost_the_state_of_an_async_run_recovers_it_from_the_workers_rewards(tmp_path):
    """The state file gone (a hostile or broken folder): the restarted coordinator resumes the run as running (not
    finished on the newest reward alone, as a synchronous recovery would) and finishes it by the rewards."""
    env = env_for(tmp_path, MAX_ROUNDS=3, MIN_WORKERS=2)
    assert join(start(env, {"w1": {}, "w2": {}})) == [0, 0, 0]
    (tmp_path / LAYOUT.state_file).unlink()
    (tmp_path / LAYOUT.reward_file(2, 0, "w2")).unlink()  # as if w2 had not played its last round yet

    # MIN_WORKERS=1 now: w1 is done, and w2, which exited, is not live: it does not hold the end
    restarted = {**env, "MIN_WORKERS": "1", "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "async"}
    coordinator = Node(restarted)
    coordinator.start()
    coordinator.join(30)
    assert coordinator.code == 0
    state = state_of(tmp_path)
    assert (state.status, state.round, state.mode) == ("finished", 3, "async")
    recovered = [e for e in events_of(tmp_path, "coord") if e.event == "state_recovered"]
    assert len(recovered) == 1 and recovered[0].data["status"] == "running"


def test_the_synchronous_default_writes_no_mode_into_the_state(tmp_path):
    env = env_for(tmp_path, MAX_ROUNDS=2, MIN_WORKERS=1, NUM_TRANSPLANT_TREES=1)
    run_threads(env, 2)
    raw = (tmp_path / LAYOUT.state_file).read_bytes()
    assert b'"mode"' not in raw
    state = decode(raw, StateRecord)
    assert (state.status, state.round, state.mode) == ("finished", 2, "sync")
    assert not any(e.event == "rounds_completed" for e in events_of(tmp_path, "w1"))


@pytest.mark.slow
def test_an_async_swarm_of_real_processes_finishes_with_exit_codes_0(tmp_path):
    """The launcher's path: ROUND_MODE=async set on the coordinator process only; the worker processes follow it."""
    rounds = 4
    env = env_for(tmp_path, MAX_ROUNDS=rounds, MIN_WORKERS=2, NUM_TRANSPLANT_TREES=1, SYNTHETIC_STEP_SECONDS=0.1)
    nodes = [NodeProcess("coord", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "async"})]
    # given ROUND_MODE=sync, so that following the experiment's mode shows in their logs
    nodes += [NodeProcess(w, {**env, "NODE_ROLE": "worker", "NODE_ID": w, "ROUND_MODE": "sync"}) for w in ("w1", "w2")]
    try:
        codes = [n.wait(timeout=120) for n in nodes]
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == [0, 0, 0], [n.lines[-10:] for n in nodes]
    state = state_of(tmp_path)
    assert (state.status, state.round, state.mode) == ("finished", rounds, "async")
    for worker in nodes[1:]:
        assert stage_rounds(tmp_path, worker.name) == list(range(rounds))
        assert any("plays asynchronous rounds" in line for line in worker.lines), worker.lines[-10:]
