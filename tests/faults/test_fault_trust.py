"""What a worker believes of the folder (GDRIVE_IMPLEMENTATION.md §5.5, §7): a forged state is never played when the
experiment has a coordinator key, however long it stays, also by a worker restarted meanwhile; in an experiment
created before keys existed one visible for a moment is never played, and one that stays is played but cannot brick
the worker; a poisoned local record is reconciled with the coordinator's state, and a second process with the same
NODE_ID is refused at start or stops once it sees the other."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    assert_every_round_submitted,
    assert_swarm_finished,
    events,
    faults,
    read_record,
    swarm_env,
    wait_until,
)

from swarm_gdrive.protocol.records import ExperimentRecord, StateRecord, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 3


def local_record(folder: Path, node: str) -> dict:
    """The node-local record of ``node`` (beside its identity file, under fast_env's SWARM_LOCAL_DIR)."""
    path = folder.parent / f"{folder.name}-local" / LAYOUT.experiment / "identities" / f"{node}.json"
    return json.loads(path.read_text())


def replace(path: Path, data: bytes) -> None:
    """Atomically, as a writer of the folder would."""
    tmp = path.with_name(".planted.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def forged(real: StateRecord, variant: str) -> StateRecord:
    change = {
        "far_ahead": {"round": 999, "status": "running", "seq": 10**6, "max_rounds": 1000},
        "finished": {"round": ROUNDS, "status": "finished", "seq": 10**6, "advance_reason": "finished"},
        "stopped": {"status": "stopped", "seq": real.seq + 1},
        "other_run": {"run_id": "0123456789abcdef", "status": "running", "seq": real.seq + 1},
        "other_coordinator": {"coordinator_id": "mallory", "status": "running", "seq": real.seq + 1},
    }[variant]
    return real.model_copy(update={**change, "updated_at": time.time()})


def without_key(folder: Path, swarm: Swarm) -> None:
    """Make the swarm's new experiment one created before coordinator keys existed: the coordinator killed once its
    files are there, experiment.json and the state written back without key and signature, its key file and its copy
    of experiment.json removed, and the coordinator started again (it resumes the experiment unsigned)."""
    first = swarm.procs[-1]
    wait_until((folder / LAYOUT.state_file).exists, 60, "the state", swarm.procs)
    first.kill()
    swarm.procs.remove(first)
    experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
    replace(
        folder / LAYOUT.experiment_file, encode(experiment.model_copy(update={"public_key": None, "signature": None}))
    )
    state = read_record(folder, LAYOUT.state_file, StateRecord)
    replace(folder / LAYOUT.state_file, encode(state.model_copy(update={"signature": None})))
    for kept in (folder.parent / f"{folder.name}-local" / LAYOUT.experiment).glob("*.*"):
        kept.unlink()  # coordinator_key.pem and faults.signed-experiment.json
    swarm.start("coord")


def two_workers_waiting(tmp_path: Path, keyed: bool = True, **extra: object) -> tuple[Path, Swarm]:
    """A coordinator waiting for 3 workers, and w1 and w2 joined and polling the state. ``keyed``: the experiment
    has a coordinator key (else :func:`without_key`)."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=3, COORDINATOR_WAIT_TIMEOUT=20, **extra)
    swarm = Swarm(folder, env, ["w1", "w2", "w3"])
    swarm.start("coord")
    if not keyed:
        without_key(folder, swarm)
    swarm.start("w1")
    swarm.start("w2")
    joined = [folder / LAYOUT.peer_file(w) for w in ("w1", "w2")]
    wait_until(lambda: all(p.exists() for p in joined), 60, "w1 and w2 joined", swarm.procs)
    return folder, swarm


def assert_finished_normally(folder: Path, swarm: Swarm, also_played: frozenset[int] = frozenset()) -> None:
    codes = swarm.wait(timeout=120)
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "w3": 0}, swarm.tails()
    assert_swarm_finished(folder, ROUNDS)
    for w in ("w1", "w2", "w3"):
        assert_every_round_submitted(folder, w, range(ROUNDS))
        assert local_record(folder, w)["last_round"] == ROUNDS - 1
    played = {p.name for p in (folder / LAYOUT.rewards_dir).iterdir()}
    assert played == {f"round_{r}" for r in {*range(ROUNDS), *also_played}}, played


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        # "of round 0", or "-1" for a worker that read the forgery before its first trusted state: rejected either way
        ("far_ahead", "round 999 seq 1000000: round 999 is more than one round ahead of round"),
        ("finished", "it finishes the experiment, and it went away"),
        ("stopped", "it says the coordinator stopped, and it went away"),
        ("other_run", "run_id 0123456789abcdef is not experiment.json's"),
        ("other_coordinator", "written by coordinator 'mallory', not experiment.json's 'coord'"),
    ],
)
def test_a_forged_state_visible_for_under_a_second_is_never_played(tmp_path, variant, reason):
    """In an experiment created before coordinator keys existed: the confirm window."""
    folder, swarm = two_workers_waiting(tmp_path, keyed=False)
    try:
        state_file = folder / LAYOUT.state_file
        real = state_file.read_bytes()
        fake = encode(forged(read_record(folder, LAYOUT.state_file, StateRecord), variant))
        # The coordinator paused for the forgery's lifetime: running, it may write its own state back within
        # milliseconds, before a worker has polled, and a worker that never saw the forgery cannot reject it.
        coordinator = swarm.procs[0].proc
        coordinator.send_signal(signal.SIGSTOP)
        try:
            replace(state_file, fake)
            time.sleep(0.6)  # the forgery's lifetime: both workers poll the state at least every 0.5 s
            replace(state_file, real)
        finally:
            coordinator.send_signal(signal.SIGCONT)
        said = f"rejected {LAYOUT.state_file}: "

        def settled() -> bool:  # both rejected it; or (the bug) one acted on it: played it, or exited
            acted = any(p.returncode is not None or any("stage 0: reward" in x for x in p.lines) for p in swarm.procs)
            return acted or all(any(said in x for x in p.lines) for p in swarm.procs[1:3])

        wait_until(settled, 30, "rejections", [])
        swarm.start("w3")
        assert_finished_normally(folder, swarm)
    finally:
        swarm.stop()
    for w in ("w1", "w2"):
        rejected = [e.message for e in events(folder, w) if e.event == "file_rejected"]
        assert rejected and all(m.startswith(LAYOUT.state_file) for m in rejected), rejected
        assert any(reason in m for m in rejected), rejected
        assert not [e for e in events(folder, w) if e.event in ("round_skipped", "progress_reconciled")]


def test_a_forged_state_that_stays_is_played_but_the_worker_returns_to_the_coordinators_rounds(tmp_path):
    """A running coordinator writes its own state back within a HEARTBEAT_INTERVAL, so only while it is down can a
    forgery stay: then it is played (in an experiment created before coordinator keys existed); the restarted
    coordinator does not resume from it (round 50 is beyond MAX_ROUNDS) and the workers return to its rounds."""
    folder, swarm = two_workers_waiting(tmp_path, keyed=False)
    try:
        swarm.procs[0].kill()
        state_file = folder / LAYOUT.state_file
        fake = forged(read_record(folder, LAYOUT.state_file, StateRecord), "far_ahead").model_copy(update={"round": 50})
        replace(state_file, encode(fake))
        played = [folder / LAYOUT.reward_file(50, 0, w) for w in ("w1", "w2")]
        wait_until(lambda: all(p.exists() for p in played), 30, "round 50 played", swarm.procs)
        swarm.start("coord")
        swarm.start("w3")
        assert_finished_normally(folder, swarm, also_played=frozenset({50}))
    finally:
        swarm.stop()
    for w in ("w1", "w2"):
        log = events(folder, w)
        (back,) = [e for e in log if e.event == "progress_reconciled"]
        assert (back.data["from_round"], back.data["to_round"]) == (51, 0), back
        assert any("round 50 seq 1000000, played earlier, was not the coordinator's" in e.message for e in log)


@pytest.mark.parametrize("variant", ["finished", "stopped", "far_ahead", "other_run", "other_coordinator"])
def test_a_forged_state_that_stays_past_the_window_is_never_played_when_the_experiment_has_a_key(tmp_path, variant):
    """The coordinator paused for 6 s (more than twice a worker's confirm window, 2 s): the forged state, unsigned,
    stays all that time; w2 is killed and started again meanwhile. Neither worker plays it nor exits; once the
    coordinator goes on, the experiment ends normally."""
    folder, swarm = two_workers_waiting(tmp_path)
    coordinator, w1, w2 = swarm.procs
    try:
        state_file = folder / LAYOUT.state_file
        real = state_file.read_bytes()
        fake = forged(read_record(folder, LAYOUT.state_file, StateRecord), variant)
        coordinator.proc.send_signal(signal.SIGSTOP)
        try:
            replace(state_file, encode(fake))
            said = "is not signed by the coordinator key this worker pinned"
            wait_until(lambda: any(said in x for x in w1.lines), 30, "w1 rejects it", [])
            w2.kill()
            swarm.procs.remove(w2)
            again = swarm.start("w2")  # its pin is in its node-local record, as before the restart
            wait_until(lambda: any(said in x for x in again.lines), 30, "the restarted w2 rejects it", [])
            time.sleep(max(0.0, 6.0 - 0.5))
            assert w1.returncode is None and again.returncode is None, swarm.tails()
            assert state_file.read_bytes() == encode(fake)  # it stayed
            replace(state_file, real)
        finally:
            coordinator.proc.send_signal(signal.SIGCONT)
        swarm.start("w3")
        codes = swarm.wait(timeout=120)
    finally:
        swarm.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "w3": 0}, swarm.tails()
    assert_swarm_finished(folder, ROUNDS)
    for w in ("w1", "w2", "w3"):
        assert_every_round_submitted(folder, w, range(ROUNDS))
    played = {p.name for p in (folder / LAYOUT.rewards_dir).iterdir()}
    assert played == {f"round_{r}" for r in range(ROUNDS)}, played
    for w in ("w1", "w2"):
        assert not [e for e in events(folder, w) if e.event in ("round_skipped", "progress_reconciled")]
        rejected = [e.message for e in events(folder, w) if e.event == "file_rejected"]
        assert rejected and all("is not signed by the coordinator key" in m for m in rejected), rejected


def test_a_worker_whose_local_record_says_a_round_never_opened_goes_on_with_the_coordinators(tmp_path):
    """An older version stored a forged state's round as last_round: every restart waited for round 1000."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=2, COORDINATOR_WAIT_TIMEOUT=20)
    swarm = Swarm(folder, env, ["w1", "w2"])
    try:
        swarm.start("coord")
        wait_until((folder / LAYOUT.experiment_file).exists, 60, "experiment.json", swarm.procs)
        run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id
        identities = folder.parent / f"{folder.name}-local" / LAYOUT.experiment / "identities"
        identities.mkdir(parents=True, exist_ok=True)
        # Where the versions that stored a forged round kept the record: inside the identity file.
        (identities / "w1.id").write_text(json.dumps({"role": "worker", "run_id": run_id, "last_round": 999}))
        swarm.start("w1")
        swarm.start("w2")
        codes = swarm.wait(timeout=120)
    finally:
        swarm.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
    assert_every_round_submitted(folder, "w1", range(ROUNDS))
    (back,) = [e for e in events(folder, "w1") if e.event == "progress_reconciled"]
    assert (back.data["from_round"], back.data["to_round"]) == (1000, 0), back
    assert local_record(folder, "w1")["last_round"] == ROUNDS - 1


def test_a_second_process_with_a_running_nodes_id_refuses_to_start(tmp_path):
    """Another machine (here: another SWARM_LOCAL_DIR, so the local lock cannot see it) with NODE_ID=w1."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=6, MIN_WORKERS=2)
    # w1 waits in round 1 (its heartbeat beating) until the twin is done: on a loaded machine the twin's start
    # alone can outlast the 6 rounds, and a twin of a finished experiment has nobody to collide with.
    parked = tmp_path / "parked"
    park = {"point": "generate", "round": 1, "dir": str(parked), "until": "released"}
    swarm = Swarm(folder, env, ["w1", "w2"], extra={"w1": faults(park=park)})
    try:
        swarm.start_all()
        wait_until((parked / "parked").exists, 60, "w1 in round 1", swarm.procs)
        twin = swarm.start("twin", node="w1", SWARM_LOCAL_DIR=str(tmp_path / "elsewhere"))
        code = twin.wait(timeout=60)
        (parked / "released").write_text("")
        assert code == 2, twin.lines[-5:]
        codes = swarm.wait(timeout=120)
    finally:
        swarm.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "twin": 2}, swarm.tails()
    (line,) = [x for x in twin.lines if "error:" in x]
    assert "NODE_ID='w1': another process is already running as this node" in line, line
    assert "stop it first, or give this node another NODE_ID" in line, line
    assert len([e for e in events(folder, "w1") if e.event == "worker_started"]) == 1  # the twin wrote nothing
    assert_every_round_submitted(folder, "w1", range(6))


def test_two_processes_started_together_with_one_node_id_see_each_other_and_the_later_one_stops(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    # Rounds of at least 0.5 s: the twin needs two looks at its heartbeat file and its farewell writes (about 1.3 s
    # on a loaded CI machine) to step down, and 3 rounds of 0.3 s once finished the run first (both exited 0).
    rounds = 6
    env = swarm_env(folder, MAX_ROUNDS=rounds, MIN_WORKERS=2, SYNTHETIC_STEP_SECONDS=0.5)
    swarm = Swarm(folder, env, ["w1", "w2"])
    try:
        first = swarm.start("w1")
        second = swarm.start("twin", node="w1", SWARM_LOCAL_DIR=str(tmp_path / "elsewhere"))
        swarm.start("w2")
        # No experiment yet when the workers start, so nothing to see at start: the coordinator starts once both
        # processes named w1 are past the start check (under load one could otherwise see the other's heartbeat).
        waiting = "no experiment 'faults' yet"
        wait_until(lambda: all(any(waiting in x for x in p.lines) for p in (first, second)), 60, "waits", swarm.procs)
        swarm.start("coord")
        codes = swarm.wait(timeout=120)
    finally:
        swarm.stop()
    assert sorted([codes.pop("w1"), codes.pop("twin")]) == [0, 3], swarm.tails()
    assert codes == {"coord": 0, "w2": 0}, swarm.tails()
    stopped, stayed = (first, second) if first.returncode == 3 else (second, first)
    assert any("this one, started later, stops" in x for x in stopped.lines), stopped.lines[-10:]
    assert any("another process is writing" in x and "NODE_ID='w1'" in x for x in stayed.lines), stayed.lines[-10:]
    log = events(folder, "w1")
    assert len([e for e in log if e.event == "node_id_conflict"]) == 2
    assert [e.message for e in log if e.event == "worker_gave_up"] == [
        next(e.message for e in log if "started later, stops" in e.message)
    ]
    assert_swarm_finished(folder, rounds)
